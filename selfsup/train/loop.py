"""The pretraining loop, read top to bottom: data -> views -> method -> loss -> optimiser -> EMA.

Distribution, device placement and precision come from Lightning Fabric (DDP on any number of
processes and nodes, launched by Fabric, torchrun or SLURM). Everything a resumed run needs is a
function of the global step: the batch indices (:class:`StepSampler`), the augmentation RNG
(seeded with ``seed`` and the step before each step), and the precomputed schedules. So a run that
is killed and resumed ends with the same weights as an uninterrupted one.

The method and the online kNN monitor come from the caller (:class:`Plugins`, filled in by
:mod:`selfsup.launch`): ``selfsup.train`` imports neither ``selfsup.methods`` nor ``selfsup.eval``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from selfsup.config import Config, ConfigError, parse_duration
from selfsup.data.datasets import DataError, ImageData
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import StreamedSplit, open_split
from selfsup.memory import check_fits, gib
from selfsup.report.method_figures import has_figures
from selfsup.train.budget import BUDGET_FILE, MAX_TIMED, WARMUP_STEPS, Calibration, budget_steps, read_budget, record, \
    record_elapsed
from selfsup.train.metrics_log import KNNAccuracy
from selfsup.train.optim import build_optimizer, fused_step, online_encoder
from selfsup.train.run_dir import RunDir, carried_weights
from selfsup.train.schedules import lr_wd_schedules, run_steps, scaled_lr, warmup_steps
from selfsup.train.signals import StopSignals, TrainingInterrupted, reduced
from selfsup.train.speed import check_compile, compile_backbones, sync_debug, sync_debug_mode
from selfsup.train.views import StepViews, build_view_groups, image_shape, normalization, sample_images

log = logging.getLogger("selfsup")


@dataclass(frozen=True)
class Plugins:
    """What the loop gets from outside ``selfsup.train``."""

    # (cfg, channels, image_size, total_steps, carried weights or None, logger or None) -> (backbone params, method):
    # the method around its backbone, started from the carried weights, frozen (selfsup.methods.assemble).
    build_model: Callable[..., tuple[dict[str, Any], nn.Module]]
    # (cfg, total_steps, warmup_steps) -> settings that run but are probably wrong (selfsup.launch.run_warnings).
    run_warnings: Callable[[Config, int, int], list[str]]
    # (cfg, data, mean, std, channels, image_size) -> the online kNN monitor (selfsup.eval.monitor).
    knn_monitor: Callable[..., KNNAccuracy | None]


def train(fabric: Any, cfg: Config, plugins: Plugins, allow_optim_change: bool = False, carried: Path | None = None,
          stage: str | None = None, budget_s: float | None = None, budget_floor: bool = False) -> None:
    """One stage: train ``cfg.method`` for ``cfg.trainer``'s steps into ``cfg.trainer.out`` (resuming its checkpoint),
    then export the backbone. ``carried``: a checkpoint whose method weights a fresh stage starts from (the previous
    stage's), matched by name; read only when the stage has no checkpoint of its own. ``budget_s``: this stage's share
    of ``trainer.budget`` (default: all of it); ``budget_floor``: a share too small to train in still trains one step
    (a later stage of a run: an error would stop the run after the stages before it), with a warning."""
    t, o, is_main = cfg.trainer, cfg.optim, fabric.global_rank == 0
    run = RunDir(fabric, cfg, allow_optim_change)  # config compatibility is checked before touching the data
    if t.compile:
        check_compile(fabric.device)  # before the data: a platform that cannot compile is told at once
    sync_mode = sync_debug_mode(fabric.device)
    carried_state = carried_weights(carried) if run.state is None and carried is not None else None

    # Data: the pretraining split decoded into memory (uint8), or listed and streamed from its files.
    data = open_split(cfg.data, cfg.data.train_split, channels=cfg.data.channels, fraction=cfg.data.fraction,
                      progress=is_main)
    run.check_data(data)  # a resumed run's checkpoint was trained on this data
    channels, image_size = image_shape(data)
    mean, std = normalization(data, cfg)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mean=mean, std=std))
    view_groups = build_view_groups(cfg, image_size, mean, std)
    sampler = StepSampler(len(data), t.batch_size, seed=t.seed, rank=fabric.global_rank, world_size=fabric.world_size)
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    # model.init_weights is read by a fresh start only: not by the size check (on the meta device), the budget's
    # timing, nor where the weights come from a checkpoint (a resume, a previous stage)
    without_file = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_weights=None))
    check_step_fits(fabric, without_file, plugins, channels, image_size, max(run_steps(t, sampler.steps_per_epoch), 1),
                    view_groups)
    started = time.perf_counter()
    if t.budget is None:
        total_steps = run_steps(t, sampler.steps_per_epoch)
    else:
        total_steps = budgeted_steps(fabric, without_file, plugins, run, data, sampler, view_groups, channels,
                                     image_size, memory_format, budget_s or parse_duration(t.budget), budget_floor)
    schedule_steps = max(total_steps, 1)  # max_steps = 0 trains nothing and exports the initial backbone

    # Model, optimiser, per-step schedules; the checkpoint's state when resuming.
    build_cfg = cfg if run.state is None and carried_state is None else without_file
    params, method = plugins.build_model(build_cfg, channels, image_size, schedule_steps, carried_state,
                                         log if is_main else None)
    method = sync_batchnorm(fabric, method) if t.sync_batchnorm else method
    if t.compile:
        compile_backbones(method, fabric.device)
    optimizer = build_optimizer(method, o, online_encoder(method), fused_step(fabric.device, t.precision, o.clip_grad))
    warmup = warmup_steps(o, total_steps, sampler.steps_per_epoch)
    lr_schedule, wd_schedule = lr_wd_schedules(o, scaled_lr(o, t.batch_size), schedule_steps, warmup)
    raw_method, (method, optimizer) = method, fabric.setup(method, optimizer)
    # after setup: the parameters are on the device, so the optimiser state loads there too (before it, a resumed
    # run's moments stayed on the CPU beside CUDA parameters)
    run.restore(raw_method, optimizer)

    run.open(cfg, raw_method, optimizer, params, channels, image_size)
    if is_main:
        log_start(fabric, cfg, data, raw_method, total_steps, sampler.steps_per_epoch, resuming=run.start_step > 0,
                  warnings=plugins.run_warnings(cfg, total_steps, warmup))
    knn = (plugins.knn_monitor(cfg, data, mean, std, channels, image_size)
           if is_main and cfg.monitor.knn_every_steps else None)
    run.start_logs(total_steps, sampler.steps_per_epoch, knn, stage)
    step_views = StepViews(data, sampler, view_groups, t.seed, run.start_step, total_steps, fabric.device,
                           memory_format, raw_method, run.reported_images)
    run.step_views = step_views
    step = run.start_step
    raw_method.train()
    with StopSignals() as stop, run.logbook:
        while step < total_steps:
            run.clock.start()
            checkpoint_due = (step + 1) % t.checkpoint_every_steps == 0 or (step + 1) % sampler.steps_per_epoch == 0
            export_due = t.export_every_steps and (step + 1) % t.export_every_steps == 0 and step + 1 < total_steps
            # SELFSUP_SYNC_DEBUG: the steps after which nothing is logged or saved read nothing from the GPU
            with sync_debug(None if checkpoint_due or export_due or run.logbook.due(step + 1) else sync_mode):
                views = views_or_checkpoint(run, step_views, step)
                out = train_step(fabric, method, raw_method, optimizer, views, step, float(lr_schedule[step]),
                                 float(wd_schedule[step]), o.clip_grad, run.watch_loss)
                step += 1
                run.clock_step(t.batch_size)
                run.log_step(step, float(lr_schedule[step - 1]), out, step_views)
            if checkpoint_due:
                run.checkpoint(step)
            if export_due:
                run.check_losses()  # every process: no snapshot of weights whose loss diverged
                if is_main:
                    run.export(run.path / "snapshots" / f"step_{step:06d}", step)
            signum = reduced(fabric, stop.signum)
            if signum:
                run.checkpoint_unless_saved(step)
                raise TrainingInterrupted(signum, step, run.path)
    run.checkpoint_unless_saved(step)

    if is_main:
        run.export(run.path, step)
        samples = sample_images(cfg, data, channels, image_size, mean, std) if has_figures(cfg.method["name"]) \
            else None
        run.plot(samples, step)
        if t.budget is not None and run.start_step == 0:
            record_elapsed(run.path, started)
        log.info("done: %d steps; backbone exported to %s", step, run.path / "backbone.safetensors")


def train_step(fabric: Any, method: nn.Module, raw_method: nn.Module, optimizer: torch.optim.Optimizer,
               views: list[torch.Tensor], step: int, lr: float, weight_decay: float, clip_grad: float | None,
               watch_loss: Callable[[torch.Tensor, int], None] | None = None) -> Any:
    """One optimiser step of ``method`` (Fabric-wrapped; ``raw_method`` unwrapped) on the step's views: the loss,
    its gradients, the update and the method's own after-step update (EMA teachers). Returns the method's output.

    Nothing in it reads a value back from the device (on a GPU, the host runs ahead, queueing the next steps' work):
    ``watch_loss`` keeps the loss for the divergence check (:meth:`RunDir.watch_loss`), and a non-finite gradient
    norm is left to that check instead of raising in the clipping (``error_if_nonfinite`` reads the norm)."""
    set_lr_and_wd(optimizer, lr, weight_decay)
    out = method(views)
    if watch_loss is not None:
        watch_loss(out.loss, step)
    optimizer.zero_grad(set_to_none=True)
    fabric.backward(out.loss)
    if clip_grad:
        fabric.clip_gradients(method, optimizer, max_norm=clip_grad, error_if_nonfinite=False)
    optimizer.step()
    raw_method.after_step(step)
    return out


def budgeted_steps(fabric: Any, cfg: Config, plugins: Plugins, run: RunDir, data: ImageData | StreamedSplit,
                   sampler: StepSampler, groups: list[Any], channels: int, image_size: int,
                   memory_format: torch.memory_format, share_s: float, floor: bool = False) -> int:
    """``trainer.budget``: the run's length in steps. A resumed run reads it from its ``budget.json``; a new one times
    the step on a throwaway copy of the method (same data, views, optimiser and device; ``selfsup.train.budget``),
    sizes itself to the rest of ``share_s`` and writes ``budget.json`` before its first step."""
    t, is_main = cfg.trainer, fabric.global_rank == 0
    saved = read_budget(run.path, t.budget)
    if saved is not None:
        return saved["steps"]
    if run.state is not None:
        raise ConfigError(f"{run.path / BUDGET_FILE} is missing: it holds the length this run was sized to by "
                          f"trainer.budget={t.budget}; restore it, or train into a new trainer.out")
    if is_main:
        log.info("trainer.budget=%s: timing the training step on this machine (%s of the budget)", t.budget,
                 f"{share_s:.0f} s" if share_s != parse_duration(t.budget) else "all")
    _, probe = plugins.build_model(cfg, channels, image_size, max(run_steps(t, sampler.steps_per_epoch), 1), None,
                                   None)
    if t.sync_batchnorm and fabric.device.type == "cuda":  # as the run's: SyncBatchNorm costs time (CUDA-only)
        probe = sync_batchnorm(fabric, probe)
    if t.compile:  # as the run's (the compilation falls in the warm-up steps)
        compile_backbones(probe, fabric.device)
    probe_optimizer = build_optimizer(probe, cfg.optim, online_encoder(probe),
                                      fused_step(fabric.device, t.precision, cfg.optim.clip_grad))
    wrapped, probe_optimizer = fabric.setup(probe, probe_optimizer)
    probe_views = StepViews(data, sampler, groups, t.seed, 0, WARMUP_STEPS + MAX_TIMED, fabric.device,
                            memory_format, probe, run.reported_images)
    probe.train()
    lr = scaled_lr(cfg.optim, t.batch_size)

    def step(i: int) -> None:
        views = probe_views(i, fabric.global_rank, fabric.world_size)
        train_step(fabric, wrapped, probe, probe_optimizer, views, i, lr, cfg.optim.weight_decay, cfg.optim.clip_grad)
        if fabric.device.type == "cuda":
            torch.cuda.synchronize(fabric.device)

    calibration = Calibration(step, share_s, agree=lambda more: bool(reduced(fabric, int(more))))
    del wrapped, probe, probe_optimizer, probe_views
    steps = budget_steps(share_s, calibration, floor) if is_main else 0
    steps = reduced(fabric, steps)  # the main process's measurement, for every process
    if is_main:
        entry = record(run.path, t.budget, share_s, calibration, steps, sampler.steps_per_epoch, len(data),
                       str(fabric.device), torch.get_num_threads())
        log.info("trainer.budget=%s: a step takes %.3f s here (%d timed after %d warm-up steps; the timing took "
                 "%.1f s): the rest of the %.0f s buys %d steps, %.2f epochs of %d images", t.budget,
                 calibration.seconds_per_step, calibration.timed_steps, WARMUP_STEPS, calibration.elapsed_s, share_s,
                 steps, entry["epochs"], len(data))
    return steps


def check_step_fits(fabric: Any, cfg: Config, plugins: Plugins, channels: int, image_size: int, steps: int,
                    groups: list[Any]) -> None:
    """Refuse a step that cannot fit in the device's free memory, before building the model: its weights and buffers
    (the method built on the meta device, which allocates nothing), their gradients, and one process's batch of
    images and views in float32, the views twice (each and the augmentation's working copy). A lower bound
    (activations and optimiser state come on top): a model or views far beyond the machine
    (model.params.width=1048576, views.*.size=8192) stop here with exit 2 and the sizes."""
    with torch.device("meta"):
        _, method = plugins.build_model(cfg, channels, image_size, steps, None, None)
    tensors = sum(t.numel() for t in [*method.parameters(), *method.buffers()])
    trainable = sum(p.numel() for p in method.parameters() if p.requires_grad)
    batch = cfg.trainer.batch_size // fabric.world_size
    pixels = batch * channels * (image_size**2 + 2 * sum(g.num * g.crop_spec.size**2 for g in groups))
    model_bytes, pixel_bytes = 4 * (tensors + trainable), 4 * pixels
    check_fits(f"the training step (a model of {tensors:,} weights with their gradients: {gib(model_bytes)}; "
               f"{batch} images and their views: {gib(pixel_bytes)})", model_bytes + pixel_bytes,
               "use a smaller model (model.backbone, model.params, method.*), trainer.batch_size or views "
               "(views.*.num, views.*.size, data.image_size)", fabric.device)


def views_or_checkpoint(run: RunDir, step_views: StepViews, step: int) -> list[torch.Tensor]:
    """The step's views. When the data fails (e.g. a folder whose files all became unreadable), a single process
    first checkpoints the steps done so far."""
    try:
        return step_views(step, run.fabric.global_rank, run.fabric.world_size)
    except DataError:
        if run.fabric.world_size == 1:
            run.checkpoint_unless_saved(step)
        raise


def log_start(fabric: Any, cfg: Config, data: ImageData | StreamedSplit, method: nn.Module, total_steps: int,
              steps_per_epoch: int, resuming: bool, warnings: list[str]) -> None:
    """The config's ``warnings``, then one line on what is about to run: method, data, steps, trainable parameters,
    devices."""
    for warning in warnings:
        log.warning(warning)
    channels, image_size = image_shape(data)
    n_params = sum(p.numel() for p in method.parameters() if p.requires_grad)
    log.info("%s %s: %d images %dx%dx%d, %d steps of %d (%.1f epochs), %.2fM trainable parameters, %s x%d",
             "resuming" if resuming else "pretraining", cfg.method["name"], len(data), channels, image_size,
             image_size, total_steps, cfg.trainer.batch_size, total_steps / steps_per_epoch, n_params / 1e6,
             fabric.device, fabric.world_size)


def set_lr_and_wd(optimizer: torch.optim.Optimizer, lr: float, weight_decay: float) -> None:
    """This step's schedule values, times each parameter group's scale (layer decay, the heads' own)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
        group["weight_decay"] = weight_decay * group["wd_scale"]


def sync_batchnorm(fabric: Any, method: nn.Module) -> nn.Module:
    """``trainer.sync_batchnorm``: batch statistics over all processes (torch's SyncBatchNorm is CUDA-only)."""
    if fabric.world_size == 1:
        return method
    if fabric.device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(method)
    if fabric.global_rank == 0:
        log.warning("SyncBatchNorm needs CUDA; on %s each process normalises with its own batch statistics",
                    fabric.device.type)
    return method
