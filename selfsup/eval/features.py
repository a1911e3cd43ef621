"""Frozen-backbone feature extraction and the input checks shared by the evaluations.

Every evaluation in :mod:`selfsup.eval` (weighted kNN, linear probe, low-shot logistic
regression, k-means) reads a frozen backbone only through the ``(N, D)`` feature matrix built
here, so evaluation never depends on a training method (GUIDE §3).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Callable, Protocol

import numpy as np
import torch
from torch import nn

from selfsup.progress import track

ArrayLike = torch.Tensor | np.ndarray


class ImageBatches(Protocol):
    """Images that do not fit in memory (e.g. :class:`selfsup.data.stream.StreamedSplit`): ``len`` rows,
    read in order as (uint8 (B, C, H, W) images, their row numbers)."""

    def __len__(self) -> int: ...

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


def as_feature_tensor(feats: ArrayLike, name: str = "features") -> torch.Tensor:
    """Return ``feats`` as a finite 2-D float32 tensor (kept on its device), or raise."""
    if isinstance(feats, np.ndarray):
        feats = torch.from_numpy(np.ascontiguousarray(feats))
    if not isinstance(feats, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor or numpy.ndarray of shape (N, D), "
            f"got {type(feats).__name__}; convert it with torch.as_tensor(...)."
        )
    if feats.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D (N, D), got shape {tuple(feats.shape)}; "
            "flatten or pool the backbone output to one vector per sample."
        )
    if feats.shape[0] == 0 or feats.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(feats.shape)}); pass at least one sample and one dimension.")
    if feats.dtype.is_complex or feats.dtype == torch.bool:
        raise TypeError(f"{name} has dtype {feats.dtype}; pass real-valued features.")
    feats = feats.float()
    if not bool(torch.isfinite(feats).all()):
        raise ValueError(
            f"{name} contains NaN or inf values; the backbone diverged or the features were "
            "corrupted. Check the checkpoint (e.g. a collapsed or NaN run) before evaluating."
        )
    return feats


def as_feature_pair(train_feats: ArrayLike, test_feats: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and test features as float tensors of the same width, or raise."""
    train = as_feature_tensor(train_feats, "train_feats")
    test = as_feature_tensor(test_feats, "test_feats")
    if train.shape[1] != test.shape[1]:
        raise ValueError(
            f"train_feats has {train.shape[1]} dims but test_feats has {test.shape[1]}; "
            "extract both with the same backbone."
        )
    return train, test


def as_label_tensor(labels: ArrayLike, num_samples: int | None = None, name: str = "labels") -> torch.Tensor:
    """Return ``labels`` as a 1-D int64 CPU tensor of non-negative class indices, or raise.

    ``num_samples``, when given, is the number of feature rows the labels must match.
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D (N,), got shape {labels.shape}; pass one class index per sample.")
    if labels.shape[0] == 0:
        raise ValueError(f"{name} is empty; pass at least one labelled sample.")
    if num_samples is not None and labels.shape[0] != num_samples:
        raise ValueError(
            f"{name} has {labels.shape[0]} entries but the features have {num_samples} rows; "
            "pass exactly one label per feature row."
        )
    if labels.dtype.kind not in "iu":
        if labels.dtype.kind == "f" and np.all(np.isfinite(labels)) and np.all(labels == np.round(labels)):
            labels = labels.astype(np.int64)
        else:
            raise TypeError(
                f"{name} must hold integer class indices, got dtype {labels.dtype}; "
                "map class names to 0..C-1 first."
            )
    if labels.min() < 0:
        raise ValueError(f"{name} contains negative class indices (min {labels.min()}); use indices 0..C-1.")
    return torch.from_numpy(labels.astype(np.int64))


def _check_images(images: ArrayLike) -> torch.Tensor:
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(np.ascontiguousarray(images))
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a uint8 torch.Tensor of shape (N, C, H, W), got {type(images).__name__}.")
    if images.dtype != torch.uint8:
        raise TypeError(
            f"images must be uint8 (raw 0..255 pixels), got {images.dtype}; the /255 scaling is "
            "done here, so pass undecoded uint8 images and put normalisation in `transform`."
        )
    if images.ndim != 4:
        raise ValueError(
            f"images must be 4-D (N, C, H, W), got shape {tuple(images.shape)}; "
            "add a channel axis for grayscale images with images[:, None]."
        )
    if images.shape[0] == 0:
        raise ValueError("images is empty (N = 0); pass at least one image.")
    return images


def _resolve_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


def extract_features(
    model: nn.Module,
    images: torch.Tensor | ImageBatches,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Embed ``images`` with a frozen ``model``; returns ``(N, D)`` float32 features on the CPU.

    Images travel to ``device`` as uint8 (4x less traffic than float), are scaled to [0, 1] there
    and passed through ``transform`` (e.g. mean/std normalisation) batch by batch. The model runs
    in eval mode under ``torch.inference_mode``; every submodule's train/eval flag is restored
    afterwards, even on error. ``device=None`` uses the device of the model's parameters.
    The model must return one vector per image, shape ``(B, D)``.

    ``images`` may also be :class:`ImageBatches` read from files; rows it could not read stay zero.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if isinstance(images, torch.Tensor) or isinstance(images, np.ndarray):
        images = _check_images(images)
        num_images = images.shape[0]
        batches = ((images[s:s + batch_size], torch.arange(s, min(s + batch_size, num_images)))
                   for s in range(0, num_images, batch_size))
    else:
        num_images = len(images)
        batches = images.batches(batch_size)
    target = _resolve_device(model, device)
    modes = {module: module.training for module in model.modules()}
    out: torch.Tensor | None = None
    if progress:
        batches = track(batches, "features", total=-(-num_images // batch_size), unit="batches")
    model.eval()
    try:
        with torch.inference_mode():
            for pixels, rows in batches:
                if len(rows) == 0:
                    continue
                batch = pixels.to(target, non_blocking=True).float().div_(255.0)
                if transform is not None:
                    batch = transform(batch)
                emb = model(batch)
                if not isinstance(emb, torch.Tensor) or emb.ndim != 2 or emb.shape[0] != batch.shape[0]:
                    shape = tuple(emb.shape) if isinstance(emb, torch.Tensor) else type(emb).__name__
                    raise ValueError(
                        f"model must return a (B, D) tensor per batch, got {shape}; wrap it so that "
                        "it returns the pooled feature (e.g. the [CLS] token or global average pool)."
                    )
                if out is None:
                    out = torch.zeros(num_images, emb.shape[1], dtype=torch.float32)
                out[rows] = emb.float().cpu()
    finally:
        for module, mode in modes.items():
            module.training = mode
        if progress:
            batches.close()  # the bar ends here, also on error
    if out is None:
        raise ValueError("no image could be read: every batch was empty")
    return out


def extract_view_averaged_features(
    model: nn.Module,
    images: torch.Tensor | ImageBatches,
    views: int,
    augment: Callable[[torch.Tensor], torch.Tensor] | None,
    seed: int = 0,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Mean features of 1 clean view (``transform``) and ``views - 1`` views made by ``augment``.

    The linear-probe protocol of Ghosh et al. (2024, App. D, "test-patches 16" in the authors'
    code): every train and test image is represented by the average over 16 views, the
    un-augmented normalised image and 15 pretraining augmentations. ``augment`` maps [0, 1] images
    to normalised augmented ones (e.g. :class:`selfsup.data.augment.Augment` with mean/std); its
    randomness comes from torch's CPU generator, seeded with ``seed`` inside a forked RNG state, so
    the result is deterministic and the caller's RNG is untouched. ``views = 1`` gives
    :func:`extract_features`.
    """
    if isinstance(views, bool) or not isinstance(views, int) or views < 1:
        raise ValueError(f"views must be a positive int (1 = the clean image only), got {views!r}.")
    if views > 1 and augment is None:
        raise ValueError(f"views={views} needs an augment function for the {views - 1} augmented views.")
    kwargs = dict(batch_size=batch_size, device=device, progress=progress)
    total = extract_features(model, images, transform=transform, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(views - 1):
            total = total + extract_features(model, images, transform=augment, **kwargs)
    return total / views


def raw_pixel_features(images: torch.Tensor) -> torch.Tensor:
    """Raw-pixel baseline: uint8 ``(N, C, H, W)`` images -> ``(N, C*H*W)`` float32 in [0, 1]."""
    images = _check_images(images)
    return images.reshape(images.shape[0], -1).float().div_(255.0)
