"""The MAST loss (Huang et al. 2023, Eqs. 2-7) against hand-computed values and its stated properties."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from selfsup.losses.mast import init_masks, mast_loss, masked_distance, masked_gaussian_distance, symmetric_kl
from selfsup.losses.vicreg import covariance_term, variance_term

N, D, K = 6, 8, 4


def gaussians(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mu_a = torch.randn(N, D, generator=g, dtype=torch.float64)
    mu_b = mu_a + 0.5 * torch.randn(N, D, generator=g, dtype=torch.float64)
    var_a = torch.rand(N, D, generator=g, dtype=torch.float64) + 0.1
    var_b = torch.rand(N, D, generator=g, dtype=torch.float64) + 0.1
    masks = torch.rand(D, K, generator=g, dtype=torch.float64)
    active = (torch.rand(N, K, generator=g) < 0.6).double()
    return mu_a, var_a, mu_b, var_b, masks, active


def test_distance_by_hand() -> None:
    mu_a = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    mu_b = torch.tensor([[0.0, 0.0, 3.0]], dtype=torch.float64)
    var_a = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    var_b = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    masks = torch.tensor([[1.0, 0.0], [0.5, 0.0], [0.0, 2.0]], dtype=torch.float64)
    # k=0: 2 (1*1 + 0.25*4) / ((1 + 1) + (0.5*2 + 0.5*1)) = 4 / 3.5; k=1: 2 (4*9) / (2*3 + 2*1) = 9.
    both = masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, torch.tensor([[1.0, 1.0]]))
    assert both.item() == pytest.approx(4 / 3.5 + 9, rel=1e-5)
    only_first = masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, torch.tensor([[1.0, 0.0]]))
    assert only_first.item() == pytest.approx(4 / 3.5, rel=1e-5)
    assert masked_distance(mu_a, mu_b, masks, torch.tensor([[1.0, 1.0]])).item() == pytest.approx(2.0 + 36.0)


def test_one_full_mask_and_unit_variances_give_vicreg_invariance() -> None:
    mu_a, _, mu_b, _, _, _ = gaussians()
    ones, mask, active = torch.ones(N, D, dtype=torch.float64), torch.ones(D, 1, dtype=torch.float64), torch.ones(N, 1)
    distance = masked_gaussian_distance(mu_a, ones, mu_b, ones, mask, active)
    assert distance.item() == pytest.approx(((mu_a - mu_b) ** 2).sum(1).mean().item() / D, rel=1e-5)
    # lambda D_mg = 25 sum_j delta_j^2: with the KL off, MAST is VICReg (paper form) on the means, plus ||M||_1.
    loss, terms = mast_loss(mu_a, ones, mu_b, ones, mask, active, kl_weight=0.0)
    vicreg = (25 * ((mu_a - mu_b) ** 2).sum(1).mean() + 25 * (variance_term(mu_a) + variance_term(mu_b))
              + covariance_term(mu_a) + covariance_term(mu_b))
    assert loss.item() == pytest.approx((vicreg + 600 / D * mask.sum()).item(), rel=1e-5)
    assert terms["sparsity"].item() == D


def test_homogeneity_in_mask_scale_and_variance_scale() -> None:
    mu_a, var_a, mu_b, var_b, masks, active = gaussians(1)
    base = masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, active)
    scaled_masks = masked_gaussian_distance(mu_a, var_a, mu_b, var_b, 3 * masks, active)
    scaled_var = masked_gaussian_distance(mu_a, 4 * var_a, mu_b, 4 * var_b, masks, active)
    assert scaled_masks.item() == pytest.approx(3 * base.item(), rel=1e-5)
    assert scaled_var.item() == pytest.approx(base.item() / 4, rel=1e-5)


def test_distance_is_zero_exactly_when_the_masked_means_agree() -> None:
    mu_a, var_a, _, var_b, masks, active = gaussians(2)
    masks[: D // 2, 0] = 0.0  # subspace 0 ignores the first half of the dimensions
    mu_b = mu_a.clone()
    mu_b[:, : D // 2] += 1.0
    only_0 = torch.zeros(N, K)
    only_0[:, 0] = 1
    assert masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, only_0).item() == 0.0
    assert masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, torch.ones(N, K)).item() > 0.0


def test_disjoint_blocks_with_unit_variance_average_their_block() -> None:
    mu_a, _, mu_b, _, _, _ = gaussians(3)
    ones = torch.ones(N, D, dtype=torch.float64)
    blocks = torch.zeros(D, K, dtype=torch.float64)
    for k in range(K):
        blocks[k * D // K:(k + 1) * D // K, k] = 1.0
    for k in range(K):
        active = torch.zeros(N, K)
        active[:, k] = 1
        block = slice(k * D // K, (k + 1) * D // K)
        expected = ((mu_a - mu_b)[:, block] ** 2).sum(1).mean() / (D // K)
        assert masked_gaussian_distance(mu_a, ones, mu_b, ones, blocks, active).item() == pytest.approx(
            expected.item(), rel=1e-5)


def test_symmetric_kl_is_both_kl_divergences_plus_d() -> None:
    mu_a, var_a, mu_b, var_b, _, _ = gaussians(4)
    kl = symmetric_kl(mu_a, var_a, mu_b, var_b)
    a, b = Normal(mu_a, var_a.sqrt()), Normal(mu_b, var_b.sqrt())
    reference = (kl_divergence(a, b).sum(1) + kl_divergence(b, a).sum(1)).mean() + D
    assert kl.item() == pytest.approx(reference.item(), rel=1e-5)
    assert kl.item() == pytest.approx(symmetric_kl(mu_b, var_b, mu_a, var_a).item(), rel=1e-12)
    assert symmetric_kl(mu_a, var_a, mu_a, var_a).item() == pytest.approx(D, rel=1e-9)


def test_inactive_subspaces_and_zero_masks_are_inert() -> None:
    mu_a, var_a, mu_b, var_b, masks, _ = gaussians(5)
    masks = masks.clone().requires_grad_()
    active = torch.zeros(N, K)
    active[:, 1] = 1
    masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, active).backward()
    assert masks.grad[:, [0, 2, 3]].abs().sum() == 0 and masks.grad[:, 1].abs().sum() > 0
    zero = torch.zeros(D, K, dtype=torch.float64, requires_grad=True)
    value = masked_gaussian_distance(mu_a, torch.zeros_like(var_a), mu_b, torch.zeros_like(var_b), zero,
                                     torch.ones(N, K))
    value.backward()
    assert value.item() == 0.0 and torch.isfinite(zero.grad).all()


def test_sparsity_gradient_flows_only_through_positive_mask_parameters() -> None:
    """lambda1 ||M||_1 with lambda1 = 600 / (d K) (§3.2): d/dU of the loss itself is 600 / (d K) where U > 0."""
    mu_a, var_a, mu_b, var_b, _, active = gaussians(6)
    u = torch.randn(D, K, dtype=torch.float64, requires_grad=True)
    loss, terms = mast_loss(mu_a, var_a, mu_b, var_b, torch.relu(u), active, invariance_weight=0.0, kl_weight=0.0,
                            var_weight=0.0, cov_weight=0.0)
    loss.backward()
    assert terms["sparsity"].item() == pytest.approx(torch.relu(u).sum().item())
    assert loss.item() == pytest.approx(600 / (8 * 4) * torch.relu(u).sum().item(), rel=1e-12)  # d = 8, K = 4
    assert torch.allclose(u.grad, 600 / (8 * 4) * (u > 0).double(), rtol=1e-12, atol=0)


def test_lambda_follows_the_number_of_active_subspaces() -> None:
    mu_a, var_a, mu_b, var_b, masks, _ = gaussians(7)
    one = torch.zeros(N, K)
    one[torch.arange(N), torch.arange(N) % K] = 1  # stage 1: one augmentation per pair
    loss, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, one, kl_weight=0.0, var_weight=0.0, cov_weight=0.0,
                            sparsity_weight=0.0)
    assert loss.item() == pytest.approx(25 * D / 1 * terms["distance"].item(), rel=1e-6)
    loss, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, torch.ones(N, K), kl_weight=0.0, var_weight=0.0,
                            cov_weight=0.0, sparsity_weight=0.0)
    assert loss.item() == pytest.approx(25 * D / K * terms["distance"].item(), rel=1e-6)


def test_mask_init_gives_each_augmentation_its_block() -> None:
    u = init_masks(64, 4, generator=torch.Generator().manual_seed(0))
    assert u.shape == (64, 4)
    assert [int(u[:, k].argmax()) // 16 for k in range(4)] == [0, 1, 2, 3]
    far = u[48:, 0]  # three blocks away from column 0's bump: noise N(0.2, 0.1^2) only
    assert far.mean().item() == pytest.approx(0.2, abs=0.06) and 0.05 < far.std().item() < 0.16


def test_scale_free_guard_removes_both_degenerate_directions() -> None:
    mu_a, var_a, mu_b, var_b, masks, active = gaussians(8)
    _, plain = mast_loss(mu_a, var_a, mu_b, var_b, masks, active)
    _, base = mast_loss(mu_a, var_a, mu_b, var_b, masks, active, scale_free=True)
    _, scaled = mast_loss(mu_a, 5 * var_a, mu_b, 5 * var_b, 0.1 * masks, active, scale_free=True)
    assert scaled["distance"].item() == pytest.approx(base["distance"].item(), rel=1e-6)
    assert scaled["sparsity"].item() == pytest.approx(0.1 * base["sparsity"].item(), rel=1e-6)  # L1 on the raw masks
    assert base["distance"].item() != pytest.approx(plain["distance"].item(), rel=1e-3)


def test_per_dimension_variance_scale_by_hand() -> None:
    """``variance_scale="dimension"``: each dimension's variances over half the sum of the two views' batch means
    of that dimension; the masks over their column means, as with the batch-wide scale."""
    mu_a = torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64)
    mu_b = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    var_a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)  # dimension means 2, 3
    var_b = torch.tensor([[2.0, 6.0], [2.0, 0.0]], dtype=torch.float64)  # dimension means 2, 3: scales 2, 3
    masks = torch.tensor([[1.0], [3.0]], dtype=torch.float64)  # column mean 2: normalised [0.5, 1.5]
    # pair 0: num 2 (1 * 0.25 + 4 * 2.25) = 18.5, den 0.5 (1 + 2) / 2 + 1.5 (2 + 6) / 3 = 4.75
    # pair 1: num 2 (1 * 0.25 + 0 * 2.25) = 0.5,  den 0.5 (3 + 2) / 2 + 1.5 (4 + 0) / 3 = 3.25
    expected = (18.5 / 4.75 + 0.5 / 3.25) / 2
    _, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, torch.ones(2, 1), scale_free=True,
                         variance_scale="dimension")
    assert terms["distance"].item() == pytest.approx(expected, rel=1e-6)


def test_per_dimension_scale_stops_variance_piling_onto_the_masked_dimensions() -> None:
    """The degenerate direction seen on CIFAR-10: variance raised on the dimensions a mask selects lowers D_mg under
    the batch-wide scale, and leaves it unchanged under the per-dimension one."""
    mu_a, var_a, mu_b, var_b, _, active = gaussians(3)
    masks = torch.full((D, K), 0.05, dtype=torch.float64)
    masks[:2] = 1.0  # every mask on dimensions 0 and 1
    pile = torch.ones(D, dtype=torch.float64)
    pile[:2] = 20.0
    for scale, lowers in (("batch", True), ("dimension", False)):
        _, base = mast_loss(mu_a, var_a, mu_b, var_b, masks, active, scale_free=True, variance_scale=scale)
        _, piled = mast_loss(mu_a, var_a * pile, mu_b, var_b * pile, masks, active, scale_free=True,
                             variance_scale=scale)
        if lowers:
            assert piled["distance"].item() < 0.5 * base["distance"].item()
        else:
            assert piled["distance"].item() == pytest.approx(base["distance"].item(), rel=1e-9)
    with pytest.raises(ValueError, match="variance_scale must be 'batch' or 'dimension', got 'dim'"):
        mast_loss(mu_a, var_a, mu_b, var_b, masks, active, scale_free=True, variance_scale="dim")
