"""k-means evaluation (MAE-CT App. E): Hungarian ACC, NMI, AMI, ARI, all x100."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score, normalized_mutual_info_score

from selfsup.eval import clustering
from selfsup.eval.clustering import cluster_accuracy, cluster_metrics, contingency_matrix, kmeans_cluster


def test_permuted_labelling_scores_100() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2, 2])
    assert cluster_accuracy(labels, np.array([2, 2, 0, 0, 1, 1, 1])) == 100.0


def test_hand_computed_six_point_example() -> None:
    # Contingency (cluster x class): c0 = {2 x class 1}, c1 = {class 0, class 2}, c2 = {class 0, class 2}.
    labels = np.array([1, 1, 0, 2, 0, 2])
    clusters = np.array([0, 0, 1, 1, 2, 2])
    assert contingency_matrix(labels, clusters).tolist() == [[0, 2, 0], [1, 0, 1], [1, 0, 1]]
    # Best one-to-one map: c0->1 (2), c1->0 (1), c2->2 (1): 4 of 6.
    assert cluster_accuracy(labels, clusters) == pytest.approx(400 / 6)


def test_hungarian_beats_greedy_matching() -> None:
    # Contingency [[3, 2], [2, 0]]: greedy takes the 3 then gets 0 (3/7); optimal is 2 + 2 = 4/7.
    labels = np.array([0, 0, 0, 1, 1, 0, 0])
    clusters = np.array([0, 0, 0, 0, 0, 1, 1])
    assert contingency_matrix(labels, clusters).tolist() == [[3, 2], [2, 0]]
    assert cluster_accuracy(labels, clusters) == pytest.approx(400 / 7)


def test_more_clusters_than_classes_count_unmatched_as_errors() -> None:
    labels = np.array([0, 0, 0, 1, 1, 1])
    clusters = np.array([0, 0, 1, 1, 2, 2])  # [[2, 0], [1, 1], [0, 2]] -> 2 + 2 of 6
    assert cluster_accuracy(labels, clusters) == pytest.approx(400 / 6)


def test_nmi_ami_ari_equal_sklearn() -> None:
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
    clusters = np.array([1, 1, 0, 0, 0, 2, 2, 2, 2, 1])
    metrics = cluster_metrics(labels, clusters)
    assert metrics["nmi"] == pytest.approx(100 * normalized_mutual_info_score(labels, clusters))
    assert metrics["ami"] == pytest.approx(100 * adjusted_mutual_info_score(labels, clusters))
    assert metrics["ari"] == pytest.approx(100 * adjusted_rand_score(labels, clusters))
    assert metrics["acc"] == pytest.approx(70.0)  # c1->0 (2), c0->1 (2), c2->2 (3)


def _blobs(per_class: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), per_class)
    # One dimension with a huge scale and no signal: standardisation must neutralise it.
    feats = 8.0 * np.eye(3, 4)[labels] + rng.standard_normal((labels.size, 4))
    feats[:, 3] *= 100.0
    return feats, (labels + 1) % 3


def test_kmeans_recovers_separated_blobs() -> None:
    feats, labels = _blobs(30)
    result = kmeans_cluster(feats, labels, n_init=3)
    assert result == {"acc": 100.0, "nmi": pytest.approx(100.0), "ami": pytest.approx(100.0), "ari": 100.0}
    # Without standardisation the large noise dimension dominates the distances.
    assert kmeans_cluster(feats, labels, n_init=3, standardize=False)["acc"] < 80.0


def test_minibatch_path_above_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clustering, "MINIBATCH_THRESHOLD", 10)
    feats, labels = _blobs(30)
    assert kmeans_cluster(feats, labels, n_init=2, seed=1)["acc"] == 100.0


def test_bad_inputs_fail_clearly() -> None:
    feats, labels = _blobs(2)
    with pytest.raises(ValueError, match="exceeds the 6 samples"):
        kmeans_cluster(feats, labels, num_clusters=7)
    with pytest.raises(ValueError, match="one label per feature row"):
        kmeans_cluster(feats, labels[:-1])


def test_restarts_from_one_seeded_stream_equal_sklearns_n_init():
    """The restart loop (with a progress bar) keeps KMeans(n_init, random_state)'s result exactly."""
    from sklearn.cluster import KMeans

    x = np.random.default_rng(0).normal(size=(600, 8))
    y = np.repeat(np.arange(6), 100)
    expected = cluster_metrics(y, KMeans(n_clusters=6, n_init=4, random_state=3).fit(x).labels_)
    assert kmeans_cluster(x, y, n_init=4, seed=3, standardize=False) == expected
