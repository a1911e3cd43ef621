"""``selfsup bench``: images/s of the training step and of the augmentation pipeline, and peak memory.

Both speeds are measured in the same process on the same batches, so their ratio is meaningful
on a shared, noisy machine; absolute numbers are not.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import torch

from selfsup.config import Config
from selfsup.data.datasets import load_dataset
from selfsup.data.views import make_views
from selfsup.train.engine import build_view_groups, build_model, normalization, validate
from selfsup.train.optim import build_optimizer


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def bench(cfg: Config, steps: int = 10, warmup: int = 2) -> dict[str, Any]:
    validate(cfg)
    t = cfg.trainer
    if t.num_threads:
        torch.set_num_threads(t.num_threads)
    device = torch.device("cuda" if t.accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available() else "cpu")
    data = load_dataset(cfg.data.dataset, cfg.data.train_split, root=cfg.data.root, image_size=cfg.data.image_size,
                        channels=cfg.data.channels, fraction=cfg.data.fraction, progress=False)
    channels, size = data.images.shape[1], data.images.shape[2]
    mean, std = normalization(data, cfg)
    view_groups = build_view_groups(cfg, size, mean, std)
    method = build_model(cfg, channels, size, total_steps=steps + warmup)[1].to(device).train()
    memory_format = torch.channels_last if t.channels_last else torch.contiguous_format
    optimizer = build_optimizer(method, cfg.optim)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if "bf16" in t.precision
                else torch.autocast(device.type, dtype=torch.float16) if "16" in t.precision
                else torch.autocast(device.type, enabled=False))
    g = torch.Generator().manual_seed(0)
    batches = [data.images[torch.randint(len(data), (t.batch_size,), generator=g)] for _ in range(steps + warmup)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Augmentation alone: uint8 batch -> all views.
    aug_time = 0.0
    for i, images in enumerate(batches):
        sync()
        start = time.perf_counter()
        x = images.to(device).float().div_(255)
        _ = make_views(x, view_groups)
        sync()
        if i >= warmup:
            aug_time += time.perf_counter() - start

    # Full training step: augmentation + forward + backward + optimiser (+ EMA).
    step_time = 0.0
    for i, images in enumerate(batches):
        sync()
        start = time.perf_counter()
        x = images.to(device).float().div_(255)
        views = [view.contiguous(memory_format=memory_format) for view in make_views(x, view_groups)]
        with autocast:
            out = method(views)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        if hasattr(method, "after_step"):
            method.after_step(i)
        sync()
        if i >= warmup:
            step_time += time.perf_counter() - start

    train_ips = steps * t.batch_size / step_time
    aug_ips = steps * t.batch_size / aug_time
    return {
        "method": cfg.method["name"], "backbone": cfg.model.backbone, "device": str(device),
        "threads": torch.get_num_threads(), "batch_size": t.batch_size, "views": sum(group.num for group in view_groups),
        "image_size": size, "channels": channels, "steps": steps,
        "train_images_per_s": round(train_ips, 1), "augment_images_per_s": round(aug_ips, 1),
        "augment_to_train_ratio": round(aug_ips / train_ips, 2),
        "peak_memory_mib": round(_peak_memory_mib(device), 1),
    }
