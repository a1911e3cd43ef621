"""Backbones (ResNet, ViT) and heads.

Every backbone exposes ``num_features`` and ``forward(x) -> (B, num_features)``.
"""
from __future__ import annotations

import typing
from collections.abc import Callable

from torch import nn

from selfsup.config import ConfigError, check_arguments

from selfsup.models.heads import GaussianHead, GeM, Prototypes, mlp, xavier_linears_
from selfsup.models.resnet import ResNet, resnet18, resnet50
from selfsup.models.vit import (
    VisionTransformer,
    sincos_pos_embed_2d,
    vit_base,
    vit_laptop,
    vit_small,
    vit_tiny,
)

__all__ = [
    "BACKBONES",
    "GaussianHead",
    "GeM",
    "Prototypes",
    "ResNet",
    "VisionTransformer",
    "backbone_class",
    "build_backbone",
    "check_backbone_params",
    "mlp",
    "xavier_linears_",
    "resnet18",
    "resnet50",
    "sincos_pos_embed_2d",
    "vit_base",
    "vit_laptop",
    "vit_small",
    "vit_tiny",
]

#: Named backbones. ``*_custom`` (alias ``resnet`` / ``vit``) take every constructor argument.
BACKBONES: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet_custom": ResNet,
    "resnet": ResNet,
    "vit_laptop": vit_laptop,
    "vit_tiny": vit_tiny,
    "vit_small": vit_small,
    "vit_base": vit_base,
    "vit_custom": VisionTransformer,
    "vit": VisionTransformer,
}


def backbone_class(kind: str) -> type[nn.Module]:
    """The class a named backbone builds (a preset's factory returns it), whose constructor's annotations declare the
    types and ranges of ``model.params``."""
    factory = BACKBONES[kind]
    return factory if isinstance(factory, type) else typing.get_type_hints(factory)["return"]


def check_backbone_params(kind: str, params: dict[str, object]) -> None:
    """``model.params`` against the backbone's constructor: known names, each value of its type and in its range
    (``selfsup.config.check_arguments``), so that a bad value fails before any data is read."""
    if kind not in BACKBONES:
        raise ConfigError(f"bad value for model.backbone: {kind!r}; allowed values: {', '.join(BACKBONES)}")
    check_arguments(backbone_class(kind), params, "model.params.")


def build_backbone(kind: str, **kwargs: object) -> nn.Module:
    """Build a backbone by name, e.g. ``build_backbone("resnet18", small_stem=True)`` or
    ``build_backbone("vit_custom", img_size=28, patch_size=4, in_channels=1, embed_dim=192,
    depth=4, num_heads=3)``. ``kwargs`` go to the factory / constructor."""
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone {kind!r}; choose one of {sorted(BACKBONES)}")
    return BACKBONES[kind](**kwargs)
