"""NNCLR (Dwibedi et al. 2021, arXiv 2104.14548), and the contrastive heads of MAE-CT (Lehner et al. 2023,
arXiv 2304.10520): SimCLR whose positive is a neighbour of the anchor in a queue of past embeddings.

One step (MAE-CT Alg. 1; NNCLR Eq. 2 is ``projector_momentum: null, topk: 1``)::

    y1, y2 = encoder(x1), encoder(x2)                                  # pooled features
    p1, p2 = predictor(projector(y1)), predictor(projector(y2))         # BatchNorm statistics per view
    z1, z2 = normalize(projector_ema(y1)), normalize(projector_ema(y2)) # no gradient; or the projector itself
    n1, n2 = queue.nearest(z1, k), queue.nearest(z2, k)                # uniform among the k nearest
    loss   = InfoNCE(n1, p2) / 2 + InfoNCE(n2, p1) / 2                  # negatives: the gathered predictions
    queue.push(z1); EMA updates of projector_ema and encoder_ema

MAE-CT's stages are this method on a MAE encoder with ``model.freeze`` (all of it in stage 2, the lower half in
stage 3), ``encoder_momentum`` (the EMA encoder is the final model) and ``projector_momentum`` (configs/*/mae_ct.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.config import Momentum, PositiveInt, Range, Temperature, Widths, check_fields
from selfsup.losses.infonce import info_nce_loss
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput, check_values
from selfsup.models.heads import mlp
from selfsup.train.ema import EMATeacher
from selfsup.train.queue import FeatureQueue, check_queue_batch, check_queue_dataset


@dataclass
class NNCLRConfig(MethodConfig):
    VIEWS: ClassVar[tuple[int, int | None]] = (2, 2)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [2048, 2048, 256])  # 3 layers, last BN without ReLU
    predictor: Widths = field(default_factory=lambda: [4096, 256])  # 2 layers, no BN after the last
    # NNCLR's support set; MAE-CT 65,536; a multiple of the global batch
    queue_size: Annotated[int, Range(ge=1, le=2**26, example="65536")] = 98304
    temperature: Temperature = 0.1  # NNCLR 0.1; MAE-CT 0.15 (B) / 0.2 (L) / 0.3 (H)
    topk: PositiveInt = 1  # 1: the nearest neighbour (NNCLR, MAE-CT stage 2); MAE-CT's CT draws among the 10-30 nearest
    projector_momentum: Momentum | None = None  # null: the NN path uses the projector itself; MAE-CT's CT: 0.99
    # null: export the online encoder; MAE-CT: an EMA copy (0.9999) is the model
    encoder_momentum: Momentum | None = None
    eval_pool: Literal["cls", "mean"] | None = None  # exported ViT feature; None = model.params.pool

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        check_values(self, {"predictor": self.predictor[-1] == self.projector[-1], "topk": self.topk <= self.queue_size},
                     {"predictor": f"a list of widths ending at the projector's output {self.projector[-1:]}",
                      "topk": "in [1, method.queue_size]"})

    def check_batch(self, global_batch: int) -> None:
        """Each step pushes the global batch: the queue must hold a whole number of batches (MAE-CT's assertion)."""
        check_queue_batch(self.queue_size, global_batch)

    def check_dataset(self, num_images: int, global_batch: int) -> None:
        check_queue_dataset(self.queue_size, num_images, global_batch,  # the authors exclude a sample's own id
                            "its nearest neighbour (a self-positive)")


class NNCLR(MethodBase):
    """Encoder + projector + predictor, a support queue, optional EMA projector (NN path) and EMA encoder (export)."""

    Config = NNCLRConfig

    def __init__(self, backbone: nn.Module, cfg: NNCLRConfig, total_steps: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = backbone
        if cfg.eval_pool is not None:
            self.export_params = {"pool": cfg.eval_pool}
            backbone.pool = cfg.eval_pool  # the head sees the feature that is evaluated (MAE-CT App. A.2)
        self.projector = mlp([backbone.num_features, *cfg.projector], norm="batch", act="relu", last_norm=True,
                             bias=False, last_bias=False)
        self.predictor = mlp([cfg.projector[-1], *cfg.predictor], norm="batch", act="relu", bias=False, last_bias=False)
        self.queue = FeatureQueue(cfg.queue_size, cfg.projector[-1])
        self.projector_ema = EMATeacher(self.projector, cfg.projector_momentum) if cfg.projector_momentum is not None else None
        self.encoder_ema = EMATeacher(self.encoder, cfg.encoder_momentum) if cfg.encoder_momentum is not None else None

    @property
    def backbone(self) -> nn.Module:
        """The exported encoder: the EMA copy when ``encoder_momentum`` is set (MAE-CT), else the online one."""
        return self.encoder_ema.module if self.encoder_ema is not None else self.encoder

    def after_carry_over(self) -> None:
        """A stage that starts from another's weights starts its EMA copies from them (MAE-CT's code)."""
        for ema, online in ((self.projector_ema, self.projector), (self.encoder_ema, self.encoder)):
            if ema is not None:
                ema.module.load_state_dict(online.state_dict())

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        c = self.cfg
        y = [self.encoder(view) for view in views]
        z = [self.projector(yi) for yi in y]  # the head runs per view: BatchNorm statistics per view
        p = [self.predictor(zi) for zi in z]
        with torch.no_grad():
            key = [F.normalize(self.projector_ema(yi) if self.projector_ema is not None else zi, dim=1) for yi, zi in zip(y, z)]
            neighbours = [self.queue.nearest(ki, c.topk) for ki in key]
        loss = 0.5 * (info_nce_loss(neighbours[0], p[1], c.temperature, key_gradient=True)
                      + info_nce_loss(neighbours[1], p[0], c.temperature, key_gradient=True))
        self.queue.push_after_step(key[0])  # view 1
        nn_cos = (key[0] * neighbours[0]).sum(dim=1).mean()
        return StepOutput(loss, {"nn_cos": nn_cos}, z[0].detach())

    def after_step(self, step: int) -> None:
        self.queue.push_pending()
        if self.projector_ema is not None:
            self.projector_ema.step(step, self.projector)
        if self.encoder_ema is not None:
            self.encoder_ema.step(step, self.encoder)
