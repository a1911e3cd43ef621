"""InfoNCE against gathered keys (MoCo v3, Chen et al. 2021; ExtreMA's alternative loss, Wu et al. Tab. 6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from selfsup.train.distributed import gather_no_grad, rank


def info_nce_loss(query: torch.Tensor, key: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean cross-entropy of ``cos(query, keys) / temperature`` with the image's own key as the positive.

    ``key`` (B, d) holds this process's keys (no gradient flows into them); the negatives are the keys of
    every other image on every process. ``query`` (m * B, d) may stack m queries per image mask-major, as
    ExtreMA's masks are; query row ``i`` belongs to image ``i mod B``. Each process averages over its own
    queries, so DDP's gradient averaging gives the single-process gradient of the global batch.
    """
    if query.ndim != 2 or key.ndim != 2 or query.shape[1] != key.shape[1] or len(query) % len(key):
        raise ValueError(f"query must be (m * B, d) for keys (B, d); got {tuple(query.shape)} and {tuple(key.shape)}")
    keys = F.normalize(gather_no_grad(key), dim=1)
    logits = F.normalize(query, dim=1) @ keys.t() / temperature
    labels = torch.arange(len(query), device=query.device) % len(key) + rank() * len(key)
    return F.cross_entropy(logits, labels)
