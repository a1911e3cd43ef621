"""ExtreMA, extreme masking (Wu et al. 2023, arXiv 2206.04667): a ViT student sees only 10-25 % of the patches,
under several disjoint masks per image, and predicts the instance representation that an EMA teacher computes
from the full image.

One step (Sec. 3, Sec. 5.1; the authors' lib/builder.py)::

    keep  = m disjoint sets of floor(N (1 - r)) patch indices per image     # one permutation per image
    q     = predictor(projector(student(x_s, keep)))                        # (m * B, P): only kept tokens enter
    t     = teacher_projector(teacher(x_t))                                 # (B, P): all N tokens, one pass for all masks
    loss  = mean over masks and images of 2 - 2 cos(q, sg(t))              # asymmetric: no symmetrised term
            (or Tab. 6's InfoNCE of q against the batch's keys t, optionally with a queue of past keys, MoCo v2)

The instance representation is the late [CLS] after the CaiT class-attention blocks and the final LayerNorm
(``model.params: {num_class_attention_blocks: 2}``); the heads use LayerNorm + GELU (``method.head_norm``), so
nothing depends on batch statistics. Views (the config's ``views`` list): one view is "1 aug" (the teacher sees the student's image
unmasked); two views are the student's and the teacher's, e.g. ``{preset: extrema, num: 2, shared_crop: true}``
for the paper's "shared crop + colour" (Tab. 4). The exported backbone is the teacher encoder (the authors' linear probe
reads the momentum encoder, main_lincls.py ``--eval_momentum``, but without the final LayerNorm and behind a
non-affine BatchNorm: ``eval_pool: cls_prenorm`` with the probes' standardisation; they fine-tune the student).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import torch
from torch import nn

from selfsup.config import ConfigError, PositiveInt, Range, Temperature, Widths, check_fields
from selfsup.data.masking import multi_mask_keep_indices, num_keep
from selfsup.losses.extrema import extrema_loss
from selfsup.methods.base import EMAConfig, MethodBase, StepOutput
from selfsup.models.heads import mlp, xavier_linears_
from selfsup.models.vit import DropPath, VisionTransformer
from selfsup.train.ema import EMATeacher
from selfsup.train.queue import FeatureQueue, check_queue_batch, check_queue_dataset
from selfsup.train.schedules import cosine_schedule


@dataclass
class ExtreMAConfig(EMAConfig):  # momentum: the teacher's, cosine to momentum_end per step (Sec. 5.1)
    # 1 view (the teacher sees the student's image) or 2 (student, teacher), e.g. {preset: extrema, num: 2, shared_crop: true}
    VIEWS: ClassVar[tuple[int, int | None]] = (1, 2)  # views per image (least, most), checked on load
    projector: Widths = field(default_factory=lambda: [4096, 4096, 256])  # 3 Linear layers, LN + GELU (Sec. 3, code)
    predictor: Widths = field(default_factory=lambda: [4096, 256])  # 2 Linear layers
    head_norm: Literal["layer", "batch"] = "layer"  # the paper's LayerNorm (BN-free), or BYOL's BatchNorm
    # fraction of patches hidden from every student view (Tab. 1: 0.75-0.9)
    mask_ratio: Annotated[float, Range(ge=0, lt=1, example="0.8")] = 0.8
    num_masks: PositiveInt = 2  # masks per image sharing one teacher pass (ablations 2; main model 5 at 0.8)
    disjoint: bool = True  # "without replacement": the masks' visible sets do not overlap (code default)
    loss: Literal["byol", "infonce"] = "byol"  # Tab. 6: BYOL, or MoCo-v3 InfoNCE against gathered teacher keys
    temperature: Temperature = 0.2  # InfoNCE only
    # InfoNCE only: 0 = the global batch's other keys are the negatives (the paper, MoCo v3 at batch 4096); > 0 = also
    # a FIFO of this many past teacher keys (MoCo v2's queue; not the paper's, level on CIFAR-10, docs/benchmarks.md)
    queue_size: Annotated[int, Range(ge=0, le=2**26, example="4096")] = 0
    # exported feature of the teacher: None = the trained instance representation (model.params.pool, the paper's
    # class-attention [CLS]); "mean" = the mean patch token (the "distributed representation" it fine-tunes);
    # "cls_prenorm" = that [CLS] before the final LayerNorm, the authors' linear-probe feature (+ a non-affine BN)
    eval_pool: Literal["cls", "mean", "cls_prenorm"] | None = None

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        if self.queue_size and self.loss != "infonce":
            raise ConfigError(f"method.queue_size={self.queue_size} holds InfoNCE negatives, but method.loss is "
                              f"{self.loss!r}; set method.loss: infonce or method.queue_size: 0")
        if self.predictor[-1] != self.projector[-1]:
            raise ConfigError(f"method.predictor must end at the projector's output width {self.projector[-1]} (it "
                              f"predicts the teacher's projection), got {self.predictor}")

    def check_batch(self, global_batch: int) -> None:
        """Each step pushes the global batch's keys: the queue must hold a whole number of batches."""
        check_queue_batch(self.queue_size, global_batch)

    def check_dataset(self, num_images: int, global_batch: int) -> None:
        check_queue_dataset(self.queue_size, num_images, global_batch, "one of its own negatives")


class ExtreMA(MethodBase):
    """Masked ViT student + projector + predictor, regressed onto an EMA teacher of the full image."""

    Config = ExtreMAConfig

    def __init__(self, backbone: nn.Module, cfg: ExtreMAConfig, total_steps: int) -> None:
        super().__init__()
        if not isinstance(backbone, VisionTransformer) or backbone.pool == "cls_prenorm":
            raise ConfigError("ExtreMA masks patch tokens and needs a ViT backbone (model.backbone vit_laptop, vit_tiny, "
                              "vit_small, vit_base or vit_custom, with model.params.num_class_attention_blocks: 2) whose "
                              "model.params.pool is cls (the paper) or mean; method.eval_pool picks the exported feature")
        if not backbone.class_attention:
            raise ConfigError("ExtreMA needs the late [CLS] of class-attention blocks: set "
                              "model.params.num_class_attention_blocks: 2 (the paper's App. A: an early [CLS] that "
                              "enters the blocks with the few visible patches fails to converge)")
        patches = backbone.num_patches
        keep = num_keep(patches, cfg.mask_ratio)
        if cfg.disjoint and cfg.num_masks * keep > patches:
            raise ConfigError(f"method.num_masks={cfg.num_masks} disjoint masks of {keep} visible patches need "
                              f"{cfg.num_masks * keep} patches but the image has {patches}; use method.num_masks <= "
                              f"{patches // keep}, a higher method.mask_ratio, or method.disjoint=false")
        self.cfg = cfg
        self.encoder = backbone
        self.projector = mlp([backbone.num_features, *cfg.projector], norm=cfg.head_norm, act="gelu")
        self.predictor = mlp([cfg.projector[-1], *cfg.predictor], norm=cfg.head_norm, act="gelu")
        xavier_linears_(self)  # the authors' init of every Linear layer (ViT and heads), before the teacher copy
        self.target = EMATeacher(nn.Sequential(self.encoder, self.projector),
                                 cfg.momentum_schedule(cosine_schedule, total_steps))
        for module in self.target.modules():  # stochastic depth on the student only (authors' code)
            if isinstance(module, DropPath):
                module.drop_prob = 0.0
        self.queue = FeatureQueue(cfg.queue_size, cfg.projector[-1]) if cfg.queue_size else None
        self.export_params = {"pool": cfg.eval_pool or backbone.pool}
        self.target.module[0].pool = self.export_params["pool"]  # its forward() is the evaluated feature

    @property
    def backbone(self) -> nn.Module:
        """The EMA teacher's ViT: the authors evaluate the momentum encoder."""
        return self.target.module[0]

    def no_weight_decay(self) -> set[str]:
        """The student ViT's [CLS] and positions get no weight decay: the authors' main.py passes the model's
        ``no_weight_decay()`` list to timm's ``add_weight_decay`` (MAE's and MSN's code decay them by shape)."""
        return {f"encoder.{name}" for name in self.encoder.no_weight_decay()}

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        c = self.cfg
        student_view, teacher_view = views[0], views[-1]
        batch = student_view.shape[0]
        grid = self.encoder.grid_for(student_view.shape[2], student_view.shape[3])
        patches = grid[0] * grid[1]
        keep = multi_mask_keep_indices(batch, patches, c.num_masks, num_keep(patches, c.mask_ratio), c.disjoint,
                                       device=student_view.device)  # (m, B, K)
        z = self.projector(self.encoder(student_view, keep.flatten(0, 1)))  # (m * B, P), mask-major
        q = self.predictor(z)
        with torch.no_grad():  # one unmasked pass serves every mask
            teacher_vit, teacher_head = self.target.module
            t = teacher_head(teacher_vit.forward_features(teacher_view)[self.encoder.pool])  # (B, P)
        negatives = None
        if self.queue is not None:
            negatives = self.queue.features
            self.queue.push_after_step(t)
        return StepOutput(extrema_loss(q, t, c.loss, c.temperature, negatives), {}, z[:batch].detach())

    def after_step(self, step: int) -> None:
        """Push this step's teacher keys into the queue, if any; EMA update of the teacher encoder and projector,
        ``xi <- m xi + (1 - m) theta``."""
        if self.queue is not None:
            self.queue.push_pending()
        self.target.step(step, nn.Sequential(self.encoder, self.projector))
