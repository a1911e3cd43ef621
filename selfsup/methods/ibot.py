"""iBOT, image BERT pre-training with an online tokenizer (Zhou et al., ICLR 2022): DINO's [CLS] self-distillation
plus masked image modelling, whose targets are the EMA teacher's patch-token distributions (Algorithm 1).

Views as DINO's (:mod:`selfsup.methods.dino`): the first two are the global crops, the rest local crops seen by the
student only. The student sees each global crop with blockwise masks (:func:`selfsup.data.masking.block_masks`): a
masked patch's embedding is replaced by a learnable mask token. The teacher sees the global crops unmasked. ViT only.

Algorithm 1, line by line::

    u, v = blockwise_mask(x1), blockwise_mask(x2)         # forward(): block_masks, the student's mask token
    u_s, v_s = gs(u), gs(v); u_t, v_t = gt(x1), gt(x2)    # [CLS] and patch logits, one head (shared by default)
    L_[CLS] = H(u_t[CLS], v_s[CLS]) + H(v_t[CLS], u_s[CLS]) (+ local crops)   # losses.ibot.ibot_loss, centre C
    L_MIM = sum over masked patches of H(u_t^patch, u_s^patch) (same for v)   # its own centre C', temperature
    update gs; gt <- l gt + (1 - l) gs; C, C' <- EMAs of the teacher's batch means   # after_step(), the loss
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

import torch
from torch import nn

from selfsup.config import ConfigError, Momentum, NonNegative, Range, Temperature, Width, check_fields
from selfsup.data.masking import block_masks
from selfsup.data.views import run_by_size
from selfsup.losses.dino import TeacherCentre
from selfsup.losses.ibot import ibot_loss
from selfsup.methods.base import MethodBase, StepOutput
from selfsup.methods.dino import DINO, DINOConfig
from selfsup.models.heads import DINOHead
from selfsup.models.vit import VisionTransformer
from selfsup.train.ema import EMATeacher
from selfsup.train.schedules import constant_schedule, cosine_schedule

MaskRatio = Annotated[float, Range(ge=0, lt=1, example="0.3")]


@dataclass
class IBOTConfig(DINOConfig):
    """DINO's fields (their defaults where iBOT keeps them) plus the masked-image-modelling ones."""

    VIEWS: ClassVar[tuple[int, int | None]] = (2, None)  # 2 global crops (masked for the student), then local ones
    out_dim: Width = 8192  # K of [CLS] (their ViT-S/B setting)
    patch_out_dim: Width = 8192  # K of the patch tokens when the head is not shared
    shared_head: bool = True  # one last layer for [CLS] and patches (the paper's ViT-S/B setting)
    teacher_patch_temperature: Temperature = 0.07  # tau_t' after the warm-up
    warmup_teacher_patch_temperature: Temperature = 0.04
    patch_center_momentum: Momentum = 0.9
    cls_weight: NonNegative = 1.0  # lambda1
    patch_weight: NonNegative = 1.0  # lambda2
    # prediction ratio per view: one of these, each +- its mask_ratio_var (ViT-S/B: 0, or 0.1-0.5)
    mask_ratio: list[MaskRatio] = field(default_factory=lambda: [0.0, 0.3])
    mask_ratio_var: list[MaskRatio] = field(default_factory=lambda: [0.0, 0.2])
    mask_aspect: list[Annotated[float, Range(gt=0, le=100, example="0.3")]] = field(
        default_factory=lambda: [0.3, 1 / 0.3])  # the blocks' aspect ratio range (log-uniform)

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        if len(self.mask_ratio) != len(self.mask_ratio_var) or not self.mask_ratio:
            raise ConfigError(f"method.mask_ratio_var needs one value per method.mask_ratio, got {self.mask_ratio} "
                              f"and {self.mask_ratio_var}")
        if any(not v <= r or r + v >= 1 for r, v in zip(self.mask_ratio, self.mask_ratio_var)):
            raise ConfigError(f"each method.mask_ratio r needs mask_ratio_var <= r and r + var < 1, got "
                              f"{self.mask_ratio} +- {self.mask_ratio_var}")
        if len(self.mask_aspect) != 2 or self.mask_aspect[0] > self.mask_aspect[1]:
            raise ConfigError(f"method.mask_aspect is a range [low, high], got {self.mask_aspect}")


class IBOT(MethodBase):
    """Student ViT + head with a mask token, distilled on [CLS] and masked patches from an EMA teacher (Fig. 3)."""

    Config = IBOTConfig
    student = DINO.student
    backbone = DINO.backbone
    after_carry_over = DINO.after_carry_over

    def __init__(self, backbone: nn.Module, cfg: IBOTConfig, total_steps: int) -> None:
        super().__init__()
        if not isinstance(backbone, VisionTransformer) or backbone.cls_token is None or backbone.class_attention:
            raise ConfigError("iBOT needs a ViT with a [CLS] token in its blocks (model.backbone vit_laptop, "
                              "vit_tiny, vit_small, vit_base or vit_custom; no class-attention blocks)")
        self.cfg = cfg
        self.encoder = backbone
        self.mask_token = nn.Parameter(torch.zeros(backbone.embed_dim))  # their masked_embed, zeros
        self.head = DINOHead(backbone.num_features, cfg.out_dim, cfg.head_hidden, cfg.bottleneck, cfg.head_layers,
                             cfg.head_batch_norm, cfg.norm_last_layer,
                             patch_out_dim=None if cfg.shared_head else cfg.patch_out_dim)
        self.teacher = EMATeacher(self.student, cfg.momentum_schedule(cosine_schedule, total_steps))
        self.centre = TeacherCentre(cfg.out_dim, cfg.center_momentum)
        self.patch_centre = TeacherCentre(cfg.out_dim if cfg.shared_head else cfg.patch_out_dim,
                                          cfg.patch_center_momentum)
        warmup = round(cfg.teacher_temperature_warmup * total_steps)
        self.teacher_temperature = constant_schedule(cfg.teacher_temperature, total_steps, warmup,
                                                     cfg.warmup_teacher_temperature)
        self.teacher_patch_temperature = constant_schedule(cfg.teacher_patch_temperature, total_steps, warmup,
                                                           cfg.warmup_teacher_patch_temperature)
        self.freeze_last_layer_steps = round(cfg.freeze_last_layer * total_steps)
        self.register_step_count()  # saved: resumes the schedules
        self.teacher.module[0].pool = cfg.eval_pool
        self.export_params = {"pool": cfg.eval_pool}

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        c = self.cfg
        step = min(self.steps_done_now(), len(self.teacher_temperature) - 1)
        frozen = self.steps_done_now() < self.freeze_last_layer_steps
        global_views, local_views = torch.cat(views[:2]), views[2:]
        batch = len(views[0])
        grid = self.encoder.grid_for(*global_views.shape[2:])
        masks = [m.to(global_views.device)
                 for m in block_masks(batch, 2, grid, c.mask_ratio, c.mask_ratio_var, tuple(c.mask_aspect))]
        with torch.no_grad():
            teacher_encoder, teacher_head = self.teacher.module
            t = teacher_encoder.forward_features(global_views)
            teacher_cls, teacher_patches = teacher_head.forward_tokens(t["cls"], t["patch_tokens"])
        s = self.encoder.forward_features(global_views, mask=torch.cat(masks), mask_token=self.mask_token)
        student_cls, student_patches = self.head.forward_tokens(s["cls"], s["patch_tokens"], frozen)
        local_cls = ()
        if local_views:  # unmasked, [CLS] only
            local = torch.cat(run_by_size(lambda x: self.encoder.forward_features(x)["cls"], local_views))
            local_cls = self.head(local, frozen).chunk(len(local_views))
        loss, terms = ibot_loss([*student_cls.chunk(2), *local_cls], list(teacher_cls.chunk(2)),
                                list(student_patches.chunk(2)), list(teacher_patches.chunk(2)), masks,
                                self.centre, self.patch_centre,
                                c.student_temperature, float(self.teacher_temperature[step]),
                                float(self.teacher_patch_temperature[step]), c.cls_weight, c.patch_weight)
        terms["masked_share"] = torch.cat(masks).float().mean()
        return StepOutput(loss, terms, s["cls"][:batch].detach())

    def after_step(self, step: int) -> None:
        """EMA update of the teacher (ViT and head; the mask token is the student's only); the schedules' step."""
        self.teacher.step(step, self.student)
        self.count_step(step)
