"""MSN, Masked Siamese Networks (Assran et al., ECCV 2022): masked anchor views of a ViT match the
prototype assignments of an unmasked target view computed by an EMA copy of the encoder.

Views (the config's ``views`` list, in order): ``views[0]`` is the target view, the next
``masked_views`` are anchors whose patch tokens are randomly dropped (only the kept tokens enter the
encoder, Sec. 3 "Patchify and Mask"), and the remaining views are focal anchors: small multi-crops,
unmasked, as in the authors' code. Each group (masked; focal of one size) goes through encoder and
projection head in its own call, so the head's BatchNorm statistics are per resolution (code).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import torch
from torch import nn

from selfsup.config import ConfigError, NonNegative, Range, Temperature, Width, Widths, check_fields
from selfsup.data.masking import random_keep_indices
from selfsup.data.views import run_by_size
from selfsup.losses.msn import msn_loss
from selfsup.methods.base import EMAConfig, MethodBase, StepOutput
from selfsup.models.heads import Prototypes, mlp
from selfsup.models.vit import VisionTransformer
from selfsup.train.ema import EMATeacher
from selfsup.train.schedules import linear_schedule


@dataclass
class MSNConfig(EMAConfig):  # momentum: linear to momentum_end (App. A.1)
    VIEWS: ClassVar[tuple[int, int | None]] = (2, None)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [2048, 2048, 256])  # hidden, hidden, out (App. A.1, code)
    projector_norm: Literal["batch", "layer", "none"] = "batch"  # BN on the hidden layers, GELU (App. A.1)
    num_prototypes: Width = 1024  # K (App. A.1, Tab. 12)
    anchor_temperature: Temperature = 0.1  # tau
    target_temperature: Temperature = 0.025  # tau+ < tau sharpens the targets (Sec. 3)
    # on the targets; 0 = off (Tab. 11: then raise memax_weight, e.g. 5)
    sinkhorn_iterations: Annotated[int, Range(ge=0, le=1000, example="3 (0 = off)")] = 3
    memax_weight: NonNegative = 1.0  # lambda of ME-MAX
    # of the prototype labels (authors' code; 0 in their configs)
    label_smoothing: Annotated[float, Range(ge=0, lt=1)] = 0.0
    # fraction of patches dropped from masked anchors (ViT-S 0.15, B 0.3, L 0.7)
    mask_ratio: Annotated[float, Range(ge=0, lt=1, example="0.15")] = 0.15
    # views after the target that are randomly masked; the rest are focal views
    masked_views: Annotated[int, Range(ge=0, le=256)] = 1
    shared_mask: bool = False  # one mask for the whole batch (authors' code) instead of one per image
    # authors' code: 1.25 (schedule built 1.25x longer, ends at ~0.9992)
    momentum_stretch: Annotated[float, Range(ge=1, le=100, example="1.25 (the authors' code)")] = 1.0
    # exported feature: [CLS] before the final norm (code), after it, or the mean patch token (small ViTs, laptop preset)
    eval_pool: Literal["cls_prenorm", "cls", "mean"] = "cls_prenorm"

    def warnings(self, global_batch: int) -> list[str]:
        """Settings that run but defeat the method at this batch size."""
        if self.sinkhorn_iterations and self.num_prototypes > global_batch:
            return [f"method.num_prototypes={self.num_prototypes} exceeds the global batch of {global_batch} with "
                    f"Sinkhorn on: it gives every prototype an equal share of {global_batch / self.num_prototypes:.3g} "
                    f"images, so even a well-clustered batch spreads each target over many prototypes. Use "
                    f"num_prototypes <= trainer.batch_size, or method.sinkhorn_iterations=0 with a higher "
                    f"method.memax_weight (paper Tab. 11)"]
        return []

    def __post_init__(self) -> None:
        check_fields(self, "method.")


class MSN(MethodBase):
    """Anchor encoder + projection head + prototypes, trained against an EMA target (Fig. 3)."""

    Config = MSNConfig

    def __init__(self, backbone: nn.Module, cfg: MSNConfig, total_steps: int) -> None:
        super().__init__()
        if not isinstance(backbone, VisionTransformer) or backbone.cls_token is None or backbone.pool != "cls":
            raise ConfigError("MSN needs a ViT with a [CLS] token pooled after the final norm (model.backbone "
                              "vit_tiny/vit_small/vit_base/vit_custom, model.params.pool: cls); the exported "
                              "backbone uses method.eval_pool")
        self.cfg = cfg
        self.encoder = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], norm=cfg.projector_norm, act="gelu")
        self.prototypes = Prototypes(cfg.num_prototypes, cfg.projector[-1])
        self.target = EMATeacher(nn.Sequential(self.encoder, self.projector),
                                 cfg.momentum_schedule(linear_schedule, total_steps, cfg.momentum_stretch))
        self.target.module[0].pool = cfg.eval_pool  # its forward() is the evaluated feature (monitors, export)
        self.export_params = {"pool": cfg.eval_pool}

    @property
    def backbone(self) -> nn.Module:
        """The EMA target ViT, pooling ``eval_pool``: MSN evaluates the target encoder (App. A.1)."""
        return self.target.module[0]

    def _similarities(self, z: torch.Tensor) -> torch.Tensor:
        """Cosine similarities to the prototypes, in float32 even under mixed precision."""
        with torch.autocast(z.device.type, enabled=False):
            return self.prototypes(z.float())

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        c = self.cfg
        if len(views) < 2 or len(views) < 1 + c.masked_views:
            raise ValueError(f"MSN needs a target view and at least one anchor view, with {c.masked_views} masked "
                             f"anchor(s) (method.masked_views), but the config makes {len(views)} views; list the "
                             "target, the masked anchors, then the focal views in `views`")
        target, masked, focal = views[0], views[1:1 + c.masked_views], views[1 + c.masked_views:]
        batch = target.shape[0]

        anchors = []
        if masked:
            x = torch.cat(masked)
            grid = self.encoder.grid_for(x.shape[2], x.shape[3])
            keep = random_keep_indices(len(x), grid[0] * grid[1], c.mask_ratio, shared=c.shared_mask, device=x.device)
            anchors.append(self.projector(self.encoder(x, keep)))
        anchors += run_by_size(lambda x: self.projector(self.encoder(x)), focal)  # one call per focal size
        z_anchor = torch.cat(anchors)
        with torch.no_grad():
            target_vit, target_head = self.target.module
            z_target = target_head(target_vit.forward_features(target)["cls"])  # [CLS] after the final norm
            target_similarities = self._similarities(z_target)

        loss, terms = msn_loss(self._similarities(z_anchor), target_similarities,
                               c.anchor_temperature, c.target_temperature, c.sinkhorn_iterations, c.memax_weight,
                               c.label_smoothing)
        return StepOutput(loss, terms, z_anchor[:batch].detach())

    def after_step(self, step: int) -> None:
        """EMA update of the target encoder and head, ``theta_bar <- m theta_bar + (1 - m) theta``."""
        self.target.step(step, nn.Sequential(self.encoder, self.projector))
