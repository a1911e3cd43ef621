"""Exponential moving average (EMA) teacher, shared by BYOL, ExtreMA, MSN and MAE-CT."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn


class EMATeacher(nn.Module):
    """A frozen copy of ``student`` updated as ``teacher = m * teacher + (1 - m) * student``.

    Buffers (BatchNorm statistics) are copied from the student, as BYOL's and MSN's code do. The
    teacher gets no gradient; it stays in the mode of its parent module (train mode during training
    so its BatchNorm uses batch statistics, like the authors' implementations).

    ``momentum`` is the teacher's momentum per step (a schedule, e.g. :meth:`EMAConfig.momentum_schedule`; steps past
    its end keep its last value) or one value for every step; :meth:`step` applies step ``t``'s.
    """

    def __init__(self, student: nn.Module, momentum: Sequence[float] | np.ndarray | float) -> None:
        super().__init__()
        self.module = copy.deepcopy(student)
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.momentum = np.atleast_1d(np.asarray(momentum, dtype=np.float64))  # not state: rebuilt from the config

    def step(self, step: int, student: nn.Module) -> None:
        """The EMA update after optimiser step ``step`` (counted from 0), with that step's momentum."""
        self.update(student, float(self.momentum[min(step, len(self.momentum) - 1)]))

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
