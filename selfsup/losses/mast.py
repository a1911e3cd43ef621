"""MAST: masked augmentation subspace training (Huang et al., ICLR 2023, §3.1, Eqs. 2-7).

Each view is a diagonal Gaussian ``N(mu, diag var)`` over d dimensions; K non-negative masks
``M (d, K)``, one per augmentation, pick the subspace in which each augmentation's invariance is
enforced. The loss (Eq. 7)::

    lambda * D_mg + lambda1 * ||M||_1 + lambda2 * sym_KL + alpha * l_var + beta * l_cov

with the paper's coefficients lambda = 25 d / K, lambda1 = 600 / (d K), lambda2 = 25, alpha = 25,
beta = 1 (§3.2). K in lambda is the number of *active* subspaces of the step (1 in the first stage
of the augmentation schedule), K in lambda1 the number of masks (the spec's default for the paper's
silence). The VICReg variance and covariance terms act on the unmasked means of both views.

Every batch statistic is taken over the batch gathered from all processes, so a DDP run computes
the single-process loss (tests/losses/test_ddp_equivalence.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from selfsup.losses.vicreg import covariance_term, variance_term
from selfsup.train.distributed import gather_no_grad, gather_with_grad

__all__ = ["EPS", "init_masks", "mast_loss", "masked_gaussian_distance", "masked_distance", "symmetric_kl"]

# Guards the divisions by a variance or a mask trace: the ReLU covariance head may output exact zeros.
EPS = 1e-6


def masked_gaussian_distance(mu_a: Tensor, var_a: Tensor, mu_b: Tensor, var_b: Tensor, masks: Tensor,
                             active: Tensor) -> Tensor:
    """D_mg (Eq. 4): ``mean_i sum_k active_ik 2 ||(mu_a - mu_b) . m_k||^2 / (tr(Sigma_a m_k) + tr(Sigma_b m_k))``.

    The mask enters the distance squared and the variance linearly, as written. ``masks (d, K) >= 0``;
    ``active (n, K)`` 0/1: the subspaces trained for each pair (the augmentations sampled for it).
    """
    num = 2.0 * (mu_a - mu_b).pow(2) @ masks.pow(2)
    den = var_a @ masks + var_b @ masks
    return (num / (den + EPS) * active).sum(dim=1).mean()


def masked_distance(z_a: Tensor, z_b: Tensor, masks: Tensor, active: Tensor) -> Tensor:
    """D_me (Eq. 2), the deterministic variant: ``mean_i sum_k active_ik ||(z_a - z_b) . m_k||^2``."""
    return ((z_a - z_b).pow(2) @ masks.pow(2) * active).sum(dim=1).mean()


def symmetric_kl(mu_a: Tensor, var_a: Tensor, mu_b: Tensor, var_b: Tensor) -> Tensor:
    """Eqs. 5-6 as printed (no ``-d``): ``mean_i KL(N_a || N_b) + KL(N_b || N_a)``; d per sample at equality.

    For diagonal Gaussians the log-determinants cancel, leaving
    ``1/2 sum_j [v_a / v_b + v_b / v_a + (mu_a - mu_b)^2 (1 / v_a + 1 / v_b)]``.
    """
    v_a, v_b = var_a + EPS, var_b + EPS
    return (0.5 * (v_a / v_b + v_b / v_a + (mu_a - mu_b).pow(2) * (1.0 / v_a + 1.0 / v_b))).sum(dim=1).mean()


def mast_loss(mu_a: Tensor, var_a: Tensor, mu_b: Tensor, var_b: Tensor, masks: Tensor, active: Tensor,
              invariance_weight: float = 25.0, sparsity_weight: float = 600.0, kl_weight: float = 25.0,
              var_weight: float = 25.0, cov_weight: float = 1.0,
              scale_free: bool = False, variance_scale: str = "batch") -> tuple[Tensor, dict[str, Tensor]]:
    """The MAST loss (Eq. 7) of two views' Gaussians; returns the loss and its unweighted terms.

    ``invariance_weight`` and ``sparsity_weight`` are the numerators of lambda = w d / K_active and
    lambda1 = w / (d K); K_active is the mean number of active subspaces per pair over the global batch.

    ``scale_free`` (off by default: the paper's loss is exact without it) guards Eq. 7's two degenerate
    directions (spec §6.4): D_mg falls when every mask shrinks (it is 1-homogeneous in M) and when every
    variance grows (-1-homogeneous in Sigma). With it, D_mg reads each mask divided by its mean and the
    variances divided by their batch mean, so only their shapes matter (which dimensions each augmentation
    uses, which samples are more uncertain than others); the L1 term still acts on the raw masks.

    ``variance_scale`` says which mean the guard divides the variances by: ``batch``, one scalar over the batch and
    every dimension; ``dimension``, each dimension's own mean over the batch. With ``batch`` the head can still move
    variance *between* dimensions: piled onto the few dimensions the masks select, it shrinks D_mg without any
    invariance (on CIFAR-10 the per-dimension variance followed the mask weight with correlation 0.97 after 300
    steps, 8-14x the mean variance on the masks' top 20 dimensions). With ``dimension`` only a sample's uncertainty
    relative to the other samples is left, which is what Eq. 4 weighs pairs by (ambiguous views count less).
    """
    mu_a, var_a, mu_b, var_b = (gather_with_grad(t) for t in (mu_a, var_a, mu_b, var_b))
    active = gather_no_grad(active.to(mu_a.dtype))
    if mu_a.shape[0] < 2:
        raise ValueError("MAST needs at least 2 samples in the (global) batch to compute variances")
    d, k = masks.shape
    k_active = active.sum(dim=1).mean().clamp_min(1.0)
    if variance_scale not in ("batch", "dimension"):
        raise ValueError(f"variance_scale must be 'batch' or 'dimension', got {variance_scale!r}")
    if scale_free:
        over = 0 if variance_scale == "dimension" else None  # None: one mean over every entry
        scale = 0.5 * (var_a.mean(dim=over) + var_b.mean(dim=over)).clamp_min(EPS)
        distance = masked_gaussian_distance(mu_a, var_a / scale, mu_b, var_b / scale,
                                            masks / masks.mean(dim=0, keepdim=True).clamp_min(EPS), active)
    else:
        distance = masked_gaussian_distance(mu_a, var_a, mu_b, var_b, masks, active)
    sparsity = masks.sum()
    kl = symmetric_kl(mu_a, var_a, mu_b, var_b)
    variance = variance_term(mu_a) + variance_term(mu_b)
    covariance = covariance_term(mu_a) + covariance_term(mu_b)
    loss = (invariance_weight * d / k_active * distance + sparsity_weight / (d * k) * sparsity + kl_weight * kl
            + var_weight * variance + cov_weight * covariance)
    terms = {"distance": distance, "sparsity": sparsity, "kl": kl, "variance": variance, "covariance": covariance}
    return loss, {name: value.detach() for name, value in terms.items()}


def init_masks(dim: int, num_masks: int, generator: torch.Generator | None = None) -> Tensor:
    """The free parameters U of the masks M = ReLU(U), (dim, num_masks) (App. A).

    Column k is a Gaussian bump over its block of d / K dimensions (centre of the block, width
    d / (2K)), plus N(0.2, 0.1^2) noise on every entry (App. A: mean 0.2, variance 0.01), so each
    augmentation starts with its own subspace that overlaps the others a little.
    """
    if dim < 1 or num_masks < 1:
        raise ValueError(f"masks need dim >= 1 and num_masks >= 1, got {dim}, {num_masks}")
    j = torch.arange(dim, dtype=torch.float32)[:, None]
    centres = (torch.arange(num_masks, dtype=torch.float32) + 0.5) * dim / num_masks
    width = dim / (2 * num_masks)
    bump = torch.exp(-(j - centres).pow(2) / (2 * width**2))
    return bump + 0.2 + 0.1 * torch.randn(dim, num_masks, generator=generator)
