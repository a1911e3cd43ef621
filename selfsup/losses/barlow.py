"""Barlow Twins: redundancy reduction via the cross-correlation matrix (Zbontar et al., ICML 2021, Eq. 1)."""

from __future__ import annotations

import torch

from selfsup.losses.vicreg import off_diagonal
from selfsup.train.distributed import gather_with_grad


def standardize(z: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Per-dimension standardisation over the batch (BatchNorm without affine, biased variance)."""
    return (z - z.mean(dim=0)) / torch.sqrt(z.var(dim=0, unbiased=False) + eps)


def cross_correlation(z_a: torch.Tensor, z_b: torch.Tensor) -> torch.Tensor:
    """``C_ij = sum_b za_bi zb_bj / N`` of the batch-standardised embeddings (Eq. 2)."""
    return standardize(z_a).T @ standardize(z_b) / z_a.shape[0]


def barlow_twins_loss(z_a: torch.Tensor, z_b: torch.Tensor, lambd: float = 0.0051
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``sum_i (1 - C_ii)^2 + lambda * sum_{i != j} C_ij^2`` on the batch gathered over all processes."""
    z_a, z_b = gather_with_grad(z_a), gather_with_grad(z_b)
    if z_a.shape[0] < 2:
        raise ValueError("Barlow Twins needs at least 2 samples in the (global) batch")
    c = cross_correlation(z_a, z_b)
    on_diag = (torch.diagonal(c) - 1).pow(2).sum()
    off_diag = off_diagonal(c).pow(2).sum()
    return on_diag + lambd * off_diag, {"on_diagonal": on_diag.detach(), "off_diagonal": off_diag.detach()}
