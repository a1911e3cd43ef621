"""k-means clustering of frozen features, scored against the true labels.

The MAE-CT protocol (MAE-CT §4.3, App. E): standardise every feature dimension with the mean
and std of the clustered embedding, run k-means with k = number of classes from several random
initialisations, keep the run with the lowest inertia, and report
- ACC: accuracy under the best one-to-one cluster-to-class map, found with the Hungarian
  algorithm on the contingency matrix (Kuhn 1955; scipy's ``linear_sum_assignment``),
- NMI (arithmetic normalisation), AMI (Vinh et al. 2010) and ARI (Hubert & Arabie 1985) from
  scikit-learn.
All four are multiplied by 100, as in MAE-CT's tables.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

from selfsup.eval.features import ArrayLike, as_feature_tensor, as_label_tensor
from selfsup.progress import track

MINIBATCH_THRESHOLD = 20_000
"""Above this many samples each restart is a MiniBatchKMeans run (what MAE-CT uses on ImageNet
val); at or below it, full-batch Lloyd k-means, which is exact and fast at that size."""


def contingency_matrix(labels: np.ndarray, assignments: np.ndarray) -> np.ndarray:
    """Counts ``M[i, j]`` of samples in the i-th distinct cluster and the j-th distinct class."""
    _, cluster_idx = np.unique(assignments, return_inverse=True)
    _, class_idx = np.unique(labels, return_inverse=True)
    counts = np.zeros((cluster_idx.max() + 1, class_idx.max() + 1), dtype=np.int64)
    np.add.at(counts, (cluster_idx, class_idx), 1)
    return counts


def cluster_accuracy(labels: ArrayLike, assignments: ArrayLike) -> float:
    """Best one-to-one cluster-to-class matching accuracy in percent (Hungarian algorithm).

    With more clusters than classes (or the reverse) the unmatched clusters count as errors.
    """
    labels_np = as_label_tensor(labels, name="labels").numpy()
    assignments_np = as_label_tensor(assignments, labels_np.shape[0], "assignments").numpy()
    counts = contingency_matrix(labels_np, assignments_np)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return 100.0 * float(counts[rows, cols].sum()) / labels_np.shape[0]


def cluster_metrics(labels: ArrayLike, assignments: ArrayLike) -> dict[str, float]:
    """``{"acc", "nmi", "ami", "ari"}`` (all x100) of a clustering against the true labels."""
    labels_np = as_label_tensor(labels, name="labels").numpy()
    assignments_np = as_label_tensor(assignments, labels_np.shape[0], "assignments").numpy()
    return {
        "acc": cluster_accuracy(labels_np, assignments_np),
        "nmi": 100.0 * float(normalized_mutual_info_score(labels_np, assignments_np)),
        "ami": 100.0 * float(adjusted_mutual_info_score(labels_np, assignments_np)),
        "ari": 100.0 * float(adjusted_rand_score(labels_np, assignments_np)),
    }


def _lowest_inertia(x: np.ndarray, num_clusters: int, n_init: int, seed: int, progress: bool) -> np.ndarray:
    """Assignments of the lowest-inertia restart: full k-means (restarts drawn from one seeded stream,
    exactly ``KMeans(n_init=n_init, random_state=seed)``), or MiniBatchKMeans above the threshold."""
    best_inertia, best_assign = np.inf, None
    stream = np.random.RandomState(seed)
    for i in track(range(n_init), "k-means restarts", unit="fits", enabled=progress, leave=False):
        if x.shape[0] > MINIBATCH_THRESHOLD:
            km = MiniBatchKMeans(n_clusters=num_clusters, n_init=1, random_state=seed + i, batch_size=4096).fit(x)
        else:
            km = KMeans(n_clusters=num_clusters, n_init=1, random_state=stream).fit(x)
        if km.inertia_ < best_inertia:
            best_inertia, best_assign = km.inertia_, km.labels_
    return best_assign


def kmeans_cluster(
    feats: ArrayLike,
    labels: ArrayLike,
    num_clusters: int | None = None,
    n_init: int = 10,
    seed: int = 0,
    standardize: bool = True,
    progress: bool = False,
) -> dict[str, float]:
    """Cluster ``feats`` with k-means and score it: ``{"acc", "nmi", "ami", "ari"}``, all x100.

    ``num_clusters=None`` uses the number of distinct labels. Of ``n_init`` seeded restarts the
    one with the lowest inertia is kept (full k-means up to :data:`MINIBATCH_THRESHOLD` samples,
    MiniBatchKMeans above). ``standardize`` z-scores each dimension first (MAE-CT App. E).
    """
    x = as_feature_tensor(feats, "feats").cpu().numpy()
    y = as_label_tensor(labels, x.shape[0], "labels").numpy()
    if num_clusters is None:
        num_clusters = int(np.unique(y).size)
    if not isinstance(num_clusters, int) or num_clusters < 1:
        raise ValueError(f"num_clusters must be a positive integer or None, got {num_clusters!r}.")
    if num_clusters > x.shape[0]:
        raise ValueError(f"num_clusters={num_clusters} exceeds the {x.shape[0]} samples; lower num_clusters.")
    if not isinstance(n_init, int) or n_init < 1:
        raise ValueError(f"n_init must be a positive integer, got {n_init!r}.")
    if standardize:
        std = x.std(axis=0)
        x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return cluster_metrics(y, _lowest_inertia(x, num_clusters, n_init, seed, progress))
