"""Image folders: ``root/<class>/**/*.jpg`` (labelled) or loose images (unlabelled), one folder per split.

Listing a folder never opens an image, and walks the tree with ``os.scandir`` (no ``stat`` per
file), so an ImageNet-size folder is indexed in seconds; images are decoded later, all at once
(in memory) or one by one in loader workers (streaming). Files are chosen by extension
(:data:`IMAGE_EXTENSIONS`); every other file that is not hidden is kept as *not read*, with its reason
(:func:`not_read_reason`: what it is and how to convert it), so that whoever reads the split lists it
beside the files that turn out empty or undecodable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from selfsup.data.imagedata import MAX_LISTED, DataError, skipped_line

__all__ = ["IMAGE_EXTENSIONS", "FolderSource", "all_images", "folder_source", "not_read_reason", "split_dir"]

# The extensions read (case-insensitive): the formats Pillow decodes that cameras, phones, scanners and image tools
# write. Multi-frame files (GIF, TIFF) give their first frame.
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".dib", ".tif",
                                     ".tiff", ".gif", ".avif", ".ppm", ".pgm", ".pbm", ".pnm")

_CONVERT = "convert it to JPEG, PNG or TIFF"
# Formats a photo folder often holds that are not read, and how to convert them.
_NOT_READ: dict[str, str] = {
    **dict.fromkeys((".heic", ".heif", ".hif"), "HEIC/HEIF is not read; convert it to JPEG, e.g. "
                    "`heif-convert IMG.heic IMG.jpg` (libheif) or `magick mogrify -format jpg *.heic`"),
    **dict.fromkeys((".dng", ".cr2", ".cr3", ".crw", ".nef", ".nrw", ".arw", ".srf", ".sr2", ".orf", ".rw2", ".raf",
                     ".pef", ".srw", ".3fr", ".iiq", ".x3f"),
                    "camera raw is not read; export it as JPEG or 16-bit TIFF/PNG from a raw converter, e.g. "
                    "`darktable-cli IMG.nef IMG.tif`"),
    ".svg": "a vector image is not read; rasterise it, e.g. `rsvg-convert -w 512 IMG.svg -o IMG.png`",
    ".psd": f"Photoshop documents are not read; {_CONVERT} (flattened)",
    **dict.fromkeys((".jp2", ".j2k", ".jpx"), f"JPEG 2000 is not read; {_CONVERT}"),
    **dict.fromkeys((".ico", ".icns", ".tga", ".pcx", ".xcf", ".exr", ".hdr"),
                    f"this format is not read; {_CONVERT}"),
}


def _extension(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and _extension(name) in IMAGE_EXTENSIONS


def not_read_reason(name: str) -> str:
    """Why a file that is not hidden is not read, from its name alone (no ``stat``, no open)."""
    ext = _extension(name)
    if ext in _NOT_READ:
        return _NOT_READ[ext]
    return f"not an image file ({f'extension {ext}' if ext else 'no extension'})"


def _walk(folder: Path, not_read: list[str] | None = None) -> Iterator[str]:
    """Paths of the images under ``folder`` (hidden files and folders skipped), lazily, in sorted walk order;
    the paths of the other files are appended to ``not_read`` when given."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if _is_image_name(f):
                yield os.path.join(dirpath, f)
            elif not_read is not None and not f.startswith("."):
                not_read.append(os.path.join(dirpath, f))


def _class_folders(root: Path) -> list[str]:
    """Names of the sub-folders of ``root`` that hold at least one image (the classes), sorted.

    Stops at each folder's first image, so a large training split is not listed twice."""
    return [d.name for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith(".") and next(_walk(d), None) is not None]


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

    Paths are stored relative to ``root`` in numpy bytes arrays (cheap to send to workers); ``not_read``: the
    split's other files (see :meth:`unused`).
    """

    def __init__(self, root: Path, paths: list[str], labels: list[int] | None, classes: list[str] | None,
                 not_read: list[str] = ()) -> None:
        self.root = Path(root)
        self._paths = self._relative(paths)
        self._not_read = self._relative(not_read)
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.classes = classes

    def _relative(self, paths: list[str]) -> np.ndarray:
        prefix = len(str(self.root).rstrip(os.sep)) + 1
        return np.array([os.fsencode(p[prefix:]) for p in paths], dtype=np.bytes_)

    def __len__(self) -> int:
        return len(self._paths)

    def name(self, index: int) -> str:
        return os.fsdecode(self._paths[index])

    def open(self, index: int) -> str:
        return os.path.join(self.root, self.name(index))

    def size(self, index: int) -> int:
        """The file's size in bytes (a stat, no read)."""
        return os.stat(self.open(index)).st_size

    def unused(self) -> list[tuple[str, str]]:
        """``(name, reason)`` of each file of the split that is not read (names relative to ``root``)."""
        names = [os.fsdecode(n) for n in self._not_read]
        return [(name, not_read_reason(name)) for name in names]


def _none_found(root: Path, not_read: list[str], fix: str) -> DataError:
    """No image in ``root``: the error names the extensions read and, when there are other files, why not those."""
    others = ""
    if not_read:
        prefix = len(str(root).rstrip(os.sep)) + 1
        others = "; " + skipped_line([(p[prefix:], not_read_reason(p)) for p in not_read], "that are not read")
    return DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) found in {root} or its sub-folders{others}; {fix}")


def folder_source(root: Path, reference: list[str] | None = None) -> FolderSource:
    """Scan one split: class folders give labels (indices into ``reference``, the training split's
    classes, matched by name, when given); loose images give an unlabelled split. Files that are not
    images are kept as not read (:meth:`FolderSource.unused`)."""
    entries = sorted(os.scandir(root), key=lambda e: e.name)
    direct = [e.path for e in entries if e.is_file() and _is_image_name(e.name)]
    not_read = [e.path for e in entries if not e.is_dir() and not e.name.startswith(".") and
                not _is_image_name(e.name)]
    subdirs = [e for e in entries if e.is_dir() and not e.name.startswith(".")]
    per_class = [(d.name, list(_walk(Path(d.path), not_read))) for d in subdirs]
    per_class = [(n, files) for n, files in per_class if files]
    if per_class and direct:
        raise DataError(
            f"{root} holds both images ({os.path.basename(direct[0])}, ...) and class folders "
            f"({per_class[0][0]}, ...); move the loose images into a class folder, or point "
            f"root at a folder of one kind"
        )
    not_read.sort()
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
        return FolderSource(root, paths, labels, list(classes), not_read)
    if not direct:
        raise _none_found(root, not_read, "check data.root")
    return FolderSource(root, direct, None, None, not_read)


def all_images(root: Path) -> FolderSource:
    """Every image under ``root``, loose files and sub-folders alike, sorted by path, unlabelled (the other
    files kept as not read)."""
    if not root.is_dir():
        raise DataError(f"{root} is not a directory of images; pass the folder that holds them")
    not_read: list[str] = []
    paths = sorted(_walk(root, not_read))
    if not paths:
        raise _none_found(root, sorted(not_read), "pass the folder that holds the images")
    return FolderSource(root, paths, None, None, sorted(not_read))
