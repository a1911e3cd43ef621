"""Golden values from the authors' code, for ``tests/test_golden.py`` (issue 28, section 1).

For each method this script builds the authors' model and loss (imported from a checkout of their public
repository, whose directory is passed on the command line) with a small configuration, copies nothing of their
code, runs one forward/backward pass on fixed images and masks and writes ``tests/golden/<case>.npz``:

* ``meta``: JSON with the repository, commit, command, the small configuration and notes;
* ``input/<name>``: the images and the kept-token indices fed to both sides;
* ``student/<our name>`` (and ``teacher/<our name>``): the weights, renamed to selfsup's parameter names by the
  written name maps below (``_deit_to_ours``, ``_extrema_vit_to_ours``, ...), including re-parametrisations
  (a [CLS] position embedding folded into the [CLS] token, separate k / v projections packed into one kv);
* ``<case>/loss`` and ``<case>/grad/<our name>``: the authors' loss and the gradients of every student parameter;
* ``teacher_after/<our name>``: the EMA teacher after one update, for the EMA methods.

The tests rebuild selfsup's model from ``meta["config"]``, load the arrays and compare; they need none of the
authors' code. Nothing of the authors' code is stored in this project: their modules are imported from the
directory given (``--repo``), with stand-ins for imports that only data loading and logging need (see
``_install_stubs``) and the runtime patches listed in ``tests/golden/README.md``.

    python benchmarks/golden.py msn --repo /tmp/anchors_golden/msn
    python benchmarks/golden.py extrema --repo /tmp/anchors_golden/extrema
    python benchmarks/golden.py dino --repo /tmp/anchors_golden/dino
    python benchmarks/golden.py ibot --repo /tmp/anchors_golden/ibot

Get the repositories as in ``../shared/anchors-bench/README.md`` (``git archive`` of the public repos into a
directory outside every repository).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.abc
import importlib.util
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DTYPE = torch.float64  # the authors' pass: float64 on float32 weights and inputs (--dtype)
OUT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "golden")


# ----------------------------------------------------------------------------------------------- helpers
class _InertMeta(type):
    """Class attributes of a stand-in class are stand-in classes too (``InterpolationMode.NEAREST`` as a dict key)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertMeta(name, (), dict(_INERT))


# an inert class: constructible with anything; an instance called on something returns it (a decorator)
_INERT = {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: (a[0] if a else None)}


class _StubModule(types.ModuleType):
    """A module whose unknown attributes are inert classes (enough for module-level imports and decorators)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _InertMeta(name, (), dict(_INERT))
        setattr(self, name, cls)
        return cls


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _stub(name: str, **attrs: object) -> None:
    if name in sys.modules:
        return
    mod = _StubModule(name)
    mod.__path__ = []  # type: ignore[attr-defined]
    for key, value in attrs.items():
        setattr(mod, key, value)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import under the given top-level names with a ``_StubModule`` (e.g. all of ``ffcv``)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module) -> None:
        pass


def _stub_tree(*roots: str) -> list[str]:
    missing = tuple(r for r in roots if not _importable(r))
    if missing:
        sys.meta_path.append(_StubFinder(missing))
    return list(missing)


def _install_stubs() -> list[str]:
    """Stand-ins for modules the authors' files import but never use in the model or loss.

    torchvision / timm cannot be imported here (CUDA wheels on a CPU torch): MSN's msn_train imports the data
    manager (torchvision transforms); ExtreMA's vits.py imports ``timm.models.vision_transformer._cfg`` (stored
    as ``default_cfg`` only) and lib/misc.py ``from torch._six import inf`` (module removed in torch 2.0) and
    uses ``np.float`` (removed in NumPy 1.24) in its sin-cos position embedding.
    """
    done = []
    done += _stub_tree("torchvision")  # every torchvision.* module: inert classes
    if not _importable("timm"):
        for name in ("timm", "timm.models", "timm.optim", "timm.optim.optim_factory"):
            _stub(name)
        _stub("timm.models.vision_transformer", _cfg=lambda url="", **kw: {"url": url, **kw})
        done.append("timm")
    if not _importable("torch._six"):
        _stub("torch._six", inf=math.inf)
        done.append("torch._six")
    if not _importable("tensorboard"):
        sys.modules.pop("torch.utils.tensorboard", None)
        _stub("torch.utils.tensorboard")
    if not _importable("termcolor"):
        _stub("termcolor", colored=lambda s, *a, **k: s)
    if not _importable("kappadata"):  # MAE-CT utils/naming_util.py: ``isinstance(obj, KDSubset)`` for model names
        _stub("kappadata")
        done.append("kappadata")
    if not hasattr(np, "float"):
        np.float = float  # type: ignore[attr-defined]
        done.append("numpy.float = float")
    return done


def _commit(repo: str) -> str:
    """The commit of ``repo`` if it is a git checkout (a ``git archive`` export is not: pass ``--commit``)."""
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (pass --commit)"
    return out if len(out) == 40 else "unknown (pass --commit)"


@contextlib.contextmanager
def _on_path(repo: str) -> Iterator[None]:
    sys.path.insert(0, repo)
    try:
        yield
    finally:
        sys.path.remove(repo)


def _perturb(module: nn.Module, scale: float, generator: torch.Generator) -> None:
    """Add ``scale * N(0, 1)`` to every parameter, so no LayerNorm/BatchNorm weight is exactly 1 and no bias 0
    (a dropped bias or affine would then change the numbers)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:  # not ExtreMA's fixed sin-cos position embedding
                p.add_(scale * torch.randn(p.shape, generator=generator))


# Parameters whose gradients / EMA values are stored for the secondary cases (the primary case stores all), to keep
# each file small: the patch embedding, [CLS], first attention, last MLP, final norm, every head layer's weight.
SUBSET = ("encoder.patch_embed.weight", "encoder.cls_token", "encoder.blocks.0.attn.qkv.weight",
          "encoder.blocks.1.mlp.fc2.weight", "encoder.ca_blocks.1.attn.kv.weight", "encoder.norm.bias",
          "projector.0.weight", "projector.1.weight", "projector.6.weight", "predictor.0.weight",
          "predictor.3.weight", "prototypes.weight")


EMA_SUBSET = ("encoder.patch_embed.weight", "encoder.cls_token", "encoder.blocks.1.attn.qkv.bias", "encoder.norm.bias",
              "projector.1.weight", "projector.6.weight")  # the EMA is elementwise: a few tensors show it


def _subset(arrays: dict[str, np.ndarray], names: tuple[str, ...] = SUBSET) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if k.split("/")[-1] in names}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().clone().numpy() if t.is_floating_point() else t.detach().cpu().clone().numpy()


def _stored_dtype(key: str) -> type:
    """float64 for what must be exact: losses, the EMA teacher after the update, momentum schedules, the NNCLR
    queue (unit vectors), and the [CLS] token (ours is their [CLS] plus their [CLS] position row, a sum that float32
    would round); float32 for the rest. Weights and inputs are made in float32 and the authors' pass runs in float64
    on them, so storing them as float32 is exact; gradients lose only float32 rounding (relative 6e-8)."""
    exact = (key.endswith(("/loss", "cls_token", "queue", "queue_after", "center", "center_after", "center2",
                           "center2_after"))
             or key.startswith(("teacher_after/", "schedule/")) or "/teacher_after/" in key)
    return np.float64 if exact else np.float32


def _save(name: str, meta: dict, arrays: dict[str, np.ndarray], out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    arrays = {k: v.astype(_stored_dtype(k)) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    path = os.path.join(out_dir, f"{name}.npz")
    np.savez_compressed(path, meta=np.array(json.dumps(meta, indent=1, sort_keys=True)), **arrays)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")
    return path


def _renamed(params: dict[str, torch.Tensor], mapping: Callable[[str, torch.Tensor], dict[str, torch.Tensor]],
             prefix: str) -> dict[str, np.ndarray]:
    """Apply a name map (their name, tensor) -> {our name: tensor} to every entry; every entry must map."""
    out: dict[str, np.ndarray] = {}
    for name, value in params.items():
        for ours, tensor in mapping(name, value).items():
            key = f"{prefix}/{ours}"
            if key in out:
                out[key] = out[key] + _np(tensor)  # two of theirs add up to one of ours ([CLS] + its pos-emb)
            else:
                out[key] = _np(tensor)
    return out


def _merge_parts(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Join ``name#k`` / ``name#v`` parts (separate projections packed into one Linear) along dim 0."""
    out: dict[str, np.ndarray] = {}
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        if "#" in key:
            base, part = key.split("#")
            parts.setdefault(base, {})[part] = value
        else:
            out[key] = value
    for base, p in parts.items():
        out[base] = np.concatenate([p["k"], p["v"]], axis=0)
    return out


# ------------------------------------------------------------------------------------------------- MSN
def _deit_to_ours(prefix: str, head: dict[str, str]) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """MSN's src/deit.py VisionTransformer (+ projection head ``fc``) -> selfsup's ``encoder`` / ``projector``.

    Their ``pos_embed`` (1, 1+N, D) has a [CLS] row; ours has none and adds nothing to the [CLS] token, so
    their ``cls_token + pos_embed[:, :1]`` is our ``cls_token`` and ``pos_embed[:, 1:]`` our ``pos_embed``
    (the gradients then agree one-to-one: d/d cls_ours = d/d cls_theirs). ``patch_embed.proj`` is our
    ``patch_embed``; blocks and the final norm have the same names.
    """
    enc, proj = prefix + "encoder.", prefix + "projector."

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        if name == "pos_embed":
            return {enc + "pos_embed": value[:, 1:], enc + "cls_token": value[:, :1]}
        if name == "cls_token":
            return {enc + "cls_token": value}
        if name.startswith("patch_embed.proj."):
            return {enc + "patch_embed." + name.rsplit(".", 1)[1]: value}
        if name.startswith("fc."):
            layer, leaf = name[3:].split(".")
            return {proj + head[layer] + "." + leaf: value}
        if name.startswith(("blocks.", "norm.")):
            return {enc + name: value}
        raise KeyError(f"no selfsup name for MSN parameter {name!r}")

    return mapping


def _deit_grad_to_ours(prefix: str, head: dict[str, str]) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients: as ``_deit_to_ours`` except that the [CLS] gradient is taken once (from ``cls_token``)."""
    weights = _deit_to_ours(prefix, head)

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        if name == "pos_embed":
            return {prefix + "encoder.pos_embed": value[:, 1:]}
        return weights(name, value)

    return mapping


MSN_HEAD = {"fc1": "0", "bn1": "1", "fc2": "3", "bn2": "4", "fc3": "6"}  # their OrderedDict -> our mlp indices


def golden_msn(repo: str, out_dir: str, command: str, commit: str) -> None:
    """MSN (facebookresearch/msn): src/deit.py ViT with patch dropping, msn_train.init_model's projection head,
    src/losses.py init_msn_loss (sharpening, Sinkhorn, ME-MAX), the target-encoder EMA of msn_train.main."""
    _install_stubs()
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "batch": 8,
           "projector": [64, 64, 16], "num_prototypes": 16, "mask_ratio": 0.3, "focal_views": 2, "focal_size": 8,
           "anchor_temperature": 0.1, "target_temperature": 0.025, "memax_weight": 1.0, "momentum": 0.996,
           "layer_norm_eps": 1e-6}
    with _on_path(repo):
        import src.deit as deit
        import src.msn_train as msn_train
        from src.losses import init_msn_loss
    logging.getLogger().setLevel(logging.WARNING)  # init_model logs the whole model at INFO
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    # The ViT: deit.VisionTransformer with deit_tiny's options (qkv bias, LN eps 1e-6) at a small width.
    name = "deit_golden"
    deit.__dict__[name] = lambda **kw: deit.VisionTransformer(
        img_size=[cfg["img_size"]], patch_size=cfg["patch_size"], embed_dim=cfg["embed_dim"], depth=cfg["depth"],
        num_heads=cfg["num_heads"], mlp_ratio=4, qkv_bias=True,
        norm_layer=lambda d: nn.LayerNorm(d, eps=cfg["layer_norm_eps"]), **kw)
    hidden, _, out_dim = cfg["projector"]
    encoder = msn_train.init_model(device=torch.device("cpu"), model_name=name, use_bn=True, two_layer=False,
                                   hidden_dim=hidden, output_dim=out_dim, drop_path_rate=0.0)
    # init_model reads the width from the model name (192 for "tiny", ... 1280 otherwise): resize fc1's input.
    encoder.fc.fc1 = nn.Linear(cfg["embed_dim"], hidden)
    _perturb(encoder, 0.02, gen)
    target_encoder = copy.deepcopy(encoder)
    _perturb(target_encoder, 0.02, gen)  # a teacher that differs from the student, so the EMA is visible
    k = cfg["num_prototypes"]
    prototypes = nn.Parameter(torch.empty(k, out_dim).uniform_(-out_dim ** -0.5, out_dim ** -0.5, generator=gen))
    proto_labels = torch.eye(k, dtype=DTYPE)  # msn_train.main: one-hot labels, label_smoothing 0
    encoder.to(DTYPE).train()
    target_encoder.to(DTYPE).train()
    prototypes.data = prototypes.data.to(DTYPE)

    b, s = cfg["batch"], cfg["img_size"]
    imgs = [torch.randn(b, 3, s, s, generator=gen), torch.randn(b, 3, s, s, generator=gen)]
    imgs += [torch.randn(b, 3, cfg["focal_size"], cfg["focal_size"], generator=gen) for _ in range(cfg["focal_views"])]
    imgs = [img.to(DTYPE) for img in imgs]

    def run(use_sinkhorn: bool) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """One loss evaluation as msn_train.main's train_step composes it (T = 0.25, ME-MAX weight 1, entropy
        weight 0); their anchor mask is one ``torch.randperm`` for the batch, recorded here."""
        encoder.zero_grad(set_to_none=True)
        prototypes.grad = None
        drawn = []
        randperm = torch.randperm

        def recording_randperm(*args, **kwargs):
            perm = randperm(*args, **kwargs)
            drawn.append(perm.clone())
            return perm

        torch.manual_seed(1)
        torch.randperm = recording_randperm
        try:
            h, z = encoder(imgs[1:], return_before_head=True, patch_drop=cfg["mask_ratio"])
        finally:
            torch.randperm = randperm
        with torch.no_grad():
            h, _ = target_encoder(imgs[0], return_before_head=True)
        msn = init_msn_loss(num_views=1 + cfg["focal_views"], tau=cfg["anchor_temperature"], me_max=True,
                            return_preds=True)
        ploss, me_max, ent, _, _ = msn(T=cfg["target_temperature"] / cfg["anchor_temperature"],
                                       use_sinkhorn=use_sinkhorn, use_entropy=True, anchor_views=z,
                                       target_views=h.detach(), proto_labels=proto_labels,
                                       prototypes=prototypes)
        loss = ploss + cfg["memax_weight"] * me_max + 0.0 * ent
        loss.backward()
        (perm,) = drawn
        n = (s // cfg["patch_size"]) ** 2
        kept = int(np.floor(n * (1.0 - cfg["mask_ratio"])))
        keep = perm[:kept].sort().values.expand(b, kept).contiguous()
        grads = {n_: p.grad.clone() for n_, p in encoder.named_parameters()}
        grads["prototypes"] = prototypes.grad.clone()
        return loss.detach(), grads, keep

    arrays: dict[str, np.ndarray] = {}
    cases = {}
    keep0 = None
    for case, sinkhorn in (("sinkhorn", True), ("no_sinkhorn", False)):
        loss, grads, keep = run(sinkhorn)
        assert keep0 is None or torch.equal(keep, keep0)
        keep0 = keep
        arrays[f"{case}/loss"] = _np(loss)
        proto_grad = grads.pop("prototypes")
        case_grads = _renamed(grads, _deit_grad_to_ours("", MSN_HEAD), f"{case}/grad")
        case_grads[f"{case}/grad/prototypes.weight"] = _np(proto_grad)
        arrays.update(case_grads if case == "sinkhorn" else _subset(case_grads))
        cases[case] = {"sinkhorn_iterations": 3 if sinkhorn else 0, "loss": float(loss)}
        print(f"msn {case}: loss {float(loss):.7f}")

    student = dict(encoder.named_parameters())
    arrays.update(_renamed(student, _deit_to_ours("", MSN_HEAD), "student"))
    arrays["student/prototypes.weight"] = _np(prototypes)
    arrays.update(_renamed(dict(target_encoder.named_parameters()), _deit_to_ours("", MSN_HEAD), "teacher"))
    # msn_train.main after optimizer.step(): param_k = m * param_k + (1 - m) * param_q (inline there; restated)
    with torch.no_grad():
        for param_q, param_k in zip(encoder.parameters(), target_encoder.parameters()):
            param_k.data.mul_(cfg["momentum"]).add_((1.0 - cfg["momentum"]) * param_q.detach().data)
    arrays.update(_subset(_renamed(dict(target_encoder.named_parameters()), _deit_to_ours("", MSN_HEAD),
                                   "teacher_after"), EMA_SUBSET))
    for i, img in enumerate(imgs):
        arrays[f"input/view{i}"] = _np(img)
    arrays["input/keep"] = keep0.numpy()
    meta = {"method": "msn", "repo": "facebookresearch/msn", "commit": commit, "command": command, "dtype": str(DTYPE).replace("torch.", ""),
            "config": cfg, "cases": cases,
            "notes": ["views: [target, masked anchor, focal anchors]; the anchor mask is the one randperm their "
                      "deit.forward_features drew (shared by the batch), stored sorted as input/keep",
                      "weights: their init + 0.02 N(0,1) on every parameter; teacher = student + another 0.02 N(0,1)",
                      "init_model's fc1 resized to the small width (it reads the width from the model name)",
                      "teacher_after: msn_train.main's inline EMA with m = 0.996 (first value of its schedule), "
                      "applied to the stored student (no optimiser step)"]}
    _save("msn", meta, arrays, out_dir)


# --------------------------------------------------------------------------------------------- ExtreMA
EXTREMA_HEAD = {"0": "0", "1": "1", "3": "3", "4": "4", "6": "6"}


def _extrema_vit_to_ours(prefix: str) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """ExtreMA's vits.py VisionTransformer (+ ``head`` projector) -> selfsup's ``encoder`` / ``projector``.

    ``blocks_token.i`` (CaiT class attention) is our ``ca_blocks.i``; its separate ``attn.k`` / ``attn.v``
    Linear layers are packed into our ``attn.kv`` (k rows first, then v); ``patch_embed.proj`` is our
    ``patch_embed``; the fixed sin-cos ``pos_embed`` is not a parameter on our side (a buffer, checked apart).
    """
    enc, proj = prefix + "encoder.", prefix + "projector."

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        if name == "pos_embed":
            return {}
        if name == "cls_token" or name.startswith(("blocks.", "norm.")):
            return {enc + name: value}
        if name.startswith("patch_embed.proj."):
            return {enc + "patch_embed." + name.rsplit(".", 1)[1]: value}
        if name.startswith("blocks_token."):
            ours = enc + "ca_blocks." + name[len("blocks_token."):]
            for part in ("k", "v"):
                marker = f".attn.{part}."
                if marker in ours:
                    return {ours.replace(marker, ".attn.kv.") + "#" + part: value}
            return {ours: value}
        if name.startswith("head."):
            _, layer, leaf = name.split(".")
            return {proj + EXTREMA_HEAD[layer] + "." + leaf: value}
        raise KeyError(f"no selfsup name for ExtreMA parameter {name!r}")

    return mapping


def golden_extrema(repo: str, out_dir: str, command: str, commit: str) -> None:
    """ExtreMA (microsoft/ExtreMA): vits.py ViT with CaiT class attention, lib/builder.py ExtreMA (projector,
    predictor, EMA inside forward, BYOL loss and the MoCo-v3 InfoNCE variant), disjoint multi-masking."""
    stubs = _install_stubs()
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "batch": 8,
           "mlp_ratio": 2, "num_class_attention_blocks": 2, "layer_scale_init": 0.1, "projector": [64, 64, 16],
           "predictor": [64, 16], "mask_ratio": 0.75, "num_masks": 3, "temperature": 0.2, "momentum": 0.996,
           "layer_norm_eps": 1e-6}
    with _on_path(repo):
        import lib.builder as builder
        import vits
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    def vit(**kw):
        return vits.VisionTransformer(img_size=cfg["img_size"], patch_size=cfg["patch_size"],
                                      embed_dim=cfg["embed_dim"], depth=cfg["depth"], num_heads=cfg["num_heads"],
                                      mlp_ratio=cfg["mlp_ratio"], qkv_bias=True,
                                      norm_layer=lambda d: nn.LayerNorm(d, eps=cfg["layer_norm_eps"]),
                                      init_values=cfg["layer_scale_init"],
                                      class_attention_layers=cfg["num_class_attention_blocks"], **kw)

    proj_hidden, _, proj_dim = cfg["projector"]
    model = builder.ExtreMA(vit, vit, proj_dim, proj_hidden, cfg["temperature"], cfg["mask_ratio"], cfg["num_masks"],
                            True)
    _perturb(model.base_encoder, 0.02, gen)
    _perturb(model.predictor, 0.02, gen)
    with torch.no_grad():
        for p_b, p_m in zip(model.base_encoder.parameters(), model.momentum_encoder.parameters()):
            if p_b.requires_grad:  # pos_embed is fixed (requires_grad False) on both
                p_m.copy_(p_b + 0.02 * torch.randn(p_b.shape, generator=gen))
    model.base_encoder.pos_embed.requires_grad_(False)
    model.to(DTYPE).train()

    b, s = cfg["batch"], cfg["img_size"]
    n = (s // cfg["patch_size"]) ** 2
    kept = int(n * (1 - cfg["mask_ratio"]))  # their generate_mask: int(196 * (1 - ratio)), 196 -> n here
    perm = torch.argsort(torch.rand(b, n, generator=gen), dim=1)
    masks = [perm[:, kept * i:kept * (i + 1)].sort(dim=1).values for i in range(cfg["num_masks"])]
    # Patch 1: generate_mask hard-codes 196 patches and device=x.get_device() (-1 on CPU); it returns our masks.
    model.generate_mask = lambda x, num_masks, mask_ratio=0.0: (masks if mask_ratio > 0 else None)
    # Patch 2 (InfoNCE only): forward chunks by ``self.local_crops``, an attribute never set; = num_masks.
    model.local_crops = cfg["num_masks"]
    x1, x2 = (torch.randn(b, 3, s, s, generator=gen).to(DTYPE) for _ in range(2))

    student0 = {k_: v.detach().clone() for k_, v in model.base_encoder.named_parameters()}
    teacher0 = {k_: v.detach().clone() for k_, v in model.momentum_encoder.named_parameters()}
    predictor0 = {k_: v.detach().clone() for k_, v in model.predictor.named_parameters()}

    def restore() -> None:
        with torch.no_grad():
            for k_, v in model.base_encoder.named_parameters():
                v.copy_(student0[k_])
            for k_, v in model.momentum_encoder.named_parameters():
                v.data = teacher0[k_].clone()
        model.zero_grad(set_to_none=True)

    arrays: dict[str, np.ndarray] = {}
    cases = {}
    _init_gloo()
    for case in ("byol", "infonce"):
        restore()
        with _cpu_cuda_calls():
            loss = model([x1, x2], cfg["momentum"], case)
        loss.backward()
        arrays[f"{case}/loss"] = _np(loss)
        grads = {k_: p.grad for k_, p in model.base_encoder.named_parameters() if p.requires_grad}
        case_grads = _merge_parts(_renamed(grads, _extrema_vit_to_ours(""), f"{case}/grad"))
        for k_, p in model.predictor.named_parameters():
            case_grads[f"{case}/grad/predictor.{EXTREMA_HEAD[k_.split('.')[0]]}.{k_.split('.')[1]}"] = _np(p.grad)
        arrays.update(case_grads if case == "byol" else _subset(case_grads))
        cases[case] = {"loss": loss.item()}
        print(f"extrema {case}: loss {loss.item():.7f}")
    teacher_after = dict(model.momentum_encoder.named_parameters())

    arrays.update(_merge_parts(_renamed(student0, _extrema_vit_to_ours(""), "student")))
    for k_, v in predictor0.items():
        arrays[f"student/predictor.{EXTREMA_HEAD[k_.split('.')[0]]}.{k_.split('.')[1]}"] = _np(v)
    arrays.update(_merge_parts(_renamed(teacher0, _extrema_vit_to_ours(""), "teacher")))
    arrays.update(_subset(_merge_parts(_renamed(teacher_after, _extrema_vit_to_ours(""), "teacher_after")), EMA_SUBSET))
    arrays["input/view0"], arrays["input/view1"] = _np(x1), _np(x2)
    arrays["input/keep"] = torch.stack(masks).numpy()  # (m, B, K)
    arrays["input/pos_embed"] = _np(model.base_encoder.pos_embed)
    meta = {"method": "extrema", "repo": "microsoft/ExtreMA", "commit": commit, "command": command, "dtype": str(DTYPE).replace("torch.", ""),
            "config": cfg, "cases": cases, "stubs": stubs,
            "notes": ["views: [student x1, teacher x2]; masks: disjoint slices of one argsort per image, "
                      "stored sorted as input/keep (m, B, K) and returned by a patched generate_mask",
                      "their forward updates the teacher (m = 0.996) with the current student BEFORE the teacher "
                      "pass; selfsup does that update in after_step of the previous step, so the test applies "
                      "after_step(0) to teacher (before) and compares with teacher_after, then runs the loss",
                      "weights: their init + 0.02 N(0,1); teacher = student + another 0.02 N(0,1)",
                      "infonce: their contrastive_loss at T = 0.2 (their CLI default is 1.0), world size 1 (gloo)",
                      "drop path 0 (their recipe: 0.1 on the student), so the pass is deterministic"]}
    _save("extrema", meta, arrays, out_dir)


def _init_gloo() -> None:
    import socket

    import torch.distributed as dist
    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")


@contextlib.contextmanager
def _cpu_cuda_calls() -> Iterator[None]:
    """ExtreMA's contrastive_loss puts its labels on ``.cuda()``: make that the identity on a CPU machine."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


# ---------------------------------------------------------------------------------------------- MAE-CT
def _maect_vit_to_ours(prefix: str) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """MAE-CT's models/vit VitMae / MaskedEncoder (timm blocks) -> selfsup's VisionTransformer: ``patch_embed.proj``
    is our ``patch_embed``; [CLS] (no position row on either side), blocks and the final norm keep their names."""

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        if name.startswith("patch_embed.proj."):
            return {prefix + "patch_embed." + name.rsplit(".", 1)[1]: value}
        if name == "cls_token" or name.startswith(("blocks.", "norm.")):
            return {prefix + name: value}
        raise KeyError(f"no selfsup name for MAE-CT encoder parameter {name!r}")

    return mapping


def _maect_decoder_to_ours(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    """MAE-CT's MaskedDecoder -> selfsup's MAEDecoder: ``pred`` is our ``head``; ``mask_token`` (1, 1, d) is our (d,)."""
    if name == "mask_token":
        return {"decoder.mask_token": value.reshape(-1)}
    if name.startswith("pred."):
        return {"decoder.head." + name.split(".", 1)[1]: value}
    if name.startswith(("embed.", "blocks.", "norm.")):
        return {"decoder." + name: value}
    raise KeyError(f"no selfsup name for MAE-CT decoder parameter {name!r}")


def _maect_modules(repo: str):
    stubs = _install_stubs()
    with _on_path(repo):
        from losses.mae_vit_loss import mae_vit_loss
        from models.contrastive_heads.nnclr_ema_queue_head import NnclrEmaQueueHead
        from models.contrastive_heads.nnclr_head import NnclrHead
        from models.vit.mask_generators.random_mask_generator import RandomMaskGenerator
        from models.vit.masked_decoder import MaskedDecoder
        from models.vit.masked_encoder import MaskedEncoder
    logging.getLogger().setLevel(logging.ERROR)  # their models log at INFO / warn about FlashAttention
    return stubs, types.SimpleNamespace(
        mae_vit_loss=mae_vit_loss, NnclrEmaQueueHead=NnclrEmaQueueHead, NnclrHead=NnclrHead,
        RandomMaskGenerator=RandomMaskGenerator, MaskedDecoder=MaskedDecoder, MaskedEncoder=MaskedEncoder)


def _maect_encoder(m, cfg: dict, gen: torch.Generator) -> nn.Module:
    shape = (3, cfg["img_size"], cfg["img_size"])
    encoder = m.MaskedEncoder(input_shape=shape, patch_size=cfg["patch_size"], embedding_dim=cfg["embed_dim"],
                              depth=cfg["depth"], attention_heads=cfg["num_heads"])
    encoder._model_specific_initialization()  # their sin-cos position embedding and init (an initializer calls it)
    _perturb(encoder, 0.02, gen)
    return encoder


def golden_mae(repo: str, out_dir: str, command: str, commit: str) -> None:
    """MAE as MAE-CT (ml-jku/MAE-CT) implements it: MaskedEncoder (random masking from a noise, timm blocks),
    MaskedDecoder (mask tokens, unshuffle by ids_restore, sin-cos positions), losses/mae_vit_loss.py with
    normalised pixels and MSE (MaeVitTrainer's defaults)."""
    stubs, m = _maect_modules(repo)
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "batch": 8,
           "mask_ratio": 0.75, "decoder_dim": 32, "decoder_depth": 1, "decoder_heads": 2}
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    encoder = _maect_encoder(m, cfg, gen)
    decoder = m.MaskedDecoder(patch_size=cfg["patch_size"], embedding_dim=cfg["decoder_dim"],
                              depth=cfg["decoder_depth"], attention_heads=cfg["decoder_heads"],
                              n_aux_tokens=encoder.n_aux_tokens, input_shape=encoder.output_shape,
                              output_shape=(3, cfg["img_size"], cfg["img_size"]))
    decoder._model_specific_initialization()
    _perturb(decoder, 0.02, gen)
    nn.Module.to(encoder, DTYPE).train()  # their SingleModelBase.to accepts only a device
    nn.Module.to(decoder, DTYPE).train()
    b, s, grid = cfg["batch"], cfg["img_size"], cfg["img_size"] // cfg["patch_size"]
    x = torch.randn(b, 3, s, s, generator=gen).to(DTYPE)
    noise = torch.rand(b, grid, grid, generator=gen)
    mask_generator = m.RandomMaskGenerator(mask_ratio=cfg["mask_ratio"])
    mask_generator.generate_noise = lambda x_, generator=None: noise.to(x_.device)  # the fixed noise

    latent, mask, ids_restore = encoder(x, mask_generator=mask_generator)  # MaeVit.forward: encode, then decode
    x_hat = decoder(latent, ids_restore=ids_restore)
    loss = m.mae_vit_loss(x=x, x_hat=x_hat, patch_size=encoder.patch_size, normalize_pixels=True,
                          base_loss_function=nn.MSELoss(reduction="none"), mask=mask)
    loss.backward()
    print(f"mae: loss {loss.item():.7f}")

    enc_map, arrays = _maect_vit_to_ours("encoder."), {}
    grads = {f"encoder/{k}": p.grad for k, p in encoder.named_parameters()}
    grads.update({f"decoder/{k}": p.grad for k, p in decoder.named_parameters()})

    def both(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        part, rest = name.split("/", 1)
        return enc_map(rest, value) if part == "encoder" else _maect_decoder_to_ours(rest, value)

    weights = {f"encoder/{k}": p for k, p in encoder.named_parameters()}
    weights.update({f"decoder/{k}": p for k, p in decoder.named_parameters()})
    arrays.update(_renamed(weights, both, "student"))
    arrays.update(_renamed(grads, both, "mae/grad"))
    arrays["mae/loss"] = _np(loss)
    arrays["input/view0"] = _np(x)
    arrays["input/noise"] = _np(noise.reshape(b, grid * grid))
    arrays["input/mask"] = _np(mask)  # theirs: 1 = hidden from the encoder
    arrays["input/ids_restore"] = ids_restore.numpy()
    arrays["input/pos_embed"] = _np(encoder.pos_embed)
    arrays["input/decoder_pos_embed"] = _np(decoder.pos_embed)
    meta = {"method": "mae", "repo": "ml-jku/MAE-CT", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg, "cases": {"mae": {"loss": loss.item()}},
            "stubs": stubs,
            "notes": ["their RandomMaskGenerator.generate_noise returns the stored noise (B, H, W), flattened "
                      "row-major as input/noise (B, N): the kept tokens are the len_keep lowest noise values",
                      "timm 0.9.16 (their environment pins no version) supplies the blocks' Attention / Mlp",
                      "weights: their init + 0.02 N(0,1) on every trainable parameter"]}
    _save("mae", meta, arrays, out_dir)


def golden_nnclr(repo: str, out_dir: str, command: str, commit: str) -> None:
    """NNCLR heads as MAE-CT (ml-jku/MAE-CT) implements them, on its ViT encoder ([CLS] pooling): NnclrHead
    (the nearest neighbour, case ``nnclr``) and NnclrEmaQueueHead (MAE-CT's CT head: EMA projector on the
    neighbour path, a uniform draw among the top-k under a fixed seed, case ``ct``); queue, loss, EMA."""
    stubs, m = _maect_modules(repo)
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "batch": 8,
           "projector": [64, 64, 16], "predictor": [64, 16], "queue_size": 32, "temperature": 0.15,
           "topk": 3, "projector_momentum": 0.99, "seed": 5}
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    encoder = _maect_encoder(m, cfg, gen)
    b, s = cfg["batch"], cfg["img_size"]
    views = [torch.randn(b, 3, s, s, generator=gen).to(DTYPE) for _ in range(2)]
    # unit vectors in DTYPE (stored float64): selfsup re-normalises the neighbours, which must not change them
    queue0 = F.normalize(torch.randn(cfg["queue_size"], cfg["projector"][-1], generator=gen).to(DTYPE), dim=1)
    common = dict(input_shape=encoder.output_shape, queue_size=cfg["queue_size"], output_dim=cfg["projector"][-1],
                  pooling=dict(kind="class_token"), temperature=cfg["temperature"],
                  proj_hidden_dim=cfg["projector"][0], pred_hidden_dim=cfg["predictor"][0])
    heads = {"nnclr": m.NnclrHead(topk=0, **common),
             "ct": m.NnclrEmaQueueHead(topk=cfg["topk"], target_factor=cfg["projector_momentum"], **common)}
    _perturb(heads["nnclr"], 0.02, gen)
    with torch.no_grad():  # the same student head in both cases; the CT teacher projector 0.02 N(0,1) away
        for p_ct, p in zip(heads["ct"].parameters(), heads["nnclr"].parameters()):
            p_ct.copy_(p)
        for p_t, p in zip(heads["ct"].target_projector.parameters(), heads["ct"].projector.parameters()):
            p_t.copy_(p + 0.02 * torch.randn(p.shape, generator=gen))
    nn.Module.to(encoder, DTYPE).train()  # their SingleModelBase.to accepts only a device
    arrays: dict[str, np.ndarray] = {}
    cases = {}
    enc_state = copy.deepcopy(encoder.state_dict())
    for case, head in heads.items():
        nn.Module.to(head, DTYPE).train()
        head.queue.copy_(queue0.to(DTYPE))
        encoder.load_state_dict(enc_state)
        encoder.zero_grad(set_to_none=True)
        student = {f"encoder/{k}": p.detach().clone() for k, p in encoder.named_parameters()}
        student.update({f"head/{k}": p.detach().clone() for k, p in head.named_parameters() if p.requires_grad})
        teacher = {f"head/{k}": p.detach().clone() for k, p in head.named_parameters() if not p.requires_grad}
        # MaeContheadsVit: the encoder on both views at once (no mask in the CT stages), the head on each view
        tokens = encoder(torch.cat(views), mask_generator=None)
        outputs = {f"view{i}": head(tokens[i * b:(i + 1) * b]) for i in range(2)}
        drawn = []
        randint = torch.randint

        def recording_randint(*args, **kwargs):
            out = randint(*args, **kwargs)
            drawn.append(out.clone())
            return out

        torch.manual_seed(cfg["seed"])
        torch.randint = recording_randint
        try:
            losses, _ = head.get_loss(outputs, idx=torch.arange(b), y=torch.zeros(b, dtype=torch.long))
        finally:
            torch.randint = randint
        loss = losses["total"]
        loss.backward()
        if case == "ct":
            head.after_update_step()  # update_ema(projector, target_projector, 0.99)
        print(f"nnclr {case}: loss {loss.item():.7f}; top-k draws {[d.tolist() for d in drawn]}")

        def ours(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
            part, rest = name.split("/", 1)
            if part == "encoder":
                return _maect_vit_to_ours("encoder.")(rest, value)
            if rest.startswith("target_projector."):
                return {"projector_ema.module." + rest.split(".", 1)[1]: value}
            return {rest: value}  # projector.i / predictor.i: the same indices as selfsup's mlp

        grads = {f"encoder/{k}": p.grad for k, p in encoder.named_parameters()}
        grads.update({f"head/{k}": p.grad for k, p in head.named_parameters() if p.requires_grad})
        arrays[f"{case}/loss"] = _np(loss)
        case_grads = _renamed(grads, ours, f"{case}/grad")
        arrays.update(case_grads if case == "nnclr" else _subset(case_grads))
        arrays[f"{case}/queue_after"] = _np(head.queue)
        arrays[f"{case}/topk_draws"] = torch.stack(drawn).numpy() if drawn else np.zeros((0, b), dtype=np.int64)
        if case == "nnclr":
            arrays.update(_renamed(student, ours, "student"))
        else:
            arrays.update(_renamed(teacher, ours, "teacher"))
            after = {f"head/{k}": p for k, p in head.named_parameters() if not p.requires_grad}
            arrays.update(_subset({k.replace("projector_ema.module.", "projector."): v
                                   for k, v in _renamed(after, ours, "teacher_after").items()}, EMA_SUBSET))
        cases[case] = {"loss": loss.item(), "topk": cfg["topk"] if case == "ct" else 1,
                       "projector_momentum": cfg["projector_momentum"] if case == "ct" else None}
    arrays["input/view0"], arrays["input/view1"] = _np(views[0]), _np(views[1])
    arrays["input/queue"] = _np(queue0)
    meta = {"method": "nnclr", "repo": "ml-jku/MAE-CT", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg, "cases": cases, "stubs": stubs,
            "notes": ["their encoder (MaskedEncoder without a mask generator) on both views at once, pooled by "
                      "[CLS] (SinglePooling 'class_token'); the head on each view (BatchNorm per view)",
                      "their top-k draw is torch.randint on the global generator, seeded with config.seed just "
                      "before get_loss; the draws are stored as <case>/topk_draws (view 0, then view 1)",
                      "queue: input/queue (random unit vectors, ids -1 so none is excluded as 'self'); "
                      "<case>/queue_after: after their dequeue_and_enqueue of view 0",
                      "teacher_after (ct): their after_update_step (update_ema, factor 0.99) on the stored head, "
                      "no optimiser step; names projector_ema.module.* stored as teacher_after/projector.*",
                      "weights: their init + 0.02 N(0,1); the CT teacher projector another 0.02 N(0,1) away"]}
    _save("nnclr", meta, arrays, out_dir)


# ------------------------------------------------------------------------------- multi-view BT / VICReg
def golden_multiview(repo: str, out_dir: str, command: str, commit: str) -> None:
    """Multi-view Barlow Twins and VICReg losses of kumarkrishna/fastssl (fastssl/models/barlow_twins.py
    ``BarlowTwinLoss``, fastssl/models/vicreg.py ``VICRegLoss``) on fixed embeddings of M = 2 and M = 4 views.

    Their loss functions run ``model(torch.vstack(views))``; the model here is the identity, so the "images" are
    the embeddings and the gradients are with respect to them."""
    stubs = _install_stubs() + _stub_tree("ffcv", "numba")
    with _on_path(repo):
        from fastssl.models.barlow_twins import BarlowTwinLoss
        from fastssl.models.vicreg import VICRegLoss
    cfg = {"batch": 16, "dim": 8, "views": [2, 4], "barlow_lambda": 1 / 128, "vicreg_sim": 25.0, "vicreg_var": 25.0,
           "vicreg_cov": 1.0}
    gen = torch.Generator().manual_seed(0)
    n, d = cfg["batch"], cfg["dim"]
    scale = torch.linspace(0.4, 1.6, d)  # per-dimension spread: VICReg's std hinge is active in some dimensions only
    arrays: dict[str, np.ndarray] = {}
    cases = {}
    for m in cfg["views"]:
        shared = torch.randn(n, d, generator=gen)
        views = (0.8 * shared + 0.4 * torch.randn(m, n, d, generator=gen)) * scale + 0.3 * torch.randn(d, generator=gen)
        arrays[f"input/m{m}"] = _np(views)
        labels = torch.zeros(n, dtype=torch.long)
        for name, fn in (("barlow", partial(BarlowTwinLoss, _lambda=cfg["barlow_lambda"])),
                         ("vicreg", partial(VICRegLoss, _lambda=cfg["vicreg_sim"], _mu=cfg["vicreg_var"]))):
            z = views.to(DTYPE).requires_grad_(True)
            inp = [z[0], labels, *z[1:]]  # their loaders yield (view 0, label, view 1, ...): they pop index 1
            with _cpu_cuda_calls():
                loss = fn(lambda x: x, inp)
            loss.backward()
            case = f"{name}_m{m}"
            arrays[f"{case}/loss"] = _np(loss)
            arrays[f"{case}/grad/views"] = _np(z.grad)
            cases[case] = {"loss": loss.item(), "views": m}
            print(f"multiview {case}: loss {loss.item():.7f}")
    meta = {"method": "multiview", "repo": "kumarkrishna/fastssl", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg, "cases": cases, "stubs": stubs,
            "notes": ["their loss functions with model = identity on torch.vstack(views): the gradients are "
                      "with respect to the embeddings (input/m<M>, (M, N, d))",
                      "Barlow: _lambda = 1/128 (their default); VICReg: _lambda = _mu = 25, covariance weight 1",
                      "Tensor.cuda is the identity during the call; stand-ins for torchvision, ffcv and numba "
                      "(their data modules, imported by the model files)"]}
    _save("multiview", meta, arrays, out_dir)


# ------------------------------------------------------------------------------------------------ DINO / iBOT
def _dino_to_ours(prefix: str, gradients: bool = False) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """DINO's / iBOT's ``MultiCropWrapper(VisionTransformer, DINOHead or iBOTHead)`` -> selfsup's ``encoder`` (the
    ViT, named as MSN's deit: [CLS] position row folded into ``cls_token``) and ``head`` (``DINOHead``: ``mlp.i``
    keeps its index, ``last_layer.weight_v`` its name, iBOT's ``last_layer2`` is ``patch_last_layer``). Their
    fixed ``weight_g`` (norm_last_layer, 1) is no parameter of ours; iBOT's ``masked_embed`` is ``mask_token``."""
    vit = (_deit_grad_to_ours if gradients else _deit_to_ours)(prefix, {})

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        if name.startswith("backbone."):
            inner = name[len("backbone."):]
            if inner == "masked_embed":
                return {prefix + "mask_token": value.reshape(-1)}
            return vit(inner, value)
        if name.endswith("weight_g"):
            if not torch.all(value == 1):
                raise ValueError(f"{name} is not 1: selfsup fixes the last layer's norm to 1 (norm_last_layer)")
            return {}
        if name.startswith("head."):
            inner = name[len("head."):].replace("last_layer2.", "patch_last_layer.")
            return {prefix + "head." + inner: value}
        raise KeyError(f"no selfsup name for {name!r}")
# --------------------------------------------------------------------------------------------- MoCo v3
class _EncoderWithClassifier(nn.Module):
    """Stand-in for torchvision's ResNet (``fc``) or timm's ViT (``head``) as their builder receives it: a trunk
    (selfsup's ResNet or ViT, pooled features) followed by a classifier that ``MoCo_ResNet`` / ``MoCo_ViT``
    delete and replace by the projector. Their builder reads the trunk's width from the classifier's weight."""

    def __init__(self, trunk: nn.Module, classifier: str, num_classes: int) -> None:
        super().__init__()
        self.trunk, self.classifier = trunk, classifier
        setattr(self, classifier, nn.Linear(trunk.num_features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.classifier)(self.trunk(x))


def _moco_to_ours(classifier: str) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Their ``{base,momentum}_encoder.trunk.*`` -> our ``backbone.*``, ``*.fc.i`` / ``*.head.i`` (the projector)
    -> ``projector.i`` (selfsup's mlp has the same layer order: Linear, BN, ReLU, ..., Linear, BN), ``predictor.i``
    unchanged; the teacher's names are stored under the same names with the ``teacher`` prefix."""

    def mapping(name: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
        part, rest = name.split(".", 1)
        if part == "predictor":
            return {name: value}
        if rest.startswith("trunk."):
            return {"backbone." + rest[len("trunk."):]: value}
        if rest.startswith(classifier + "."):
            return {"projector." + rest[len(classifier) + 1:]: value}
        raise KeyError(f"no selfsup name for MoCo v3 parameter {name!r}")

    return mapping


def _size_based_pos_embed(vit: nn.Module) -> None:
    """Their ``interpolate_pos_encoding`` resizes with ``scale_factor = (grid + 0.1) / sqrt(N)``, which maps source
    coordinates by that factor (2.1 / 4 for a 4 -> 2 grid, not 1 / 2); selfsup's resizes to the target grid. Both
    sides use bicubic interpolation to the grid size here (a runtime change, in the README)."""

    def interpolate(x: torch.Tensor, w: int, h: int) -> torch.Tensor:
        n = vit.pos_embed.shape[1] - 1
        side = int(math.sqrt(n))
        gw, gh = w // vit.patch_embed.patch_size, h // vit.patch_embed.patch_size
        if (gw, gh) == (side, side):
            return vit.pos_embed
        grid = vit.pos_embed[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", align_corners=False)
        return torch.cat([vit.pos_embed[:, :1], grid.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], dim=1)

    vit.interpolate_pos_encoding = interpolate


def _dino_like_pair(build: Callable[[], nn.Module], gen: torch.Generator) -> tuple[nn.Module, nn.Module]:
    """Student and teacher built apart (weight_norm modules cannot be deep-copied), teacher loaded from the student
    (their ``load_state_dict``) and moved 0.02 N(0, 1) away; both perturbed as the other goldens."""
    student, teacher = build(), build()
    _perturb(student, 0.02, gen)
    teacher.load_state_dict(student.state_dict(), strict=False)
    _perturb(teacher, 0.02, gen)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student.to(DTYPE).train(), teacher.to(DTYPE).train()


def _their_ema(student: nn.Module, teacher: nn.Module, m: float) -> None:
    """main_dino.train_one_epoch / main_ibot.train_one_epoch: ``param_k = m param_k + (1 - m) param_q`` over the
    parameters both have (restated: it is inline there)."""
    names = dict(teacher.named_parameters())
    with torch.no_grad():
        for name, q in student.named_parameters():
            if name in names:
                names[name].data.mul_(m).add_((1 - m) * q.detach().data)


DINO_CONFIG = {"img_size": 16, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "batch": 8,
               "local_views": 2, "local_size": 8, "head_hidden": 64, "bottleneck": 16, "out_dim": 32,
               "head_layers": 3, "student_temperature": 0.1, "warmup_teacher_temperature": 0.04,
               "teacher_temperature": 0.07, "warmup_teacher_temperature_epochs": 3, "epochs": 5, "epoch": 1,
               "center_momentum": 0.9, "momentum": 0.996, "layer_norm_eps": 1e-6}


def _dino_images(cfg: dict, gen: torch.Generator) -> list[torch.Tensor]:
    b, s, ls = cfg["batch"], cfg["img_size"], cfg["local_size"]
    imgs = [torch.randn(b, 3, s, s, generator=gen) for _ in range(2)]
    imgs += [torch.randn(b, 3, ls, ls, generator=gen) for _ in range(cfg["local_views"])]
    return imgs


def golden_dino(repo: str, out_dir: str, command: str, commit: str) -> None:
    """DINO (facebookresearch/dino): vision_transformer.py VisionTransformer and DINOHead, utils.MultiCropWrapper,
    main_dino.DINOLoss (centring, sharpening at the warm-up's teacher temperature, centre update), the inline EMA."""
    _install_stubs()
    cfg = dict(DINO_CONFIG)
    with _on_path(repo):
        import main_dino
        import utils
        import vision_transformer as vits
    _init_gloo()  # DINOLoss.update_center all-reduces
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)

    def build() -> nn.Module:
        vit = vits.VisionTransformer(img_size=[cfg["img_size"]], patch_size=cfg["patch_size"],
                                     embed_dim=cfg["embed_dim"], depth=cfg["depth"], num_heads=cfg["num_heads"],
                                     mlp_ratio=4, qkv_bias=True,
                                     norm_layer=partial(nn.LayerNorm, eps=cfg["layer_norm_eps"]))
        _size_based_pos_embed(vit)
        head = vits.DINOHead(cfg["embed_dim"], cfg["out_dim"], use_bn=False, norm_last_layer=True,
                             nlayers=cfg["head_layers"], hidden_dim=cfg["head_hidden"],
                             bottleneck_dim=cfg["bottleneck"])
        return utils.MultiCropWrapper(vit, head)

    student, teacher = _dino_like_pair(build, gen)
    imgs = [img.to(DTYPE) for img in _dino_images(cfg, gen)]
    loss_fn = main_dino.DINOLoss(cfg["out_dim"], 2 + cfg["local_views"], cfg["warmup_teacher_temperature"],
                                 cfg["teacher_temperature"], cfg["warmup_teacher_temperature_epochs"], cfg["epochs"],
                                 student_temp=cfg["student_temperature"], center_momentum=cfg["center_momentum"])
    center = 0.5 * torch.randn(1, cfg["out_dim"], generator=gen)  # a centre that matters (theirs starts at 0)
    loss_fn.center = center.to(DTYPE).clone()
    cfg["teacher_temperature_now"] = float(loss_fn.teacher_temp_schedule[cfg["epoch"]])

    with torch.no_grad():
        teacher_output = teacher(imgs[:2])  # only the 2 global views pass through the teacher
    student_output = student(imgs)
    loss = loss_fn(student_output, teacher_output, cfg["epoch"])
    loss.backward()
    print(f"dino: loss {float(loss):.10f} (teacher temperature {cfg['teacher_temperature_now']:.4f})")

    mapping = _dino_to_ours("")
    arrays: dict[str, np.ndarray] = {"dino/loss": _np(loss)}
    grads = {n: p.grad for n, p in student.named_parameters() if p.requires_grad}
    arrays.update(_renamed(grads, _dino_to_ours("", gradients=True), "dino/grad"))
    arrays.update(_renamed(dict(student.named_parameters()), mapping, "student"))
    arrays.update(_renamed(dict(teacher.named_parameters()), mapping, "teacher"))
    arrays["input/center"] = _np(center[0])
    arrays["dino/center_after"] = _np(loss_fn.center[0])
    _their_ema(student, teacher, cfg["momentum"])
    arrays.update(_subset(_renamed(dict(teacher.named_parameters()), mapping, "teacher_after"), DINO_EMA_SUBSET))
    for i, img in enumerate(imgs):
        arrays[f"input/view{i}"] = _np(img)
    meta = {"method": "dino", "repo": "facebookresearch/dino", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg,
            "notes": ["views: 2 global (16 px) then 2 local (8 px); the teacher sees the global ones only",
                      "weights: their init + 0.02 N(0,1) on every trainable parameter; teacher = student + another "
                      "0.02 N(0,1); weight_g stays 1 (norm_last_layer)",
                      "their interpolate_pos_encoding replaced by a resize to the grid size (selfsup's)",
                      "centre: 0.5 N(0,1) before the loss (input/center), theirs after it (dino/center_after)",
                      "teacher temperature: their per-epoch warm-up schedule at epoch 1 (teacher_temperature_now)",
                      "teacher_after: main_dino's inline EMA with m = 0.996 on the stored student (no optimiser step)"]}
    _save("dino", meta, arrays, out_dir)


IBOT_CONFIG = {**DINO_CONFIG, "teacher_temperature": 0.06, "teacher_patch_temperature": 0.08,
               "warmup_teacher_patch_temperature": 0.04, "patch_out_dim": 24, "center_momentum2": 0.8,
               "mask_ratio": [0.0, 0.3], "mask_ratio_var": [0.0, 0.2], "mask_aspect": [0.3, 1 / 0.3],
               "mask_seed": 3, "cls_weight": 1.0, "patch_weight": 0.5}


def _ibot_block_masks(loader, cfg: dict, imgs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Their ``loader.ImageFolderMask.__getitem__`` (BEiT-style block masks, a prediction ratio drawn per crop from
    ``pred_ratio`` +- ``pred_ratio_var``, Python's ``random``) over the batch, image by image, on the global crops.
    Its dataset base class is a stand-in whose ``__getitem__`` returns the crops of image ``index``."""
    dataset = loader.ImageFolderMask.__new__(loader.ImageFolderMask)
    dataset.psz = cfg["patch_size"]
    dataset.pred_ratio, dataset.pred_ratio_var = list(cfg["mask_ratio"]), list(cfg["mask_ratio_var"])
    dataset.log_aspect_ratio = tuple(math.log(x) for x in cfg["mask_aspect"])
    dataset.pred_shape, dataset.pred_start_epoch = "block", 0
    loader.ImageFolderMask.__bases__[0].__getitem__ = lambda self, index: ([img[index] for img in imgs[:2]], 0)
    random_state = __import__("random").getstate()
    __import__("random").seed(cfg["mask_seed"])
    try:
        per_image = [dataset[i][2] for i in range(cfg["batch"])]
    finally:
        __import__("random").setstate(random_state)
    return [torch.from_numpy(np.stack([m[v] for m in per_image])) for v in range(2)]


def golden_ibot(repo: str, out_dir: str, command: str, commit: str) -> None:
    """iBOT (bytedance/ibot): models/vision_transformer.py VisionTransformer with masked image modelling,
    models/head.py iBOTHead (shared and separate last layers), utils.MultiCropWrapper, loader.ImageFolderMask's
    block masks, main_ibot.iBOTLoss (two centres, two teacher temperatures), the inline EMA."""
    _install_stubs()
    _stub_tree("timm", "tensorboardX", "munkres", "sklearn")
    cfg = dict(IBOT_CONFIG)
    with _on_path(repo):
        import loader
        import main_ibot
        import utils
        from models.head import iBOTHead
        from models.vision_transformer import VisionTransformer
    _init_gloo()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    imgs = [img.to(DTYPE) for img in _dino_images(cfg, gen)]
    masks = _ibot_block_masks(loader, cfg, imgs)
    center = 0.5 * torch.randn(1, cfg["out_dim"], generator=gen)
    arrays: dict[str, np.ndarray] = {"input/center": _np(center[0])}
    cases = {}
    pairs: dict[str, tuple[nn.Module, nn.Module]] = {}
    for case, shared in (("separate", False), ("shared", True)):
        def build() -> nn.Module:
            vit = VisionTransformer(img_size=[cfg["img_size"]], patch_size=cfg["patch_size"],
                                    embed_dim=cfg["embed_dim"], depth=cfg["depth"], num_heads=cfg["num_heads"],
                                    mlp_ratio=4, qkv_bias=True, return_all_tokens=True, masked_im_modeling=True,
                                    norm_layer=partial(nn.LayerNorm, eps=cfg["layer_norm_eps"]))
            _size_based_pos_embed(vit)
            head = iBOTHead(cfg["embed_dim"], cfg["out_dim"], patch_out_dim=cfg["patch_out_dim"], norm=None,
                            act="gelu", norm_last_layer=True, shared_head=shared, nlayers=cfg["head_layers"],
                            hidden_dim=cfg["head_hidden"], bottleneck_dim=cfg["bottleneck"])
            return utils.MultiCropWrapper(vit, head)

        pairs[case] = _dino_like_pair(build, gen)
        if case == "shared":  # the separate pair's weights (a superset), so that one copy serves both cases
            for ours, theirs in zip(pairs["shared"], pairs["separate"]):
                ours.load_state_dict({k: v for k, v in theirs.state_dict().items() if "last_layer2" not in k},
                                     strict=False)  # their shared last_layer2 is last_layer
    for case, shared in (("shared", True), ("separate", False)):
        student, teacher = pairs[case]
        gen_case = torch.Generator().manual_seed(1 if shared else 2)
        teacher.backbone.masked_im_modeling = False  # main_ibot builds the teacher without it
        with torch.no_grad():  # their loader puts the teacher's mask token at its init (not used)
            teacher.backbone.masked_embed.zero_()
        patch_dim = cfg["out_dim"] if shared else cfg["patch_out_dim"]
        loss_fn = main_ibot.iBOTLoss(cfg["out_dim"], patch_dim, 2, cfg["local_views"],
                                     cfg["warmup_teacher_temperature"], cfg["teacher_temperature"],
                                     cfg["warmup_teacher_patch_temperature"], cfg["teacher_patch_temperature"],
                                     cfg["warmup_teacher_temperature_epochs"], cfg["epochs"],
                                     student_temp=cfg["student_temperature"], center_momentum=cfg["center_momentum"],
                                     center_momentum2=cfg["center_momentum2"], lambda1=cfg["cls_weight"],
                                     lambda2=cfg["patch_weight"])
        loss_fn.center = center.to(DTYPE).clone()
        center2 = 0.5 * torch.randn(1, 1, patch_dim, generator=gen_case)
        loss_fn.center2 = center2.to(DTYPE).clone()
        epoch = cfg["epoch"]
        cfg["teacher_temperature_now"] = float(loss_fn.teacher_temp_schedule[epoch])
        cfg["teacher_patch_temperature_now"] = float(loss_fn.teacher_temp2_schedule[epoch])

        # main_ibot.train_one_epoch
        with torch.no_grad():
            teacher_output = teacher(imgs[:2])
        student_output = student(imgs[:2], mask=masks)
        student.backbone.masked_im_modeling = False
        student_local_cls = student(imgs[2:])[0]
        student.backbone.masked_im_modeling = True
        all_loss = loss_fn(student_output, teacher_output, student_local_cls, masks, epoch)
        loss = all_loss.pop("loss")
        loss.backward()
        print(f"ibot {case}: loss {float(loss.detach()):.10f} (cls {float(all_loss['cls']):.6f}, "
              f"patch {float(all_loss['patch']):.6f})")

        mapping = _dino_to_ours("")
        arrays[f"{case}/loss"] = _np(loss)
        arrays[f"{case}/cls"] = _np(all_loss["cls"])
        grads = {n: p.grad for n, p in student.named_parameters() if p.requires_grad}
        case_grads = _renamed(grads, _dino_to_ours("", gradients=True), f"{case}/grad")
        arrays.update(case_grads if shared else _subset(case_grads, SUBSET + DINO_EMA_SUBSET))
        if not shared:  # the superset: the shared case's weights are these without head.patch_last_layer
            arrays.update(_renamed(dict(student.named_parameters()), mapping, "student"))
            teacher_params = {n: p for n, p in teacher.named_parameters() if n != "backbone.masked_embed"}
            arrays.update(_renamed(teacher_params, mapping, "teacher"))
        arrays[f"{case}/input/center2"] = _np(center2[0, 0])
        arrays[f"{case}/center_after"] = _np(loss_fn.center[0])
        arrays[f"{case}/center2_after"] = _np(loss_fn.center2[0, 0])
        _their_ema(student, teacher, cfg["momentum"])
        after = _renamed({n: p for n, p in teacher.named_parameters() if n != "backbone.masked_embed"}, mapping,
                         f"teacher_after/{case}")
        arrays.update({k: v for k, v in after.items() if k.split("/")[-1] in DINO_EMA_SUBSET})
        cases[case] = {"shared_head": shared, "loss": float(loss.detach())}
    for i, img in enumerate(imgs):
        arrays[f"input/view{i}"] = _np(img)
    for v, m in enumerate(masks):
        arrays[f"input/mask{v}"] = m.numpy()
    meta = {"method": "ibot", "repo": "bytedance/ibot", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg, "cases": cases,
            "notes": ["views: 2 global (16 px, masked for the student) then 2 local (8 px, unmasked, student only)",
                      "masks: loader.ImageFolderMask.__getitem__ on the two global crops of each image in turn, "
                      "Python's random seeded with mask_seed (input/mask0, mask1: (B, H, W), True = masked)",
                      "weights: their init + 0.02 N(0,1) on every trainable parameter; teacher = student + another "
                      "0.02 N(0,1); weight_g stays 1 (norm_last_layer); the teacher's masked_embed is unused; "
                      "one copy (student/*, teacher/*): case shared uses all but head.patch_last_layer",
                      "case separate: shared_head False for the student and shared_head_teacher False (their "
                      "default True gives the teacher the [CLS] last layer for patches; selfsup's teacher is an "
                      "EMA copy of the student, separate layer included)",
                      "their interpolate_pos_encoding replaced by a resize to the grid size (selfsup's)",
                      "centres: 0.5 N(0,1) before the loss (input/center, <case>/input/center2), theirs after it",
                      "teacher temperatures: their per-epoch warm-up schedules at epoch 1 (*_now)",
                      "teacher_after/<case>: main_ibot's inline EMA over common parameters, m = 0.996"]}
    _save("ibot", meta, arrays, out_dir)


DINO_EMA_SUBSET = ("encoder.patch_embed.weight", "encoder.cls_token", "encoder.blocks.1.attn.qkv.bias",
                   "encoder.norm.bias", "head.mlp.2.weight", "head.last_layer.weight_v",
                   "head.patch_last_layer.weight_v", "mask_token")
MOCO_EMA_SUBSET = ("backbone.stem.0.weight", "backbone.layer4.0.bn2.bias", "backbone.patch_embed.weight",
                   "backbone.cls_token", "backbone.blocks.1.attn.qkv.bias", "backbone.norm.bias", "projector.0.weight",
                   "projector.1.weight", "projector.3.weight")  # the EMA is elementwise: a few tensors show it


def golden_mocov3(repo: str, out_dir: str, command: str, commit: str) -> None:
    """MoCo v3 (facebookresearch/moco-v3): moco/builder.py ``MoCo_ResNet`` (2-layer projector, 2-layer predictor
    without a last BN, T = 1.0, their CLI default) and ``MoCo_ViT`` (3-layer projector, 2-layer predictor with a
    last BN, T = 0.2, their ViT recipes), the momentum update inside ``forward`` and the symmetric
    ``contrastive_loss`` with its 2T factor; main_moco.py ``adjust_moco_momentum`` for the schedule.

    The base encoders are selfsup's tiny ResNet and ViT behind a classifier the builder replaces (their ResNet is
    torchvision's, their ViT timm's: neither imports here), so the comparison covers the builder: heads, momentum
    encoder, loss."""
    stubs = _install_stubs()
    for name in ("timm.models.layers", "timm.models.layers.helpers"):  # vits.py (imported by main_moco)
        if not _importable("timm"):
            _stub(name)
    with _on_path(repo):
        import main_moco
        import moco.builder as builder
    from selfsup.models import build_backbone

    cfg = {"img_size": 16, "batch": 8, "mlp_dim": 32, "dim": 16, "momentum": 0.99,
           "cases": {"resnet": {"temperature": 1.0, "projector_layers": 2, "predictor_last_bn": False,
                                "backbone": "resnet", "params": {"block": "basic", "layers": [1, 1, 1, 1], "width": 4,
                                                                 "small_stem": True}},
                     "vit": {"temperature": 0.2, "projector_layers": 3, "predictor_last_bn": True,
                             "backbone": "vit_custom", "params": {"img_size": 16, "patch_size": 4, "embed_dim": 32,
                                                                  "depth": 2, "num_heads": 2, "pos_embed": "sincos",
                                                                  "in_channels": 3}}},
           "schedule": {"epochs": 3, "iters_per_epoch": 4}}
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    b, s = cfg["batch"], cfg["img_size"]
    x1, x2 = (torch.randn(b, 3, s, s, generator=gen) for _ in range(2))
    arrays: dict[str, np.ndarray] = {"input/view0": _np(x1), "input/view1": _np(x2)}
    cases = {}
    _init_gloo()
    for case, c in cfg["cases"].items():
        classifier, cls = ("fc", builder.MoCo_ResNet) if case == "resnet" else ("head", builder.MoCo_ViT)
        model = cls(lambda num_classes: _EncoderWithClassifier(build_backbone(c["backbone"], **c["params"]),
                                                               classifier, num_classes),
                    dim=cfg["dim"], mlp_dim=cfg["mlp_dim"], T=c["temperature"])
        _perturb(model.base_encoder, 0.02, gen)
        _perturb(model.predictor, 0.02, gen)
        with torch.no_grad():  # a momentum encoder 0.02 N(0,1) away from the base encoder: the update is visible
            for p_b, p_m in zip(model.base_encoder.parameters(), model.momentum_encoder.parameters()):
                p_m.copy_(p_b + 0.02 * torch.randn(p_b.shape, generator=gen))
        model.to(DTYPE).train()
        student = {f"base_encoder.{k}": v.detach().clone() for k, v in model.base_encoder.named_parameters()}
        student.update({f"predictor.{k}": v.detach().clone() for k, v in model.predictor.named_parameters()})
        teacher = {f"momentum_encoder.{k}": v.detach().clone() for k, v in model.momentum_encoder.named_parameters()}
        with _cpu_cuda_calls():
            loss = model(x1.to(DTYPE), x2.to(DTYPE), cfg["momentum"])
        loss.backward()
        grads = {f"base_encoder.{k}": p.grad for k, p in model.base_encoder.named_parameters()}
        grads.update({f"predictor.{k}": p.grad for k, p in model.predictor.named_parameters()})
        after = {f"momentum_encoder.{k}": p for k, p in model.momentum_encoder.named_parameters()}
        ours = _moco_to_ours(classifier)
        arrays.update(_renamed(student, ours, f"{case}/student"))
        arrays.update(_renamed(teacher, ours, f"{case}/teacher"))
        arrays.update(_renamed(grads, ours, f"{case}/grad"))
        arrays.update(_subset(_renamed(after, ours, f"{case}/teacher_after"), MOCO_EMA_SUBSET))
        arrays[f"{case}/loss"] = _np(loss)
        cases[case] = {"loss": loss.item(), "temperature": c["temperature"]}
        print(f"mocov3 {case}: loss {loss.item():.10f}")
    sched = cfg["schedule"]
    args = types.SimpleNamespace(moco_m=cfg["momentum"], epochs=sched["epochs"])
    steps = sched["epochs"] * sched["iters_per_epoch"]
    # main_moco.train: adjust_moco_momentum(epoch + i / iters_per_epoch, args) before each iteration's forward
    arrays["schedule/momentum"] = np.array([main_moco.adjust_moco_momentum(t / sched["iters_per_epoch"], args)
                                            for t in range(steps)], dtype=np.float64)
    meta = {"method": "mocov3", "repo": "facebookresearch/moco-v3", "commit": commit, "command": command,
            "dtype": str(DTYPE).replace("torch.", ""), "config": cfg, "cases": cases, "stubs": stubs,
            "notes": ["their moco/builder.py MoCo_ResNet (case resnet) and MoCo_ViT (case vit) around selfsup's "
                      "tiny ResNet / ViT (a stand-in for torchvision's / timm's: the builder replaces the "
                      "classifier fc / head by its projector); views [x1, x2], batch 8",
                      "their forward first updates the momentum encoder with m = 0.99 (the first value of "
                      "adjust_moco_momentum), then computes the keys; <case>/teacher_after holds it after that "
                      "update (a few tensors), <case>/teacher before",
                      "weights: their init (ours for the trunks) + 0.02 N(0,1); momentum encoder = base + another "
                      "0.02 N(0,1); world size 1 (gloo) for concat_all_gather; Tensor.cuda the identity",
                      "schedule/momentum: main_moco.adjust_moco_momentum(epoch + i / iters, args) over 3 epochs "
                      "of 4 iterations, moco_m 0.99"]}
    _save("mocov3", meta, arrays, out_dir)


# ------------------------------------------------------------------------------------------------ main
METHODS = {"msn": golden_msn, "extrema": golden_extrema, "mae": golden_mae, "nnclr": golden_nnclr,
           "multiview": golden_multiview, "mocov3": golden_mocov3, "dino": golden_dino, "ibot": golden_ibot}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("method", choices=sorted(METHODS))
    parser.add_argument("--repo", required=True, help="directory of the authors' repository (git archive of it)")
    parser.add_argument("--commit", help="the repository's commit, when --repo is not a git checkout")
    parser.add_argument("--out", default=OUT_DIR, help="output directory (default: tests/golden)")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="precision of the authors' pass (weights and inputs are float32 either way)")
    args = parser.parse_args(argv)
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    repo = os.path.abspath(args.repo)
    command = "python benchmarks/golden.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    METHODS[args.method](repo, args.out, command, args.commit or _commit(repo))


if __name__ == "__main__":
    main()
