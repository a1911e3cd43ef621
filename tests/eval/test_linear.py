"""Linear probe: batched Adam heads, held-out selection on train only, retrain, test top-1."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfsup.eval.linear import _train_heads, linear_probe, stratified_holdout


def _blobs(per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three well separated Gaussian blobs in 5-D (centres 6 apart, unit noise)."""
    gen = torch.Generator().manual_seed(seed)
    centres = 6.0 * torch.eye(3, 5)
    labels = torch.arange(3).repeat_interleave(per_class)
    return centres[labels] + torch.randn(labels.shape[0], 5, generator=gen), labels


def _reference_adam(
    x: torch.Tensor, y: torch.Tensor, lr: float, wd: float, epochs: int, batch: int, smoothing: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.optim.Adam + cosine schedule + autograd CE, same mini-batch order as _train_heads."""
    num_classes = int(y.max()) + 1
    weight = torch.zeros(x.shape[1], num_classes, requires_grad=True)
    bias = torch.zeros(num_classes, requires_grad=True)
    opt = torch.optim.Adam([{"params": [weight], "weight_decay": wd}, {"params": [bias], "weight_decay": 0.0}], lr=lr)
    total = epochs * math.ceil(x.shape[0] / batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=gen)
        for start in range(0, x.shape[0], batch):
            idx = order[start : start + batch]
            loss = F.cross_entropy(x[idx] @ weight + bias, y[idx], label_smoothing=smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return weight.detach(), bias.detach()


def test_batched_heads_equal_torch_adam_with_cosine_schedule() -> None:
    x, y = _blobs(7, seed=1)
    lrs, wds = [0.05, 0.2], [0.0, 0.3]
    weight, bias = _train_heads(x, y, torch.tensor(lrs), torch.tensor(wds), 3, 3, 4, 0.1, seed=5)
    for g, (lr, wd) in enumerate(zip(lrs, wds)):
        ref_w, ref_b = _reference_adam(x, y, lr, wd, epochs=3, batch=4, smoothing=0.1, seed=5)
        torch.testing.assert_close(weight[:, 3 * g : 3 * g + 3], ref_w, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(bias[3 * g : 3 * g + 3], ref_b, atol=1e-5, rtol=1e-4)


def test_separable_blobs_reach_100_percent() -> None:
    train_x, train_y = _blobs(40, seed=0)
    test_x, test_y = _blobs(20, seed=1)
    result = linear_probe(train_x, train_y, test_x, test_y, epochs=10, batch_size=16)
    assert result["top1"] == 100.0 and result["top5"] == 100.0 and result["val_top1"] == 100.0
    assert set(result) == {"top1", "top5", "val_top1", "best_lr", "best_wd", "train_objective"}
    smoothed = linear_probe(train_x, train_y, test_x, test_y, epochs=10, batch_size=16, label_smoothing=0.1)
    assert smoothed["top1"] == 100.0


def test_selection_never_reads_test_data() -> None:
    # Overlapping blobs so that the grid entries really differ on validation data.
    gen = torch.Generator().manual_seed(0)
    train_x, train_y = torch.randn(90, 5, generator=gen), torch.arange(3).repeat(30)
    train_x[:, 0] += train_y.float()
    test_x, test_y = torch.randn(30, 5, generator=gen), torch.arange(3).repeat(10)
    kwargs = dict(lrs=(1e-3, 1e-1), weight_decays=(0.0, 1.0), epochs=5, batch_size=8)
    honest = linear_probe(train_x, train_y, test_x, test_y, **kwargs)
    wrong = linear_probe(train_x, train_y, -test_x, (test_y + 1) % 3, **kwargs)
    for key in ("best_lr", "best_wd", "val_top1"):
        assert honest[key] == wrong[key]
    assert honest["top1"] != wrong["top1"]


def test_deterministic_for_a_seed() -> None:
    train_x, train_y = _blobs(20, seed=0)
    test_x, test_y = _blobs(10, seed=1)
    runs = [linear_probe(train_x, train_y, test_x, test_y, epochs=3, batch_size=8, seed=3) for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("normalize", ["standardize", "l2", "none"])
def test_normalizations_run(normalize: str) -> None:
    train_x, train_y = _blobs(20, seed=0)
    test_x, test_y = _blobs(10, seed=1)
    result = linear_probe(train_x.numpy(), train_y.numpy(), test_x, test_y, epochs=5, batch_size=8, normalize=normalize)
    assert result["top1"] == 100.0


def test_stratified_holdout_counts() -> None:
    labels = np.array([0] * 10 + [1] * 5 + [2])
    fit, val = stratified_holdout(labels, 0.2, seed=0)
    # round-half-up(0.2 * n_c) per class, but a singleton class stays in the fit part.
    assert np.bincount(labels[val], minlength=3).tolist() == [2, 1, 0]
    assert sorted(np.concatenate([fit, val]).tolist()) == list(range(16))
    again_fit, again_val = stratified_holdout(labels, 0.2, seed=0)
    assert np.array_equal(val, again_val) and np.array_equal(fit, again_fit)


def test_stratified_holdout_of_a_few_labels_per_class_validates_on_one_of_each() -> None:
    """Issue 48: 3 labelled images per class (a user's folder) gave round(0.1 * 3) = 0 to validation, and the linear
    probe stopped with an error; each class of two or more now gives one."""
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3])
    fit, val = stratified_holdout(labels, 0.1, seed=0)
    assert np.bincount(labels[val], minlength=4).tolist() == [1, 1, 1, 0]
    assert np.bincount(labels[fit], minlength=4).tolist() == [2, 2, 1, 1]
    with pytest.raises(ValueError, match="single labelled sample.*label more images"):
        stratified_holdout(np.array([0, 1, 2]), 0.1, seed=0)


def test_bad_arguments_fail_clearly() -> None:
    x, y = _blobs(5, seed=0)
    with pytest.raises(ValueError, match="val_fraction"):
        linear_probe(x, y, x, y, val_fraction=1.0)
    with pytest.raises(ValueError, match="lrs is empty"):
        linear_probe(x, y, x, y, lrs=())
    with pytest.raises(ValueError, match="normalize"):
        linear_probe(x, y, x, y, normalize="batchnorm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single labelled sample"):
        linear_probe(x[:3], torch.tensor([0, 1, 2]), x, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_matches_cpu() -> None:
    train_x, train_y = _blobs(20, seed=0)
    test_x, test_y = _blobs(10, seed=1)
    cpu = linear_probe(train_x, train_y, test_x, test_y, epochs=3, batch_size=8)
    cuda = linear_probe(train_x, train_y, test_x, test_y, epochs=3, batch_size=8, device="cuda")
    assert cuda["top1"] == cpu["top1"] == 100.0
    assert (cuda["best_lr"], cuda["best_wd"]) == (cpu["best_lr"], cpu["best_wd"])


def test_min_steps_extends_the_run_as_more_epochs_would() -> None:
    """``min_steps`` = k passes is the same run as ``epochs`` = k (same batches, same cosine), and the cut is exact."""
    x, y = _blobs(7, seed=1)  # 21 samples, 6 steps of 4 per pass
    args = (x, y, torch.tensor([0.05]), torch.tensor([0.1]), 3)
    longer = _train_heads(*args, 5, 4, 0.0, 5)
    extended = _train_heads(*args, 1, 4, 0.0, 5, min_steps=30)
    assert all(torch.equal(a, b) for a, b in zip(longer, extended))
    cut = _train_heads(*args, 1, 4, 0.0, 5, min_steps=27)  # 4.5 passes: not any whole number of them
    assert not any(torch.equal(a, b) for a, b in zip(longer, cut))


def test_the_default_probe_converges_on_a_few_hundred_labels_per_class() -> None:
    """Issue 52: on a small labelled set the probe must reach the optimum of its own objective, not stop after its
    epochs (1,500 digits at batch 256 are 6 steps a pass: 30 passes left the objective 0.1 above the optimum and the
    accuracy 2.7 points below). The reference is the same objective, at the chosen weight decay, solved by L-BFGS."""
    from sklearn.datasets import load_digits

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from probe_convergence import lbfgs  # the converged reference, shared with the benchmark

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    result = linear_probe(train_x, train_y, test_x, test_y, epochs=30, weight_decays=[1e-3])  # a finite optimum
    mean, std = train_x.mean(0), train_x.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    optimum, w, b = lbfgs((train_x - mean) / std, train_y, 1e-3, 10)
    # measured: 0.0096 above at the default 5,000 steps (lr 1e-3 chosen), 0.067 above after 30 passes (180 steps)
    assert 0 <= result["train_objective"] - optimum < 0.02, (result["train_objective"], optimum)
    logits = ((test_x - mean) / std).double() @ w + b
    reference = 100.0 * float((logits.argmax(1) == test_y).float().mean())
    # 297 test images, 0.34 points each: measured 0.67 below at 5,000 steps, 2.7 below after 180
    assert abs(result["top1"] - reference) <= 1.0, (result["top1"], reference)


def test_test_features_are_standardised_with_the_training_statistics() -> None:
    # Issue 52: a probe that standardised the test features with their own mean / std passed every test. Here the
    # class is the sign of feature 0 in training (mean 0), and every test point is shifted by +3 on that feature.
    # With the training statistics all test points land on the positive side: class 1 for all, 50 %. Re-centring
    # the test set with its own mean would undo the shift and score 100 %.
    gen = torch.Generator().manual_seed(0)
    signs = torch.tensor([-1.0, 1.0]).repeat(40)
    train_y = (signs > 0).long()
    train_x = 0.1 * torch.randn(80, 3, generator=gen)
    train_x[:, 0] += signs
    test_x = train_x[:20].clone()
    test_x[:, 0] += 3.0
    result = linear_probe(train_x, train_y, test_x, train_y[:20], epochs=5, batch_size=16)
    assert result["val_top1"] == 100.0  # the probe learnt the sign of feature 0
    assert result["top1"] == 50.0  # and applied the training mean / std to the shifted test set
