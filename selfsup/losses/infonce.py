"""Contrastive losses: cross-entropy over temperature-scaled cosines against the gathered batch.

- :func:`info_nce_loss`: queries against keys of another branch (MoCo v3, Chen et al. 2021, Eq. 1; ExtreMA's
  alternative loss, Wu et al. Tab. 6; NNCLR, Dwibedi et al. 2021, Eq. 2, and MAE-CT, Lehner et al. 2023, Eq. 2);
- :func:`moco_contrastive_loss`: MoCo v3's ``ctr(q, k)``, InfoNCE times ``2 tau`` (the authors' builder.py);
- :func:`nt_xent_loss`: SimCLR's NT-Xent (Chen et al. 2020, Eq. 1), every one of the 2N views an anchor against
  the other 2N - 1.

All three are one idea, :func:`cosine_cross_entropy`; they differ in which rows are the keys and which key is the
positive.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from selfsup.train.distributed import gather_no_grad, gather_with_grad, rank


def cosine_cross_entropy(query: torch.Tensor, keys: torch.Tensor, positive: torch.Tensor, temperature: float,
                         exclude: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the query rows of ``-log softmax(cos(query_i, keys) / temperature)[positive_i]``.

    ``exclude`` (one column per query row, optional): a key left out of row ``i``'s softmax (NT-Xent's
    self-similarity ``k != i``).
    """
    logits = F.normalize(query, dim=1) @ F.normalize(keys, dim=1).t() / temperature
    if exclude is not None:
        rows = torch.arange(len(query), device=query.device)
        mask = torch.zeros_like(logits, dtype=torch.bool)
        mask[rows, exclude] = True
        logits = logits.masked_fill(mask, float("-inf"))
    return F.cross_entropy(logits, positive)


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
    keys = gather_with_grad(key) if key_gradient else gather_no_grad(key)
    if negatives is not None:
        keys = torch.cat([keys, negatives.detach().to(keys.dtype)])
    positive = torch.arange(len(query), device=query.device) % len(key) + rank() * len(key)
    return cosine_cross_entropy(query, keys, positive, temperature)


def moco_contrastive_loss(query: torch.Tensor, key: torch.Tensor, temperature: float,
                          negatives: torch.Tensor | None = None) -> torch.Tensor:
    """MoCo v3's ``ctr(q, k)`` (Chen et al. 2021, Alg. 1; the authors' ``contrastive_loss``): InfoNCE of the
    queries against the gathered keys, which are constants, times ``2 * temperature`` (their code's factor, which
    makes the gradient's scale independent of the temperature)."""
    return info_nce_loss(query, key, temperature, negatives=negatives) * (2 * temperature)


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent (Chen et al. 2020, Eq. 1) over the 2N views of the global batch.

    ``z1``, ``z2`` (B, d): this process's projections of the two views of its B images. Every one of the 2N views
    of the global batch (N = B x processes) is an anchor; its positive is the other view of its image, its
    negatives the 2N - 2 other views (both views of every other image, on every process), gathered with gradients;
    the anchor's similarity with itself is left out (``1[k != i]``). The loss averages over this process's 2B
    anchors (Eq. 1's ``1/2N`` sum over the pairs (2k-1, 2k) and (2k, 2k-1)); DDP's gradient averaging gives the
    single-process gradient of the global batch.
    """
    if z1.ndim != 2 or z1.shape != z2.shape:
        raise ValueError(f"NT-Xent needs the two views' projections as (B, d) each; got {tuple(z1.shape)} and "
                         f"{tuple(z2.shape)}")
    batch = len(z1)
    anchors = torch.cat([z1, z2])  # (2B, d): view 1 of each image, then view 2
    keys = gather_with_grad(anchors)  # (2N, d): process r's 2B anchors at rows r * 2B ...
    rows = torch.arange(2 * batch, device=z1.device)
    own = rows + rank() * 2 * batch
    positive = (rows + batch) % (2 * batch) + rank() * 2 * batch  # the other view of the same image
    return cosine_cross_entropy(anchors, keys, positive, temperature, exclude=own)
