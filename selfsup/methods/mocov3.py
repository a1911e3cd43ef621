"""MoCo v3 (Chen, Xie & He 2021, arXiv 2104.02057): a query encoder with a predictor learns to pick its image's key,
computed by a momentum encoder, out of the keys of the whole (global) batch.

One step (the paper's Alg. 1; the authors' moco/builder.py)::

    q1, q2 = predictor(projector(f(x1))), predictor(projector(f(x2)))   # base encoder f; BatchNorm per view
    k1, k2 = f_m(x1), f_m(x2)                                           # momentum encoder: EMA of f + projector
    loss   = ctr(q1, k2) + ctr(q2, k1)                                  # ctr = 2 tau InfoNCE, keys gathered, no grad
    f_m    = m f_m + (1 - m) (f + projector)                            # m: 0.99 -> 1, half cosine over the run

Heads as the authors' builders make them: Linear layers without bias, BatchNorm + ReLU after the hidden ones, a
BatchNorm without affine after the projector's last (both backbones) and after the predictor's (ViT:
``predictor_last_norm: true``). The defaults are their ViT recipe (3-layer projector, T = 0.2); their ResNet recipe is
``projector: [4096, 256]``, ``predictor_last_norm: false``, ``temperature: 1.0`` (configs/cifar10/laptop/mocov3.yaml).
``freeze_patch_embed`` is the paper's random patch projection for ViTs. The exported backbone is the base encoder f
(their linear evaluation loads ``base_encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from selfsup.config import ConfigError, Temperature, Widths, check_fields
from selfsup.losses.infonce import moco_contrastive_loss
from selfsup.methods.base import EMAConfig, EMAMomentum, MethodBase, StepOutput
from selfsup.models.heads import mlp
from selfsup.models.vit import VisionTransformer
from selfsup.train.ema import EMATeacher
from selfsup.train.schedules import cosine_schedule


@dataclass
class MoCoV3Config(EMAConfig):  # momentum: m0, raised to momentum_end by their half cosine (adjust_moco_momentum)
    VIEWS: ClassVar[tuple[int, int | None]] = (2, 2)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [4096, 4096, 256])  # ViT: 3 layers; their ResNet: 2
    predictor: Widths = field(default_factory=lambda: [4096, 256])  # 2 layers
    predictor_last_norm: bool = True  # a BatchNorm without affine after the predictor (their ViT; ResNet: none)
    temperature: Temperature = 0.2  # their ViT recipes; their ResNet recipes (and CLI default): 1.0
    momentum: EMAMomentum = 0.99  # their --moco-m
    freeze_patch_embed: bool = False  # ViT: the random patch projection stays at its init (their --stop-grad-conv1)

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        if self.predictor[-1] != self.projector[-1]:
            raise ConfigError(f"method.predictor must end at the projector's output width {self.projector[-1]} (its "
                              f"queries meet the momentum encoder's keys), got {self.predictor}")


class MoCoV3(MethodBase):
    """Base encoder + projector + predictor; momentum encoder = EMA of base encoder + projector."""

    Config = MoCoV3Config

    def __init__(self, backbone: nn.Module, cfg: MoCoV3Config, total_steps: int) -> None:
        super().__init__()
        if cfg.freeze_patch_embed:
            if not isinstance(backbone, VisionTransformer):
                raise ConfigError("method.freeze_patch_embed freezes a ViT's patch projection; the backbone "
                                  f"{type(backbone).__name__} has none: set method.freeze_patch_embed=false")
            backbone.freeze_patch_projection()
        self.temperature = cfg.temperature
        self.backbone = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], bias=False, last_bias=False, last_norm=True,
                             last_affine=False)
        self.predictor = mlp([cfg.projector[-1], *cfg.predictor], bias=False, last_bias=False,
                             last_norm=cfg.predictor_last_norm, last_affine=False)
        self.momentum_encoder = EMATeacher(nn.Sequential(backbone, self.projector),
                                           cfg.momentum_schedule(cosine_schedule, total_steps))

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        z = [self.projector(self.backbone(x)) for x in views]
        q1, q2 = (self.predictor(zi) for zi in z)
        k1, k2 = (self.momentum_encoder(x) for x in views)  # no gradient
        loss = (moco_contrastive_loss(q1, k2, self.temperature)
                + moco_contrastive_loss(q2, k1, self.temperature))  # symmetrised, Alg. 1
        return StepOutput(loss, {}, z[0].detach())

    def after_step(self, step: int) -> None:
        """The momentum update ``f_m <- m f_m + (1 - m) f`` with step ``step``'s momentum. Their code makes it at
        the start of the next step, with that step's momentum: the same update, the schedule one step earlier."""
        self.momentum_encoder.step(step, nn.Sequential(self.backbone, self.projector))
