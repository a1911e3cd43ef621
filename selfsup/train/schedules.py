"""Per-step schedules, precomputed as arrays (as in DINO): easy to plot, test and resume."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from selfsup.config import MAX_STEPS, ConfigError, OptimConfig, TrainerConfig


def cosine_schedule(start: float, end: float, total_steps: int, warmup_steps: int = 0,
                    warmup_start: float = 0.0) -> np.ndarray:
    """Linear warm-up from ``warmup_start`` to ``start``, then a half cosine from ``start`` to ``end``.

    Value at step ``t`` after warm-up: ``end + (start - end) * (1 + cos(pi * t / T)) / 2``.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    warmup_steps = min(max(warmup_steps, 0), total_steps)
    warmup = np.linspace(warmup_start, start, warmup_steps, endpoint=False)
    t = np.arange(total_steps - warmup_steps)
    cosine = end + 0.5 * (start - end) * (1 + np.cos(np.pi * t / max(len(t), 1)))
    return np.concatenate([warmup, cosine])


def linear_schedule(start: float, end: float, total_steps: int) -> np.ndarray:
    """Linear ramp from ``start`` to ``end`` over ``total_steps`` (MSN's momentum schedule)."""
    return np.linspace(start, end, total_steps, endpoint=False) if total_steps > 0 else np.zeros(0)


def ema_momentum(momentum: float, horizon: float | None, total_steps: int) -> float:
    """The EMA teacher's starting momentum: ``momentum``, or, when ``horizon`` is given, the momentum
    whose averaging horizon ``1 / (1 - m)`` is that fraction of the run's steps.

    A momentum is a horizon in steps (0.996: the last ~250 steps), so a fixed value means a different
    thing in a 600-step laptop run and in MSN's 375k ImageNet steps; a horizon fraction keeps its
    meaning when ``trainer.epochs`` changes (0.05 of a 1,000-step run: m = 0.98).
    """
    if horizon is None:
        return momentum
    if horizon <= 0:
        raise ValueError(f"the EMA horizon must be a positive fraction of the run, got {horizon}")
    return max(0.0, 1.0 - 1.0 / (horizon * total_steps))


def ema_momentum_schedule(shape: Callable[..., np.ndarray], momentum: float, horizon: float | None,
                          end: float | None, total_steps: int, stretch: float = 1.0) -> np.ndarray:
    """An EMA teacher's momentum per step: from :func:`ema_momentum` to ``end`` along ``shape``
    (``linear_schedule`` for MSN, ``cosine_schedule`` for BYOL and ExtreMA), built ``stretch`` times longer
    than the run (:func:`stretched`). ``end=None`` holds the starting momentum for the whole run.

    The papers raise the momentum to 1, which in a short run freezes the teacher early: rising linearly
    from m0 over T steps, step t's weight in the final teacher peaks at u = 1 / sqrt((1 - m0) T) from the
    end (u = 1 - t / T), 0.31 of a 1,000-step run from 0.99 against 0.03 of MSN's 375k steps from 0.996.
    """
    start = ema_momentum(momentum, horizon, total_steps)
    return stretched(shape, total_steps, stretch, start, start if end is None else end)


def constant_schedule(value: float, total_steps: int, warmup_steps: int = 0, warmup_start: float = 0.0) -> np.ndarray:
    """Constant value after an optional linear warm-up from ``warmup_start`` (DINO's teacher temperature: 0.04 to
    0.07 over the first 30 of 300 epochs, then held)."""
    return cosine_schedule(value, value, total_steps, warmup_steps, warmup_start)


def stretched(schedule_fn, total_steps: int, stretch: float, *args) -> np.ndarray:
    """Compute a schedule over ``stretch * total_steps`` steps and keep the first ``total_steps``.

    The MSN authors' code builds its momentum and weight-decay schedules 1.25x longer than training,
    so they never reach their final value.
    """
    return schedule_fn(*args, int(round(total_steps * stretch)))[:total_steps]


def augmentation_count_schedule(num_ops: int, total_steps: int, first_stage: float = 0.5) -> np.ndarray:
    """MAST's two-stage augmentation schedule (Huang et al. 2023, §3.2): the number of augmentations composed
    per pair at each step.

    Stage 1 (the first ``first_stage`` of the run; the paper: 500 of 1000 epochs) applies one augmentation
    at a time; stage 2 composes a number that grows linearly from 1 to ``num_ops``, reached at the last
    step (``1 + round((K - 1) * t / (T2 - 1))`` at step t of the T2 stage-2 steps).
    """
    if num_ops < 1 or total_steps < 1 or not 0.0 <= first_stage <= 1.0:
        raise ValueError(f"need num_ops >= 1, total_steps >= 1 and first_stage in [0, 1]; got {num_ops}, "
                         f"{total_steps}, {first_stage}")
    stage1 = int(round(first_stage * total_steps))
    stage2 = total_steps - stage1
    ramp = 1 + np.rint((num_ops - 1) * np.arange(stage2) / max(stage2 - 1, 1)).astype(np.int64)
    return np.concatenate([np.ones(stage1, dtype=np.int64), ramp])


# ----------------------------------------------------------------------------------------------
# A run's length and its lr / weight-decay schedules, from its config


def run_steps(t: TrainerConfig, steps_per_epoch: int) -> int:
    """The run's length in steps: ``max_steps``, or ``epochs`` epochs (at least one step); at most MAX_STEPS."""
    if t.max_steps is not None:
        return t.max_steps
    steps = max(1, int(round(t.epochs * steps_per_epoch)))
    if steps > MAX_STEPS:
        raise ConfigError(f"bad value for trainer.epochs: {t.epochs:g}; {t.epochs:g} epochs of {steps_per_epoch} "
                          f"steps are {steps:.3g} steps, more than the {MAX_STEPS:g} a run may take; use fewer")
    return steps


def warmup_steps(o: OptimConfig, total_steps: int, steps_per_epoch: int) -> int:
    """Warm-up length in steps: ``warmup_fraction`` of the run, or ``warmup_epochs`` epochs."""
    if o.warmup_fraction is not None:
        return int(round(o.warmup_fraction * total_steps))
    return int(round(o.warmup_epochs * steps_per_epoch))


def scaled_lr(o: OptimConfig, batch_size: int) -> float:
    """``optim.lr``, times ``batch_size / 256`` with ``lr_scaling: linear``."""
    return o.lr * (batch_size / 256 if o.lr_scaling == "linear" else 1.0)


def lr_wd_schedules(o: OptimConfig, base_lr: float, total_steps: int, warmup_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-step learning rate (warm-up, then cosine to ``min_lr`` or constant) and weight decay (cosine).

    With ``schedule_stretch`` s > 1 the cosine lr and the wd are computed over ``s * total_steps`` steps and
    cut at ``total_steps`` (MSN's code, s = 1.25: the lr ends near 1e-4 instead of 1e-6, wd near 0.366, not 0.4).
    """
    if o.schedule == "cosine":
        cosine = partial(cosine_schedule, warmup_steps=warmup_steps)
        lr = stretched(cosine, total_steps, o.schedule_stretch, base_lr, o.min_lr)
    else:
        lr = constant_schedule(base_lr, total_steps, warmup_steps)
    wd_end = o.weight_decay_end if o.weight_decay_end is not None else o.weight_decay
    return lr, stretched(cosine_schedule, total_steps, o.schedule_stretch, o.weight_decay, wd_end)
