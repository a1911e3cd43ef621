"""STL-10: the binary files of stl10_binary.tar.gz, memory-mapped (the unlabeled split is 100,000 images)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from selfsup.data.imagedata import DataError, ImageData

_STL_SHAPE = (3, 96, 96)
_STL_BYTES = 3 * 96 * 96


def _stl_dir(root: Path) -> Path:
    for candidate in (root / "stl10_binary", root):
        if (candidate / "class_names.txt").is_file() or (candidate / "test_X.bin").is_file():
            return candidate
    raise FileNotFoundError(
        f"stl10: no extracted archive found at {root}. Download "
        f"http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz (no download is done here), "
        f"extract it so that {root / 'stl10_binary'} holds train_X.bin, train_y.bin, test_X.bin, "
        f"test_y.bin, unlabeled_X.bin and class_names.txt, and pass root=... (config: data.root=...)"
    )


def _stl_images(path: Path) -> np.ndarray:
    """Memory-map an STL-10 image file as (N, 3, 96, 96) in its stored (column-major) layout."""
    if not path.is_file():
        raise FileNotFoundError(f"stl10: missing {path}; re-extract stl10_binary.tar.gz there")
    size = path.stat().st_size
    if size == 0 or size % _STL_BYTES:
        raise DataError(
            f"{path}: size {size} bytes is not a multiple of one 3x96x96 image ({_STL_BYTES}); "
            f"the file is truncated or corrupt"
        )
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size // _STL_BYTES, *_STL_SHAPE))


def _stl_labels(path: Path, n: int) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"stl10: missing {path}; re-extract stl10_binary.tar.gz there")
    raw = np.fromfile(path, dtype=np.uint8).astype(np.int64)
    if len(raw) != n:
        raise DataError(f"{path}: {len(raw)} labels for {n} images; the file is truncated or corrupt")
    if len(raw) and (raw.min() < 1 or raw.max() > 10):
        raise DataError(f"{path}: labels must be 1..10; found {raw.min()}..{raw.max()}")
    return raw - 1


def _stl_materialise(mm: np.ndarray, idx: np.ndarray | None) -> torch.Tensor:
    """Read the selected rows and turn column-major (C, W, H) into (C, H, W)."""
    arr = np.asarray(mm) if idx is None else mm[idx]
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(0, 1, 3, 2)))


def load_stl10(split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    folder = _stl_dir(root)
    parts = split.split("+")
    maps = {p: _stl_images(folder / f"{p}_X.bin") for p in parts}
    total = sum(len(m) for m in maps.values())
    idx = select(total)
    chunks, label_chunks, offset = [], [], 0
    for part in parts:
        mm = maps[part]
        if idx is None:
            local = None
        else:
            mask = (idx >= offset) & (idx < offset + len(mm))
            local = (idx[mask] - offset).numpy()
        chunks.append(_stl_materialise(mm, local))
        if part != "unlabeled":
            lab = _stl_labels(folder / f"{part}_y.bin", len(mm))
            label_chunks.append(torch.from_numpy(lab if local is None else lab[local]))
        offset += len(mm)
    images = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    # A split containing unlabeled images has no labels at all.
    labels = label_chunks[0] if "unlabeled" not in parts else None
    classes = None
    names = folder / "class_names.txt"
    if names.is_file():
        classes = [line.strip() for line in names.read_text().splitlines() if line.strip()]
    return ImageData(images, labels, classes, [])
