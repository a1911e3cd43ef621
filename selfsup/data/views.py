"""Multi-view / multi-crop groups: what the config's ``views`` list turns into.

A view spec (``{preset, num, size, params, shared_crop}``) becomes one :class:`ViewGroup` that makes
``num`` views per image, e.g. MSN (Assran et al. 2022, §3): 1 target + 1 anchor at full resolution
and 10 small focal crops; the multi-view BT/VICReg method (Agrawal et al.): M views of one spec;
BYOL/VICReg: two asymmetric specs with one view each.

``shared_crop`` is ExtreMA's "shared crop + colour" scheme (Wu et al., §5.1, Tab. 4): the spec's
random resized crop and flip are drawn once per image, and each of the ``num`` views then applies
the spec's photometric ops to that crop independently.

Streaming (:mod:`selfsup.data.stream`) splits every group the same way: the loader workers take the
crops (:class:`CropSpec`: ``num`` per image, or one shared) from the full-resolution image, and
:meth:`ViewGroup.from_crops` applies the photometric ops on the training device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from selfsup.data.augment import Augment, AugmentConfig

__all__ = ["CropSpec", "ViewGroup", "make_views", "run_by_size"]


@dataclass(frozen=True)
class CropSpec:
    """The geometric part of a view group, drawn by the streaming loader: ``count`` random-resized crops
    (scale, ratio as RandomResizedCrop) of each image, mirrored with probability ``hflip_p``, at ``size`` px."""

    size: int
    scale: tuple[float, float]
    ratio: tuple[float, float]
    hflip_p: float
    count: int


class ViewGroup(nn.Module):
    """``num`` views of a batch from one augmentation config, in one call.

    ``shared_crop=False``: every view is an independent draw of the whole pipeline.
    ``shared_crop=True``: the crop and flip are drawn once per image (no colour, no normalisation),
    then each view draws the colour ops (jitter, grayscale, blur, solarize) and normalises on that crop.
    """

    def __init__(self, config: AugmentConfig, num: int, shared_crop: bool = False) -> None:
        super().__init__()
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise ValueError(f"a view spec needs num >= 1 views, got {num!r}")
        self.num = num
        self.crop_spec = CropSpec(config.size, config.crop_scale, config.crop_ratio, config.hflip_p,
                                  1 if shared_crop else num)
        colour = dataclasses.replace(config, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip_p=0.0)
        self.colour = Augment(colour)
        if shared_crop:
            geometry = dataclasses.replace(config, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0,
                                           mean=None, std=None)
            self.crop: Augment | None = Augment(geometry)
            self.augment = self.colour
        else:
            self.crop = None
            self.augment = Augment(config)

    def forward(self, images: Tensor) -> list[Tensor]:
        """``images`` (B, C, H, W) float in [0, 1] -> ``num`` views (B, C, size, size)."""
        if self.crop is not None:
            images = self.crop(images)
        return [self.augment(images) for _ in range(self.num)]

    def from_crops(self, crops: list[Tensor]) -> list[Tensor]:
        """Streaming: ``crop_spec.count`` crops (B, C, size, size) float in [0, 1], already cropped and
        flipped by the loader -> ``num`` views, the photometric ops drawn per view."""
        if len(crops) != self.crop_spec.count:
            raise ValueError(f"expected {self.crop_spec.count} crops for this view group, got {len(crops)}")
        return [self.colour(crops[0] if len(crops) == 1 else crops[i]) for i in range(self.num)]


def make_views(images: Tensor, groups: list[ViewGroup]) -> list[Tensor]:
    """All views of ``images``, flat and in spec order: ``groups[0].num`` views, then ``groups[1].num``, ..."""
    if not groups:
        raise ValueError("make_views needs at least one ViewGroup (the config's `views` list is empty)")
    return [view for group in groups for view in group(images)]


def run_by_size(fn: Callable[[Tensor], Tensor], views: list[Tensor]) -> list[Tensor]:
    """``fn`` once per run of consecutive views of one size, on their concatenation: a multi-crop step's batching
    (DINO's ``MultiCropWrapper``: the global crops in one call, the local ones in another; a BatchNorm then sees
    one resolution per call). Returns one output per run, in view order (``torch.cat`` gives the views' order)."""
    outputs, start = [], 0
    for end in range(1, len(views) + 1):
        if end == len(views) or views[end].shape[1:] != views[start].shape[1:]:
            outputs.append(fn(torch.cat(views[start:end])))
            start = end
    return outputs
