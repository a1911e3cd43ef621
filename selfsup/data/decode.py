"""Image files -> pixels, shared by the in-memory and the streaming paths and by :class:`selfsup.api.Preprocess`.

An :class:`ImageSource` is a split of encoded images on disk, whatever the layout (an image folder,
WebDataset tar shards): its length, labels and class names, and ``open(i)``, the i-th encoded image.
Every image, a file or a PIL image, goes through :func:`open_image` (upright, 8 bit, alpha composited,
in the run's mode); then one of:

- :func:`fit_square` / :func:`decode_resized`: the whole image, shorter side resized to ``size``
  (PIL's antialiased bilinear) and centre-cropped: the in-memory path, evaluation, the kNN monitor,
  ``selfsup embed`` and ``Preprocess``, which therefore give the same pixels for the same image;
- :func:`decode_crops`: random-resized crops taken from the full-resolution image (the streaming
  training path). JPEGs are decoded in draft mode at the smallest 1/2, 1/4 or 1/8 scale that still
  gives every crop at least its output resolution, so a 64 px crop of a 500 px photo decodes about
  a sixteenth of the pixels.

:func:`decode_resized` decodes in full, with no draft: a draft decode is ~4x faster on a 4000 x 3000 JPEG
(38 against 161 ms) but gives pixels up to 3/255 away (0.4/255 on average at 224 px) from the full decode
that a PIL image or a tensor of the same photo is resized from, and ``selfsup embed`` must agree with
``Preprocess``. Training crops are random anyway, so :func:`decode_crops` keeps the draft.

Warnings the image library gives while decoding (corrupt EXIF, a palette's transparency, a very large image)
are caught per file by :class:`DecodeWarnings` and logged in one line, never printed as Python warnings.
"""

from __future__ import annotations

import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import torch
from PIL import Image, ImageOps

from selfsup.data.imagedata import DataError, ImageData, report_decode_warnings, report_skipped
from selfsup.memory import check_fits
from selfsup.progress import track

__all__ = ["ALPHA_BACKGROUND", "Crop", "DecodeWarnings", "ImageSource", "decode_all", "decode_crops",
           "decode_resized", "fit_square", "image_mode", "open_image", "unreadable_reason", "unused_files", "upright"]

_EXIF_ORIENTATION = 0x0112
_MAX_DRAFT_REDUCTION = 8  # libjpeg scales by 1/2, 1/4, 1/8

# The grey level that transparent pixels are composited onto (RGBA, LA, PA, a palette or an RGB/L image with a
# transparent colour): white, as image viewers and browsers show transparency and as product shots and scanned
# documents with a cut-out background are meant to be seen.
ALPHA_BACKGROUND = 255

_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
_WITH_ALPHA = {"RGBA": "RGB", "LA": "L", "PA": "RGB", "RGBa": "RGB", "La": "L"}


class ImageSource(Protocol):
    """A split of encoded images: ``len``, ``labels`` (int64 (N,) or None), ``classes``, ``open(i)``, ``name(i)``,
    ``size(i)`` (its bytes, for the data's fingerprint), and optionally ``unused()``: ``(name, reason)`` of the
    split's files that are not read (see :func:`unused_files`).

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


def unused_files(source: ImageSource) -> list[tuple[str, str]]:
    """``(name, reason)`` of the files of a split that are not read (an image folder's other files)."""
    unused = getattr(source, "unused", None)
    return unused() if unused is not None else []


def _why(err: BaseException) -> str:
    """An error in a few words: PIL names in-memory files by their repr and files by their path, which the
    listing already gives."""
    text = " ".join(str(err).split(" <_io.")[0].split())  # one line: the reason ends a line of OUT.skipped.txt
    text = re.sub(r" '[^']*'$", "", text) if "cannot identify image file" in text else text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def unreadable_reason(source: ImageSource, index: int, err: BaseException) -> str:
    """Why image ``index`` of ``source`` could not be used: an empty file, or what decoding it raised."""
    try:
        empty = source.size(index) == 0
    except OSError:  # gone since it was listed: the decoding error says so
        empty = False
    return "empty file (0 bytes)" if empty else f"cannot decode ({_why(err)})"


class DecodeWarnings:
    """The warnings given while files are decoded, caught per file instead of printed as Python warnings.

    Python's warning filters and hook are process-wide (``warnings.catch_warnings`` is not thread-safe), so
    one thread enters this context (it swaps the hook once) around all the decoding, and each decoding
    thread wraps one file in :meth:`file`: a warning is attributed through a thread-local to the file that
    thread is decoding and collected in ``notes`` as ``(name, "Category: message")``. A warning from any other
    thread meanwhile goes on to the previous hook (shown every time, not once per place, while this is open).
    """

    def __init__(self) -> None:
        self.notes: list[tuple[str, str]] = []
        self._local = threading.local()
        self._lock = threading.Lock()
        self._saved: Any = None
        self._show: Callable[..., Any] | None = None

    def __enter__(self) -> DecodeWarnings:
        self._saved = warnings.catch_warnings()
        self._saved.__enter__()
        self._show = warnings.showwarning
        warnings.simplefilter("always")  # each file's warnings, not only the first at each source line
        warnings.showwarning = self._caught
        return self

    def __exit__(self, *exc: Any) -> None:
        self._saved.__exit__(*exc)

    @contextmanager
    def file(self, name: str) -> Iterator[None]:
        """Attribute the warnings this thread gives meanwhile to ``name``."""
        self._local.name = name
        try:
            yield
        finally:
            self._local.name = None

    def _caught(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                line: str | None = None) -> None:
        name = getattr(self._local, "name", None)
        if name is None:
            self._show(message, category, filename, lineno, file, line)
            return
        with self._lock:
            self.notes.append((name, f"{category.__name__}: {message}"))


def _oriented(im: Image.Image) -> bool:
    """True when the EXIF orientation turns or mirrors the stored pixels."""
    try:
        return im.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None)
    except Exception:  # an unreadable EXIF block: the pixels are used as stored
        return False


def _eight_bit(im: Image.Image) -> Image.Image:
    """16-bit and 32-bit integer and float gray images scaled (not clipped) to 8 bit ("L").

    - 16-bit ("I;16" and its byte orders): ``round(x * 255 / 65535)``;
    - "I" (32-bit integer; Pillow's mode for 16-bit PGM and some 16-bit PNG/TIFF): read as 16 bit, values outside
      [0, 65535] clipped first;
    - "F" (float TIFF): [0, 1] -> [0, 255], ``round(x * 255)``, values outside [0, 1] (and NaN, as 0) clipped.

    16-bit colour PNG/TIFF files need nothing here: Pillow opens them as "RGB" with each channel's high byte,
    ``floor(x / 256)``, which is within 1 of ``x * 255 / 65535``.
    """
    if im.mode in _SIXTEEN_BIT:
        x = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        return Image.fromarray(((x * 255 + 32767) // 65535).astype(np.uint8), "L")
    if im.mode == "F":
        x = np.nan_to_num(np.asarray(im, dtype=np.float64), nan=0.0)
        return Image.fromarray(np.rint(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8), "L")
    return im


def _flatten_alpha(im: Image.Image) -> Image.Image:
    """An image with transparency composited onto :data:`ALPHA_BACKGROUND`: ``round((c * a + B * (255 - a)) / 255)``
    per channel (a palette or a transparent colour key is first expanded to RGBA / LA)."""
    if im.mode not in _WITH_ALPHA:
        if not im.has_transparency_data:
            return im
        im = im.convert("LA" if im.mode in ("L", "1") else "RGBA")
    base = _WITH_ALPHA[im.mode]
    if im.mode not in ("RGBA", "LA"):  # premultiplied or palette + alpha
        im = im.convert("RGBA" if base == "RGB" else "LA")
    x = np.asarray(im, dtype=np.int32)
    colour, alpha = x[..., :-1], x[..., -1:]
    out = (colour * alpha + ALPHA_BACKGROUND * (255 - alpha) + 127) // 255
    out = out.astype(np.uint8)
    return Image.fromarray(out[..., 0] if base == "L" else out, base)


def upright(im: Image.Image, mode: str) -> Image.Image:
    """A decoded image in ``mode`` ("L" or "RGB"): EXIF orientation applied, 16-bit and float scaled to 8 bit
    (:func:`_eight_bit`), transparency composited onto :data:`ALPHA_BACKGROUND`, then Pillow's conversion (palette,
    1-bit, CMYK, YCbCr to RGB; colour to gray by ITU-R 601-2 luma, ``L = 0.299 R + 0.587 G + 0.114 B``).
    Returns ``im`` itself when it is already upright in ``mode``; never changes ``im``."""
    if _oriented(im):
        im = ImageOps.exif_transpose(im)
    im = _flatten_alpha(_eight_bit(im))
    return im if im.mode == mode else im.convert(mode)


def open_image(source: str | Path | IO[bytes] | Image.Image, mode: str) -> Image.Image:
    """Any image file (a path or a binary file object; GIF and TIFF: the first frame) or PIL image, upright in
    ``mode`` (see :func:`upright`), fully decoded (a file is closed again). Raises what Pillow raises for a file
    it cannot read."""
    if isinstance(source, Image.Image):
        return upright(source, mode)
    with Image.open(source) as im:
        im.load()
        return upright(im, mode)  # loaded: leaving the block closes the file, the pixels stay usable


def fit_square(im: Image.Image, size: int | None) -> np.ndarray:
    """``im`` as a new (H, W, C) uint8 array: shorter side resized to ``size`` (PIL's antialiased bilinear) and
    centre-cropped to ``size`` x ``size``; ``size`` None keeps the image as it is."""
    if size is not None:
        w, h = im.size
        scale = size / min(w, h)
        new_w, new_h = max(size, round(w * scale)), max(size, round(h * scale))
        if (new_w, new_h) != (w, h):
            im = im.resize((new_w, new_h), Image.Resampling.BILINEAR)
        left, top = (new_w - size) // 2, (new_h - size) // 2
        if (left, top, size, size) != (0, 0, new_w, new_h):
            im = im.crop((left, top, left + size, top + size))
    arr = np.array(im, dtype=np.uint8)  # a writable copy (np.asarray of a PIL image is read-only)
    return arr[:, :, None] if arr.ndim == 2 else arr


def decode_resized(source: str | Path | IO[bytes] | Image.Image, size: int | None, mode: str) -> np.ndarray:
    """The whole image as (H, W, C) uint8: :func:`open_image`, then :func:`fit_square` (no draft decode: see the
    module's docstring)."""
    return fit_square(open_image(source, mode), size)


def _draft_reduction(crops: Sequence[Crop]) -> int:
    """The largest power-of-two reduction (<= 8) that leaves every crop at least ``size`` pixels a side."""
    least = min(min(c.box[2], c.box[3]) / c.size for c in crops)
    if least < 2:
        return 1
    return min(_MAX_DRAFT_REDUCTION, 2 ** int(math.floor(math.log2(least))))


def decode_crops(source: str | Path | IO[bytes], mode: str,
                 choose: Callable[[int, int], list[Crop]]) -> list[np.ndarray]:
    """Crops of one image at full resolution: ``choose(width, height)`` picks them once the header is read.

    The image is made :func:`upright` in ``mode`` as :func:`open_image` does. Each crop is resampled with PIL's
    antialiased bilinear filter straight from its box (no intermediate resize), then mirrored if asked; returns
    (size, size, C) uint8 arrays.
    """
    with Image.open(source) as im:
        if _oriented(im):  # the boxes refer to the upright image: decode all of it and turn it first
            im.load()
            im = upright(im, mode)
            width, height = im.size
            crops = choose(width, height)
        else:
            width, height = im.size
            crops = choose(width, height)
            reduction = _draft_reduction(crops)
            if reduction > 1:  # JPEG: a smaller scale of the same pixels (the colour conversion stays upright's)
                im.draft(im.mode, (math.ceil(width / reduction), math.ceil(height / reduction)))
            im.load()
            im = upright(im, mode)
    sx, sy = im.size[0] / width, im.size[1] / height
    out = []
    for crop in crops:
        x0, y0, w, h = crop.box
        patch = im.resize((crop.size, crop.size), Image.Resampling.BILINEAR,
                          box=(x0 * sx, y0 * sy, (x0 + w) * sx, (y0 + h) * sy))
        if crop.flip:
            patch = patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(fit_square(patch, None))
    return out


def decode_all(source: ImageSource, image_size: int | None, channels: int, indices: torch.Tensor | None = None,
               progress: bool = True) -> ImageData:
    """Decode a source (or the ``indices`` of it) into memory with :func:`decode_resized`, in threads.

    Files not used (not read, empty, undecodable) are left out, logged in one line and kept with their reasons in
    ``ImageData.skipped``; warnings while decoding the others are logged in one line (:class:`DecodeWarnings`).
    """
    rows = range(len(source)) if indices is None else indices.tolist()
    mode = image_mode(channels)
    if image_size is not None:  # the decoded arrays, then their stacked copy
        check_fits(f"decoding {len(rows):,} images at {image_size} x {image_size} (data.image_size) into memory",
                   2 * len(rows) * channels * image_size**2, "use a smaller data.image_size, or data.stream=true to "
                   "stream the images from their files (crops are then taken from each file as it is read)")

    def work(i: int) -> np.ndarray | str:
        try:
            with caught.file(source.name(i)):
                return decode_resized(source.open(i), image_size, mode)
        except Exception as err:  # any undecodable file is skipped and reported once below
            return unreadable_reason(source, i, err)

    workers = max(1, min(8, os.cpu_count() or 1))
    with DecodeWarnings() as caught, ThreadPoolExecutor(max_workers=workers) as pool:
        results = pool.map(work, rows)
        if progress:
            results = track(results, f"decoding {source.root.name}", total=len(rows), unit="images")
        arrays = list(results)

    ok = [k for k, a in enumerate(arrays) if not isinstance(a, str)]
    unused = unused_files(source)
    skipped = unused + [(source.name(rows[k]), a) for k, a in enumerate(arrays) if isinstance(a, str)]
    where = f"of {len(rows) + len(unused)} in {source.root}"
    report_skipped(skipped, where)
    report_decode_warnings(caught.notes, f"in {source.root}")
    if not ok:
        last = f" ({skipped[-1][0]}: {skipped[-1][1]})" if skipped else ""
        raise DataError(f"none of the {len(rows)} images in {source.root} could be decoded{last}; check the files")
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
    return ImageData(images, labels, source.classes, [(str(source.root / n), why) for n, why in skipped], paths)
