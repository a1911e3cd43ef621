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


# Edges found by mutation testing (issue 51's new losses): refusals by their exact message, the documented defaults,
# boundaries by hand.


def test_centre_momentum_accepts_0_and_1_and_refuses_outside_by_message() -> None:
    """m = 1 keeps the centre where it is (a frozen centre), m = 0 replaces it by the batch mean; outside [0, 1]
    the EMA would diverge or flip sign: refused."""
    logits = torch.tensor([[1.0, 2.0, 6.0], [3.0, 0.0, 0.0]])
    frozen, replaced = TeacherCentre(3, momentum=1.0), TeacherCentre(3, momentum=0.0)
    frozen.center.fill_(0.5)
    frozen.update(logits)
    replaced.update(logits)
    torch.testing.assert_close(frozen.center, torch.full((3,), 0.5))
    torch.testing.assert_close(replaced.center, torch.tensor([2.0, 1.0, 3.0]))
    for momentum in (1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^the centre momentum must lie in \[0, 1\], got {momentum}$"):
            TeacherCentre(3, momentum=momentum)


def test_centring_keeps_the_teacher_logits_dtype() -> None:
    """The float32 centre is cast to the logits' dtype: bfloat16 logits (precision bf16) stay bfloat16."""
    centre = TeacherCentre(3)
    centre.center.copy_(torch.tensor([0.5, -1.0, 2.0]))
    logits = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.bfloat16)
    centred = centre.centred(logits)
    assert centred.dtype == torch.bfloat16
    torch.testing.assert_close(centred, torch.tensor([[0.5, 3.0, 2.0]], dtype=torch.bfloat16))


def test_dino_refusals_name_the_problem() -> None:
    two = _logits(2)
    for teacher, student, counts in (([], two, "0 and 2"), (two[:1], two[:1], "1 and 1")):
        with pytest.raises(ValueError, match=f"^DINO needs at least one teacher view and two student views, got "
                                             f"{counts}$"):
            dino_loss(student, teacher, TeacherCentre(6))
    for ts, tt in ((0.0, 0.04), (0.1, 0.0)):
        with pytest.raises(ValueError, match=rf"^temperatures must be positive, got tau_s={ts}, tau_t={tt}$"):
            dino_loss(two, two, TeacherCentre(6), student_temperature=ts, teacher_temperature=tt)


def test_kl_term_is_the_cross_entropy_minus_the_teacher_entropy_by_hand() -> None:
    """Uniform student (zeros) against a teacher sharpened to one-hot: H(P_t, P_s) = log 4, the teacher's entropy 0,
    so kl = log 4; against a uniform teacher (centred to zero) both are log 4 and kl = 0."""
    student = [torch.zeros(5, 4, dtype=torch.float64)] * 2
    one_hot = [torch.tensor([[3.0, 0.0, 0.0, 0.0]]).repeat(5, 1).double()]
    loss, terms = dino_loss(student, one_hot, TeacherCentre(4), teacher_temperature=0.001)
    assert loss.item() == pytest.approx(math.log(4), rel=1e-9)
    assert terms["teacher_entropy"].item() == pytest.approx(0.0, abs=1e-9)
    assert terms["kl"].item() == pytest.approx(math.log(4), rel=1e-9)
    uniform = [torch.zeros(5, 4, dtype=torch.float64)]
    _, terms = dino_loss(student, uniform, TeacherCentre(4))
    assert terms["kl"].item() == pytest.approx(0.0, abs=1e-9)


def test_masked_patch_loss_divides_by_the_masked_count_even_for_one_token() -> None:
    """An image with one masked token: that token's cross-entropy itself (divisor 1), beside an image with three."""
    g = torch.Generator().manual_seed(7)
    student = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    teacher = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    mask = torch.tensor([[False, True, False, False], [True, True, False, True]])
    loss = masked_patch_loss([student], [teacher], [mask], TeacherCentre(3), 0.1, 0.07)
    ce = -(_softmax(teacher.numpy() / 0.07) * np.log(_softmax(student.numpy() / 0.1))).sum(-1)
    expected = (ce[0, 1] + (ce[1, 0] + ce[1, 1] + ce[1, 3]) / 3) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def test_masked_patch_loss_refusals_name_the_shapes() -> None:
    x, mask = torch.zeros(2, 4, 3), torch.zeros(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^need one student, teacher and mask per global view, got 2, 1 and 2$"):
        masked_patch_loss([x, x], [x], [mask, mask], TeacherCentre(3), 0.1, 0.07)
    with pytest.raises(ValueError, match=r"^need one student, teacher and mask per global view, got 0, 0 and 0$"):
        masked_patch_loss([], [], [], TeacherCentre(3), 0.1, 0.07)
    for teacher, m in ((torch.zeros(2, 4, 5), mask), (x, mask[:, :3])):  # each condition alone
        with pytest.raises(ValueError, match=rf"^student \(2, 4, 3\) and teacher \({', '.join(map(str, teacher.shape))}"
                                             rf"\) patch logits must match, and the mask "
                                             rf"\({', '.join(map(str, m.shape))}\) must be their \(B, N\)$"):
            masked_patch_loss([x], [teacher], [m], TeacherCentre(3), 0.1, 0.07)


def test_ibot_loss_documented_defaults_and_logged_terms() -> None:
    """tau_s 0.1, tau_t 0.04, tau_t' 0.07, lambda1 = lambda2 = 1 (the signature's defaults); the logged terms are
    the unweighted cls and mim and DINO's teacher entropy."""
    cls_s, cls_t = _logits(3), _logits(2, seed=1)
    g = torch.Generator().manual_seed(4)
    patch_s = [torch.randn(4, 3, 6, generator=g, dtype=torch.float64) for _ in range(2)]
    patch_t = [torch.randn(4, 3, 6, generator=g, dtype=torch.float64) for _ in range(2)]
    masks = [torch.rand(4, 3, generator=g) > 0.4 for _ in range(2)]
    default, terms = ibot_loss(cls_s, cls_t, patch_s, patch_t, masks, TeacherCentre(6), TeacherCentre(6))
    explicit, _ = ibot_loss(cls_s, cls_t, patch_s, patch_t, masks, TeacherCentre(6), TeacherCentre(6), 0.1, 0.04,
                            0.07, 1.0, 1.0)
    assert default.item() == pytest.approx(explicit.item(), rel=1e-12)
    _, dino_terms = dino_loss(cls_s, cls_t, TeacherCentre(6), 0.1, 0.04)
    assert set(terms) == {"cls", "mim", "teacher_entropy"}
    assert terms["teacher_entropy"].item() == pytest.approx(dino_terms["teacher_entropy"].item(), rel=1e-12)
