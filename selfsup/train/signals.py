"""How training stops: SIGINT/SIGTERM at a step boundary, a diverged loss, weights unfit to save.

Every process takes the same decision at the same step (:func:`reduced` over the processes).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger("selfsup")

# A parameter larger than this in magnitude means the weights are exploding (a divergence under way):
# such a state is never checkpointed or exported. Healthy networks stay many orders of magnitude below.
MAX_SANE_WEIGHT = 1e6


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


def reduced(fabric: Any, value: int, op: Any = torch.distributed.ReduceOp.MAX) -> int:
    """``value`` reduced over the processes: the largest by default, so that all of them stop (or raise) at
    the same step; ``ReduceOp.SUM`` for counts."""
    if fabric.world_size == 1:
        return value
    flag = torch.tensor([value], device=fabric.device)
    torch.distributed.all_reduce(flag, op=op)
    return int(flag.item())
