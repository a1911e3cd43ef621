"""Weights from the ecosystem: read a state dict saved by torchvision, timm or selfsup, and write ours in their names.

Our ResNet differs from torchvision's only in two names (``stem.0`` / ``stem.1`` for ``conv1`` / ``bn1``, and
``shortcut`` for ``downsample``); our ViT from timm's ``VisionTransformer`` in the patch projection's name
(``patch_embed`` for ``patch_embed.proj``) and in the position embedding: timm adds a learned embedding to the [CLS]
token as well, ours does not, so timm's [CLS] row folds into our [CLS] token (the same sum, so the same features).
The key and shape lists the tests check these against were made by the real libraries
(``tests/golden/ecosystem/``).

:func:`init_weights` starts a backbone from such a file (``model.init_weights``): the names are detected, a
classifier head is dropped, a ViT's position embedding is interpolated to the run's patch grid, and a first layer
made for RGB is summed over its input channels for gray images (the same response to a gray image given as RGB).
Any other shape mismatch is an error naming the key.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.config import ConfigError

__all__ = ["init_weights", "naming", "read_state_dict", "selfsup_names", "torchvision_state_dict", "vit_from_timm"]

# Keys of a classifier on top of the backbone, dropped on import: torchvision's fc, timm's head.
_HEADS = re.compile(r"^(fc|head|head_dist|classifier)\.")
# Wrappers around a state dict in checkpoint files (Lightning, DeiT / MAE / timm training scripts).
_CONTAINERS = ("state_dict", "model", "module", "model_state", "teacher", "target_encoder", "encoder")
_PREFIXES = ("module.", "model.", "backbone.", "encoder.", "_orig_mod.")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: safetensors, or a torch file (``.pth``, ``.pt``, ``.bin``) read with
    ``weights_only`` (never code). A checkpoint wrapping its state dict (``{"state_dict": ...}``, ``{"model":
    ...}``) is unwrapped, and a prefix every key shares (``module.``, ``backbone.``, ...) is removed."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model.init_weights: {path} is not a file; give a .safetensors, .pth, .pt or .bin file "
                          f"of weights")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same error for the user
        raise ConfigError(f"model.init_weights: cannot read {path} ({str(err).splitlines()[0][:200]}); it must be "
                          f"a safetensors file or a torch state dict saved with torch.save") from None
    for _ in range(3):  # {"model": {"state_dict": ...}}
        if isinstance(state, dict) and not any(torch.is_tensor(v) for v in state.values()):
            inner = next((state[k] for k in _CONTAINERS if isinstance(state.get(k), dict)), None)
            if inner is None:
                break
            state = inner
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        raise ConfigError(f"model.init_weights: {path} holds no state dict of tensors (found "
                          f"{type(state).__name__}); save one with torch.save(model.state_dict(), path)")
    for prefix in _PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def naming(state: dict[str, torch.Tensor]) -> str:
    """Whose names a state dict uses: ``torchvision`` (a ResNet's ``conv1``), ``timm`` (a ViT's
    ``patch_embed.proj``) or ``selfsup``."""
    if "conv1.weight" in state and "layer1.0.conv1.weight" in state:
        return "torchvision"
    if "patch_embed.proj.weight" in state:
        return "timm"
    return "selfsup"


def selfsup_names(state: dict[str, torch.Tensor], model: nn.Module) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` renamed and reshaped for ``model`` (one of our backbones), and the keys dropped (a classifier)."""
    from selfsup.models.resnet import ResNet
    from selfsup.models.vit import VisionTransformer

    kind = naming(state)
    dropped = sorted(k for k in state if kind != "selfsup" and _HEADS.match(k))
    state = {k: v for k, v in state.items() if k not in dropped}
    if kind == "torchvision":
        if not isinstance(model, ResNet):
            raise ConfigError(f"model.init_weights holds a torchvision ResNet's weights but model.backbone is a "
                              f"{type(model).__name__}; use model.backbone=resnet18 or resnet50")
        state = {_from_torchvision(k): v for k, v in state.items()}
    elif kind == "timm":
        if not isinstance(model, VisionTransformer):
            raise ConfigError(f"model.init_weights holds a timm ViT's weights but model.backbone is a "
                              f"{type(model).__name__}; use model.backbone=vit_small (or vit_tiny, vit_base)")
        state = _from_timm(state, model)
    return _fit_shapes(state, model), dropped


def _from_torchvision(key: str) -> str:
    key = re.sub(r"^conv1\.", "stem.0.", key)
    key = re.sub(r"^bn1\.", "stem.1.", key)
    return key.replace(".downsample.", ".shortcut.")


def _to_torchvision(key: str) -> str:
    key = re.sub(r"^stem\.0\.", "conv1.", key)
    key = re.sub(r"^stem\.1\.", "bn1.", key)
    return key.replace(".shortcut.", ".downsample.")


def _from_timm(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    state = {k.replace("patch_embed.proj.", "patch_embed."): v for k, v in state.items()}
    pos = state.pop("pos_embed", None)
    if pos is not None:
        if model.pos_embed_type != "learned":
            raise ConfigError("model.init_weights holds a learned position embedding (timm's pos_embed) but the ViT "
                              "uses fixed sin-cos ones; set model.params.pos_embed=learned to start from it")
        prefix = pos.shape[1] - math.isqrt(pos.shape[1]) ** 2  # timm's [CLS] row before the square patch grid
        if prefix == 1 and "cls_token" in state:
            state["cls_token"] = state["cls_token"] + pos[:, :1]  # timm adds it to the [CLS]: the same sum
        state["pos_embed"] = pos[:, prefix:]
    return state


def _fit_shapes(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A position embedding resized to the model's patch grid (bicubic, as timm's ``resample_abs_pos_embed``), a
    first layer's input channels adapted (RGB -> gray: summed; gray -> RGB: split in three)."""
    own = model.state_dict()
    out = dict(state)
    pos = out.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape:
        side, dim = int(math.isqrt(pos.shape[1])), pos.shape[-1]
        rows, cols = model.grid_size
        if side * side != pos.shape[1] or dim != own["pos_embed"].shape[-1]:
            raise ConfigError(f"model.init_weights: pos_embed of shape {list(pos.shape)} cannot be resized to "
                              f"{list(own['pos_embed'].shape)} (not a square grid of the same width)")
        grid = pos.reshape(1, side, side, dim).permute(0, 3, 1, 2).float()
        grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", align_corners=False, antialias=True)
        out["pos_embed"] = grid.permute(0, 2, 3, 1).reshape(own["pos_embed"].shape).to(pos.dtype)
    for key in ("stem.0.weight", "patch_embed.weight"):
        if key in out and key in own and out[key].ndim == 4 and out[key].shape[1] != own[key].shape[1]:
            have, want = out[key].shape[1], own[key].shape[1]
            if (have, want) == (3, 1):
                out[key] = out[key].sum(1, keepdim=True)
            elif (have, want) == (1, 3):
                out[key] = out[key].repeat(1, 3, 1, 1) / 3
    return out


def torchvision_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A selfsup ResNet's weights in torchvision's names (``torchvision.models.resnet50()`` loads them with
    ``strict=False``: everything but its classifier ``fc``)."""
    from selfsup.models.resnet import ResNet

    if not isinstance(model, ResNet):
        raise ConfigError(f"torchvision names are a ResNet's; this backbone is a {type(model).__name__}")
    return {_to_torchvision(k): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def init_weights(model: nn.Module, path: str | Path, log: logging.Logger | None = None) -> None:
    """Start ``model`` from the weights in ``path`` (``model.init_weights``): torchvision, timm or selfsup names.
    Every tensor of the model must come from the file, in its shape (after the adaptations above); a key the
    file has and the model has not is reported and ignored, a missing or mis-shaped one is an error naming it."""
    raw = read_state_dict(path)
    state, dropped = selfsup_names(raw, model)
    own = model.state_dict()
    wrong = [f"{k}: {list(v.shape)} in the file, {list(own[k].shape)} in the model" for k, v in state.items()
             if k in own and v.shape != own[k].shape]
    if wrong:
        raise ConfigError(f"model.init_weights: {path} does not fit the model ({'; '.join(wrong[:3])}); match "
                          f"model.backbone and model.params to the weights' architecture")
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    if missing:
        raise ConfigError(f"model.init_weights: {path} lacks {len(missing)} of the model's tensors (e.g. "
                          f"{', '.join(missing[:3])}); match model.backbone and model.params to the weights")
    unexpected = sorted(k for k in state if k not in own)
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
    if log is not None:
        log.info("init_weights: every tensor of the backbone from %s (%s names)%s%s", path, naming(raw),
                 f"; classifier dropped: {', '.join(dropped)}" if dropped else "",
                 f"; ignored (not in the model): {', '.join(unexpected[:5])}" if unexpected else "")


def _timm_vit_args(model: nn.Module) -> tuple[dict[str, object] | None, str]:
    """The arguments of our :class:`VisionTransformer` that compute what a timm ``VisionTransformer`` computes (its
    pooled feature and every token), or None and what our ViT cannot express."""
    if type(model).__name__ != "VisionTransformer":
        return None, f"it is a {type(model).__name__}, not timm's VisionTransformer"
    blocks = list(model.blocks)
    proj = model.patch_embed.proj
    side = tuple(model.patch_embed.img_size or ())
    eps = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    checks = [
        (lambda: bool(blocks) and all(type(b).__name__ == "Block" for b in blocks),
         "its blocks are not timm's plain ViT blocks"),
        (lambda: proj.kernel_size == proj.stride and proj.kernel_size[0] == proj.kernel_size[1] and len(side) == 2
         and side[0] == side[1], "its patches or its image are not square"),
        (lambda: isinstance(model.patch_embed.norm, nn.Identity) and isinstance(model.norm_pre, nn.Identity),
         "it normalises the patch embedding (embed or pre norm)"),
        (lambda: model.num_reg_tokens == 0, f"it has {model.num_reg_tokens} register tokens"),
        (lambda: model.pos_embed is not None, "it has no position embedding"),
        (lambda: model.global_pool in ("token", "avg") and model.attn_pool is None,
         f"it pools with global_pool={model.global_pool!r}"),
        (lambda: model.global_pool != "token" or model.cls_token is not None,
         "it pools a [CLS] token it does not have"),
        (lambda: isinstance(model.fc_norm, nn.Identity), "it normalises the pooled feature (fc_norm)"),
        (lambda: isinstance(model.norm, nn.LayerNorm), "it has no final LayerNorm (final_norm=False)"),
        (lambda: len(eps) == 1, f"its LayerNorms use several epsilons {sorted(eps)}"),
        (lambda: all(isinstance(b.ls1, nn.Identity) and isinstance(b.ls2, nn.Identity) for b in blocks),
         "its blocks use LayerScale (init_values)"),
        (lambda: all(isinstance(getattr(b.attn, n, nn.Identity()), nn.Identity)
                     for b in blocks for n in ("q_norm", "k_norm", "norm"))
         and all(isinstance(getattr(b.mlp, "norm", nn.Identity()), nn.Identity) for b in blocks),
         "its attention or MLP has a norm inside (qk_norm, scale_norm)"),
        (lambda: all(type(b.mlp).__name__ == "Mlp" and type(b.mlp.act) is nn.GELU and b.mlp.act.approximate == "none"
             for b in blocks), "its MLP is not Linear-GELU-Linear"),
        (lambda: all(m.p == 0 for m in model.modules() if isinstance(m, nn.Dropout)), "it uses dropout"),
    ]
    for ok, why in checks:  # in order: the block checks run once the blocks are known to be timm's
        try:
            if not ok():
                return None, why
        except AttributeError:  # a block or layer of another kind than timm's plain ViT's
            return None, "its blocks are not timm's plain ViT blocks"

    qkv_bias = {b.attn.qkv.bias is not None for b in blocks}
    if len(qkv_bias) > 1 or not all(b.attn.proj.bias is not None and b.mlp.fc1.bias is not None
                                    and b.mlp.fc2.bias is not None for b in blocks):
        return None, "its linear layers' biases differ from a ViT's"
    dim = model.embed_dim
    drop = [getattr(b.drop_path1, "drop_prob", 0.0) for b in blocks]
    args = {"img_size": side[0], "patch_size": proj.kernel_size[0], "in_channels": proj.in_channels,
            "embed_dim": dim, "depth": len(blocks), "num_heads": blocks[0].attn.num_heads,
            "mlp_ratio": blocks[0].mlp.fc1.out_features / dim, "qkv_bias": qkv_bias.pop(), "pos_embed": "learned",
            "cls_token": model.cls_token is not None, "drop_path_rate": float(drop[-1]) if drop else 0.0,
            "layer_norm_eps": eps.pop(), "pool": "cls" if model.global_pool == "token" else "mean"}
    return args, ""


def vit_from_timm(model: nn.Module) -> tuple[nn.Module | None, str]:
    """timm's ``VisionTransformer`` (random or pretrained) as our ViT with its weights: the same tokens and pooled
    feature, and the token interface that MSN, MAE and ExtreMA need (dropping patch tokens, [CLS] before the norm).
    Returns ``(our ViT, "")``, or ``(None, why)`` when the timm model has parts ours lacks (register tokens,
    LayerScale, qk-norm, fc_norm pooling, ...)."""
    from selfsup.models.vit import VisionTransformer

    args, why = _timm_vit_args(model)
    if args is None:
        return None, why
    ours = VisionTransformer(**args)
    state, _ = selfsup_names({k: v.detach() for k, v in model.state_dict().items()}, ours)
    ours.load_state_dict(state, strict=True)
    ours.constructor_args = args  # what the run records to rebuild it (selfsup.models.recorded_backbone)
    return ours, ""
