"""Backbones (ResNet, ViT) and heads.

Every backbone exposes ``num_features`` and ``forward(x) -> (B, num_features)``.
"""
from __future__ import annotations

import logging
import typing
from collections.abc import Callable

import torch
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
from selfsup.models.weights import vit_from_timm

log = logging.getLogger("selfsup")

__all__ = [
    "BACKBONES",
    "GaussianHead",
    "GeM",
    "Prototypes",
    "ResNet",
    "TimmBackbone",
    "VisionTransformer",
    "backbone_class",
    "build_backbone",
    "check_backbone",
    "check_backbone_params",
    "mlp",
    "recorded_backbone",
    "register_backbone",
    "resolve_auto",
    "timm_backbone",
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


BUILT_IN = frozenset(BACKBONES)


def register_backbone(name: str, factory: Callable[..., nn.Module]) -> None:
    """Make ``model.backbone: NAME`` build ``factory(**model.params)``: your own ``nn.Module`` for any method that
    takes pooled features (VICReg, Barlow Twins, BYOL, NNCLR, MAST, multi-view). The module needs ``num_features``
    (an int) and ``forward(images) -> (B, num_features)``; a factory that takes ``in_channels`` / ``img_size``
    gets the data's. MSN, MAE and ExtreMA mask the patch tokens of selfsup's ``VisionTransformer`` and need it.

    Registration lasts for the Python process: a new process that evaluates or resumes the run registers the same
    name first (``backbone.json`` records it)."""
    if not isinstance(name, str) or not name or name in BUILT_IN:
        raise ValueError(f"register_backbone: {name!r} is empty or a built-in backbone's name; choose another")
    if not callable(factory):
        raise TypeError(f"register_backbone: the factory for {name!r} must be callable (a class or a function)")
    BACKBONES[name] = factory


def check_backbone(module: nn.Module, kind: str) -> nn.Module:
    """The protocol every backbone keeps: an ``nn.Module`` with an integer ``num_features``."""
    width = getattr(module, "num_features", None)
    if not isinstance(module, nn.Module) or isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"backbone {kind!r} built a {type(module).__name__} without a positive integer "
                          f"num_features; a backbone is an nn.Module with num_features (its feature width) and "
                          f"forward(images) -> (batch, num_features)")
    return module


class TimmBackbone(nn.Module):
    """A timm model by name (``model.backbone: timm:resnet50``) without its classifier: ``forward`` gives timm's
    pooled pre-logits feature, ``num_features`` its width. Its weights are timm's initialisation, or its pretrained
    ones with ``model.params.pretrained: true`` where timm can fetch them (:func:`timm_backbone` turns a plain timm ViT
    into ours)."""

    def __init__(self, name: str, in_channels: int = 3, img_size: int | None = None, **kwargs: object) -> None:
        super().__init__()
        import timm

        args = {"pretrained": False, "num_classes": 0, "in_chans": in_channels, **kwargs}
        try:
            self.model = timm.create_model(name, **args, **({"img_size": img_size} if img_size else {}))
        except TypeError:  # a model without an input size (a CNN)
            self.model = timm.create_model(name, **args)
        self.num_features = int(self.model.num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def timm_backbone(name: str, **kwargs: object) -> nn.Module:
    """``model.backbone: timm:NAME``: timm's model, built by timm (its weights, pretrained ones included). A plain
    timm ``VisionTransformer`` (``vit_small_patch16_224`` and the like) comes back as our ViT with those weights: the
    same tokens and feature, and the token interface MSN, MAE, ExtreMA and iBOT need (dropping patch tokens); its
    run records it as ``vit_custom`` (:func:`recorded_backbone`), so its export loads where timm is absent. Any other
    timm model is wrapped as it is (:class:`TimmBackbone`)."""
    wrapped = TimmBackbone(name, **kwargs)
    if any(c.__name__ == "VisionTransformer" for c in type(wrapped.model).__mro__):
        ours, why = vit_from_timm(wrapped.model)
        if ours is not None:
            log.info("timm:%s runs as selfsup's ViT with timm's weights (%s)", name, ", ".join(
                f"{k}={v}" for k, v in ours.constructor_args.items()))
            return ours
        log.warning("timm:%s stays timm's own module: selfsup's ViT cannot express it (%s), so methods that drop "
                    "patch tokens (MSN, MAE, ExtreMA, iBOT) cannot train it", name, why)
    return wrapped


def recorded_backbone(kind: str, params: dict[str, object], backbone: nn.Module) -> tuple[str, dict[str, object]]:
    """The name and arguments ``backbone.json`` records to rebuild ``backbone``: ``kind`` and ``params``, except for a
    timm ViT turned into ours (:func:`timm_backbone`), recorded as ``vit_custom`` with our arguments."""
    if kind.startswith("timm:") and isinstance(backbone, VisionTransformer):
        return "vit_custom", dict(backbone.constructor_args)
    return kind, params


def timm_problem(kind: str) -> str | None:
    """Why ``model.backbone: timm:NAME`` cannot be built here (timm absent, or no such model), or None."""
    try:
        import timm
    except Exception as err:  # noqa: BLE001 - timm absent, or failing to import (e.g. a torchvision for another torch)
        return (f"model.backbone={kind} needs timm, which does not import here ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:120]}); install timm where it imports, or use a built-in backbone "
                f"(resnet18, resnet50, vit_tiny, vit_small, vit_base) with model.init_weights=FILE to start from "
                f"timm's or torchvision's weights")
    name = kind[len("timm:"):]
    if not timm.is_model(name.split(".")[0]):  # "vit_small_patch16_224.augreg_in21k": a model and its weights' tag
        return f"model.backbone={kind}: timm has no model named {name!r} (see timm.list_models())"
    return None


def backbone_class(kind: str) -> type[nn.Module]:
    """The class a named backbone builds (a preset's factory returns it), whose constructor's annotations declare the
    types and ranges of ``model.params``."""
    factory = BACKBONES[kind]
    if isinstance(factory, type) or kind not in BUILT_IN:
        return factory
    return typing.get_type_hints(factory)["return"]


#: ``model.params`` that may be ``auto``: chosen from the input's side by :func:`resolve_auto` (ResNets' stem, ViTs' patch).
AUTO_PARAMS = {ResNet: "small_stem", VisionTransformer: "patch_size"}


def resolve_auto(kind: str, params: dict[str, object], image_size: int) -> dict[str, object]:
    """``model.params`` with ``auto`` values chosen for ``image_size`` px inputs, so that a preset follows
    ``data.image_size`` (its first feature map, or its token grid, stays about the same size):

    - ResNets, ``small_stem: auto``: up to 48 px the CIFAR stem (3x3, stride 1: a 32 px image keeps 32 x 32 maps); up to
      96 px the same stem at stride 2 (64 px -> 32 x 32); above, the ImageNet stem (stride 4: 224 px -> 56 x 56);
    - ViTs, ``patch_size: auto``: an 8 x 8 grid of patches below 128 px (64 px -> patches of 8), patches of 16 from
      128 px (224 px -> 14 x 14, ViT-S/16's grid); a side that does not divide gets the nearest patch that does.

    The resolved values are what the run records (``backbone.json``) and what an export rebuilds."""
    key = AUTO_PARAMS.get(backbone_class(kind)) if kind in BACKBONES else None
    if key is None or params.get(key) != "auto":
        return params
    out = dict(params)
    if key == "small_stem":
        out["small_stem"] = image_size <= 96
        if out["small_stem"]:
            out.setdefault("stem_stride", 1 if image_size <= 48 else 2)
    else:  # the divisor of the side nearest to that patch (28 px -> 4, a 7 x 7 grid)
        target = 16 if image_size >= 128 else image_size / 8
        out["patch_size"] = min((p for p in range(1, image_size + 1) if image_size % p == 0),
                                key=lambda p: (abs(p - target), -p))
    return out


def check_backbone_params(kind: str, params: dict[str, object]) -> None:
    """``model.params`` against the backbone's constructor: known names, each value of its type and in its range
    (``selfsup.config.check_arguments``), so that a bad value fails before any data is read. An ``auto`` value
    (:data:`AUTO_PARAMS`) is checked once the image size is known, when the backbone is built."""
    if kind.startswith("timm:"):
        problem = timm_problem(kind)
        if problem:
            raise ConfigError(problem)
        return
    if kind not in BACKBONES:
        raise ConfigError(f"bad value for model.backbone: {kind!r}; allowed values: {', '.join(BACKBONES)} (or a "
                          f"name given to selfsup.register_backbone in this process)")
    cls = backbone_class(kind)
    if params.get(AUTO_PARAMS.get(cls, "")) == "auto":
        params = {k: v for k, v in params.items() if k != AUTO_PARAMS[cls]}
    check_arguments(cls, params, "model.params.")


def build_backbone(kind: str, **kwargs: object) -> nn.Module:
    """Build a backbone by name, e.g. ``build_backbone("resnet18", small_stem=True)`` or
    ``build_backbone("vit_custom", img_size=28, patch_size=4, in_channels=1, embed_dim=192,
    depth=4, num_heads=3)``. ``kwargs`` go to the factory / constructor."""
    if kind.startswith("timm:"):
        return check_backbone(timm_backbone(kind[len("timm:"):], **kwargs), kind)
    if kind not in BACKBONES:
        raise ValueError(f"unknown backbone {kind!r}; choose one of {sorted(BACKBONES)}, or register it first "
                         f"with selfsup.register_backbone({kind!r}, factory)")
    return check_backbone(BACKBONES[kind](**kwargs), kind)
