"""In-memory image datasets: IDX (MNIST / Fashion-MNIST), CIFAR pickles, STL-10 binary,
image folders, saved tensors and scikit-learn digits.

Every loader returns an :class:`ImageData` holding one contiguous uint8 tensor of shape
(N, C, H, W), so a training loop batches by indexing and needs no DataLoader workers.
"""

from __future__ import annotations

import gzip
import importlib
import os
import pickle
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from tqdm.auto import tqdm

__all__ = ["DATASETS", "DataError", "ImageData", "default_root", "load_dataset", "load_image_files"]

DATASETS: tuple[str, ...] = (
    "fashion_mnist",
    "mnist",
    "cifar10",
    "cifar100",
    "stl10",
    "imagefolder",
    "tensors",
    "digits",
)

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".bmp")

FASHION_MNIST_CLASSES: list[str] = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]

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

_STL_SHAPE = (3, 96, 96)
_STL_BYTES = 3 * 96 * 96
_DIGITS_TRAIN = 1500
_RESIZE_CHUNK = 512
_LUMA = (0.299, 0.587, 0.114)
_MAX_LISTED = 10


class DataError(ValueError):
    """A dataset is missing, malformed or unreadable; the message names the file or folder and the fix."""


@dataclass
class ImageData:
    """A whole dataset split in memory.

    images: uint8 (N, C, H, W) with C in {1, 3}, contiguous.
    labels: int64 (N,), or None when the split has no labels.
    classes: class names indexed by label, or None.
    skipped: paths (or ids) of unreadable images that were left out.
    paths: the file of each image (image folders), or None.
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    classes: list[str] | None
    skipped: list[str] = field(default_factory=list)
    paths: list[str] | None = None

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise DataError(
                f"ImageData.images must be uint8 (N, C, H, W); got {self.images.dtype} "
                f"{tuple(self.images.shape)}"
            )
        if self.images.shape[1] not in (1, 3):
            raise DataError(f"ImageData.images must have 1 or 3 channels; got {self.images.shape[1]}")
        self.images = self.images.contiguous()
        if self.labels is not None:
            if self.labels.dtype != torch.int64 or self.labels.shape != (len(self.images),):
                raise DataError(
                    f"ImageData.labels must be int64 of shape ({len(self.images)},); got "
                    f"{self.labels.dtype} {tuple(self.labels.shape)}"
                )

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, indices: torch.Tensor | Sequence[int]) -> ImageData:
        """Return the rows at ``indices`` (a new ImageData; classes and skipped are kept)."""
        idx = torch.as_tensor(indices)
        if idx.dtype != torch.bool:
            idx = idx.to(torch.int64)
        labels = None if self.labels is None else self.labels[idx]
        paths = None if self.paths is None else [self.paths[i] for i in torch.arange(len(self))[idx].tolist()]
        return ImageData(self.images[idx].contiguous(), labels, self.classes, list(self.skipped), paths)


# ----------------------------------------------------------------------------- public API


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


def load_dataset(
    name: str,
    split: str = "train",
    root: str | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    fraction: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> ImageData:
    """Load a dataset split into memory as uint8 (N, C, H, W).

    name: one of :data:`DATASETS`.
    split: "train" / "test" (STL-10 also "unlabeled", "train+unlabeled"). For imagefolder and
        tensors, ``root/<split>`` (a folder, or ``<split>.pt`` / ``<split>.npz``) is used when it
        exists; "train" falls back to ``root`` itself. An image folder's other splits are labelled
        with the training split's class folders (by name), so labels agree across splits.
    root: data location; None uses :func:`default_root`.
    image_size: output side length; images are resized (antialiased bilinear; image folders
        with PIL bicubic at decode time), non-square ones on the shorter side followed by a
        center crop. Required for image folders whose images differ in size.
    channels: 1 or 3; converts gray->RGB by repetition and RGB->gray by luminance.
    fraction: keep a seeded random subset of round(fraction * N) images (at least one).
    seed: seed of that subset.
    progress: show a progress bar while decoding image folders.
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

    def select(n: int) -> torch.Tensor | None:
        return _subset_indices(n, fraction, seed)

    if name in ("fashion_mnist", "mnist"):
        data = _load_idx(name, split, _resolve_root(name, root), select)
    elif name in ("cifar10", "cifar100"):
        data = _load_cifar(name, split, _resolve_root(name, root), select)
    elif name == "stl10":
        data = _load_stl10(split, _resolve_root(name, root), select)
    elif name == "imagefolder":
        folder_root = _require_root(name, root)
        folder = _split_dir(folder_root, split)
        paths, labels, classes = _scan_folder(folder, _reference_classes(folder_root, split))
        data = _decode_files(folder, paths, labels, classes, image_size, channels or 3, select, progress)
    elif name == "tensors":
        data = _load_tensors(_split_file(_require_root(name, root), split), select)
    else:
        data = _load_digits(split, select)

    images = data.images
    if channels is not None:
        images = _convert_channels(images, channels)
    if image_size is not None:
        images = _resize(images, image_size)
    if images is not data.images:
        data = ImageData(images, data.labels, data.classes, data.skipped, data.paths)
    return data


# ----------------------------------------------------------------------------- helpers


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def _subset_indices(n: int, fraction: float, seed: int) -> torch.Tensor | None:
    """Sorted seeded subset of range(n) of size round(fraction * n), or None for everything."""
    if fraction >= 1.0:
        return None
    keep = max(1, round(fraction * n))
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[:keep].sort().values


def _resolve_root(name: str, root: str | None) -> Path:
    if root is not None:
        return Path(root).expanduser()
    found = default_root(name)
    if found is None:
        hint = _idx_missing_hint(name) if name in ("fashion_mnist", "mnist") else (
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


def _split_dir(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DataError(f"imagefolder root {root} is not a directory; check data.root")
    if (root / split).is_dir():
        return root / split
    if split == "train":
        return root
    raise FileNotFoundError(
        f"imagefolder split {split!r}: expected a folder {root / split}; use split='train' to "
        f"read {root} itself"
    )


def _split_file(root: Path, split: str) -> Path:
    if root.is_file():
        return root
    for ext in (".pt", ".npz"):
        if (root / f"{split}{ext}").is_file():
            return root / f"{split}{ext}"
    raise FileNotFoundError(
        f"tensors: expected {root / (split + '.pt')} or {root / (split + '.npz')}; or pass "
        f"root=FILE.pt|FILE.npz"
    )


def _convert_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    c = images.shape[1]
    if c == channels:
        return images
    if channels == 3:
        return images.expand(-1, 3, -1, -1).contiguous()
    out = torch.empty((images.shape[0], 1, *images.shape[2:]), dtype=torch.uint8)
    weights = torch.tensor(_LUMA).view(1, 3, 1, 1)
    for start in range(0, len(images), _RESIZE_CHUNK):
        chunk = images[start:start + _RESIZE_CHUNK].float()
        gray = (chunk * weights).sum(1, keepdim=True)
        out[start:start + _RESIZE_CHUNK] = gray.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize to size x size: shorter side to ``size`` (antialiased bilinear), then center crop."""
    n, c, h, w = images.shape
    if h == size and w == size:
        return images
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    top, left = (new_h - size) // 2, (new_w - size) // 2
    out = torch.empty((n, c, size, size), dtype=torch.uint8)
    for start in range(0, n, _RESIZE_CHUNK):
        chunk = images[start:start + _RESIZE_CHUNK].float()
        if (new_h, new_w) != (h, w):
            chunk = F.interpolate(chunk, size=(new_h, new_w), mode="bilinear",
                                  align_corners=False, antialias=True)
        chunk = chunk[:, :, top:top + size, left:left + size]
        out[start:start + _RESIZE_CHUNK] = chunk.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _take(images: torch.Tensor, labels: torch.Tensor | None, idx: torch.Tensor | None,
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if idx is None:
        return images, labels
    return images[idx].contiguous(), (None if labels is None else labels[idx])


# ----------------------------------------------------------------------------- IDX


_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049


def _idx_missing_hint(name: str) -> str:
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
        f"{name}: expected {stem} or {stem}.gz in {root}; {_idx_missing_hint(name)}"
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


def _load_idx(name: str, split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    prefix = "train" if split == "train" else "t10k"
    img_path = _find_idx_file(root, f"{prefix}-images-idx3-ubyte", name)
    lbl_path = _find_idx_file(root, f"{prefix}-labels-idx1-ubyte", name)
    images = _read_idx(img_path, _IDX_IMAGES_MAGIC, 3)
    labels = _read_idx(lbl_path, _IDX_LABELS_MAGIC, 1)
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels")
    img_t = torch.from_numpy(images.copy()).unsqueeze(1)
    lbl_t = torch.from_numpy(labels.astype(np.int64))
    img_t, lbl_t = _take(img_t, lbl_t, select(len(img_t)))
    classes = FASHION_MNIST_CLASSES if name == "fashion_mnist" else [str(i) for i in range(10)]
    return ImageData(img_t.contiguous(), lbl_t, list(classes), [])


# ----------------------------------------------------------------------------- CIFAR


_CIFAR = {
    "cifar10": {
        "folder": "cifar-10-batches-py",
        "archive": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "train": [f"data_batch_{i}" for i in range(1, 6)],
        "test": ["test_batch"],
        "meta": "batches.meta",
        "label_key": b"labels",
        "names_key": b"label_names",
    },
    "cifar100": {
        "folder": "cifar-100-python",
        "archive": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "train": ["train"],
        "test": ["test"],
        "meta": "meta",
        "label_key": b"fine_labels",
        "names_key": b"fine_label_names",
    },
}

# The only globals a CIFAR pickle needs: numpy array reconstruction and latin-1 bytes.
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays: a CIFAR file cannot run arbitrary code."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _PICKLE_ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a dataset file")
        if module.startswith("numpy.core."):
            try:
                return getattr(importlib.import_module("numpy._core." + module[len("numpy.core."):]), name)
            except ImportError:
                pass
        return getattr(importlib.import_module(module), name)


def _read_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = _SafeUnpickler(f, encoding="bytes").load()
    except Exception as err:  # any unpickling failure means a corrupt or foreign file
        raise DataError(f"{path}: not a valid CIFAR python pickle ({err}); re-extract the archive") from err
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _cifar_dir(name: str, root: Path) -> Path:
    spec = _CIFAR[name]
    for candidate in (root / spec["folder"], root):
        if (candidate / spec["meta"]).is_file() or (candidate / spec["test"][0]).is_file():
            return candidate
    raise FileNotFoundError(
        f"{name}: no extracted archive found at {root}. Download {spec['archive']} (no download "
        f"is done here), extract it so that {root / spec['folder']} holds "
        f"{', '.join(spec['train'] + spec['test'] + [spec['meta']])}, and pass root={root} "
        f"(config: data.root=...) pointing at that folder or its parent"
    )


def _load_cifar(name: str, split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    spec = _CIFAR[name]
    folder = _cifar_dir(name, root)
    images, labels = [], []
    for batch in spec[split]:
        path = folder / batch
        if not path.is_file():
            raise FileNotFoundError(f"{name}: missing {path}; re-extract {spec['archive']} into {root}")
        obj = _read_pickle(path)
        for key in (b"data", spec["label_key"]):
            if key not in obj:
                raise DataError(f"{path}: key {key!r} missing; not a {name} batch file")
        data = np.asarray(obj[b"data"])
        lab = np.asarray(obj[spec["label_key"]], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(f"{path}: b'data' must be uint8 (N, 3072); got {data.dtype} {data.shape}")
        if lab.shape != (len(data),):
            raise DataError(f"{path}: {len(data)} images but labels of shape {lab.shape}")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(lab)
    classes = None
    meta = folder / spec["meta"]
    if meta.is_file():
        names = _read_pickle(meta).get(spec["names_key"])
        if names is not None:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    img_t = torch.from_numpy(np.concatenate(images))
    lbl_t = torch.from_numpy(np.concatenate(labels))
    img_t, lbl_t = _take(img_t, lbl_t, select(len(img_t)))
    return ImageData(img_t.contiguous(), lbl_t, classes, [])


# ----------------------------------------------------------------------------- STL-10


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


def _load_stl10(split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
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


# ----------------------------------------------------------------------------- image folders


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


def _iter_images(folder: Path) -> Iterator[Path]:
    """The images under ``folder`` (hidden files and folders skipped), lazily, in walk order."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        yield from (p for p in (Path(dirpath) / f for f in sorted(filenames)) if _is_image(p))


def _images_under(folder: Path) -> list[Path]:
    return list(_iter_images(folder))


def _class_folders(root: Path) -> list[str]:
    """Names of the sub-folders of ``root`` that hold at least one image (the classes), sorted.

    Stops at each folder's first image, so a large training split is not listed twice."""
    return [d.name for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith(".") and next(_iter_images(d), None) is not None]


def _reference_classes(root: Path, split: str) -> list[str] | None:
    """The training split's class names, which label every other split of the same image folder.

    None for the training split itself, or when the training split has no class folders.
    """
    if split == "train":
        return None
    train = root / "train" if (root / "train").is_dir() else root
    classes = [c for c in _class_folders(train) if train != root or c != split]
    return classes or None


def _scan_folder(root: Path, reference: list[str] | None = None) -> tuple[list[Path], list[int] | None, list[str] | None]:
    """Image paths, their labels and class names (labels/classes None when there are no class folders).

    ``reference``: class names of the training split; labels are their indices, matched by folder
    name, so a split that lacks a class (or has an empty class folder) keeps the training labels.
    """
    direct = sorted(p for p in root.iterdir() if _is_image(p))
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    per_class = [(d.name, _images_under(d)) for d in subdirs]
    per_class = [(n, files) for n, files in per_class if files]
    if per_class and direct:
        raise DataError(
            f"{root} holds both images ({direct[0].name}, ...) and class folders "
            f"({per_class[0][0]}, ...); move the loose images into a class folder, or point "
            f"root at a folder of one kind"
        )
    if per_class:
        classes = reference if reference is not None else [n for n, _ in per_class]
        index = {name: i for i, name in enumerate(classes)}
        unseen = [n for n, _ in per_class if n not in index]
        if unseen:
            raise DataError(
                f"{root} has class folders without training images: {', '.join(unseen[:_MAX_LISTED])} "
                f"(training classes: {', '.join(classes[:_MAX_LISTED])}{', ...' if len(classes) > _MAX_LISTED else ''}); "
                f"add their training images or remove them from this split"
            )
        paths, labels = [], []
        for name, files in per_class:
            paths.extend(files)
            labels.extend([index[name]] * len(files))
        return paths, labels, list(classes)
    if not direct:
        raise DataError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {root} or its sub-folders; "
            f"check data.root"
        )
    return direct, None, None


def _decode(path: Path, size: int | None, mode: str) -> np.ndarray:
    """Decode one image to (H, W, C) uint8, resized on the shorter side and center-cropped."""
    with Image.open(path) as im:
        if size is not None:
            im.draft(None, (size, size))  # JPEG: decode at a reduced scale when possible
        im.load()
        im = ImageOps.exif_transpose(im).convert(mode)
    if size is not None:
        w, h = im.size
        scale = size / min(w, h)
        new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
        if (new_w, new_h) != (w, h):
            im = im.resize((new_w, new_h), Image.Resampling.BICUBIC)
        left, top = (new_w - size) // 2, (new_h - size) // 2
        im = im.crop((left, top, left + size, top + size))
    arr = np.asarray(im, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def load_image_files(folder: str | Path, image_size: int | None = None, channels: int = 3,
                     progress: bool = True) -> ImageData:
    """Every image under ``folder`` (loose files and sub-folders alike, sorted by path), unlabelled.

    For embedding a folder: ``paths`` gives the file of each row, ``skipped`` the unreadable ones.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(f"{root} is not a directory of images; pass the folder that holds them")
    paths = sorted(_images_under(root))
    if not paths:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {root} or its sub-folders")
    return _decode_files(root, paths, None, None, image_size, channels, lambda n: None, progress)


def _decode_files(root: Path, paths: list[Path], labels: list[int] | None, classes: list[str] | None,
                  image_size: int | None, channels: int, select: Callable[[int], torch.Tensor | None],
                  progress: bool) -> ImageData:
    """Decode ``paths`` (a seeded subset of them) in threads; unreadable files are skipped and reported once."""
    idx = select(len(paths))
    if idx is not None:
        paths = [paths[i] for i in idx.tolist()]
        labels = None if labels is None else [labels[i] for i in idx.tolist()]
    mode = "L" if channels == 1 else "RGB"

    def work(path: Path) -> np.ndarray | None:
        try:
            return _decode(path, image_size, mode)
        except Exception:  # any undecodable file is skipped and reported once below
            return None

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(work, paths)
        if progress:
            results = tqdm(results, total=len(paths), desc=f"decoding {root.name}", unit="img")
        arrays = list(results)

    ok = [i for i, a in enumerate(arrays) if a is not None]
    skipped = [str(paths[i]) for i, a in enumerate(arrays) if a is None]
    if not ok:
        raise DataError(f"none of the {len(paths)} images in {root} could be decoded; check the files")
    if skipped:
        names = [os.path.relpath(p, root) for p in skipped]
        listed = ", ".join(names[:_MAX_LISTED])
        more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
        warnings.warn(
            f"skipped {len(skipped)} unreadable images of {len(paths)}: {listed}{more}",
            stacklevel=3,
        )
    shapes = {arrays[i].shape for i in ok}
    if len(shapes) > 1:
        by_shape: dict[tuple[int, ...], Path] = {}
        for i in ok:
            by_shape.setdefault(arrays[i].shape, paths[i])
        examples = "; ".join(f"{p.name} is {s[1]}x{s[0]}" for s, p in list(by_shape.items())[:3])
        raise DataError(
            f"images in {root} have different sizes ({examples}); pass image_size=N "
            f"(config: data.image_size=N) to resize and center-crop them"
        )
    images = torch.from_numpy(np.stack([arrays[i] for i in ok])).permute(0, 3, 1, 2).contiguous()
    lbl = None if labels is None else torch.tensor([labels[i] for i in ok], dtype=torch.int64)
    return ImageData(images, lbl, classes, skipped, [str(paths[i]) for i in ok])


# ----------------------------------------------------------------------------- tensors


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


def _load_tensors(path: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
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
    images, labels = _take(images, labels, select(len(images)))
    return ImageData(images, labels, classes, [])


# ----------------------------------------------------------------------------- digits


def _load_digits(split: str, select: Callable[[int], torch.Tensor | None]) -> ImageData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    part = slice(0, _DIGITS_TRAIN) if split == "train" else slice(_DIGITS_TRAIN, None)
    images = torch.from_numpy(pixels[part].copy()).unsqueeze(1)
    labels = torch.from_numpy(bunch.target[part].astype(np.int64))
    images, labels = _take(images, labels, select(len(images)))
    return ImageData(images.contiguous(), labels, [str(i) for i in range(10)], [])
