"""Low-shot protocol (MSN App. A.2): fixed seeded k-shot / percent splits, per-sample centring +
L2 norm, multinomial L2 logistic regression without intercept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfsup.eval.lowshot import DEFAULT_C, center_normalize, lowshot_logistic, lowshot_splits, percent_split

LABELS = np.array([0] * 5 + [1] * 7 + [2] * 4)


def test_lowshot_splits_exact_counts_and_determinism() -> None:
    splits = lowshot_splits(LABELS, shots=3, num_splits=3, seed=0)
    assert len(splits) == 3
    for idx in splits:
        assert np.bincount(LABELS[idx]).tolist() == [3, 3, 3]
        assert np.unique(idx).size == 9 and np.all(np.diff(idx) > 0)
    again = lowshot_splits(LABELS, shots=3, num_splits=3, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(splits, again))
    # Split i uses seed + i: the second split of seed 0 is the first split of seed 1.
    assert np.array_equal(lowshot_splits(LABELS, 3, num_splits=1, seed=1)[0], splits[1])
    assert not np.array_equal(splits[0], splits[1])


def test_lowshot_splits_reject_too_few_samples() -> None:
    with pytest.raises(ValueError, match=r"\{2: 4\}"):
        lowshot_splits(LABELS, shots=5)


def test_percent_split_counts() -> None:
    labels = np.array([0] * 250 + [1] * 100 + [2] * 30)
    # 1 %: 2.5 -> 3 (half-up), 1.0 -> 1, 0.3 -> at least 1.
    assert np.bincount(labels[percent_split(labels, 1.0)]).tolist() == [3, 1, 1]
    assert np.bincount(labels[percent_split(labels, 10)]).tolist() == [25, 10, 3]
    assert np.array_equal(percent_split(labels, 10, seed=4), percent_split(labels, 10, seed=4))
    assert not np.array_equal(percent_split(labels, 10, seed=4), percent_split(labels, 10, seed=5))
    with pytest.raises(ValueError, match="percent"):
        percent_split(labels, 0.0)


def test_center_normalize_hand_case() -> None:
    feats = torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0], [13.0, 16.0, 19.0]])
    out = center_normalize(feats)
    s = 2**-0.5
    expected = torch.tensor([[-s, 0.0, s], [0.0, 0.0, 0.0], [-s, 0.0, s]], dtype=torch.float64)
    torch.testing.assert_close(out, expected)


def _blobs(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(4), per_class)
    return 5.0 * np.eye(4, 8)[labels] + 0.3 * rng.standard_normal((labels.size, 8)), labels


def test_lowshot_logistic_keys_and_separable_accuracy() -> None:
    train_x, train_y = _blobs(30, seed=0)
    test_x, test_y = _blobs(10, seed=1)
    result = lowshot_logistic(train_x, train_y, test_x, test_y, shots=(1, 2), percents=(10.0,), num_splits=2)
    assert set(result) == {f"{p}_{s}" for p in ("1shot", "2shot", "10pct") for s in ("mean", "std", "splits")}
    for prefix in ("1shot", "2shot", "10pct"):
        assert result[f"{prefix}_splits"] == [100.0, 100.0]
        assert result[f"{prefix}_mean"] == 100.0 and result[f"{prefix}_std"] == 0.0


def test_test_features_get_the_same_per_sample_map() -> None:
    # Test points are affine copies (3x + 5) of 1-shot training points, so after per-sample
    # centring and L2 normalisation they coincide with them: 100 % whatever the classifier.
    rng = np.random.default_rng(0)
    train_x, train_y = rng.standard_normal((3, 6)), np.array([0, 1, 2])
    result = lowshot_logistic(train_x, train_y, 3 * train_x + 5, train_y, shots=(1,), percents=(), num_splits=1)
    assert result["1shot_mean"] == 100.0
    # A dataset-mean shift would break this: the shifted copies would not be classified alike.


def test_mean_and_std_over_splits() -> None:
    # Noisy training points, so that the three 1-shot splits score differently (86, 71, 82).
    train_x, train_y = _blobs(20, seed=0)
    train_x = train_x + 3.0 * np.random.default_rng(1).standard_normal(train_x.shape)
    test_x, test_y = _blobs(25, seed=2)
    result = lowshot_logistic(train_x, train_y, test_x, test_y, shots=(1,), percents=(), num_splits=3)
    accs = result["1shot_splits"]
    assert len(accs) == 3 and len(set(accs)) == 3
    assert result["1shot_mean"] == pytest.approx(np.mean(accs))
    assert result["1shot_std"] == pytest.approx(np.std(accs))


def test_default_c_matches_msn_lambda() -> None:
    assert DEFAULT_C == pytest.approx(1 / 2.5e-4)


def test_bad_inputs_fail_clearly() -> None:
    train_x, train_y = _blobs(3, seed=0)
    with pytest.raises(ValueError, match="shots"):
        lowshot_logistic(train_x, train_y, train_x, train_y, shots=(5,), percents=())
    with pytest.raises(ValueError, match="same backbone"):
        lowshot_logistic(train_x, train_y, train_x[:, :3], train_y)
    with pytest.raises(ValueError, match="at least 2 classes"):
        lowshot_logistic(train_x[:3], np.zeros(3, dtype=int), train_x, train_y, shots=(1,), percents=())


def test_test_features_get_no_statistic_of_their_own() -> None:
    # Issue 52: the map of the test features must not use a statistic of the test set (a column mean, as cyanure's
    # columns=True fitted per split would be). 1-shot training points e0 (class 0) and e1 (class 1); the test
    # points are the same two, both shifted by 5 e1. Per sample they both point towards class 1: 50 %. Centring the
    # test set with its own column mean would remove the shift and score 100 %.
    train_x, train_y = np.eye(3)[:2], np.array([0, 1])
    shifted = train_x + np.array([0.0, 5.0, 0.0])
    result = lowshot_logistic(train_x, train_y, shifted, train_y, shots=(1,), percents=(), num_splits=1)
    assert result["1shot_mean"] == 50.0
