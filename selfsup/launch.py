"""``selfsup pretrain``: check the config, start Lightning Fabric, and train (one run, or its stages).

Here the engine (:mod:`selfsup.train`) is given what it builds through others: the method from the registry
(:mod:`selfsup.methods.assemble`) and the online kNN monitor (:mod:`selfsup.eval.monitor`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from selfsup.config import Config, ConfigError, stage_configs
from selfsup.data.augment import augment_config
from selfsup.data.datasets import DATASETS
from selfsup.data.stream import split_size
from selfsup.eval.monitor import build_knn_monitor
from selfsup.methods import MethodConfig, method_of
from selfsup.methods.assemble import assemble_model
from selfsup.models import check_backbone_params
from selfsup.train.loggers import check_loggers
from selfsup.train.loop import Plugins, train
from selfsup.train.run_dir import run_lock
from selfsup.train.signals import TrainingInterrupted
from selfsup.train.speed import fp32_precision
from selfsup.train.stages import train_stages

log = logging.getLogger("selfsup")


def run_warnings(cfg: Config, total_steps: int, warmup: int) -> list[str]:
    """Settings that run but are probably sized for another run (e.g. copied from an ImageNet config)."""
    warnings = []
    if total_steps and warmup > total_steps / 4:
        warnings.append(f"the lr warm-up takes {warmup} of the run's {total_steps} steps ({warmup / total_steps:.0%}): "
                        f"the cosine barely decays; use optim.warmup_fraction=0.05 (a few % of the run)")
    warnings.extend(method_of(cfg)[1].warnings(cfg.trainer.batch_size))
    return warnings


PLUGINS = Plugins(build_model=assemble_model, run_warnings=run_warnings, knn_monitor=build_knn_monitor)


def validate(cfg: Config) -> None:
    """Checks that need no data: run them before any work so bad configs fail fast (every stage's, for stages)."""
    for stage in stage_configs(cfg):
        validate(stage.cfg)
    method_of(cfg)[1].check_batch(cfg.trainer.batch_size)
    check_backbone_params(cfg.model.backbone, cfg.model.params)
    if not cfg.views:
        raise ConfigError("views must list at least one view spec, each with num >= 1")
    for i, view in enumerate(cfg.views):
        try:
            augment_config(view.preset, view.size or 32, **view.params)
        except (TypeError, ValueError) as err:  # ValueError includes ConfigError; TypeError: a key that is no name
            raise ConfigError(f"views.{i}.params: {err}") from None
    if cfg.data.dataset not in DATASETS:
        raise ConfigError(f"bad value for data.dataset: {cfg.data.dataset!r}; allowed values: {', '.join(DATASETS)}")
    check_loggers(cfg.trainer.loggers)


def check_data_size(cfg: Config) -> None:
    """Method settings that depend on the number of training images (NNCLR's queue must stay below it), checked
    before training; the data is counted (file names only) just for methods that have such a check (that override
    :meth:`MethodConfig.check_dataset`)."""
    for c in [stage.cfg for stage in stage_configs(cfg)] or [cfg]:
        method_cfg = method_of(c)[1]
        if type(method_cfg).check_dataset is not MethodConfig.check_dataset:
            method_cfg.check_dataset(split_size(c.data, c.data.train_split, c.data.fraction), c.trainer.batch_size)


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` (``trainer.num_threads``; None leaves it) for the block, and put
    back after it: a Python caller's process keeps its own setting."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pretrain(cfg: Config, allow_optim_change: bool = False) -> Path:
    """Pretrain ``cfg.method`` and export the backbone into ``cfg.trainer.out``; resumes an existing run.

    A config with ``stages`` runs them one after the other (:func:`train_stages`). ``allow_optim_change``:
    resume even though ``optim.*`` settings differ from the run's (e.g. a lower lr after a divergence); each
    change is logged and appended to ``config_changes.log``.
    """
    validate(cfg)
    if cfg.trainer.budget is not None and cfg.trainer.max_steps is not None and not cfg.stages:
        raise ConfigError(f"trainer.budget={cfg.trainer.budget} and trainer.max_steps={cfg.trainer.max_steps} both set "
                          f"the run's length; keep one of them (trainer.max_steps=null to train to the budget)")
    check_data_size(cfg)
    with torch_threads(cfg.trainer.num_threads):
        return _pretrain(cfg, allow_optim_change)


def _pretrain(cfg: Config, allow_optim_change: bool) -> Path:
    from lightning.fabric import Fabric

    t = cfg.trainer
    accelerator = "cuda" if t.accelerator == "gpu" else t.accelerator
    fabric = Fabric(accelerator=accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
                    precision=t.precision)
    fabric.launch()
    if fabric.global_rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        with run_lock(fabric, Path(t.out)), fp32_precision(fabric.device, t.precision, t.tf32):
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
