"""Weighted kNN (Wu et al. 2018 / DINO): cosine top-k, weights exp(s/T), summed class votes."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from selfsup.eval.knn import knn_classify, knn_scores, topk_accuracy

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
