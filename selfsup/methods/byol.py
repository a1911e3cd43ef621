"""BYOL (Grill et al., NeurIPS 2020): an online network predicts an EMA target network's projection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from selfsup.config import ConfigError, Widths, check_fields
from selfsup.losses.byol import byol_loss
from selfsup.methods.base import EMAConfig, MethodBase, StepOutput
from selfsup.models.heads import mlp
from selfsup.train.ema import EMATeacher
from selfsup.train.schedules import cosine_schedule


@dataclass
class BYOLConfig(EMAConfig):  # momentum: tau_base, increased to momentum_end with a cosine schedule (Sec. 3.2)
    VIEWS: ClassVar[tuple[int, int | None]] = (2, 2)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [4096, 256])
    predictor: Widths = field(default_factory=lambda: [4096, 256])

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        if self.predictor[-1] != self.projector[-1]:
            raise ConfigError(f"method.predictor must end at the projector's output width {self.projector[-1]} (it "
                              f"predicts the target's projection), got {self.predictor}")


class BYOL(MethodBase):
    Config = BYOLConfig

    def __init__(self, backbone: nn.Module, cfg: BYOLConfig, total_steps: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], norm="batch", act="relu")
        self.predictor = mlp([cfg.projector[-1], *cfg.predictor], norm="batch", act="relu")
        self.target = EMATeacher(nn.Sequential(backbone, self.projector), cfg.momentum_schedule(cosine_schedule,
                                                                                                 total_steps))

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        z = [self.projector(self.backbone(view)) for view in views]
        p = [self.predictor(zi) for zi in z]
        t = [self.target(view) for view in views]
        loss = byol_loss(p[0], t[1]) + byol_loss(p[1], t[0])  # symmetrised, Eq. 2
        return StepOutput(loss, {}, z[0].detach())

    def after_step(self, step: int) -> None:
        self.target.step(step, nn.Sequential(self.backbone, self.projector))
