"""SimCLR's NT-Xent (Chen et al. 2020, Eq. 1) and MoCo v3's ctr(q, k) against transcriptions of the papers.

SimCLR's authors' code is TensorFlow: the reference here is an independent transcription of Eq. 1, written from
the paper with Python loops over i and k in float64, compared with the vectorised :func:`nt_xent_loss` (loss and
gradients). MoCo v3's golden values from the authors' code are in tests/test_golden.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from selfsup.losses.infonce import info_nce_loss, moco_contrastive_loss, nt_xent_loss


def _sim(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sim(u, v) = u^T v / (||u|| ||v||) (Sec. 2.1)."""
    return (u * v).sum() / (u.norm() * v.norm())


def _eq1(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 1 as written: the augmented views are interleaved, z_{2k-1} and z_{2k} the two views of image k;
    l(i, j) = -log exp(sim(z_i, z_j) / tau) / sum_{k=1}^{2N} 1[k != i] exp(sim(z_i, z_k) / tau);
    L = 1 / (2N) sum_{k=1}^{N} [l(2k-1, 2k) + l(2k, 2k-1)]."""
    n = len(z1)
    z = [None] * (2 * n)
    for k in range(n):
        z[2 * k], z[2 * k + 1] = z1[k], z2[k]  # 0-based: 2k-1 -> 2k, 2k -> 2k+1

    def ell(i: int, j: int) -> torch.Tensor:
        denominator = sum(torch.exp(_sim(z[i], z[k]) / tau) for k in range(2 * n) if k != i)
        return -torch.log(torch.exp(_sim(z[i], z[j]) / tau) / denominator)

    return sum(ell(2 * k, 2 * k + 1) + ell(2 * k + 1, 2 * k) for k in range(n)) / (2 * n)


def _pair(n: int = 6, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = z1 + 0.7 * torch.randn(n, d, generator=g, dtype=torch.float64)  # positives closer than the negatives
    return z1 * 3.0, z2 * 0.5  # unnormalised: the loss must normalise


@pytest.mark.parametrize("tau", [0.5, 0.1, 1.0])
def test_nt_xent_equals_a_transcription_of_eq1_loss_and_gradients(tau: float) -> None:
    z1, z2 = _pair()
    a1, a2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    b1, b2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    ours = nt_xent_loss(a1, a2, tau)
    reference = _eq1(b1, b2, tau)
    ours.backward()
    reference.backward()
    assert ours.item() == pytest.approx(reference.item(), rel=1e-12)
    torch.testing.assert_close(a1.grad, b1.grad, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(a2.grad, b2.grad, rtol=1e-10, atol=1e-13)
    assert a1.grad.abs().max() > 1e-3 and a2.grad.abs().max() > 1e-3


def test_nt_xent_by_hand_at_the_extremes() -> None:
    """Orthonormal embeddings, positives equal to their anchors: every anchor sees sim 1 with its positive and 0
    with its 2N - 2 negatives; identical embeddings everywhere: the positive is one of 2N - 1 equal terms."""
    n, tau = 3, 0.5
    eye = torch.eye(n, dtype=torch.float64)
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2 * (n - 1)))
    assert nt_xent_loss(eye, eye, tau).item() == pytest.approx(expected, rel=1e-12)
    same = torch.ones(n, 4, dtype=torch.float64)
    assert nt_xent_loss(same, same, tau).item() == pytest.approx(math.log(2 * n - 1), rel=1e-12)


def test_nt_xent_of_one_image_has_no_negatives_and_is_zero() -> None:
    """N = 1: each view's softmax runs over its one other view (2N - 2 = 0 negatives), whatever the embeddings."""
    z1, z2 = _pair(n=1)
    assert nt_xent_loss(z1, z2, 0.5).item() == pytest.approx(0.0, abs=1e-12)
    assert nt_xent_loss(z1, -z2, 0.1).item() == pytest.approx(0.0, abs=1e-12)


def test_nt_xent_is_symmetric_in_the_views_and_refuses_mismatched_shapes() -> None:
    z1, z2 = _pair()
    torch.testing.assert_close(nt_xent_loss(z1, z2, 0.5), nt_xent_loss(z2, z1, 0.5))
    with pytest.raises(ValueError, match=r"^NT-Xent needs the two views' projections as \(B, d\) each; got \(6, 5\) "
                                         r"and \(6, 4\)$"):
        nt_xent_loss(z1, z2[:, :4], 0.5)


def test_moco_ctr_is_infonce_times_two_tau_against_a_transcription() -> None:
    """ctr(q, k) = -2 tau mean_i log exp(q_i . k_i / tau) / sum_j exp(q_i . k_j / tau) on unit vectors (Alg. 1 and
    the authors' ``contrastive_loss``); keys are constants."""
    q, k = _pair(seed=1)
    tau = 0.2
    qn, kn = q / q.norm(dim=1, keepdim=True), k / k.norm(dim=1, keepdim=True)
    expected = 0.0
    for i in range(len(q)):
        logits = [float(qn[i] @ kn[j]) / tau for j in range(len(k))]
        expected -= logits[i] - math.log(sum(math.exp(x) for x in logits))
    expected *= 2 * tau / len(q)
    query, key = q.clone().requires_grad_(), k.clone().requires_grad_()
    loss = moco_contrastive_loss(query, key, tau)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    assert key.grad is None  # stop-gradient on the keys
    torch.testing.assert_close(loss, 2 * tau * info_nce_loss(q, k, tau))


@pytest.mark.parametrize("process", [0, 1, 2])
def test_nt_xent_on_one_of_three_processes_is_eq1_over_its_own_anchors(process: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Process r of 3 (the all-gather replaced by the global batch, r's rows its own inputs): its loss is the mean of
    Eq. 1's l(i, j) over its own 2B anchors, each against the 2N - 1 other views of the global batch. Three
    processes, because with two a wrong offset of +-2B rows lands on the right rows modulo 2N = 4B."""
    world, b, tau = 3, 2, 0.5
    z1, z2 = _pair(n=world * b, seed=3)
    mine = slice(process * b, (process + 1) * b)

    def gather(x: torch.Tensor) -> torch.Tensor:  # process p's [z1_p; z2_p] at rows p * 2B ...
        blocks = [torch.cat([z1[p * b:(p + 1) * b], z2[p * b:(p + 1) * b]]) for p in range(world)]
        blocks[process] = x
        return torch.cat(blocks)

    monkeypatch.setattr("selfsup.losses.infonce.rank", lambda: process)
    monkeypatch.setattr("selfsup.losses.infonce.gather_with_grad", gather)
    views = torch.stack([z1, z2], dim=1).reshape(2 * world * b, -1)  # Eq. 1's interleaved order: image k at 2k, 2k+1

    def ell(i: int, j: int) -> float:
        denominator = sum(math.exp(float(_sim(views[i], views[k])) / tau) for k in range(len(views)) if k != i)
        return -math.log(math.exp(float(_sim(views[i], views[j])) / tau) / denominator)

    own = [(2 * k, 2 * k + 1) for k in range(process * b, (process + 1) * b)]
    expected = sum(ell(i, j) + ell(j, i) for i, j in own) / (2 * b)
    assert nt_xent_loss(z1[mine], z2[mine], tau).item() == pytest.approx(expected, rel=1e-12)
