"""iBOT loss (Zhou et al., ICLR 2022, Sec. 3.2 Eq. 1-2, Algorithm 1): DINO's [CLS] self-distillation plus masked
image modelling with an online tokenizer.

``L = lambda1 L_[CLS] + lambda2 L_MIM``. ``L_[CLS]`` is :func:`selfsup.losses.dino.dino_loss` (the teacher's global
views against the student's other views). ``L_MIM`` is, for each global view, the cross-entropy between the teacher's
centred, sharpened patch distribution of the *unmasked* view and the student's patch distribution of the *masked*
view at the masked positions, ``-sum_i m_i P_t^patch(u_i) log P_s^patch(u_hat_i)``, averaged over an image's masked
tokens (at least 1), then over images and views, as their ``iBOTLoss``. The patch tokens have their own centre and
teacher temperature.

Distribution: per-sample terms only, plus the two centres, all-reduced (tests/losses/test_dino_ddp.py).
"""

from __future__ import annotations

import torch

from selfsup.losses.dino import TeacherCentre, dino_loss, distillation_cross_entropy, teacher_probabilities

__all__ = ["ibot_loss", "masked_patch_loss"]


def masked_patch_loss(student_patch_logits: list[torch.Tensor], teacher_patch_logits: list[torch.Tensor],
                      masks: list[torch.Tensor], centre: TeacherCentre, student_temperature: float,
                      teacher_temperature: float) -> torch.Tensor:
    """``L_MIM`` over the global views: view ``v``'s masked student tokens against view ``v``'s teacher tokens.

    Args:
        student_patch_logits: per global view ``(B, N, K)``, from the masked view.
        teacher_patch_logits: per global view ``(B, N, K)``, from the same view unmasked; no gradient.
        masks: per global view ``(B, N)`` bool, True where the student saw the mask token.
    """
    if not len(student_patch_logits) == len(teacher_patch_logits) == len(masks) >= 1:
        raise ValueError(f"need one student, teacher and mask per global view, got {len(student_patch_logits)}, "
                         f"{len(teacher_patch_logits)} and {len(masks)}")
    total = student_patch_logits[0].new_zeros(())
    for student, teacher, mask in zip(student_patch_logits, teacher_patch_logits, masks):
        if student.shape != teacher.shape or mask.shape != student.shape[:2]:
            raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} patch logits must "
                             f"match, and the mask {tuple(mask.shape)} must be their (B, N)")
        ce = distillation_cross_entropy(teacher_probabilities(teacher, centre, teacher_temperature), student,
                                        student_temperature)
        m = mask.to(ce.dtype)
        total = total + ((ce * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)).mean()
    return total / len(masks)


def ibot_loss(student_cls: list[torch.Tensor], teacher_cls: list[torch.Tensor],
              student_patches: list[torch.Tensor], teacher_patches: list[torch.Tensor], masks: list[torch.Tensor],
              cls_centre: TeacherCentre, patch_centre: TeacherCentre, student_temperature: float = 0.1,
              teacher_temperature: float = 0.04, teacher_patch_temperature: float = 0.07, cls_weight: float = 1.0,
              patch_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``lambda1 L_[CLS] + lambda2 L_MIM``; both centres are used, then updated with this step's teacher outputs.

    ``student_cls``: one ``(B, K)`` per view (global views first, masked; then local ones); ``teacher_cls``,
    ``teacher_patches``, ``student_patches`` and ``masks``: one per global view. Returns the loss and the terms
    ``cls``, ``mim`` (unweighted) and DINO's ``teacher_entropy``.
    """
    cls, terms = dino_loss(student_cls, teacher_cls, cls_centre, student_temperature, teacher_temperature,
                           update_centre=False)
    mim = masked_patch_loss(student_patches, teacher_patches, masks, patch_centre, student_temperature,
                            teacher_patch_temperature)
    cls_centre.update(torch.cat([t.detach() for t in teacher_cls]))
    patch_centre.update(torch.cat([t.detach() for t in teacher_patches]))
    return cls_weight * cls + patch_weight * mim, {"cls": cls.detach(), "mim": mim.detach(),
                                                   "teacher_entropy": terms["teacher_entropy"]}
