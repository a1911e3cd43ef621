"""Multi-view / multi-crop specifications.

A method asks for views as a list of ``ViewSpec`` (how many crops, which pipeline), e.g.
MSN (Assran et al. 2022, §3): 1 target + 1 anchor at full resolution and 10 small focal crops;
the multi-view BT/VICReg method (Agrawal et al.): M views of one spec; BYOL/VICReg: two
asymmetric specs with one crop each.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from selfsup.data.augment import Augment, AugmentConfig

__all__ = ["ViewSpec", "make_views"]


@dataclass
class ViewSpec:
    """``num`` independent crops drawn with the ``augment`` pipeline."""

    num: int
    augment: AugmentConfig

    def __post_init__(self) -> None:
        if isinstance(self.num, bool) or not isinstance(self.num, int) or self.num < 1:
            raise ValueError(f"ViewSpec.num must be a positive int (crops with this spec), got {self.num!r}")
        if not isinstance(self.augment, AugmentConfig):
            raise TypeError(f"ViewSpec.augment must be an AugmentConfig, got {type(self.augment).__name__}")


def make_views(images: Tensor, specs: list[ViewSpec], augmenters: list[Augment]) -> list[Tensor]:
    """Augment ``images`` (B, C, H, W float in [0, 1]) into views, in spec order.

    Returns a flat list: ``specs[0].num`` views from ``augmenters[0]``, then ``specs[1].num``
    from ``augmenters[1]``, ... Each view is an independent draw, (B, C, size_i, size_i).
    ``augmenters[i]`` must be built from ``specs[i].augment`` (built once, moved to the device).
    """
    if len(specs) != len(augmenters):
        raise ValueError(f"make_views needs one Augment per ViewSpec, got {len(specs)} specs and "
                         f"{len(augmenters)} augmenters")
    if not specs:
        raise ValueError("make_views needs at least one ViewSpec")
    for i, (spec, augment) in enumerate(zip(specs, augmenters)):
        if augment.config != spec.augment:
            raise ValueError(f"augmenters[{i}] was built from a different AugmentConfig than specs[{i}]; "
                             f"build it with Augment(specs[{i}].augment)")
    return [augment(images) for spec, augment in zip(specs, augmenters) for _ in range(spec.num)]
