"""InfoNCE against the gathered batch (MoCo v3, Chen et al. 2021; ExtreMA's alternative loss, Wu et al. Tab. 6;
NNCLR, Dwibedi et al. 2021, Eq. 2, and MAE-CT, Lehner et al. 2023, Eq. 2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from selfsup.train.distributed import gather_no_grad, gather_with_grad, rank


def info_nce_loss(query: torch.Tensor, key: torch.Tensor, temperature: float, key_gradient: bool = False,
                  negatives: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``cos(query, keys) / temperature`` with the image's own key as the positive.

    ``key`` (B, d) holds this process's keys; the negatives are the keys of every other image on every process.
    ``key_gradient=False`` (MoCo v3, ExtreMA): the keys are constants. ``key_gradient=True`` (NNCLR, MAE-CT: the
    query is the looked-up neighbour, the keys the other view's predictions): gradients flow into every
    process's keys through the all-gather. ``query`` (m * B, d) may stack m queries per image mask-major, as
    ExtreMA's masks are; query row ``i`` belongs to image ``i mod B``. Each process averages over its own
    queries, so DDP's gradient averaging gives the single-process gradient of the global batch.
    ``negatives`` (K, d), optional: further keys that are every query's negatives (MoCo v2's queue of past keys,
    the same on every process), constants.
    """
    if query.ndim != 2 or key.ndim != 2 or query.shape[1] != key.shape[1] or len(query) % len(key):
        raise ValueError(f"query must be (m * B, d) for keys (B, d); got {tuple(query.shape)} and {tuple(key.shape)}")
    keys = F.normalize(gather_with_grad(key) if key_gradient else gather_no_grad(key), dim=1)
    if negatives is not None:
        keys = torch.cat([keys, F.normalize(negatives.detach().to(keys.dtype), dim=1)])
    logits = F.normalize(query, dim=1) @ keys.t() / temperature
    labels = torch.arange(len(query), device=query.device) % len(key) + rank() * len(key)
    return F.cross_entropy(logits, labels)
