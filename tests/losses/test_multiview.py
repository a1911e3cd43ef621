"""Multi-view Barlow Twins / VICReg (Ghosh et al. 2024, Eq. 10; specs/multiview_small_projectors.md §2.3, §7)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from selfsup.losses.barlow import barlow_twins_loss
from selfsup.losses.multiview import barlow_twins_multiview_loss, vicreg_multiview_loss
from selfsup.losses.vicreg import vicreg_loss


def _views(m: int, n: int = 7, d: int = 5, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    return [0.7 * base + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(m)]


def _bt_reference(views: list[np.ndarray], lambd: float) -> float:
    """The spec's M > 2 formula, written out with per-view standardisation (biased variance, eps 1e-5)."""
    z = np.stack([(v - v.mean(0)) / np.sqrt(v.var(0) + 1e-5) for v in views])  # (M, N, d)
    m, n, d = z.shape
    z_mean = z.mean(0)
    inv = 0.0
    for k in range(m):
        for i in range(d):
            inv += (1 - sum(z[k, b, i] * z_mean[b, i] for b in range(n)) / n) ** 2
    auto = z_mean.T @ z_mean / n
    orth = sum(auto[i, j] ** 2 for i in range(d) for j in range(d) if i != j)
    return inv / m + lambd * orth


def _vicreg_reference(views: list[np.ndarray], lam: float = 25.0, mu: float = 25.0, nu: float = 1.0) -> float:
    """``(1/M) sum_m [lam MSE(z_m, zbar_-m) + mu (v(z_m) + v(zbar_-m)) / 2 + nu (c(z_m) + c(zbar_-m))]``."""

    def var(z: np.ndarray) -> float:
        return float(np.mean(np.maximum(0.0, 1 - np.sqrt(z.var(0, ddof=1) + 1e-4))))

    def cov(z: np.ndarray) -> float:
        c = np.cov(z, rowvar=False)
        return float((c**2).sum() - (np.diag(c) ** 2).sum()) / z.shape[1]

    m = len(views)
    total = 0.0
    for k, z in enumerate(views):
        others = np.mean([v for j, v in enumerate(views) if j != k], axis=0)
        total += lam * np.mean((z - others) ** 2) + mu * (var(z) + var(others)) / 2 + nu * (cov(z) + cov(others))
    return total / m


def test_barlow_twins_hand_computed_three_views() -> None:
    # N = 2 samples standardise to +-1 per dimension; the mean embedding is +-1/3 in both dimensions, so
    # diag C^(m) = (1/3, -1/3), (1/3, 1/3), (-1/3, 1/3): invariance (1/3)(48/9) = 16/9; auto-correlation of
    # the mean has off-diagonals 1/9: orthogonality 2/81.
    views = [torch.tensor(v, dtype=torch.float64) for v in ([[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]],
                                                            [[0.0, 1.0], [1.0, 0.0]])]
    loss, terms = barlow_twins_multiview_loss(views, lambd=0.5)
    assert terms["on_diagonal"].item() == pytest.approx(16 / 9, rel=1e-4)  # rel: eps 1e-5 in the std
    assert terms["off_diagonal"].item() == pytest.approx(2 / 81, rel=1e-4)
    assert loss.item() == pytest.approx(16 / 9 + 0.5 * 2 / 81, rel=1e-4)


@pytest.mark.parametrize("m", [3, 4, 6])
def test_barlow_twins_matches_the_mean_embedding_formula(m: int) -> None:
    views = _views(m, seed=m)
    loss, _ = barlow_twins_multiview_loss(views, lambd=0.05)
    assert loss.item() == pytest.approx(_bt_reference([v.numpy() for v in views], 0.05), rel=1e-10)


@pytest.mark.parametrize("m", [2, 3, 5])
def test_vicreg_matches_the_leave_one_out_formula(m: int) -> None:
    views = _views(m, seed=10 + m)
    loss, _ = vicreg_multiview_loss(views, 3.0, 2.0, 5.0)
    assert loss.item() == pytest.approx(_vicreg_reference([v.numpy() for v in views], 3.0, 2.0, 5.0), rel=1e-10)


def test_two_views_are_exactly_the_two_view_losses() -> None:
    a, b = _views(2, seed=3)
    bt, bt_terms = barlow_twins_multiview_loss([a, b], lambd=0.02)
    bt2, bt2_terms = barlow_twins_loss(a, b, lambd=0.02)
    assert torch.equal(bt, bt2) and bt_terms.keys() == bt2_terms.keys()
    vic, vic_terms = vicreg_multiview_loss([a, b], 10.0, 20.0, 2.0)
    vic2, vic2_terms = vicreg_loss(a, b, 10.0, 20.0, 2.0)
    assert torch.equal(vic, vic2) and vic_terms.keys() == vic2_terms.keys()
    # The leave-one-out formula itself reduces to two-view VICReg (zbar_0 = z_1, zbar_1 = z_0).
    assert vic.item() == pytest.approx(_vicreg_reference([a.numpy(), b.numpy()], 10.0, 20.0, 2.0), rel=1e-12)


LOSSES = {
    "barlow_twins": lambda views: barlow_twins_multiview_loss(views, lambd=0.05)[0],
    "vicreg": lambda views: vicreg_multiview_loss(views)[0],
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_invariant_to_view_order_sample_order_and_dimension_order(name: str) -> None:
    loss_fn = LOSSES[name]
    views = _views(4, seed=7)
    reference = loss_fn(views)
    for order in ([3, 1, 0, 2], [1, 0, 2, 3]):
        torch.testing.assert_close(loss_fn([views[i] for i in order]), reference, rtol=1e-12, atol=0)
    samples = torch.randperm(7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loss_fn([v[samples] for v in views]), reference, rtol=1e-12, atol=0)
    dims = torch.tensor([4, 2, 0, 1, 3])
    torch.testing.assert_close(loss_fn([v[:, dims] for v in views]), reference, rtol=1e-12, atol=0)
    # ...but pairing different samples across views changes it (the comparison above can fail).
    shuffled = [views[0][samples], *views[1:]]
    assert abs(loss_fn(shuffled).item() - reference.item()) > 1e-3


@pytest.mark.parametrize("m", [3, 4, 8])
def test_vicreg_invariance_is_the_pairwise_sum_at_order_m_cost(m: int) -> None:
    # Spec §7.2: sum_m ||z_m - zbar||^2 = (1/M) sum_{m<m'} ||z_m - z_m'||^2 and
    # sum_m ||z_m - zbar_-m||^2 = (M/(M-1))^2 sum_m ||z_m - zbar||^2, so the leave-one-out invariance term
    # (1/M) sum_m MSE(z_m, zbar_-m) equals (M/(M-1))^2 / (M^2 N d) * sum over all M(M-1)/2 pairs.
    views = _views(m, n=6, d=3, seed=m)
    _, terms = vicreg_multiview_loss(views)
    pairs = sum((a - b).pow(2).sum() for a, b in itertools.combinations(views, 2))
    n, d = views[0].shape
    expected = (m / (m - 1)) ** 2 / (m**2 * n * d) * pairs
    assert terms["invariance"].item() == pytest.approx(expected.item(), rel=1e-12)


def test_barlow_twins_minimum_for_identical_decorrelated_views() -> None:
    h = np.array([[1.0]])
    while h.shape[0] < 8:
        h = np.block([[h, h], [h, -h]])
    z = torch.tensor(h[:, 1:5])  # zero-mean, unit-variance, mutually orthogonal columns
    loss, terms = barlow_twins_multiview_loss([z, z.clone(), z.clone()], lambd=0.1)
    assert loss.item() == pytest.approx(0.0, abs=1e-8)  # up to eps 1e-5 in the std
    correlated = z.clone()
    correlated[:, 1] = 0.6 * z[:, 0] + 0.8 * z[:, 1]
    loss, terms = barlow_twins_multiview_loss([correlated] * 3, lambd=0.1)
    assert terms["off_diagonal"].item() == pytest.approx(2 * 0.6**2, rel=1e-4)
    assert loss.item() == pytest.approx(0.1 * 2 * 0.6**2, rel=1e-3)


@pytest.mark.parametrize("name", list(LOSSES))
def test_gradients_match_finite_differences(name: str) -> None:
    views = [v[:, :3].clone().requires_grad_() for v in _views(3, n=5, seed=2)]
    assert torch.autograd.gradcheck(lambda *vs: LOSSES[name](list(vs)), tuple(views))


@pytest.mark.parametrize("loss_fn", [lambda v: barlow_twins_multiview_loss(v, 0.1), vicreg_multiview_loss])
def test_bad_inputs_name_the_problem(loss_fn) -> None:
    views = _views(3)
    with pytest.raises(ValueError, match="at least 2 views"):
        loss_fn(views[:1])
    with pytest.raises(ValueError, match="one shape"):
        loss_fn([views[0], views[1][:, :3], views[2]])
    with pytest.raises(ValueError, match="at least 2 samples"):
        loss_fn([v[:1] for v in views])
