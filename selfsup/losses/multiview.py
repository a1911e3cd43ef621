"""Barlow Twins and VICReg with M >= 2 views per image, at O(M) cost (Ghosh et al., NeurIPS 2024).

"Harnessing small projectors and multiple views for efficient vision pretraining", §3.1 and §3.4:
the invariance term of Eq. 9, ``sum_i ||T_M f_i - f_i||^2``, uses the averaging operator
``(T_M f)(x) = E_a f(a(x))`` (Eq. 8); Eq. 10 replaces it by its M-sample estimate, the mean
embedding of the M views of an image, so each view is compared with one mean instead of with the
M - 1 other views (O(M) instead of O(M^2) pairs). Our copy of the paper lost its equations; the
forms below are those of the authors' code (kumarkrishna/fastssl; specs/multiview_small_projectors.md
§2.3), and with M = 2 both are exactly our two-view losses.

Both losses gather every view over all processes (``gather_with_grad``), so a DDP run computes the
single-process loss of the global batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from selfsup.losses.barlow import barlow_twins_loss, standardize
from selfsup.losses.vicreg import covariance_term, off_diagonal, variance_term, vicreg_loss
from selfsup.train.distributed import gather_with_grad


def _check_views(views: Sequence[torch.Tensor], loss: str) -> None:
    if len(views) < 2:
        raise ValueError(f"{loss} needs at least 2 views per image, got {len(views)}; list 2 or more views in the config")
    shapes = {tuple(v.shape) for v in views}
    if len(shapes) != 1 or views[0].ndim != 2:
        raise ValueError(f"{loss} needs the M views as (N, d) embeddings of one shape, got shapes {sorted(shapes)}")


def barlow_twins_multiview_loss(views: Sequence[torch.Tensor], lambd: float
                                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Multi-view Barlow Twins of M views ``(N, d)`` of the same N images.

    M = 2: the two-view loss ``sum_i (1 - C_ii)^2 + lambd * sum_{i!=j} C_ij^2`` (Zbontar et al., Eq. 1),
    as the authors' code does. M > 2, with Z_m the batch-standardised views and Zbar = mean_m Z_m
    (the sample estimate of T_M f, Eq. 10)::

        L = (1/M) sum_m sum_i (1 - (Z_m^T Zbar / N)_ii)^2  +  lambd * sum_{i!=j} (Zbar^T Zbar / N)_ij^2

    i.e. each view's correlation with the mean embedding is pulled to 1, and the auto-correlation
    of the mean embedding is decorrelated (the authors' code). Each view is standardised on its own
    with the biased variance, as in our two-view loss; the authors' code L2-normalises the
    embeddings and standardises all M*N of them jointly with the unbiased std, which would make
    M = 2 differ from the two-view loss. Terms: ``on_diagonal`` and ``off_diagonal``, unweighted.
    """
    _check_views(views, "multi-view Barlow Twins")
    if len(views) == 2:
        return barlow_twins_loss(views[0], views[1], lambd)
    gathered = [gather_with_grad(v) for v in views]
    n = gathered[0].shape[0]
    if n < 2:
        raise ValueError("Barlow Twins needs at least 2 samples in the (global) batch")
    z = torch.stack([standardize(v) for v in gathered])  # (M, N, d)
    z_mean = z.mean(dim=0)  # (N, d)
    view_mean_corr = (z * z_mean).sum(dim=1) / n  # (M, d): diagonals of Z_m^T Zbar / N
    on_diag = (1 - view_mean_corr).pow(2).sum(dim=1).mean()
    off_diag = off_diagonal(z_mean.T @ z_mean / n).pow(2).sum()
    return on_diag + lambd * off_diag, {"on_diagonal": on_diag.detach(), "off_diagonal": off_diag.detach()}


def vicreg_multiview_loss(views: Sequence[torch.Tensor], sim_weight: float = 25.0, var_weight: float = 25.0,
                          cov_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Multi-view VICReg of M views ``(N, d)``: each view against the leave-one-out mean of the others.

    With ``zbar_m = (sum_k z_k - z_m) / (M - 1)`` (the authors' code)::

        L = (1/M) sum_m [ lambda * MSE(z_m, zbar_m) + mu * (v(z_m) + v(zbar_m)) / 2 + nu * (c(z_m) + c(zbar_m)) ]

    with VICReg's variance hinge v and covariance penalty c (Bardes et al., Eqs. 1-6). For M = 2,
    ``zbar_0 = z_1`` and ``zbar_1 = z_0``, so both summands are the two-view loss, which is what
    is computed then (the authors' code keeps only the m = 0 summand for M = 2). Since
    ``z_m - zbar_m = M / (M - 1) * (z_m - mean_k z_k)``, the invariance term is the mean-embedding
    form of Eq. 10 times ``(M / (M - 1))^2``. Terms (unweighted, averaged over m): ``invariance``,
    ``variance``, ``covariance``.
    """
    _check_views(views, "multi-view VICReg")
    if len(views) == 2:
        return vicreg_loss(views[0], views[1], sim_weight, var_weight, cov_weight)
    z = [gather_with_grad(v) for v in views]
    if z[0].shape[0] < 2:
        raise ValueError("VICReg needs at least 2 samples in the (global) batch to compute variances")
    num_views = len(z)
    total = torch.stack(z).sum(dim=0)
    invariance = variance = covariance = 0.0
    for z_m in z:
        others = (total - z_m) / (num_views - 1)
        invariance = invariance + F.mse_loss(z_m, others)
        variance = variance + 0.5 * (variance_term(z_m) + variance_term(others))
        covariance = covariance + covariance_term(z_m) + covariance_term(others)
    invariance, variance, covariance = invariance / num_views, variance / num_views, covariance / num_views
    loss = sim_weight * invariance + var_weight * variance + cov_weight * covariance
    return loss, {"invariance": invariance.detach(), "variance": variance.detach(), "covariance": covariance.detach()}
