"""DINO and iBOT losses (Caron et al. 2021, Eq. 2-4; Zhou et al. 2022, Eq. 1-2) against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selfsup.losses.dino import TeacherCentre, dino_loss
from selfsup.losses.ibot import ibot_loss, masked_patch_loss
from selfsup.train.schedules import constant_schedule


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logits(n: int, b: int = 4, k: int = 6, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, k, generator=g, dtype=torch.float64) for _ in range(n)]


def _reference(student: list[np.ndarray], teacher: list[np.ndarray], center: np.ndarray, ts: float, tt: float) -> float:
    """DINO's Algorithm 1 written out in NumPy: every (global teacher view, other student view) pair, equal weights."""
    terms = []
    for t, tv in enumerate(teacher):
        p_t = _softmax((tv - center) / tt)
        for s, sv in enumerate(student):
            if s != t:
                terms.append(np.mean(-(p_t * np.log(_softmax(sv / ts))).sum(-1)))
    return float(np.mean(terms))


def test_dino_loss_is_the_mean_over_pairs_of_other_views() -> None:
    student, teacher = _logits(4), _logits(2, seed=1)
    centre = TeacherCentre(6)
    centre.center.copy_(torch.linspace(-0.5, 0.5, 6, dtype=torch.float64).float())
    expected = _reference([s.numpy() for s in student], [t.numpy() for t in teacher], centre.center.double().numpy(),
                          0.1, 0.05)
    loss, terms = dino_loss(student, teacher, centre, student_temperature=0.1, teacher_temperature=0.05)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert set(terms) == {"teacher_entropy", "kl"}
    assert terms["kl"].item() >= -1e-6  # cross-entropy >= the teacher's entropy


def test_dino_temperatures_are_not_swapped() -> None:
    student, teacher = _logits(3), _logits(2, seed=1)
    loss, _ = dino_loss(student, teacher, TeacherCentre(6), student_temperature=0.1, teacher_temperature=0.04)
    swapped = _reference([s.numpy() for s in student], [t.numpy() for t in teacher], np.zeros(6), 0.04, 0.1)
    assert loss.item() == pytest.approx(_reference([s.numpy() for s in student], [t.numpy() for t in teacher],
                                                   np.zeros(6), 0.1, 0.04), rel=1e-6)
    assert abs(loss.item() - swapped) > 1e-2


def test_student_equal_to_teacher_view_is_skipped() -> None:
    """Student view t is never compared with teacher view t: changing only the pairs' own views would show."""
    teacher = _logits(2, seed=1)
    student = [teacher[0].clone(), teacher[1].clone()]
    loss, _ = dino_loss(student, teacher, TeacherCentre(6), 1.0, 1.0)
    cross = _reference([s.numpy() for s in student], [t.numpy() for t in teacher], np.zeros(6), 1.0, 1.0)
    assert loss.item() == pytest.approx(cross, rel=1e-9)
    same_view = np.mean([np.mean(-(_softmax(t.numpy()) * np.log(_softmax(t.numpy()))).sum(-1)) for t in teacher])
    assert abs(loss.item() - same_view) > 1e-3


def test_no_gradient_flows_into_the_teacher() -> None:
    student = [s.requires_grad_() for s in _logits(3)]
    teacher = [t.requires_grad_() for t in _logits(2, seed=1)]
    loss, _ = dino_loss(student, teacher, TeacherCentre(6))
    loss.backward()
    assert all(t.grad is None for t in teacher)
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in student)


def test_centre_is_an_ema_of_the_teacher_batch_mean_updated_after_the_loss() -> None:
    student, teacher = _logits(3), _logits(2, seed=1)
    centre = TeacherCentre(6, momentum=0.9)
    centre.center.fill_(0.25)
    before = _reference([s.numpy() for s in student], [t.numpy() for t in teacher], np.full(6, 0.25), 0.1, 0.04)
    loss, _ = dino_loss(student, teacher, centre)
    assert loss.item() == pytest.approx(before, rel=1e-6)  # the loss used the old centre
    batch_mean = torch.cat(teacher).mean(0).float()
    torch.testing.assert_close(centre.center, 0.9 * 0.25 + 0.1 * batch_mean)


def test_centring_and_sharpening_extremes() -> None:
    """A teacher constant over images equals the centre after enough updates, and centring then gives a uniform
    target (Sec. 5.3: centring alone pushes to uniform, sharpening alone to one dimension)."""
    constant = torch.tensor([[3.0, 0.0, 0.0, 0.0]]).repeat(5, 1).double()
    centre = TeacherCentre(4, momentum=0.0)
    centre.update(constant)
    student = [torch.zeros(5, 4, dtype=torch.float64), torch.zeros(5, 4, dtype=torch.float64)]
    loss, terms = dino_loss(student, [constant], centre, teacher_temperature=0.01)
    assert terms["teacher_entropy"].item() == pytest.approx(math.log(4), rel=1e-9)
    assert loss.item() == pytest.approx(math.log(4), rel=1e-9)
    _, sharp = dino_loss(student, [constant], TeacherCentre(4), teacher_temperature=0.01)
    assert sharp["teacher_entropy"].item() < 1e-6  # uncentred and sharp: one-hot


def test_teacher_temperature_warm_up_schedule() -> None:
    """0.04 -> 0.07 linearly over the warm-up, then held (theirs: np.linspace per epoch; ours per step)."""
    s = constant_schedule(0.07, 10, warmup_steps=4, warmup_start=0.04)
    np.testing.assert_allclose(s, [0.04, 0.0475, 0.055, 0.0625] + [0.07] * 6)


def test_masked_patch_loss_counts_masked_tokens_only() -> None:
    g = torch.Generator().manual_seed(3)
    student = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    teacher = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, False, True, False, False], [False] * 5])
    centre = TeacherCentre(4)
    centre.center.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    loss = masked_patch_loss([student], [teacher], [mask], centre, 0.1, 0.07)
    p_t = _softmax((teacher.numpy() - centre.center.double().numpy()) / 0.07)
    ce = -(p_t * np.log(_softmax(student.numpy() / 0.1))).sum(-1)
    expected = np.mean([(ce[0, 0] + ce[0, 2]) / 2, 0.0])  # an image without masked tokens contributes 0
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_ibot_loss_weights_and_both_centres() -> None:
    cls_s, cls_t = _logits(3), _logits(2, seed=1)
    g = torch.Generator().manual_seed(4)
    patch_s = [torch.randn(4, 3, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    patch_t = [torch.randn(4, 3, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    masks = [torch.rand(4, 3, generator=g) > 0.4 for _ in range(2)]
    c1, c2 = TeacherCentre(6, 0.9), TeacherCentre(5, 0.8)
    loss, terms = ibot_loss(cls_s, cls_t, patch_s, patch_t, masks, c1, c2, 0.1, 0.04, 0.07, cls_weight=0.5,
                            patch_weight=2.0)
    cls_ref = _reference([s.numpy() for s in cls_s], [t.numpy() for t in cls_t], np.zeros(6), 0.1, 0.04)
    mim_ref = masked_patch_loss(patch_s, patch_t, masks, TeacherCentre(5), 0.1, 0.07).item()
    assert terms["cls"].item() == pytest.approx(cls_ref, rel=1e-6)
    assert terms["mim"].item() == pytest.approx(mim_ref, rel=1e-9)
    assert loss.item() == pytest.approx(0.5 * cls_ref + 2.0 * mim_ref, rel=1e-6)
    torch.testing.assert_close(c1.center, 0.1 * torch.cat(cls_t).mean(0).float())
    torch.testing.assert_close(c2.center, 0.2 * torch.cat(patch_t).mean((0, 1)).float())
