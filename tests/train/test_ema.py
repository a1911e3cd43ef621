"""EMA teacher: ``teacher = m * teacher + (1 - m) * student``, buffers copied, no gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from selfsup.train.ema import EMATeacher


def _student() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).double()


def _perturb(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))


def test_teacher_is_a_frozen_independent_copy() -> None:
    student = _student()
    ema = EMATeacher(student, 0.99)
    for (n, t), s in zip(ema.module.named_parameters(), student.parameters()):
        assert not t.requires_grad and s.requires_grad
        assert torch.equal(t, s) and t.data_ptr() != s.data_ptr(), n
    before = [p.clone() for p in ema.module.parameters()]
    _perturb(student)
    assert all(torch.equal(b, t) for b, t in zip(before, ema.module.parameters()))


@pytest.mark.parametrize("m", [0.9, 0.996, 0.5])
def test_update_is_the_ema_formula(m: float) -> None:
    student = _student()
    ema = EMATeacher(student, 0.99)
    _perturb(student)
    teacher_before = [p.clone() for p in ema.module.parameters()]
    ema.update(student, m)
    for t0, s, t1 in zip(teacher_before, student.parameters(), ema.module.parameters()):
        assert not torch.equal(t0, s)
        torch.testing.assert_close(t1, m * t0 + (1 - m) * s.detach(), rtol=1e-12, atol=1e-14)


def test_momentum_one_keeps_teacher_and_zero_copies_student() -> None:
    student = _student()
    ema = EMATeacher(student, 0.99)
    _perturb(student)
    before = [p.clone() for p in ema.module.parameters()]
    ema.update(student, 1.0)
    assert all(torch.equal(b, t) for b, t in zip(before, ema.module.parameters()))
    ema.update(student, 0.0)
    for s, t in zip(student.parameters(), ema.module.parameters()):
        torch.testing.assert_close(t, s.detach(), rtol=0, atol=1e-15)


def test_buffers_are_copied_from_student() -> None:
    student = _student()
    ema = EMATeacher(student, 0.99)
    student.train()
    student(torch.randn(8, 3, dtype=torch.float64) * 3 + 2)  # moves BatchNorm running statistics
    bn_s, bn_t = student[1], ema.module[1]
    assert not torch.equal(bn_s.running_mean, bn_t.running_mean)
    ema.update(student, 0.99)
    assert torch.equal(bn_s.running_mean, bn_t.running_mean)
    assert torch.equal(bn_s.running_var, bn_t.running_var)
    assert bn_t.num_batches_tracked.item() == bn_s.num_batches_tracked.item() == 1


def test_teacher_gets_no_gradient() -> None:
    student = _student()
    ema = EMATeacher(student, 0.99)
    x = torch.randn(6, 3, dtype=torch.float64)
    out_t = ema(x)
    assert not out_t.requires_grad
    loss = ((student(x) - out_t) ** 2).sum() + ema.module(x).sum() * 0  # even a direct call is frozen
    loss.backward()
    assert all(p.grad is None for p in ema.module.parameters())
    assert all(p.grad is not None for p in student.parameters())


def test_mismatched_student_raises() -> None:
    ema = EMATeacher(_student(), 0.99)
    with pytest.raises(ValueError):
        ema.update(nn.Linear(3, 4).double(), 0.9)


def test_step_applies_that_steps_momentum_and_holds_the_last_past_the_end() -> None:
    student = _student()
    ema = EMATeacher(student, [0.5, 0.9, 0.99])
    for step, m in [(1, 0.9), (0, 0.5), (7, 0.99)]:
        _perturb(student)
        before = [p.clone() for p in ema.module.parameters()]
        ema.step(step, student)
        for t0, s, t1 in zip(before, student.parameters(), ema.module.parameters()):
            torch.testing.assert_close(t1, m * t0 + (1 - m) * s.detach(), rtol=1e-12, atol=1e-14)
    constant = EMATeacher(student, 0.7)
    assert constant.momentum.tolist() == [0.7]
