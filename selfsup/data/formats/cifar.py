"""CIFAR-10 / CIFAR-100: the python pickles of the official archives, read with an unpickler that only
rebuilds numpy arrays."""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from selfsup.data.imagedata import DataError, ImageData, take


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


def load_cifar(name: str, split: str, root: Path, select: Callable[[int], torch.Tensor | None]) -> ImageData:
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
    img_t, lbl_t = take(img_t, lbl_t, select(len(img_t)))
    return ImageData(img_t.contiguous(), lbl_t, classes, [])
