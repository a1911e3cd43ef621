"""How training stops: SIGINT/SIGTERM at a step boundary, a diverged loss, weights unfit to save.

Every process takes the same decision at the same step (:func:`reduced` over the processes).
"""

from __future__ import annotations

import logging
import math
import signal
import statistics
import threading
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger("selfsup")

# A parameter larger than this in magnitude means the weights are exploding (a divergence under way):
# such a state is never checkpointed or exported. Healthy networks stay many orders of magnitude below.
MAX_SANE_WEIGHT = 1e6

# Divergence while the numbers are still finite (issue 31). The loss of a step is diverging when it exceeds
# LOSS_RATIO times the median |loss| of the last LOSS_WINDOW steps, that median floored at LOSS_FLOOR times the run's
# first loss (a loss that converged near 0 may climb back a little: it trips only past 10x the starting loss) and at
# LOSS_MIN_SCALE (losses that start near 0 or cross it, e.g. MSN's cross-entropy minus its ME-MAX entropy, trip only
# past 100 in magnitude; bounded losses such as BYOL's or MSN's then rely on the non-finite and weight checks). The
# presets' losses move by factors of a few early on (VICReg 25 -> 20, MSN and MAST more), two orders of magnitude
# below the ratio; a learning rate 100x too large takes VICReg from 23 to 5e5 within one step. The weights are
# exploding when their L2 norm exceeds MAX_NORM_GROWTH times the norm at the start of the run. Measured on digits
# (quick-start settings, 60-300 steps): VICReg, MSN, MAST, BYOL, ExtreMA stay within 1.0x, NNCLR 1.9x, Barlow Twins
# 7x by step 50 (its BatchNorm scales grow under its large gradients): hence 1000x, a guard for runaway growth that
# the loss does not show (the loss check catches the lr-30 runs first).
LOSS_WINDOW = 50
LOSS_RATIO = 100.0
LOSS_FLOOR = 0.1
LOSS_MIN_SCALE = 1.0
MAX_NORM_GROWTH = 1000.0


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped training at a step boundary, after a checkpoint of that step was written."""

    def __init__(self, signum: int, step: int, run_dir: Path) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}; checkpoint saved. "
                         f"Re-run `selfsup pretrain {run_dir}` to resume")
        self.signum = signum


class TrainingDiverged(RuntimeError):
    """The loss became non-finite (or the weights exploded); the message says which checkpoint is left."""


class StopSignals:
    """SIGINT / SIGTERM during training are remembered and acted on at the next step boundary.

    Stopping mid-step (inside the forward pass, BatchNorm's statistics update or the optimiser
    step) would leave a state that no step count describes; deferring keeps every checkpoint the
    exact state after a whole number of steps. A second signal stops at once, without a checkpoint
    (the previous one stays).
    """

    def __init__(self) -> None:
        self.signum = 0
        self.previous: dict[int, Any] = {}

    def handle(self, signum: int, frame: Any) -> None:
        if self.signum:
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("%s received: stopping after the current step with a checkpoint (send it again to stop at once, "
                    "keeping the previous checkpoint)", signal.Signals(signum).name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def unhealthy(model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why the weights or optimiser state are unfit to checkpoint (non-finite, or exploded), or None."""
    for name, param in model.named_parameters():
        largest = float(param.detach().abs().max()) if param.numel() else 0.0
        if not math.isfinite(largest):
            return f"parameter {name} is not finite"
        if largest > MAX_SANE_WEIGHT:
            return f"parameter {name} reaches |w| = {largest:.3g} (> {MAX_SANE_WEIGHT:g}: the weights are exploding)"
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"optimiser state {key!r} is not finite"
    return None


def weight_norm(model: nn.Module) -> float:
    """The L2 norm of all the model's parameters together."""
    norms = [p.detach().float().norm() for p in model.parameters() if p.numel()]
    return float(torch.stack(norms).norm()) if norms else 0.0


class TrainingHealth:
    """What the divergence checks remember: the recent losses (their running median), the run's first loss and the
    weights' norm at the start of the run. :meth:`state` goes into the checkpoint (key ``health``) so that a resumed
    run judges its steps as the uninterrupted run would; a checkpoint without it starts afresh."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.losses: deque[float] = deque((float(x) for x in state.get("losses", [])), maxlen=LOSS_WINDOW)
        self.first_loss: float | None = state.get("first_loss")
        self.start_norm: float | None = state.get("start_norm")

    def state(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "first_loss": self.first_loss, "start_norm": self.start_norm}

    def start(self, model: nn.Module) -> None:
        """Measure the weights' norm at the start of the run (kept from the checkpoint when resuming)."""
        if self.start_norm is None:
            self.start_norm = weight_norm(model)

    def loss_problem(self, loss: float) -> str | None:
        """Why this step's loss means divergence (non-finite, or far above its running median), or None; a healthy
        loss joins the window."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.losses:
            median = statistics.median(abs(x) for x in self.losses)
            scale = max(median, LOSS_FLOOR * abs(self.first_loss or 0.0), LOSS_MIN_SCALE)
            if abs(loss) > LOSS_RATIO * scale:
                return (f"loss is {loss:.4g}, {abs(loss) / scale:.3g}x its running median {median:.4g} over the last "
                        f"{len(self.losses)} steps (> {LOSS_RATIO:g}x: diverging)")
        if self.first_loss is None:
            self.first_loss = loss
        self.losses.append(loss)
        return None

    def weights_problem(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
        """Why the weights or optimiser state are unfit to checkpoint: :func:`unhealthy`, or a weight norm grown
        past MAX_NORM_GROWTH times the start's."""
        problem = unhealthy(model, optimizer)
        if problem is None and self.start_norm:
            norm = weight_norm(model)
            if norm > MAX_NORM_GROWTH * self.start_norm:
                problem = (f"the weights' norm {norm:.4g} is {norm / self.start_norm:.3g}x the run's starting "
                           f"{self.start_norm:.4g} (> {MAX_NORM_GROWTH:g}x: the weights are exploding)")
        return problem


def reduced(fabric: Any, value: int, op: Any = torch.distributed.ReduceOp.MAX) -> int:
    """``value`` reduced over the processes: the largest by default, so that all of them stop (or raise) at
    the same step; ``ReduceOp.SUM`` for counts."""
    if fabric.world_size == 1:
        return value
    flag = torch.tensor([value], device=fabric.device)
    torch.distributed.all_reduce(flag, op=op)
    return int(flag.item())
