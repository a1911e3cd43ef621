"""ExtreMA's objective (Wu et al. 2023, Sec. 3, Tab. 6) over m masked student views of each image."""

from __future__ import annotations

import torch

from selfsup.losses.byol import byol_loss
from selfsup.losses.infonce import moco_contrastive_loss


def extrema_loss(prediction: torch.Tensor, target: torch.Tensor, loss: str = "byol",
                 temperature: float = 0.2, negatives: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over masks and images of ``2 - 2 cos(q, sg(t))`` (``loss="byol"``), or MoCo v3's InfoNCE scaled
    by ``2 * temperature`` (``loss="infonce"``, the authors' code).

    ``prediction`` (m * B, P) stacks the m masked views mask-major; ``target`` (B, P) is the teacher's
    projection of the full image, shared by every mask. Each image's terms are its own (InfoNCE takes its
    negatives from the gathered keys, without gradient), so under DDP each process averages its own images
    and DDP's gradient averaging gives the single-process gradient. ``negatives`` (K, P): InfoNCE's further
    negatives, a queue of past teacher keys (not the paper's; see ExtreMAConfig.queue_size).
    """
    if loss == "byol":
        if negatives is not None:
            raise ValueError("the BYOL regression has no negatives; a key queue needs loss='infonce'")
        return byol_loss(prediction, target.repeat(len(prediction) // len(target), 1))
    if loss == "infonce":
        return moco_contrastive_loss(prediction, target, temperature, negatives)
    raise ValueError(f"unknown ExtreMA loss {loss!r}; use 'byol' or 'infonce'")
