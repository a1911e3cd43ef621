"""Multi-view / multi-crop groups: what the config's ``views`` list turns into.

A view spec (``{preset, num, size, params, shared_crop}``) becomes one :class:`ViewGroup` that makes
``num`` views per image, e.g. MSN (Assran et al. 2022, §3): 1 target + 1 anchor at full resolution
and 10 small focal crops; the multi-view BT/VICReg method (Agrawal et al.): M views of one spec;
BYOL/VICReg: two asymmetric specs with one view each.

``shared_crop`` is ExtreMA's "shared crop + colour" scheme (Wu et al., §5.1, Tab. 4): the spec's
random resized crop and flip are drawn once per image, and each of the ``num`` views then applies
the spec's photometric ops to that crop independently.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from selfsup.data.augment import Augment, AugmentConfig

__all__ = ["ViewGroup", "make_views"]


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
        if shared_crop:
            geometry = dataclasses.replace(config, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0,
                                           mean=None, std=None)
            colour = dataclasses.replace(config, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip_p=0.0)
            self.crop: Augment | None = Augment(geometry)
            self.augment = Augment(colour)
        else:
            self.crop = None
            self.augment = Augment(config)

    def forward(self, images: Tensor) -> list[Tensor]:
        """``images`` (B, C, H, W) float in [0, 1] -> ``num`` views (B, C, size, size)."""
        if self.crop is not None:
            images = self.crop(images)
        return [self.augment(images) for _ in range(self.num)]


def make_views(images: Tensor, groups: list[ViewGroup]) -> list[Tensor]:
    """All views of ``images``, flat and in spec order: ``groups[0].num`` views, then ``groups[1].num``, ..."""
    if not groups:
        raise ValueError("make_views needs at least one ViewGroup (the config's `views` list is empty)")
    return [view for group in groups for view in group(images)]
