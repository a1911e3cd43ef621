"""Optimisers and parameter groups (no weight decay on biases, norms and prototypes)."""

from __future__ import annotations

import re

import torch
from torch import nn

from selfsup.config import OptimConfig


_STAGE = re.compile(r"^layer(\d+)\.")


def layer_ids(backbone: nn.Module) -> tuple[dict[str, int], int]:
    """Each parameter's layer for the lr decay, and the number of blocks/stages L: the stem is 0, block or stage
    i (counted from 1) is i, what follows them is L + 1.

    A ViT names its own (:meth:`VisionTransformer.layer_id`: the late [CLS] of class-attention models belongs to
    the pooling head, L + 1); a ResNet's ``layer<s>`` is stage s, its ``stem`` 0, anything else L + 1.
    """
    names = [name for name, _ in backbone.named_parameters()]
    if hasattr(backbone, "layer_id"):
        return {name: backbone.layer_id(name) for name in names}, backbone.depth
    stages = {name: int(m.group(1)) for name in names if (m := _STAGE.match(name))}
    num_layers = max(stages.values(), default=0)
    return {name: stages.get(name, 0 if name.startswith("stem.") else num_layers + 1) for name in names}, num_layers


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full names of the parameters that the top-level ``model`` (a method) lists in its ``no_weight_decay()``.

    The authors differ: ExtreMA's optimiser skips the ViT's ``no_weight_decay()`` list (``cls_token``,
    ``pos_embed``; its main.py passes it to timm's ``add_weight_decay``), so its method names them; MAE's and MSN's
    pretraining scripts select by shape only (``ndim <= 1`` or a bias), which decays the (1, 1, D) [CLS], so theirs
    do not."""
    listed = getattr(model, "no_weight_decay", None)
    return set(listed()) if callable(listed) else set()


def parameter_groups(model: nn.Module, encoder: nn.Module | None = None, layer_decay: float = 1.0,
                     head_lr_scale: float = 1.0, head_wd_scale: float = 1.0) -> list[dict]:
    """Trainable parameters grouped by lr scale and weight decay; frozen ones (``requires_grad=False``) get none.

    Biases, norm parameters, 1-D tensors, parameters the method names in ``no_weight_decay()`` (ExtreMA: the ViT's
    tokens and positions, :func:`no_weight_decay_names`) and parameters marked ``_no_weight_decay = True`` get no weight
    decay. LARS skips its trust ratio on them too (as in BYOL, VICReg and MSN's code), except for parameters marked
    ``_lars_without_weight_decay = True`` (MAST's masks unless ``method.masks_lars: false``: their L1 term is
    their only penalty, but at the ImageNet presets' lr 1.6 a plain SGD step would move them by several times their
    size). Parameters of ``encoder`` in layer l of L (:func:`layer_ids`) get ``lr_scale = layer_decay^(L + 1 - l)``;
    parameters outside it (the heads) get ``head_lr_scale`` and ``head_wd_scale``. The engine sets each group's lr and
    weight decay per step as the schedule's value times these scales.
    """
    ids, num_layers = layer_ids(encoder) if encoder is not None else ({}, 0)
    encoder_params = {id(p): name for name, p in encoder.named_parameters()} if encoder is not None else {}
    no_decay_names = no_weight_decay_names(model)
    groups: dict[tuple[float, float, bool, bool], list[nn.Parameter]] = {}
    for param_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decayed = not (param.ndim <= 1 or getattr(param, "_no_weight_decay", False)
                       or param_name in no_decay_names)
        lars = decayed or getattr(param, "_lars_without_weight_decay", False)
        name = encoder_params.get(id(param))
        if name is not None:
            lr_scale, wd_scale = layer_decay ** (num_layers + 1 - ids[name]), 1.0
        else:
            lr_scale, wd_scale = (head_lr_scale, head_wd_scale) if encoder is not None else (1.0, 1.0)
        groups.setdefault((lr_scale, wd_scale, decayed, lars), []).append(param)
    return [{"params": params, "lr_scale": lr_scale, "wd_scale": wd_scale if decayed else 0.0,
             "apply_weight_decay": decayed, "apply_lars": lars, **({} if decayed else {"weight_decay": 0.0})}
            for (lr_scale, wd_scale, decayed, lars), params
            in sorted(groups.items(), key=lambda item: (-item[0][0], -item[0][2], -item[0][3]))]


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a layer-wise trust ratio ``eta * ||w|| / (||g|| + wd * ||w||)`` (You et al., 2017).

    Groups with ``apply_lars=False`` (biases, norms) get plain SGD with momentum. Per parameter ``w`` with gradient
    ``g`` (parameters without a gradient are skipped): ``u = g + wd * w`` and ``u *= trust`` (LARS groups only; trust
    1 where ``||w||`` or ``||u||`` is 0), then ``v = momentum * v + u`` (``v = u`` at the first step) and
    ``w -= lr * v``. Each group runs on ``torch._foreach_*`` ops (the trust ratios of a group computed together), so
    a step launches a few kernels per group instead of a few per parameter, and never reads a value back to the host.
    On the CPU these ops run the same kernels per tensor as a loop over the parameters: the results are the same.
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.9, eta: float = 0.02) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            updates = [p.grad for p in params]
            if group.get("apply_lars", True):
                updates = torch._foreach_add(updates, params, alpha=group["weight_decay"])
                w_norm, u_norm = torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(updates))
                trust = torch.where((w_norm > 0) & (u_norm > 0), group["eta"] * w_norm / u_norm,
                                    torch.ones_like(w_norm))
                torch._foreach_mul_(updates, trust.unbind())
            states = [self.state[p] for p in params]
            running = [i for i, state in enumerate(states) if "momentum_buffer" in state]
            for i, state in enumerate(states):  # the first step of a parameter: its buffer starts at the update
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.clone(updates[i]).detach()
            if running:
                buffers = [states[i]["momentum_buffer"] for i in running]
                torch._foreach_mul_(buffers, group["momentum"])
                torch._foreach_add_(buffers, [updates[i] for i in running])
            torch._foreach_add_(params, [state["momentum_buffer"] for state in states], alpha=-group["lr"])
        return loss


def online_encoder(method: nn.Module) -> nn.Module:
    """The encoder that the optimiser trains: ``method.encoder`` where the exported backbone is another copy (an
    EMA), else ``method.backbone``."""
    return getattr(method, "encoder", None) or method.backbone


def fused_step(device: torch.device, precision: str, clip_grad: float | None) -> bool:
    """Whether Adam and AdamW take torch's fused kernels (:func:`build_optimizer`): on CUDA, except at 16-mixed with
    ``optim.clip_grad``, where Fabric unscales the GradScaler's gradients before clipping them and refuses an
    optimiser that unscales them itself, as a fused one does."""
    return torch.device(device).type == "cuda" and not (precision == "16-mixed" and clip_grad)


def build_optimizer(model: nn.Module, cfg: OptimConfig, encoder: nn.Module | None = None,
                    fused: bool = False) -> torch.optim.Optimizer:
    """The configured optimiser; learning rate and weight decay are set per step by the engine (times each group's
    ``lr_scale`` / ``wd_scale``: layer-wise decay in ``encoder``, the heads' own lr and weight decay).

    ``fused`` (:func:`fused_step`: on CUDA): Adam and AdamW take torch's fused kernels (a few kernels for all the
    parameters' updates; the step count stays on the GPU and a GradScaler's inf check is read inside the kernel, so
    the step reads nothing back); otherwise torch's default (foreach on CUDA, its loop over the parameters on the
    CPU), so CPU results do not change. SGD keeps torch's default; LARS is foreach everywhere."""
    head_lr = cfg.lr if cfg.head_lr is None else cfg.head_lr
    head_wd = cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay
    groups = parameter_groups(model, encoder, cfg.layer_decay, head_lr / cfg.lr,
                              head_wd / cfg.weight_decay if cfg.weight_decay else 0.0)
    fused = True if fused else None  # None: torch's choice
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused)
    if cfg.name == "adam":  # L2 penalty added to the gradient, as torch.optim.Adam does
        return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return LARS(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, eta=cfg.lars_eta)
