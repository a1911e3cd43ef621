"""Image folders: ``root/<class>/**/*.jpg`` (labelled) or loose images (unlabelled), one folder per split.

Listing a folder never opens an image, and walks the tree with ``os.scandir`` (no ``stat`` per
file), so an ImageNet-size folder is indexed in seconds; images are decoded later, all at once
(in memory) or one by one in loader workers (streaming).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from selfsup.data.imagedata import MAX_LISTED, DataError

__all__ = ["IMAGE_EXTENSIONS", "FolderSource", "folder_source", "split_dir"]

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _iter_images(folder: Path) -> Iterator[str]:
    """Paths of the images under ``folder`` (hidden files and folders skipped), lazily, in sorted walk order."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        yield from (os.path.join(dirpath, f) for f in sorted(filenames) if _is_image_name(f))


def _class_folders(root: Path) -> list[str]:
    """Names of the sub-folders of ``root`` that hold at least one image (the classes), sorted.

    Stops at each folder's first image, so a large training split is not listed twice."""
    return [d.name for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith(".") and next(_iter_images(d), None) is not None]


def reference_classes(root: Path, split: str) -> list[str] | None:
    """The training split's class names, which label every other split of the same image folder.

    None for the training split itself, or when the training split has no class folders.
    """
    if split == "train":
        return None
    train = root / "train" if (root / "train").is_dir() else root
    classes = [c for c in _class_folders(train) if train != root or c != split]
    return classes or None


def split_dir(root: Path, split: str, kind: str = "imagefolder") -> Path:
    """``root/<split>`` when it exists; the training split falls back to ``root`` itself."""
    if not root.is_dir():
        raise DataError(f"{kind} root {root} is not a directory; check data.root")
    if (root / split).is_dir():
        return root / split
    if split == "train":
        return root
    raise FileNotFoundError(f"{kind} split {split!r}: expected a folder {root / split}; use split='train' to "
                            f"read {root} itself")


class FolderSource:
    """The images of one folder split as an :class:`~selfsup.data.decode.ImageSource`.

    Paths are stored relative to ``root`` in one numpy bytes array (cheap to send to workers).
    """

    def __init__(self, root: Path, paths: list[str], labels: list[int] | None, classes: list[str] | None) -> None:
        self.root = Path(root)
        prefix = len(str(self.root).rstrip(os.sep)) + 1
        self._paths = np.array([os.fsencode(p[prefix:]) for p in paths], dtype=np.bytes_)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.classes = classes

    def __len__(self) -> int:
        return len(self._paths)

    def name(self, index: int) -> str:
        return os.fsdecode(self._paths[index])

    def open(self, index: int) -> str:
        return os.path.join(self.root, self.name(index))

    def size(self, index: int) -> int:
        """The file's size in bytes (a stat, no read)."""
        return os.stat(self.open(index)).st_size


def folder_source(root: Path, reference: list[str] | None = None) -> FolderSource:
    """Scan one split: class folders give labels (indices into ``reference``, the training split's
    classes, matched by name, when given); loose images give an unlabelled split."""
    entries = sorted(os.scandir(root), key=lambda e: e.name)
    direct = [e.path for e in entries if e.is_file() and _is_image_name(e.name)]
    subdirs = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    per_class = [(d.name, list(_iter_images(Path(d.path)))) for d in subdirs]
    per_class = [(n, files) for n, files in per_class if files]
    if per_class and direct:
        raise DataError(
            f"{root} holds both images ({os.path.basename(direct[0])}, ...) and class folders "
            f"({per_class[0][0]}, ...); move the loose images into a class folder, or point "
            f"root at a folder of one kind"
        )
    if per_class:
        classes = reference if reference is not None else [n for n, _ in per_class]
        index = {name: i for i, name in enumerate(classes)}
        unseen = [n for n, _ in per_class if n not in index]
        if unseen:
            raise DataError(
                f"{root} has class folders without training images: {', '.join(unseen[:MAX_LISTED])} "
                f"(training classes: {', '.join(classes[:MAX_LISTED])}{', ...' if len(classes) > MAX_LISTED else ''}); "
                f"add their training images or remove them from this split"
            )
        paths, labels = [], []
        for name, files in per_class:
            paths.extend(files)
            labels.extend([index[name]] * len(files))
        return FolderSource(root, paths, labels, list(classes))
    if not direct:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {root} or its sub-folders; "
                        f"check data.root")
    return FolderSource(root, direct, None, None)


def all_images(root: Path) -> FolderSource:
    """Every image under ``root``, loose files and sub-folders alike, sorted by path, unlabelled."""
    if not root.is_dir():
        raise DataError(f"{root} is not a directory of images; pass the folder that holds them")
    paths = sorted(_iter_images(root))
    if not paths:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {root} or its sub-folders")
    return FolderSource(root, paths, None, None)
