"""VICReg (Bardes et al., ICLR 2022): two views, an expander, variance-invariance-covariance loss."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from selfsup.losses.vicreg import vicreg_loss
from selfsup.methods.base import StepOutput, check_num_views
from selfsup.models.heads import mlp


@dataclass
class VICRegConfig:
    expander: list[int] = field(default_factory=lambda: [8192, 8192, 8192])  # paper: 3 layers of 8192
    sim_weight: float = 25.0  # lambda
    var_weight: float = 25.0  # mu
    cov_weight: float = 1.0  # nu


class VICReg(nn.Module):
    Config = VICRegConfig

    def __init__(self, backbone: nn.Module, cfg: VICRegConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.expander = mlp([backbone.num_features, *cfg.expander], norm="batch", act="relu")

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        check_num_views("VICReg", views, 2)
        z_a, z_b = (self.expander(self.backbone(view)) for view in views)
        loss, terms = vicreg_loss(z_a, z_b, self.cfg.sim_weight, self.cfg.var_weight, self.cfg.cov_weight)
        return StepOutput(loss, terms, z_a.detach())
