"""Backbones (ResNet, ViT) and heads.

Every backbone exposes ``num_features`` and ``forward(x) -> (B, num_features)``.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

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
    "build_backbone",
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


def build_backbone(kind: str, **kwargs: object) -> nn.Module:
    """Build a backbone by name, e.g. ``build_backbone("resnet18", small_stem=True)`` or
    ``build_backbone("vit_custom", img_size=28, patch_size=4, in_channels=1, embed_dim=192,
    depth=4, num_heads=3)``. ``kwargs`` go to the factory / constructor."""
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone {kind!r}; choose one of {sorted(BACKBONES)}")
    return BACKBONES[kind](**kwargs)
