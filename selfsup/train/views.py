"""The views of each training step: normalisation, view groups, and :class:`StepViews` (in memory or streamed).

Every step's views are seeded by the seed and the step, so a resumed run draws the same views.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from selfsup.config import Config, ConfigError
from selfsup.data.augment import augment_config
from selfsup.data.datasets import DataError, ImageData, resolve_eval_split
from selfsup.data.sampler import StepSampler
from selfsup.data.stream import StreamedSplit, crop_batches, open_split, pixels_and_labels
from selfsup.data.views import CropSpec, ViewGroup, make_views

log = logging.getLogger("selfsup")


def image_shape(data: ImageData | StreamedSplit) -> tuple[int, int]:
    """``(channels, image_size)`` of the training images (a streamed split's are set when it is opened)."""
    if isinstance(data, ImageData):
        return data.images.shape[1], data.images.shape[2]
    return data.channels, data.image_size


def normalization(data: ImageData | StreamedSplit, cfg: Config) -> tuple[list[float], list[float]]:
    """Per-channel mean and std: from the config, or measured on a subset of the training images
    (10,000 in memory; 1,000 decoded when streaming)."""
    if cfg.data.mean is not None and cfg.data.std is not None:
        return list(cfg.data.mean), list(cfg.data.std)
    count = 10000 if isinstance(data, ImageData) else 1000
    sample = pixels_and_labels(data, torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:count])[0]
    sample = sample.float() / 255
    mean = sample.mean(dim=(0, 2, 3)).tolist()
    std = sample.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()
    return [round(m, 4) for m in mean], [round(s, 4) for s in std]


def build_view_groups(cfg: Config, image_size: int, mean: list[float], std: list[float]) -> list[ViewGroup]:
    """One :class:`ViewGroup` per view spec (a spec with ``num: k`` gives k views)."""
    groups = []
    for i, view in enumerate(cfg.views):
        try:
            aug_cfg = augment_config(view.preset, view.size or image_size, mean=tuple(mean), std=tuple(std), **view.params)
            groups.append(ViewGroup(aug_cfg, view.num, view.shared_crop))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"views.{i}: {err}") from err
    return groups


def views_maker(method: nn.Module | None, groups: list[ViewGroup]) -> Callable[[torch.Tensor, int], list[torch.Tensor]]:
    """``(images in [0, 1], step) -> views``: the config's view groups, or the method's own ``make_views``
    (MAST draws its pairs itself: its loss needs to know which augmentations each pair got)."""
    if method is not None and method.OWN_VIEWS:
        method.attach_views(groups)
        return method.make_views
    return lambda images, step: make_views(images, groups)


def crop_specs(image_size: int, groups: list[ViewGroup], method: nn.Module | None) -> list[CropSpec]:
    """What the streaming loader crops: every view group's crops, or, for a method that draws its own views
    (MAST), each image's centre square at ``image_size`` (``data.image_size``)."""
    if method is not None and method.OWN_VIEWS:
        return [CropSpec(image_size, (1.0, 1.0), (1.0, 1.0), 0.0, 1)]
    return [g.crop_spec for g in groups]


def views_from_crops(crops: list[torch.Tensor], groups: list[ViewGroup],
                     make: Callable[[torch.Tensor, int], list[torch.Tensor]] | None, step: int) -> list[torch.Tensor]:
    """A streamed step's views from the loader's crops (float in [0, 1] on the device, one per slot of
    :func:`crop_specs`): each group's photometric ops on its crops, or ``make`` (the :func:`views_maker` of a method
    that draws its own views, None otherwise) on the centre squares."""
    if make is not None:
        return make(crops[0], step)
    slots = iter(crops)
    return [v for g in groups for v in g.from_crops([next(slots) for _ in range(g.crop_spec.count)])]


class StepViews:
    """The views of every step of ``[start, stop)``, in order, seeded by the step (so a resumed run gets the same).

    In memory: the step's images are indexed out of the uint8 tensor and every op runs on the device.
    Streaming: loader workers decode the images and take the crops at full resolution; the photometric ops
    run on the device. A method that draws its own views (MAST) gets, when streaming, each image's centre
    square at ``data.image_size`` from the loader and crops it on the device. ``unreadable`` counts the
    streamed images replaced because their file was unreadable.
    """

    def __init__(self, data: ImageData | StreamedSplit, sampler: StepSampler, groups: list[ViewGroup], seed: int,
                 start: int, stop: int, device: torch.device, memory_format: torch.memory_format,
                 method: nn.Module | None = None, reported: set[str] | None = None) -> None:
        # the groups' buffers (normalisation) to the device the views are made on
        self.data, self.sampler, self.groups, self.seed = data, sampler, [g.to(device) for g in groups], seed
        self.device, self.memory_format = device, memory_format
        self.streamed = isinstance(data, StreamedSplit)
        self.own_views = method is not None and method.OWN_VIEWS
        self.make = views_maker(method, self.groups)
        self.unreadable = 0
        self.reported = set() if reported is None else reported  # unreadable files named already this session
        if self.streamed:
            self.batches = iter(crop_batches(data.source, sampler, crop_specs(data.image_size, groups, method), data.channels,
                                             seed, start, stop, data.workers, pin_memory=device.type == "cuda"))

    def _on_device(self, images: torch.Tensor) -> torch.Tensor:
        return images.to(self.device, non_blocking=True).float().div_(255)

    def __call__(self, step: int, rank: int, world_size: int) -> list[torch.Tensor]:
        if self.streamed:
            batch = next(self.batches)
            for name in batch.unreadable:  # each file once per session: an epoch meets it again
                if name not in self.reported:
                    log.warning("unreadable image replaced by another: %s", name)
                    self.reported.add(name)
            self.unreadable += len(batch.unreadable)
            crops = [self._on_device(c) for c in batch.crops]
            torch.manual_seed(self.seed * 1_000_003 + step * world_size + rank)
            views = views_from_crops(crops, self.groups, self.make if self.own_views else None, step)
        else:
            images = self._on_device(self.data.images[self.sampler.indices(step)])
            torch.manual_seed(self.seed * 1_000_003 + step * world_size + rank)
            views = self.make(images, step)
        return [view.contiguous(memory_format=self.memory_format) for view in views]


def sample_images(cfg: Config, data: ImageData | StreamedSplit, channels: int, image_size: int, mean: list[float],
                  std: list[float], count: int = 8) -> torch.Tensor:
    """The first ``count`` images of the evaluation split (the training split when there is none), normalised:
    what the methods' pictures show (MAE's reconstructions)."""
    try:
        name = resolve_eval_split(cfg.data).name  # data.eval_split=auto resolved as evaluation resolves it
        split = data if name is None else open_split(cfg.data, name, image_size=image_size, channels=channels,
                                                     progress=False)
    except (DataError, OSError, ValueError):  # no evaluation split (e.g. an image folder without test/)
        split = data
    images = pixels_and_labels(split, torch.arange(min(count, len(split))))[0].float() / 255
    return (images - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
