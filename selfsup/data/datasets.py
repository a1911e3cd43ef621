"""Datasets by name: one entry point over the on-disk formats of :mod:`selfsup.data.formats`.

- :func:`load_dataset`: a split decoded into memory as one uint8 (N, C, H, W) tensor
  (:class:`ImageData`), so a training loop batches by indexing: IDX (MNIST / Fashion-MNIST),
  CIFAR pickles, STL-10 binary, saved tensors, scikit-learn digits, image folders and tar shards.
- :func:`open_images`: a split of encoded image files, not decoded (:class:`ImageSource`), for the
  streaming path (:mod:`selfsup.data.stream`): image folders and WebDataset tar shards.
- :func:`resolve_eval_split`: the split evaluation tests on (``data.eval_split``, ``auto`` resolved: val, test,
  or a stratified hold-out of the labelled images), the one answer every evaluation reads.

An image folder's labels come from its class folders, or from a CSV (``data.labels``,
:mod:`selfsup.data.formats.label_csv`) that labels a subset of its images.

Both paths share the decoders of :mod:`selfsup.data.decode`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from selfsup.data.decode import ImageSource, decode_all
from selfsup.data.formats import cifar, digits, idx, stl10, tensors
from selfsup.data.formats.folder import folder_source, reference_classes, split_dir
from selfsup.data.formats.label_csv import labelled_source, read_label_csv
from selfsup.data.formats.shards import shard_source
from selfsup.data.imagedata import DataError, ImageData, convert_channels, resize_images, subset_indices

if TYPE_CHECKING:
    from selfsup.config import DataConfig

__all__ = ["AUTO_HOLDOUT", "DATASETS", "STORED_SHAPES", "STREAMABLE", "DataError", "EvalSplit", "ImageData",
           "ImageSource", "default_root", "has_split", "load_dataset", "open_images", "resolve_eval_split"]

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

# (channels, side) of the built-in datasets' images as stored (image folders, shards and tensors: whatever the files
# hold); what ``selfsup bench --synthetic`` makes its random images like when data.image_size / data.channels are unset.
STORED_SHAPES: dict[str, tuple[int, int]] = {
    "fashion_mnist": (1, 28),
    "mnist": (1, 28),
    "cifar10": (3, 32),
    "cifar100": (3, 32),
    "stl10": (3, 96),
    "digits": (1, 8),
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


def open_images(name: str, split: str = "train", root: str | None = None, allow_incomplete_shards: bool = False,
                labels: str | None = None, eval_splits: Sequence[str] = ()) -> ImageSource:
    """A split of an image folder or a shard folder, listed but not decoded.

    ``root/<split>`` is used when it exists; "train" falls back to ``root`` itself. A folder's other
    splits are labelled with the training split's class folders (by name), so labels agree across
    splits; ``selfsup shard`` writes those labels into the shards. ``allow_incomplete_shards``: read shards that
    hold fewer samples than their index lists, with a warning (otherwise an error).
    ``labels``: a label CSV (``data.labels``; image folders only): the split is its labelled images alone, those
    of the ``eval_splits`` folders held out of any other split (``label_csv.labelled_source``).
    """
    _check_name(name)
    if name not in STREAMABLE:
        raise DataError(f"{name} is not a dataset of image files; only {' and '.join(STREAMABLE)} can be streamed "
                        f"(set data.stream=false: {name} is loaded into memory)")
    if labels is not None and name != "imagefolder":
        raise DataError(f"data.labels={labels} labels the images of a folder; data.dataset is {name}: set "
                        f"data.dataset=imagefolder, or data.labels=null")
    base = _require_root(name, root)
    folder = split_dir(base, split, name)
    if name == "shards":
        return shard_source(folder, allow_incomplete=allow_incomplete_shards)
    if labels is not None:
        return labelled_source(read_label_csv(labels, base), split, folder, eval_splits)
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
    labels: str | None = None,
    eval_splits: Sequence[str] = (),
) -> ImageData:
    """Load a dataset split into memory as uint8 (N, C, H, W).

    name: one of :data:`DATASETS`.
    split: "train" / "test" (STL-10 also "unlabeled", "train+unlabeled"). For imagefolder, shards
        and tensors, ``root/<split>`` (a folder, or ``<split>.pt`` / ``<split>.npz``) is used when it
        exists; "train" falls back to ``root`` itself (see :func:`open_images` for the labels).
    root: data location; None uses :func:`default_root`.
    image_size: output side length; images are resized (antialiased bilinear: torch's for arrays, PIL's for
        image files at decode time), non-square ones on the shorter side followed by a center crop.
        Required for image files that differ in size.
    channels: 1 or 3; converts gray->RGB by repetition and RGB->gray by luminance.
    fraction: keep a seeded random subset of round(fraction * N) images (at least one).
    seed: seed of that subset.
    progress: show a progress bar while decoding image files.
    allow_incomplete_shards: shards with fewer samples than their index lists are read (with a warning), not refused.
    labels, eval_splits: an image folder's label CSV and the evaluation splits it holds out (see :func:`open_images`).
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
        source = open_images(name, split, root, allow_incomplete_shards, labels, eval_splits)
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


def has_split(name: str, split: str, root: str | None = None, labels: str | None = None) -> bool:
    """Whether the dataset has ``split``, checked without reading an image: a built-in dataset's files, a folder
    ``root/<split>`` (with a label CSV: holding a labelled image), a tensors file ``root/<split>.pt|.npz``.
    A missing root is no split. A label CSV that cannot be read is its DataError."""
    _check_name(name)
    if name in _SPLITS and split not in _SPLITS[name]:
        return False
    if name == "digits":  # scikit-learn's, always there
        return True
    try:
        base = _resolve_root(name, root) if name in _SPLITS else _require_root(name, root)
        if name in STREAMABLE:
            folder = base / split
            return folder.is_dir() and (labels is None or bool(read_label_csv(labels, base).under(folder)))
        if name == "tensors":
            return base.is_dir() and tensors.split_file(base, split).is_file()
        return all(path.is_file() for path in _split_files(name, split, base))
    except FileNotFoundError:
        return False


def _split_files(name: str, split: str, base: Path) -> list[Path]:
    """The files a built-in dataset's split is read from, named as its format module names them (each finds its
    folder under ``base``; a FileNotFoundError when it cannot)."""
    if name in ("fashion_mnist", "mnist"):
        prefix = "train" if split == "train" else "t10k"
        return [idx._find_idx_file(base, stem, name)
                for stem in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")]
    if name in ("cifar10", "cifar100"):
        folder = cifar._cifar_dir(name, base)
        return [folder / batch for batch in cifar._CIFAR[name][split]]
    folder = stl10._stl_dir(base)
    return [folder / f"{part}_X.bin" for part in split.split("+")]


# eval.holdout's fraction when data.eval_split=auto finds no val or test split: a fifth of the labelled images
# (a few hundred labels leave ~20 per class of 3-5 classes to test on, and 80 % to fit).
AUTO_HOLDOUT = 0.2


@dataclass(frozen=True)
class EvalSplit:
    """What evaluation tests on: the split ``name``, or (``name`` None) a stratified, seeded ``holdout`` fraction of
    the labelled training split; ``why`` is the log line that says which and why."""

    name: str | None
    holdout: float | None
    why: str


def resolve_eval_split(d: DataConfig, holdout: float | None = None) -> EvalSplit:
    """``data.eval_split`` resolved: ``eval.holdout`` (``holdout``) set wins; a named split is that split; ``auto``
    is ``val`` when the dataset has it, else ``test``, else a hold-out of :data:`AUTO_HOLDOUT` of the labelled
    training images. Every reader of the evaluation split (eval, fine-tuning, the kNN monitor, the report) asks
    here, so they agree. Checks that files exist; reads no image."""
    if holdout is not None:
        return EvalSplit(None, holdout, f"eval.holdout={holdout:g}: evaluating on a stratified hold-out of "
                                        f"{holdout * 100:g}% of the labelled training images")
    if d.eval_split != "auto":
        return EvalSplit(d.eval_split, None, f"data.eval_split={d.eval_split}: evaluating on "
                                             f"{d.dataset}/{d.eval_split}")
    for split in ("val", "test"):
        if has_split(d.dataset, split, d.root, d.labels):
            where = f" ({Path(d.root) / split})" if d.dataset in STREAMABLE and d.root else ""
            return EvalSplit(split, None, f"data.eval_split=auto: evaluating on {d.dataset}/{split}{where}")
    missing = f"{d.labels} labels no image of a val or test split" if d.labels else \
        f"{d.dataset} has no val or test split"
    labelled = "images it labels" if d.labels else "labelled training images"
    return EvalSplit(None, AUTO_HOLDOUT, f"data.eval_split=auto: {missing}; evaluating on a stratified hold-out of "
                                         f"{AUTO_HOLDOUT * 100:g}% of the {labelled} (eval.holdout=F sets the "
                                         f"fraction, data.eval_split=SPLIT names a split)")


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
