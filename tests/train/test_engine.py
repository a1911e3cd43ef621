"""The engine's per-step lr and weight-decay schedules, with MSN's 1.25x stretch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from selfsup.config import ConfigError, OptimConfig, load_config
from selfsup.train.engine import lr_wd_schedules, validate
from selfsup.train.schedules import cosine_schedule


def test_schedules_without_stretch_end_at_their_final_values() -> None:
    o = OptimConfig(lr=1e-3, min_lr=1e-6, weight_decay=0.04, weight_decay_end=0.4)
    lr, wd = lr_wd_schedules(o, 1e-3, total_steps=100, warmup_steps=10)
    np.testing.assert_allclose(lr, cosine_schedule(1e-3, 1e-6, 100, 10))
    np.testing.assert_allclose(wd, cosine_schedule(0.04, 0.4, 100))


def test_msn_stretch_computes_schedules_over_1_25x_steps() -> None:
    """MSN code: T' = 1.25 T, so wd(t) = 0.4 - 0.36 (1 + cos(pi t / T')) / 2 never reaches 0.4 (spec 2.11)."""
    o = OptimConfig(lr=1e-3, min_lr=1e-6, weight_decay=0.04, weight_decay_end=0.4, schedule_stretch=1.25)
    total, warmup = 800, 15
    lr, wd = lr_wd_schedules(o, 1e-3, total, warmup)
    assert len(lr) == len(wd) == total
    t = np.arange(total)
    np.testing.assert_allclose(wd, 0.4 + (0.04 - 0.4) * 0.5 * (1 + np.cos(np.pi * t / 1000)))
    assert wd[-1] == pytest.approx(0.4 - 0.36 * 0.5 * (1 + math.cos(math.pi * 799 / 1000)))  # ~0.366
    after = t[warmup:] - warmup
    np.testing.assert_allclose(lr[warmup:], 1e-6 + (1e-3 - 1e-6) * 0.5 * (1 + np.cos(np.pi * after / (1000 - warmup))))
    assert lr[-1] > 9e-5  # ends near 1e-4, not at min_lr
    constant = OptimConfig(lr=0.5, schedule="constant", schedule_stretch=1.25)
    np.testing.assert_allclose(lr_wd_schedules(constant, 0.5, 10, 0)[0], np.full(10, 0.5))


def test_stretch_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="optim.schedule_stretch"):
        validate(load_config(overrides=["optim.schedule_stretch=0.5"]))
