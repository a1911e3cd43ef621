"""The MAST method: its pairs follow the two-stage schedule and share their drawn augmentations, the step is the
loss of Eq. 7 on those labels, masks stay non-negative, and a run exports the encoder alone with its pictures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from selfsup.cli import main
from selfsup.config import ConfigError
from selfsup.data.augment import MAST15_OPS, MAST_OPS, augment_config
from selfsup.data.views import ViewGroup
from selfsup.methods.mast import MAST, MASTConfig
from selfsup.models import build_backbone
from selfsup.report.method_figures import (draw_method_figures, mask_figure, mask_rows, uncertainty_figure,
                                           uncertainty_series)
from tiny import MAST_RUN, tiny_yaml

OPS = ["color_jitter", "blur", "flip", "crop"]


def method(total_steps: int = 10, ops: list[str] = OPS, attach: bool = True, **overrides) -> MAST:
    torch.manual_seed(0)
    backbone = build_backbone("resnet", block="basic", layers=[1, 1], width=8, small_stem=True, in_channels=1)
    cfg = MASTConfig(ops=ops, embedding_dim=16, trunk=[16], **overrides)
    mast = MAST(backbone, cfg, total_steps)
    if attach:
        mast.attach_views([ViewGroup(augment_config("mast", 12, mean=(0.5,), std=(0.25,)), 2)])
    return mast


def images(n: int = 8) -> torch.Tensor:
    return torch.rand(n, 1, 12, 12, generator=torch.Generator().manual_seed(1))


def test_pairs_follow_the_two_stage_schedule() -> None:
    mast = method(total_steps=10)
    torch.manual_seed(0)
    mast.make_views(images(), step=0)
    assert (mast.active.sum(1) == 1).all()  # stage 1: one augmentation per pair
    mast.make_views(images(), step=9)
    assert (mast.active.sum(1) == len(OPS)).all()  # the last step composes all K
    assert mast.op_counts.tolist() == [1, 1, 1, 1, 1, 1, 2, 3, 3, 4]
    mast.make_views(images(), step=25)  # past the schedule's end (a resumed or lengthened run): its last count
    assert (mast.active.sum(1) == len(OPS)).all()
    # first_stage 0.2: 2 steps of one op, then 1 + round(3 t / 7) for t = 0..7
    assert method(total_steps=10, first_stage=0.2).op_counts.tolist() == [1, 1, 1, 1, 2, 2, 3, 3, 4, 4]
    assert method(total_steps=1, first_stage=0.0).op_counts.tolist() == [1]  # a one-step run: one op


def test_the_schedule_is_not_part_of_the_checkpoint() -> None:
    """op_counts is rebuilt from the run length: a checkpoint of a 10-step run loads into a 30-step MAST."""
    short, long = method(total_steps=10), method(total_steps=30)
    assert "op_counts" not in short.state_dict()
    long.load_state_dict(short.state_dict())
    assert len(long.op_counts) == 30


def test_both_views_get_the_same_drawn_augmentations() -> None:
    mast = method(total_steps=4)
    mast.augment.config.hflip_p = 1.0  # a drawn flip always fires
    torch.manual_seed(3)
    x = images()
    view_a, view_b = mast.make_views(x, step=0)
    flipped = mast.active[:, OPS.index("flip")]
    centre = (x - 0.5) / 0.25
    for i in range(len(x)):
        if flipped[i]:  # flip alone: both views are the mirrored image
            assert torch.allclose(view_a[i], centre[i].flip(-1), atol=1e-5)
            assert torch.allclose(view_b[i], centre[i].flip(-1), atol=1e-5)
    assert flipped.any()


def _eq_7_by_hand(mu_a, var_a, mu_b, var_b, masks, active, scale_free: bool = False,
                  per_dimension: bool = False) -> torch.Tensor:
    """MAST Eq. 7 from scratch (§3.1-3.2): lambda = 25 d / K_active, lambda1 = 600 / (d K), lambda2 = 25, VICReg
    variance (25) and covariance (1) on the means of both views, KL as printed (Eqs. 5-6), eps 1e-6 as the loss.
    ``scale_free`` (spec §6.4's safeguard): inside D_mg only, each mask column divided by its mean and the variances
    by their mean over the batch and both views (``per_dimension``: each dimension by its own such mean)."""
    n, d = mu_a.shape
    k = masks.shape[1]
    scale = torch.cat([var_a, var_b]).mean(dim=0 if per_dimension else None) if scale_free else 1.0
    total = 0.0
    for i in range(n):
        for j in range(k):
            if active[i, j]:
                m = masks[:, j] / masks[:, j].mean() if scale_free else masks[:, j]
                total = total + 2 * ((mu_a[i] - mu_b[i]) ** 2 * m ** 2).sum() / ((var_a[i] / scale * m).sum()
                                                                                  + (var_b[i] / scale * m).sum() + 1e-6)
    distance = total / n
    k_active = max(float(active.sum()) / n, 1.0)
    va, vb = var_a + 1e-6, var_b + 1e-6
    kl = (0.5 * (va / vb + vb / va + (mu_a - mu_b) ** 2 * (1 / va + 1 / vb))).sum() / n
    regulariser = 0.0
    for z in (mu_a, mu_b):
        regulariser = regulariser + 25 * torch.clamp(1 - (z.var(0) + 1e-4).sqrt(), min=0).mean()
        c = (z - z.mean(0)).T @ (z - z.mean(0)) / (n - 1)
        regulariser = regulariser + (c ** 2).sum().sub((c.diagonal() ** 2).sum()) / d
    return 25 * d / k_active * distance + 600 / (d * k) * masks.sum() + 25 * kl + regulariser


def test_the_step_is_eq_7_on_the_drawn_labels() -> None:
    mast = method(variance="softplus")
    torch.manual_seed(0)
    views = mast.make_views(images(), step=7)
    out = mast(views)
    with torch.no_grad():
        (mu_a, var_a), (mu_b, var_b) = (mast.projector(mast.backbone.forward_feature_map(v)) for v in views)
        expected = _eq_7_by_hand(mu_a, var_a, mu_b, var_b, torch.relu(mast.mask_params), mast.active)
    assert 1 < mast.active.sum(1).double().mean().item() < len(OPS)  # K_active is neither 1 nor K: lambda's divisor is seen
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert {"distance", "sparsity", "kl", "variance", "covariance", "mask_mean", "mask_dead",
            "sigma_trace"} <= set(out.terms)
    drawn = [op for k, op in enumerate(OPS) if mast.active[:, k].any()]
    assert {f"uncertainty_{op}" for op in drawn} <= set(out.terms)
    assert torch.allclose(out.embeddings, mu_a) and not out.embeddings.requires_grad  # monitored: view a's mean


@pytest.mark.parametrize("setting", ["scale_free", "scale_free_per_dimension", "avg_pooling"])
def test_the_step_follows_the_scale_free_and_pooling_settings(setting: str) -> None:
    """scale_free: D_mg on unit-mean masks and batch-relative variances; avg pooling: the heads see the pooled
    feature (a 1 x 1 map), not the feature map."""
    overrides = {"avg_pooling": {"pooling": "avg"}, "scale_free": {"scale_free": True},
                 "scale_free_per_dimension": {"scale_free": True, "variance_scale": "dimension"}}[setting]
    mast = method(variance="softplus", **overrides)
    torch.manual_seed(0)
    views = mast.make_views(images(), step=7)
    out = mast(views)
    encode = mast.backbone if setting == "avg_pooling" else mast.backbone.forward_feature_map
    with torch.no_grad():
        (mu_a, var_a), (mu_b, var_b) = (mast.projector(encode(v)) for v in views)
        expected = _eq_7_by_hand(mu_a, var_a, mu_b, var_b, torch.relu(mast.mask_params), mast.active,
                                 scale_free=setting.startswith("scale_free"),
                                 per_dimension=setting == "scale_free_per_dimension")
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_masks_stay_non_negative_and_get_gradients() -> None:
    mast = method(variance="softplus")
    with torch.no_grad():
        mast.mask_params[:3, 0] = -0.5  # dead entries: mask 0, no gradient through the ReLU
    optimizer = torch.optim.SGD(mast.parameters(), lr=0.01)
    for step in range(3):
        torch.manual_seed(step)
        out = mast(mast.make_views(images(), step=step + 6))
        optimizer.zero_grad()
        out.loss.backward()
        grad = mast.mask_params.grad
        assert torch.isfinite(grad).all() and grad[3:].abs().sum() > 0 and (grad[:3, 0] == 0).all()
        optimizer.step()
    assert (mast.masks >= 0).all() and (mast.masks[:3, 0] == 0).all()


@pytest.mark.parametrize("labels", ["drawn", "applied"])
def test_labels_name_the_drawn_or_the_applied_ops(labels: str) -> None:
    """Stage 1, flip drawn alone with p 0.5 per view: ``applied`` labels a pair flip iff a view is mirrored."""
    mast = method(total_steps=4, labels=labels)
    torch.manual_seed(3)
    x = images(64)
    view_a, view_b = mast.make_views(x, step=0)
    centre = (x - 0.5) / 0.25
    drawn = mast.active.sum(1) == 1  # stage 1: one op per pair, whatever the labels
    label = mast.active[:, OPS.index("flip")]
    mirrored_pairs, unmirrored_pairs = 0, 0
    for i in range(len(x)):
        mirrored = [torch.allclose(v[i], centre[i].flip(-1), atol=1e-5) for v in (view_a, view_b)]
        plain = [torch.allclose(v[i], centre[i], atol=1e-5) for v in (view_a, view_b)]
        if all(a or b for a, b in zip(mirrored, plain)) and (label[i] or labels == "applied"):  # a flip-only pair
            if any(mirrored):
                mirrored_pairs += 1
                assert label[i]
            else:
                unmirrored_pairs += 1
                assert label[i] == (labels == "drawn")  # drawn, but neither view was flipped
    assert mirrored_pairs and unmirrored_pairs
    if labels == "drawn":
        assert drawn.all()


def test_grayscale_on_gray_images_is_refused() -> None:
    backbone = build_backbone("resnet", block="basic", layers=[1], width=8, small_stem=True, in_channels=1)
    mast = MAST(backbone, MASTConfig(embedding_dim=8, trunk=[8]), 10)  # MAST-5: grayscale among the ops
    with pytest.raises(ConfigError, match=r"method.ops: grayscale cannot act on 1-channel images.*"
                                          r"\['color_jitter', 'blur', 'flip', 'crop'\]"):
        mast.attach_views([ViewGroup(augment_config("mast", 12, mean=(0.5,), std=(0.25,)), 2)])
    mast.attach_views([ViewGroup(augment_config("mast", 12), 2)])  # channels unknown until the first batch
    with pytest.raises(ConfigError, match="grayscale cannot act on 1-channel"):
        mast.make_views(images(), step=0)
    mast.attach_views([ViewGroup(augment_config("mast", 12, mean=(0.5,) * 3, std=(0.25,) * 3), 2)])  # colour: fine
    with pytest.raises(ConfigError, match="method.labels"):
        MASTConfig(labels="fired")


def test_bad_settings_are_refused() -> None:
    backbone = build_backbone("resnet", block="basic", layers=[1], width=8, small_stem=True, in_channels=1)
    with pytest.raises(ConfigError, match="method.ops"):
        MAST(backbone, MASTConfig(ops=["flip", "flip"], embedding_dim=8, trunk=[8]), 10)
    with pytest.raises(ConfigError, match="method.ops"):
        MASTConfig(ops=["flip", "solarize"])  # not a MAST-15 op
    mast = method()
    config = augment_config("mast", 12)
    for groups in ([ViewGroup(config, 1), ViewGroup(config, 1)],  # each condition alone: two specs,
                   [ViewGroup(config, 2), ViewGroup(config, 2)],
                   [ViewGroup(config, 3)],  # one spec of 3 views,
                   [ViewGroup(config, 2, shared_crop=True)]):  # one pair with a shared crop
        with pytest.raises(ConfigError, match="one view spec with num: 2"):
            mast.attach_views(groups)


def test_steps_out_of_order_are_refused() -> None:
    with pytest.raises(RuntimeError, match="attach_views"):
        method(attach=False).make_views(images(), step=0)
    mast = method()
    with pytest.raises(RuntimeError, match="make_views"):
        mast([images(), images()])  # no pairs made yet
    mast.make_views(images(8), step=0)
    with pytest.raises(RuntimeError, match="make_views"):
        mast([images(6), images(6)])  # the labels are of another batch


def test_mast_15_ops_get_the_extended_augmentation() -> None:
    """MAST-5 ops use the 5-op pipeline; any MAST-15 op the 15-op one with extra_p, each drawn op mapped to its own
    op: stage 1, one op per pair, a drawn flip (p 1) mirrors both views and a drawn rotate (p 1) turns them."""
    mast_5 = method()
    assert mast_5.augment.ops == MAST_OPS and mast_5.augment.extra_p is None
    mast = method(total_steps=4, ops=["rotate", "flip"], extra_p=1.0)
    assert mast.augment.ops == MAST15_OPS and mast.augment.extra_p == 1.0
    assert method(ops=["rotate", "flip"], extra_p=0.25).augment.extra_p == 0.25
    mast.augment.config.hflip_p = 1.0
    torch.manual_seed(0)
    x = images(16)
    view_a, view_b = mast.make_views(x, step=0)
    centre = (x - 0.5) / 0.25
    for i in range(len(x)):
        if mast.active[i, 1]:
            assert torch.allclose(view_a[i], centre[i].flip(-1), atol=1e-5)
            assert torch.allclose(view_b[i], centre[i].flip(-1), atol=1e-5)
        else:  # rotate: each view by its own angle
            assert not torch.allclose(view_a[i], centre[i], atol=1e-3) and not torch.allclose(view_a[i], view_b[i])
    assert mast.active[:, 0].any() and mast.active[:, 1].any()


def test_crop_p_is_the_drawn_crops_probability() -> None:
    """crop_p 0: a pair that drew only the crop gets two uncropped views (the whole 12 x 12 image)."""
    mast = method(total_steps=4, ops=["crop", "flip"], crop_p=0.0)
    torch.manual_seed(0)
    x = images()
    view_a, view_b = mast.make_views(x, step=0)
    centre = (x - 0.5) / 0.25
    cropped = mast.active[:, 0]
    assert cropped.any()
    assert torch.allclose(view_a[cropped], centre[cropped], atol=1e-5)
    assert torch.allclose(view_b[cropped], centre[cropped], atol=1e-5)


def test_a_run_exports_the_encoder_alone_with_its_pictures(tmp_path: Path) -> None:
    config = tmp_path / "mast.yaml"
    config.write_text(tiny_yaml(MAST_RUN))
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    exported = load_file(run / "backbone.safetensors")
    assert exported and not any(k.startswith(("projector", "mask", "augment")) for k in exported)
    assert (run / "plots" / "mast_masks.png").is_file() and (run / "plots" / "mast_uncertainty.png").is_file()
    with (run / "metrics.csv").open() as f:
        columns = next(csv.reader(f))
    assert {"distance", "kl", "mask_mean", "sigma_trace", "uncertainty_crop"} <= set(columns)
    # Streaming: the loader gives each image's centre square at data.image_size; MAST crops it on the device.
    folder = tmp_path / "images" / "a"
    folder.mkdir(parents=True)
    from PIL import Image

    for i in range(64):
        Image.new("L", (16 + i % 3, 12), i).save(folder / f"{i}.png")
    streamed = tmp_path / "streamed"
    assert main(["pretrain", str(config), f"trainer.out={streamed}", "data.dataset=imagefolder",
                 f"data.root={tmp_path / 'images'}", "data.image_size=12", "data.stream=true", "data.channels=1",
                 "data.num_workers=0", "data.mean=[0.5]", "data.std=[0.25]"]) == 0
    assert (streamed / "backbone.safetensors").is_file()


def test_the_mask_picture_shows_each_ops_mask_as_a_row() -> None:
    masks = torch.tensor([[0.0, 1.5], [0.25, 0.0], [0.75, 2.0]], requires_grad=True)  # d = 3, K = 2
    matrix, labels = mask_rows(masks, ("flip", "crop"))
    assert matrix.tolist() == [[0.0, 0.25, 0.75], [1.5, 0.0, 2.0]] and labels == ["flip", "crop"]
    assert mask_rows(masks.bfloat16(), ["flip", "crop"])[0].tolist() == matrix.tolist()  # precision: bf16-true
    fig = mask_figure(matrix, labels)
    ax = fig.axes[0]
    (image,) = ax.images
    assert image.get_array().tolist() == [[0.0, 0.25, 0.75], [1.5, 0.0, 2.0]]
    assert ax.get_yticks().tolist() == [0, 1] and [t.get_text() for t in ax.get_yticklabels()] == ["flip", "crop"]
    assert image.colorbar is not None and image.colorbar.ax in fig.axes  # the colour bar reads this image's values


def test_the_uncertainty_picture_shows_each_ops_logged_curve() -> None:
    rows = [{"step": "0", "uncertainty_flip": "1.5", "uncertainty_blur": ""},  # as read back from metrics.csv
            {"step": "5", "uncertainty_flip": "nan", "uncertainty_blur": "2", "uncertainty_crop": "inf"},
            {"step": 10, "uncertainty_flip": 3.0, "uncertainty_blur": None},
            {"step": 15}]
    series = uncertainty_series(rows, ["color_jitter", "blur", "flip", "crop"])
    assert series == {"blur": ((5,), (2.0,)), "flip": ((0, 10), (1.5, 3.0))}  # never logged / only inf: no curve
    assert list(series) == ["blur", "flip"]  # in the ops' order
    ax = uncertainty_figure(series).axes[0]
    assert [(line.get_label(), line.get_xdata().tolist(), line.get_ydata().tolist()) for line in ax.lines] == [
        ("blur", [5], [2.0]), ("flip", [0, 10], [1.5, 3.0])]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["blur", "flip"]


def test_plot_writes_both_pictures(tmp_path: Path) -> None:
    mast = method()
    out = tmp_path / "run" / "plots"  # parents made as needed; a second call overwrites
    for _ in range(2):
        draw_method_figures("mast", mast, out, [{"step": 0, "uncertainty_flip": 1.0},
                                                {"step": 5, "uncertainty_flip": 2.0}])
    assert sorted(p.name for p in out.iterdir()) == ["mast_masks.png", "mast_uncertainty.png"]
