"""DINO, self-distillation with no labels (Caron et al., ICCV 2021): a student network matches the centred, sharpened
output of an EMA teacher across the crops of an image (Algorithm 1).

Views (the config's ``views`` list, in order): the first two are the global crops, seen by teacher and student;
every later view is a local crop (smaller, e.g. 16 px beside 32 px), seen by the student only (Sec. 3.1 "multi-crop").
The student's views of one size share a backbone call (their ``MultiCropWrapper``), then one head call on all.

Algorithm 1, line by line::

    gs, gt = student, teacher                         # self.encoder + self.head; self.teacher (EMA copy)
    t1, t2 = gt(x1), gt(x2)                           # forward(): teacher logits of the 2 global views
    s = gs(x1), gs(x2), gs(local crops)               # forward(): student logits of every view
    loss = mean H(t_i, s_j), i != j                   # losses.dino.dino_loss, centre c, temperatures tau_t, tau_s
    update gs                                         # the optimiser; last layer frozen early (freeze_last_layer)
    gt.params = l * gt.params + (1 - l) * gs.params   # after_step(): EMA, l cosine 0.996 -> 1
    C = m * C + (1 - m) * mean(t1, t2)                # dino_loss, after the loss, all-reduced over processes
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import torch
from torch import nn

from selfsup.config import ConfigError, Depth, Momentum, Range, Temperature, Width, check_fields
from selfsup.data.views import run_by_size
from selfsup.losses.dino import TeacherCentre, dino_loss
from selfsup.methods.base import EMAConfig, MethodBase, StepOutput
from selfsup.models.heads import DINOHead
from selfsup.models.vit import VisionTransformer
from selfsup.train.ema import EMATeacher
from selfsup.train.schedules import constant_schedule, cosine_schedule

Fraction = Annotated[float, Range(ge=0, le=1, example="0.1 (a fraction of the run)")]


@dataclass
class DINOConfig(EMAConfig):  # momentum: lambda, cosine 0.996 -> 1 (Sec. 3.1)
    VIEWS: ClassVar[tuple[int, int | None]] = (2, None)  # 2 global crops, then any number of local crops
    SAME_SIZE_VIEWS: ClassVar[int] = 2  # the teacher takes the two global crops as one batch (iBOT's student too)
    out_dim: Width = 65536  # K (Sec. 3.1; App. Tab. 9 ablates 1024-262144)
    head_hidden: Width = 2048
    bottleneck: Width = 256
    head_layers: Depth = 3
    head_batch_norm: bool = False  # their use_bn_in_head (off for ViT)
    norm_last_layer: bool = True  # weight-norm g fixed to 1 (their default; False lets it learn)
    student_temperature: Temperature = 0.1  # tau_s
    teacher_temperature: Temperature = 0.07  # tau_t after the warm-up (paper: 0.04 -> 0.07 in 30 of 300 epochs)
    warmup_teacher_temperature: Temperature = 0.04
    teacher_temperature_warmup: Fraction = 0.1  # the warm-up's share of the run (30 / 300 epochs)
    center_momentum: Momentum = 0.9  # m of the centre's EMA (Eq. 4)
    # share of the run whose last-layer gradients are zeroed (their 1 epoch: 1/100 of their default run)
    freeze_last_layer: Fraction = 0.01
    # exported feature of the teacher ViT: [CLS] after the final norm (their kNN), before it, or the mean patch token
    eval_pool: Literal["cls", "cls_prenorm", "mean"] = "cls"

    def __post_init__(self) -> None:
        check_fields(self, "method.")


def trained_feature(encoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The feature DINO trains on: a ViT's [CLS] after the final norm (their ViT's output), a ResNet's pooled map."""
    if isinstance(encoder, VisionTransformer):
        return encoder.forward_features(x)["cls"]
    return encoder(x)


class DINO(MethodBase):
    """Student (backbone + DINO head) distilled from an EMA teacher of the same shape (Fig. 2)."""

    Config = DINOConfig

    def __init__(self, backbone: nn.Module, cfg: DINOConfig, total_steps: int) -> None:
        super().__init__()
        if isinstance(backbone, VisionTransformer) and backbone.cls_token is None:
            raise ConfigError("DINO trains on a ViT's [CLS] token: build the ViT with cls_token: true")
        self.cfg = cfg
        self.encoder = backbone
        self.head = DINOHead(backbone.num_features, cfg.out_dim, cfg.head_hidden, cfg.bottleneck, cfg.head_layers,
                             cfg.head_batch_norm, cfg.norm_last_layer)
        self.teacher = EMATeacher(self.student, cfg.momentum_schedule(cosine_schedule, total_steps))
        self.centre = TeacherCentre(cfg.out_dim, cfg.center_momentum)
        self.teacher_temperature = constant_schedule(cfg.teacher_temperature, total_steps,
                                                     round(cfg.teacher_temperature_warmup * total_steps),
                                                     cfg.warmup_teacher_temperature)
        self.freeze_last_layer_steps = round(cfg.freeze_last_layer * total_steps)
        self.register_step_count()  # saved: resumes the schedules
        if isinstance(backbone, VisionTransformer):
            self.teacher.module[0].pool = cfg.eval_pool  # its forward() is the evaluated feature (monitors, export)
            self.export_params = {"pool": cfg.eval_pool}

    @property
    def student(self) -> nn.Sequential:
        """Backbone and head: what the teacher averages."""
        return nn.Sequential(self.encoder, self.head)

    @property
    def backbone(self) -> nn.Module:
        """The teacher's backbone: DINO evaluates the teacher (Sec. 5.3, Fig. 6: it beats the student)."""
        return self.teacher.module[0]

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        c = self.cfg
        step = min(self.steps_done_now(), len(self.teacher_temperature) - 1)
        global_views = views[:2]
        with torch.no_grad():
            teacher_encoder, teacher_head = self.teacher.module
            teacher_logits = teacher_head(trained_feature(teacher_encoder, torch.cat(global_views))).chunk(2)
        features = torch.cat(run_by_size(lambda x: trained_feature(self.encoder, x), views))
        frozen = self.steps_done_now() < self.freeze_last_layer_steps
        student_logits = self.head(features, freeze_last_layer=frozen).chunk(len(views))
        loss, terms = dino_loss(list(student_logits), list(teacher_logits), self.centre, c.student_temperature,
                                float(self.teacher_temperature[step]))
        terms["teacher_temperature"] = torch.tensor(float(self.teacher_temperature[step]))
        return StepOutput(loss, terms, features[:len(views[0])].detach())

    def after_step(self, step: int) -> None:
        """EMA update of the teacher, ``theta_t <- l theta_t + (1 - l) theta_s``; the step count for the schedules."""
        self.teacher.step(step, self.student)
        self.count_step(step)

    def after_carry_over(self) -> None:
        """A stage that starts from another's weights starts its teacher from them (their teacher = student at 0)."""
        self.teacher.module.load_state_dict(self.student.state_dict())
