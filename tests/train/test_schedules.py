"""Per-step schedules: linear warm-up + half cosine (DINO's scheduler), linear ramps, MSN's stretched schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selfsup.train.schedules import (constant_schedule, cosine_schedule, ema_momentum, ema_momentum_schedule,
                                     linear_schedule, stretched)


def test_cosine_schedule_hand_values_with_warmup() -> None:
    s = cosine_schedule(1.0, 0.1, total_steps=10, warmup_steps=3, warmup_start=0.4)
    assert len(s) == 10
    np.testing.assert_allclose(s[:3], [0.4, 0.6, 0.8])  # linear from warmup_start, start not yet reached
    expected = [0.1 + 0.5 * 0.9 * (1 + math.cos(math.pi * t / 7)) for t in range(7)]
    np.testing.assert_allclose(s[3:], expected, rtol=1e-12)
    assert s[3] == pytest.approx(1.0)  # the start value right at the end of warm-up


def test_cosine_schedule_monotonic_and_approaches_end() -> None:
    s = cosine_schedule(0.5, 0.01, total_steps=200, warmup_steps=20)
    assert s[0] == 0.0
    assert np.all(np.diff(s[:21]) > 0)  # increasing warm-up up to the peak
    assert s.max() == pytest.approx(0.5) and int(np.argmax(s)) == 20
    assert np.all(np.diff(s[20:]) < 0)  # strictly decreasing cosine
    assert s[20:].min() > 0.01 and s[-1] == pytest.approx(0.01, abs=0.49 * (1 - math.cos(math.pi / 180)) / 2 + 1e-12)
    assert abs(s[-1] - 0.01) < abs(s[-2] - 0.01)


def test_cosine_schedule_increasing_for_momentum() -> None:
    s = cosine_schedule(0.996, 1.0, total_steps=50)
    assert s[0] == pytest.approx(0.996)
    assert np.all(np.diff(s) > 0) and s[-1] < 1.0 and s[-1] > 0.9999


def test_cosine_schedule_edge_cases() -> None:
    assert len(cosine_schedule(1.0, 0.0, total_steps=5, warmup_steps=10)) == 5  # warm-up clipped to the run
    np.testing.assert_allclose(cosine_schedule(1.0, 0.0, total_steps=4, warmup_steps=4), [0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(cosine_schedule(2.0, 0.0, total_steps=1), [2.0])
    with pytest.raises(ValueError):
        cosine_schedule(1.0, 0.0, total_steps=0)


def test_constant_schedule() -> None:
    np.testing.assert_allclose(constant_schedule(0.3, 6, warmup_steps=2), [0.0, 0.15, 0.3, 0.3, 0.3, 0.3])


def test_linear_schedule() -> None:
    np.testing.assert_allclose(linear_schedule(0.0, 1.0, 4), [0.0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(linear_schedule(0.04, 0.4, 3), [0.04, 0.16, 0.28])
    assert len(linear_schedule(0.0, 1.0, 0)) == 0


def test_stretched_msn_momentum_never_reaches_final_value() -> None:
    # MSN: momentum 0.996 -> 1 computed over 1.25x the training steps; only the first steps are used.
    s = stretched(linear_schedule, 8, 1.25, 0.996, 1.0)
    assert len(s) == 8
    np.testing.assert_allclose(s, 0.996 + 0.004 * np.arange(8) / 10, rtol=1e-12)
    assert s[-1] == pytest.approx(0.9988) and s.max() < 1.0
    c = stretched(cosine_schedule, 100, 1.25, 0.04, 0.4)  # MSN weight decay 0.04 -> 0.4
    np.testing.assert_allclose(c, cosine_schedule(0.04, 0.4, 125)[:100])
    assert c[-1] < 0.4 - 0.03


def test_ema_horizon_is_a_fraction_of_the_run() -> None:
    assert ema_momentum(0.996, None, 1000) == 0.996  # no horizon: the configured momentum
    assert ema_momentum(0.996, 0.05, 1000) == pytest.approx(0.98)  # averages the last 50 of 1,000 steps
    assert ema_momentum(0.996, 0.05, 4000) == pytest.approx(0.995)  # 4x the run, 4x the horizon in steps
    for steps in (100, 1000, 10000):  # 1 / (1 - m) is the horizon in steps
        assert 1 / (1 - ema_momentum(0.5, 0.02, steps)) == pytest.approx(0.02 * steps)
    assert ema_momentum(0.996, 0.001, 100) == 0.0  # shorter than a step: no averaging
    with pytest.raises(ValueError, match="positive fraction"):
        ema_momentum(0.996, 0.0, 100)


def test_ema_momentum_schedule_rises_or_holds() -> None:
    # the papers' rise to 1 from the momentum of a 10 % horizon (0.99 over 1,000 steps), linear or cosine
    np.testing.assert_allclose(ema_momentum_schedule(linear_schedule, 0.996, 0.1, 1.0, 1000),
                               linear_schedule(0.99, 1.0, 1000))
    np.testing.assert_allclose(ema_momentum_schedule(cosine_schedule, 0.996, 0.1, 1.0, 1000),
                               cosine_schedule(0.99, 1.0, 1000))
    np.testing.assert_allclose(ema_momentum_schedule(linear_schedule, 0.996, None, 1.0, 100, stretch=1.25),
                               stretched(linear_schedule, 100, 1.25, 0.996, 1.0))
    # end None holds the starting momentum, which follows the run's length through the horizon
    for steps in (1000, 3000):
        held = ema_momentum_schedule(linear_schedule, 0.996, 0.1, None, steps)
        assert held.shape == (steps,)
        np.testing.assert_allclose(held, 1 - 1 / (0.1 * steps))
    np.testing.assert_allclose(ema_momentum_schedule(cosine_schedule, 0.996, None, None, 50), 0.996)


def test_ema_momentum_end_null_is_accepted_and_out_of_range_is_not() -> None:
    from selfsup.config import ConfigError
    from selfsup.methods.byol import BYOLConfig
    from selfsup.methods.extrema import ExtreMAConfig
    from selfsup.methods.msn import MSNConfig

    for config in (MSNConfig, ExtreMAConfig, BYOLConfig):
        assert config(momentum_end=None).momentum_end is None
        with pytest.raises(ConfigError, match="momentum_end: 1.5; use a number in \\[0, 1\\], e.g. 1, or null"):
            config(momentum_end=1.5)
        with pytest.raises(ConfigError, match="method.momentum: -0.1; use a number in \\[0, 1\\]"):
            config(momentum=-0.1)


def test_mast_augmentation_count_schedule() -> None:
    from selfsup.train.schedules import augmentation_count_schedule

    counts = augmentation_count_schedule(5, 100)
    assert len(counts) == 100 and (counts[:50] == 1).all()  # stage 1: one augmentation at a time
    assert (np.diff(counts) >= 0).all() and counts[50] == 1 and counts[-1] == 5  # stage 2: 1 -> K, K at the end
    assert sorted(set(counts[50:].tolist())) == [1, 2, 3, 4, 5]
    assert augmentation_count_schedule(15, 7, first_stage=0.0).tolist() == [1, 3, 6, 8, 10, 13, 15]
    assert augmentation_count_schedule(1, 4).tolist() == [1, 1, 1, 1]


def test_schedule_edges_by_hand() -> None:
    """Mutation-testing survivors: one-step and empty schedules, defaults, MAST's counts as integers, refusals."""
    from selfsup.train.schedules import augmentation_count_schedule

    assert linear_schedule(0.5, 1.0, 1).tolist() == [0.5]
    assert linear_schedule(0.5, 1.0, 0).shape == (0,) and linear_schedule(0.5, 1.0, -1).shape == (0,)
    assert constant_schedule(2.0, 3).tolist() == [2.0, 2.0, 2.0]  # no warm-up by default
    counts = augmentation_count_schedule(3, 4, first_stage=0.5)
    assert counts.dtype == np.int64 and counts.tolist() == [1, 1, 1, 3]
    assert augmentation_count_schedule(3, 2, first_stage=1.0).tolist() == [1, 1]  # all of the run in stage 1
    with pytest.raises(ValueError, match="^total_steps must be positive, got 0$"):
        cosine_schedule(1.0, 0.0, 0)
    for args in [(0, 4, 0.5), (3, 0, 0.5), (3, 4, 1.5), (3, 4, -0.1)]:
        with pytest.raises(ValueError, match=r"^need num_ops >= 1, total_steps >= 1 and first_stage in \[0, 1\]; "
                                             rf"got {args[0]}, {args[1]}, {args[2]}$"):
            augmentation_count_schedule(*args)


def test_linear_lr_scaling_is_per_256_images_and_off_by_default() -> None:
    from selfsup.config import OptimConfig
    from selfsup.train.schedules import scaled_lr

    assert scaled_lr(OptimConfig(lr=0.3, lr_scaling="linear"), 512) == pytest.approx(0.6)  # 0.3 x 512 / 256
    assert scaled_lr(OptimConfig(lr=0.3, lr_scaling="linear"), 64) == pytest.approx(0.075)
    assert scaled_lr(OptimConfig(lr=0.3), 512) == pytest.approx(0.3)  # lr_scaling: none, the default


def test_a_run_lasts_max_steps_or_its_epochs_and_at_least_one_step() -> None:
    from selfsup.config import TrainerConfig
    from selfsup.train.schedules import run_steps

    assert run_steps(TrainerConfig(max_steps=7, epochs=3), steps_per_epoch=100) == 7  # max_steps wins
    assert run_steps(TrainerConfig(epochs=3), steps_per_epoch=100) == 300
    assert run_steps(TrainerConfig(epochs=1.5), steps_per_epoch=5) == 8  # round(7.5) = 8
    assert run_steps(TrainerConfig(epochs=0.01), steps_per_epoch=10) == 1  # round(0.1) = 0: still one step
