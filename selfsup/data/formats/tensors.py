"""Saved tensors: a ``.pt`` (torch.save of a dict) or ``.npz`` with ``images``, optional ``labels`` and ``classes``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from selfsup.data.imagedata import DataError, ImageData, take


def split_file(root: Path, split: str) -> Path:
    if root.is_file():
        return root
    for ext in (".pt", ".npz"):
        if (root / f"{split}{ext}").is_file():
            return root / f"{split}{ext}"
    raise FileNotFoundError(
        f"tensors: expected {root / (split + '.pt')} or {root / (split + '.npz')}; or pass "
        f"root=FILE.pt|FILE.npz"
    )


def _as_uint8_images(arr: torch.Tensor, path: Path) -> torch.Tensor:
    if arr.ndim == 3:
        arr = arr.unsqueeze(1)
    if arr.ndim != 4:
        raise DataError(f"{path}: 'images' must be (N, C, H, W) or (N, H, W); got shape {tuple(arr.shape)}")
    if arr.shape[1] not in (1, 3):
        hint = (" (looks channels-last: store images.permute(0, 3, 1, 2))"
                if arr.shape[-1] in (1, 3) else "")
        raise DataError(f"{path}: 'images' must have 1 or 3 channels in dim 1; got shape "
                         f"{tuple(arr.shape)}{hint}")
    if len(arr) == 0:
        raise DataError(f"{path}: 'images' is empty")
    if arr.dtype == torch.uint8:
        return arr.contiguous()
    if arr.is_floating_point():
        if not bool(torch.isfinite(arr).all()):
            raise DataError(f"{path}: float 'images' contain NaN or inf")
        lo, hi = float(arr.min()), float(arr.max())
        if lo < 0.0 or hi > 1.0:
            raise DataError(f"{path}: float 'images' must lie in [0, 1]; found [{lo:g}, {hi:g}] "
                             f"(store uint8 0..255 or floats in [0, 1])")
        return (arr.float() * 255.0).round_().to(torch.uint8).contiguous()
    if not arr.is_complex() and arr.dtype != torch.bool:  # remaining dtypes are integers
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > 255:
            raise DataError(f"{path}: integer 'images' must lie in 0..255; found {lo}..{hi}")
        return arr.to(torch.uint8).contiguous()
    raise DataError(f"{path}: 'images' has unsupported dtype {arr.dtype}; store uint8 or float in [0, 1]")


def _as_labels(arr: torch.Tensor, n: int, path: Path) -> torch.Tensor:
    if arr.is_floating_point() or arr.is_complex() or arr.dtype == torch.bool:
        raise DataError(f"{path}: 'labels' must be integers; got {arr.dtype}")
    if arr.shape != (n,):
        raise DataError(f"{path}: 'labels' must have shape ({n},) to match images; got {tuple(arr.shape)}")
    if n and int(arr.min()) < 0:
        raise DataError(f"{path}: 'labels' must be >= 0; found {int(arr.min())}")
    return arr.to(torch.int64)


def load_tensors(path: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    suffix = path.suffix.lower()
    if suffix in (".pt", ".pth"):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise DataError(f"{path}: cannot load with torch.load(weights_only=True) ({err}); save a "
                             f"dict of tensors with torch.save") from err
        if not isinstance(obj, dict):
            raise DataError(f"{path}: expected a dict with 'images' (and optional 'labels'); got "
                             f"{type(obj).__name__}")
        raw = {k: obj[k] for k in ("images", "labels", "classes") if k in obj}
    elif suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                raw = {k: npz[k] for k in ("images", "labels", "classes") if k in npz.files}
        except Exception as err:
            raise DataError(f"{path}: cannot read as .npz ({err})") from err
    else:
        raise DataError(f"{path}: tensors must be a .pt/.pth or .npz file; got {suffix or 'no extension'!r}")
    if "images" not in raw:
        raise DataError(f"{path}: no 'images' entry; save {{'images': uint8 (N, C, H, W), 'labels': ...}}")

    def as_tensor(x: object, key: str) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":
            return torch.from_numpy(x)
        raise DataError(f"{path}: {key!r} must be a tensor or numeric array; got {type(x).__name__}")

    images = _as_uint8_images(as_tensor(raw["images"], "images"), path)
    labels = _as_labels(as_tensor(raw["labels"], "labels"), len(images), path) if "labels" in raw else None
    classes = None
    if "classes" in raw:
        names = raw["classes"]
        if isinstance(names, np.ndarray):
            names = names.tolist()
        if not isinstance(names, (list, tuple)):
            raise DataError(f"{path}: 'classes' must be a list of names; got {type(names).__name__}")
        classes = [str(c) for c in names]
    images, labels = take(images, labels, select(len(images)))
    return ImageData(images, labels, classes, [])
