"""MoCo v3: the symmetric step, its heads, the momentum encoder and its schedule, the frozen random patch
projection, the view count on load. Against the authors' code: tests/test_golden.py (mocov3)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.losses.infonce import moco_contrastive_loss
from selfsup.methods import build_method
from selfsup.methods.mocov3 import MoCoV3, MoCoV3Config
from selfsup.models import build_backbone
from selfsup.models.vit import VisionTransformer

PRESET = Path(__file__).resolve().parents[2] / "configs" / "cifar10" / "laptop" / "mocov3.yaml"
HEADS = {"projector": [32, 32, 16], "predictor": [32, 16]}


def _resnet() -> nn.Module:
    return build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=1)


def _vit(conv_stem: list[int] | None = None) -> VisionTransformer:
    return VisionTransformer(img_size=16, patch_size=4, in_channels=1, embed_dim=16, depth=2, num_heads=2,
                             conv_stem=conv_stem)


def _method(backbone: nn.Module | None = None, total_steps: int = 10, **kwargs) -> MoCoV3:
    torch.manual_seed(0)
    return MoCoV3(backbone if backbone is not None else _resnet(), MoCoV3Config(**{**HEADS, **kwargs}),
                  total_steps).train()


def _views(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(8, 1, 16, 16, generator=g) for _ in range(2)]


def _train(method: MoCoV3, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.5)
    losses = []
    for step in range(steps):
        out = method(_views(seed=step))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        method.after_step(step)
        losses.append(out.loss.item())
    return losses


def test_step_is_the_symmetric_ctr_of_predictions_against_the_other_views_momentum_keys() -> None:
    method = _method(temperature=0.3)
    x1, x2 = _views()
    out = method([x1, x2])
    z1, z2 = method.projector(method.backbone(x1)), method.projector(method.backbone(x2))
    q1, q2 = method.predictor(z1), method.predictor(z2)
    k1, k2 = method.momentum_encoder(x1), method.momentum_encoder(x2)
    expected = moco_contrastive_loss(q1, k2, 0.3) + moco_contrastive_loss(q2, k1, 0.3)
    torch.testing.assert_close(out.loss, expected)
    assert not torch.allclose(out.loss, moco_contrastive_loss(q1, k1, 0.3) + moco_contrastive_loss(q2, k2, 0.3))
    torch.testing.assert_close(out.embeddings, z1.detach())
    assert out.terms == {}  # no extra terms to log (the engine iterates them)


def test_heads_are_the_authors_layout_and_the_momentum_encoder_gets_no_gradient() -> None:
    method = _method()
    kinds = [type(m) for m in method.projector]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    assert all(m.bias is None for m in method.projector if isinstance(m, nn.Linear))
    assert not method.projector[-1].affine and method.projector[1].affine  # last BN without affine
    assert [type(m) for m in method.predictor][-1] is nn.BatchNorm1d and not method.predictor[-1].affine
    resnet_style = _method(projector=[32, 16], predictor=[32, 16], predictor_last_norm=False)
    assert [type(m) for m in resnet_style.predictor] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    out = method(_views())
    out.loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in method.momentum_encoder.parameters())
    assert all(p.grad is not None for p in method.backbone.parameters())
    assert all(p.grad is not None for p in method.predictor.parameters())


def test_a_few_steps_train_the_base_encoder_and_move_the_momentum_encoder_towards_it() -> None:
    method = _method(total_steps=3)
    student0 = copy.deepcopy(method.backbone.state_dict())
    teacher0 = [p.clone() for p in method.momentum_encoder.module[0].parameters()]
    losses = _train(method, steps=3)
    assert all(np.isfinite(losses))
    moved = [not torch.equal(p, p0) for p, p0 in zip(method.momentum_encoder.module[0].parameters(), teacher0)]
    assert any(moved)
    student = list(method.backbone.parameters())
    assert any(not torch.equal(t, s) for t, s in zip(method.momentum_encoder.module[0].parameters(), student))
    assert any(not torch.equal(p, student0[n]) for n, p in method.backbone.named_parameters())
    assert method.backbone is not method.momentum_encoder.module[0]  # the export is the base encoder


def test_momentum_schedule_rises_from_m0_to_one_by_half_cosine() -> None:
    method = _method(total_steps=100, momentum=0.99)
    m = method.momentum_encoder.momentum
    assert len(m) == 100 and m[0] == pytest.approx(0.99) and m[50] == pytest.approx(0.995)
    assert m[-1] == pytest.approx(1 - 0.5 * (1 + np.cos(np.pi * 99 / 100)) * 0.01)
    assert np.all(np.diff(m) > 0)
    held = _method(total_steps=100, momentum=0.99, momentum_end=None).momentum_encoder.momentum
    assert np.all(held == 0.99)


@pytest.mark.parametrize("conv_stem", [None, [8]])
def test_frozen_random_patch_projection_stays_put(conv_stem: list[int] | None) -> None:
    """method.freeze_patch_embed: the patch projection (and a conv stem's convolutions and BatchNorm affines) keep
    their init through training, in the base and the momentum encoder; the rest of the ViT trains."""
    vit = _vit(conv_stem)
    method = _method(vit, freeze_patch_embed=True)
    frozen = {n: p.clone() for n, p in vit.named_parameters() if n.startswith(("patch_embed.", "stem."))}
    assert len(frozen) == (2 if conv_stem is None else 5)
    others = {n: p.clone() for n, p in vit.named_parameters() if n not in frozen}
    _train(method, steps=2)
    params = dict(vit.named_parameters())
    for name, value in frozen.items():
        assert not params[name].requires_grad and params[name].grad is None, name
        assert torch.equal(params[name], value), name
    teacher = dict(method.momentum_encoder.module[0].named_parameters())
    assert all(torch.equal(teacher[n], v) for n, v in frozen.items())
    assert others and all(not torch.equal(params[n], v) for n, v in others.items())
    trains = _method(_vit(conv_stem))
    assert all(p.requires_grad for p in trains.backbone.parameters())


def test_frozen_patch_projection_needs_a_vit() -> None:
    with pytest.raises(ConfigError, match=r"^method.freeze_patch_embed freezes a ViT's patch projection; the backbone "
                                          r"ResNet has none: set method.freeze_patch_embed=false$"):
        _method(freeze_patch_embed=True)


def test_config_is_checked_and_the_view_count_on_load() -> None:
    with pytest.raises(ConfigError, match=r"method.predictor must end at the projector's output width 16"):
        MoCoV3Config(projector=[32, 16], predictor=[32, 8])
    with pytest.raises(ConfigError, match=r"^method.predictor must end at the projector's output width 16 \(its "
                                          r"queries meet the momentum encoder's keys\), got \[16, 32\]$"):
        MoCoV3Config(projector=[32, 32, 16], predictor=[16, 32])  # a 3-layer projector: its last width, not its 2nd
    assert MoCoV3Config(projector=[32, 16], predictor=[32, 8, 16]).predictor == [32, 8, 16]  # 3 layers, ends at 16
    with pytest.raises(ConfigError, match=r"bad value for method.temperature: 0"):
        MoCoV3Config(temperature=0.0)
    for made in (1, 3):
        with pytest.raises(ConfigError, match=f"method mocov3 needs 2 views per image but the config makes {made}"):
            load_config(None, ["method.name=mocov3", f"views=[{{preset: minimal, num: {made}}}]"])
    cfg = load_config(PRESET)
    assert cfg.method["name"] == "mocov3" and cfg.method["temperature"] == 1.0
    method = build_method(cfg.method, _resnet(), 10)
    assert isinstance(method, MoCoV3) and [type(m) for m in method.predictor][-1] is nn.Linear
