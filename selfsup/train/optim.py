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

    Groups with ``apply_lars=False`` (biases, norms) get plain SGD with momentum.
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.9, eta: float = 0.02) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if group.get("apply_lars", True):
                    update = update.add(p, alpha=group["weight_decay"])
                    w_norm, u_norm = torch.norm(p), torch.norm(update)
                    trust = torch.where((w_norm > 0) & (u_norm > 0), group["eta"] * w_norm / u_norm, torch.ones_like(w_norm))
                    update = update.mul(trust)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.clone(update).detach()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(update)
                p.add_(state["momentum_buffer"], alpha=-group["lr"])
        return loss


def online_encoder(method: nn.Module) -> nn.Module:
    """The encoder that the optimiser trains: ``method.encoder`` where the exported backbone is another copy (an
    EMA), else ``method.backbone``."""
    return getattr(method, "encoder", None) or method.backbone


def build_optimizer(model: nn.Module, cfg: OptimConfig, encoder: nn.Module | None = None) -> torch.optim.Optimizer:
    """The configured optimiser; learning rate and weight decay are set per step by the engine (times each group's
    ``lr_scale`` / ``wd_scale``: layer-wise decay in ``encoder``, the heads' own lr and weight decay)."""
    head_lr = cfg.lr if cfg.head_lr is None else cfg.head_lr
    head_wd = cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay
    groups = parameter_groups(model, encoder, cfg.layer_decay, head_lr / cfg.lr,
                              head_wd / cfg.weight_decay if cfg.weight_decay else 0.0)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.name == "adam":  # L2 penalty added to the gradient, as torch.optim.Adam does
        return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return LARS(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, eta=cfg.lars_eta)
