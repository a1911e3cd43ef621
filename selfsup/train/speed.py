"""The fast-step options, shared by the training loop and ``selfsup bench`` (issue 53): TF32 where fp32 is asked for
on CUDA (``trainer.tf32``), ``torch.compile`` of the backbones (``trainer.compile``), and a switch that makes CUDA
report every host-device synchronisation inside the step (``SELFSUP_SYNC_DEBUG``). The fused / foreach optimiser
steps are :func:`selfsup.train.optim.build_optimizer`'s. Each leaves a CPU run's numbers as they were unless asked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.models.resnet import ResNet
from selfsup.models.vit import DropPath, VisionTransformer
from selfsup.train.optim import online_encoder

# ----------------------------------------------------------------------------------------------
# TF32


def tf32_settings(device: torch.device, precision: str, allowed: bool) -> dict[str, bool]:
    """Whether CUDA's matmuls (``"matmul"``) and cuDNN's convolutions (``"cudnn"``) may use TF32 in a run: ``{}``
    leaves torch's settings alone (other devices; mixed or 16-bit precisions, whose matmuls autocast or store below
    fp32 anyway); on CUDA at ``32-true``, True for both where ``trainer.tf32`` allows it (the DINOv2 scripts set
    ``torch.backends.cuda.matmul.allow_tf32 = True``; torch allows TF32 in cuDNN's convolutions by default), else
    False for both (full fp32: the opt-out).

    The CUDA back-ends' own flags, not ``torch.set_float32_matmul_precision("high")``: in torch 2.13 that also
    switches oneDNN's CPU matmuls to TF32 (``torch.backends.mkldnn.matmul.fp32_precision``), which would change CPU
    results on processors that have it. And their ``allow_tf32`` flags rather than the newer ``fp32_precision``
    ones: after those are set for one back-end, ``torch.get_float32_matmul_precision()`` (which Lightning and
    inductor's cache call) raises on the mix."""
    if torch.device(device).type != "cuda" or precision != "32-true":
        return {}
    return {"matmul": allowed, "cudnn": allowed}


_TF32_FLAGS = {"matmul": torch.backends.cuda.matmul, "cudnn": torch.backends.cudnn}


@contextlib.contextmanager
def fp32_precision(device: torch.device, precision: str, allowed: bool) -> Iterator[None]:
    """:func:`tf32_settings` set for the block and put back after it (a Python caller's process keeps its own)."""
    settings = tf32_settings(device, precision, allowed)
    before = {name: _TF32_FLAGS[name].allow_tf32 for name in settings}
    for name, value in settings.items():
        _TF32_FLAGS[name].allow_tf32 = value
    try:
        yield
    finally:
        for name, value in before.items():
            _TF32_FLAGS[name].allow_tf32 = value


# ----------------------------------------------------------------------------------------------
# torch.compile


def check_compile(device: torch.device) -> None:
    """Refuse ``trainer.compile`` where ``torch.compile`` cannot work, with what is missing and the fix, before any
    work (it would otherwise fail at the first step with a compiler's traceback)."""
    import torch._dynamo
    from torch.utils._triton import has_triton

    why = None
    if not torch._dynamo.is_dynamo_supported():
        why = (f"torch {torch.__version__} cannot compile on this Python ({sys.version.split()[0]}) or platform "
               f"({sys.platform})")
    elif torch.device(device).type == "cuda" and not has_triton():
        why = "compiling for CUDA needs Triton, which does not import here (pip install triton)"
    elif torch.device(device).type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as err:  # InvalidCxxCompiler, or an OS error running it
            why = f"compiling for the CPU needs a C++ compiler (g++ or clang++; CXX names another): {err}"
    if why is not None:
        raise ConfigError(f"trainer.compile=true: {why}; set trainer.compile=false to train without compiling")


def compile_regions(backbone: nn.Module) -> list[nn.Module]:
    """What ``trainer.compile`` compiles in ``backbone``: a ViT's blocks (class-attention blocks too) or a ResNet's
    residual blocks, through which every entry point the methods call passes (``forward``, ``forward_features``,
    ``forward_tokens``, ``forward_feature_map``; compiling the backbone's ``__call__`` would reach ``forward``
    only), each compiled once and reused by the blocks of its kind (torch's "regional compilation", which also
    compiles in a fraction of the time of the whole network); any other backbone (timm's, a user's) whole.

    A ViT with stochastic depth gives each block its own drop rate, a constant that a compiled block is specialised
    on: twelve blocks would compile twelve times, past torch's limit of 8 (the rest then run uncompiled). There the
    blocks' attention and MLP are compiled instead (the same for every block), the residual sums and drop paths
    left as they are."""
    if isinstance(backbone, VisionTransformer):
        if any(isinstance(block.drop_path, DropPath) for block in backbone.blocks):
            return [*(part for block in backbone.blocks for part in (block.attn, block.mlp)), *backbone.ca_blocks]
        return [*backbone.blocks, *backbone.ca_blocks]
    if isinstance(backbone, ResNet):
        return [block for name, stage in backbone.named_children() if name.startswith("layer") for block in stage]
    return [backbone]


def compile_backbones(method: nn.Module, device: torch.device) -> int:
    """``trainer.compile``: compile, in place (``nn.Module.compile``), the regions (:func:`compile_regions`) of the
    backbones of ``method``: the trained encoder, the exported backbone and, for selfsup's ViT and ResNet, every
    copy of them in the method (an EMA teacher's: the modules of their class). In place, the state dict keeps its
    names (no ``_orig_mod.``): a compiled run's checkpoints resume without compiling and the other way round, and
    exports are the same files. Returns how many modules were compiled."""
    check_compile(device)
    backbones = [online_encoder(method), method.backbone]
    ours = {type(b) for b in backbones if isinstance(b, (VisionTransformer, ResNet))}
    copies = [module for module in method.modules() if type(module) in ours]
    regions = {id(r): r for b in [*backbones, *copies] for r in compile_regions(b)}  # each once
    for region in regions.values():
        region.compile()
    return len(regions)


# ----------------------------------------------------------------------------------------------
# Finding host-device synchronisations

# SELFSUP_SYNC_DEBUG=warn (or error) on CUDA: torch.cuda.set_sync_debug_mode for the steps that log, monitor,
# checkpoint or export nothing (those read values on purpose), so that each synchronisation left inside the step
# (an .item(), a bool of a tensor, a data-dependent shape, a blocking copy from the host) warns (or raises) with
# where it is. A tool for a GPU check (benchmarks/gpu_check.sh); unset, nothing changes.
SYNC_DEBUG = "SELFSUP_SYNC_DEBUG"


def sync_debug_mode(device: torch.device) -> str | None:
    """The mode ``SELFSUP_SYNC_DEBUG`` asks for ("warn" or "error"), on CUDA; None when unset or not on CUDA."""
    mode = os.environ.get(SYNC_DEBUG, "").strip().lower()
    if not mode or mode in ("0", "default"):
        return None
    if mode not in ("warn", "error"):
        raise ConfigError(f"environment variable {SYNC_DEBUG}={os.environ[SYNC_DEBUG]!r}: use warn or error (or "
                          f"unset it)")
    return mode if torch.device(device).type == "cuda" else None


@contextlib.contextmanager
def sync_debug(mode: str | None) -> Iterator[None]:
    """torch.cuda's sync debug mode ``mode`` for the block (None: nothing), back to its default after it."""
    if mode is None:
        yield
        return
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
