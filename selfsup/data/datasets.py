"""Datasets by name: one entry point over the on-disk formats of :mod:`selfsup.data.formats`.

- :func:`load_dataset`: a split decoded into memory as one uint8 (N, C, H, W) tensor
  (:class:`ImageData`), so a training loop batches by indexing: IDX (MNIST / Fashion-MNIST),
  CIFAR pickles, STL-10 binary, saved tensors, scikit-learn digits, image folders and tar shards.
- :func:`open_images`: a split of encoded image files, not decoded (:class:`ImageSource`), for the
  streaming path (:mod:`selfsup.data.stream`): image folders and WebDataset tar shards.

Both paths share the decoders of :mod:`selfsup.data.decode`.
"""

from __future__ import annotations

import os
from pathlib import Path

from selfsup.data.decode import ImageSource, decode_all
from selfsup.data.formats import cifar, digits, idx, stl10, tensors
from selfsup.data.formats.folder import folder_source, reference_classes, split_dir
from selfsup.data.formats.shards import shard_source
from selfsup.data.imagedata import DataError, ImageData, convert_channels, resize_images, subset_indices

__all__ = ["DATASETS", "STREAMABLE", "DataError", "ImageData", "ImageSource", "default_root", "load_dataset",
           "open_images"]

DATASETS: tuple[str, ...] = (
    "fashion_mnist",
    "mnist",
    "cifar10",
    "cifar100",
    "stl10",
    "imagefolder",
    "shards",
    "tensors",
    "digits",
)

# Datasets of encoded image files, which can be streamed instead of decoded into memory.
STREAMABLE: tuple[str, ...] = ("imagefolder", "shards")

# Directories that system packages install datasets into (Debian: dataset-fashion-mnist).
# Debian ships no MNIST package, so MNIST has no system default.
_SYSTEM_ROOTS: dict[str, str] = {"fashion_mnist": "/usr/share/datasets/fashion-mnist"}

_SPLITS: dict[str, tuple[str, ...]] = {
    "fashion_mnist": ("train", "test"),
    "mnist": ("train", "test"),
    "cifar10": ("train", "test"),
    "cifar100": ("train", "test"),
    "stl10": ("train", "test", "unlabeled", "train+unlabeled"),
    "digits": ("train", "test"),
}


def default_root(name: str) -> str | None:
    """Directory searched when ``root`` is None.

    The system path (Debian package) when it exists, else ``$SELFSUP_DATA/<name>`` when that
    variable is set, else the system path (so errors say where files were expected), else None.
    """
    _check_name(name)
    system = _SYSTEM_ROOTS.get(name)
    if system is not None and os.path.isdir(system):
        return system
    base = os.environ.get("SELFSUP_DATA")
    if base:
        return os.path.join(base, name)
    return system


def open_images(name: str, split: str = "train", root: str | None = None,
                allow_incomplete_shards: bool = False) -> ImageSource:
    """A split of an image folder or a shard folder, listed but not decoded.

    ``root/<split>`` is used when it exists; "train" falls back to ``root`` itself. A folder's other
    splits are labelled with the training split's class folders (by name), so labels agree across
    splits; ``selfsup shard`` writes those labels into the shards. ``allow_incomplete_shards``: read shards that
    hold fewer samples than their index lists, with a warning (otherwise an error).
    """
    _check_name(name)
    if name not in STREAMABLE:
        raise DataError(f"{name} is not a dataset of image files; only {' and '.join(STREAMABLE)} can be streamed "
                        f"(set data.stream=false: {name} is loaded into memory)")
    base = _require_root(name, root)
    folder = split_dir(base, split, name)
    if name == "shards":
        return shard_source(folder, allow_incomplete=allow_incomplete_shards)
    return folder_source(folder, reference_classes(base, split))


def load_dataset(
    name: str,
    split: str = "train",
    root: str | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    fraction: float = 1.0,
    seed: int = 0,
    progress: bool = True,
    allow_incomplete_shards: bool = False,
) -> ImageData:
    """Load a dataset split into memory as uint8 (N, C, H, W).

    name: one of :data:`DATASETS`.
    split: "train" / "test" (STL-10 also "unlabeled", "train+unlabeled"). For imagefolder, shards
        and tensors, ``root/<split>`` (a folder, or ``<split>.pt`` / ``<split>.npz``) is used when it
        exists; "train" falls back to ``root`` itself (see :func:`open_images` for the labels).
    root: data location; None uses :func:`default_root`.
    image_size: output side length; images are resized (antialiased bilinear; image files with PIL
        bicubic at decode time), non-square ones on the shorter side followed by a center crop.
        Required for image files that differ in size.
    channels: 1 or 3; converts gray->RGB by repetition and RGB->gray by luminance.
    fraction: keep a seeded random subset of round(fraction * N) images (at least one).
    seed: seed of that subset.
    progress: show a progress bar while decoding image files.
    allow_incomplete_shards: shards with fewer samples than their index lists are read (with a warning), not refused.
    """
    _check_name(name)
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise DataError(f"fraction must be in (0, 1]; got {fraction!r} (use 1.0 to keep everything)")
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise DataError(f"image_size must be a positive int or None; got {image_size!r}")
    if channels is not None and channels not in (1, 3):
        raise DataError(f"channels must be 1, 3 or None; got {channels!r}")
    if name in _SPLITS and split not in _SPLITS[name]:
        raise DataError(f"unknown split {split!r} for {name}; choose one of {list(_SPLITS[name])}")

    def select(n: int):
        return subset_indices(n, fraction, seed)

    if name in ("fashion_mnist", "mnist"):
        data = idx.load_idx(name, split, _resolve_root(name, root), select)
    elif name in ("cifar10", "cifar100"):
        data = cifar.load_cifar(name, split, _resolve_root(name, root), select)
    elif name == "stl10":
        data = stl10.load_stl10(split, _resolve_root(name, root), select)
    elif name in STREAMABLE:
        source = open_images(name, split, root, allow_incomplete_shards)
        data = decode_all(source, image_size, channels or 3, select(len(source)), progress)
    elif name == "tensors":
        data = tensors.load_tensors(tensors.split_file(_require_root(name, root), split), select)
    else:
        data = digits.load_digits(split, select)

    images = data.images
    if channels is not None:
        images = convert_channels(images, channels)
    if image_size is not None:
        images = resize_images(images, image_size)
    if images is not data.images:
        data = ImageData(images, data.labels, data.classes, data.skipped, data.paths)
    return data


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def _resolve_root(name: str, root: str | None) -> Path:
    if root is not None:
        return Path(root).expanduser()
    found = default_root(name)
    if found is None:
        hint = idx.missing_hint(name) if name in ("fashion_mnist", "mnist") else (
            f"pass root=DIR (config: data.root=DIR) or set SELFSUP_DATA=BASE so that "
            f"BASE/{name} holds the files")
        raise FileNotFoundError(f"no data location for {name}: {hint}")
    return Path(found)


def _require_root(name: str, root: str | None) -> Path:
    if root is None:
        raise DataError(f"dataset {name!r} needs root=PATH (config: data.root=PATH)")
    path = Path(root).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{name} root {path} does not exist; check data.root")
    return path
