"""Side by side on one device: a full training step of the authors' MSN ViT-S/16 and MAE ViT-B/16 against the same
steps built by selfsup from ``configs/imagenet/msn_vit_s16.yaml`` and ``mae_vit_b16.yaml`` (issue 53, point 4).

    bash benchmarks/gpu_pack.sh MSN_GIT MAE_GIT       # once, where the public repositories are at hand
    python benchmarks/anchors_cuda.py --precisions bf16-mixed,32-true [--batch 64] [--steps 20] [--out FILE]
    python benchmarks/anchors_cuda.py --device cpu --batch 2 --steps 1 --warmup 0 --image-size 64   # tests the script

Prints one JSON line per (implementation, config, precision): seconds per step (mean, median, min of ``--steps``
steps timed one by one between device synchronisations, after ``--warmup`` untimed steps and one step whose FLOPs
are counted), images/s, the step's FLOPs (forward and backward, :func:`selfsup.flops.count_flops`; equal counts on
both sides are the check that they do the same matrix work), TFLOP/s and MFU (:func:`selfsup.flops.device_peak`),
peak memory (``torch.cuda.max_memory_allocated``; on a CPU the process's peak RSS) and, on selfsup's line,
``speed_vs_authors``: the authors' mean step time over selfsup's (> 1: selfsup is faster). Each (implementation,
config, precision) runs in its own subprocess, so peak memory and the allocator's cache are its own.

The same work on both sides, on the same random batch (normal noise in every view's shape, the loader's output after
normalisation: no data loading or augmentation is timed on either side):

* **MSN** (facebookresearch/msn, ``src/msn_train.py``'s ``train_step``): the target view and the masked anchor at
  224 px, 10 focal anchors at 96 px; ViT-S/16 (``src/deit.py``'s ``deit_small``, explicit attention), patch drop
  0.15 with one random permutation for the batch (selfsup: ``method.shared_mask: true``), projection head
  2048-2048-256 with BatchNorm, 1024 prototypes, Sinkhorn (3 iterations) and ME-MAX (``src/losses.py``), the
  gradient clipped at 3, AdamW, the target's EMA; their config ``configs/pretrain/msn_vits16.yaml``. Their step also
  logs: one host synchronisation per weight matrix (``grad_logger``'s ``float(norm)``) and the loss terms as
  Python floats; selfsup's loop reads the loss once a step (its divergence check). Both are part of each step.
* **MAE** (facebookresearch/mae, ``engine_pretrain.py``'s loop body): ``models_mae.mae_vit_base_patch16`` with
  ``norm_pix_loss``, mask ratio 0.75 drawn per image, decoder 512 x 8 blocks, 16 heads; AdamW (0.9, 0.95), weight
  decay 0.05 off biases and norms (timm's rule, as ``main_pretrain.py``), their per-step lr schedule, ``loss.item()``.
  They train in float16 with a loss scaler (``util.misc.NativeScalerWithGradNormCount``); in bf16-mixed and fp32 no
  loss scaling is needed, so the scaler is replaced by its call sequence without scaling: backward, their
  ``get_grad_norm_`` (the norm they log), the optimiser step.

Where the two cannot be made equal: the authors' code has no bf16 path, so their forward and loss run under
``torch.autocast(bfloat16)`` here, as selfsup's (Lightning Fabric's bf16-mixed) does; MSN's authors train in fp32.
models_mae.py was written for timm 0.3.2, which does not import on a modern torch: it runs on a modern timm whose
``Block`` has no ``qk_scale`` argument (a subclass takes it, as None, and drops it) and whose attention is fused
(``F.scaled_dot_product_attention``) by default; timm 0.3.2's was explicit (softmax of ``q @ k^T``), so ``authors``
switches the fused path off (the step the authors measured) and ``authors-sdpa`` keeps it (the authors' model on a
modern timm). The learning rate and momentum schedules differ in value (not in cost). Nothing is compiled on either
side. 32-true runs at the matmul precision torch is left with (``matmul_precision`` in the line: tf32 or fp32).

The authors' code is never copied into this project: it is imported at run time from ``--authors`` (default
``.gpu_carry/authors``, filled by ``benchmarks/gpu_pack.sh``), with ``benchmarks/golden.py``'s stand-ins for imports
that only their data loading and logging need (torchvision where it does not import, ``torch._six``, ``np.float``).

On a CPU (``--device cpu``, tiny ``--batch`` and ``--image-size``) this tests the script; such numbers are not the
benchmark.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = {"msn_vit_s16": ROOT / "configs" / "imagenet" / "msn_vit_s16.yaml",
           "mae_vit_b16": ROOT / "configs" / "imagenet" / "mae_vit_b16.yaml"}
AUTHORS = {"msn_vit_s16": ("msn", "src/msn_train.py"), "mae_vit_b16": ("mae", "models_mae.py")}  # subfolder, a file
IMPLS = ("authors", "authors-sdpa", "selfsup")
PRECISIONS = ("bf16-mixed", "32-true")
PATCH = 16


# ------------------------------------------------------------------------------------------------- shared inputs
def selfsup_config(config: str, opts: argparse.Namespace) -> Any:
    """The config at ``--batch`` and ``--precision``; ``--image-size`` scales every view (the focal views keep their
    ratio to the full size, rounded to the patch size)."""
    from selfsup.load import load_config

    overrides = [f"trainer.batch_size={opts.batch}", f"trainer.precision={opts.precision}",
                 f"trainer.accelerator={opts.device}"]
    cfg = load_config(str(CONFIGS[config]), overrides)
    if opts.image_size:
        full = cfg.data.image_size
        overrides.append(f"data.image_size={opts.image_size}")
        overrides += [f"views.{i}.size={max(PATCH, round(v.size * opts.image_size / full / PATCH) * PATCH)}"
                      for i, v in enumerate(cfg.views) if v.size]
        cfg = load_config(str(CONFIGS[config]), overrides)
    return cfg


def view_sizes(cfg: Any) -> list[int]:
    """Every view's side in the config's order (MSN: target, masked anchor, focal anchors)."""
    return [v.size or cfg.data.image_size for v in cfg.views for _ in range(v.num)]


def random_views(sizes: list[int], batch: int, device: Any) -> list[Any]:
    """The batch both sides get: normal noise shaped as each normalised view, from one seed."""
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, 3, s, s, generator=g).to(device) for s in sizes]


def autocast(precision: str, device: Any) -> Any:
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled="bf16" in precision)


def trainable_millions(*modules_or_tensors: Any) -> float:
    import torch

    params = [p for m in modules_or_tensors
              for p in ([m] if isinstance(m, torch.Tensor) else m.parameters()) if p.requires_grad]
    return round(sum(p.numel() for p in params) / 1e6, 3)


# ------------------------------------------------------------------------------------------------- the authors'
def authors_code(root: Path, config: str) -> Path:
    folder, marker = AUTHORS[config]
    repo = root / folder
    if not (repo / marker).is_file():
        raise FileNotFoundError(f"the authors' code for {config} is not at {repo} ({marker} missing): run "
                                f"`bash benchmarks/gpu_pack.sh MSN_GIT MAE_GIT` first (it unpacks facebookresearch/msn "
                                f"and facebookresearch/mae into .gpu_carry/authors), or pass --authors DIR")
    return repo


def authors_commit(root: Path, folder: str) -> str:
    """The commit gpu_pack.sh recorded (a ``git archive`` export has no history)."""
    listed = root / "commits.txt"
    if listed.is_file():
        for line in listed.read_text().splitlines():
            name, _, commit = line.partition(" ")
            if name == folder:
                return commit
    return "unknown"


def same_work(config: str, opts: argparse.Namespace, theirs: dict[str, Any]) -> None:
    """Stop unless the authors' settings equal the selfsup config's (``theirs``: method field -> their value)."""
    ours = selfsup_config(config, opts).method
    differ = {key: (value, ours.get(key)) for key, value in theirs.items() if ours.get(key) != value}
    if differ:
        raise ValueError(f"{config}: the authors' settings differ from the config's, so the steps would not do the "
                         f"same work: " + ", ".join(f"{k} theirs {a!r} ours {b!r}" for k, (a, b) in differ.items()))


def _stand_ins() -> list[str]:
    sys.path.insert(0, str(HERE))
    from golden import _install_stubs  # one set of stand-ins for the authors' imports (golden values, this bench)

    return _install_stubs()


def authors_msn(config: str, opts: argparse.Namespace, device: Any, views: list[Any]) -> tuple[Callable, dict]:
    """``train_step`` of msn_train.main on their model, loss, optimiser set-up and schedules."""
    import torch
    import yaml

    repo = authors_code(Path(opts.authors), config)
    stubbed = _stand_ins()
    sys.path.insert(0, str(repo))
    import src.msn_train as msn_train  # module level: seeds, cudnn.benchmark = True, logging at INFO
    from src.losses import init_msn_loss
    from src.utils import AllReduceSum, grad_logger
    logging.getLogger().setLevel(logging.WARNING)  # init_model logs the whole model at INFO

    args = yaml.safe_load((repo / "configs" / "pretrain" / "msn_vits16.yaml").read_text())
    meta, crit, data, optim = args["meta"], args["criterion"], args["data"], args["optimization"]
    size, focal = views[0].shape[-1], views[2:]
    if meta["model_name"] != "deit_small" or data["focal_views"] != len(focal) or data["rand_views"] != 1:
        raise ValueError(f"their msn_vits16.yaml ({meta['model_name']}, {data['rand_views']} + {data['focal_views']} "
                         f"views) is not the config's ({len(views) - 1} anchors): the comparison would not be fair")
    same_work(config, opts, {"mask_ratio": data["patch_drop"], "shared_mask": True,  # one randperm for the batch
                             "num_prototypes": crit["num_proto"],
                             "projector": [meta["hidden_dim"], meta["hidden_dim"], meta["output_dim"]],
                             "sinkhorn_iterations": 3 if crit["use_sinkhorn"] else 0,
                             "memax_weight": float(crit["memax_weight"]) if crit["me_max"] else 0.0})
    # deit_small at the bench's size (224 unless --image-size); the name keeps "small": init_model reads the width
    msn_train.deit.__dict__["deit_small_bench"] = partial(msn_train.deit.deit_small, img_size=[size])
    encoder = msn_train.init_model(device=device, model_name="deit_small_bench", two_layer=False,
                                   use_pred=meta["use_pred_head"], use_bn=meta["use_bn"],
                                   bottleneck=meta["bottleneck"], hidden_dim=meta["hidden_dim"],
                                   output_dim=meta["output_dim"], drop_path_rate=meta["drop_path_rate"])
    target_encoder = copy.deepcopy(encoder)
    num_views = data["focal_views"] + data["rand_views"]
    msn = init_msn_loss(num_views=num_views, tau=crit["temperature"], me_max=crit["me_max"], return_preds=True)
    num_proto, out_dim = crit["num_proto"], meta["output_dim"]
    with torch.no_grad():  # msn_train.main's prototypes and one-hot labels (label_smoothing 0)
        prototypes = torch.empty(num_proto, out_dim)
        torch.nn.init.uniform_(prototypes, -(1.0 / out_dim) ** 0.5, (1.0 / out_dim) ** 0.5)
        prototypes = torch.nn.parameter.Parameter(prototypes).to(device)
        proto_labels = torch.eye(num_proto, device=device)
    prototypes.requires_grad = True
    ipe, epochs = 1000, optim["epochs"]
    encoder, optimizer, scheduler, wd_scheduler = msn_train.init_opt(
        encoder=encoder, prototypes=prototypes, wd=float(optim["weight_decay"]),
        final_wd=float(optim["final_weight_decay"]), start_lr=optim["start_lr"], ref_lr=optim["lr"],
        final_lr=optim["final_lr"], iterations_per_epoch=ipe, warmup=optim["warmup"], num_epochs=epochs)
    total = int(ipe * epochs * 1.25)
    momentum_scheduler = (0.996 + (1.0 - 0.996) / total * i for i in range(total + 1))
    sharpen_scheduler = (crit["start_sharpen"] + (crit["final_sharpen"] - crit["start_sharpen"]) / total * i
                         for i in range(total + 1))
    encoder.train()
    target_encoder.train()
    imgs, patch_drop = views, data["patch_drop"]

    def step() -> float:  # train_step of msn_train.main, the forward and loss under autocast for bf16-mixed
        optimizer.zero_grad()
        with autocast(opts.precision, device):
            h, z = encoder(imgs[1:], return_before_head=True, patch_drop=patch_drop)
            with torch.no_grad():
                h, _ = target_encoder(imgs[0], return_before_head=True)
            h, z = h.float(), z.float()
            ploss, me_max, ent, logs, _ = msn(T=next(sharpen_scheduler), use_sinkhorn=crit["use_sinkhorn"],
                                              use_entropy=crit["use_ent"], anchor_views=z, target_views=h.detach(),
                                              proto_labels=proto_labels, prototypes=prototypes)
            loss = ploss + crit["memax_weight"] * me_max + crit["ent_weight"] * ent
        scheduler.step()
        wd_scheduler.step()
        loss.backward()
        with torch.no_grad():
            prototypes.grad.data = AllReduceSum.apply(prototypes.grad.data)
        grad_logger(encoder.named_parameters())
        if optim["clip_grad"] > 0:
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), optim["clip_grad"])
        optimizer.step()
        with torch.no_grad():
            m = next(momentum_scheduler)
            for param_q, param_k in zip(encoder.parameters(), target_encoder.parameters()):
                param_k.data.mul_(m).add_((1.0 - m) * param_q.detach().data)
        return (float(loss), float(ploss), float(me_max), float(ent))[0]

    return step, {"repo": "facebookresearch/msn", "commit": authors_commit(Path(opts.authors), "msn"),
                  "params_M": trainable_millions(encoder, prototypes), "mask_ratio": patch_drop,
                  "attention": "explicit (src/deit.py)", "stubbed": stubbed}


def timm_blocks_for_mae(attention: str) -> str:
    """models_mae.py builds ``timm.models.vision_transformer.Block(..., qk_scale=None, ...)`` (timm 0.3.2); a modern
    timm's Block has no ``qk_scale``. Replace the module's ``Block`` (before models_mae imports it) by a subclass that
    takes it and drops it (None: the default scale, head_dim ** -0.5, either way), with timm's fused attention off
    (``explicit``: timm 0.3.2's softmax(q k^T) v) or on (``sdpa``). Returns timm's version."""
    import timm
    import timm.models.vision_transformer as vt

    base = vt.Block
    takes_qk_scale = "qk_scale" in inspect.signature(base.__init__).parameters

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                     qk_scale: float | None = None, **kwargs: Any) -> None:
            if qk_scale is not None:
                raise ValueError("models_mae.py passes qk_scale=None; this stand-in only drops that value")
            if takes_qk_scale:
                kwargs["qk_scale"] = qk_scale
            super().__init__(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, **kwargs)
            if hasattr(self.attn, "fused_attn"):
                self.attn.fused_attn = attention == "sdpa"
            elif attention == "sdpa":
                raise RuntimeError(f"timm {timm.__version__} has no fused attention: run impl 'authors' only")

    vt.Block = Block
    return timm.__version__


class _UnscaledNativeScaler:
    """util.misc.NativeScalerWithGradNormCount's call without its float16 loss scaling (not needed in bf16 or
    fp32): backward, clip or the authors' gradient norm, the optimiser step."""

    def __init__(self, get_grad_norm: Callable) -> None:
        self.get_grad_norm = get_grad_norm

    def __call__(self, loss: Any, optimizer: Any, clip_grad: float | None = None, parameters: Any = None,
                 create_graph: bool = False, update_grad: bool = True) -> Any:
        import torch

        loss.backward(create_graph=create_graph)
        if not update_grad:
            return None
        parameters = list(parameters)
        norm = (torch.nn.utils.clip_grad_norm_(parameters, clip_grad) if clip_grad is not None
                else self.get_grad_norm(parameters))
        optimizer.step()
        return norm


def authors_mae(config: str, opts: argparse.Namespace, device: Any, views: list[Any],
                attention: str = "explicit") -> tuple[Callable, dict]:
    """engine_pretrain.train_one_epoch's loop body (accum_iter 1) on models_mae.mae_vit_base_patch16."""
    import torch

    repo = authors_code(Path(opts.authors), config)
    stubbed = _stand_ins()  # torchvision (for timm) where it does not import, torch._six, np.float
    try:
        timm_version = timm_blocks_for_mae(attention)
    except ImportError as err:
        raise ImportError(f"models_mae.py needs timm ({err}): install the wheel gpu_pack.sh puts in "
                          f".gpu_carry/wheels (gpu_check.sh does)") from None
    sys.path.insert(0, str(repo))
    import models_mae
    import util.lr_sched as lr_sched
    import util.misc as misc
    from timm import optim as timm_optim

    (x,) = views
    same_work(config, opts, {"mask_ratio": 0.75, "norm_pix_loss": True, "decoder_dim": 512, "decoder_depth": 8,
                             "decoder_heads": 16})  # mae_vit_base_patch16's decoder, PRETRAIN.md's options
    model = models_mae.mae_vit_base_patch16(norm_pix_loss=True, img_size=x.shape[-1]).to(device)
    model.train()
    batch, blr, mask_ratio = x.shape[0], 1.5e-4, 0.75  # PRETRAIN.md: --blr 1.5e-4 --mask_ratio 0.75 --norm_pix_loss
    args = SimpleNamespace(lr=blr * batch / 256, min_lr=0.0, warmup_epochs=40, epochs=800)
    group = getattr(timm_optim, "param_groups_weight_decay", None) or timm_optim.optim_factory.add_weight_decay
    optimizer = torch.optim.AdamW(group(model, 0.05), lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = _UnscaledNativeScaler(misc.get_grad_norm_)
    ipe, epoch, it = 1000, 100, [0]  # a point past the warm-up of the lr schedule
    optimizer.zero_grad()

    def step() -> float:
        lr_sched.adjust_learning_rate(optimizer, it[0] / ipe + epoch, args)
        it[0] += 1
        with autocast(opts.precision, device):  # theirs: torch.cuda.amp.autocast() (float16)
            loss, _, _ = model(x, mask_ratio=mask_ratio)
        loss_value = loss.item()
        loss_scaler(loss, optimizer, parameters=model.parameters(), update_grad=True)
        optimizer.zero_grad()
        return loss_value

    return step, {"repo": "facebookresearch/mae", "commit": authors_commit(Path(opts.authors), "mae"),
                  "params_M": trainable_millions(model), "mask_ratio": mask_ratio, "timm": timm_version,
                  "attention": ("F.scaled_dot_product_attention (a modern timm's default)" if attention == "sdpa"
                                else "explicit (timm 0.3.2's; a modern timm's fused path off)"),
                  "loss_scaling": "none (theirs: float16 with GradScaler)", "stubbed": stubbed}


# ------------------------------------------------------------------------------------------------- selfsup
def selfsup_step(config: str, opts: argparse.Namespace, device: Any, views: list[Any]) -> tuple[Callable, dict]:
    """The training loop's own ``train_step`` (selfsup.train.loop) through Lightning Fabric at the config's
    precision: schedule values, forward, the loss read once (the loop's divergence check), backward, clipping
    (``optim.clip_grad``), the optimiser step, the method's after-step update (EMA)."""
    import torch
    from lightning.fabric import Fabric

    from selfsup.methods.assemble import assemble_model
    from selfsup.train.loop import train_step
    from selfsup.train.optim import build_optimizer, online_encoder
    from selfsup.train.schedules import scaled_lr

    cfg = selfsup_config(config, opts)
    _, method = assemble_model(cfg, 3, cfg.data.image_size, total_steps=100_000)
    method.train()
    optimizer = build_optimizer(method, cfg.optim, online_encoder(method))
    fabric = Fabric(accelerator=device.type, devices=1, precision=opts.precision)
    wrapped, optimizer = fabric.setup(method, optimizer)
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    views = [v.contiguous(memory_format=memory_format) for v in views]  # as the loop's StepViews hands them
    lr, wd, clip = scaled_lr(cfg.optim, cfg.trainer.batch_size), cfg.optim.weight_decay, cfg.optim.clip_grad
    state = {"i": 0, "loss": math.nan}

    def check_loss(loss: Any, step: int) -> None:  # the loop's: RunDir.check_loss reads the loss every step
        state["loss"] = float(loss.detach())
        if not math.isfinite(state["loss"]):
            raise FloatingPointError(f"loss {state['loss']} at step {step}")

    def step() -> float:
        train_step(fabric, wrapped, method, optimizer, views, state["i"], lr, wd, clip, check_loss)
        state["i"] += 1
        return state["loss"]

    c = cfg.method
    return step, {"repo": "selfsup", "params_M": trainable_millions(method), "mask_ratio": c.get("mask_ratio"),
                  "attention": "F.scaled_dot_product_attention"}


BUILDERS: dict[str, dict[str, Callable]] = {
    "authors": {"msn_vit_s16": authors_msn, "mae_vit_b16": authors_mae},
    "authors-sdpa": {"mae_vit_b16": partial(authors_mae, attention="sdpa")},  # MSN's deit.py has no fused path
    "selfsup": {"msn_vit_s16": selfsup_step, "mae_vit_b16": selfsup_step},
}


# ------------------------------------------------------------------------------------------------- one measurement
def measure(impl: str, config: str, opts: argparse.Namespace) -> dict[str, Any]:
    """Build ``impl``'s step for ``config``, count one step's FLOPs, run the warm-up, time ``--steps`` steps."""
    import torch

    from selfsup.bench import _peak_memory_mib
    from selfsup.flops import compute_precision, count_flops, device_peak

    torch.manual_seed(0)
    device = torch.device(opts.device)
    cfg = selfsup_config(config, opts)
    sizes = view_sizes(cfg)
    step, info = BUILDERS[impl][config](config, opts, device, random_views(sizes, opts.batch, device))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    losses = []
    flops = count_flops(lambda: losses.append(step()))  # the first step, counted; a warm-up step too
    for _ in range(opts.warmup):
        losses.append(step())
    times = []
    for _ in range(opts.steps):
        sync()
        start = time.perf_counter()
        losses.append(step())
        sync()
        times.append(time.perf_counter() - start)
    mean = statistics.fmean(times)
    matmul = compute_precision(opts.precision, device)
    peak, peak_source = device_peak(device, matmul)
    achieved = flops / mean / 1e12
    counts = {s: sizes.count(s) for s in dict.fromkeys(sizes)}
    return {
        "impl": impl, "config": config, "precision": opts.precision, "matmul_precision": matmul,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "batch": opts.batch,
        "views": " + ".join(f"{n}x{s}px" for s, n in counts.items()), "steps": opts.steps, "warmup": opts.warmup,
        "step_s_mean": round(mean, 5), "step_s_median": round(statistics.median(times), 5),
        "step_s_min": round(min(times), 5), "images_per_s": round(opts.batch / mean, 1),
        "gflops_per_step": float(f"{flops / 1e9:.4g}"), "tflops_per_s": float(f"{achieved:.4g}"),
        "mfu": round(achieved / peak, 3), "peak_source": peak_source,
        "peak_memory_mib": round(_peak_memory_mib(device), 1),
        "loss_first": round(losses[0], 5), "loss_last": round(losses[-1], 5), "torch": torch.__version__, **info,
    }


def run_child(impl: str, config: str, precision: str, opts: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure` in a subprocess (its own peak memory and allocator); an error becomes the line's ``error``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", impl, config, "--precisions", precision,
           "--device", opts.device, "--batch", str(opts.batch), "--steps", str(opts.steps), "--warmup",
           str(opts.warmup), "--authors", str(opts.authors)]
    if opts.image_size:
        cmd += ["--image-size", str(opts.image_size)]
    head = {"impl": impl, "config": config, "precision": precision, "batch": opts.batch}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**head, "error": f"timed out after {opts.timeout} s"}
    lines = [line[len("SBS_JSON "):] for line in proc.stdout.splitlines() if line.startswith("SBS_JSON ")]
    if proc.returncode or not lines:
        return {**head, "error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(lines[-1])


def with_ratio(line: dict[str, Any], authors: dict[str, Any] | None) -> dict[str, Any]:
    """``speed_vs_authors`` on a line of another implementation, when the authors' line of its config and precision
    has a time."""
    if line["impl"] != "authors" and authors is not None and "error" not in authors and "error" not in line:
        line["speed_vs_authors"] = round(authors["step_s_mean"] / line["step_s_mean"], 3)
    return line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="CPU numbers (--device cpu) test the script; they are not the benchmark.")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--impls", default="authors,selfsup", help=f"comma list of {', '.join(IMPLS)} (authors-sdpa: "
                                                              "MAE only, the authors' model with timm's fused "
                                                              "attention)")
    p.add_argument("--precisions", default="bf16-mixed", help=f"comma list of {', '.join(PRECISIONS)}")
    p.add_argument("--batch", type=int, default=64, help="images a step (default 64: the authors' per-GPU batch of "
                                                        "both recipes)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the counted one (default 3)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests the script)")
    p.add_argument("--image-size", type=int, default=0, help="full view side instead of the configs' 224 (tests: "
                                                             "the focal views keep their ratio)")
    p.add_argument("--authors", default=str(ROOT / ".gpu_carry" / "authors"),
                   help="folder with msn/ and mae/, the authors' code unpacked by benchmarks/gpu_pack.sh")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for one (impl, config, precision)")
    p.add_argument("--out", help="also append the JSON lines to this file")
    p.add_argument("--child", nargs=2, metavar=("IMPL", "CONFIG"), help=argparse.SUPPRESS)
    opts = p.parse_args(argv)

    def listed(name: str, allowed: tuple[str, ...] | dict) -> list[str]:
        values = [v for v in getattr(opts, name).split(",") if v]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            p.error(f"--{name} {getattr(opts, name)!r}: each must be one of {', '.join(allowed)}")
        return values

    opts.config_list = listed("configs", CONFIGS)
    opts.impl_list = sorted(listed("impls", IMPLS), key=IMPLS.index)  # the authors' step first
    opts.precision_list = listed("precisions", PRECISIONS)
    opts.precision = opts.precision_list[0]
    if opts.device not in ("cuda", "cpu"):
        p.error(f"--device {opts.device!r}: cuda or cpu")
    if min(opts.batch, opts.steps) < 1 or opts.warmup < 0 or opts.image_size < 0:
        p.error("--batch and --steps must be at least 1, --warmup and --image-size at least 0")
    if opts.image_size % PATCH:
        p.error(f"--image-size {opts.image_size}: a multiple of the patch size, {PATCH}")
    if opts.child is None and any(i.startswith("authors") for i in opts.impl_list):
        for config in opts.config_list:
            try:
                authors_code(Path(opts.authors), config)
            except FileNotFoundError as err:
                p.error(str(err))
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.child:
        impl, config = opts.child
        print("SBS_JSON " + json.dumps(measure(impl, config, opts)), flush=True)
        return 0
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda, but torch sees no CUDA device here; --device cpu tests the script")
    lines = []
    for precision in opts.precision_list:
        for config in opts.config_list:
            authors = None
            for impl in opts.impl_list:  # "authors" first: the others' lines carry their speed against it
                if config not in BUILDERS[impl]:
                    continue
                line = with_ratio(run_child(impl, config, precision, opts), authors)
                authors = line if impl == "authors" else authors
                lines.append(line)
                print(json.dumps(line), flush=True)
                if opts.out:  # line by line: a run stopped from outside keeps what it measured
                    with open(opts.out, "a") as f:
                        f.write(json.dumps(line) + "\n")
    return 1 if any("error" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
