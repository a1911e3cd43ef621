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
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from selfsup.checkpoint import CHECKPOINT, export_backbone, load_checkpoint, save_checkpoint
from selfsup.config import Config, ConfigError, OptimConfig, save_config, to_dict
from selfsup.data.augment import Augment, augment_config
from selfsup.data.datasets import ImageData, load_dataset
from selfsup.data.sampler import StepSampler
from selfsup.methods import build_method, method_config
from selfsup.models import BACKBONES, build_backbone
from selfsup.train.monitors import KNNMonitor, SpectrumLog, collapse_stats
from selfsup.train.optim import build_optimizer
from selfsup.train.schedules import constant_schedule, cosine_schedule, stretched

log = logging.getLogger("selfsup")

# Keys that may change when a run is resumed: they do not affect the computation.
RESUMABLE_CHANGES = {"trainer.progress", "trainer.log_every_steps", "trainer.checkpoint_every_steps",
                     "trainer.num_threads", "trainer.out", "monitor.knn_every_steps", "eval"}


# ----------------------------------------------------------------------------------------------
# Building blocks


def normalization(data: ImageData, cfg: Config) -> tuple[list[float], list[float]]:
    """Per-channel mean and std: from the config, or measured on (a subset of) the training images."""
    if cfg.data.mean is not None and cfg.data.std is not None:
        return list(cfg.data.mean), list(cfg.data.std)
    sample = data.images[torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:10000]].float() / 255
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


def build_augmenters(cfg: Config, image_size: int, mean: list[float], std: list[float]) -> list[Augment]:
    """One augmentation module per view (a view spec with ``num: k`` gives k views)."""
    augmenters = []
    for i, view in enumerate(cfg.views):
        try:
            aug_cfg = augment_config(view.preset, view.size or image_size, mean=tuple(mean), std=tuple(std), **view.params)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"views.{i}: {err}") from err
        augmenters.extend([Augment(aug_cfg)] * view.num)
    return augmenters


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


def validate(cfg: Config) -> None:
    """Checks that need no data: run them before any work so bad configs fail fast."""
    method_config(cfg.method)
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
    if not 0 < cfg.data.fraction <= 1:
        raise ConfigError(f"bad value for data.fraction: {cfg.data.fraction}; use a number in (0, 1]")
    if cfg.trainer.batch_size < 2:
        raise ConfigError("trainer.batch_size must be at least 2")


def check_resume_compatible(saved: dict[str, Any], current: dict[str, Any], run_dir: Path) -> None:
    """Refuse to resume a run directory whose config differs in anything that changes the computation."""

    def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(tree, dict):
            out: dict[str, Any] = {}
            for key, value in tree.items():
                out.update(flatten(value, f"{prefix}{key}."))
            return out
        return {prefix[:-1]: tree}

    old, new = flatten(saved), flatten(current)
    diffs = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
             and not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)]
    if diffs:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diffs[:5])
        raise ConfigError(f"{run_dir} holds a run with a different config ({shown}). Resume it with "
                          f"`selfsup pretrain {run_dir}`, or start a new run with trainer.out=<new dir>")


class MetricsLog:
    """``metrics.csv``: one row per logged step; columns grow as new metrics appear."""

    def __init__(self, path: Path, resume_step: int) -> None:
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
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)


def plot_metrics(rows: list[dict[str, Any]], out_dir: Path) -> None:
    """One PNG per logged metric against the step (loss, kNN accuracy, collapse statistics...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(exist_ok=True)
    keys = [k for k in (rows[0].keys() if rows else []) if k not in ("step", "epoch")]
    keys += [k for r in rows for k in r if k not in keys and k not in ("step", "epoch")]
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


def pretrain(cfg: Config) -> Path:
    """Pretrain ``cfg.method`` and export the backbone into ``cfg.trainer.out``; resumes an existing run."""
    from lightning.fabric import Fabric

    validate(cfg)
    t = cfg.trainer
    run_dir = Path(t.out)
    if t.num_threads:
        torch.set_num_threads(t.num_threads)

    accelerator = "cuda" if t.accelerator == "gpu" else t.accelerator
    fabric = Fabric(accelerator=accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
                    precision=t.precision)
    fabric.launch()
    is_main = fabric.global_rank == 0
    if is_main:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    # Resume bookkeeping (config compatibility is checked before touching the data).
    ckpt_path = run_dir / CHECKPOINT
    state = load_checkpoint(ckpt_path) if ckpt_path.is_file() else None
    if state is not None:
        check_resume_compatible(state["config"], to_dict(cfg), run_dir)

    # Data: the pretraining split in memory, uint8.
    data = load_dataset(cfg.data.dataset, cfg.data.train_split, root=cfg.data.root, image_size=cfg.data.image_size,
                        channels=cfg.data.channels, fraction=cfg.data.fraction, seed=cfg.data.fraction_seed,
                        progress=is_main)
    channels, image_size = data.images.shape[1], data.images.shape[2]
    mean, std = normalization(data, cfg)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mean=mean, std=std))
    augmenters = build_augmenters(cfg, image_size, mean, std)

    sampler = StepSampler(len(data), t.batch_size, seed=t.seed, rank=fabric.global_rank, world_size=fabric.world_size)
    total_steps = t.max_steps or max(1, int(round(t.epochs * sampler.steps_per_epoch)))

    # Model, optimiser, schedules.
    params, method = build_model(cfg, channels, image_size, total_steps)
    if fabric.world_size > 1 and t.sync_batchnorm:
        if fabric.device.type == "cuda":
            method = nn.SyncBatchNorm.convert_sync_batchnorm(method)
        elif is_main:  # torch's SyncBatchNorm is CUDA-only
            log.warning("SyncBatchNorm needs CUDA; on %s each process normalises with its own batch statistics",
                        fabric.device.type)
    optimizer = build_optimizer(method, cfg.optim)
    o = cfg.optim
    base_lr = o.lr * (t.batch_size / 256 if o.lr_scaling == "linear" else 1.0)
    warmup = int(round(o.warmup_epochs * sampler.steps_per_epoch))
    lr_schedule, wd_schedule = lr_wd_schedules(o, base_lr, total_steps, warmup)

    start_step = 0
    if state is not None:
        method.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    raw_method = method
    method, optimizer = fabric.setup(method, optimizer)
    device = fabric.device

    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
        n_params = sum(p.numel() for p in raw_method.parameters() if p.requires_grad)
        log.info("%s %s: %d images %dx%dx%d, %d steps of %d (%.1f epochs), %.2fM trainable parameters, %s x%d",
                 "resuming" if start_step else "pretraining", cfg.method["name"], len(data), channels, image_size,
                 image_size, total_steps, t.batch_size, total_steps / sampler.steps_per_epoch, n_params / 1e6,
                 device, fabric.world_size)
    metrics = MetricsLog(run_dir / "metrics.csv", start_step)
    # Training wall-clock (monitors and checkpoints excluded), continued across resumes.
    train_seconds = float(metrics.rows[-1].get("train_time_s") or 0.0) if metrics.rows else 0.0
    spectra = SpectrumLog(run_dir / "spectra.npz", start_step)
    knn_monitor = build_knn_monitor(cfg, data, mean, std, channels) if is_main and cfg.monitor.knn_every_steps else None

    def checkpoint(step: int) -> None:
        if is_main:
            save_checkpoint(ckpt_path, {"model": raw_method.state_dict(), "optimizer": optimizer.state_dict(),
                                        "step": step, "config": to_dict(cfg)})
            metrics.flush()
            spectra.flush()
        fabric.barrier()

    progress = Progress(t.progress and is_main, total_steps, start_step)
    step, window_start, window_images = start_step, time.perf_counter(), 0
    raw_method.train()
    try:
        while step < total_steps:
            torch.manual_seed(t.seed * 1_000_003 + step * fabric.world_size + fabric.global_rank)
            batch = data.images[sampler.indices(step)].to(device, non_blocking=True).float().div_(255)
            views = [augment(batch).contiguous(memory_format=memory_format) for augment in augmenters]
            for group in optimizer.param_groups:
                group["lr"] = float(lr_schedule[step])
                group["weight_decay"] = float(wd_schedule[step]) if group["apply_weight_decay"] else 0.0

            out = method(views)
            if not torch.isfinite(out.loss):
                raise FloatingPointError(f"loss is {out.loss.item()} at step {step}; lower optim.lr or enable "
                                         f"optim.clip_grad. The last checkpoint ({ckpt_path}) is intact.")
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(out.loss)
            if o.clip_grad:
                fabric.clip_gradients(method, optimizer, max_norm=o.clip_grad)
            optimizer.step()
            if hasattr(raw_method, "after_step"):
                raw_method.after_step(step)
            step += 1
            window_images += t.batch_size

            log_now = step % t.log_every_steps == 0 or step == total_steps
            collapse_now = cfg.monitor.collapse_every_steps and step % cfg.monitor.collapse_every_steps == 0
            knn_now = knn_monitor is not None and (step % cfg.monitor.knn_every_steps == 0 or step == total_steps)
            if is_main and (log_now or collapse_now or knn_now):
                elapsed = time.perf_counter() - window_start
                train_seconds += elapsed
                row: dict[str, Any] = {"step": step, "epoch": round(step / sampler.steps_per_epoch, 3),
                                       "lr": float(lr_schedule[step - 1]), "loss": out.loss.item(),
                                       **{k: float(v) for k, v in out.terms.items()},
                                       "images_per_s": round(window_images / max(elapsed, 1e-9), 1),
                                       "train_time_s": round(train_seconds, 2)}
                if collapse_now and out.embeddings is not None:
                    row.update(collapse_stats(out.embeddings))
                    spectra.append(step, out.embeddings)
                if knn_now:
                    row["knn_top1"] = knn_monitor(raw_method.backbone, device)
                metrics.append(row)
                info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
                progress.update(step, info, force_log=log_now or knn_now)
                window_start, window_images = time.perf_counter(), 0
            if step % t.checkpoint_every_steps == 0 or step % sampler.steps_per_epoch == 0:
                checkpoint(step)
                if window_images == 0:  # a row was just logged: keep the checkpoint out of the next window
                    window_start = time.perf_counter()
    except KeyboardInterrupt:
        checkpoint(step)
        progress.close()
        if is_main:
            log.info("interrupted at step %d; checkpoint saved. Re-run `selfsup pretrain %s` to resume.", step, run_dir)
        raise
    progress.close()
    checkpoint(step)

    if is_main:
        export_params = {**params, **getattr(raw_method, "export_params", {})}
        export_backbone(run_dir, raw_method.backbone, {
            "backbone": cfg.model.backbone, "params": export_params, "method": cfg.method["name"], "image_size": image_size,
            "channels": channels, "mean": mean, "std": std, "dataset": cfg.data.dataset, "seed": t.seed,
            "steps": step})
        plot_metrics(metrics.rows, run_dir / "plots")
        spectra.plot(run_dir / "plots" / "eigenspectrum.png")
        log.info("done: %d steps; backbone exported to %s", step, run_dir / "backbone.safetensors")
    return run_dir


def build_knn_monitor(cfg: Config, data: ImageData, mean: list[float], std: list[float], channels: int) -> KNNMonitor | None:
    """A fixed, seeded labelled subset: gallery from the training split, queries from the eval split."""
    if data.labels is None:
        log.warning("monitor.knn_every_steps is set but %s/%s has no labels; the kNN monitor is off",
                    cfg.data.dataset, cfg.data.train_split)
        return None
    test = load_dataset(cfg.data.dataset, cfg.data.eval_split, root=cfg.data.root, image_size=cfg.data.image_size,
                        channels=channels, progress=False)
    g = torch.Generator().manual_seed(1234)
    train_idx = torch.randperm(len(data), generator=g)[:cfg.monitor.knn_train_size]
    test_idx = torch.randperm(len(test), generator=g)[:cfg.monitor.knn_test_size]
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - m.to(x.device)) / s.to(x.device)

    return KNNMonitor(data.images[train_idx], data.labels[train_idx], test.images[test_idx], test.labels[test_idx],
                      normalize, k=cfg.monitor.knn_k, temperature=cfg.monitor.knn_temperature)


__all__ = ["pretrain", "validate", "normalization"]
