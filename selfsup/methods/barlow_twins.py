"""Barlow Twins (Zbontar et al., ICML 2021): make the cross-correlation of two views' embeddings the identity."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from selfsup.losses.barlow import barlow_twins_loss
from selfsup.methods.base import StepOutput, check_num_views
from selfsup.models.heads import mlp


@dataclass
class BarlowTwinsConfig:
    projector: list[int] = field(default_factory=lambda: [8192, 8192, 8192])  # paper: 3 layers of 8192
    lambd: float = 0.0051  # off-diagonal weight (the authors' code; the paper says 5e-3)


class BarlowTwins(nn.Module):
    Config = BarlowTwinsConfig

    def __init__(self, backbone: nn.Module, cfg: BarlowTwinsConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], norm="batch", act="relu", last_bias=False)

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        check_num_views("Barlow Twins", views, 2)
        z_a, z_b = (self.projector(self.backbone(view)) for view in views)
        loss, terms = barlow_twins_loss(z_a, z_b, self.cfg.lambd)
        return StepOutput(loss, terms, z_a.detach())
