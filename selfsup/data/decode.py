"""Image files -> pixels, shared by the in-memory and the streaming paths.

An :class:`ImageSource` is a split of encoded images on disk, whatever the layout (an image folder,
WebDataset tar shards): its length, labels and class names, and ``open(i)``, the i-th encoded image.
Two decoders read it:

- :func:`decode_resized`: the whole image, shorter side resized to ``size`` and centre-cropped (the
  in-memory path, evaluation, the kNN monitor);
- :func:`decode_crops`: random-resized crops taken from the full-resolution image (the streaming
  training path). JPEGs are decoded in draft mode at the smallest 1/2, 1/4 or 1/8 scale that still
  gives every crop at least its output resolution, so a 64 px crop of a 500 px photo decodes about
  a sixteenth of the pixels.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import numpy as np
import torch
from PIL import Image, ImageOps
from tqdm.auto import tqdm

from selfsup.data.imagedata import DataError, ImageData, warn_unreadable
from selfsup.memory import check_fits

__all__ = ["Crop", "ImageSource", "decode_all", "decode_crops", "decode_resized", "image_mode"]

_EXIF_ORIENTATION = 0x0112
_MAX_DRAFT_REDUCTION = 8  # libjpeg scales by 1/2, 1/4, 1/8


class ImageSource(Protocol):
    """A split of encoded images: ``len``, ``labels`` (int64 (N,) or None), ``classes``, ``open(i)``, ``name(i)``,
    ``size(i)`` (its bytes, for the data's fingerprint).

    Sources are pickled into DataLoader workers, so they hold numpy arrays, not Python lists of
    objects (a list of a million paths would be copied page by page into every worker).
    """

    root: Path
    labels: np.ndarray | None
    classes: list[str] | None

    def __len__(self) -> int: ...

    def open(self, index: int) -> str | IO[bytes]: ...

    def name(self, index: int) -> str: ...

    def size(self, index: int) -> int: ...


@dataclass(frozen=True)
class Crop:
    """One output crop: ``box`` (x0, y0, w, h) in pixels of the (EXIF-oriented) image, ``size`` its side, ``flip`` mirrors it."""

    box: tuple[float, float, float, float]
    size: int
    flip: bool = False


def image_mode(channels: int) -> str:
    return "L" if channels == 1 else "RGB"


def _oriented(im: Image.Image) -> bool:
    """True when the EXIF orientation turns or mirrors the stored pixels."""
    try:
        return im.getexif().get(_EXIF_ORIENTATION, 1) != 1
    except Exception:  # an unreadable EXIF block: the pixels are used as stored
        return False


def _as_array(im: Image.Image) -> np.ndarray:
    arr = np.asarray(im, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_resized(source: str | Path | IO[bytes], size: int | None, mode: str) -> np.ndarray:
    """The whole image as (H, W, C) uint8: shorter side resized to ``size`` (bicubic) and centre-cropped."""
    with Image.open(source) as im:
        if size is not None:
            im.draft(mode, (size, size))  # JPEG: decode at a reduced scale when possible
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
    return _as_array(im)


def _draft_reduction(crops: Sequence[Crop]) -> int:
    """The largest power-of-two reduction (<= 8) that leaves every crop at least ``size`` pixels a side."""
    least = min(min(c.box[2], c.box[3]) / c.size for c in crops)
    if least < 2:
        return 1
    return min(_MAX_DRAFT_REDUCTION, 2 ** int(math.floor(math.log2(least))))


def decode_crops(source: str | Path | IO[bytes], mode: str,
                 choose: Callable[[int, int], list[Crop]]) -> list[np.ndarray]:
    """Crops of one image at full resolution: ``choose(width, height)`` picks them once the header is read.

    Each crop is resampled with PIL's antialiased bilinear filter straight from its box (no
    intermediate resize), then mirrored if asked; returns (size, size, C) uint8 arrays.
    """
    with Image.open(source) as im:
        if _oriented(im):  # the boxes refer to the upright image: decode all of it and turn it first
            im.load()
            im = ImageOps.exif_transpose(im)
            width, height = im.size
            crops = choose(width, height)
        else:
            width, height = im.size
            crops = choose(width, height)
            reduction = _draft_reduction(crops)
            if reduction > 1:
                im.draft(mode, (math.ceil(width / reduction), math.ceil(height / reduction)))
        im = im.convert(mode)
    sx, sy = im.size[0] / width, im.size[1] / height
    out = []
    for crop in crops:
        x0, y0, w, h = crop.box
        patch = im.resize((crop.size, crop.size), Image.Resampling.BILINEAR,
                          box=(x0 * sx, y0 * sy, (x0 + w) * sx, (y0 + h) * sy))
        if crop.flip:
            patch = patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(_as_array(patch))
    return out


def decode_all(source: ImageSource, image_size: int | None, channels: int, indices: torch.Tensor | None = None,
               progress: bool = True) -> ImageData:
    """Decode a source (or the ``indices`` of it) into memory with :func:`decode_resized`, in threads.

    Unreadable files are left out and reported in one warning (and in ``ImageData.skipped``).
    """
    rows = range(len(source)) if indices is None else indices.tolist()
    mode = image_mode(channels)
    if image_size is not None:  # the decoded arrays, then their stacked copy
        check_fits(f"decoding {len(rows):,} images at {image_size} x {image_size} (data.image_size) into memory",
                   2 * len(rows) * channels * image_size**2, "use a smaller data.image_size, or data.stream=true to "
                   "stream the images from their files (crops are then taken from each file as it is read)")

    def work(i: int) -> np.ndarray | None:
        try:
            return decode_resized(source.open(i), image_size, mode)
        except Exception:  # any undecodable file is skipped and reported once below
            return None

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(work, rows)
        if progress:
            results = tqdm(results, total=len(rows), desc=f"decoding {source.root.name}", unit="img")
        arrays = list(results)

    ok = [k for k, a in enumerate(arrays) if a is not None]
    skipped = [source.name(rows[k]) for k, a in enumerate(arrays) if a is None]
    if not ok:
        raise DataError(f"none of the {len(rows)} images in {source.root} could be decoded; check the files")
    if skipped:
        warn_unreadable(skipped, f"of {len(rows)}", stacklevel=3)
    shapes = {arrays[k].shape for k in ok}
    if len(shapes) > 1:
        by_shape: dict[tuple[int, ...], str] = {}
        for k in ok:
            by_shape.setdefault(arrays[k].shape, source.name(rows[k]))
        examples = "; ".join(f"{name} is {s[1]}x{s[0]}" for s, name in list(by_shape.items())[:3])
        raise DataError(
            f"images in {source.root} have different sizes ({examples}); pass image_size=N "
            f"(config: data.image_size=N) to resize and center-crop them"
        )
    images = torch.from_numpy(np.stack([arrays[k] for k in ok])).permute(0, 3, 1, 2).contiguous()
    labels = None if source.labels is None else torch.from_numpy(source.labels[[rows[k] for k in ok]])
    paths = [str(source.root / source.name(rows[k])) for k in ok]
    return ImageData(images, labels, source.classes, [str(source.root / s) for s in skipped], paths)
