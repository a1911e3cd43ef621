"""Optimisers and parameter groups (no weight decay on biases, norms and prototypes)."""

from __future__ import annotations

import torch
from torch import nn

from selfsup.config import OptimConfig


def parameter_groups(model: nn.Module) -> list[dict]:
    """Two groups: weights with decay, and biases / norm parameters / 1-D tensors / prototypes without.

    A parameter opts out of weight decay with the attribute ``_no_weight_decay = True``. LARS also
    skips its trust-ratio adaptation on the no-decay group (as in BYOL and VICReg).
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or getattr(param, "_no_weight_decay", False):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "apply_weight_decay": True, "apply_lars": True},
              {"params": no_decay, "apply_weight_decay": False, "apply_lars": False, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


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


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The configured optimiser; learning rate and weight decay are set per step by the engine."""
    groups = parameter_groups(model)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.name == "adam":  # L2 penalty added to the gradient, as torch.optim.Adam does
        return torch.optim.Adam(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return LARS(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, eta=cfg.lars_eta)
