"""``selfsup pretrain``: check the config, start Lightning Fabric, and train (one run, or its stages).

Here the engine (:mod:`selfsup.train`) is given what it builds through others: the method from the registry
(:mod:`selfsup.methods.assemble`) and the online kNN monitor (:mod:`selfsup.eval.monitor`).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import torch

from selfsup.config import Config, ConfigError, stage_configs
from selfsup.data.augment import augment_config
from selfsup.data.datasets import DATASETS
from selfsup.eval.monitor import build_knn_monitor
from selfsup.methods import method_config
from selfsup.methods.assemble import assemble_model
from selfsup.models import BACKBONES
from selfsup.train.loggers import check_loggers
from selfsup.train.loop import Plugins, train
from selfsup.train.signals import TrainingInterrupted
from selfsup.train.stages import train_stages

log = logging.getLogger("selfsup")


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


PLUGINS = Plugins(build_model=assemble_model, run_warnings=run_warnings, knn_monitor=build_knn_monitor)


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
    check_loggers(t.loggers)
    if t.max_steps is None and not t.epochs > 0:
        raise ConfigError(f"bad value for trainer.epochs: {t.epochs}; use a positive number (or set trainer.max_steps)")


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
            train_stages(fabric, cfg, PLUGINS, allow_optim_change)
        else:
            train(fabric, cfg, PLUGINS, allow_optim_change)
    except TrainingInterrupted:
        fabric.barrier()  # every process stops at the same step (reduced); none exits while another still saves
        raise
    fabric.barrier()  # every process leaves together: none tears down gloo while another still exports
    return Path(t.out)


__all__ = ["PLUGINS", "pretrain", "run_warnings", "validate"]
