"""Small projectors, tuned orthogonality weights and M-view VICReg / Barlow Twins steps (Ghosh et al. 2024)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.losses.multiview import barlow_twins_multiview_loss, vicreg_multiview_loss
from selfsup.methods import build_method, method_config
from selfsup.methods.small_projectors import (BARLOW_TWINS_BETA, VICREG_SIM_WEIGHT, barlow_twins_beta, build_projector,
                                              tuned_value, vicreg_sim_weight)
from selfsup.models import build_backbone


@pytest.mark.parametrize("p,weights", [(64, 135_168), (256, 589_824), (8192, 83_886_080)])
def test_projector_has_the_papers_weight_count_and_layers(p: int, weights: int) -> None:
    # Table D.1: 2048 p + p^2 weights (135k, 589k, 83.9M) on a ResNet-50's 2048-d feature.
    with torch.device("meta"):
        head = build_projector(2048, p, last_bias=False)
    first, norm, act, last = head
    assert isinstance(norm, nn.BatchNorm1d) and isinstance(act, nn.ReLU) and len(head) == 4
    assert (first.in_features, first.out_features, first.bias) == (2048, p, None)
    assert (last.in_features, last.out_features) == (p, p) and last.bias is not None
    assert first.weight.numel() + last.weight.numel() == weights == 2048 * p + p * p


@pytest.mark.parametrize("last_bias", [False, True])
def test_list_spec_keeps_the_classic_mlp(last_bias: bool) -> None:
    head = build_projector(16, [32, 32, 8], last_bias=last_bias)
    linears = [m for m in head if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(16, 32), (32, 32), (32, 8)]
    assert linears[0].bias is not None and (linears[-1].bias is not None) == last_bias


def test_tuned_weights_are_the_authors_table_values() -> None:
    for p, beta in BARLOW_TWINS_BETA.items():
        assert barlow_twins_beta(p, 2) == beta
    assert barlow_twins_beta(256, 2) == 0.02 and barlow_twins_beta(8192, 2) == 0.0008
    # Their M = 4 / M = 8 runs: 0.01 at p = 256, 0.0004 at p = 8192 (half the two-view values).
    assert barlow_twins_beta(256, 4) == 0.01 and barlow_twins_beta(8192, 8) == 0.0004
    assert [vicreg_sim_weight(p) for p in (64, 256, 2048, 8192)] == [20.0, 25.0, 75.0, 800.0]
    assert set(VICREG_SIM_WEIGHT) == {64, 128, 256, 512, 1024, 2048, 4096, 8192}


def test_rule_outside_the_table() -> None:
    # Between 256 (0.02) and 512 (0.01) beta * p = 5.12 at both ends, so log-log interpolation gives 5.12 / p.
    assert barlow_twins_beta(384, 2) == pytest.approx(5.12 / 384, rel=1e-12)
    # VICReg between 1024 (25) and 2048 (75): 25 * 3^(log2(p / 1024)).
    assert vicreg_sim_weight(1536) == pytest.approx(25 * 3 ** math.log2(1.5), rel=1e-12)
    # Beyond the ends: beta ~ 1/p (VICReg lambda = 1/beta ~ p).
    assert barlow_twins_beta(32, 2) == pytest.approx(0.08) and barlow_twins_beta(16384, 2) == pytest.approx(0.0004)
    assert barlow_twins_beta(32, 4) == pytest.approx(0.04)
    assert vicreg_sim_weight(32) == pytest.approx(10.0) and vicreg_sim_weight(16384) == pytest.approx(1600.0)
    assert tuned_value({10: 1.0, 1000: 100.0}, 100, exponent=1.0) == pytest.approx(10.0)
    # Between the two smallest widths (64, 128: both 20 / 0.04) and the two largest (4096: 200, 8192: 800).
    assert vicreg_sim_weight(96) == pytest.approx(20.0) and barlow_twins_beta(96, 2) == pytest.approx(0.04)
    assert vicreg_sim_weight(6144) == pytest.approx(200 * 4 ** math.log2(1.5))  # = 450
    # p = 1 is a valid width: the 1/p rule from p = 64.
    assert vicreg_sim_weight(1) == pytest.approx(20.0 / 64) and barlow_twins_beta(1, 2) == pytest.approx(0.04 * 64)
    # A one-width table extrapolates from that width on both sides.
    assert tuned_value({100: 2.0}, 50, exponent=-1.0) == pytest.approx(4.0)
    assert tuned_value({100: 2.0}, 400, exponent=-1.0) == pytest.approx(0.5)
    for bad in (0, -3, True, 96.0):
        with pytest.raises(ValueError, match="positive int"):
            vicreg_sim_weight(bad)
    with pytest.raises(ValueError, match="at least 2 views"):
        barlow_twins_beta(256, 1)


def _backbone() -> nn.Module:
    return build_backbone("resnet", block="basic", layers=[1, 1, 1, 1], width=8, small_stem=True, in_channels=1)


def _views(m: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(8, 1, 16, 16, generator=g) for _ in range(m)]


@pytest.mark.parametrize("m", [3, 4])
def test_barlow_twins_step_with_m_views_and_tuned_beta(m: int) -> None:
    torch.manual_seed(0)
    method = build_method({"name": "barlow_twins", "projector": 32, "lambd": "auto"}, _backbone(), 10).train()
    assert isinstance(method.projector[0], nn.Linear) and method.projector[0].bias is None
    views = _views(m)
    out = method(views)
    z = [method.projector(method.backbone(v)) for v in views]
    beta = barlow_twins_beta(32, m)
    assert beta == pytest.approx(0.04 * 64 / 32 / 2)
    torch.testing.assert_close(out.loss, barlow_twins_multiview_loss(z, beta)[0])
    assert not torch.allclose(out.loss, barlow_twins_multiview_loss(z, 2 * beta)[0])
    torch.testing.assert_close(out.embeddings, z[0].detach())
    out.loss.backward()
    assert all(p.grad is not None for p in method.backbone.parameters())


def test_vicreg_step_with_m_views_and_tuned_weights() -> None:
    torch.manual_seed(0)
    method = build_method({"name": "vicreg", "expander": 256, "sim_weight": "auto", "var_weight": "auto"},
                          _backbone(), 10).train()
    assert (method.sim_weight, method.var_weight) == (25.0, 25.0)
    views = _views(3)
    out = method(views)
    z = [method.expander(method.backbone(v)) for v in views]
    torch.testing.assert_close(out.loss, vicreg_multiview_loss(z, 25.0, 25.0, 1.0)[0])
    assert set(out.terms) == {"invariance", "variance", "covariance"}
    # var_weight "auto" follows a numeric sim_weight (the authors tie lambda = mu); a number stays itself.
    method = build_method({"name": "vicreg", "expander": 256, "sim_weight": 75, "var_weight": "auto"}, _backbone(), 10)
    assert (method.sim_weight, method.var_weight) == (75.0, 75.0)
    method = build_method({"name": "vicreg", "expander": [64, 64]}, _backbone(), 10)
    assert (method.sim_weight, method.var_weight) == (25.0, 25.0)


def test_auto_weights_read_the_output_width_of_a_list_projector() -> None:
    # [16, 64, 256]: p = 256, the last width (not 64).
    vicreg = build_method({"name": "vicreg", "expander": [16, 64, 256], "sim_weight": "auto"}, _backbone(), 10)
    assert vicreg.sim_weight == 25.0
    barlow = build_method({"name": "barlow_twins", "projector": [16, 64, 256], "lambd": "auto"}, _backbone(), 10)
    assert barlow.off_diagonal_weight(2) == 0.02


def test_bad_weight_or_projector_values_name_the_key() -> None:
    with pytest.raises(ConfigError, match="method.lambd"):
        method_config({"name": "barlow_twins", "lambd": "tuned"})
    with pytest.raises(ConfigError, match="method.expander"):
        method_config({"name": "vicreg", "expander": "wide"})
    with pytest.raises(ValueError, match="at least 2 views"):
        build_method({"name": "vicreg", "expander": 16}, _backbone(), 10)(_views(1))
