"""Edges of the losses that the value tests leave open (found by mutation testing, `make mutation`): the smallest
batch each accepts and its exact refusal, the documented defaults, and hand values at the boundaries."""

from __future__ import annotations

import math
import re

import pytest
import torch

from selfsup.losses.barlow import barlow_twins_loss
from selfsup.losses.mae import mae_loss, normalized_patches, patch_mean_std, patchify
from selfsup.losses.mast import mast_loss, masked_distance
from selfsup.losses.msn import msn_loss, prototype_log_probs
from selfsup.losses.multiview import barlow_twins_multiview_loss, vicreg_multiview_loss
from selfsup.losses.vicreg import vicreg_loss

TWO = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 1.0]])
ONE = TWO[:1]


@pytest.mark.parametrize("loss, message", [
    (lambda z: barlow_twins_loss(z, z.flip(1)), r"Barlow Twins needs at least 2 samples in the \(global\) batch"),
    (lambda z: vicreg_loss(z, z.flip(1)), r"VICReg needs at least 2 samples in the \(global\) batch to compute "
                                          r"variances"),
    (lambda z: barlow_twins_multiview_loss([z, z.flip(1), z + 1], 0.005), r"Barlow Twins needs at least 2 samples "
                                                                           r"in the \(global\) batch"),  # M = 3
    (lambda z: vicreg_multiview_loss([z, z.flip(1), z + 1]), r"VICReg needs at least 2 samples in the \(global\) "
                                                             r"batch to compute variances"),
    (lambda z: mast_loss(z, z.abs() + 1, z.flip(1), z.abs() + 1, torch.ones(3, 1), torch.ones(len(z), 1)),
     r"MAST needs at least 2 samples in the \(global\) batch to compute variances"),
])
def test_two_samples_are_enough_one_is_refused_by_name(loss, message: str) -> None:
    value, _ = loss(TWO)
    assert torch.isfinite(value)
    with pytest.raises(ValueError, match=f"^{message}$"):
        loss(ONE)


@pytest.mark.parametrize("loss, name", [(lambda v: vicreg_multiview_loss(v), "multi-view VICReg"),
                                        (lambda v: barlow_twins_multiview_loss(v, 0.005), "multi-view Barlow Twins")])
def test_multiview_refusals_name_the_loss(loss, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} needs at least 2 views per image, got 1;"):
        loss([TWO])
    with pytest.raises(ValueError, match=rf"^{name} needs the M views as \(N, d\) embeddings of one shape"):
        loss([TWO, TWO[:, :2]])


def test_documented_defaults() -> None:
    """VICReg's 25 / 25 / 1 (Bardes et al. §4.2); MSN's tau 0.1, tau+ 0.025, 3 Sinkhorn steps, lambda 1 (App. A)."""
    views = [TWO, TWO.flip(1), TWO + 1]
    torch.testing.assert_close(vicreg_multiview_loss(views)[0], vicreg_multiview_loss(views, 25.0, 25.0, 1.0)[0])
    g = torch.Generator().manual_seed(0)
    anchor, target = torch.randn(6, 5, generator=g), torch.randn(3, 5, generator=g)
    torch.testing.assert_close(msn_loss(anchor, target)[0], msn_loss(anchor, target, 0.1, 0.025, 3, 1.0, 0.0)[0])
    s = torch.tensor([[1.0, 2.0, 4.0]])
    expected = s / 0.5 - torch.log(torch.exp(s / 0.5).sum())  # log softmax(s / tau), no smoothing by default
    torch.testing.assert_close(prototype_log_probs(s, 0.5), expected)


def test_mae_edges_by_hand() -> None:
    with pytest.raises(ValueError, match=r"^image size 4x6 is not divisible by the patch size 4$"):
        patchify(torch.zeros(1, 1, 4, 6), 4)  # height fits, width does not
    target = torch.tensor([[[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 4.0]]])  # two patches
    mean, std = patch_mean_std(target)
    torch.testing.assert_close(mean, torch.tensor([[[3.0], [1.0]]]))
    torch.testing.assert_close(std, torch.tensor([[[math.sqrt(14 / 3 + 1e-6)], [math.sqrt(4 + 1e-6)]]]))  # unbiased
    torch.testing.assert_close(normalized_patches(target, eps=1.0)[0, 1], torch.tensor([-1.0, -1, -1, 3]) / math.sqrt(5))
    prediction = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0]]])
    one_masked = torch.tensor([[False, True]])  # the loss is that one patch's mean squared error
    assert mae_loss(prediction, target, one_masked, norm_pix=False).item() == pytest.approx((0 + 1 + 0 + 9) / 4)
    with pytest.raises(ValueError, match=r"^prediction \(1, 2, 4\), target \(1, 2, 3\) and mask \(1, 2\) must be "
                                         r"\(B, N, P\), \(B, N, P\) and \(B, N\)$"):
        mae_loss(prediction, target[..., :3], one_masked)
    with pytest.raises(ValueError, match=r"and mask \(1, 1\) must be"):
        mae_loss(prediction, target, one_masked[:, :1])


def test_masked_distance_by_hand_over_two_samples() -> None:
    """D_me (Eq. 2): mean over samples of sum_k active_ik ||(z_a - z_b) . m_k||^2."""
    z_a = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    z_b = torch.tensor([[0.0, 1.0], [2.0, 1.0]])
    masks = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    active = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # sample 0: k=0 1, k=1 4 * 1 = 4; sample 1: k=0 4 (k=1 inactive): (5 + 4) / 2
    assert masked_distance(z_a, z_b, masks, active).item() == pytest.approx(4.5)


def test_mast_defaults_are_the_papers_coefficients() -> None:
    """§3.2: lambda 25 d / K, lambda1 600 / (d K), lambda2 25, alpha 25, beta 1."""
    g = torch.Generator().manual_seed(0)
    mu_a, mu_b = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    var_a, var_b = torch.rand(4, 3, generator=g) + 0.5, torch.rand(4, 3, generator=g) + 0.5
    masks, active = torch.rand(3, 2, generator=g), torch.ones(4, 2)
    default, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, active)
    by_hand = (25 * 3 / 2 * terms["distance"] + 600 / 6 * terms["sparsity"] + 25 * terms["kl"]
               + 25 * terms["variance"] + terms["covariance"])
    torch.testing.assert_close(default, by_hand)


def test_mask_init_by_hand() -> None:
    """App. A: column k is exp(-(j - c_k)^2 / (2 w^2)), c_k = (k + 1/2) d / K, w = d / (2K), plus N(0.2, 0.1^2)."""
    from selfsup.losses.mast import init_masks

    d, k = 8, 2
    u = init_masks(d, k, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(d, k, generator=torch.Generator().manual_seed(0))
    expected = torch.empty(d, k)
    for j in range(d):
        for col, centre in enumerate((2.0, 6.0)):  # w = 2
            expected[j, col] = math.exp(-((j - centre) ** 2) / 8) + 0.2 + 0.1 * noise[j, col]
    torch.testing.assert_close(u, expected)
    u = init_masks(12, 2, generator=torch.Generator().manual_seed(1))  # w = 3: 2 w^2 = 18
    noise = torch.randn(12, 2, generator=torch.Generator().manual_seed(1))
    assert u[0, 0].item() == pytest.approx(math.exp(-9 / 18) + 0.2 + 0.1 * noise[0, 0].item(), rel=1e-6)  # c_0 = 3
    assert init_masks(1, 1).shape == (1, 1)
    for args in [(0, 1), (1, 0)]:
        with pytest.raises(ValueError, match=rf"^masks need dim >= 1 and num_masks >= 1, got {args[0]}, {args[1]}$"):
            init_masks(*args)


def test_mast_distance_with_zero_variance_and_the_scale_free_form_by_hand() -> None:
    """Eq. 4 with the 1e-6 guard when both variances are 0; ``scale_free``: each mask over its mean over the d
    dimensions, the variances over half the sum of the two views' mean variance."""
    from selfsup.losses.mast import masked_gaussian_distance

    mu_a, mu_b = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    zero = torch.zeros(1, 2)
    value = masked_gaussian_distance(mu_a, zero, mu_b, zero, torch.tensor([[1.0], [1.0]]), torch.ones(1, 1))
    assert value.item() == pytest.approx(2 * 1.0 / 1e-6, rel=1e-4)  # large and positive, not -2e6
    mu_a = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    mu_b = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    var_a = torch.tensor([[1.0, 2.0], [1.0, 1.0]])  # mean 1.25
    var_b = torch.tensor([[3.0, 1.0], [1.0, 2.0]])  # mean 1.75: scale = 0.5 (1.25 + 1.75) = 1.5
    masks = torch.tensor([[1.0, 0.0], [3.0, 2.0]])  # column means 2 and 1: normalised [[0.5, 0], [1.5, 2]]
    active = torch.ones(2, 2)
    m = [[0.5, 1.5], [0.0, 2.0]]  # m[k][j]
    total = 0.0
    for i in range(2):
        for k in range(2):
            num = sum(2 * (mu_a[i, j] - mu_b[i, j]) ** 2 * m[k][j] ** 2 for j in range(2))
            den = sum((var_a[i, j] + var_b[i, j]) / 1.5 * m[k][j] for j in range(2))
            total += num / (den + 1e-6)
    _, terms = mast_loss(mu_a, var_a, mu_b, var_b, masks, active, scale_free=True)
    assert terms["distance"].item() == pytest.approx(float(total) / 2, rel=1e-5)


def test_extrema_and_msn_defaults_and_refusals() -> None:
    from selfsup.losses.extrema import extrema_loss

    q, t = TWO, TWO.flip(1)
    torch.testing.assert_close(extrema_loss(q, t, "infonce"), extrema_loss(q, t, "infonce", 0.2))  # tau 0.2
    with pytest.raises(ValueError, match="^unknown ExtreMA loss 'mse'; use 'byol' or 'infonce'$"):
        extrema_loss(q, t, "mse")
    with pytest.raises(ValueError, match=r"^msn_loss expects 2-D \(rows, prototypes\) similarities, got shapes "
                                         r"\(2, 3\) and \(1, 2, 3\)$"):
        msn_loss(TWO, TWO[None])


def test_infonce_keys_are_constants_by_default_and_bad_shapes_are_refused() -> None:
    from selfsup.losses.infonce import info_nce_loss

    query = TWO.clone().requires_grad_()
    key = TWO.flip(1).clone().requires_grad_()
    info_nce_loss(query, key, 0.2).backward()  # MoCo v3 / ExtreMA: no gradient into the keys
    assert key.grad is None and query.grad is not None
    cube = torch.zeros(2, 3, 3)  # 3-D, its second dimension equal to d = 3 and its length to B = 2
    for q, k in [(TWO, TWO[None]), (TWO[None], TWO), (TWO, TWO[:, :2]), (TWO[:1], TWO), (TWO, cube),
                 (cube, TWO)]:
        with pytest.raises(ValueError, match=rf"^query must be \(m \* B, d\) for keys \(B, d\); got "
                                             rf"{re.escape(str(tuple(q.shape)))} and {re.escape(str(tuple(k.shape)))}$"):
            info_nce_loss(q, k, 0.2)


def test_msn_accepts_one_target_row_and_refuses_a_zero_temperature() -> None:
    anchor, target = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.3, 0.1]]), torch.tensor([[0.5, 0.1, 0.0]])
    assert torch.isfinite(msn_loss(anchor, target)[0])  # a batch of one image, two anchor views
    with pytest.raises(ValueError, match=r"^temperatures must be positive, got tau=0.0, tau\+=0.025$"):
        msn_loss(anchor, target, anchor_temperature=0.0)


def test_msn_sinkhorn_steps_and_label_smoothing_reach_the_loss() -> None:
    g = torch.Generator().manual_seed(0)
    anchor, target = torch.randn(8, 5, generator=g), torch.randn(4, 5, generator=g)
    values = [msn_loss(anchor, target, sinkhorn_iterations=n)[0].item() for n in (0, 1, 3)]
    assert len({round(v, 6) for v in values}) == 3  # 0, 1 and 3 Sinkhorn steps give three different targets
    smoothed = msn_loss(anchor, target, label_smoothing=0.1)[0].item()
    assert smoothed != pytest.approx(values[2], rel=1e-4)


def test_infonce_negatives_are_cast_to_the_keys_dtype() -> None:
    """A queue kept in float64 beside a float32 batch (or the reverse) is cast to the keys' dtype: the same loss as
    negatives given in the batch's dtype, and no dtype clash in the matrix product."""
    from selfsup.losses.infonce import info_nce_loss

    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    negatives = torch.randn(5, 3, generator=g)
    same = info_nce_loss(query, key, 0.2, negatives=negatives)
    torch.testing.assert_close(info_nce_loss(query, key, 0.2, negatives=negatives.double()), same)
