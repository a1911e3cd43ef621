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
from selfsup.data.augment import augment_config
from selfsup.data.views import ViewGroup
from selfsup.methods.mast import MAST, MASTConfig
from selfsup.models import build_backbone

OPS = ["color_jitter", "blur", "flip", "crop"]


def method(total_steps: int = 10, **overrides) -> MAST:
    torch.manual_seed(0)
    backbone = build_backbone("resnet", block="basic", layers=[1, 1], width=8, small_stem=True, in_channels=1)
    cfg = MASTConfig(ops=OPS, embedding_dim=16, trunk=[16], **overrides)
    mast = MAST(backbone, cfg, total_steps)
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


def _eq_7_by_hand(mu_a, var_a, mu_b, var_b, masks, active) -> torch.Tensor:
    """MAST Eq. 7 from scratch (§3.1-3.2): lambda = 25 d / K_active, lambda1 = 600 / (d K), lambda2 = 25, VICReg
    variance (25) and covariance (1) on the means of both views, KL as printed (Eqs. 5-6), eps 1e-6 as the loss."""
    n, d = mu_a.shape
    k = masks.shape[1]
    total = 0.0
    for i in range(n):
        for j in range(k):
            if active[i, j]:
                m = masks[:, j]
                total = total + 2 * ((mu_a[i] - mu_b[i]) ** 2 * m ** 2).sum() / ((var_a[i] * m).sum()
                                                                                  + (var_b[i] * m).sum() + 1e-6)
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
    mast = method()
    with pytest.raises(ConfigError, match="one view spec with num: 2"):
        mast.attach_views([ViewGroup(augment_config("mast", 12), 1), ViewGroup(augment_config("mast", 12), 1)])


TINY_MAST = """
method: {name: mast, ops: [color_jitter, blur, flip, crop], embedding_dim: 32, trunk: [32], variance: softplus}
data: {dataset: digits}
views:
  - {preset: mast, num: 2, params: {crop_scale: [0.5, 1.0]}}
model:
  backbone: resnet
  params: {block: basic, layers: [1, 1], width: 8, small_stem: true}
optim: {name: adamw, lr: 0.002, warmup_epochs: 0.5}
trainer: {epochs: 1, batch_size: 64, log_every_steps: 5, progress: false}
"""


def test_a_run_exports_the_encoder_alone_with_its_pictures(tmp_path: Path) -> None:
    config = tmp_path / "mast.yaml"
    config.write_text(TINY_MAST)
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
