"""``selfsup export RUN_DIR --format torchscript|onnx|timm``: a run's backbone as a file that runs without selfsup.

- ``torchscript``: ``torch.jit.load(FILE)`` (traced at the run's image size; any batch size);
- ``onnx``: an ONNX model (input ``images``, output ``features``, dynamic batch) for ONNX Runtime and friends
  (needs the ``onnx`` extra: ``onnx``, ``onnxscript``; ``onnxruntime`` to run it);
- ``timm``: a ViT's weights as a safetensors state dict named and shaped as timm's ``VisionTransformer``, with the
  constructor arguments that rebuild it (``timm.models.vision_transformer.VisionTransformer(**kwargs)``,
  ``num_classes=0``). ViT variants timm's class cannot express (a conv stem, class-attention blocks) are refused.
- ``torchvision``: a ResNet's weights as a safetensors state dict in torchvision's names
  (``torchvision.models.resnet50().load_state_dict(..., strict=False)``: all but its classifier ``fc``).
- ``state_dict``: any backbone's weights as a safetensors state dict in selfsup's names.

Each of the three weight formats is what ``model.init_weights`` starts a run from (:mod:`selfsup.models.weights`).

The TorchScript and ONNX networks take what ``selfsup.load_backbone``'s model takes: float images
``(B, channels, image_size, image_size)`` normalised with the run's mean and std. Each export writes a sidecar
``FILE.json`` with the input size, channels, mean, std and feature width (also stored inside the TorchScript
file as the extra file ``selfsup.json`` and in the ONNX model's metadata).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from selfsup.checkpoint import CheckpointError, atomic_write, load_backbone
from selfsup.config import ConfigError
from selfsup.models.weights import torchvision_state_dict

__all__ = ["FORMATS", "ExportError", "export", "timm_state_dict"]

FORMATS = {"torchscript": ".pt", "onnx": ".onnx", "timm": ".safetensors", "torchvision": ".safetensors",
           "state_dict": ".safetensors"}
ONNX_OPSET = 18


class ExportError(CheckpointError):
    """The backbone cannot be written in the asked format (e.g. a ViT variant timm cannot express)."""


def export(run_dir: str | Path, fmt: str, out: str | Path | None = None) -> dict[str, Any]:
    """Export a run's backbone; returns a summary (``out``, ``sidecar``, ``format``, ``dim``, ...).

    ``out`` defaults to ``RUN_DIR/export/backbone.<pt|onnx>`` (``backbone_<format>.safetensors`` for the weights).
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    model, meta = load_backbone(run_dir)
    model.eval()
    name = "backbone" if fmt in ("torchscript", "onnx") else f"backbone_{fmt}"
    out = Path(out) if out is not None else run_dir / "export" / f"{name}{FORMATS[fmt]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {
        "format": fmt, "backbone": meta["backbone"], "params": meta["params"], "image_size": meta["image_size"],
        "channels": meta["channels"], "mean": meta["mean"], "std": meta["std"],
        "input": [-1, meta["channels"], meta["image_size"], meta["image_size"]], "dim": int(model.num_features),
        "source": str(run_dir),
    }
    example = torch.randn(2, meta["channels"], meta["image_size"], meta["image_size"])
    if fmt == "torchscript":
        _torchscript(model, example, out, info)
    elif fmt == "onnx":
        _onnx(model, example, out, info)
    else:
        from safetensors.torch import save_file

        if fmt == "timm":
            state, kwargs = timm_state_dict(model)
            info["timm_kwargs"] = kwargs
            info["timm_note"] = ("timm.models.vision_transformer.VisionTransformer(**timm_kwargs) then "
                                 "load_state_dict(safetensors.torch.load_file(FILE)); model(x) is the feature")
        elif fmt == "torchvision":
            try:
                state = torchvision_state_dict(model)
            except ConfigError as err:
                raise ExportError(f"--format torchvision: {err}; use --format state_dict, timm (a ViT), torchscript "
                                  f"or onnx") from None
        else:
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        atomic_write(out, lambda tmp: save_file(state, tmp, metadata={"selfsup": json.dumps(info)}))
    sidecar = out.with_name(out.name + ".json")
    atomic_write(sidecar, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=2)))
    return {"out": str(out), "sidecar": str(sidecar), "format": fmt, "dim": info["dim"],
            "input": info["input"]}


def _torchscript(model: nn.Module, example: torch.Tensor, out: Path, info: dict[str, Any]) -> None:
    # torch 2.13 deprecates TorchScript in favour of torch.export, but torch.jit.load still runs it (and C++ libtorch).
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # input checks become constants at this size
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, example)

    def write(tmp: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(traced, tmp, _extra_files={"selfsup.json": json.dumps(info)})

    atomic_write(out, write)


def _onnx(model: nn.Module, example: torch.Tensor, out: Path, info: dict[str, Any]) -> None:
    try:
        import onnx
        import onnxscript  # noqa: F401 - torch's ONNX exporter needs it
    except ImportError as err:
        raise ExportError(f"ONNX export needs the onnx extra: pip install 'selfsup[onnx]' ({err})") from err
    for name in ("torch.onnx", "onnxscript", "onnx_ir"):  # "torchvision is not installed. Skipping ...", ...
        logging.getLogger(name).setLevel(logging.ERROR)

    def write(tmp: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (example,), dynamo=True, opset_version=ONNX_OPSET,
                                        input_names=["images"], output_names=["features"],
                                        dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
        proto = program.model_proto
        onnx.helper.set_model_props(proto, {"selfsup": json.dumps(info)})
        onnx.save(proto, tmp)

    atomic_write(out, write)


def timm_state_dict(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A selfsup ViT's weights renamed to timm's ``VisionTransformer`` and the constructor arguments that make
    timm compute the same feature (``num_classes=0``: no head).

    Our [CLS] has no position embedding and our sin-cos embedding is a buffer: timm's ``pos_embed`` (a
    parameter, ``(1, 1 + N, D)`` with a [CLS] token) gets a zero row for the [CLS] and the patch embeddings.
    Pooling: ``cls`` -> ``global_pool="token"``; ``mean`` (mean of the normalised patch tokens) ->
    ``global_pool="avg", fc_norm=False``; ``cls_prenorm`` -> ``"token"`` with ``final_norm=False`` (the final
    LayerNorm's weights are then left out; timm >= 1.0.10 has the argument).
    """
    from selfsup.models.vit import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ExportError(f"--format timm writes a ViT's weights; this backbone is a {type(model).__name__} "
                          f"(use --format torchscript or onnx)")
    if len(model.stem) > 0:
        raise ExportError("--format timm: this ViT has a convolutional stem (model.params.conv_stem), which timm's "
                          "VisionTransformer cannot express; use --format torchscript or onnx")
    if model.class_attention:
        raise ExportError("--format timm: this ViT pools with CaiT class-attention blocks "
                          "(num_class_attention_blocks), which timm's VisionTransformer cannot express; use "
                          "--format torchscript or onnx")
    eps = model.norm.eps
    if abs(eps - 1e-6) > 1e-12:
        raise ExportError(f"--format timm: layer_norm_eps={eps} differs from timm's 1e-6; use --format "
                          f"torchscript or onnx")
    block = model.blocks[0]
    dim, depth = model.embed_dim, model.depth
    kwargs: dict[str, Any] = {
        "img_size": model.img_size, "patch_size": model.patch_size, "in_chans": model.in_channels,
        "num_classes": 0, "embed_dim": dim, "depth": depth, "num_heads": block.attn.num_heads,
        "mlp_ratio": block.mlp.fc1.out_features / dim, "qkv_bias": block.attn.qkv.bias is not None,
        "class_token": model.cls_token is not None,
    }
    if model.pool == "mean":
        kwargs.update(global_pool="avg", fc_norm=False)
    else:
        kwargs["global_pool"] = "token"
        if model.pool == "cls_prenorm":
            kwargs["final_norm"] = False
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    pos = model.pos_embed.detach().cpu().float().reshape(1, model.num_patches, dim)
    if model.cls_token is not None:
        pos = torch.cat([torch.zeros(1, 1, dim), pos], dim=1)
    state: dict[str, torch.Tensor] = {"pos_embed": pos,
                                      "patch_embed.proj.weight": ours["patch_embed.weight"],
                                      "patch_embed.proj.bias": ours["patch_embed.bias"]}
    if model.cls_token is not None:
        state["cls_token"] = ours["cls_token"]
    for i in range(depth):
        for name in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            for leaf in ("weight", "bias"):
                key = f"blocks.{i}.{name}.{leaf}"
                if key in ours:
                    state[key] = ours[key]
    if model.pool != "cls_prenorm":
        state["norm.weight"], state["norm.bias"] = ours["norm.weight"], ours["norm.bias"]
    unused = set(ours) - {"patch_embed.weight", "patch_embed.bias", "cls_token", "pos_embed", "norm.weight",
                          "norm.bias"} - {k for k in ours if k.startswith("blocks.")}
    if unused:  # a parameter this mapping does not know: refuse rather than drop it silently
        raise ExportError(f"--format timm: no timm name for {sorted(unused)[:5]}; use --format torchscript or onnx")
    return {k: v.contiguous() for k, v in state.items()}, kwargs
