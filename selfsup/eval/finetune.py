"""End-to-end fine-tuning of a pretrained backbone with a linear head (the protocol MAE, MAE-CT and ExtreMA are
judged by, scaled to the run).

Recipe (MAE, He et al. 2022, App. A.1; BEiT's layer-wise decay): AdamW; learning rate warm-up then cosine
to 0; layer-wise learning-rate decay (layer l of L gets ``lr * decay^(L + 1 - l)``: the patch embedding or
stem is layer 0, block or stage i is layer i, the head layer L + 1); label smoothing; stochastic depth in
the ViT blocks (the caller builds the backbone with it); the run's own training augmentation on every
batch. Weight decay skips biases and normalisation parameters. Optionally on a class-stratified seeded
subset of the labels: a fraction (MAE's and ExtreMA's 1 % / 10 % semi-supervised protocol) or a number
per class.

Missing from MAE's recipe (App. A.1, used by MAE-CT too): Mixup (0.8), CutMix (1.0), RandAugment (m9, mstd 0.5)
and Random Erasing (0.25); the batch is augmented with the run's own pretraining views instead. Numbers from here
are therefore not comparable with the papers' fine-tuning results.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.eval.knn import topk_accuracy
from selfsup.eval.lowshot import lowshot_splits, percent_split
from selfsup.progress import Progress
from selfsup.train.optim import parameter_groups
from selfsup.train.schedules import cosine_schedule

__all__ = ["finetune", "labelled_subset"]


def labelled_subset(labels: np.ndarray, fraction: float = 1.0, per_class: int | None = None, seed: int = 0) -> np.ndarray:
    """Sorted indices of a class-stratified seeded subset, drawn as the low-shot evaluation draws its labelled sets:
    ``per_class`` images of each class (:func:`lowshot_splits`), or ``fraction`` of each class, at least one
    (:func:`percent_split`); everything when neither asks for less."""
    if per_class is not None:
        return lowshot_splits(labels, per_class, num_splits=1, seed=seed)[0]
    if fraction >= 1.0:
        return np.arange(len(labels))
    return percent_split(labels, 100.0 * fraction, seed=seed)


def finetune(backbone: nn.Module, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
             test_labels: torch.Tensor, augment: Callable[[torch.Tensor], torch.Tensor],
             normalize: Callable[[torch.Tensor], torch.Tensor], *, epochs: int = 10, batch_size: int = 128,
             lr: float = 1e-3, layer_decay: float = 0.65, weight_decay: float = 0.05, warmup_fraction: float = 0.1,
             label_smoothing: float = 0.1, seed: int = 0, device: torch.device | str = "cpu",
             progress: bool = False) -> dict[str, float]:
    """Fine-tune ``backbone`` (changed in place) with a new linear head; returns test top-1 / top-5 in percent.

    ``train_images``/``test_images``: uint8 (N, C, H, W); ``augment`` maps a [0, 1] batch to a normalised
    augmented one (the run's training augmentation), ``normalize`` a [0, 1] batch to a normalised one.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0 or not 0 < layer_decay <= 1:
        raise ValueError(f"fine-tuning needs epochs >= 1, batch_size >= 1, lr > 0 and layer_decay in (0, 1]; got "
                         f"{epochs}, {batch_size}, {lr}, {layer_decay}")
    device = torch.device(device)
    generator = torch.Generator().manual_seed(seed)
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    backbone = backbone.to(device)
    with torch.no_grad():
        width = backbone.eval()(normalize(train_images[:2].to(device).float() / 255)).shape[1]
    torch.manual_seed(seed)
    head = nn.Linear(width, num_classes).to(device)
    nn.init.trunc_normal_(head.weight, std=2e-5)  # MAE's head init
    nn.init.zeros_(head.bias)

    param_groups = parameter_groups(nn.ModuleDict({"backbone": backbone, "head": head}), backbone, layer_decay)
    for group in param_groups:
        group["weight_decay"] = weight_decay * group["wd_scale"]
    optimizer = torch.optim.AdamW(param_groups, lr=lr, betas=(0.9, 0.999))

    steps_per_epoch = max(1, len(train_images) // batch_size)
    total = epochs * steps_per_epoch
    schedule = cosine_schedule(lr, 0.0, total, warmup_steps=int(round(warmup_fraction * total)))
    step = 0
    bar = Progress("fine-tuning", total, unit="steps", enabled=progress)
    for _ in range(epochs):
        backbone.train()
        order = torch.randperm(len(train_images), generator=generator)
        for start in range(0, steps_per_epoch * batch_size, batch_size):
            idx = order[start:start + batch_size]
            x = augment(train_images[idx].to(device).float().div_(255))
            loss = F.cross_entropy(head(backbone(x)), train_labels[idx].to(device), label_smoothing=label_smoothing)
            for group in optimizer.param_groups:
                group["lr"] = float(schedule[step]) * group["lr_scale"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            bar.advance()
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"fine-tuning loss is {loss.item()} at step {step}; lower eval.finetune_lr")
    bar.close()

    backbone.eval()
    logits = []
    with torch.inference_mode():
        for start in range(0, len(test_images), 512):
            x = normalize(test_images[start:start + 512].to(device).float().div_(255))
            logits.append(head(backbone(x)).float().cpu())
    return topk_accuracy(torch.cat(logits), test_labels, ks=(1, 5))
