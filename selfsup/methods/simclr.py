"""SimCLR (Chen, Kornblith, Norouzi & Hinton 2020, arXiv 2002.05709): each image's two views pick each other out of
the 2N views of the global batch.

One step (the paper's Alg. 1)::

    h = f(cat(x1, x2))                     # the 2N views in one pass: BatchNorm statistics over both views
                                           # (views of two sizes: one pass per size, as DINO's multi-crop)
    z1, z2 = split(g(h))                   # projection head g: Linear-BN-ReLU ... Linear-BN
    loss = NT-Xent(z1, z2, tau)            # Eq. 1: every view an anchor, the 2N - 2 others of the global batch
                                           # its negatives, gathered with gradients across processes

The head follows the authors' code (model_util.py ``projection_head``): Linear layers without bias, each followed by
BatchNorm, ReLU after the hidden ones; ``projector`` lists the widths, so its length is the depth (the paper's 2
layers ``[2048, 128]``; SimCLR v2's 3 layers ``[2048, 2048, 128]``). The exported backbone is f (the paper evaluates h).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from selfsup.config import Temperature, Widths, check_fields
from selfsup.data.views import run_by_size
from selfsup.losses.infonce import nt_xent_loss
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput
from selfsup.models.heads import mlp


@dataclass
class SimCLRConfig(MethodConfig):
    VIEWS: ClassVar[tuple[int, int | None]] = (2, 2)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [2048, 128])  # 2 layers (Sec. 4.2), 128-d output (their code)
    temperature: Temperature = 0.5  # CIFAR-10 (App. B.9); their ImageNet runs at batch 4096 use 0.1 (Tab. 5)

    def __post_init__(self) -> None:
        check_fields(self, "method.")


class SimCLR(MethodBase):
    """Encoder f + projection head g, trained with NT-Xent."""

    Config = SimCLRConfig

    def __init__(self, backbone: nn.Module, cfg: SimCLRConfig, total_steps: int) -> None:
        super().__init__()
        self.temperature = cfg.temperature
        self.backbone = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], bias=False, last_bias=False, last_norm=True)

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        z1, z2 = self.projector(torch.cat(run_by_size(self.backbone, views))).chunk(2)
        return StepOutput(nt_xent_loss(z1, z2, self.temperature), {}, z1.detach())
