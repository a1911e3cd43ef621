"""BYOL regression loss (Grill et al., NeurIPS 2020, Eq. 2): ``2 - 2 cos(q, z')``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def byol_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``2 - 2 * cos(prediction, stop_grad(target))``; per-sample, no batch statistics."""
    return (2 - 2 * F.cosine_similarity(prediction, target.detach(), dim=-1)).mean()
