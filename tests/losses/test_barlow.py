"""Barlow Twins loss against Zbontar et al. (ICML 2021), Eqs. 1-2, written out with numpy loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfsup.losses.barlow import barlow_twins_loss, cross_correlation


def _hadamard(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _reference_c(za: np.ndarray, zb: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    n, d = za.shape

    def standardise(z):
        out = np.empty_like(z)
        for j in range(d):
            mean = sum(z[i, j] for i in range(n)) / n
            biased = sum((z[i, j] - mean) ** 2 for i in range(n)) / n
            for i in range(n):
                out[i, j] = (z[i, j] - mean) / math.sqrt(biased + eps)
        return out

    a, b = standardise(za), standardise(zb)
    c = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            c[i, j] = sum(a[k, i] * b[k, j] for k in range(n)) / n
    return c


def _reference_loss(za: np.ndarray, zb: np.ndarray, lambd: float = 0.0051):
    c = _reference_c(za, zb)
    d = c.shape[0]
    on = sum((1 - c[i, i]) ** 2 for i in range(d))
    off = sum(c[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
    return on + lambd * off, on, off


@pytest.mark.parametrize("n,d", [(4, 3), (7, 5), (3, 6)])
def test_barlow_matches_paper_formula(n: int, d: int) -> None:
    g = torch.Generator().manual_seed(n + 100 * d)
    za = torch.randn(n, d, generator=g, dtype=torch.float64) * 2 + 1
    zb = za + torch.randn(n, d, generator=g, dtype=torch.float64)
    np.testing.assert_allclose(cross_correlation(za, zb).numpy(), _reference_c(za.numpy(), zb.numpy()),
                               rtol=1e-10, atol=1e-12)
    loss, terms = barlow_twins_loss(za, zb)
    ref, on, off = _reference_loss(za.numpy(), zb.numpy())
    assert terms["on_diagonal"].item() == pytest.approx(on, rel=1e-10)
    assert terms["off_diagonal"].item() == pytest.approx(off, rel=1e-10)
    assert loss.item() == pytest.approx(ref, rel=1e-10)


def test_barlow_lambda_weights_off_diagonal() -> None:
    g = torch.Generator().manual_seed(3)
    za = torch.randn(6, 4, generator=g, dtype=torch.float64)
    zb = torch.randn(6, 4, generator=g, dtype=torch.float64)
    loss, terms = barlow_twins_loss(za, zb, lambd=0.5)
    ref, on, off = _reference_loss(za.numpy(), zb.numpy(), 0.5)
    assert off > 0.1
    assert loss.item() == pytest.approx(ref, rel=1e-10)
    assert loss.item() == pytest.approx((terms["on_diagonal"] + 0.5 * terms["off_diagonal"]).item(), rel=1e-12)


def test_identical_decorrelated_inputs_give_identity_correlation() -> None:
    # 4 samples, 3 zero-mean orthogonal dims. With the *biased* variance C_ii = 1 / (1 + eps);
    # an unbiased-variance standardisation would give C_ii = 3/4 and on-diagonal 3 * (1/4)^2.
    z = torch.tensor(_hadamard(4)[:, 1:] * 3.0)
    c = cross_correlation(z, z)
    expected_diag = 9.0 / (9.0 + 1e-5)
    np.testing.assert_allclose(torch.diagonal(c).numpy(), [expected_diag] * 3, rtol=1e-12)
    loss, terms = barlow_twins_loss(z, z)
    assert terms["on_diagonal"].item() == pytest.approx(3 * (1 - expected_diag) ** 2, abs=1e-15)
    assert terms["on_diagonal"].item() < 1e-10
    assert terms["off_diagonal"].item() == pytest.approx(0.0, abs=1e-20)
    assert loss.item() < 1e-10


def test_opposite_inputs_give_on_diagonal_about_4d() -> None:
    z = torch.tensor(_hadamard(8)[:, 1:])
    _, terms = barlow_twins_loss(z, -z)
    assert terms["on_diagonal"].item() == pytest.approx(4 * 7, rel=1e-4)


def test_barlow_invariant_to_per_dimension_affine_maps() -> None:
    g = torch.Generator().manual_seed(5)
    za = torch.randn(16, 4, generator=g, dtype=torch.float64)
    zb = torch.randn(16, 4, generator=g, dtype=torch.float64)
    scale = torch.tensor([0.5, 2.0, 3.0, 10.0], dtype=torch.float64)
    base, _ = barlow_twins_loss(za, zb)
    moved, _ = barlow_twins_loss(za * scale + 7, zb * scale - 2)
    assert moved.item() == pytest.approx(base.item(), rel=1e-4)  # up to the eps in the standardisation


def test_barlow_needs_two_samples() -> None:
    with pytest.raises(ValueError):
        barlow_twins_loss(torch.randn(1, 4), torch.randn(1, 4))
