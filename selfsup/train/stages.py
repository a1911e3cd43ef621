"""Staged runs (``stages:``): each stage a full run in ``RUN_DIR/stages/<i>_<name>/``, started from the previous one."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import yaml

from selfsup.checkpoint import CHECKPOINT, atomic_write, read_backbone_meta
from selfsup.config import Config, parse_duration, save_config, stage_configs, to_dict
from selfsup.data.stream import split_size
from selfsup.train.loop import Plugins, train
from selfsup.train.metrics_log import MetricsLog
from selfsup.train.run_dir import carried_weights, check_resume_compatible, run_checkpoint
from selfsup.train.schedules import run_steps

log = logging.getLogger("selfsup")


def train_stages(fabric: Any, cfg: Config, plugins: Plugins, allow_optim_change: bool = False) -> None:
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
        check_resume_compatible(yaml.safe_load(saved.read_text()), to_dict(cfg), run_dir,
                                allowed=("optim", "stages") if allow_optim_change else ())
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, saved)
    stages = stage_configs(cfg)
    for stage in stages:  # a damaged init_from checkpoint stops the run now, not after the stages before it
        if stage.init_from is not None and not (Path(stage.cfg.trainer.out) / "backbone.json").is_file():
            carried_weights(run_checkpoint(Path(stage.init_from)))
    shares = budget_shares(cfg, stages)
    carried, rows, done = None, [], []
    for number, stage in enumerate(stages, start=1):
        stage_dir = Path(stage.cfg.trainer.out)
        if stage.init_from is not None:
            carried = run_checkpoint(Path(stage.init_from))
        if (stage_dir / "backbone.json").is_file():
            if is_main:
                log.info("stage %d (%s) is done: %s", number, stage.name, stage_dir)
        else:
            if is_main:
                log.info("stage %d of %d: %s (%s)", number, len(cfg.stages), stage.name, stage.cfg.method["name"])
            train(fabric, stage.cfg, plugins, allow_optim_change, carried=carried, stage=stage.name,
                  budget_s=shares[number - 1], budget_floor=number > 1)
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


def budget_shares(cfg: Config, stages: list[Any]) -> list[float | None]:
    """``trainer.budget`` over the stages (None each without one): stage i gets ``budget * planned_i / sum(planned)``,
    ``planned`` its steps from its own ``trainer.epochs`` / ``max_steps``. Fixed when the run starts, so a stage that
    overruns its share (its export, its pictures) does not starve the next one, and a resumed run gets the same."""
    if cfg.trainer.budget is None:
        return [None] * len(stages)
    planned, sizes = [], {}
    for stage in stages:
        c = stage.cfg
        key = repr(c.data)  # the stages mostly share their data: it is listed (or loaded) once
        if key not in sizes:
            sizes[key] = split_size(c.data, c.data.train_split, c.data.fraction)
        planned.append(max(1, run_steps(c.trainer, max(1, sizes[key] // c.trainer.batch_size))))
    budget = parse_duration(cfg.trainer.budget)
    return [budget * p / sum(planned) for p in planned]
