"""MSN training step on a tiny ViT: token dropping, view layout, stop-gradient, EMA, export, CLI run."""

from __future__ import annotations

import math

import numpy as np

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from selfsup.config import ConfigError
from selfsup.data.masking import random_keep_indices
from selfsup.losses.msn import msn_loss
from selfsup.methods import build_method
from selfsup.methods.msn import MSNConfig
from selfsup.models import VisionTransformer, build_backbone

B, SIZE, PATCH, FOCAL = 6, 32, 4, 16  # 64 patches per full view, 16 per focal view


def _vit(**kwargs) -> VisionTransformer:
    return build_backbone("vit_custom", img_size=SIZE, patch_size=PATCH, in_channels=3, embed_dim=32, depth=2,
                          num_heads=2, pos_embed="learned", **kwargs)


def _method(total_steps: int = 100, backbone=None, **cfg):
    torch.manual_seed(0)
    spec = {"name": "msn", "projector": [64, 64, 16], "num_prototypes": 24, **cfg}
    return build_method(spec, backbone if backbone is not None else _vit(), total_steps).train()


def _views(num_full: int = 2, num_focal: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    full = [torch.rand(B, 3, SIZE, SIZE, generator=g) for _ in range(num_full)]
    return full + [torch.rand(B, 3, FOCAL, FOCAL, generator=g) for _ in range(num_focal)]


def _block_inputs(vit: VisionTransformer) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    vit.blocks[0].register_forward_hook(lambda mod, inp, out: shapes.append(tuple(inp[0].shape)))
    return shapes


@pytest.mark.parametrize("ratio, kept", [(0.15, 54), (0.7, 19)])  # floor(64 (1 - r))
def test_anchor_encoder_processes_only_the_kept_tokens(ratio: float, kept: int) -> None:
    method = _method(mask_ratio=ratio)
    anchor_shapes, target_shapes = _block_inputs(method.encoder), _block_inputs(method.backbone)
    method(_views())
    # masked anchors: [CLS] + kept patches; focal views: [CLS] + 16 patches, unmasked (both focal views in one call)
    assert anchor_shapes == [(B, 1 + kept, 32), (2 * B, 1 + 16, 32)]
    assert target_shapes == [(B, 1 + 64, 32)]  # the target view is never masked


@pytest.mark.parametrize("shared", [False, True])
def test_step_is_the_msn_loss_of_target_masked_and_focal_views(shared: bool) -> None:
    method = _method(shared_mask=shared, mask_ratio=0.5, memax_weight=3.0, sinkhorn_iterations=2, masked_views=2,
                     label_smoothing=0.1)
    views = _views(num_full=3, num_focal=2)  # target, 2 masked anchors, 2 focal anchors
    torch.manual_seed(7)
    out = method(views)

    torch.manual_seed(7)
    keep = random_keep_indices(2 * B, 64, 0.5, shared=shared)
    assert shared == bool((keep == keep[:1]).all())
    enc, head, protos = method.encoder, method.projector, method.prototypes
    z_masked = head(enc(torch.cat(views[1:3]), keep))
    z_focal = head(enc(torch.cat(views[3:])))
    z_target = head(enc(views[0]))  # the target is an exact copy before any EMA step
    expected, terms = msn_loss(protos(torch.cat([z_masked, z_focal])), protos(z_target).detach(), 0.1, 0.025,
                               sinkhorn_iterations=2, memax_weight=3.0, label_smoothing=0.1)
    torch.testing.assert_close(out.loss, expected)
    assert set(out.terms) == {"ce", "me_max", "mean_entropy", "prototypes_used"}
    for key, value in terms.items():
        torch.testing.assert_close(out.terms[key], value)
    assert out.terms["mean_entropy"].item() == pytest.approx(math.log(24) - out.terms["me_max"].item(), abs=1e-5)
    torch.testing.assert_close(out.embeddings, z_masked[:B].detach())


def test_target_gets_no_gradient_while_encoder_head_and_prototypes_do() -> None:
    method = _method()
    method(_views()).loss.backward()
    assert all(not p.requires_grad and p.grad is None for p in method.target.parameters())
    for module in (method.encoder, method.projector, method.prototypes):
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None for g in grads) and sum(g.abs().sum().item() for g in grads) > 0
    assert getattr(method.prototypes.weight, "_no_weight_decay", False)  # MSN: no weight decay on prototypes


def test_ema_update_follows_the_stretched_linear_momentum_schedule() -> None:
    method = _method(total_steps=8, momentum_stretch=1.25)
    # Code: m(t) = 0.996 + 0.004 t / (1.25 T), so the last step is 0.996 + 0.004 * 7 / 10, not 1.
    torch.testing.assert_close(torch.as_tensor(method.target.momentum), 0.996 + 0.004 * torch.arange(8.0, dtype=torch.float64) / 10)
    online, target = method.encoder.patch_embed.weight, method.backbone.patch_embed.weight
    assert torch.equal(online, target) and online.data_ptr() != target.data_ptr()
    with torch.no_grad():
        for p in list(method.encoder.parameters()) + list(method.projector.parameters()):
            p.add_(torch.randn_like(p))
    for step in (0, 5, 7, 10_000):  # 7 is the last step; past the schedule its last value holds
        before, student = target.detach().clone(), online.detach().clone()
        m = 0.996 + 0.004 * min(step, 7) / 10
        method.after_step(step)
        torch.testing.assert_close(target.detach(), m * before + (1 - m) * student, rtol=1e-6, atol=1e-7)
    head_t = method.target.module[1][0].weight
    assert not torch.equal(head_t, method.projector[0].weight)  # the head's target moved but is its own copy


def test_backbone_is_the_target_and_exports_the_prenorm_cls() -> None:
    method = _method()
    assert method.backbone is method.target.module[0] and method.backbone is not method.encoder
    assert method.export_params == {"pool": "cls_prenorm"}
    exported = _vit(pool="cls_prenorm")
    exported.load_state_dict(method.backbone.state_dict())
    x = torch.rand(3, 3, SIZE, SIZE)
    features = method.backbone.forward_features(x)
    torch.testing.assert_close(exported(x), features["cls_prenorm"])
    torch.testing.assert_close(method.backbone(x), features["cls_prenorm"])  # what the online kNN monitor sees
    assert not torch.allclose(exported(x), features["cls"])
    assert method.encoder.pool == "cls"  # training uses the [CLS] after the final norm
    assert _method(eval_pool="cls").export_params == {"pool": "cls"}
    mean = _method(eval_pool="mean")  # the exported feature changes, the target's training output does not
    assert mean.export_params == {"pool": "mean"} and mean.backbone.pool == "mean"
    losses = []
    for m in (method, mean):
        torch.manual_seed(3)
        losses.append(m(_views()).loss)
    torch.testing.assert_close(losses[0], losses[1])


def test_focal_only_and_several_masked_views() -> None:
    focal_only = _method(masked_views=0)
    shapes = _block_inputs(focal_only.encoder)
    focal_only(_views(num_full=1, num_focal=3))
    assert shapes == [(3 * B, 17, 32)]
    two_masked = _method(masked_views=2, mask_ratio=0.5)
    shapes = _block_inputs(two_masked.encoder)
    two_masked(_views(num_full=3, num_focal=0))
    assert shapes == [(2 * B, 33, 32)]


def test_target_and_one_masked_anchor_are_enough() -> None:
    method = _method()
    shapes = _block_inputs(method.encoder)
    out = method(_views(num_full=2, num_focal=0))
    assert shapes == [(B, 1 + 54, 32)] and torch.isfinite(out.loss)


def test_non_square_views_mask_their_own_grid_and_focal_groups_split_by_height_and_width() -> None:
    method = _method(mask_ratio=0.5)
    shapes = _block_inputs(method.encoder)
    g = torch.Generator().manual_seed(1)
    target, masked = torch.rand(B, 3, SIZE, SIZE, generator=g), torch.rand(B, 3, SIZE, 16, generator=g)
    focal = [torch.rand(B, 3, *hw, generator=g) for hw in ((16, 16), (16, 16), (8, 16))]
    method([target, masked, *focal])
    # 32x16 pixels = an 8x4 grid of 32 patches, half kept; focal 16x16 (16 patches) twice, then 8x16 (8 patches)
    assert shapes == [(B, 1 + 16, 32), (2 * B, 1 + 16, 32), (B, 1 + 8, 32)]


@pytest.mark.parametrize("norm, norm_layer", [("batch", nn.BatchNorm1d), ("layer", nn.LayerNorm), ("none", None)])
def test_projection_head_is_linear_norm_gelu_with_the_configured_norm(norm: str, norm_layer) -> None:
    # authors' code: Linear(D, 2048) -> BN -> GELU -> Linear(2048, 2048) -> BN -> GELU -> Linear(2048, 256)
    head = _method(projector_norm=norm).projector
    hidden = [nn.Linear, norm_layer, nn.GELU] if norm_layer else [nn.Linear, nn.GELU]
    assert [type(m) for m in head] == hidden + hidden + [nn.Linear]
    linears = [m for m in head if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32, 64), (64, 64), (64, 16)]


def test_prototype_warning_needs_sinkhorn_and_more_prototypes_than_images() -> None:
    [message] = MSNConfig(num_prototypes=1024).warnings(512)
    assert "num_prototypes=1024 exceeds the global batch of 512" in message
    assert "equal share of 0.5 images" in message
    assert MSNConfig(num_prototypes=1024).warnings(1024) == []  # one image per prototype
    assert MSNConfig(num_prototypes=1024, sinkhorn_iterations=0).warnings(512) == []


def test_bad_views_backbones_and_options_fail_clearly() -> None:
    method = _method(masked_views=2)
    with pytest.raises(ValueError, match="masked_views"):
        method(_views(num_full=2, num_focal=0))
    with pytest.raises(ValueError, match="target view and at least one anchor"):
        _method()(_views(num_full=1, num_focal=0))
    resnet = build_backbone("resnet", block="basic", layers=[1, 1], width=8, small_stem=True, in_channels=3)
    with pytest.raises(ConfigError, match="needs a ViT"):
        _method(backbone=resnet)
    with pytest.raises(ConfigError, match="pool"):
        _method(backbone=_vit(pool="mean"))
    for key, value in {"mask_ratio": 1.0, "target_temperature": 0.0, "momentum_stretch": 0.8,
                       "label_smoothing": -0.1, "num_prototypes": 0}.items():
        with pytest.raises(ConfigError, match=f"method.{key}"):
            _method(**{key: value})
    with pytest.raises(ConfigError, match="method.eval_pool"):
        _method(eval_pool="avg")


def test_pretrain_cli_logs_msn_monitors_and_exports_the_target_encoder(tmp_path) -> None:
    from selfsup.checkpoint import load_backbone, load_checkpoint
    from selfsup.cli import main

    config = tmp_path / "msn.yaml"
    config.write_text("""
method: {name: msn, projector: [32, 32, 16], num_prototypes: 32, mask_ratio: 0.5, momentum_stretch: 1.25}
data: {dataset: digits}
views:
  - {preset: msn, num: 1}
  - {preset: msn, num: 1}
  - {preset: msn_focal, num: 2, size: 4}
model: {backbone: vit_custom, params: {patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2, pos_embed: learned}}
optim: {name: adamw, lr: 0.001, weight_decay: 0.04, weight_decay_end: 0.4, schedule_stretch: 1.25, clip_grad: 3.0}
trainer: {max_steps: 4, batch_size: 32, log_every_steps: 2, progress: false, channels_last: false}
""")
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"ce", "me_max", "mean_entropy", "prototypes_used"} <= set(header)
    assert (run / "plots" / "prototypes_used.png").is_file()
    backbone, meta = load_backbone(run)
    assert meta["params"]["pool"] == "cls_prenorm" and backbone.pool == "cls_prenorm"
    model = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    for name, tensor in load_file(run / "backbone.safetensors").items():
        torch.testing.assert_close(tensor, model[f"target.module.0.{name}"])  # the EMA target, not the encoder
    assert not torch.equal(model["target.module.0.cls_token"], model["encoder.cls_token"])


def test_momentum_horizon_sizes_the_ema_to_the_run() -> None:
    for steps in (200, 800):
        method = _method(total_steps=steps, momentum_horizon=0.05)
        assert method.target.momentum[0] == pytest.approx(1 - 1 / (0.05 * steps))
        assert method.target.momentum[-1] < 1.0 and np.all(np.diff(method.target.momentum) > 0)  # still linear to 1
    byol = build_method({"name": "byol", "projector": [8, 4], "predictor": [8, 4], "momentum_horizon": 0.1},
                        build_backbone("resnet", block="basic", layers=[1], width=4, in_channels=3), 50)
    assert byol.target.momentum[0] == pytest.approx(0.8)
    held = _method(total_steps=800, momentum_horizon=0.05, momentum_end=None)  # null: the start, held
    np.testing.assert_allclose(held.target.momentum, 1 - 1 / (0.05 * 800))
    byol = build_method({"name": "byol", "projector": [8, 4], "predictor": [8, 4], "momentum_horizon": 0.1,
                         "momentum_end": None}, build_backbone("resnet", block="basic", layers=[1], width=4), 50)
    np.testing.assert_allclose(byol.target.momentum, 0.8)
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="momentum_horizon"):
            _method(momentum_horizon=bad)
        with pytest.raises(ConfigError, match="momentum_horizon"):
            build_method({"name": "byol", "momentum_horizon": bad}, build_backbone("resnet", block="basic", layers=[1], width=4), 5)
