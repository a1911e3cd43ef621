"""What a training run records: ``metrics.csv`` and its plots, the progress bar or log line, the training clock.

:class:`TrainingLog` decides what each step records (a row every ``log_every_steps``, collapse statistics and
eigenspectra every ``monitor.collapse_every_steps``, the online kNN accuracy every ``monitor.knn_every_steps``).
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from selfsup.checkpoint import atomic_write
from selfsup.config import Config
from selfsup.train.loggers import ExperimentLoggers
from selfsup.train.monitors import SpectrumLog, collapse_stats
from selfsup.train.signals import TrainingInterrupted

log = logging.getLogger("selfsup")

# ``(backbone, device) -> top-1 accuracy``: the online kNN monitor (``selfsup.eval.monitor``).
KNNAccuracy = Callable[[nn.Module, torch.device], float]


class TrainClock:
    """Training time of this process, wall-clock and CPU (user + system, all threads), monitors, logging
    and checkpoints excluded; continued across resumes through the checkpoint."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.wall = float((state or {}).get("train_time_s", 0.0))
        self.cpu = float((state or {}).get("cpu_time_s", 0.0))

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> float:
        """Add the time since :meth:`start`; returns its wall-clock seconds."""
        elapsed = time.perf_counter() - self._wall
        self.wall += elapsed
        self.cpu += time.process_time() - self._cpu
        return elapsed

    def state(self) -> dict[str, float]:
        return {"train_time_s": round(self.wall, 2), "cpu_time_s": round(self.cpu, 2)}


class MetricsLog:
    """``metrics.csv``: one row per logged step; columns grow as new metrics appear."""

    def __init__(self, path: Path, resume_step: float) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if path.is_file() and resume_step > 0:
            with path.open() as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        columns: list[str] = []
        for row in self.rows:
            columns.extend(k for k in row if k not in columns)

        def write(tmp: str) -> None:
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(self.rows)

        atomic_write(self.path, write)


def plot_metrics(rows: list[dict[str, Any]], out_dir: Path) -> None:
    """One PNG per logged metric against the step (loss, kNN accuracy, collapse statistics...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(exist_ok=True)
    skip = ("step", "epoch", "stage")
    keys = [k for k in (rows[0].keys() if rows else []) if k not in skip]
    keys += [k for r in rows for k in r if k not in keys and k not in skip]
    for key in dict.fromkeys(keys):
        points = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
        if len(points) < 2:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(*zip(*points))
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / f"{key.replace('/', '_')}.png", dpi=100)
        plt.close(fig)


class Progress:
    """Training's progress (:class:`selfsup.progress.Progress`): with ``trainer.progress`` on a terminal, a bar whose
    info column holds the last logged row; otherwise a log line per logged row (every ``log_every_steps``) with
    ``step/total``, the percentage and the ETA before the row."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        from selfsup.progress import Progress as SharedProgress

        self.shared = SharedProgress("pretrain", total, unit="steps", start=start, bar=enabled, log_interval_s=None)

    def update(self, step: int, info: str, force_log: bool) -> None:
        self.shared.update(step, info, force_log=force_log)

    def close(self) -> None:
        self.shared.close()


class TrainingLog:
    """The records of one run: ``metrics.csv`` rows, eigenspectra (``spectra.npz``), the kNN monitor, the progress,
    and each row sent to the experiment loggers (``trainer.loggers``: TensorBoard, W&B, MLflow).

    Resuming at step s keeps the rows and spectra of steps <= s. Only the main process records (``record``).
    """

    def __init__(self, cfg: Config, run_dir: Path, start_step: int, total_steps: int, steps_per_epoch: int,
                 knn_monitor: KNNAccuracy | None, stage: str | None, show_progress: bool,
                 experiment: ExperimentLoggers | None = None) -> None:
        self.every, self.total_steps, self.steps_per_epoch = cfg.trainer.log_every_steps, total_steps, steps_per_epoch
        self.collapse_every, self.knn_every = cfg.monitor.collapse_every_steps, cfg.monitor.knn_every_steps
        self.knn_monitor, self.stage = knn_monitor, stage
        self.metrics = MetricsLog(run_dir / "metrics.csv", start_step)
        self.spectra = SpectrumLog(run_dir / "spectra.npz", start_step)
        self.progress = Progress(show_progress, total_steps, start_step)
        self.experiment = experiment
        self.window_seconds, self.window_images = 0.0, 0  # images/s since the last record

    def count(self, seconds: float, images: int) -> None:
        """A step of ``images`` images took ``seconds`` of training time."""
        self.window_seconds += seconds
        self.window_images += images

    def row_due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.total_steps

    def _collapse_due(self, step: int) -> bool:
        return bool(self.collapse_every) and step % self.collapse_every == 0

    def _knn_due(self, step: int) -> bool:
        return self.knn_monitor is not None and (step % self.knn_every == 0 or step == self.total_steps)

    def due(self, step: int) -> bool:
        """Whether :meth:`record` may record anything after ``step`` steps (a row, a monitor): the only steps at which
        it reads the step's values from the device. The same on every process (the kNN monitor is the main
        process's only: its setting decides, not its presence), so that they all act on it together."""
        knn = bool(self.knn_every) and (step % self.knn_every == 0 or step == self.total_steps)
        return self.row_due(step) or self._collapse_due(step) or knn

    def record(self, step: int, lr: float, out: Any, clock: TrainClock, backbone: nn.Module, device: torch.device,
               unreadable: int | None) -> None:
        """After ``step`` steps: a metrics row (with the step output's loss and terms) and the monitors, when due."""
        log_now, collapse_now, knn_now = self.row_due(step), self._collapse_due(step), self._knn_due(step)
        if not (log_now or collapse_now or knn_now):
            return
        row: dict[str, Any] = {**({"stage": self.stage} if self.stage else {}), "step": step,
                               "epoch": round(step / self.steps_per_epoch, 3), "lr": lr, "loss": out.loss.item(),
                               **{k: float(v) for k, v in out.terms.items()},
                               "images_per_s": round(self.window_images / max(self.window_seconds, 1e-9), 1),
                               **clock.state()}
        if unreadable is not None:
            row["unreadable_images"] = unreadable
        if collapse_now and out.embeddings is not None:
            row.update(collapse_stats(out.embeddings))
            self.spectra.append(step, out.embeddings)
        if knn_now:
            row["knn_top1"] = self.knn_monitor(backbone, device)
        self.metrics.append(row)
        if self.experiment is not None:
            self.experiment.log_metrics(row)
        info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        self.progress.update(step, info, force_log=log_now or knn_now)
        self.window_seconds, self.window_images = 0.0, 0

    def flush(self) -> None:
        self.metrics.flush()
        self.spectra.flush()
        if self.experiment is not None:
            self.experiment.flush()

    def __enter__(self) -> TrainingLog:
        return self

    def __exit__(self, error_type: type | None, *_: Any) -> None:
        """Training stopped: the progress bar ends; the loggers' files are synced, and their runs closed if training
        stopped early (interrupted: KILLED, diverged or failed: FAILED; a finished run closes them after its plots)."""
        self.progress.close()
        if self.experiment is not None:
            if error_type is None:
                self.experiment.flush()
            else:
                self.experiment.finalize("KILLED" if issubclass(error_type, TrainingInterrupted) else "failed")

    def plot(self, out_dir: Path) -> None:
        """The metrics' curves and the eigenspectra, into ``out_dir``."""
        plot_metrics(self.metrics.rows, out_dir)
        self.spectra.plot(out_dir / "eigenspectrum.png")
