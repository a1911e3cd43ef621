"""VICReg: variance-invariance-covariance regularisation (Bardes et al., ICLR 2022, Eqs. 1-6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from selfsup.train.distributed import gather_with_grad


def off_diagonal(m: torch.Tensor) -> torch.Tensor:
    """The off-diagonal entries of a square matrix, flattened."""
    n = m.shape[0]
    return m.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


def variance_term(z: torch.Tensor, gamma: float = 1.0, eps: float = 1e-4) -> torch.Tensor:
    """Hinge on the per-dimension std: ``mean_j max(0, gamma - sqrt(Var(z_j) + eps))`` (Eq. 1)."""
    std = torch.sqrt(z.var(dim=0) + eps)
    return F.relu(gamma - std).mean()


def covariance_term(z: torch.Tensor) -> torch.Tensor:
    """Sum of squared off-diagonal covariances divided by the dimension d (Eqs. 3-4)."""
    n, d = z.shape
    z = z - z.mean(dim=0)
    cov = (z.T @ z) / (n - 1)
    return off_diagonal(cov).pow(2).sum() / d


def vicreg_loss(z_a: torch.Tensor, z_b: torch.Tensor, sim_weight: float = 25.0, var_weight: float = 25.0,
                cov_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VICReg loss of two batches of embeddings (Eq. 6), on the batch gathered over all processes.

    Returns the loss and its unweighted terms. Every process computes the same global value.
    """
    z_a, z_b = gather_with_grad(z_a), gather_with_grad(z_b)
    if z_a.shape[0] < 2:
        raise ValueError("VICReg needs at least 2 samples in the (global) batch to compute variances")
    invariance = F.mse_loss(z_a, z_b)
    variance = 0.5 * (variance_term(z_a) + variance_term(z_b))
    covariance = covariance_term(z_a) + covariance_term(z_b)
    loss = sim_weight * invariance + var_weight * variance + cov_weight * covariance
    return loss, {"invariance": invariance.detach(), "variance": variance.detach(), "covariance": covariance.detach()}
