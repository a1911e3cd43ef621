"""The pretraining loop, read top to bottom: data -> views -> method -> loss -> optimiser -> EMA.

Distribution, device placement and precision come from Lightning Fabric (DDP on any number of
processes and nodes, launched by Fabric, torchrun or SLURM). Everything a resumed run needs is a
function of the global step: the batch indices (:class:`StepSampler`), the augmentation RNG
(seeded with ``seed`` and the step before each step), and the precomputed schedules. So a run that
is killed and resumed ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import csv
import dataclasses
import inspect
import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from selfsup.checkpoint import (CHECKPOINT, atomic_write, export_backbone, load_checkpoint, read_backbone_meta,
                                remove_stale_temporaries, save_checkpoint)
from selfsup.config import Config, ConfigError, OptimConfig, TrainerConfig, save_config, stage_configs, to_dict
from selfsup.data.augment import augment_config
from selfsup.data.datasets import DATASETS, DataError, ImageData
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import StreamedSplit, crop_batches, open_split, pixels_and_labels
from selfsup.data.views import CropSpec, ViewGroup, make_views
from selfsup.methods import build_method, method_config
from selfsup.models import BACKBONES, build_backbone
from selfsup.train.monitors import KNNMonitor, SpectrumLog, collapse_stats
from selfsup.train.optim import build_optimizer
from selfsup.train.schedules import constant_schedule, cosine_schedule, stretched

log = logging.getLogger("selfsup")

# A parameter larger than this in magnitude means the weights are exploding (a divergence under way):
# such a state is never checkpointed or exported. Healthy networks stay many orders of magnitude below.
MAX_SANE_WEIGHT = 1e6

# Keys that may change when a run is resumed: they do not affect the computation.
RESUMABLE_CHANGES = {"trainer.progress", "trainer.log_every_steps", "trainer.checkpoint_every_steps",
                     "trainer.export_every_steps", "trainer.num_threads", "trainer.out", "monitor.knn_every_steps", "eval",
                     "data.num_workers"}


# ----------------------------------------------------------------------------------------------
# Building blocks


def normalization(data: ImageData | StreamedSplit, cfg: Config) -> tuple[list[float], list[float]]:
    """Per-channel mean and std: from the config, or measured on a subset of the training images
    (10,000 in memory; 1,000 decoded when streaming)."""
    if cfg.data.mean is not None and cfg.data.std is not None:
        return list(cfg.data.mean), list(cfg.data.std)
    count = 10000 if isinstance(data, ImageData) else 1000
    sample = pixels_and_labels(data, torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:count])[0]
    sample = sample.float() / 255
    mean = sample.mean(dim=(0, 2, 3)).tolist()
    std = sample.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    return [round(m, 4) for m in mean], [round(s, 4) for s in std]


def backbone_params(cfg: Config, channels: int, image_size: int) -> dict[str, Any]:
    """The backbone's constructor arguments: the config's, plus input channels and size where needed."""
    params = dict(cfg.model.params)
    params.setdefault("in_channels", channels)
    if cfg.model.backbone.startswith("vit"):
        params.setdefault("img_size", image_size)
    return params


def build_view_groups(cfg: Config, image_size: int, mean: list[float], std: list[float]) -> list[ViewGroup]:
    """One :class:`ViewGroup` per view spec (a spec with ``num: k`` gives k views)."""
    groups = []
    for i, view in enumerate(cfg.views):
        try:
            aug_cfg = augment_config(view.preset, view.size or image_size, mean=tuple(mean), std=tuple(std), **view.params)
            groups.append(ViewGroup(aug_cfg, view.num, view.shared_crop))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"views.{i}: {err}") from err
    return groups


def views_maker(method: nn.Module, groups: list[ViewGroup]) -> Callable[[torch.Tensor, int], list[torch.Tensor]]:
    """``(images in [0, 1], step) -> views``: the config's view groups, or the method's own ``make_views``
    (MAST draws its pairs itself: its loss needs to know which augmentations each pair got)."""
    if hasattr(method, "make_views"):
        method.attach_views(groups)
        return method.make_views
    return lambda images, step: make_views(images, groups)


def crop_specs(data: StreamedSplit, groups: list[ViewGroup], method: nn.Module | None) -> list[CropSpec]:
    """What the streaming loader crops: every view group's crops, or, for a method that draws its own views
    (MAST), each image's centre square at ``data.image_size``."""
    if hasattr(method, "make_views"):
        return [CropSpec(data.image_size, (1.0, 1.0), (1.0, 1.0), 0.0, 1)]
    return [g.crop_spec for g in groups]


class StepViews:
    """The views of every step of ``[start, stop)``, in order, seeded by the step (so a resumed run gets the same).

    In memory: the step's images are indexed out of the uint8 tensor and every op runs on the device.
    Streaming: loader workers decode the images and take the crops at full resolution; the photometric ops
    run on the device. A method that draws its own views (MAST) gets, when streaming, each image's centre
    square at ``data.image_size`` from the loader and crops it on the device. ``unreadable`` counts the
    streamed images replaced because their file was unreadable.
    """

    def __init__(self, data: ImageData | StreamedSplit, sampler: StepSampler, groups: list[ViewGroup], seed: int,
                 start: int, stop: int, device: torch.device, memory_format: torch.memory_format,
                 method: nn.Module | None = None) -> None:
        self.data, self.sampler, self.groups, self.seed = data, sampler, groups, seed
        self.device, self.memory_format = device, memory_format
        self.streamed = isinstance(data, StreamedSplit)
        self.own_views = hasattr(method, "make_views")
        self.make = views_maker(method, groups)
        self.unreadable = 0
        if self.streamed:
            self.batches = iter(crop_batches(data.source, sampler, crop_specs(data, groups, method), data.channels,
                                             seed, start, stop, data.workers, pin_memory=device.type == "cuda"))

    def _on_device(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device, non_blocking=True).float().div_(255)

    def __call__(self, step: int, rank: int, world_size: int) -> list[torch.Tensor]:
        if self.streamed:
            batch = next(self.batches)
            for name in batch.unreadable:
                log.warning("unreadable image replaced by another: %s", name)
            self.unreadable += len(batch.unreadable)
            crops = iter([self._on_device(c) for c in batch.crops])
            torch.manual_seed(self.seed * 1_000_003 + step * world_size + rank)
            if self.own_views:
                views = self.make(next(crops), step)
            else:
                views = [v for g in self.groups for v in g.from_crops([next(crops) for _ in range(g.crop_spec.count)])]
        else:
            images = self._on_device(self.data.images[self.sampler.indices(step)])
            torch.manual_seed(self.seed * 1_000_003 + step * world_size + rank)
            views = self.make(images, step)
        return [view.contiguous(memory_format=self.memory_format) for view in views]


def build_model(cfg: Config, channels: int, image_size: int, total_steps: int) -> tuple[dict[str, Any], nn.Module]:
    """The backbone's constructor arguments and the method wrapped around it (seeded, in the configured memory format)."""
    torch.manual_seed(cfg.trainer.seed)
    params = backbone_params(cfg, channels, image_size)
    try:
        backbone = build_backbone(cfg.model.backbone, **params)
        method = build_method(cfg.method, backbone, total_steps)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"cannot build {cfg.method['name']} on {cfg.model.backbone} {params}: {err}") from err
    if cfg.trainer.channels_last:
        method = method.to(memory_format=torch.channels_last)
    return params, method


def online_encoder(method: nn.Module) -> nn.Module:
    """The encoder that the optimiser trains: ``method.encoder`` where the exported backbone is another copy (an
    EMA), else ``method.backbone``."""
    return getattr(method, "encoder", None) or method.backbone


def freeze(encoder: nn.Module, spec: int | str | None) -> None:
    """``model.freeze``: the stem and the first k ViT blocks, or ``"all"`` of the encoder (no gradients, no optimiser
    state, frozen blocks and stem in eval mode)."""
    if spec is None:
        return
    if not hasattr(encoder, "freeze_blocks"):
        raise ConfigError(f"model.freeze={spec!r} needs a ViT backbone (it freezes the stem and transformer blocks); "
                          "use model.freeze=null with a ResNet")
    depth = encoder.depth
    if spec == "all":
        encoder.freeze_blocks(depth)
        encoder.requires_grad_(False)
    elif not 0 <= spec <= depth:
        raise ConfigError(f"bad value for model.freeze: {spec}; use a number of blocks in 0..{depth}, all, or null")
    else:
        encoder.freeze_blocks(spec)


def carry_over(method: nn.Module, state: dict[str, torch.Tensor], log_to: logging.Logger | None = None) -> None:
    """Start ``method`` from another method's weights (the previous stage, or ``init_from``): every tensor whose name
    and shape match is copied; the rest (a new head, a new EMA copy) keeps its initialisation. Then the method's
    ``after_carry_over`` hook runs (EMA copies restart from the carried weights)."""
    own = method.state_dict()
    matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not any(k.startswith(("encoder.", "backbone.")) for k in matched):
        raise ConfigError("the previous stage's weights hold no encoder that this stage's method can take (no "
                          "parameter name and shape in common); chain methods that keep the encoder as "
                          "`encoder` (mae, nnclr) on the same model")
    method.load_state_dict(matched, strict=False)
    if hasattr(method, "after_carry_over"):
        method.after_carry_over()
    if log_to is not None:
        parts = lambda keys: ", ".join(sorted({k.split(".")[0] for k in keys}))  # noqa: E731
        fresh = [k for k in own if k not in matched]
        log_to.info("carried over %d tensors (%s); initialised afresh: %s", len(matched), parts(matched),
                    parts(fresh) or "nothing")


def sample_images(cfg: Config, data: ImageData | StreamedSplit, channels: int, image_size: int, mean: list[float],
                  std: list[float], count: int = 8) -> torch.Tensor:
    """The first ``count`` images of the evaluation split (the training split when there is none), normalised:
    what the methods' pictures show (MAE's reconstructions)."""
    try:
        split = open_split(cfg.data, cfg.data.eval_split, image_size=image_size, channels=channels, progress=False)
    except (DataError, OSError, ValueError):  # no evaluation split (e.g. an image folder without test/)
        split = data
    images = pixels_and_labels(split, torch.arange(min(count, len(split))))[0].float() / 255
    return (images - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


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


def run_steps(t: TrainerConfig, steps_per_epoch: int) -> int:
    """The run's length in steps: ``max_steps``, or ``epochs`` epochs (at least one step)."""
    return t.max_steps if t.max_steps is not None else max(1, int(round(t.epochs * steps_per_epoch)))


def warmup_steps(o: OptimConfig, total_steps: int, steps_per_epoch: int) -> int:
    """Warm-up length in steps: ``warmup_fraction`` of the run, or ``warmup_epochs`` epochs."""
    if o.warmup_fraction is not None:
        return int(round(o.warmup_fraction * total_steps))
    return int(round(o.warmup_epochs * steps_per_epoch))


def run_warnings(cfg: Config, total_steps: int, warmup: int) -> list[str]:
    """Settings that run but are probably sized for another run (e.g. copied from an ImageNet config)."""
    warnings = []
    if total_steps and warmup > total_steps / 4:
        warnings.append(f"the lr warm-up takes {warmup} of the run's {total_steps} steps ({warmup / total_steps:.0%}): "
                        f"the cosine barely decays; use optim.warmup_fraction=0.05 (a few % of the run)")
    _, method_cfg = method_config(cfg.method)
    if hasattr(method_cfg, "warnings"):
        warnings.extend(method_cfg.warnings(cfg.trainer.batch_size))
    return warnings


def validate(cfg: Config) -> None:
    """Checks that need no data: run them before any work so bad configs fail fast (every stage's, for stages)."""
    for stage in stage_configs(cfg):
        validate(stage.cfg)
    _, method_cfg = method_config(cfg.method)
    if hasattr(method_cfg, "check_batch"):
        method_cfg.check_batch(cfg.trainer.batch_size)
    if cfg.model.backbone not in BACKBONES:
        raise ConfigError(f"bad value for model.backbone: {cfg.model.backbone!r}; allowed values: {', '.join(BACKBONES)}")
    try:
        inspect.signature(BACKBONES[cfg.model.backbone]).bind_partial(**cfg.model.params)
    except TypeError as err:
        raise ConfigError(f"model.params: {err}; see the signature of selfsup.models.{cfg.model.backbone}") from err
    if not cfg.views or any(v.num < 1 for v in cfg.views):
        raise ConfigError("views must list at least one view spec, each with num >= 1")
    for i, view in enumerate(cfg.views):
        try:
            augment_config(view.preset, view.size or 32, **view.params)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"views.{i}: {err}") from err
    if cfg.optim.schedule_stretch < 1:
        raise ConfigError(f"bad value for optim.schedule_stretch: {cfg.optim.schedule_stretch}; use a number >= 1 "
                          "(1 = schedules end with training; MSN's code uses 1.25)")
    if cfg.data.dataset not in DATASETS:
        raise ConfigError(f"bad value for data.dataset: {cfg.data.dataset!r}; allowed values: {', '.join(DATASETS)}")
    if cfg.data.channels not in (None, 1, 3):
        raise ConfigError(f"bad value for data.channels: {cfg.data.channels}; use 1, 3 or null (the stored channels)")
    t, m = cfg.trainer, cfg.monitor
    for key, value, least, hint in (
            ("data.image_size", cfg.data.image_size, 1, "a side length in pixels, or null (the stored size)"),
            ("data.num_workers", cfg.data.num_workers, 0, "a number of loader processes (0: decode in the training "
             "process), or null (one per core, at most 8)"),
            ("trainer.batch_size", t.batch_size, 2, "the global batch, at least 2"),
            ("trainer.devices", t.devices, 1, "the number of processes per node, at least 1"),
            ("trainer.num_nodes", t.num_nodes, 1, "at least 1"),
            ("trainer.max_steps", t.max_steps, 0, "a number of steps >= 0 (0 exports the initial backbone), or null"),
            ("trainer.num_threads", t.num_threads, 1, "at least 1, or null (torch's default)"),
            ("trainer.log_every_steps", t.log_every_steps, 1, "at least 1"),
            ("trainer.checkpoint_every_steps", t.checkpoint_every_steps, 1, "at least 1"),
            ("trainer.export_every_steps", t.export_every_steps, 0, "a number of steps, 0 = off"),
            ("monitor.knn_every_steps", m.knn_every_steps, 0, "a number of steps, 0 = off"),
            ("monitor.collapse_every_steps", m.collapse_every_steps, 0, "a number of steps, 0 = off")):
        if value is not None and value < least:
            raise ConfigError(f"bad value for {key}: {value}; use {hint}")
    if not 0 < cfg.data.fraction <= 1:
        raise ConfigError(f"bad value for data.fraction: {cfg.data.fraction}; use a number in (0, 1]")
    if cfg.optim.warmup_fraction is not None:
        if not 0 <= cfg.optim.warmup_fraction < 1:
            raise ConfigError(f"bad value for optim.warmup_fraction: {cfg.optim.warmup_fraction}; use a fraction "
                              "of the run in [0, 1), e.g. 0.05")
        if cfg.optim.warmup_epochs:
            raise ConfigError("optim.warmup_fraction and optim.warmup_epochs are both set; keep one of them "
                              "(warmup_epochs=0 to use the fraction)")
    if t.batch_size % (t.devices * t.num_nodes):
        raise ConfigError(f"bad value for trainer.batch_size: {t.batch_size}; the global batch must be divisible by "
                          f"the {t.devices * t.num_nodes} processes (trainer.devices x trainer.num_nodes)")
    if t.max_steps is None and not t.epochs > 0:
        raise ConfigError(f"bad value for trainer.epochs: {t.epochs}; use a positive number (or set trainer.max_steps)")


def check_resume_compatible(saved: dict[str, Any], current: dict[str, Any], run_dir: Path,
                            allowed: tuple[str, ...] = ()) -> list[str]:
    """Refuse to resume a run directory whose config differs in anything that changes the computation.

    Differences under the ``allowed`` sections (e.g. ``("optim",)``) are accepted and returned as
    ``"key: old -> new"`` lines. Normalisation left to be measured (``data.mean``/``std`` null) is
    not a change: it is measured again on the same data.
    """

    def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(tree, dict):
            out: dict[str, Any] = {}
            for key, value in tree.items():
                out.update(flatten(value, f"{prefix}{key}."))
            return out
        return {prefix[:-1]: tree}

    def under(key: str, sections) -> bool:
        return any(key == r or key.startswith(r + ".") for r in sections)

    old, new = flatten(saved), flatten(current)
    diffs = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k) and not under(k, RESUMABLE_CHANGES)
             and not (k.startswith(("data.mean", "data.std")) and new.get(k) is None)]
    refused = [k for k in diffs if not under(k, allowed)]
    if refused:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in refused[:5])
        hint = (" To resume with other optim.* settings, add --allow-optim-change."
                if all(under(k, ("optim",)) for k in refused) else "")
        raise ConfigError(f"{run_dir} holds a run with a different config ({shown}). Resume it with "
                          f"`selfsup pretrain {run_dir}`, or start a new run with trainer.out=<new dir>.{hint}")
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diffs]


def record_config_changes(run_dir: Path, step: int, changes: list[str]) -> None:
    """Log the accepted config changes of a resume and append them to ``config_changes.log``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with (run_dir / "config_changes.log").open("a") as f:
        for change in changes:
            log.warning("resuming at step %d with a changed config: %s", step, change)
            f.write(f"{stamp} step {step}: {change}\n")


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
    """A rich progress bar on a terminal; plain log lines otherwise (CI, files)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self.bar = RichProgress(TextColumn("pretrain"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                    TextColumn("{task.fields[info]}"), transient=False)
            self.bar.start()
            self.task = self.bar.add_task("pretrain", total=total, completed=start, info="")

    def update(self, step: int, info: str, force_log: bool) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif force_log:
            log.info(info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ----------------------------------------------------------------------------------------------
# The loop


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


def pretrain(cfg: Config, allow_optim_change: bool = False) -> Path:
    """Pretrain ``cfg.method`` and export the backbone into ``cfg.trainer.out``; resumes an existing run.

    A config with ``stages`` runs them one after the other (:func:`train_stages`). ``allow_optim_change``:
    resume even though ``optim.*`` settings differ from the run's (e.g. a lower lr after a divergence); each
    change is logged and appended to ``config_changes.log``.
    """
    from lightning.fabric import Fabric

    validate(cfg)
    t = cfg.trainer
    if t.num_threads:
        torch.set_num_threads(t.num_threads)
    accelerator = "cuda" if t.accelerator == "gpu" else t.accelerator
    fabric = Fabric(accelerator=accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
                    precision=t.precision)
    fabric.launch()
    if fabric.global_rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        if cfg.stages:
            train_stages(fabric, cfg, allow_optim_change)
        else:
            train(fabric, cfg, allow_optim_change)
    except TrainingInterrupted:
        fabric.barrier()  # every process stops at the same step (reduced); none exits while another still saves
        raise
    fabric.barrier()  # every process leaves together: none tears down gloo while another still exports
    return Path(t.out)


def train(fabric: Any, cfg: Config, allow_optim_change: bool = False, carried: Path | None = None,
          stage: str | None = None) -> None:
    """One stage: train ``cfg.method`` for ``cfg.trainer``'s steps into ``cfg.trainer.out`` (resuming its checkpoint),
    then export the backbone. ``carried``: a checkpoint whose method weights a fresh stage starts from (the previous
    stage's), matched by name; read only when the stage has no checkpoint of its own."""
    t = cfg.trainer
    run_dir = Path(t.out)
    is_main = fabric.global_rank == 0

    # Resume bookkeeping (config compatibility is checked before touching the data).
    ckpt_path = run_dir / CHECKPOINT
    state = load_checkpoint(ckpt_path) if ckpt_path.is_file() else None
    changes: list[str] = []
    if state is not None:
        changes = check_resume_compatible(state["config"], to_dict(cfg), run_dir,
                                          allowed=("optim",) if allow_optim_change else ())

    # Data: the pretraining split decoded into memory (uint8), or listed and streamed from its files.
    data = open_split(cfg.data, cfg.data.train_split, channels=cfg.data.channels, fraction=cfg.data.fraction,
                      progress=is_main)
    channels, image_size = ((data.images.shape[1], data.images.shape[2]) if isinstance(data, ImageData)
                            else (data.channels, data.image_size))
    mean, std = normalization(data, cfg)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mean=mean, std=std))
    view_groups = build_view_groups(cfg, image_size, mean, std)

    sampler = StepSampler(len(data), t.batch_size, seed=t.seed, rank=fabric.global_rank, world_size=fabric.world_size)
    total_steps = run_steps(t, sampler.steps_per_epoch)
    schedule_steps = max(total_steps, 1)  # max_steps = 0 trains nothing and exports the initial backbone

    # Model, optimiser, schedules.
    params, method = build_model(cfg, channels, image_size, schedule_steps)
    if state is None and carried is not None:
        carry_over(method, load_checkpoint(carried)["model"], log_to=log if is_main else None)
    freeze(online_encoder(method), cfg.model.freeze)
    if fabric.world_size > 1 and t.sync_batchnorm:
        if fabric.device.type == "cuda":
            method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
        elif is_main:  # torch's SyncBatchNorm is CUDA-only
            log.warning("SyncBatchNorm needs CUDA; on %s each process normalises with its own batch statistics",
                        fabric.device.type)
    optimizer = build_optimizer(method, cfg.optim, online_encoder(method))
    o = cfg.optim
    base_lr = o.lr * (t.batch_size / 256 if o.lr_scaling == "linear" else 1.0)
    warmup = warmup_steps(o, total_steps, sampler.steps_per_epoch)
    lr_schedule, wd_schedule = lr_wd_schedules(o, base_lr, schedule_steps, warmup)

    start_step, clock = 0, TrainClock(state)
    if state is not None:
        method.load_state_dict(state["model"])
        if state["config"]["optim"]["name"] == o.name:
            # The saved moments, with this config's hyper-parameters (betas, momentum...; lr and wd are set per step).
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            optimizer.load_state_dict(state["optimizer"])
            for group, values in zip(optimizer.param_groups, hyper):
                group.update(values)
        elif is_main:
            log.warning("optim.name changed to %s: the optimiser starts with fresh state", o.name)
        start_step = int(state["step"])
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    raw_method = method
    method, optimizer = fabric.setup(method, optimizer)
    device = fabric.device

    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(run_dir)
        save_config(cfg, run_dir / "config.yaml")
        if changes:
            record_config_changes(run_dir, start_step, changes)
        for warning in run_warnings(cfg, total_steps, warmup):
            log.warning(warning)
        n_params = sum(p.numel() for p in raw_method.parameters() if p.requires_grad)
        log.info("%s %s: %d images %dx%dx%d, %d steps of %d (%.1f epochs), %.2fM trainable parameters, %s x%d",
                 "resuming" if start_step else "pretraining", cfg.method["name"], len(data), channels, image_size,
                 image_size, total_steps, t.batch_size, total_steps / sampler.steps_per_epoch, n_params / 1e6,
                 device, fabric.world_size)
    metrics = MetricsLog(run_dir / "metrics.csv", start_step)
    spectra = SpectrumLog(run_dir / "spectra.npz", start_step)
    knn_monitor = build_knn_monitor(cfg, data, mean, std, channels, image_size) if is_main and cfg.monitor.knn_every_steps else None
    saved_step = start_step if state is not None else None  # the step the checkpoint on disk holds

    def flush_logs() -> None:
        if is_main:
            metrics.flush()
            spectra.flush()

    def checkpoint(step: int) -> None:
        """Write the state after ``step`` steps, unless the weights are unfit (then the last good one stays).

        Every process takes the same decision: the weights and optimiser state are the same on all of them.
        """
        nonlocal saved_step
        problem = unhealthy(raw_method, optimizer)
        if problem is None:
            if is_main:
                save_checkpoint(ckpt_path, {"model": raw_method.state_dict(), "optimizer": optimizer.state_dict(),
                                            "step": step, **clock.state(), "config": to_dict(cfg)})
            saved_step = step
        elif is_main:
            log.warning("step %d not checkpointed: %s; %s", step, problem, last_checkpoint_text())
        flush_logs()
        fabric.barrier()

    def export(folder: Path, step: int) -> None:
        """The backbone as evaluation reads it: safetensors + backbone.json (with the step and training time)."""
        export_params = {**params, **getattr(raw_method, "export_params", {})}
        export_backbone(folder, raw_method.backbone, {
            "backbone": cfg.model.backbone, "params": export_params, "method": cfg.method["name"], "image_size": image_size,
            "channels": channels, "mean": mean, "std": std, "dataset": cfg.data.dataset, "seed": t.seed,
            "steps": step, **clock.state()})

    def last_checkpoint_text() -> str:
        if saved_step is None:
            return "no checkpoint was written yet"
        return f"the checkpoint of step {saved_step} ({ckpt_path}) was written with a finite loss and sane weights"

    def diverged(reason: str) -> TrainingDiverged:
        flush_logs()
        fix = (f"resume it with a lower lr: `selfsup pretrain {run_dir} optim.lr=... --allow-optim-change` "
               "(or set optim.clip_grad)" if saved_step is not None else "lower optim.lr or set optim.clip_grad and start again")
        return TrainingDiverged(f"{reason}; {last_checkpoint_text()}; {fix}")

    def reduced(value: int, op: Any = torch.distributed.ReduceOp.MAX) -> int:
        """``value`` reduced over the processes: the largest by default, so that all of them stop (or raise) at
        the same step; ``ReduceOp.SUM`` for counts."""
        if fabric.world_size == 1:
            return value
        flag = torch.tensor([value], device=device)
        torch.distributed.all_reduce(flag, op=op)
        return int(flag.item())

    step_views = StepViews(data, sampler, view_groups, t.seed, start_step, total_steps, device, memory_format,
                           raw_method)
    progress = Progress(t.progress and is_main, total_steps, start_step)
    step, window_seconds, window_images = start_step, 0.0, 0
    raw_method.train()
    with StopSignals() as stop:
        try:
            while step < total_steps:
                clock.start()
                try:
                    views = step_views(step, fabric.global_rank, fabric.world_size)
                except DataError:  # e.g. a folder whose files all became unreadable: keep the steps done so far
                    if fabric.world_size == 1 and saved_step != step:
                        checkpoint(step)
                    raise
                for group in optimizer.param_groups:
                    group["lr"] = float(lr_schedule[step]) * group["lr_scale"]
                    group["weight_decay"] = float(wd_schedule[step]) * group["wd_scale"]

                out = method(views)
                finite = bool(torch.isfinite(out.loss))
                if reduced(int(not finite)):
                    raise diverged(f"loss is {out.loss.item()} at step {step}" if not finite
                                   else f"loss is not finite at step {step} on another process")
                optimizer.zero_grad(set_to_none=True)
                fabric.backward(out.loss)
                if o.clip_grad:
                    fabric.clip_gradients(method, optimizer, max_norm=o.clip_grad)
                optimizer.step()
                if hasattr(raw_method, "after_step"):
                    raw_method.after_step(step)
                step += 1
                window_seconds += clock.stop()
                window_images += t.batch_size

                log_now = step % t.log_every_steps == 0 or step == total_steps
                collapse_now = cfg.monitor.collapse_every_steps and step % cfg.monitor.collapse_every_steps == 0
                knn_now = knn_monitor is not None and (step % cfg.monitor.knn_every_steps == 0 or step == total_steps)
                unreadable = (reduced(step_views.unreadable, torch.distributed.ReduceOp.SUM)
                              if log_now and step_views.streamed else None)
                if is_main and (log_now or collapse_now or knn_now):
                    row: dict[str, Any] = {**({"stage": stage} if stage else {}), "step": step, "epoch": round(step / sampler.steps_per_epoch, 3),
                                           "lr": float(lr_schedule[step - 1]), "loss": out.loss.item(),
                                           **{k: float(v) for k, v in out.terms.items()},
                                           "images_per_s": round(window_images / max(window_seconds, 1e-9), 1),
                                           **clock.state()}
                    if unreadable is not None:
                        row["unreadable_images"] = unreadable
                    if collapse_now and out.embeddings is not None:
                        row.update(collapse_stats(out.embeddings))
                        spectra.append(step, out.embeddings)
                    if knn_now:
                        row["knn_top1"] = knn_monitor(raw_method.backbone, device)
                    metrics.append(row)
                    info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
                    progress.update(step, info, force_log=log_now or knn_now)
                    window_seconds, window_images = 0.0, 0
                if step % t.checkpoint_every_steps == 0 or step % sampler.steps_per_epoch == 0:
                    checkpoint(step)
                if is_main and t.export_every_steps and step % t.export_every_steps == 0 and step < total_steps:
                    export(run_dir / "snapshots" / f"step_{step:06d}", step)
                signum = reduced(stop.signum)
                if signum:
                    if saved_step != step:
                        checkpoint(step)
                    raise TrainingInterrupted(signum, step, run_dir)
        finally:
            progress.close()
    if saved_step != step:
        checkpoint(step)
    if saved_step != step:
        raise diverged(f"training ended at step {step} with weights unfit to export")

    if is_main:
        export(run_dir, step)
        plot_metrics(metrics.rows, run_dir / "plots")
        spectra.plot(run_dir / "plots" / "eigenspectrum.png")
        if hasattr(raw_method, "plot"):
            raw_method.plot(run_dir / "plots", metrics.rows, sample_images(cfg, data, channels, image_size, mean, std))
        log.info("done: %d steps; backbone exported to %s", step, run_dir / "backbone.safetensors")


def train_stages(fabric: Any, cfg: Config, allow_optim_change: bool = False) -> None:
    """Run ``cfg.stages`` in order into ``RUN_DIR/stages/<i>_<name>/``, each a full run (checkpoint, metrics, plots,
    exported backbone) that starts from the previous stage's weights; then export the last stage's backbone into
    ``RUN_DIR`` and write all stages' rows, with their ``stage``, into ``RUN_DIR/metrics.csv``.

    A stage whose backbone is exported is done and skipped, so a killed run resumes inside the stage it was in.
    The run's config must be unchanged; with ``allow_optim_change`` the stage list may change too, and the stage
    in progress accepts changes of its ``optim`` only (its own checkpoint's check, in :func:`train`).
    """
    run_dir, is_main = Path(cfg.trainer.out), fabric.global_rank == 0
    saved = run_dir / "config.yaml"
    if saved.is_file() and (run_dir / "stages").is_dir():
        import yaml

        check_resume_compatible(yaml.safe_load(saved.read_text()), to_dict(cfg), run_dir,
                                allowed=("optim", "stages") if allow_optim_change else ())
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, saved)
    carried, rows, done = None, [], []
    for number, stage in enumerate(stage_configs(cfg), start=1):
        stage_dir = Path(stage.cfg.trainer.out)
        if stage.init_from is not None:
            carried = run_checkpoint(Path(stage.init_from))
        if (stage_dir / "backbone.json").is_file():
            if is_main:
                log.info("stage %d (%s) is done: %s", number, stage.name, stage_dir)
        else:
            if is_main:
                log.info("stage %d of %d: %s (%s)", number, len(cfg.stages), stage.name, stage.cfg.method["name"])
            train(fabric, stage.cfg, allow_optim_change, carried=carried, stage=stage.name)
            fabric.barrier()
        carried = stage_dir / CHECKPOINT
        rows += MetricsLog(stage_dir / "metrics.csv", resume_step=math.inf).rows  # every row of the stage
        meta = read_backbone_meta(stage_dir)
        done.append({"stage": stage.name, **{k: meta[k] for k in ("method", "steps", "train_time_s", "cpu_time_s")}})
    if is_main:
        metrics = MetricsLog(run_dir / "metrics.csv", 0)
        metrics.rows = rows
        metrics.flush()
        meta.update(stages=done, train_time_s=round(sum(d["train_time_s"] for d in done), 2),
                    cpu_time_s=round(sum(d["cpu_time_s"] for d in done), 2))
        atomic_write(run_dir / "backbone.safetensors", lambda tmp: shutil.copyfile(stage_dir / "backbone.safetensors", tmp))
        atomic_write(run_dir / "backbone.json", lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2)))
        log.info("done: %d stages; the last one's backbone exported to %s", len(done), run_dir / "backbone.safetensors")


def run_checkpoint(run_dir: Path) -> Path:
    """``init_from``: the checkpoint of a finished run (a staged run's last stage's)."""
    candidates = [run_dir / CHECKPOINT, *sorted((run_dir / "stages").glob(f"*/{CHECKPOINT}"),
                                              key=lambda p: int(p.parent.name.split("_")[0]))[-1:]]
    for path in candidates:
        if path.is_file():
            return path
    raise ConfigError(f"init_from: {run_dir} holds no {CHECKPOINT} (nor stages/*/{CHECKPOINT}); point it at the run "
                      "directory of a finished `selfsup pretrain`")


def build_knn_monitor(cfg: Config, data: ImageData | StreamedSplit, mean: list[float], std: list[float],
                      channels: int, image_size: int) -> KNNMonitor | None:
    """A fixed, seeded labelled subset: gallery from the training split, queries from the eval split."""
    if data.labels is None:
        log.warning("monitor.knn_every_steps is set but %s/%s has no labels; the kNN monitor is off",
                    cfg.data.dataset, cfg.data.train_split)
        return None
    test = open_split(cfg.data, cfg.data.eval_split, image_size=image_size, channels=channels, progress=False)
    g = torch.Generator().manual_seed(1234)
    train_idx = torch.randperm(len(data), generator=g)[:cfg.monitor.knn_train_size]
    test_idx = torch.randperm(len(test), generator=g)[:cfg.monitor.knn_test_size]
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - m.to(x.device)) / s.to(x.device)

    return KNNMonitor(*pixels_and_labels(data, train_idx), *pixels_and_labels(test, test_idx),
                      normalize, k=cfg.monitor.knn_k, temperature=cfg.monitor.knn_temperature)


__all__ = ["TrainingDiverged", "TrainingInterrupted", "normalization", "pretrain", "validate"]
