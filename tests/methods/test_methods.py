"""VICReg, Barlow Twins and BYOL training steps on a tiny ResNet: wiring, gradients, BYOL's EMA target."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.losses.barlow import barlow_twins_loss
from selfsup.losses.byol import byol_loss
from selfsup.losses.vicreg import vicreg_loss
from selfsup.methods import METHODS, build_method
from selfsup.methods.barlow_twins import BarlowTwinsConfig
from selfsup.methods.byol import BYOLConfig
from selfsup.methods.vicreg import VICRegConfig
from selfsup.models import build_backbone

SPECS = {
    "vicreg": {"name": "vicreg", "expander": [32, 32]},
    "barlow_twins": {"name": "barlow_twins", "projector": [32, 32], "lambd": 0.01},
    "byol": {"name": "byol", "projector": [32, 16], "predictor": [32, 16]},
}


def _backbone():
    return build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=1)


def _method(name: str, total_steps: int = 100):
    torch.manual_seed(0)
    return build_method(SPECS[name], _backbone(), total_steps)


def _views(n: int = 2):
    g = torch.Generator().manual_seed(1)
    return [torch.rand(8, 1, 16, 16, generator=g) for _ in range(n)]


@pytest.mark.parametrize("name", list(SPECS))
def test_forward_gives_finite_scalar_loss_and_backbone_gradients(name: str) -> None:
    method = _method(name).train()
    out = method(_views())
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.embeddings is not None and out.embeddings.shape[0] == 8 and not out.embeddings.requires_grad
    out.loss.backward()
    grads = [p.grad for p in method.backbone.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum().item() for g in grads) > 0


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_declares_its_views_and_a_count_outside_them_is_refused_on_load(name: str) -> None:
    """The one view-count check: the method config's VIEWS = (least, most), against the sum of views.*.num when the
    config is loaded (no method checks its views inside its step)."""
    least, most = METHODS[name].Config.VIEWS
    assert 1 <= least and (most is None or most >= least)
    counts = [least - 1] + ([most + 1] if most is not None else [])
    for made in [n for n in counts if n >= 1]:
        with pytest.raises(ConfigError, match=f"method {name} needs .* views per image but the config makes {made}"):
            load_config(None, [f"method.name={name}", f"views=[{{preset: minimal, num: {made}}}]"])
    ok = least if name != "mast" else 2
    assert load_config(None, [f"method.name={name}", f"views=[{{preset: minimal, num: {ok}}}]"]).method["name"] == name


def test_vicreg_step_is_the_vicreg_loss_of_the_expanded_views() -> None:
    method = _method("vicreg").train()
    views = _views()
    out = method(views)
    z_a, z_b = (method.expander(method.backbone(v)) for v in views)
    assert z_a.shape == (8, 32)
    expected, terms = vicreg_loss(z_a, z_b)
    torch.testing.assert_close(out.loss, expected)
    assert set(out.terms) == {"invariance", "variance", "covariance"}
    torch.testing.assert_close(out.embeddings, z_a.detach())


def test_vicreg_step_uses_the_configured_weights() -> None:
    torch.manual_seed(0)
    spec = {**SPECS["vicreg"], "sim_weight": 10.0, "var_weight": 5.0, "cov_weight": 0.5}
    method = build_method(spec, _backbone(), 100).train()
    assert (method.sim_weight, method.var_weight) == (10.0, 5.0)
    views = _views()
    out = method(views)
    z_a, z_b = (method.expander(method.backbone(v)) for v in views)
    torch.testing.assert_close(out.loss, vicreg_loss(z_a, z_b, 10.0, 5.0, 0.5)[0])


def test_barlow_step_uses_configured_lambda() -> None:
    method = _method("barlow_twins").train()
    views = _views()
    out = method(views)
    z_a, z_b = (method.projector(method.backbone(v)) for v in views)
    torch.testing.assert_close(out.loss, barlow_twins_loss(z_a, z_b, 0.01)[0])
    assert not torch.allclose(out.loss, barlow_twins_loss(z_a, z_b, 0.0051)[0])
    assert set(out.terms) == {"on_diagonal", "off_diagonal"}


def test_barlow_projector_is_the_authors_mlp_without_a_last_bias() -> None:
    # Zbontar et al.'s code: Linear -> BN -> ReLU per hidden layer, then Linear(bias=False)
    head = _method("barlow_twins").projector
    assert [type(m) for m in head] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert [(m.in_features, m.out_features) for m in (head[0], head[3])] == [(64, 32), (32, 32)]
    assert head[3].bias is None


def test_config_errors_built_in_python_name_the_method_key() -> None:
    with pytest.raises(ConfigError, match=r"bad value for method\.lambd: -1\.0"):
        BarlowTwinsConfig(lambd=-1.0)
    with pytest.raises(ConfigError, match=r"bad value for method\.cov_weight: -1\.0"):
        VICRegConfig(cov_weight=-1.0)


def test_byol_symmetrised_loss_and_frozen_target() -> None:
    method = _method("byol").train()
    views = _views()
    out = method(views)
    z = [method.projector(method.backbone(v)) for v in views]
    p = [method.predictor(zi) for zi in z]
    t = [method.target(v) for v in views]
    torch.testing.assert_close(out.loss, byol_loss(p[0], t[1]) + byol_loss(p[1], t[0]))
    assert out.terms == {}
    torch.testing.assert_close(out.embeddings, z[0].detach())  # the first view's online projection
    out.loss.backward()
    assert all(not q.requires_grad and q.grad is None for q in method.target.parameters())
    assert all(q.grad is not None for q in method.predictor.parameters())
    # The target is a separate copy of backbone + projector, not shared with the online network.
    online = list(method.backbone.parameters()) + list(method.projector.parameters())
    target = list(method.target.parameters())
    assert len(online) == len(target)
    assert not {q.data_ptr() for q in online} & {q.data_ptr() for q in target}


def test_byol_after_step_moves_target_by_the_momentum_schedule() -> None:
    method = _method("byol", total_steps=10).train()
    online_w = method.backbone.stem[0].weight
    target_w = method.target.module[0].stem[0].weight
    torch.testing.assert_close(online_w, target_w)  # starts as a copy
    with torch.no_grad():
        for q in list(method.backbone.parameters()) + list(method.projector.parameters()):
            q.add_(torch.randn_like(q))
    # Steps 0, 4, the last one (9) and past the schedule's end, which uses the last value instead of failing.
    for step in (0, 4, 9, 10_000):
        t0, s = target_w.detach().clone(), online_w.detach().clone()
        m = 1 - (1 - 0.996) * (math.cos(math.pi * min(step, 9) / 10) + 1) / 2  # BYOL Sec. 3.2
        method.after_step(step)
        torch.testing.assert_close(target_w.detach(), m * t0 + (1 - m) * s, rtol=1e-6, atol=1e-7)
        assert (target_w - t0).abs().max() > 0
    assert method.target.momentum[0] == pytest.approx(0.996) and method.target.momentum[4] > 0.996


def test_byol_heads_are_linear_bn_relu_mlps_and_the_predictor_reads_the_projection() -> None:
    # BYOL Sec. 3.3: Linear -> BN -> ReLU -> Linear; here 3 projector and 3 predictor layers
    torch.manual_seed(0)
    method = build_method({"name": "byol", "projector": [32, 24, 16], "predictor": [40, 8, 16]}, _backbone(), 10)
    hidden = [nn.Linear, nn.BatchNorm1d, nn.ReLU]
    for head, widths in ((method.projector, [(64, 32), (32, 24), (24, 16)]),
                         (method.predictor, [(16, 40), (40, 8), (8, 16)])):
        assert [type(m) for m in head] == hidden + hidden + [nn.Linear]
        assert [(m.in_features, m.out_features) for m in head if isinstance(m, nn.Linear)] == widths


def test_byol_predictor_must_end_at_the_projector_width() -> None:
    with pytest.raises(ConfigError, match=r"projector's output width 16 \(it predicts .*got \[32, 8\]"):
        BYOLConfig(projector=[32, 24, 16], predictor=[32, 8])


def test_byol_momentum_schedule() -> None:
    total = 200
    m = _method("byol", total_steps=total).target.momentum
    assert len(m) == total
    assert m[0] == pytest.approx(0.996) and 0.99999 < m[-1] < 1.0
    assert all(a <= b for a, b in zip(m[:-1], m[1:]))
    k = torch.arange(total, dtype=torch.float64)
    tau = 1 - (1 - 0.996) * (torch.cos(torch.pi * k / total) + 1) / 2  # BYOL Sec. 3.2
    torch.testing.assert_close(torch.as_tensor(m, dtype=torch.float64), tau)


def test_the_engine_calls_method_hooks_without_probing_for_them() -> None:
    """Every method is a MethodBase whose hooks are no-ops by default: no ``hasattr(method, "<hook>")`` in the engine."""
    import re
    from pathlib import Path

    import selfsup
    from selfsup.methods.base import MethodBase

    assert all(issubclass(cls, MethodBase) for cls in METHODS.values())
    probe = re.compile(r"hasattr\([^)]*\"(after_step|after_carry_over|make_views|attach_views|export_params)\"")
    root = Path(selfsup.__file__).parent
    found = [f"{path.relative_to(root)}:{i}" for path in root.rglob("*.py")
             for i, line in enumerate(path.read_text().splitlines(), 1) if probe.search(line)]
    assert not found, found
