"""``trainer.budget``: a run sized to a time budget on the machine it runs on.

A step count says nothing about time: the same preset takes 30 minutes on one 2-core laptop and 50 on another. With
``trainer.budget: 30min`` the run first times its own training step here (a throwaway copy of the model, the real
data, views, optimiser and device; a few warm-up steps, then timed ones), and then trains as many steps as the rest
of the budget buys. Everything sized by the run's length follows it (the warm-up fraction, the cosine, EMA
horizons), as with ``trainer.max_steps``. The budget covers the training stage itself: the calibration, the steps,
their checkpoints and the export; reading or decoding the data before it is not counted.

The calibration is written to ``RUN_DIR/budget.json`` before the first step, and a resumed run reads its length
from there (it is not measured again), so a killed run resumes to the same schedules. A staged run (MAE-CT) shares
the budget among its stages in proportion to their planned steps (``trainer.epochs`` / ``max_steps`` of each stage,
:func:`selfsup.train.stages.budget_shares`); each stage times its own step.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selfsup.config import ConfigError

log = logging.getLogger("selfsup")

__all__ = ["BUDGET_FILE", "Calibration", "budget_steps", "read_budget", "record", "record_elapsed"]

BUDGET_FILE = "budget.json"
WARMUP_STEPS = 2  # untimed: the first steps allocate, fill caches and start loader workers
MIN_TIMED, MAX_TIMED = 3, 20
TIMED_FRACTION = 0.03  # of the budget, at most, for the timed steps (beyond MIN_TIMED)


def cpu_name() -> str:
    """The processor's model name (``lscpu``'s), for the record of where a step was timed."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Calibration:
    """Time ``step(i)`` (one training step, synchronised) on the machine: ``WARMUP_STEPS`` untimed, then at least
    ``MIN_TIMED`` and at most ``MAX_TIMED`` timed ones, stopping once they have taken ``TIMED_FRACTION`` of
    ``budget_s``. ``seconds_per_step`` is their mean (the run's total is a sum of step times, so the mean)."""

    def __init__(self, step: Callable[[int], None], budget_s: float,
                 agree: Callable[[bool], bool] = lambda more: more) -> None:
        """``agree(more)``: whether every process times one more step (all processes must step together)."""
        start = time.perf_counter()
        for i in range(WARMUP_STEPS):
            step(i)
        times: list[float] = []
        while agree(len(times) < MAX_TIMED and (len(times) < MIN_TIMED or sum(times) < TIMED_FRACTION * budget_s)):
            before = time.perf_counter()
            step(WARMUP_STEPS + len(times))
            times.append(time.perf_counter() - before)
        self.seconds_per_step = sum(times) / len(times)
        self.timed_steps = len(times)
        self.elapsed_s = time.perf_counter() - start


def budget_steps(share_s: float, calibration: Calibration, floor: bool = False) -> int:
    """Steps that fit in what is left of ``share_s`` after the calibration. None fit: an error, or with ``floor`` (a
    later stage of a run) one step and a warning."""
    left = share_s - calibration.elapsed_s
    if left < calibration.seconds_per_step and floor:
        log.warning("trainer.budget: this stage's share (%.1f s) went to timing its step (%.1f s); it trains 1 step "
                    "(give a larger budget for more)", share_s, calibration.elapsed_s)
        return 1
    if left < calibration.seconds_per_step:
        raise ConfigError(f"trainer.budget: measuring the step took {calibration.elapsed_s:.1f} s of the "
                          f"{share_s:.1f} s this run has, which leaves no time to train (a step takes "
                          f"{calibration.seconds_per_step:.2f} s here); give a larger budget, or a smaller model, "
                          f"batch or image size")
    return max(1, math.floor(left / calibration.seconds_per_step))


def record(run_dir: Path, budget: str, share_s: float, calibration: Calibration, steps: int, steps_per_epoch: int,
           images: int, device: str, threads: int) -> dict[str, Any]:
    """Write ``RUN_DIR/budget.json`` (what was measured and what it bought) and return it."""
    entry = {"budget": budget, "share_s": round(share_s, 2), "seconds_per_step": round(calibration.seconds_per_step, 6),
             "timed_steps": calibration.timed_steps, "warmup_steps": WARMUP_STEPS,
             "calibration_s": round(calibration.elapsed_s, 3), "steps": steps,
             "epochs": round(steps / steps_per_epoch, 3), "images": images, "device": device,
             "cpu": cpu_name(), "threads": threads, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    _write(Path(run_dir), entry)
    return entry


def read_budget(run_dir: Path, budget: str) -> dict[str, Any] | None:
    """The calibration a run recorded for ``budget`` (None when there is none: the run has not started)."""
    path = Path(run_dir) / BUDGET_FILE
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        steps = int(entry["steps"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is unreadable ({err}); it holds the length this run was sized to: restore it, or "
                          f"train into a new trainer.out") from None
    if entry.get("budget") != budget:
        raise ConfigError(f"{path} sized this run for trainer.budget={entry.get('budget')}, not {budget}; resume it "
                          f"with its own budget, or train into a new trainer.out")
    entry["steps"] = steps
    return entry


def record_elapsed(run_dir: Path, started: float) -> None:
    """Add the session's wall-clock seconds, calibration to export, to ``budget.json`` (a run that was not resumed:
    a resumed one's time is split over sessions)."""
    entry = json.loads((Path(run_dir) / BUDGET_FILE).read_text())
    entry["elapsed_s"] = round(time.perf_counter() - started, 2)
    _write(Path(run_dir), entry)


def _write(run_dir: Path, entry: dict[str, Any]) -> None:
    from selfsup.checkpoint import atomic_write

    atomic_write(run_dir / BUDGET_FILE, lambda tmp: Path(tmp).write_text(json.dumps(entry, indent=2) + "\n"))
