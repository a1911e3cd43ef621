"""``selfsup bench``: images/s of the training step and of the augmentation pipeline, and peak memory.

Both speeds are measured in the same process on the same batches, so their ratio is meaningful
on a shared, noisy machine; absolute numbers are not. A streamed dataset (``data.stream``) adds the
loader: images/s of reading + decoding + cropping with the configured workers, and the decode cost
per image in one process, so a user sees whether the loader or the step limits training. They are
measured one after the other (loader alone, then the step on batches it produced), so on a machine
with few cores the two do not slow each other during the measurement, as they would in a run.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch

from selfsup.config import Config
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import StreamedSplit, crop_batches, open_split
from selfsup.methods.assemble import assemble_model
from selfsup.launch import torch_threads, validate
from selfsup.train.optim import build_optimizer, fused_step, online_encoder
from selfsup.train.speed import check_compile, compile_backbones, fp32_precision
from selfsup.train.views import StepViews, build_view_groups, crop_specs, image_shape, normalization, views_maker


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def bench(cfg: Config, steps: int = 10, warmup: int = 2) -> dict[str, Any]:
    validate(cfg)
    with torch_threads(cfg.trainer.num_threads):
        return _bench(cfg, steps, warmup)


def _bench(cfg: Config, steps: int, warmup: int) -> dict[str, Any]:
    t = cfg.trainer
    device = torch.device("cuda" if t.accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available() else "cpu")
    if t.compile:
        check_compile(device)  # before the data, as pretrain does
    # The training loop's fast-step options, by the same functions: TF32 (trainer.tf32), compiled backbones
    # (trainer.compile; the warm-up steps compile), fused Adam / AdamW on CUDA.
    with fp32_precision(device, t.precision, t.tf32):
        return _bench_on(cfg, device, steps, warmup)


def _bench_on(cfg: Config, device: torch.device, steps: int, warmup: int) -> dict[str, Any]:
    t = cfg.trainer
    data = open_split(cfg.data, cfg.data.train_split, channels=cfg.data.channels, fraction=cfg.data.fraction,
                      progress=False)
    streamed = isinstance(data, StreamedSplit)
    channels, size = image_shape(data)
    mean, std = normalization(data, cfg)
    view_groups = [group.to(device) for group in build_view_groups(cfg, size, mean, std)]
    # model.freeze applied: frozen blocks cost no backward pass and no optimiser step
    method = assemble_model(cfg, channels, size, total_steps=steps + warmup)[1].to(device).train()
    if t.compile:
        compile_backbones(method, device)
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    optimizer = build_optimizer(method, cfg.optim, online_encoder(method), fused_step(device, t.precision,
                                                                                     cfg.optim.clip_grad))
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if "bf16" in t.precision
                else torch.autocast(device.type, dtype=torch.float16) if "16" in t.precision
                else torch.autocast(device.type, enabled=False))
    loader: dict[str, Any] = {}
    if streamed:
        loader = _loader_speed(data, cfg, crop_specs(data, view_groups, method), steps, warmup)
        # The step below runs on the crops of every view: the full-resolution decode is the loader's work.
        step_views = StepViews(data, StepSampler(len(data), t.batch_size, seed=t.seed), view_groups, t.seed, 0,
                               steps + warmup, device, memory_format, method)
        view_batches = [step_views(i, 0, 1) for i in range(steps + warmup)]
        batches: list[torch.Tensor] = []  # no separate augmentation pass: the loader made the crops
    else:
        make = views_maker(method, view_groups)
        g = torch.Generator().manual_seed(0)
        batches = [data.images[torch.randint(len(data), (t.batch_size,), generator=g)] for _ in range(steps + warmup)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Augmentation alone: uint8 batch -> all views (in memory; a streamed run's crops come from the loader).
    aug_time = 0.0
    for i, images in enumerate(batches):
        sync()
        start = time.perf_counter()
        x = images.to(device).float().div_(255)
        _ = make(x, i)
        sync()
        if i >= warmup:
            aug_time += time.perf_counter() - start

    # Full training step: augmentation + forward + backward + optimiser (+ EMA).
    step_time = 0.0
    for i in range(steps + warmup):
        sync()
        start = time.perf_counter()
        if streamed:
            views = view_batches[i]
        else:
            x = batches[i].to(device).float().div_(255)
            views = [view.contiguous(memory_format=memory_format) for view in make(x, i)]
        with autocast:
            out = method(views)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        method.after_step(i)
        sync()
        if i >= warmup:
            step_time += time.perf_counter() - start

    train_ips = steps * t.batch_size / step_time
    if streamed:
        loader["loader_to_train_ratio"] = round(loader["loader_images_per_s"] / train_ips, 2)
    augment = {} if streamed else {"augment_images_per_s": round(steps * t.batch_size / aug_time, 1),
                                   "augment_to_train_ratio": round(steps * t.batch_size / aug_time / train_ips, 2)}
    return {
        "method": cfg.method["name"], "backbone": cfg.model.backbone, "device": str(device), "precision": t.precision,
        "compile": t.compile,
        "threads": torch.get_num_threads(), "batch_size": t.batch_size, "views": sum(group.num for group in view_groups),
        "image_size": size, "channels": channels, "steps": steps,
        "train_images_per_s": round(train_ips, 1), **augment, **loader,
        "peak_memory_mib": round(_peak_memory_mib(device), 1),
    }


def _loader_speed(data: StreamedSplit, cfg: Config, specs: list, steps: int, warmup: int) -> dict[str, Any]:
    """Images/s of the streaming loader (read + decode + crop every view) with ``data.num_workers`` workers,
    and the milliseconds one process spends per image."""
    t = cfg.trainer
    sampler = StepSampler(len(data), t.batch_size, seed=t.seed)

    def images_per_s(workers: int, count: int) -> float:
        batches = iter(crop_batches(data.source, sampler, specs, data.channels, t.seed, 0, count + warmup, workers))
        for _ in range(warmup):  # worker start-up and the first prefetch are not throughput
            next(batches)
        start = time.perf_counter()
        for _ in range(count):
            next(batches)
        return count * t.batch_size / (time.perf_counter() - start)

    one_process = images_per_s(0, max(1, steps // 4))
    return {"loader_workers": data.workers, "loader_images_per_s": round(images_per_s(data.workers, steps), 1),
            "decode_ms_per_image": round(1000 / one_process, 2)}
