"""Streaming data: image files read and decoded in DataLoader worker processes, never held in memory.

Training (:func:`crop_batches`): every step's batch is the same one the in-memory path would take
(:class:`~selfsup.data.sampler.StepSampler`: a seeded permutation per epoch, each process reading
its own contiguous slice of the global batch), so a run is split across processes without overlap
and resumes at any step with the same remaining batches, whatever the number of workers. Each
worker decodes an image once and takes the random-resized crop of every view from the
full-resolution image (:func:`~selfsup.data.decode.decode_crops`, JPEG draft mode where it helps);
the photometric ops stay batched on the training device (:meth:`ViewGroup.from_crops`). The crop
randomness of an image is seeded by ``(seed, step, position in the global batch)``, so it does not
depend on which worker or process decodes it. An unreadable image is replaced by a seeded random
other one and counted; the warnings a used image gives while decoding are logged once per file and process.

Evaluation and the kNN monitor (:class:`StreamedSplit`): whole images resized and centre-cropped
as the in-memory path does, in batches, unreadable ones left out and reported. Either way, the files of the
split that are not read (an image folder's other files) are logged, with their reasons, when it is opened.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from selfsup.config import ConfigError, DataConfig
from selfsup.data.augment import sample_crop_boxes
from selfsup.data.datasets import STREAMABLE, load_dataset, open_images
from selfsup.data.decode import (Crop, DecodeWarnings, ImageSource, decode_crops, decode_resized, image_mode,
                                 unreadable_reason, unused_files)
from selfsup.data.imagedata import DataError, ImageData, report_decode_warnings, report_skipped, subset_indices
from selfsup.data.sampler import StepSampler
from selfsup.data.views import CropSpec

__all__ = ["CropBatch", "CropStream", "StepBatches", "StreamedSplit", "crop_batches", "default_workers", "open_split",
           "pixels_and_labels"]

log = logging.getLogger("selfsup")

# data.stream=auto streams an image folder or shards when the split decoded at data.image_size would pass this.
STREAM_ABOVE_BYTES = 4 * 2**30

# Replacements tried for one unreadable image before the run stops (a folder this broken is the wrong folder).
MAX_REPLACEMENTS = 50


def default_workers() -> int:
    """DataLoader worker processes when ``data.num_workers`` is null: one per CPU core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


def crop_seed(seed: int, step: int, position: int) -> int:
    """The seed of the crops of the image at ``position`` in the global batch of ``step``."""
    return ((seed * 1_000_003 + step) * 1_000_033 + position) % (2**63)


@dataclass
class CropBatch:
    """One process's share of a step: the image indices, the uint8 crops (one (B, C, S, S) tensor per crop
    slot, in view-spec order) and the names of the unreadable files that were replaced."""

    indices: torch.Tensor
    crops: list[torch.Tensor]
    unreadable: list[str]

    def pin_memory(self) -> CropBatch:
        return CropBatch(self.indices, [c.pin_memory() for c in self.crops], self.unreadable)


class StepBatches:
    """DataLoader batch sampler: for each step in ``[start, stop)``, this process's ``(step, position, index)``
    items, ``position`` being the image's place in the global batch."""

    def __init__(self, sampler: StepSampler, start: int, stop: int) -> None:
        self.sampler, self.start, self.stop = sampler, start, stop

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        first = self.sampler.rank * self.sampler.local_batch
        for step in range(self.start, self.stop):
            yield [(step, first + k, int(i)) for k, i in enumerate(self.sampler.indices(step).tolist())]


class CropStream(Dataset):
    """Item ``(step, position, index)`` -> the crops of image ``index`` for every crop spec (see :func:`crop_seed`)."""

    def __init__(self, source: ImageSource, specs: list[CropSpec], channels: int, seed: int) -> None:
        self.source, self.specs, self.mode, self.seed = source, specs, image_mode(channels), seed

    def __len__(self) -> int:
        return len(self.source)

    def _choose(self, width: int, height: int) -> list[Crop]:
        crops = []
        for spec in self.specs:
            boxes = sample_crop_boxes(spec.count, height, width, spec.scale, spec.ratio)
            flips = torch.rand(spec.count) < spec.hflip_p
            crops.extend(Crop(tuple(box), spec.size, bool(flip)) for box, flip in zip(boxes.tolist(), flips.tolist()))
        return crops

    def __getitem__(self, item: tuple[int, int, int]) -> tuple[int, list[np.ndarray], list[str]]:
        step, position, index = item
        unreadable: list[str] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(crop_seed(self.seed, step, position))
            while True:
                try:
                    return index, self._decode(index), unreadable
                except Exception as err:  # any unreadable file is replaced and counted, never fatal
                    unreadable.append(f"{self.source.name(index)} ({unreadable_reason(self.source, index, err)})")
                    if len(unreadable) > MAX_REPLACEMENTS:
                        raise DataError(f"{len(unreadable)} unreadable images in a row in {self.source.root} "
                                        f"(last: {unreadable[-1]}); check data.root") from err
                    index = int(torch.randint(len(self.source), ()))


    def _decode(self, index: int) -> list[np.ndarray]:
        name = self.source.name(index)
        with DecodeWarnings() as caught, caught.file(name):
            crops = decode_crops(self.source.open(index), self.mode, self._choose)
        if caught.notes and name not in _WARNED:  # once per file and process: every epoch meets it again
            _WARNED.add(name)
            report_decode_warnings(caught.notes, f"in {self.source.root}")
        return crops


# Files whose decoding warnings this process has logged (CropStream).
_WARNED: set[str] = set()


def _collate_crops(items: list[tuple[int, list[np.ndarray], list[str]]]) -> CropBatch:
    slots = len(items[0][1])
    crops = [torch.from_numpy(np.ascontiguousarray(np.stack([it[1][k] for it in items]).transpose(0, 3, 1, 2)))
             for k in range(slots)]
    return CropBatch(torch.tensor([it[0] for it in items]), crops, [name for it in items for name in it[2]])


def crop_batches(source: ImageSource, sampler: StepSampler, specs: list[CropSpec], channels: int, seed: int,
                 start: int, stop: int, workers: int, pin_memory: bool = False) -> DataLoader:
    """The crops of steps ``[start, stop)`` for this process, decoded by ``workers`` processes (0: in this one)."""
    return DataLoader(CropStream(source, specs, channels, seed), batch_sampler=StepBatches(sampler, start, stop),
                      num_workers=workers, collate_fn=_collate_crops, pin_memory=pin_memory,
                      prefetch_factor=4 if workers else None)


class _Resized(Dataset):
    """Item ``index`` -> ``(index, image or None, (name, reason) if unused, [(name, warning), ...])``."""

    def __init__(self, source: ImageSource, size: int, channels: int) -> None:
        self.source, self.size, self.mode = source, size, image_mode(channels)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int,
                    ) -> tuple[int, np.ndarray | None, tuple[str, str] | None, list[tuple[str, str]]]:
        name = self.source.name(index)
        with DecodeWarnings() as caught, caught.file(name):
            try:
                return index, decode_resized(self.source.open(index), self.size, self.mode), None, caught.notes
            except Exception as err:  # left out and reported by StreamedSplit
                return index, None, (name, unreadable_reason(self.source, index, err)), []


def _collate_resized(items: list[tuple[int, np.ndarray | None, tuple[str, str] | None, list[tuple[str, str]]]],
                     ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]], list[tuple[str, str]]]:
    ok = [it for it in items if it[1] is not None]
    images = (torch.from_numpy(np.ascontiguousarray(np.stack([it[1] for it in ok]).transpose(0, 3, 1, 2)))
              if ok else torch.empty(0, dtype=torch.uint8))
    return (images, torch.tensor([it[0] for it in ok], dtype=torch.long), [it[2] for it in items if it[1] is None],
            [note for it in items for note in it[3]])


class StreamedSplit:
    """A labelled (or unlabelled) split read from files on demand: the streaming counterpart of ``ImageData``.

    :meth:`batches` yields uint8 (B, C, size, size) centre crops; :meth:`pixels` decodes a subset.
    The split's files that are not read are logged when it is opened; unreadable files are left out and
    logged, once per split; after a full pass ``readable`` marks the rows that were decoded and ``skipped``
    holds ``(name, reason)`` of every file not used (not read, then unreadable).
    """

    def __init__(self, source: ImageSource, image_size: int, channels: int, workers: int) -> None:
        self.source, self.image_size, self.channels, self.workers = source, image_size, channels, workers
        self.labels = None if source.labels is None else torch.from_numpy(source.labels)
        self.classes = source.classes  # as ImageData's: class names indexed by label, or None
        self.readable = torch.ones(len(source), dtype=torch.bool)
        self.unused = unused_files(source)
        self.skipped: list[tuple[str, str]] = list(self.unused)
        self._reported: set[tuple[str, str]] = set()
        report_skipped(self.unused, f"of {len(source) + len(self.unused)} in {source.root}")

    def __len__(self) -> int:
        return len(self.source)

    def _loader(self, indices: list[int] | None, batch_size: int) -> DataLoader:
        data = _Resized(self.source, self.image_size, self.channels)
        rows = range(len(self.source)) if indices is None else indices
        batches = [list(rows[i:i + batch_size]) for i in range(0, len(rows), batch_size)]
        return DataLoader(data, batch_sampler=batches, num_workers=self.workers, collate_fn=_collate_resized)

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every image in order as (uint8 images, their row numbers); unreadable rows are left out and reported."""
        seen, unreadable, notes = torch.zeros(len(self.source), dtype=torch.bool), [], []
        for images, rows, bad, warned in self._loader(None, batch_size):
            seen[rows] = True
            unreadable.extend(bad)
            notes.extend(warned)
            yield images, rows
        self.readable = seen
        self.skipped = self.unused + unreadable
        self._report(unreadable, notes)

    def pixels(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoded images at ``indices`` and the indices that were readable: uint8 (n, C, size, size), (n,)."""
        out, kept, unreadable, notes = [], [], [], []
        for images, rows, bad, warned in self._loader(indices.tolist(), 256):
            out.append(images)
            kept.append(rows)
            unreadable.extend(bad)
            notes.extend(warned)
        self._report(unreadable, notes)
        return torch.cat(out), torch.cat(kept)

    def _report(self, unreadable: list[tuple[str, str]], notes: list[tuple[str, str]]) -> None:
        """Log the unreadable files and the decoding warnings not logged before (a split read again, e.g. by the kNN
        monitor, logs nothing new)."""
        report_skipped([u for u in unreadable if u not in self._reported], f"in {self.source.root}")
        report_decode_warnings([n for n in notes if n not in self._reported], f"in {self.source.root}")
        self._reported.update(unreadable, notes)


class SubsetSource:
    """The rows ``rows`` of a source (``data.fraction``), as a source."""

    def __init__(self, source: ImageSource, rows: torch.Tensor) -> None:
        self.source, self.rows = source, rows.numpy()
        self.root, self.classes = source.root, source.classes
        self.labels = None if source.labels is None else source.labels[self.rows]

    def unused(self) -> list[tuple[str, str]]:
        return unused_files(self.source)

    def __len__(self) -> int:
        return len(self.rows)

    def open(self, index: int):
        return self.source.open(int(self.rows[index]))

    def name(self, index: int) -> str:
        return self.source.name(int(self.rows[index]))

    def size(self, index: int) -> int:
        return self.source.size(int(self.rows[index]))


def data_fingerprint(data: ImageData | StreamedSplit) -> dict[str, Any]:
    """What a resumed run checks its training data against: the number of images and a SHA-256 of their content,
    taken cheaply: the decoded pixels of an in-memory split; every file's name and size of a streamed one (a stat
    each, no file read); the labels of either."""
    digest = hashlib.sha256()
    if isinstance(data, StreamedSplit):
        source = data.source
        for i in range(len(source)):
            digest.update(f"{source.name(i)}\t{source.size(i)}\n".encode("utf-8", "surrogateescape"))
    else:
        digest.update(data.images.contiguous().numpy())
    if data.labels is not None:
        digest.update(data.labels.contiguous().numpy())
    return {"images": len(data), "sha256": digest.hexdigest()}


def split_size(d: DataConfig, split: str, fraction: float = 1.0) -> int:
    """The number of images :func:`open_split` would give: image files are listed, not decoded; other formats are
    loaded (they fit in memory). For checks that need the dataset's size before training."""
    if d.dataset in STREAMABLE:
        n = len(open_images(d.dataset, split, d.root))
        return n if fraction >= 1 else max(1, round(fraction * n))
    return len(load_dataset(d.dataset, split, root=d.root, fraction=fraction, seed=d.fraction_seed, progress=False))


def open_split(d: DataConfig, split: str, image_size: int | None = None, channels: int | None = None,
               fraction: float = 1.0, progress: bool = True, labelled: bool = False) -> ImageData | StreamedSplit:
    """A split as the config asks: decoded into memory (:class:`ImageData`), or listed for streaming.

    ``data.stream``: true streams (image folders and shards only), false decodes into memory, auto streams
    when the decoded split would exceed :data:`STREAM_ABOVE_BYTES`. Streaming needs the output size
    (``image_size``, default ``data.image_size``); channels default to 3. One log line says which path runs.
    ``labelled`` (evaluation, the kNN monitor): with ``data.labels``, the split's images that the CSV labels, those
    of the evaluation splits' folders (val, test, ``data.eval_split``) held out of the training split; without it
    (pretraining) every image, as without a CSV.
    """
    image_size = image_size or d.image_size
    labels = d.labels if labelled else None
    eval_splits = tuple(dict.fromkeys(s for s in ("val", "test", d.eval_split) if s != "auto"))
    stream = d.stream
    if stream is True and d.dataset not in STREAMABLE:
        raise ConfigError(f"data.stream=true: {d.dataset} is not a dataset of image files (streamable: "
                          f"{', '.join(STREAMABLE)}); set data.stream=false or auto")
    if stream and d.dataset in STREAMABLE:
        source = open_images(d.dataset, split, d.root, bool(d.allow_incomplete_shards), labels, eval_splits)
        if fraction < 1:
            source = SubsetSource(source, subset_indices(len(source), fraction, d.fraction_seed))
        decoded = len(source) * (channels or 3) * (image_size or 0) ** 2
        if stream is True or decoded > STREAM_ABOVE_BYTES:
            if image_size is None:
                raise ConfigError(f"streaming {d.dataset} needs data.image_size (the side of the crops and of the "
                                  f"evaluation images), e.g. data.image_size=224")
            workers = default_workers() if d.num_workers is None else d.num_workers
            log.info("data: streaming %s/%s (%d images%s) with %d loader workers; crops from full resolution",
                     d.dataset, split, len(source), "" if stream is True else
                     f", {decoded / 2**30:.1f} GiB decoded > {STREAM_ABOVE_BYTES / 2**30:.0f} GiB", workers)
            return StreamedSplit(source, image_size, channels or 3, workers)
    data = load_dataset(d.dataset, split, root=d.root, image_size=image_size, channels=channels, fraction=fraction,
                        seed=d.fraction_seed, progress=progress, allow_incomplete_shards=bool(d.allow_incomplete_shards),
                        labels=labels, eval_splits=eval_splits)
    log.info("data: %s/%s in memory (%d images %dx%dx%d)", d.dataset, split, len(data), *data.images.shape[1:])
    return data


def pixels_and_labels(split: ImageData | StreamedSplit, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The uint8 images at ``indices`` and their labels (unreadable streamed images left out of both)."""
    if isinstance(split, ImageData):
        return split.images[indices], None if split.labels is None else split.labels[indices]
    images, kept = split.pixels(indices)
    return images, None if split.labels is None else split.labels[kept]
