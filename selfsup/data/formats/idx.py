"""MNIST and Fashion-MNIST: the four IDX files (optionally gzipped) of LeCun et al.'s format."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from selfsup.data.imagedata import DataError, ImageData, take

FASHION_MNIST_CLASSES: list[str] = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]


_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049


def missing_hint(name: str) -> str:
    if name == "fashion_mnist":
        return ("install the Debian package (apt-get install dataset-fashion-mnist, files land in "
                "/usr/share/datasets/fashion-mnist) or pass root=DIR (config: data.root=DIR) "
                "holding the IDX files")
    return ("download the four IDX files of MNIST (e.g. from https://yann.lecun.com/exdb/mnist/) "
            "into a folder and pass root=DIR (config: data.root=DIR), or set SELFSUP_DATA=BASE "
            "with the files in BASE/mnist")


def _find_idx_file(root: Path, stem: str, name: str) -> Path:
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{name}: expected {stem} or {stem}.gz in {root}; {missing_hint(name)}"
    )


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    """Read an unsigned-byte IDX file and check magic number, dimensions and length."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: cannot read IDX file ({err}); the file is corrupt, re-download it") from err
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: file is truncated ({len(raw)} bytes); re-download it")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise DataError(f"{path}: bad IDX magic number {found} (expected {magic}); wrong or corrupt file")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(
            f"{path}: IDX header announces {dims} = {expected} bytes of data but the file has "
            f"{len(raw) - header}; the file is truncated or corrupt, re-download it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_idx(name: str, split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    prefix = "train" if split == "train" else "t10k"
    img_path = _find_idx_file(root, f"{prefix}-images-idx3-ubyte", name)
    lbl_path = _find_idx_file(root, f"{prefix}-labels-idx1-ubyte", name)
    images = _read_idx(img_path, _IDX_IMAGES_MAGIC, 3)
    labels = _read_idx(lbl_path, _IDX_LABELS_MAGIC, 1)
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels")
    img_t = torch.from_numpy(images.copy()).unsqueeze(1)
    lbl_t = torch.from_numpy(labels.astype(np.int64))
    img_t, lbl_t = take(img_t, lbl_t, select(len(img_t)))
    classes = FASHION_MNIST_CLASSES if name == "fashion_mnist" else [str(i) for i in range(10)]
    return ImageData(img_t.contiguous(), lbl_t, list(classes), [])
