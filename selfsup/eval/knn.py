"""Weighted k-nearest-neighbour classification on frozen features.

The protocol of Wu et al. 2018 ("Unsupervised feature learning via non-parametric instance
discrimination") as used by DINO (Caron et al. 2021) and MAE-CT (App. B): features
are L2-normalised, each test sample takes its k most cosine-similar training samples, neighbour
j votes for its class with weight exp(s_j / T), and the class with the largest summed vote wins.
DINO reports k=20, T=0.07; MAE-CT finds k=10 best for its models.

lightly's benchmark tables (CIFAR-10, ImageNette, ...) report the same vote at k=200, T=0.1
(``lightly/utils/benchmarking/knn.py: knn_predict``, from the MoCo CIFAR-10 demo; Wu et al.'s
defaults): cosine similarities of L2-normalised features (their benchmarks normalise both sides),
the top k, weights exp(s / T) summed per class, the largest sum wins. What differs: ties between
classes (lightly's ``argsort`` leaves them to the sort; here the lower class index wins) and the row
maximum subtracted before ``exp`` here (a per-row constant factor: the same ranking, no overflow).
:data:`LIGHTLY_K`, :data:`LIGHTLY_TEMPERATURE`; :func:`knn_classify_many` scores several (k, T)
from one similarity pass.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
import torch.nn.functional as F

from selfsup.eval.features import ArrayLike, as_feature_pair, as_feature_tensor, as_label_tensor

LIGHTLY_K = 200
LIGHTLY_TEMPERATURE = 0.1


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
    settings = _check_settings([(k, temperature)], batch_size, train.shape[0])
    return _weighted_votes(train, labels, test, settings, num_classes, batch_size)[0]


def _check_settings(settings: Sequence[tuple[int, float]], batch_size: int, num_train: int) -> list[tuple[int, float]]:
    """Validated (k, T) pairs, k larger than the training set clamped to it with a warning."""
    if not settings:
        raise ValueError("pass at least one (k, temperature) pair.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    checked = []
    for k, temperature in settings:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}.")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}.")
        if k > num_train:
            logging.getLogger("selfsup").warning("k=%d exceeds the %d training samples; using k=%d", k, num_train,
                                                 num_train)
            k = num_train
        checked.append((k, float(temperature)))
    return checked


def _weighted_votes(
    train: torch.Tensor,
    labels: torch.Tensor,
    test: torch.Tensor,
    settings: Sequence[tuple[int, float]],
    num_classes: int,
    batch_size: int,
) -> list[torch.Tensor]:
    """Class votes ``(N_test, C)`` for each (k, T) of ``settings``, from one similarity matrix per test batch: the
    top max(k) neighbours are found once (sorted, most similar first) and each setting reads its first k."""
    device = train.device
    train = F.normalize(train, dim=1)
    test = F.normalize(test.to(device), dim=1)
    labels = labels.to(device)
    largest_k = max(k for k, _ in settings)
    scores = [torch.empty(test.shape[0], num_classes, dtype=torch.float32, device=device) for _ in settings]
    for start in range(0, test.shape[0], batch_size):
        sims = test[start : start + batch_size] @ train.T
        all_sims, all_idx = sims.topk(largest_k, dim=1)
        all_labels = labels[all_idx]
        for (k, temperature), out in zip(settings, scores):
            top_sims = all_sims[:, :k]
            weights = ((top_sims - top_sims[:, :1]) / temperature).exp()
            votes = torch.zeros(top_sims.shape[0], num_classes, dtype=torch.float32, device=device)
            votes.scatter_add_(1, all_labels[:, :k], weights)
            out[start : start + batch_size] = votes
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
    For several k (e.g. k in {10, 20, 200}) use :func:`knn_classify_many`: one similarity pass for all.
    """
    return knn_classify_many(train_feats, train_labels, test_feats, test_labels, [(k, temperature)], num_classes,
                             batch_size)[0]


def knn_classify_many(
    train_feats: ArrayLike,
    train_labels: ArrayLike,
    test_feats: ArrayLike,
    test_labels: ArrayLike,
    settings: Sequence[tuple[int, float]],
    num_classes: int | None = None,
    batch_size: int = 1024,
) -> list[dict[str, float]]:
    """:func:`knn_classify` for each (k, T) in ``settings``, e.g. ``[(20, 0.07), (LIGHTLY_K, LIGHTLY_TEMPERATURE)]``.

    The similarities to the training set (the costly part) are computed once per test batch and the top max(k)
    neighbours found once; each setting votes with its first k. Only where neighbours tie exactly in similarity
    at a setting's k-th place can its pick differ from a separate ``topk(k)``.
    """
    train, test = as_feature_pair(train_feats, test_feats)
    train_targets = as_label_tensor(train_labels, train.shape[0], "train_labels")
    targets = as_label_tensor(test_labels, test.shape[0], "test_labels")
    num_classes = _infer_num_classes(num_classes, train_targets, targets)
    checked = _check_settings(settings, batch_size, train.shape[0])
    scores = _weighted_votes(train, train_targets, test, checked, num_classes, batch_size)
    return [topk_accuracy(s, targets) for s in scores]
