"""Weighted k-nearest-neighbour classification on frozen features.

The protocol of Wu et al. 2018 ("Unsupervised feature learning via non-parametric instance
discrimination") as used by DINO (Caron et al. 2021) and MAE-CT (App. B): features
are L2-normalised, each test sample takes its k most cosine-similar training samples, neighbour
j votes for its class with weight exp(s_j / T), and the class with the largest summed vote wins.
DINO reports k=20, T=0.07; MAE-CT finds k=10 best for its models.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from selfsup.eval.features import ArrayLike, as_feature_pair, as_feature_tensor, as_label_tensor


def _infer_num_classes(num_classes: int | None, *label_sets: torch.Tensor) -> int:
    largest = max(int(labels.max()) for labels in label_sets) + 1
    if num_classes is None:
        return largest
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer or None, got {num_classes!r}.")
    if largest > num_classes:
        raise ValueError(
            f"labels go up to {largest - 1} but num_classes={num_classes}; pass num_classes >= {largest} "
            "or None to infer it."
        )
    return num_classes


def knn_scores(
    train_feats: ArrayLike,
    train_labels: ArrayLike,
    test_feats: ArrayLike,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
    batch_size: int = 1024,
) -> torch.Tensor:
    """Per-class summed neighbour weights, ``(N_test, C)`` float32 on the training features' device.

    Row i holds ``sum_{j in topk(i)} exp((s_ij - max_j s_ij) / T) * onehot(y_j)``. Subtracting the
    row's largest similarity rescales a row by a constant, so the ranking of classes is exactly
    that of the plain exp(s/T) weights, without float overflow at small T. Test samples are
    processed ``batch_size`` at a time, so memory stays O(batch_size * N_train). ``k`` larger
    than the training set is clamped to it with a warning.
    """
    train, test = as_feature_pair(train_feats, test_feats)
    labels = as_label_tensor(train_labels, train.shape[0], "train_labels")
    num_classes = _infer_num_classes(num_classes, labels)
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}.")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if k > train.shape[0]:
        logging.getLogger("selfsup").warning("k=%d exceeds the %d training samples; using k=%d", k, train.shape[0],
                                             train.shape[0])
        k = train.shape[0]

    return _weighted_votes(train, labels, test, k, temperature, num_classes, batch_size)


def _weighted_votes(
    train: torch.Tensor,
    labels: torch.Tensor,
    test: torch.Tensor,
    k: int,
    temperature: float,
    num_classes: int,
    batch_size: int,
) -> torch.Tensor:
    device = train.device
    train = F.normalize(train, dim=1)
    test = F.normalize(test.to(device), dim=1)
    labels = labels.to(device)
    scores = torch.empty(test.shape[0], num_classes, dtype=torch.float32, device=device)
    for start in range(0, test.shape[0], batch_size):
        sims = test[start : start + batch_size] @ train.T
        top_sims, top_idx = sims.topk(k, dim=1)
        weights = ((top_sims - top_sims[:, :1]) / temperature).exp()
        votes = torch.zeros(top_sims.shape[0], num_classes, dtype=torch.float32, device=device)
        votes.scatter_add_(1, labels[top_idx], weights)
        scores[start : start + batch_size] = votes
    return scores


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Top-k accuracies in percent from class scores ``(N, C)``; keys ``top1``, ``top5``, ...

    Ties are broken towards the lower class index (stable sort), so results are deterministic.
    With fewer than k classes top-k counts every class, i.e. it is 100.
    """
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    hits = order == labels.to(scores.device)[:, None]
    return {f"top{k}": 100.0 * float(hits[:, :k].any(dim=1).float().mean()) for k in ks}


def knn_classify(
    train_feats: ArrayLike,
    train_labels: ArrayLike,
    test_feats: ArrayLike,
    test_labels: ArrayLike,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
    batch_size: int = 1024,
) -> dict[str, float]:
    """DINO-style weighted kNN accuracy (percent): ``{"top1": ..., "top5": ...}``.

    See :func:`knn_scores` for the vote. ``num_classes=None`` infers it from both label sets.
    Loop over k in the caller for a sweep (e.g. k in {10, 20, 200}).
    """
    train = as_feature_tensor(train_feats, "train_feats")
    test = as_feature_tensor(test_feats, "test_feats")
    train_targets = as_label_tensor(train_labels, train.shape[0], "train_labels")
    targets = as_label_tensor(test_labels, test.shape[0], "test_labels")
    num_classes = _infer_num_classes(num_classes, train_targets, targets)
    scores = knn_scores(train, train_targets, test, k, temperature, num_classes, batch_size)
    return topk_accuracy(scores, targets)
