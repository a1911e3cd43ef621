"""DINO loss (Caron et al., ICCV 2021, Sec. 3.1 Eq. 2-3, Algorithm 1): self-distillation with no labels.

The teacher's output of each global view is centred and sharpened, ``P_t = softmax((g_t(x) - c) / tau_t)``, and
the student's softmax ``P_s = softmax(g_s(x') / tau_s)`` of every *other* view is pulled towards it by the
cross-entropy ``H(P_t, P_s) = -sum_k P_t log P_s``. The centre ``c`` is an EMA of the teacher outputs' batch mean,
``c <- m c + (1 - m) mean_i g_t(x_i)`` (Eq. 4), updated after the loss.

Distribution: the cross-entropy is per sample, so DDP's gradient averaging makes a multi-process step equal to one
process on the whole batch; the centre's batch mean is all-reduced over processes, so every process keeps the same
centre (tests/losses/test_dino_ddp.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.train.distributed import all_reduce_mean

__all__ = ["TeacherCentre", "dino_loss", "distillation_cross_entropy"]


class TeacherCentre(nn.Module):
    """The centre ``c`` of the teacher's outputs (a buffer, saved with the method): :meth:`centred` subtracts it,
    :meth:`update` moves it towards the batch mean, ``c <- m c + (1 - m) mean``, all-reduced over processes
    (DINO's ``update_center``; iBOT keeps one for [CLS] and one for the patch tokens)."""

    center: torch.Tensor

    def __init__(self, dim: int, momentum: float = 0.9) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"the centre momentum must lie in [0, 1], got {momentum}")
        self.momentum = momentum
        self.register_buffer("center", torch.zeros(dim))

    def centred(self, teacher_logits: torch.Tensor) -> torch.Tensor:
        return teacher_logits - self.center.to(teacher_logits.dtype)

    @torch.no_grad()
    def update(self, teacher_logits: torch.Tensor) -> None:
        """``teacher_logits (..., K)``: the mean over every leading dimension (images; for patch tokens images and
        tokens, as iBOT's mean over tokens then images), averaged over processes (equal batches per process)."""
        batch_mean = all_reduce_mean(teacher_logits.detach().reshape(-1, teacher_logits.shape[-1]).mean(dim=0))
        self.center.mul_(self.momentum).add_(batch_mean.to(self.center.dtype), alpha=1.0 - self.momentum)

    def extra_repr(self) -> str:
        return f"dim={self.center.numel()}, momentum={self.momentum}"


def distillation_cross_entropy(teacher_probs: torch.Tensor, student_logits: torch.Tensor,
                               student_temperature: float) -> torch.Tensor:
    """``H(P_t, P_s) = -sum_k P_t log softmax(s / tau_s)`` per row (last dimension ``K``); no reduction."""
    return -(teacher_probs * F.log_softmax(student_logits / student_temperature, dim=-1)).sum(dim=-1)


def teacher_probabilities(teacher_logits: torch.Tensor, centre: TeacherCentre,
                          teacher_temperature: float) -> torch.Tensor:
    """Centring and sharpening, ``softmax((g_t - c) / tau_t)``, with the stop-gradient of Algorithm 1."""
    return F.softmax(centre.centred(teacher_logits.detach()) / teacher_temperature, dim=-1)


def dino_loss(student_logits: list[torch.Tensor], teacher_logits: list[torch.Tensor], centre: TeacherCentre,
              student_temperature: float = 0.1, teacher_temperature: float = 0.04,
              update_centre: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DINO objective ``mean over pairs (t in globals, s in views, s != t) of mean_i H(P_t(x_i^t), P_s(x_i^s))``.

    Args:
        student_logits: one ``(B, K)`` head output per view, the global views first (in the teacher's order), then
            the local ones.
        teacher_logits: one ``(B, K)`` head output per global view; no gradient flows into them.
        centre: the teacher centre; used as it is, then updated with these teacher outputs (``update_centre``).
        student_temperature: ``tau_s`` (0.1).
        teacher_temperature: ``tau_t`` of this step (0.04 -> 0.07 warm-up in the paper).

    The pairs are averaged with equal weight, as their ``DINOLoss`` (``total_loss / n_loss_terms``). Returns the
    loss and logged terms: ``teacher_entropy`` (mean entropy of the sharpened teacher) and ``kl`` (cross-entropy
    minus that entropy: 0 when the student matches the teacher).
    """
    if len(teacher_logits) < 1 or len(student_logits) < 2:
        raise ValueError(f"DINO needs at least one teacher view and two student views, got {len(teacher_logits)} "
                         f"and {len(student_logits)}")
    if student_temperature <= 0 or teacher_temperature <= 0:
        raise ValueError(f"temperatures must be positive, got tau_s={student_temperature}, "
                         f"tau_t={teacher_temperature}")
    targets = [teacher_probabilities(t, centre, teacher_temperature) for t in teacher_logits]
    total, pairs = student_logits[0].new_zeros(()), 0
    for t, target in enumerate(targets):
        for s, logits in enumerate(student_logits):
            if s == t:  # the student's and the teacher's view of the same crop: skipped
                continue
            total = total + distillation_cross_entropy(target, logits, student_temperature).mean()
            pairs += 1
    loss = total / pairs
    with torch.no_grad():
        entropy = torch.stack([-(p * p.clamp_min(torch.finfo(p.dtype).tiny).log()).sum(-1).mean()
                               for p in targets]).mean()
    if update_centre:
        centre.update(torch.cat([t.detach() for t in teacher_logits]))
    return loss, {"teacher_entropy": entropy, "kl": loss.detach() - entropy}
