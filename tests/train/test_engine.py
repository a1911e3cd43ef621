"""The engine's per-step lr and weight-decay schedules, with MSN's 1.25x stretch; its imports."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from selfsup.config import ConfigError, OptimConfig
from selfsup.load import load_config
from selfsup.launch import run_warnings, validate
from selfsup.train.schedules import cosine_schedule, lr_wd_schedules, warmup_steps


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
    np.testing.assert_allclose(lr_wd_schedules(constant, 0.5, 5, 2)[0], [0.0, 0.25, 0.5, 0.5, 0.5])  # linear warm-up


def test_stretch_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="optim.schedule_stretch"):
        validate(load_config(overrides=["optim.schedule_stretch=0.5"]))


def test_warmup_as_a_fraction_of_the_run_follows_its_length() -> None:
    o = OptimConfig(warmup_fraction=0.05)
    assert warmup_steps(o, total_steps=600, steps_per_epoch=469) == 30
    assert warmup_steps(o, total_steps=6000, steps_per_epoch=469) == 300  # more epochs, same share
    assert warmup_steps(OptimConfig(warmup_epochs=1.0), 600, 469) == 469
    with pytest.raises(ConfigError, match="warmup_fraction and optim.warmup_epochs are both set"):
        validate(load_config(overrides=["optim.warmup_fraction=0.05", "optim.warmup_epochs=1"]))
    with pytest.raises(ConfigError, match="optim.warmup_fraction"):
        validate(load_config(overrides=["optim.warmup_fraction=1.5"]))


def test_warnings_name_a_long_warmup_and_more_prototypes_than_the_batch() -> None:
    msn = load_config("configs/fashion_mnist/msn.yaml", ["method.num_prototypes=1024", "trainer.batch_size=128"])
    warnings = run_warnings(msn, total_steps=610, warmup=469)
    assert len(warnings) == 2
    assert "469 of the run's 610 steps (77%)" in warnings[0] and "optim.warmup_fraction" in warnings[0]
    assert "method.num_prototypes=1024 exceeds the global batch of 128" in warnings[1]
    assert run_warnings(load_config("configs/fashion_mnist/msn.yaml", [
        "method.num_prototypes=1024", "trainer.batch_size=128", "method.sinkhorn_iterations=0"]), 610, 30) == []
    assert run_warnings(load_config("configs/fashion_mnist/msn.yaml", [
        "method.num_prototypes=128", "trainer.batch_size=128"]), 610, 30) == []


def test_the_engine_imports_neither_the_methods_nor_the_evaluation() -> None:
    """``selfsup.train`` is handed the method and the kNN monitor (``selfsup.launch``): no import runs back up."""
    train_dir = Path(__file__).parents[2] / "selfsup" / "train"
    upward = []
    for path in sorted(train_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            upward += [f"{path.name}: {n}" for n in names if n.startswith(("selfsup.methods", "selfsup.eval"))]
    assert len(list(train_dir.glob("*.py"))) > 5 and upward == []
