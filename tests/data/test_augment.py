from __future__ import annotations

import math

import kornia
import pytest
import torch

from selfsup.data import augment as A
from selfsup.data.augment import (
    MAST_OPS,
    PRESETS,
    Augment,
    AugmentConfig,
    LabelledAugment,
    MAST15_OPS,
    augment_config,
    augment_throughput,
    sample_op_subsets,
)

B = 8


def _images(channels: int = 3, size: int = 16, batch: int = B, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _identity(size: int, **overrides) -> AugmentConfig:
    return augment_config("none", size, **overrides)


# ---------------------------------------------------------------- configs and presets


def test_presets_build_and_have_documented_values() -> None:
    for name in PRESETS:
        assert isinstance(augment_config(name, 32), AugmentConfig)
    v1, v2 = augment_config("byol_view1", 32), augment_config("byol_view2", 32)
    assert (v1.blur_p, v1.solarize_p, v2.blur_p, v2.solarize_p) == (1.0, 0.0, 0.1, 0.2)
    assert augment_config("vicreg_view2", 32) == v2
    minimal = augment_config("minimal", 32)
    assert minimal.crop_scale == (0.2, 1.0) and minimal.jitter_p == minimal.grayscale_p == minimal.blur_p == 0.0
    mv = augment_config("multiview", 32)
    assert (mv.brightness, mv.contrast, mv.saturation, mv.hue, mv.blur_p) == (0.4, 0.4, 0.4, 0.0, 0.0)
    msn, focal = augment_config("msn", 32), augment_config("msn_focal", 16)
    assert msn.crop_scale == (0.3, 1.0) and focal.crop_scale == (0.05, 0.3) and msn.blur_p == 0.5
    assert msn.solarize_p == 0.0


def test_overrides_apply_and_lists_become_tuples() -> None:
    cfg = augment_config("simclr", 24, blur_p=0.0, crop_scale=[0.5, 1.0], mean=[0.5], std=[0.2])
    assert cfg.blur_p == 0.0 and cfg.crop_scale == (0.5, 1.0) and cfg.mean == (0.5,) and cfg.size == 24


def test_unknown_preset_and_override_name_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="unknown augmentation preset 'simclrr'.*'simclr'"):
        augment_config("simclrr", 32)
    with pytest.raises(ValueError, match="unknown augmentation override.*'blur'.*allowed keys.*blur_p"):
        augment_config("simclr", 32, blur=0.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(hflip_p=1.5), "hflip_p"),
        (dict(crop_scale=(0.0, 1.0)), "crop_scale"),
        (dict(crop_scale=(0.9, 0.5)), "crop_scale"),
        (dict(crop_ratio=(-1.0, 1.0)), "crop_ratio"),
        (dict(hue=0.7), "hue"),
        (dict(brightness=-0.1), "brightness"),
        (dict(blur_sigma=(0.0, 1.0)), "blur_sigma"),
        (dict(mean=(0.5, 0.5, 0.5)), "together"),
        (dict(mean=(0.5, 0.5), std=(0.2, 0.2)), "per channel"),
        (dict(mean=(0.5,), std=(0.0,)), "std"),
    ],
)
def test_bad_config_values_raise(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        augment_config("simclr", 32, **overrides)


def test_bad_size_raises() -> None:
    with pytest.raises(ValueError, match="size"):
        AugmentConfig(size=0)


def test_blur_kernel_is_ten_percent_odd_at_least_three() -> None:
    assert [AugmentConfig(size=s).blur_kernel_size for s in (28, 32, 96, 224)] == [3, 3, 9, 23]


# ---------------------------------------------------------------- Augment: shapes, range, errors


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("channels", [1, 3])
def test_every_preset_shape_dtype_range(preset: str, channels: int) -> None:
    torch.manual_seed(0)
    out = Augment(augment_config(preset, 12))(_images(channels, 16))
    assert out.shape == (B, channels, 12, 12) and out.dtype == torch.float32
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_float64_input_keeps_dtype() -> None:
    out = Augment(augment_config("simclr", 8))(_images(3, 16).double())
    assert out.dtype == torch.float64


def test_gray_input_with_full_simclr_pipeline() -> None:
    torch.manual_seed(0)
    cfg = augment_config("simclr", 16, blur_p=1.0, solarize_p=0.5, mean=(0.3,), std=(0.2,))
    out = Augment(cfg)(_images(1, 20))
    assert out.shape == (B, 1, 16, 16) and torch.isfinite(out).all()
    pixels = out * 0.2 + 0.3
    assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6


def test_normalisation_is_exact_per_channel() -> None:
    x = _images(3, 8)
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.25, 0.5)
    out = Augment(_identity(8, mean=mean, std=std))(x)
    expected = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(out, expected)


def test_normalisation_matches_batch_statistics() -> None:
    x = torch.rand(64, 3, 8, 8)
    m = x.mean(dim=(0, 2, 3)).tolist()
    s = x.std(dim=(0, 2, 3)).tolist()
    out = Augment(_identity(8, mean=m, std=s))(x)
    torch.testing.assert_close(out.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-5, rtol=0)


def test_input_errors_name_the_problem() -> None:
    aug = Augment(augment_config("simclr", 8))
    with pytest.raises(ValueError, match=r"x.float\(\) / 255"):
        aug((_images(3, 8) * 255).to(torch.uint8))
    with pytest.raises(ValueError, match="1 \\(gray\\) or 3 \\(RGB\\)"):
        aug(torch.rand(2, 2, 8, 8))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        aug(torch.rand(3, 8, 8))
    with pytest.raises(ValueError, match="un-normalised images in \\[0, 1\\]"):
        aug(torch.randn(2, 3, 8, 8) * 3)
    gray_with_rgb_stats = Augment(augment_config("simclr", 8, mean=(0.5,) * 3, std=(0.2,) * 3))
    with pytest.raises(ValueError, match="3 values but the batch has 1 channel"):
        gray_with_rgb_stats(_images(1, 8))
    with pytest.raises(TypeError, match="AugmentConfig"):
        Augment(dict(size=8))  # type: ignore[arg-type]


# ---------------------------------------------------------------- Augment: each op does what it says


def test_identity_config_returns_input() -> None:
    x = _images(3, 16)
    assert torch.equal(Augment(_identity(16))(x), x)


def test_identity_crop_through_resampling_is_exact_up_to_interpolation() -> None:
    x = _images(3, 16)
    full = torch.tensor([[0.0, 0.0, 16.0, 16.0]]).double().expand(B, 4)
    out = A._resample(x, full, torch.zeros(B, dtype=torch.bool), 16)
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)
    flipped = A._resample(x, full, torch.ones(B, dtype=torch.bool), 16)
    torch.testing.assert_close(flipped, x.flip(-1), atol=1e-5, rtol=0)


def test_none_preset_resizes_centre_square() -> None:
    # A horizontal ramp in a 16 x 32 image: the centred 16 x 16 square covers columns 8..24.
    ramp = ((torch.arange(32.0) + 0.5) / 32).expand(1, 1, 16, 32).clone()
    out = Augment(_identity(8))(ramp)
    expected = (8 + (torch.arange(8.0) + 0.5) * 2) / 32
    torch.testing.assert_close(out[0, 0, 3], expected, atol=1e-6, rtol=0)


def test_crop_reads_the_requested_box() -> None:
    # Bilinear sampling reproduces a linear ramp exactly, so each output column is known.
    ramp = ((torch.arange(20.0) + 0.5) / 20).expand(1, 1, 20, 20).clone()
    box = torch.tensor([[4.0, 2.0, 10.0, 12.0]], dtype=torch.float64)
    out = A._resample(ramp, box, torch.tensor([False]), 5)
    expected = (4 + (torch.arange(5.0) + 0.5) * 2) / 20
    torch.testing.assert_close(out[0, 0, 0], expected, atol=1e-6, rtol=0)
    mirrored = A._resample(ramp, box, torch.tensor([True]), 5)
    torch.testing.assert_close(mirrored[0, 0, 0], expected.flip(0), atol=1e-6, rtol=0)


def test_crop_boxes_respect_scale_ratio_and_bounds() -> None:
    torch.manual_seed(0)
    boxes = A.sample_crop_boxes(2000, 32, 48, (0.1, 0.5), (0.5, 2.0))
    x0, y0, w, h = boxes.unbind(1)
    assert (x0 >= 0).all() and (y0 >= 0).all() and (x0 + w <= 48 + 1e-9).all() and (y0 + h <= 32 + 1e-9).all()
    frac, aspect = w * h / (32 * 48), w / h
    assert frac.min() >= 0.1 - 1e-9 and frac.max() <= 0.5 + 1e-9
    assert aspect.min() >= 0.5 - 1e-9 and aspect.max() <= 2.0 + 1e-9
    assert 0.25 < frac.mean() < 0.35  # uniform area fraction on [0.1, 0.5]


def test_crop_falls_back_to_centre_box_when_nothing_fits() -> None:
    boxes = A.sample_crop_boxes(4, 10, 30, (1.0, 1.0), (1.0, 1.0))
    assert torch.allclose(boxes, torch.tensor([10.0, 0.0, 10.0, 10.0], dtype=torch.float64).expand(4, 4))


def test_flip_p1_flips_exactly() -> None:
    x = _images(3, 16)
    torch.testing.assert_close(Augment(_identity(16, hflip_p=1.0))(x), x.flip(-1), atol=0, rtol=0)


def test_grayscale_p1_makes_channels_equal_luma() -> None:
    x = _images(3, 8)
    out = Augment(_identity(8, grayscale_p=1.0))(x)
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    for c in range(3):
        torch.testing.assert_close(out[:, c], luma)


def test_grayscale_is_noop_on_gray_images() -> None:
    x = _images(1, 8)
    assert torch.equal(Augment(_identity(8, grayscale_p=1.0))(x), x)


def test_solarize_p1_inverts_pixels_at_or_above_half() -> None:
    x = _images(3, 8)
    x[0, 0, 0, 0] = 0.5
    out = Augment(_identity(8, solarize_p=1.0))(x)
    assert torch.equal(out, torch.where(x >= 0.5, 1.0 - x, x))


def test_blur_matches_kornia_gaussian_blur_per_sample_sigma() -> None:
    x = _images(3, 20)
    sigma = torch.linspace(0.1, 2.0, B)
    ref = kornia.filters.gaussian_blur2d(x, (5, 5), torch.stack([sigma, sigma], 1), border_type="reflect")
    torch.testing.assert_close(A._gaussian_blur(x, sigma, 5), ref, atol=1e-5, rtol=0)


def test_blur_p1_smooths_every_image_and_keeps_its_mean() -> None:
    torch.manual_seed(0)
    x = _images(3, 20)
    out = Augment(_identity(20, blur_p=1.0, blur_sigma=(1.0, 2.0)))(x)
    def roughness(t: torch.Tensor) -> torch.Tensor:
        return (t[..., 1:] - t[..., :-1]).abs().mean(dim=(1, 2, 3))

    assert (roughness(out) < 0.7 * roughness(x)).all()
    torch.testing.assert_close(out.mean(dim=(1, 2, 3)), x.mean(dim=(1, 2, 3)), atol=0.01, rtol=0)


def test_blur_kernel_too_large_for_image_raises() -> None:
    with pytest.raises(ValueError, match=r"bad value for blur_kernel_frac: 2.0; use a number in \(0, 1\]"):
        _identity(4, blur_p=1.0, blur_kernel_frac=2.0)  # a kernel twice the image's side
    aug = Augment(_identity(1, blur_p=1.0))  # the smallest kernel (3) cannot reflect-pad a 1-pixel image
    with pytest.raises(ValueError, match="blur_kernel_frac"):
        aug(_images(3, 1))


@pytest.mark.parametrize(
    ("ours", "reference"),
    [
        (A._adjust_brightness, kornia.enhance.adjust_brightness_accumulative),
        (A._adjust_contrast, kornia.enhance.adjust_contrast_with_mean_subtraction),
        (A._adjust_saturation, kornia.enhance.adjust_saturation_with_gray_subtraction),
    ],
)
def test_colour_factors_match_kornia(ours, reference) -> None:
    x = _images(3, 8)
    factor = torch.linspace(0.0, 1.8, B)
    torch.testing.assert_close(ours(x, factor.view(-1, 1, 1, 1)), reference(x, factor), atol=1e-6, rtol=0)


def test_contrast_on_gray_images_matches_kornia() -> None:
    x = _images(1, 8)
    factor = torch.linspace(0.2, 1.8, B)
    expected = kornia.enhance.adjust_contrast_with_mean_subtraction(x, factor)
    torch.testing.assert_close(A._adjust_contrast(x, factor.view(-1, 1, 1, 1)), expected, atol=1e-6, rtol=0)


def test_hue_matches_kornia_including_gray_and_tied_pixels() -> None:
    x = _images(3, 8)
    x[0] = x[0, :1]  # gray image: chroma 0
    x[1, 1] = x[1, 0]  # red and green tie
    x[2, 2] = x[2, 0]  # red and blue tie
    shift = torch.linspace(-0.5, 0.5, B)
    expected = kornia.enhance.adjust_hue(x, shift * 2 * math.pi)
    torch.testing.assert_close(A._adjust_hue(x, shift), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(A._adjust_hue(x, torch.zeros(B)), x, atol=1e-6, rtol=0)


def test_hue_of_pure_red_by_a_third_turn_is_green() -> None:
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1.0
    green = A._adjust_hue(red, torch.tensor([1 / 3]))
    torch.testing.assert_close(green[0, :, 0, 0], torch.tensor([0.0, 1.0, 0.0]), atol=1e-6, rtol=0)


def test_jitter_factors_differ_per_sample_and_stay_in_range() -> None:
    torch.manual_seed(0)
    x = torch.full((64, 1, 8, 8), 0.5)
    out = Augment(_identity(8, jitter_p=1.0, brightness=0.4, contrast=0.0))(x)
    level = out.mean(dim=(1, 2, 3))
    assert level.min() >= 0.5 * 0.6 - 1e-6 and level.max() <= 0.5 * 1.4 + 1e-6
    assert level.std() > 0.05  # one brightness factor per sample


def test_jitter_probability_leaves_other_samples_untouched() -> None:
    torch.manual_seed(0)
    x = _images(3, 8, batch=200)
    out = Augment(_identity(8, jitter_p=0.3))(x)
    unchanged = (out == x).flatten(1).all(dim=1)
    assert 0.55 < unchanged.float().mean() < 0.85


def test_per_sample_parameters_differ_across_batch() -> None:
    torch.manual_seed(0)
    x = _images(3, 16, batch=1).expand(B, 3, 16, 16).contiguous()
    out = Augment(augment_config("simclr", 12))(x)
    flat = out.flatten(1)
    assert all(not torch.allclose(flat[i], flat[j]) for i in range(B) for j in range(i))


def test_same_seed_same_output_and_new_seed_differs() -> None:
    aug = Augment(augment_config("byol_view2", 12, mean=(0.5,) * 3, std=(0.2,) * 3))
    x = _images(3, 16)
    torch.manual_seed(11)
    a = aug(x)
    torch.manual_seed(11)
    b = aug(x)
    torch.manual_seed(12)
    c = aug(x)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_seed_same_output_on_cuda_and_cpu() -> None:
    aug = Augment(augment_config("simclr", 12, solarize_p=0.5, mean=(0.5,) * 3, std=(0.2,) * 3))
    x = _images(3, 16)
    torch.manual_seed(0)
    cpu = aug(x)
    torch.manual_seed(0)
    gpu = aug.cuda()(x.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=0)


def test_augment_throughput_is_positive_and_keeps_rng_state() -> None:
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    rate = augment_throughput(augment_config("simclr", 8), batch=4, channels=3, in_size=8, iters=1)
    assert rate > 0 and math.isfinite(rate)
    assert torch.equal(torch.rand(1), expected)
    with pytest.raises(ValueError, match="batch"):
        augment_throughput(augment_config("simclr", 8), batch=0, channels=3, in_size=8)


# ---------------------------------------------------------------- LabelledAugment (MAST)


def test_labelled_flip_only_flags_every_image() -> None:
    x = _images(3, 16)
    out, applied = LabelledAugment(_identity(16, hflip_p=1.0), crop_p=0.0)(x)
    assert torch.equal(out, x.flip(-1))
    assert applied.shape == (B, len(MAST_OPS)) and applied.dtype == torch.bool
    expected = torch.tensor([op == "flip" for op in MAST_OPS]).expand(B, -1)
    assert torch.equal(applied, expected)


def test_labelled_flags_match_what_each_image_got() -> None:
    torch.manual_seed(0)
    x = _images(3, 16, batch=64)
    out, applied = LabelledAugment(_identity(16, hflip_p=0.5, grayscale_p=0.5), crop_p=0.0)(x)
    flip, gray = applied[:, MAST_OPS.index("flip")], applied[:, MAST_OPS.index("grayscale")]
    expected = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    expected = torch.where(gray.view(-1, 1, 1, 1), A._gray(expected).expand_as(expected), expected)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    assert 10 < flip.sum() < 54 and 10 < gray.sum() < 54
    assert not applied[:, [MAST_OPS.index("color_jitter"), MAST_OPS.index("blur"), MAST_OPS.index("crop")]].any()


def test_labelled_jitter_and_blur_flags_mark_changed_images() -> None:
    torch.manual_seed(1)
    x = _images(3, 16, batch=64)
    out, applied = LabelledAugment(_identity(16, jitter_p=0.5, blur_p=0.5, blur_sigma=(1.0, 2.0)), crop_p=0.0)(x)
    changed = (out - x).flatten(1).abs().amax(dim=1) > 1e-4
    touched = applied[:, MAST_OPS.index("color_jitter")] | applied[:, MAST_OPS.index("blur")]
    assert torch.equal(changed, touched)
    assert 0 < applied[:, 0].sum() < 64 and 0 < applied[:, 1].sum() < 64


def test_labelled_crop_flag_means_box_differs_from_identity() -> None:
    torch.manual_seed(0)
    x = _images(3, 16, batch=32)
    _, applied = LabelledAugment(augment_config("minimal", 16, hflip_p=0.0), crop_p=0.5)(x)
    crop = applied[:, MAST_OPS.index("crop")]
    assert 0 < crop.sum() < 32
    # identity-scale crops never count as applied, even when the crop op fires
    _, applied = LabelledAugment(_identity(16), crop_p=1.0)(x)
    assert not applied.any()


def test_labelled_uncropped_images_are_the_centre_square() -> None:
    torch.manual_seed(0)
    x = _images(3, 16)
    out, applied = LabelledAugment(augment_config("minimal", 8, hflip_p=0.0), crop_p=0.0)(x)
    assert not applied.any()
    torch.testing.assert_close(out, Augment(_identity(8))(x))


def test_labelled_gray_input_never_flags_grayscale() -> None:
    torch.manual_seed(0)
    _, applied = LabelledAugment(_identity(16, grayscale_p=1.0, jitter_p=1.0), crop_p=0.0)(_images(1, 16))
    assert not applied[:, MAST_OPS.index("grayscale")].any()
    assert applied[:, MAST_OPS.index("color_jitter")].all()  # brightness/contrast still act on gray images


def test_labelled_enabled_restricts_ops() -> None:
    torch.manual_seed(0)
    cfg = augment_config("byol_view1", 16, blur_p=1.0, jitter_p=1.0, grayscale_p=1.0, hflip_p=1.0)
    enabled = torch.zeros(B, 5, dtype=torch.bool)
    enabled[torch.arange(B), torch.arange(B) % 5] = True
    _, applied = LabelledAugment(cfg)(_images(3, 20), enabled)
    assert torch.equal(applied, enabled)  # every enabled op fires (p = 1), nothing else does


def test_labelled_errors() -> None:
    with pytest.raises(ValueError, match="solarize"):
        LabelledAugment(augment_config("byol_view2", 16))
    with pytest.raises(ValueError, match="crop_p"):
        LabelledAugment(_identity(16), crop_p=2.0)
    with pytest.raises(ValueError, match="enabled must be a bool tensor of shape"):
        LabelledAugment(_identity(16))(_images(3, 16), torch.ones(B, 4, dtype=torch.bool))


def test_labelled_same_seed_same_output() -> None:
    aug = LabelledAugment(augment_config("byol_view1", 12))
    x = _images(3, 16)
    torch.manual_seed(5)
    a, fa = aug(x)
    torch.manual_seed(5)
    b, fb = aug(x)
    assert torch.equal(a, b) and torch.equal(fa, fb)


def test_sample_op_subsets_exact_count_per_row() -> None:
    torch.manual_seed(0)
    subsets = sample_op_subsets(1000, 5, 2)
    assert subsets.shape == (1000, 5) and (subsets.sum(dim=1) == 2).all()
    freq = subsets.float().mean(dim=0)
    assert ((freq - 0.4).abs() < 0.06).all()
    with pytest.raises(ValueError, match="count"):
        sample_op_subsets(4, 5, 0)


# ---------------------------------------------------------------- MAST-15's extra ops


def _one_op(op: str, batch: int = 16) -> torch.Tensor:
    """Only ``op`` enabled, on the even images."""
    enabled = torch.zeros(batch, len(MAST15_OPS), dtype=torch.bool)
    enabled[::2, MAST15_OPS.index(op)] = True
    return enabled


@pytest.mark.parametrize("op", MAST15_OPS[5:])
def test_mast15_each_extra_op_changes_exactly_the_images_it_flags(op: str) -> None:
    torch.manual_seed(0)
    x = _images(3, 16, batch=16)
    out, applied = LabelledAugment(_identity(16), crop_p=0.0, extra_p=1.0)(x, _one_op(op))
    assert applied.shape == (16, 15) and torch.equal(applied, _one_op(op))
    changed = (out - x).flatten(1).abs().amax(dim=1) > 1e-4
    assert torch.equal(changed, applied[:, MAST15_OPS.index(op)])


def test_mast15_invert_sobel_and_cutout_by_hand() -> None:
    torch.manual_seed(0)
    x = _images(1, 12, batch=4)
    out, _ = LabelledAugment(_identity(12), crop_p=0.0, extra_p=1.0)(x, _one_op("invert", 4))
    torch.testing.assert_close(out[::2], 1 - x[::2])
    flat = torch.full((4, 1, 12, 12), 0.3)
    out, _ = LabelledAugment(_identity(12), crop_p=0.0, extra_p=1.0)(flat, _one_op("sobel", 4))
    assert out[::2].abs().max() == 0 and torch.equal(out[1::2], flat[1::2])  # no edges in a flat image
    edge = torch.zeros(4, 1, 12, 12)
    edge[..., 6:] = 1.0
    out, _ = LabelledAugment(_identity(12), crop_p=0.0, extra_p=1.0)(edge, _one_op("sobel", 4))
    assert out[0, 0, :, 5:7].min() == 1.0 and out[0, 0, :, :4].max() == 0.0  # the edge, scaled to 1
    torch.manual_seed(2)
    out, _ = LabelledAugment(_identity(12), crop_p=0.0, extra_p=1.0)(torch.zeros(4, 1, 12, 12), _one_op("cutout", 4))
    square = out[0, 0] == 0.5
    rows, cols = square.any(1).nonzero().squeeze(1), square.any(0).nonzero().squeeze(1)
    assert square.sum() == len(rows) * len(cols) > 0  # one axis-aligned patch of mid-gray
    assert (out[1::2] == 0).all()


def test_mast15_rejects_a_mast5_mask_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(3, 15\)"):
        LabelledAugment(_identity(16), extra_p=0.5)(_images(3, 16, batch=3), torch.ones(3, 5, dtype=torch.bool))


def test_labelled_magnitudes_are_what_each_applied_op_drew() -> None:
    torch.manual_seed(4)
    x = _images(3, 16, batch=64)
    cfg = augment_config("mast", 16)
    out, applied, mags = LabelledAugment(cfg, extra_p=0.5)(x, magnitudes=True)
    assert mags.shape == applied.shape == (64, 15)
    assert (mags[~applied] == 0).all() and (mags[applied] > 0).all()  # 0 exactly where an op did not act
    column = {op: mags[:, k][applied[:, k]] for k, op in enumerate(MAST15_OPS)}
    assert (column["flip"] == 1).all() and (column["invert"] == 1).all()
    assert (column["crop"] < 0.92 + 1e-6).all()  # at most 1 - 0.08 of the image cut away
    assert (column["blur"] >= 0.1).all() and (column["blur"] <= 2.0).all()  # sigma in [0.1, 2]
    assert (column["color_jitter"] <= 0.4 + 1e-6).all() and (column["rotate"] <= 30).all()
    # A pipeline asked for no magnitudes draws the same images.
    torch.manual_seed(4)
    again, applied_again = LabelledAugment(cfg, extra_p=0.5)(x)
    assert torch.equal(again, out) and torch.equal(applied_again, applied)
