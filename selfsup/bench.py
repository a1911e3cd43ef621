"""``selfsup bench``: images/s of the training step and of the augmentation pipeline, peak memory, and the step's
FLOPs and model FLOPs utilisation (MFU).

Both speeds are measured in the same process on the same batches, so their ratio is meaningful
on a shared, noisy machine; absolute numbers are not. A streamed dataset (``data.stream``) adds the
loader: images/s of reading + decoding + cropping with the configured workers, and the decode cost
per image in one process, so a user sees whether the loader or the step limits training. They are
measured one after the other (loader alone, then the step on the crops it produced: their transfer to the device,
the photometric ops and the training step), so on a machine with few cores the two do not slow each other during the
measurement, as they would in a run. ``bottleneck`` names the slower side: streamed, ``loader`` when it makes fewer
images/s than the step takes (``loader_to_train_ratio`` < 1); in memory, where the augmentation runs inside the step,
``augmentation`` when it takes longer than the rest of the step (``augment_to_train_ratio`` < 2); else ``step``.
``data`` says what was read: ``memory``, ``streamed`` or ``synthetic``.

FLOPs (:mod:`selfsup.flops`): one step's forward and backward (every pass the method runs: student, teacher or
target, heads; not the augmentation, not the optimiser) counted once, outside the timed steps; ``tflops_per_s`` is
that count times the timed steps over their time, ``mfu`` its fraction of the device's peak at the step's precision
(``peak_source`` says which: a datasheet's dense figure for a known NVIDIA GPU, else a matrix multiply measured
here).

``synthetic``: random uint8 images instead of the training split, so a config is benched without its data (an
ImageNet config on a laptop); the loader is not measured (``"data": "synthetic"``). A streamed config
(``data.stream: true``) runs the streamed step on random crops of every view's size (what the loader hands the step),
any other (``auto`` too: whether it would stream depends on the data's size) the in-memory step on random images of
``data.image_size`` (the dataset's stored size when unset: :data:`~selfsup.data.datasets.STORED_SHAPES`), its
augmentation measured as usual.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch

from selfsup.config import Config, ConfigError, DataConfig
from selfsup.data.datasets import STORED_SHAPES, STREAMABLE, ImageData
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import StreamedSplit, crop_batches, open_split
from selfsup.flops import achieved_tflops, compute_precision, count_flops, device_peak
from selfsup.methods.assemble import assemble_model
from selfsup.launch import torch_threads, validate
from selfsup.train.optim import build_optimizer, fused_step, online_encoder
from selfsup.train.speed import check_compile, compile_backbones, fp32_precision
from selfsup.train.views import build_view_groups, crop_specs, image_shape, normalization, views_from_crops, views_maker


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def bench(cfg: Config, steps: int = 10, warmup: int = 2, synthetic: bool = False) -> dict[str, Any]:
    """``steps`` timed training steps of ``cfg`` after ``warmup`` untimed ones, with ``trainer.num_threads``; the
    result as ``selfsup bench`` prints it (the module's docstring says what each part measures). ``synthetic``: random
    images instead of the data."""
    validate(cfg)
    with torch_threads(cfg.trainer.num_threads):
        return _bench(cfg, steps, warmup, synthetic)


def synthetic_split(d: DataConfig, count: int) -> ImageData:
    """``count`` random uint8 images shaped as the training split's: ``data.image_size`` and ``data.channels`` where
    set, else the dataset's stored shape (:data:`STORED_SHAPES`; image files are decoded to 3 channels)."""
    channels, side = STORED_SHAPES.get(d.dataset, (3 if d.dataset in STREAMABLE else None, None))
    channels, side = d.channels or channels, d.image_size or side
    missing = [key for key, value in (("image_size", side), ("channels", channels)) if value is None]
    if missing:
        examples = {"image_size": "data.image_size=224", "channels": "data.channels=3"}
        raise ConfigError(f"--synthetic makes random images shaped as the training images, but {d.dataset}'s shape "
                          f"is in its files: set {' and '.join(f'data.{key}' for key in missing)}, e.g. "
                          f"{' '.join(examples[key] for key in missing)}")
    images = torch.randint(0, 256, (count, channels, side, side), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    return ImageData(images, None, None)


def _significant(x: float) -> float:
    return float(f"{x:.4g}")


def _bench(cfg: Config, steps: int, warmup: int, synthetic: bool) -> dict[str, Any]:
    t = cfg.trainer
    device = torch.device("cuda" if t.accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available() else "cpu")
    if t.compile:
        check_compile(device)  # before the data, as pretrain does
    # The training loop's fast-step options, by the same functions: TF32 (trainer.tf32), compiled backbones
    # (trainer.compile; the warm-up steps compile), fused Adam / AdamW on CUDA.
    with fp32_precision(device, t.precision, t.tf32):
        return _bench_on(cfg, device, steps, warmup, synthetic)


def _bench_on(cfg: Config, device: torch.device, steps: int, warmup: int, synthetic: bool) -> dict[str, Any]:
    t = cfg.trainer
    if synthetic:
        data: ImageData | StreamedSplit = synthetic_split(cfg.data, t.batch_size)
        streamed = cfg.data.stream is True and cfg.data.dataset in STREAMABLE  # auto: in memory, without a count
    else:
        data = open_split(cfg.data, cfg.data.train_split, channels=cfg.data.channels, fraction=cfg.data.fraction,
                          progress=False)
        streamed = isinstance(data, StreamedSplit)
    channels, size = image_shape(data)
    mean, std = normalization(data, cfg)
    view_groups = [group.to(device) for group in build_view_groups(cfg, size, mean, std)]
    # model.freeze applied: frozen blocks cost no backward pass and no optimiser step
    method = assemble_model(cfg, channels, size, total_steps=steps + warmup)[1].to(device).train()
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    optimizer = build_optimizer(method, cfg.optim, online_encoder(method), fused_step(device, t.precision,
                                                                                     cfg.optim.clip_grad))
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if "bf16" in t.precision
                else torch.autocast(device.type, dtype=torch.float16) if "16" in t.precision
                else torch.autocast(device.type, enabled=False))
    make = views_maker(method, view_groups)
    loader: dict[str, Any] = {}
    if streamed:
        specs = crop_specs(size, view_groups, method)
        if synthetic:  # what the loader hands the step: uint8 crops of every view's size (one set, every step)
            g = torch.Generator().manual_seed(0)
            crop_sets = [[torch.randint(0, 256, (t.batch_size, channels, spec.size, spec.size), dtype=torch.uint8,
                                        generator=g) for spec in specs for _ in range(spec.count)]] * (steps + warmup)
        else:
            loader = _loader_speed(data, cfg, specs, steps, warmup)
            # The step below runs on crops the loader made beforehand: the decode is the loader's work, measured above.
            crop_sets = [batch.crops for batch in crop_batches(
                data.source, StepSampler(len(data), t.batch_size, seed=t.seed), specs, channels, t.seed, 0,
                steps + warmup, data.workers, pin_memory=device.type == "cuda")]
        batches: list[torch.Tensor] = []  # no separate augmentation pass: the loader made the crops
    else:
        g = torch.Generator().manual_seed(0)
        batches = [data.images[torch.randint(len(data), (t.batch_size,), generator=g)] for _ in range(steps + warmup)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step_views(i: int) -> list[torch.Tensor]:
        if streamed:
            crops = [c.to(device, non_blocking=True).float().div_(255) for c in crop_sets[i]]
            views = views_from_crops(crops, view_groups, make if method.OWN_VIEWS else None, i)
        else:
            views = make(batches[i].to(device).float().div_(255), i)
        return [view.contiguous(memory_format=memory_format) for view in views]

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

    # The step's FLOPs: one forward and backward on the first batch's views, counted before the timed steps.
    first = step_views(0)

    def forward_backward() -> None:
        with autocast:
            out = method(first)
        out.loss.backward()

    flops = count_flops(forward_backward)
    optimizer.zero_grad(set_to_none=True)
    if t.compile:  # after the count: the counter sees the eager ops (the same FLOPs); the warm-up steps compile
        compile_backbones(method, device)

    # Full training step: views (augmentation in memory, photometric ops when streamed) + forward + backward +
    # optimiser (+ EMA).
    step_time = 0.0
    for i in range(steps + warmup):
        sync()
        start = time.perf_counter()
        views = step_views(i)
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
    if streamed and not synthetic:
        loader["loader_to_train_ratio"] = round(loader["loader_images_per_s"] / train_ips, 2)
        loader["bottleneck"] = "loader" if loader["loader_images_per_s"] < train_ips else "step"
    augment = {} if streamed else {"augment_images_per_s": round(steps * t.batch_size / aug_time, 1),
                                   "augment_to_train_ratio": round(steps * t.batch_size / aug_time / train_ips, 2),
                                   # the augmentation runs inside the step: slower than the rest of it?
                                   "bottleneck": "augmentation" if aug_time > step_time - aug_time else "step"}
    precision = compute_precision(t.precision, device)
    peak, peak_source = device_peak(device, precision)
    achieved = achieved_tflops(flops, steps, step_time)
    return {
        "method": cfg.method["name"], "backbone": cfg.model.backbone, "device": str(device), "precision": t.precision,
        "compile": t.compile,
        "threads": torch.get_num_threads(), "batch_size": t.batch_size, "views": sum(group.num for group in view_groups),
        "image_size": size, "channels": channels, "steps": steps,
        "data": "synthetic" if synthetic else "streamed" if streamed else "memory",
        "train_images_per_s": round(train_ips, 1), **augment, **loader,
        "gflops_per_step": _significant(flops / 1e9), "gflops_per_image": _significant(flops / 1e9 / t.batch_size),
        "tflops_per_s": _significant(achieved), "peak_tflops": _significant(peak), "peak_source": peak_source,
        "mfu": round(achieved / peak, 3),
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
