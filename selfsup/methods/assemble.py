"""A method assembled around its backbone for training: built (seeded), started from carried weights, frozen."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from torch import nn

from selfsup.config import Config, ConfigError
from selfsup.methods import method_of
from selfsup.models import BACKBONES, build_backbone, resolve_auto
from selfsup.models.weights import init_weights
from selfsup.train.optim import online_encoder

log = logging.getLogger("selfsup")


def backbone_params(cfg: Config, channels: int, image_size: int) -> dict[str, Any]:
    """The backbone's constructor arguments: the config's, plus the input channels (and a ViT's or a timm model's
    input size) where the constructor takes them (a registered factory may take neither)."""
    kind, params = cfg.model.backbone, dict(cfg.model.params)
    factory = BACKBONES.get(kind)  # None for timm:NAME, whose TimmBackbone takes both

    def takes(name: str) -> bool:
        if factory is None:
            return True
        accepted = inspect.signature(factory).parameters
        return name in accepted or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())

    if takes("in_channels"):
        params.setdefault("in_channels", channels)
    if kind.startswith(("vit", "timm:")) and takes("img_size"):
        params.setdefault("img_size", image_size)
    return resolve_auto(kind, params, image_size)


def build_model(cfg: Config, channels: int, image_size: int, total_steps: int) -> tuple[dict[str, Any], nn.Module]:
    """The backbone's constructor arguments and the method wrapped around it (seeded, in the configured memory format)."""
    torch.manual_seed(cfg.trainer.seed)
    params = backbone_params(cfg, channels, image_size)
    try:
        backbone = build_backbone(cfg.model.backbone, **params)
        cls, method_cfg = method_of(cfg)  # parsed once, when the config was loaded
        method = cls(backbone, method_cfg, total_steps)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"cannot build {cfg.method['name']} on {cfg.model.backbone} {params}: {err}") from err
    if cfg.model.init_weights:
        start_from(method, cfg.model.init_weights)
    if cfg.trainer.channels_last:
        method = method.to(memory_format=torch.channels_last)
    return params, method


def start_from(method: nn.Module, path: str) -> None:
    """``model.init_weights``: the file's weights into the method's encoder, after the method is built (MAE and
    ExtreMA re-initialise the encoder's Linear layers as the authors do), and into every copy of the encoder the
    method holds (the EMA targets of MSN, BYOL, ExtreMA and NNCLR), which then start from them too."""
    encoder = online_encoder(method)
    init_weights(encoder, path, log)
    state = encoder.state_dict()
    for module in method.modules():
        if module is not encoder and type(module) is type(encoder) and module.state_dict().keys() == state.keys():
            module.load_state_dict(state)


def freeze(encoder: nn.Module, spec: int | str | None) -> None:
    """``model.freeze``: the stem and the first k ViT blocks, or ``"all"`` of the encoder (no gradients, no optimiser
    state, frozen blocks and stem in eval mode)."""
    if spec is None:
        return
    if not hasattr(encoder, "freeze_blocks"):
        raise ConfigError(f"model.freeze={spec!r} needs a ViT backbone (it freezes the stem and transformer blocks); "
                          "use model.freeze=null with a ResNet")
    depth = encoder.depth
    if spec == "all":
        encoder.freeze_blocks(depth)
        encoder.requires_grad_(False)
    elif not 0 <= spec <= depth:
        raise ConfigError(f"bad value for model.freeze: {spec}; use a number of blocks in 0..{depth}, all, or null")
    else:
        encoder.freeze_blocks(spec)


def carry_over(method: nn.Module, state: dict[str, torch.Tensor], log_to: logging.Logger | None = None) -> None:
    """Start ``method`` from another method's weights (the previous stage, or ``init_from``): every tensor whose name
    and shape match is copied; the rest (a new head, a new EMA copy) keeps its initialisation. Then the method's
    ``after_carry_over`` hook runs (EMA copies restart from the carried weights)."""
    own = method.state_dict()
    matched = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if not any(k.startswith(("encoder.", "backbone.")) for k in matched):
        raise ConfigError("the previous stage's weights hold no encoder that this stage's method can take (no "
                          "parameter name and shape in common); chain methods that keep the encoder as "
                          "`encoder` (mae, nnclr) on the same model")
    method.load_state_dict(matched, strict=False)
    method.after_carry_over()
    if log_to is not None:
        parts = lambda keys: ", ".join(sorted({k.split(".")[0] for k in keys}))  # noqa: E731
        fresh = [k for k in own if k not in matched]
        log_to.info("carried over %d tensors (%s); initialised afresh: %s", len(matched), parts(matched),
                    parts(fresh) or "nothing")


def assemble_model(cfg: Config, channels: int, image_size: int, total_steps: int,
                   carried: dict[str, torch.Tensor] | None = None,
                   log_to: logging.Logger | None = None) -> tuple[dict[str, Any], nn.Module]:
    """:func:`build_model`, started from the ``carried`` weights of another method (:func:`carry_over`) when given,
    with ``model.freeze`` applied to the online encoder: what the training loop trains."""
    params, method = build_model(cfg, channels, image_size, total_steps)
    if carried is not None:
        carry_over(method, carried, log_to)
    freeze(online_encoder(method), cfg.model.freeze)
    return params, method
