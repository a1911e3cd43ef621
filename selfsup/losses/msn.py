"""MSN loss (Assran et al., ECCV 2022, Sec. 3 Eq. 1): cross-entropy between the prototype assignments
of masked anchor views and the sharpened assignments of the unmasked target view, plus ME-MAX.

Inputs are cosine similarities to the L2-normalised prototypes (``selfsup.models.heads.Prototypes``).
Distribution: Sinkhorn-Knopp all-reduces its prototype sums over the global batch and the mean
prediction ``p_bar`` is averaged over all processes with gradients; the cross-entropy is per-sample,
so DDP's gradient averaging makes a multi-process step equal to one process on the whole batch.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from selfsup.train.distributed import all_reduce_mean_with_grad, gather_no_grad, is_distributed, world_size


def prototype_log_probs(similarities: torch.Tensor, temperature: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """``log p`` with ``p = (1 - s) softmax(sim / tau) + s / K`` (Sec. 3 "Similarity Metric").

    ``s`` is the authors' label smoothing of the one-hot prototype labels (code: ``softmax(.) @
    one_hot(K, s)``; 0 in all their configs). Computed in log space, so nothing underflows.
    """
    log_p = F.log_softmax(similarities / temperature, dim=1)
    if label_smoothing == 0.0:
        return log_p
    k = similarities.shape[1]
    floor = torch.full_like(log_p, math.log(label_smoothing / k))
    return torch.logaddexp(log_p + math.log1p(-label_smoothing), floor)


@torch.no_grad()
def sinkhorn_knopp(probs: torch.Tensor, iterations: int = 3) -> torch.Tensor:
    """Balance target assignments over the *global* batch (MSN App. A.1, C.1; SwAV's Sinkhorn).

    ``probs (B_local, K)`` -> ``(B_local, K)`` whose rows sum to 1 and whose prototype (column) sums
    approach ``B / K`` over the global batch ``B`` as ``iterations`` grows. With ``Q = probs^T / sum``:
    repeat {rows of Q (prototypes) to 1/K, summed over all processes; columns (samples) to 1/B};
    return ``B * Q^T``. The caller's tensor is not modified.
    """
    if probs.ndim != 2:
        raise ValueError(f"sinkhorn_knopp expects (batch, prototypes) probabilities, got shape {tuple(probs.shape)}")
    tiny = torch.finfo(probs.dtype).tiny  # a prototype without any mass stays at 0 instead of 0/0
    q = probs.t().clone()
    k, batch = q.shape[0], q.shape[1] * world_size()
    total = q.sum()
    if is_distributed():
        dist.all_reduce(total)
    q /= total
    for _ in range(iterations):
        prototype_mass = q.sum(dim=1, keepdim=True)
        if is_distributed():
            dist.all_reduce(prototype_mass)
        q /= prototype_mass.clamp_min(tiny) * k
        q /= q.sum(dim=0, keepdim=True).clamp_min(tiny) * batch
    return (q * batch).t()


def me_max(mean_probs: torch.Tensor) -> torch.Tensor:
    """ME-MAX regulariser ``log K - H(p_bar) = sum_k p_bar_k log p_bar_k + log K`` (Eq. 1, code form).

    Minimising it maximises the entropy of the mean prediction: 0 for a uniform ``p_bar``, ``log K``
    for a one-hot one. Zero entries contribute 0 (``0 log 0 = 0``) and a finite gradient.
    """
    k = mean_probs.shape[-1]
    return (mean_probs * mean_probs.clamp_min(torch.finfo(mean_probs.dtype).tiny).log()).sum() + math.log(k)


def msn_loss(anchor_similarities: torch.Tensor, target_similarities: torch.Tensor, anchor_temperature: float = 0.1,
             target_temperature: float = 0.025, sinkhorn_iterations: int = 3, memax_weight: float = 1.0,
             label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MSN objective ``mean_{i,m} H(p+_i, p_{i,m}) + lambda (log K - H(p_bar))`` (Eq. 1).

    Args:
        anchor_similarities: ``(M * B, K)`` cosine similarities of the M anchor views, view-major
            (all images of anchor view 1, then view 2, ...).
        target_similarities: ``(B, K)`` of the target view; no gradient flows into it.
        anchor_temperature: ``tau`` (0.1).
        target_temperature: ``tau+`` (0.025 < tau sharpens; the code applies ``sharpen(p, T)``,
            ``p^(1/T) / sum``, with ``T = tau+ / tau = 0.25`` to the tau-softmax, which is the same).
        sinkhorn_iterations: Sinkhorn-Knopp iterations on the sharpened targets; 0 turns it off.
        memax_weight: ``lambda``.
        label_smoothing: ``s`` of :func:`prototype_log_probs`, applied to anchors and targets (code).

    Returns the loss and logged terms: ``ce``, ``me_max`` (``log K - H(p_bar)``), ``mean_entropy``
    (``H(p_bar)``) and ``prototypes_used`` (distinct argmax of the targets over the global batch,
    the code's ``np``).
    """
    if anchor_similarities.ndim != 2 or target_similarities.ndim != 2:
        raise ValueError("msn_loss expects 2-D (rows, prototypes) similarities, got shapes "
                         f"{tuple(anchor_similarities.shape)} and {tuple(target_similarities.shape)}")
    rows, k = anchor_similarities.shape
    batch = target_similarities.shape[0]
    if target_similarities.shape[1] != k or batch == 0 or rows % batch != 0:
        raise ValueError(f"anchor similarities {tuple(anchor_similarities.shape)} must stack M views of the "
                         f"{batch} target rows of shape {tuple(target_similarities.shape)} (view-major, same K)")
    if anchor_temperature <= 0 or target_temperature <= 0:
        raise ValueError(f"temperatures must be positive, got tau={anchor_temperature}, tau+={target_temperature}")

    log_p = prototype_log_probs(anchor_similarities, anchor_temperature, label_smoothing)
    with torch.no_grad():
        sharpen = target_temperature / anchor_temperature
        log_t = prototype_log_probs(target_similarities.detach(), anchor_temperature, label_smoothing)
        targets = F.softmax(log_t / sharpen, dim=1)
        if sinkhorn_iterations > 0:
            targets = sinkhorn_knopp(targets, sinkhorn_iterations)
    ce = -(targets.repeat(rows // batch, 1) * log_p).sum(dim=1).mean()
    mean_probs = all_reduce_mean_with_grad(log_p.exp().mean(dim=0))
    reg = me_max(mean_probs)
    # distinct argmax prototypes, counted on the device (unique() has a data-dependent size: a read to the host)
    used = torch.zeros(k, device=targets.device).index_fill_(0, gather_no_grad(targets.argmax(dim=1)), 1.0).sum()
    terms = {"ce": ce.detach(), "me_max": reg.detach(), "mean_entropy": math.log(k) - reg.detach(),
             "prototypes_used": used}
    return ce + memax_weight * reg, terms
