"""Barlow Twins (Zbontar et al., ICML 2021): make the cross-correlation of the views' embeddings the identity.

With M > 2 views it is the multi-view form of Ghosh et al. (NeurIPS 2024, Eq. 10): every view is
correlated with the mean embedding of the M views (``selfsup.losses.multiview``). ``projector: p``
selects that paper's small projector and ``lambd: auto`` its tuned beta(p, M)
(``selfsup.methods.small_projectors``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from torch import nn

from selfsup.config import NonNegative, Width, Widths, check_fields
from selfsup.losses.multiview import barlow_twins_multiview_loss
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput
from selfsup.methods.small_projectors import barlow_twins_beta, build_projector, output_width


@dataclass
class BarlowTwinsConfig(MethodConfig):
    VIEWS: ClassVar[tuple[int, int | None]] = (2, None)  # views per image (least, most), checked on load
    # A list: MLP widths (paper: 3 layers of 8192); an int p: Linear(bias=False)-BN-ReLU-Linear to width p (Ghosh et al.).
    projector: Widths | Width = field(default_factory=lambda: [8192, 8192, 8192])
    # Off-diagonal weight, Ghosh et al.'s beta (the authors' code: 0.0051; the paper says 5e-3);
    # "auto": Ghosh et al.'s tuned beta for the projector width p and the number of views M.
    lambd: NonNegative | Literal["auto"] = 0.0051

    def __post_init__(self) -> None:
        check_fields(self, "method.")


class BarlowTwins(MethodBase):
    Config = BarlowTwinsConfig

    def __init__(self, backbone: nn.Module, cfg: BarlowTwinsConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = backbone
        self.projector = build_projector(backbone.num_features, cfg.projector, last_bias=False)

    def off_diagonal_weight(self, num_views: int) -> float:
        """The configured ``lambd``, or the tuned beta(p, M) when it is "auto"."""
        if self.cfg.lambd == "auto":
            return barlow_twins_beta(output_width(self.cfg.projector), num_views)
        return self.cfg.lambd

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        z = [self.projector(self.backbone(view)) for view in views]
        loss, terms = barlow_twins_multiview_loss(z, self.off_diagonal_weight(len(views)))
        return StepOutput(loss, terms, z[0].detach())
