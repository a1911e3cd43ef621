"""Weighted kNN (Wu et al. 2018 / DINO): cosine top-k, weights exp(s/T), summed class votes."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from selfsup.eval.knn import LIGHTLY_K, LIGHTLY_TEMPERATURE, knn_classify, knn_classify_many, knn_scores, topk_accuracy

# One class-0 neighbour at cosine 1.0 and two class-1 neighbours at cosine 0.8 from the test
# point (2, 0); a class-0 point at cosine -1 is the farthest.
TRAIN = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6], [-3.0, 0.0]])
TRAIN_Y = torch.tensor([0, 1, 1, 0])
TEST = torch.tensor([[2.0, 0.0]])
TEST_Y = torch.tensor([0])


def test_votes_match_hand_computation() -> None:
    # Weights are exp((s - s_max) / T): class 0 gets e^0 = 1, class 1 gets 2 e^(-0.2/T).
    scores = knn_scores(TRAIN, TRAIN_Y, TEST, k=3, temperature=0.07)
    torch.testing.assert_close(scores, torch.tensor([[1.0, 2 * math.exp(-0.2 / 0.07)]]))
    # k=4 adds the opposite class-0 point with weight e^(-2/T).
    scores = knn_scores(TRAIN, TRAIN_Y, TEST, k=4, temperature=0.5)
    torch.testing.assert_close(scores, torch.tensor([[1.0 + math.exp(-2 / 0.5), 2 * math.exp(-0.2 / 0.5)]]))


def test_weighting_changes_the_answer_versus_majority_vote() -> None:
    # T = 0.07: 1 > 2 e^(-2.86) = 0.11, the single close neighbour wins.
    assert knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, k=3, temperature=0.07)["top1"] == 100.0
    # T = 1: 1 < 2 e^(-0.2) = 1.64; a large T is a plain majority vote, 2 votes beat 1.
    assert knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, k=3, temperature=1.0)["top1"] == 0.0
    assert knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, k=3, temperature=1e6)["top1"] == 0.0


def test_tiny_temperature_does_not_overflow() -> None:
    scores = knn_scores(TRAIN, TRAIN_Y, TEST, k=3, temperature=1e-4)
    assert torch.isfinite(scores).all()
    assert knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, k=3, temperature=1e-4)["top1"] == 100.0


def test_k_larger_than_train_set_is_clamped_with_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="selfsup"):
        clamped = knn_scores(TRAIN, TRAIN_Y, TEST, k=50, temperature=0.5)
    assert "k=50 exceeds the 4 training samples; using k=4" in caplog.text
    torch.testing.assert_close(clamped, knn_scores(TRAIN, TRAIN_Y, TEST, k=4, temperature=0.5))


def test_topk_accuracy_hand_case_and_tie_break() -> None:
    scores = torch.tensor([[0.1, 0.5, 0.4], [1.0, 1.0, 0.0]])
    labels = torch.tensor([2, 1])
    # Row 0: class 2 is second. Row 1: tie between 0 and 1 goes to the lower index 0.
    assert topk_accuracy(scores, labels, ks=(1, 2)) == {"top1": 0.0, "top2": 100.0}


def test_top5_and_batching_on_random_data() -> None:
    gen = torch.Generator().manual_seed(0)
    train, test = torch.randn(50, 8, generator=gen), torch.randn(13, 8, generator=gen)
    train_y, test_y = torch.randint(0, 7, (50,), generator=gen), torch.randint(0, 7, (13,), generator=gen)
    full = knn_scores(train, train_y, test, k=5, batch_size=1024)
    torch.testing.assert_close(knn_scores(train, train_y, test, k=5, batch_size=4), full)
    expected = topk_accuracy(full, test_y)
    assert knn_classify(train.numpy(), train_y.numpy(), test.numpy(), test_y.numpy(), k=5, batch_size=4) == expected
    # Reference top-5 by brute force.
    top5 = full.argsort(dim=1, descending=True, stable=True)[:, :5]
    assert expected["top5"] == pytest.approx(100.0 * np.mean([int(y) in row for y, row in zip(test_y, top5.tolist())]))


def test_bad_inputs_fail_clearly() -> None:
    with pytest.raises(ValueError, match="same backbone"):
        knn_classify(TRAIN, TRAIN_Y, torch.ones(1, 3), TEST_Y)
    with pytest.raises(ValueError, match="num_classes"):
        knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, num_classes=1)
    with pytest.raises(ValueError, match="temperature"):
        knn_classify(TRAIN, TRAIN_Y, TEST, TEST_Y, temperature=0.0)
    with pytest.raises(ValueError, match="one label per feature row"):
        knn_classify(TRAIN, TRAIN_Y[:3], TEST, TEST_Y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_features_give_the_cpu_votes() -> None:
    scores = knn_scores(TRAIN.cuda(), TRAIN_Y, TEST.cuda(), k=4, temperature=0.5)
    assert scores.device.type == "cuda"
    torch.testing.assert_close(scores.cpu(), knn_scores(TRAIN, TRAIN_Y, TEST, k=4, temperature=0.5))


def test_test_features_are_not_centred_with_their_own_mean() -> None:
    # Issue 52: cosine kNN compares each test vector with the training vectors as they are. Training points at
    # (+-1, 0.1) (class by the sign of x); test points are the same two shifted by (+5, 0): both lie nearest the
    # class-1 direction, 50 %. Centring the test set with its own mean would undo the shift and score 100 %.
    train_x, train_y = torch.tensor([[-1.0, 0.1], [1.0, 0.1]]), torch.tensor([0, 1])
    shifted = train_x + torch.tensor([5.0, 0.0])
    assert knn_classify(train_x, train_y, shifted, train_y, k=1, temperature=0.07)["top1"] == 50.0


def _ring(cosines_and_labels: list[tuple[float, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit vectors at cosine c from (1, 0), ``n`` of each (c, label, n); alternately above and below the axis."""
    points, labels = [], []
    for c, label, n in cosines_and_labels:
        s = math.sqrt(1 - c * c)
        points += [[c, s if i % 2 else -s] for i in range(n)]
        labels += [label] * n
    return torch.tensor(points), torch.tensor(labels)


# Around the test point (1, 0): 10 of class 0 at cosine 1.0, 10 of class 1 at 0.9, 120 of class 2 at 0.8, 60 of
# class 3 at 0.7 (ranks 141-200), then 1000 of class 3 at 0.69 that only k > 200 would reach.
LIGHTLY_TRAIN, LIGHTLY_TRAIN_Y = _ring([(1.0, 0, 10), (0.9, 1, 10), (0.8, 2, 120), (0.7, 3, 60), (0.69, 3, 1000)])


def test_lightly_200nn_matches_hand_computation_and_differs_from_20nn() -> None:
    # 20-NN, T = 0.07: class 0 sums 10, class 1 10 e^(-0.1/0.07) = 2.4: class 0.
    # 200-NN, T = 0.1: class 0 10, class 1 10 e^-1 = 3.7, class 2 120 e^-2 = 16.2, class 3 60 e^-3 = 3.0: class 2.
    # (T = 0.07 at k = 200 gives class 2 only 120 e^(-0.2/0.07) = 6.9 < 10; k = 20 at T = 0.1 never sees class 2;
    # the whole set, k = 1200, would add 1000 e^-3.1 = 45 to class 3.)
    test, test_y = torch.tensor([[2.0, 0.0]]), torch.tensor([2])
    lightly = knn_scores(LIGHTLY_TRAIN, LIGHTLY_TRAIN_Y, test, k=LIGHTLY_K, temperature=LIGHTLY_TEMPERATURE)
    expected = [10.0, 10 * math.exp(-1.0), 120 * math.exp(-2.0), 60 * math.exp(-3.0)]
    torch.testing.assert_close(lightly, torch.tensor([expected]), rtol=1e-4, atol=1e-5)
    twenty, two_hundred = knn_classify_many(LIGHTLY_TRAIN, LIGHTLY_TRAIN_Y, test, test_y,
                                            [(20, 0.07), (LIGHTLY_K, LIGHTLY_TEMPERATURE)], batch_size=1)
    assert twenty["top1"] == 0.0 and two_hundred["top1"] == 100.0
    assert twenty == knn_classify(LIGHTLY_TRAIN, LIGHTLY_TRAIN_Y, test, test_y, k=20, temperature=0.07)
    assert (LIGHTLY_K, LIGHTLY_TEMPERATURE) == (200, 0.1)  # lightly's knn_predict defaults


def test_many_settings_equal_separate_runs_on_random_data() -> None:
    gen = torch.Generator().manual_seed(1)
    train, test = torch.randn(300, 6, generator=gen), torch.randn(40, 6, generator=gen)
    train_y, test_y = torch.randint(0, 5, (300,), generator=gen), torch.randint(0, 5, (40,), generator=gen)
    settings = [(20, 0.07), (200, 0.1), (3, 1.0)]
    many = knn_classify_many(train, train_y, test, test_y, settings, batch_size=7)
    assert many == [knn_classify(train, train_y, test, test_y, k=k, temperature=t) for k, t in settings]


def test_evaluate_reports_knn200_beside_20nn() -> None:
    from types import SimpleNamespace

    from selfsup.config import EvalConfig
    from selfsup.eval.run import Features, evaluate

    test, test_y = torch.tensor([[2.0, 0.0]]), torch.tensor([2])
    feats = Features(LIGHTLY_TRAIN, LIGHTLY_TRAIN_Y, test, test_y)
    result = evaluate("knn", feats, SimpleNamespace(eval=EvalConfig()))
    assert result == {"knn_top1": 0.0, "knn_top5": 100.0, "knn200_top1": 100.0}
    off = evaluate("knn", feats, SimpleNamespace(eval=EvalConfig(knn_lightly=False)))
    assert off == {"knn_top1": 0.0, "knn_top5": 100.0}


def test_evaluate_leaves_knn200_out_on_200_training_images_or_fewer(caplog) -> None:
    from types import SimpleNamespace

    from selfsup.config import EvalConfig
    from selfsup.eval.run import Features, evaluate

    feats = Features(LIGHTLY_TRAIN[:200], LIGHTLY_TRAIN_Y[:200], torch.tensor([[2.0, 0.0]]), torch.tensor([0]))
    with caplog.at_level(logging.INFO, logger="selfsup"):
        result = evaluate("knn", feats, SimpleNamespace(eval=EvalConfig()))
    assert set(result) == {"knn_top1", "knn_top5"}  # k = 200 of 200 images would be a vote of the whole set
    assert "knn200_top1 (lightly's k = 200) left out" in caplog.text and "there are 200" in caplog.text
