"""VICReg loss against Bardes et al. (ICLR 2022), Eqs. 1-6, written out independently with numpy loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfsup.losses.vicreg import covariance_term, off_diagonal, variance_term, vicreg_loss


def _hadamard(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def _reference(za: np.ndarray, zb: np.ndarray, lam: float = 25.0, mu: float = 25.0, nu: float = 1.0):
    n, d = za.shape
    inv = sum((za[i, j] - zb[i, j]) ** 2 for i in range(n) for j in range(d)) / (n * d)

    def var(z):
        total = 0.0
        for j in range(d):
            mean = sum(z[i, j] for i in range(n)) / n
            unbiased = sum((z[i, j] - mean) ** 2 for i in range(n)) / (n - 1)
            total += max(0.0, 1.0 - math.sqrt(unbiased + 1e-4))
        return total / d

    def cov(z):
        means = [sum(z[i, j] for i in range(n)) / n for j in range(d)]
        total = 0.0
        for j in range(d):
            for k in range(d):
                if j != k:
                    c = sum((z[i, j] - means[j]) * (z[i, k] - means[k]) for i in range(n)) / (n - 1)
                    total += c * c
        return total / d

    v = 0.5 * (var(za) + var(zb))
    c = cov(za) + cov(zb)
    return lam * inv + mu * v + nu * c, inv, v, c


def test_off_diagonal_3x3_hand_example() -> None:
    m = torch.arange(1.0, 10.0).view(3, 3)  # [[1,2,3],[4,5,6],[7,8,9]]
    assert off_diagonal(m).tolist() == [2.0, 3.0, 4.0, 6.0, 7.0, 8.0]


@pytest.mark.parametrize("n,d,scale", [(5, 3, 0.3), (6, 4, 1.5), (3, 6, 0.8)])
def test_vicreg_matches_paper_formula(n: int, d: int, scale: float) -> None:
    g = torch.Generator().manual_seed(n * 10 + d)
    za = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    zb = za + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    loss, terms = vicreg_loss(za, zb)
    ref, inv, v, c = _reference(za.numpy(), zb.numpy())
    assert terms["invariance"].item() == pytest.approx(inv, rel=1e-10)
    assert terms["variance"].item() == pytest.approx(v, rel=1e-10, abs=1e-12)
    assert terms["covariance"].item() == pytest.approx(c, rel=1e-10)
    assert loss.item() == pytest.approx(ref, rel=1e-10)
    # The variance term is not trivially zero here (scale < 1 or small batch), so the test can fail.
    if scale < 1:
        assert v > 0.05


def test_vicreg_custom_weights() -> None:
    g = torch.Generator().manual_seed(0)
    za = torch.randn(6, 4, generator=g, dtype=torch.float64) * 0.5
    zb = torch.randn(6, 4, generator=g, dtype=torch.float64) * 0.5
    loss, _ = vicreg_loss(za, zb, sim_weight=2.0, var_weight=3.0, cov_weight=5.0)
    ref, *_ = _reference(za.numpy(), zb.numpy(), 2.0, 3.0, 5.0)
    assert loss.item() == pytest.approx(ref, rel=1e-10)


def test_covariance_term_zero_for_decorrelated_features() -> None:
    # Columns 1..7 of a Hadamard matrix: zero mean and mutually orthogonal -> zero covariance.
    z = torch.tensor(_hadamard(8)[:, 1:] * 0.7)
    assert covariance_term(z).item() == pytest.approx(0.0, abs=1e-14)
    # ... and positive as soon as two dimensions correlate.
    z_corr = z.clone()
    z_corr[:, 1] = z_corr[:, 0]
    assert covariance_term(z_corr).item() == pytest.approx(2 * (0.49 * 8 / 7) ** 2 / 7, rel=1e-10)


def test_covariance_term_uses_unbiased_covariance_over_d() -> None:
    # 2 dims, identical columns [1, -1]: cov = 2 / (n - 1) = 2, off-diagonal sum of squares = 2 * 4 = 8, / d = 4.
    z = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    assert covariance_term(z).item() == pytest.approx(4.0)


def test_variance_term_zero_when_all_stds_at_least_one() -> None:
    z = torch.tensor(_hadamard(8)[:, 1:])  # unbiased variance 8/7 per dimension
    assert variance_term(z).item() == 0.0
    _, terms = vicreg_loss(z, z)
    assert terms["variance"].item() == 0.0
    assert terms["covariance"].item() == pytest.approx(0.0, abs=1e-14)
    assert terms["invariance"].item() == 0.0


def test_variance_term_hand_values() -> None:
    z = torch.tensor(_hadamard(8)[:, 1:] * 0.5)  # std = sqrt(0.25 * 8 / 7 + 1e-4)
    assert variance_term(z).item() == pytest.approx(1 - math.sqrt(0.25 * 8 / 7 + 1e-4), rel=1e-12)


def test_variance_term_collapsed_batch() -> None:
    z = torch.ones(6, 5) * 3.0  # every row equal: var 0, std = sqrt(1e-4) = 0.01
    assert variance_term(z).item() == pytest.approx(0.99, rel=1e-6)
    loss, terms = vicreg_loss(z, z)
    assert terms["variance"].item() == pytest.approx(0.99, rel=1e-6)
    assert loss.item() == pytest.approx(25 * 0.99, rel=1e-6)


def test_variance_averaged_over_branches_covariance_summed() -> None:
    good = torch.tensor(_hadamard(8)[:, 1:])
    collapsed = torch.zeros(8, 7, dtype=torch.float64)
    _, terms = vicreg_loss(good, collapsed)
    assert terms["variance"].item() == pytest.approx(0.5 * 0.99, rel=1e-10)
    corr = good.clone()
    corr[:, 1] = corr[:, 0]
    single = covariance_term(corr).item()
    _, terms = vicreg_loss(corr, corr)
    assert terms["covariance"].item() == pytest.approx(2 * single, rel=1e-12)


def test_vicreg_needs_two_samples() -> None:
    with pytest.raises(ValueError):
        vicreg_loss(torch.randn(1, 4), torch.randn(1, 4))


def test_vicreg_gradient_matches_finite_differences() -> None:
    g = torch.Generator().manual_seed(1)
    za = (torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    zb = (torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: vicreg_loss(a, b)[0], (za, zb))
