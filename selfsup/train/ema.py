"""Exponential moving average (EMA) teacher, shared by BYOL, ExtreMA, MSN and MAE-CT."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMATeacher(nn.Module):
    """A frozen copy of ``student`` updated as ``teacher = m * teacher + (1 - m) * student``.

    Buffers (BatchNorm statistics) are copied from the student, as BYOL's and MSN's code do. The
    teacher gets no gradient; it stays in the mode of its parent module (train mode during training
    so its BatchNorm uses batch statistics, like the authors' implementations).
    """

    def __init__(self, student: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(student)
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, student: nn.Module, momentum: float) -> None:
        teacher_params = list(self.module.parameters())
        student_params = [p.detach() for p in student.parameters()]
        if len(teacher_params) != len(student_params):
            raise ValueError("EMA teacher and student have different parameter lists")
        torch._foreach_lerp_(teacher_params, student_params, 1.0 - momentum)
        for t, s in zip(self.module.buffers(), student.buffers()):
            t.copy_(s)

    def forward(self, *args, **kwargs):
        with torch.no_grad():
            return self.module(*args, **kwargs)
