"""A run directory while it trains: resuming it, its config changes, its checkpoints and exported backbones.

Layout: see :mod:`selfsup.checkpoint`. A checkpoint holds ``model``, ``optimizer``, ``step``, the training clock
(``train_time_s``, ``cpu_time_s``), the resolved ``config``, the divergence checks' ``health`` state and the
``unreadable_images`` replaced so far (both absent from older checkpoints, which resume as before).

A checkpoint is kept only while it passes the health checks: its weights and optimiser state when it is written, and
the loss its weights give at the next step. ``checkpoints/previous.pt`` (a hard link to the checkpoint before) is what
a run falls back on when the latter fails; the failed checkpoint is moved to ``checkpoints/diverged.pt``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from selfsup.checkpoint import (CHECKPOINT, TMP_SUFFIX, CheckpointError, check_run_checkpoint, export_backbone,
                                load_checkpoint, read_backbone_meta, remove_stale_temporaries, save_checkpoint)
from selfsup.config import Config, ConfigError, flatten, save_config, to_dict
from selfsup.data.imagedata import ImageData
from selfsup.data.stream import StreamedSplit, data_fingerprint
from selfsup.models import recorded_backbone
from selfsup.report.method_figures import draw_method_figures
from selfsup.train.loggers import ExperimentLoggers
from selfsup.train.metrics_log import KNNAccuracy, TrainClock, TrainingLog
from selfsup.train.signals import TrainingDiverged, TrainingHealth, reduced
from selfsup.train.views import StepViews

log = logging.getLogger("selfsup")

# Keys (and whole sections) that may change when a run is resumed: they do not affect the computation. The
# monitors only read the model (in eval mode, with their own RNG; each step reseeds the global one), evaluation and
# the experiment loggers run outside training, and the others say when or where to write, or how fast to compute
# (trainer.num_threads changes the order of float sums only; trainer.compile and trainer.tf32 the kernels, so the
# last bits of a GPU's numbers, never the weights' names). data.root may move: the data's content is checked
# against the checkpoint's fingerprint instead (RunDir.check_data).
RESUMABLE_CHANGES = {"trainer.progress", "trainer.log_every_steps", "trainer.checkpoint_every_steps",
                     "trainer.export_every_steps", "trainer.num_threads", "trainer.compile", "trainer.tf32",
                     "trainer.out", "trainer.loggers", "monitor",
                     "eval", "data.num_workers", "data.allow_incomplete_shards", "data.root",
                     "data.eval_split", "data.labels",  # what evaluation and the monitor read, not what trains
                     "model.init_weights"}  # read when a run starts only


# Losses kept on the device before they are checked (RunDir.watch_loss): they are checked at each metrics row,
# checkpoint and snapshot, or once this many wait (a run that logs and saves seldom keeps a bounded list).
MAX_UNCHECKED_LOSSES = 256
NO_STEP = 2**62  # no diverging loss (reduced with MIN over the processes)

# Held by the process that trains into the run directory (rank 0), for the whole run.
LOCK = ".selfsup.lock"
# What a run directory holds (see the README's "Run directory"): anything else is a user's own file.
RUN_ENTRIES = {"config.yaml", "budget.json", "metrics.csv", "spectra.npz", "config_changes.log", "loggers.json",
               "backbone.safetensors", "backbone.json", "report.html", "checkpoints", "plots", "snapshots", "stages",
               "eval", "export", "tensorboard", "wandb", "mlruns", LOCK}
# Results that only a run that trained (or was evaluated) leaves: without a checkpoint, retraining would replace them.
RESULTS = ("backbone.safetensors", "eval", "export", "snapshots", "report.html")


def unfit_run_dir(run_dir: Path) -> str | None:
    """Why ``trainer.out`` may not be trained into, or None: it holds files that are not a run's (a user's own
    folder), or a run's results without a checkpoint to resume (deleted to save space): training would overwrite
    them. A new or empty folder, a resumable run, or one stopped before its first checkpoint (config.yaml,
    metrics.csv, plots) is fit."""
    if not run_dir.is_dir():
        return None
    names = {p.name for p in run_dir.iterdir() if not (p.name.startswith(".") and p.name.endswith(TMP_SUFFIX))}
    foreign = sorted(names - RUN_ENTRIES)
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return (f"trainer.out: {run_dir} holds files that are not a selfsup run's ({listed}); nothing in it is "
                f"overwritten: choose a new or empty folder for the run")
    if (run_dir / CHECKPOINT).is_file() or any((run_dir / "stages").glob(f"*/{CHECKPOINT}")):
        return None
    results = [name for name in RESULTS if name in names]
    if results:
        return (f"trainer.out: {run_dir} holds a run's results ({', '.join(results)}) but no {CHECKPOINT} to resume "
                f"from: training would replace them; choose another trainer.out, or move {run_dir} away to retrain")
    return None


@contextlib.contextmanager
def run_lock(fabric: Any, run_dir: Path) -> Iterator[None]:
    """A directory fit to train into (:func:`unfit_run_dir`), and one run per directory: the main process holds an
    OS file lock (``flock``) on ``RUN_DIR/.selfsup.lock`` while it trains, and writes its PID there. The OS releases
    the lock when the process ends, however it ends, so a killed run leaves no stale lock. Finding it held, every
    process of the second run stops with a ConfigError naming the holder's PID, before anything in the directory is
    touched. A directory this made and that holds nothing but the lock at the end (the run failed before writing
    anything) is removed."""
    import fcntl

    handle, holder, made, problem = None, 0, False, None
    if fabric.global_rank == 0:
        problem = unfit_run_dir(run_dir)  # before the lock file is made: a refused folder is left as it was
    if reduced(fabric, int(problem is not None)):
        raise ConfigError(problem or f"trainer.out: {run_dir} is refused (the main process says why)")
    if fabric.global_rank == 0:
        made = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            holder = int(text) if text.isdigit() else -1
            handle.close()
            handle = None
        else:
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
    holder = reduced(fabric, holder)  # every process learns it, and stops together
    if holder:
        who = f"process {holder}" if holder > 0 else "another process"
        raise ConfigError(f"trainer.out: {run_dir} is in use by {who} (it holds {run_dir / LOCK}); wait for that run "
                          f"to end (re-running this command then resumes it) or choose another trainer.out")
    try:
        yield
    finally:
        if handle is not None:
            if made and [p.name for p in run_dir.iterdir()] == [LOCK]:
                (run_dir / LOCK).unlink()
                run_dir.rmdir()
            handle.close()  # releases the lock


def check_resume_compatible(saved: dict[str, Any], current: dict[str, Any], run_dir: Path,
                            allowed: tuple[str, ...] = (), finished_steps: int | None = None) -> list[str]:
    """Refuse to resume a run directory whose config differs in anything that changes the computation.

    Differences under :data:`RESUMABLE_CHANGES` and the ``allowed`` sections (e.g. ``("optim",)``) are accepted
    and returned as ``"key: old -> new"`` lines. Normalisation left to be measured (``data.mean``/``std`` null) is
    not a change: it is measured again on the same data. ``finished_steps``: the run is done (it trained and exported
    that many steps); asking it for another length then says how to train it further (:func:`extension_command`).
    """

    def under(key: str, sections) -> bool:
        return any(key == r or key.startswith(r + ".") for r in sections)

    old, new = flatten(saved), flatten(current)
    diffs = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
             and not (k.startswith(("data.mean", "data.std")) and new.get(k) is None)]
    refused = [k for k in diffs if not under(k, RESUMABLE_CHANGES) and not under(k, allowed)]
    if refused and finished_steps is not None and all(k in LENGTH_KEYS for k in refused):
        raise ConfigError(extension_command(saved, current, run_dir, finished_steps))
    if refused:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in refused[:5])
        hint = (" To resume with other optim.* settings, add --allow-optim-change."
                if all(under(k, ("optim",)) for k in refused) else "")
        raise ConfigError(f"{run_dir} holds a run with a different config ({shown}). Resume it with "
                          f"`selfsup pretrain {run_dir}`, or start a new run with trainer.out=<new dir>.{hint}")
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diffs]


# The keys that set a run's length: a finished run asked for another one is extended (extension_command).
LENGTH_KEYS = ("trainer.max_steps", "trainer.epochs", "trainer.budget")


def extension_command(saved: dict[str, Any], current: dict[str, Any], run_dir: Path, done: int) -> str:
    """What to say when a finished run is asked for another length: it is not changed (its backbone and evaluations
    stay what they are); a new run continues it from its final checkpoint (the method's weights: backbone, heads and
    EMA teacher) as one stage with its own 5 % warm-up and schedules, trained for the steps (epochs, budget) asked
    beyond what it did. The command is written out in full, ready to paste."""
    old_t, new_t = saved.get("trainer", {}), current.get("trainer", {})
    asked = f"trainer.max_steps={new_t.get('max_steps')}" if new_t.get("max_steps") != old_t.get("max_steps") else (
        f"trainer.epochs={new_t.get('epochs')}" if new_t.get("epochs") != old_t.get("epochs") else
        f"trainer.budget={new_t.get('budget')}")
    length, top = {}, []
    if new_t.get("budget") is not None:
        top.append(f"trainer.budget={new_t['budget']}")
        what = f"trained for trainer.budget={new_t['budget']}"
    elif new_t.get("max_steps") is not None:
        more = int(new_t["max_steps"]) - done
        if more <= 0:
            return (f"{run_dir} is finished: it trained {done} steps, and {asked} asks for no more; pass a larger "
                    f"trainer.max_steps to train it further, or start a new run with trainer.out=<new dir>")
        length, what = {"max_steps": more}, f"{more} more steps"
    else:
        more_epochs = float(new_t.get("epochs") or 0) - float(old_t.get("epochs") or 0)
        if more_epochs <= 0 or old_t.get("max_steps") is not None:
            return (f"{run_dir} is finished ({done} steps, backbone exported); {asked} does not ask it for more "
                    f"training; pass trainer.max_steps=N (N > {done}) to train it further")
        length, what = {"epochs": round(more_epochs, 6)}, f"{more_epochs:g} more epochs"
    new_dir = Path(f"{run_dir}_more")
    n = 2
    while new_dir.exists():
        new_dir, n = Path(f"{run_dir}_more{n}"), n + 1
    stage: dict[str, Any] = {"name": "more", "init_from": str(run_dir),
                             "optim": {"warmup_epochs": 0, "warmup_fraction": 0.05}}
    if length:
        stage["trainer"] = length
    spec = yaml.safe_dump([stage], default_flow_style=True, sort_keys=False, width=10**6).strip()
    command = " ".join(shlex.quote(a) for a in ["selfsup", "pretrain", str(run_dir), f"trainer.out={new_dir}",
                                                     *top, f"stages={spec}"])
    return (f"{run_dir} is finished ({done} steps, backbone exported) and is left as it is; {asked} does not change "
            f"a finished run. To train it further, continue it in a new run from its final weights (backbone, heads "
            f"and teacher), {what} with its own 5 % warm-up: `{command}`")


def record_config_changes(run_dir: Path, step: int, changes: list[str]) -> None:
    """Log the accepted config changes of a resume and append them to ``config_changes.log``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with (run_dir / "config_changes.log").open("a") as f:
        for change in changes:
            log.warning("resuming at step %d with a changed config: %s", step, change)
            f.write(f"{stamp} step {step}: {change}\n")


def run_checkpoint(run_dir: Path) -> Path:
    """``init_from``: the checkpoint of a finished run (a staged run's last stage's)."""
    candidates = [run_dir / CHECKPOINT, *sorted((run_dir / "stages").glob(f"*/{CHECKPOINT}"),
                                              key=lambda p: int(p.parent.name.split("_")[0]))[-1:]]
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(f"init_from: {run_dir} holds no {CHECKPOINT} (nor stages/*/{CHECKPOINT}); point it at the run "
                      "directory of a finished `selfsup pretrain`")


def carried_weights(path: Path) -> dict[str, Any]:
    """The method weights a fresh stage starts from: the checkpoint of the previous stage or of ``init_from``,
    checked as a resume checks its own (readable, complete, finite)."""
    fix = f"point init_from at another finished run, or re-run the run that wrote {path}"
    state = load_checkpoint(path, fix)
    check_run_checkpoint(state, path, fix)
    return state["model"]


def finished_steps(run_dir: Path, state: dict[str, Any]) -> int | None:
    """The steps of a finished run: its backbone exported at the checkpoint's step (None for a run in progress)."""
    try:
        meta = read_backbone_meta(run_dir)
    except (CheckpointError, OSError):  # none yet, or damaged: the run is resumed (and re-exported) as usual
        return None
    return int(state["step"]) if meta.get("steps") == int(state["step"]) else None


class RunDir:
    """One stage's run directory (``cfg.trainer.out``) during training, on every process.

    Made from the config: reads the checkpoint (if any) and checks that the config may resume it. Then
    :meth:`restore` loads its state into the model and optimiser, :meth:`open` gives it what it saves (the config
    with the measured normalisation, the model, the optimiser) and writes the directory, :meth:`start_logs`
    starts its logs, and :meth:`checkpoint` / :meth:`export` save. ``saved_step``: the step of the checkpoint on
    disk, None before one.
    """

    def __init__(self, fabric: Any, cfg: Config, allow_optim_change: bool) -> None:
        self.fabric, self.cfg, self.is_main = fabric, cfg, fabric.global_rank == 0
        self.path = Path(cfg.trainer.out)
        self.checkpoint_path = self.path / CHECKPOINT
        self.state = load_checkpoint(self.checkpoint_path) if self.checkpoint_path.is_file() else None
        if self.state is not None:
            check_run_checkpoint(self.state, self.checkpoint_path)
        self.changes: list[str] = []
        if self.state is not None:
            self.changes = check_resume_compatible(self.state["config"], to_dict(cfg), self.path,
                                                   allowed=("optim",) if allow_optim_change else (),
                                                   finished_steps=finished_steps(self.path, self.state))
        self.start_step = int(self.state["step"]) if self.state is not None else 0
        self.saved_step = self.start_step if self.state is not None else None
        self.clock = TrainClock(self.state)
        self.health = TrainingHealth(self.state.get("health") if self.state is not None else None)
        self.losses: list[tuple[int, torch.Tensor]] = []  # (step, loss) not yet checked (watch_loss)
        # Streamed images replaced by earlier sessions of the run (counted once, on the main process).
        self.unreadable_before = int(self.state.get("unreadable_images", 0)) if self.state is not None else 0
        self.step_views: StepViews | None = None
        self.reported_images: set[str] = set()  # unreadable streamed files logged this session (by every StepViews)
        self.data: dict[str, Any] | None = None

    def check_data(self, data: ImageData | StreamedSplit) -> None:
        """Fingerprint the training data (:func:`data_fingerprint`, on the main process) for the checkpoints, and
        refuse to resume a run whose checkpoint was trained on other data (its images or labels changed under the
        same ``data.root``): every process stops with a ConfigError. A checkpoint without a fingerprint (an older
        version's) resumes as before."""
        problem = None
        if self.is_main:
            self.data = data_fingerprint(data)
            saved = self.state.get("data") if self.state is not None else None
            if saved is not None and saved != self.data:
                count = (f"{saved['images']} images then, {self.data['images']} now" if saved["images"] !=
                         self.data["images"] else f"the same {saved['images']} images by count")
                problem = (f"{self.checkpoint_path} was trained on other data than {self.cfg.data.dataset} at "
                           f"data.root={self.cfg.data.root} holds now ({count}, their content differs); restore "
                           f"that data to resume, or choose another trainer.out to train on this data")
        if reduced(self.fabric, int(problem is not None)):
            raise ConfigError(problem or f"{self.checkpoint_path} was trained on other data (the main process says "
                              f"what changed)")

    def restore(self, method: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the checkpoint's model and optimiser state (the optimiser's only if ``optim.name`` is unchanged)."""
        if self.state is None:
            return
        method.load_state_dict(self.state["model"])
        if self.state["config"]["optim"]["name"] == self.cfg.optim.name:
            # The saved moments, with this config's hyper-parameters (betas, momentum...; lr and wd are set per step).
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            optimizer.load_state_dict(self.state["optimizer"])
            for group, values in zip(optimizer.param_groups, hyper):
                group.update(values)
        elif self.is_main:
            log.warning("optim.name changed to %s: the optimiser starts with fresh state", self.cfg.optim.name)

    def open(self, cfg: Config, method: nn.Module, optimizer: torch.optim.Optimizer, backbone_params: dict[str, Any],
             channels: int, image_size: int) -> None:
        """What the run saves: ``cfg`` (with the measured normalisation), the (unwrapped) method and its optimiser,
        and what ``backbone.json`` records. The main process writes the directory: config.yaml, and
        config_changes.log for a resume's accepted changes."""
        self.cfg, self.method, self.optimizer = cfg, method, optimizer
        self.health.start(method)
        kind, backbone_params = recorded_backbone(cfg.model.backbone, backbone_params, method.backbone)
        self.backbone_meta = {"backbone": kind, "params": backbone_params, "method": cfg.method["name"],
                              "image_size": image_size, "channels": channels, "mean": cfg.data.mean,
                              "std": cfg.data.std, "dataset": cfg.data.dataset, "seed": cfg.trainer.seed}
        if self.is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.path)
            save_config(cfg, self.path / "config.yaml")
            if self.changes:
                record_config_changes(self.path, self.start_step, self.changes)

    def start_logs(self, total_steps: int, steps_per_epoch: int, knn_monitor: KNNAccuracy | None,
                   stage: str | None) -> TrainingLog:
        """The run's logs, continued from the resumed step (written by the main process)."""
        experiment = ExperimentLoggers(self.cfg.trainer.loggers, self.path, self.start_step, self.is_main)
        experiment.log_hyperparams(to_dict(self.cfg))
        self.logbook = TrainingLog(self.cfg, self.path, self.start_step, total_steps, steps_per_epoch, knn_monitor,
                                   stage, show_progress=self.cfg.trainer.progress and self.is_main,
                                   experiment=experiment)
        return self.logbook

    def clock_step(self, images: int) -> None:
        """A step of ``images`` images ended: stop the training clock and count the step for the images/s."""
        self.logbook.count(self.clock.stop(), images)

    def log_step(self, step: int, lr: float, out: Any, step_views: StepViews) -> None:
        """Record the step output of ``step`` (main process), with the streamed images that were unreadable (a sum
        over the processes) when a row is due; the losses kept so far are checked first (:meth:`check_losses`)."""
        if self.logbook.due(step):
            self.check_losses()
        unreadable = self.unreadable_images() if self.logbook.row_due(step) and step_views.streamed else None
        if self.is_main:
            self.logbook.record(step, lr, out, self.clock, self.method.backbone, self.fabric.device, unreadable)

    def plot(self, samples: torch.Tensor | None, step: int) -> None:
        """The metrics' curves, the eigenspectra and the method's own pictures (of ``samples``), into plots/; then
        every picture of plots/ to the experiment loggers, which are closed (the run is done)."""
        self.logbook.plot(self.path / "plots")
        draw_method_figures(self.cfg.method["name"], self.method, self.path / "plots", self.logbook.metrics.rows,
                            samples)
        self.logbook.experiment.log_images(self.path / "plots", step)
        self.logbook.experiment.finalize()

    def flush_logs(self) -> None:
        if self.is_main:
            self.logbook.flush()

    def unreadable_images(self) -> int:
        """Streamed images replaced so far in the run, earlier sessions included (a sum over the processes)."""
        here = self.step_views.unreadable if self.step_views is not None else 0
        return self.unreadable_before + reduced(self.fabric, here, torch.distributed.ReduceOp.SUM)

    def watch_loss(self, loss: torch.Tensor, step: int) -> None:
        """Keep the loss of ``step`` (the weights after ``step`` steps) for :meth:`check_losses`, on the device:
        reading it at every step would make the host wait for each step to finish on a GPU."""
        self.losses.append((step, loss.detach()))
        if len(self.losses) >= MAX_UNCHECKED_LOSSES:
            self.check_losses()

    def check_losses(self) -> None:
        """Check the kept losses in step order (one read for all of them) and raise :class:`TrainingDiverged` on
        every process when one diverges on any of them, naming the first such step; a checkpoint of that step's
        weights is then discarded. Called before each metrics row, checkpoint and snapshot, so none of them follows
        a loss that was not checked, as when each step's loss was checked at once (the same losses, in the same
        order, reach the health checks and the checkpoints)."""
        if not self.losses:
            return
        steps, values = [s for s, _ in self.losses], torch.stack([loss for _, loss in self.losses]).tolist()
        self.losses = []
        problem, bad = None, NO_STEP
        for step, value in zip(steps, values):
            problem = self.health.loss_problem(value)
            if problem is not None:
                bad = step
                break
        first = reduced(self.fabric, bad, torch.distributed.ReduceOp.MIN)
        if first == NO_STEP:
            return
        if self.saved_step == first:
            self.discard_checkpoint(first)
        raise self.diverged(f"{problem if bad == first else 'the loss diverges on another process'} at step {first}",
                            first)

    def checkpoint(self, step: int) -> None:
        """Write the state after ``step`` steps; when the weights or optimiser state are unfit, stop training with
        :class:`TrainingDiverged` (the last checkpoint that passed stays).

        Every process takes the same decision: the weights and optimiser state are the same on all of them.
        """
        self.check_losses()
        problem = self.health.weights_problem(self.method, self.optimizer)
        if problem is not None:
            raise self.diverged(f"step {step} not checkpointed: {problem}", step)
        unreadable = self.unreadable_images()
        failure: OSError | None = None
        if self.is_main:
            self.link_previous()
            try:
                save_checkpoint(self.checkpoint_path, {"model": self.method.state_dict(),
                                                       "optimizer": self.optimizer.state_dict(), "step": step,
                                                       **self.clock.state(), "config": to_dict(self.cfg),
                                                       "health": self.health.state(), "unreadable_images": unreadable,
                                                       "data": self.data})
            except OSError as err:  # a full disk: the previous checkpoint is kept; every process stops
                failure = err
        if reduced(self.fabric, int(failure is not None)):
            self.flush_logs()
            raise failure or OSError(errno.EIO, "the main process could not write the checkpoint",
                                     str(self.checkpoint_path))
        self.saved_step = step
        self.flush_logs()
        self.fabric.barrier()

    def link_previous(self) -> None:
        """Keep the checkpoint on disk as ``previous.pt`` (a hard link: no copy) before it is replaced."""
        previous = self.checkpoint_path.with_name("previous.pt")
        previous.unlink(missing_ok=True)
        if self.checkpoint_path.is_file():
            try:
                os.link(self.checkpoint_path, previous)
            except OSError:  # a file system without hard links: no fallback, as before
                pass

    def discard_checkpoint(self, step: int) -> None:
        """The checkpoint of ``step`` holds weights that diverge: move it to ``diverged.pt`` and fall back on
        ``previous.pt`` (the checkpoint before, which passed), if any."""
        previous, bad = self.checkpoint_path.with_name("previous.pt"), self.checkpoint_path.with_name("diverged.pt")
        previous_step = int(load_checkpoint(previous)["step"]) if previous.is_file() else None
        if previous_step is not None and previous_step >= step:
            previous_step = None
        self.fabric.barrier()
        if self.is_main:
            os.replace(self.checkpoint_path, bad)
            if previous_step is not None:
                os.replace(previous, self.checkpoint_path)
            log.warning("the checkpoint of step %d diverges at the next step: moved to %s", step, bad)
        self.saved_step = previous_step

    def checkpoint_unless_saved(self, step: int) -> None:
        self.check_losses()
        if self.saved_step != step:
            self.checkpoint(step)

    def export(self, folder: Path, step: int) -> None:
        """The backbone as evaluation reads it: safetensors + backbone.json (with the step and training time)."""
        meta = dict(self.backbone_meta)
        meta["params"] = {**meta["params"], **self.method.export_params}
        export_backbone(folder, self.method.backbone, {**meta, "steps": step, **self.clock.state()})

    def last_checkpoint_text(self, step: int) -> str:
        if self.saved_step is None:
            return "no checkpoint that passed the health checks was written"
        back = step - self.saved_step
        return (f"the checkpoint of step {self.saved_step} ({self.checkpoint_path}), {back} step{'s' * (back != 1)} "
                "before the failure, passed the health checks (finite weights and optimiser state, its loss within "
                "100x the running median)")

    def diverged(self, reason: str, step: int) -> TrainingDiverged:
        """The error to raise when training diverged at ``step``: which checkpoint is left, and how to go on."""
        self.flush_logs()
        fix = (f"resume it with a lower lr: `selfsup pretrain {self.path} optim.lr=... --allow-optim-change` "
               "(or set optim.clip_grad)" if self.saved_step is not None
               else "lower optim.lr or set optim.clip_grad and start again")
        return TrainingDiverged(f"{reason}; {self.last_checkpoint_text(step)}; {fix}")
