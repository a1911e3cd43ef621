"""VICReg (Bardes et al., ICLR 2022): an expander and the variance-invariance-covariance loss.

With M > 2 views it is the multi-view form of Ghosh et al. (NeurIPS 2024, Eq. 10): every view is
compared with the mean of the other views (``selfsup.losses.multiview``). ``expander: p`` selects
that paper's small projector and ``sim_weight: auto`` its tuned lambda = mu for width p
(``selfsup.methods.small_projectors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from selfsup.config import NonNegative, Width, Widths, check_fields
from selfsup.losses.multiview import vicreg_multiview_loss
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput
from selfsup.methods.small_projectors import build_projector, output_width, vicreg_sim_weight


@dataclass
class VICRegConfig(MethodConfig):
    VIEWS: ClassVar[tuple[int, int | None]] = (2, None)  # views per image (least, most), checked on load
    # A list: MLP widths (paper: 3 layers of 8192); an int p: Linear(bias=False)-BN-ReLU-Linear to width p (Ghosh et al.).
    expander: Widths | Width = field(default_factory=lambda: [8192, 8192, 8192])
    sim_weight: NonNegative | Literal["auto"] = 25.0  # lambda; "auto": Ghosh et al.'s tuned lambda = mu for the width p
    var_weight: NonNegative | Literal["auto"] = 25.0  # mu; "auto": equal to sim_weight (Ghosh et al. tie lambda = mu)
    cov_weight: NonNegative = 1.0  # nu

    def __post_init__(self) -> None:
        check_fields(self, "method.")


class VICReg(MethodBase):
    Config = VICRegConfig

    def __init__(self, backbone: nn.Module, cfg: VICRegConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.expander = build_projector(backbone.num_features, cfg.expander, last_bias=True)
        self.sim_weight = vicreg_sim_weight(output_width(cfg.expander)) if cfg.sim_weight == "auto" else cfg.sim_weight
        self.var_weight = self.sim_weight if cfg.var_weight == "auto" else cfg.var_weight

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        z = [self.expander(self.backbone(view)) for view in views]
        loss, terms = vicreg_multiview_loss(z, self.sim_weight, self.var_weight, self.cfg.cov_weight)
        return StepOutput(loss, terms, z[0].detach())
