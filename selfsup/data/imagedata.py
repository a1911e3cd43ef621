"""What every dataset format returns: :class:`ImageData` (a split in memory) or a :class:`DataError`,
the array helpers the formats share (seeded subsets, channel conversion, resizing), and the one log line that
names the files of a folder that were not used, each with its reason (:func:`report_skipped`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from selfsup.memory import check_fits

__all__ = ["DataError", "ImageData", "MAX_LISTED", "convert_channels", "report_decode_warnings", "report_skipped",
           "resize_images", "skipped_line", "subset_indices", "take"]

log = logging.getLogger("selfsup")

MAX_LISTED = 10  # file names quoted in one error or log line
_RESIZE_CHUNK = 512
_LUMA = (0.299, 0.587, 0.114)


def skipped_line(skipped: Sequence[tuple[str, str]], where: str) -> str:
    """One readable line for files left out: ``skipped N files WHERE: a.heic, b.heic: <reason>; c.jpg: <reason>``.

    ``skipped`` holds ``(name, reason)`` pairs; files sharing a reason are named together, at most
    :data:`MAX_LISTED` names in all ("and N more" says the rest); ``where`` is e.g. "of 20 in DIR"."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in skipped:
        by_reason.setdefault(reason, []).append(name)
    groups = list(by_reason.items())
    parts, room = [], MAX_LISTED
    for k, (reason, names) in enumerate(groups):
        if room <= 0:
            parts.append(f"{sum(len(n) for _, n in groups[k:])} more for other reasons")
            break
        more = f" and {len(names) - room} more" if len(names) > room else ""
        parts.append(f"{', '.join(names[:room])}{more}: {reason}")
        room -= len(names)
    return f"skipped {len(skipped)} file{'s' if len(skipped) != 1 else ''} {where}: " + "; ".join(parts)


def report_skipped(skipped: Sequence[tuple[str, str]], where: str) -> None:
    """Log the files left out (see :func:`skipped_line`) as one warning of the ``selfsup`` logger, not a Python
    warning (which would point at this library's source line instead of at the files)."""
    if skipped:
        log.warning("%s", skipped_line(skipped, where))


def report_decode_warnings(notes: Sequence[tuple[str, str]], where: str) -> None:
    """Log the warnings the image library gave while decoding files that were used (corrupt EXIF, a very large
    image, ...) as one line: ``(name, warning)`` pairs, the first :data:`MAX_LISTED` quoted."""
    if notes:
        files = len({name for name, _ in notes})
        quoted = "; ".join(f"{name}: {text}" for name, text in notes[:MAX_LISTED])
        more = f"; and {len(notes) - MAX_LISTED} more" if len(notes) > MAX_LISTED else ""
        log.warning("decoded %d file%s %s with warnings (the images were used): %s%s", files,
                    "s" if files != 1 else "", where, quoted, more)


class DataError(ValueError):
    """A dataset is missing, malformed or unreadable; the message names the file or folder and the fix."""


@dataclass
class ImageData:
    """A whole dataset split in memory.

    images: uint8 (N, C, H, W) with C in {1, 3}, contiguous.
    labels: int64 (N,), or None when the split has no labels.
    classes: class names indexed by label, or None.
    skipped: ``(path, reason)`` of each file of the split that was left out (not an image file this reads,
        empty, or undecodable), for image folders and shards.
    paths: the file of each image (image folders), or None.
    """

    images: torch.Tensor
    labels: torch.Tensor | None
    classes: list[str] | None
    skipped: list[tuple[str, str]] = field(default_factory=list)
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


def subset_indices(n: int, fraction: float, seed: int) -> torch.Tensor | None:
    """Sorted seeded subset of range(n) of size round(fraction * n), or None for everything."""
    if fraction >= 1.0:
        return None
    keep = max(1, round(fraction * n))
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[:keep].sort().values


def convert_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
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


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize to size x size: shorter side to ``size`` (antialiased bilinear), then center crop."""
    n, c, h, w = images.shape
    if h == size and w == size:
        return images
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    top, left = (new_h - size) // 2, (new_w - size) // 2
    # images per chunk: at most _RESIZE_CHUNK, and float copies of at most ~256 MB whatever the size
    step = max(1, min(_RESIZE_CHUNK, 2**26 // (c * max(h * w, new_h * new_w))))
    check_fits(f"resizing {n:,} images to {size} x {size} (data.image_size)", n * c * size * size
               + step * c * (h * w + 2 * new_h * new_w) * 4,
               "use a smaller data.image_size, or data.stream=true to stream an image folder or shards (crops are "
               "then taken from each file as it is read)")
    out = torch.empty((n, c, size, size), dtype=torch.uint8)
    for start in range(0, n, step):
        chunk = images[start:start + step].float()
        if (new_h, new_w) != (h, w):
            chunk = F.interpolate(chunk, size=(new_h, new_w), mode="bilinear",
                                  align_corners=False, antialias=True)
        chunk = chunk[:, :, top:top + size, left:left + size]
        out[start:start + step] = chunk.round_().clamp_(0, 255).to(torch.uint8)
    return out


def take(images: torch.Tensor, labels: torch.Tensor | None, idx: torch.Tensor | None,
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if idx is None:
        return images, labels
    return images[idx].contiguous(), (None if labels is None else labels[idx])
