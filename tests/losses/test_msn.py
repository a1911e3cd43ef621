"""MSN loss (Assran et al. 2022, Eq. 1): ME-MAX values, sharpening, Sinkhorn, cross-entropy, Prop. 1."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_ddp
from selfsup.losses.msn import me_max, msn_loss, prototype_log_probs, sinkhorn_knopp
from selfsup.models.heads import Prototypes

K = 16


def _similarities(rows: int, k: int = K, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(rows, k, generator=g, dtype=torch.float64) * 2 - 1  # cosines in [-1, 1]


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.log()).sum(dim=-1)


# ---------------------------------------------------------------------------------------------- ME-MAX


def test_me_max_is_zero_for_uniform_and_log_k_for_collapsed_mean_prediction() -> None:
    k = 1024
    uniform = torch.full((k,), 1.0 / k, dtype=torch.float64)
    assert me_max(uniform).item() == pytest.approx(0.0, abs=1e-12)
    assert _entropy(uniform).item() == pytest.approx(6.931471805599453, abs=1e-12)  # H = log 1024
    collapsed = torch.zeros(k, dtype=torch.float64)
    collapsed[3] = 1.0
    assert me_max(collapsed).item() == pytest.approx(math.log(k), abs=1e-12)  # H(p_bar) = 0, no NaN
    two = torch.zeros(k, dtype=torch.float64)
    two[[1, 7]] = 0.5
    assert me_max(two).item() == pytest.approx(math.log(k) - math.log(2), abs=1e-12)


def test_me_max_gradient_vanishes_at_uniform_and_pushes_away_from_collapse() -> None:
    # Parametrise p_bar by logits so the simplex constraint is respected.
    flat = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    me_max(flat.softmax(0)).backward()
    assert flat.grad.abs().max().item() < 1e-12
    peaked = torch.zeros(K, dtype=torch.float64)
    peaked[0] = 3.0
    peaked.requires_grad_()
    me_max(peaked.softmax(0)).backward()
    assert peaked.grad[0] > 0  # gradient descent lowers the dominant prototype's share
    assert torch.isfinite(peaked.grad).all()
    one_hot = torch.zeros(K, dtype=torch.float64)
    one_hot[0] = 1.0
    one_hot.requires_grad_()
    me_max(one_hot).backward()
    assert torch.isfinite(one_hot.grad).all()  # zero entries give no NaN


# ------------------------------------------------------------------------------------------ sharpening


def test_targets_are_the_code_sharpening_of_the_tau_softmax() -> None:
    # Zero anchor loss weight, so the CE gradient w.r.t. the anchor logits is softmax(a / tau) - targets.
    s_target = _similarities(6, seed=1)
    s_anchor = _similarities(6, seed=2).requires_grad_()
    loss, _ = msn_loss(s_anchor, s_target, 0.1, 0.025, sinkhorn_iterations=0, memax_weight=0.0)
    loss.backward()
    targets = F.softmax(s_anchor.detach() / 0.1, dim=1) - s_anchor.grad * 6 * 0.1
    p = F.softmax(s_target / 0.1, dim=1)
    sharpened = p**4 / (p**4).sum(dim=1, keepdim=True)  # code: sharpen(p, T=0.25)
    torch.testing.assert_close(targets, sharpened, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(targets, F.softmax(s_target / 0.025, dim=1), rtol=1e-9, atol=1e-12)
    assert torch.equal(sharpened.argmax(1), p.argmax(1)) and (_entropy(sharpened) < _entropy(p)).all()


def test_label_smoothing_mixes_prototype_labels_like_the_authors_code() -> None:
    sims, s = _similarities(5), 0.1
    labels = torch.full((K, K), s / K, dtype=torch.float64) + (1 - s) * torch.eye(K, dtype=torch.float64)
    expected = F.softmax(sims / 0.1, dim=1) @ labels  # code: softmax(.) @ one_hot(K, smoothing)
    torch.testing.assert_close(prototype_log_probs(sims, 0.1, s).exp(), expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(prototype_log_probs(sims, 0.1, 0.0), F.log_softmax(sims / 0.1, dim=1))



def test_label_smoothing_enters_both_the_anchor_and_the_target_probabilities() -> None:
    """The whole loss with smoothing against a from-scratch transcription of the authors' ``msn`` loss (no
    Sinkhorn): ``probs = softmax(sim / tau) @ one_hot(K, s)`` for anchors and targets, targets sharpened with
    ``T = tau+ / tau``, cross-entropy, then ME-MAX ``sum(p_bar log p_bar) + log K``."""
    s, tau, tau_plus, views = 0.2, 0.1, 0.025, 3
    targets_sim, anchors_sim = _similarities(6, seed=1), _similarities(6 * views, seed=2)
    labels = torch.full((K, K), s / K, dtype=torch.float64) + (1 - s) * torch.eye(K, dtype=torch.float64)
    probs = F.softmax(anchors_sim / tau, dim=1) @ labels
    target = (F.softmax(targets_sim / tau, dim=1) @ labels) ** (tau / tau_plus)
    target = target / target.sum(dim=1, keepdim=True)
    ce = -(target.repeat(views, 1) * probs.log()).sum(dim=1).mean()
    mean = probs.mean(dim=0)
    expected = ce + 1.5 * ((mean * mean.log()).sum() + math.log(K))
    loss, terms = msn_loss(anchors_sim, targets_sim, tau, tau_plus, sinkhorn_iterations=0, memax_weight=1.5,
                           label_smoothing=s)
    torch.testing.assert_close(terms["ce"], ce, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)

# ----------------------------------------------------------------------------------------- Sinkhorn


def test_sinkhorn_rows_sum_to_one_and_columns_approach_b_over_k() -> None:
    b = 32
    probs = F.softmax(_similarities(b) / 0.1, dim=1)
    original = probs.clone()
    errors = []
    for iterations in (1, 3, 10, 50):
        q = sinkhorn_knopp(probs, iterations)
        torch.testing.assert_close(q.sum(dim=1), torch.ones(b, dtype=torch.float64), rtol=0, atol=1e-12)
        errors.append((q.sum(dim=0) - b / K).abs().max().item())
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-5 and errors[0] > 0.1
    assert torch.equal(probs, original)  # the caller's tensor is left alone


def test_sinkhorn_ignores_row_scaling_keeps_uniform_and_has_no_gradient() -> None:
    probs = F.softmax(_similarities(8) / 0.1, dim=1)
    scaled = probs * torch.linspace(0.5, 4.0, 8, dtype=torch.float64)[:, None]
    # Per-sample scales are absorbed at Sinkhorn's fixed point (not after 3 iterations).
    torch.testing.assert_close(sinkhorn_knopp(scaled, 200), sinkhorn_knopp(probs, 200), rtol=1e-10, atol=1e-14)
    uniform = torch.full((8, K), 1.0 / K, dtype=torch.float64)
    torch.testing.assert_close(sinkhorn_knopp(uniform), uniform)
    leaf = probs.clone().requires_grad_()
    assert not sinkhorn_knopp(leaf).requires_grad
    # A prototype that no sample reaches keeps zero mass instead of 0 / 0.
    empty = probs.clone()
    empty[:, 0] = 0.0
    out = sinkhorn_knopp(empty)
    assert torch.isfinite(out).all() and out[:, 0].abs().max() == 0


# ------------------------------------------------------------------------------------ cross-entropy


def test_loss_is_cross_entropy_plus_weighted_me_max_over_view_major_anchors() -> None:
    b, m, lam = 4, 3, 2.5
    anchor, target = _similarities(m * b, seed=3), _similarities(b, seed=4)
    loss, terms = msn_loss(anchor, target, 0.1, 0.025, sinkhorn_iterations=3, memax_weight=lam)
    t = sinkhorn_knopp(F.softmax(target / 0.025, dim=1), 3)
    log_p = F.log_softmax(anchor / 0.1, dim=1)
    ce = torch.stack([-(t[i] * log_p[v * b + i]).sum() for v in range(m) for i in range(b)]).mean()
    p_bar = log_p.exp().mean(0)
    torch.testing.assert_close(terms["ce"], ce)
    torch.testing.assert_close(terms["me_max"], math.log(K) + (p_bar * p_bar.log()).sum())
    torch.testing.assert_close(terms["mean_entropy"], _entropy(p_bar))
    torch.testing.assert_close(loss, ce + lam * terms["me_max"])
    assert terms["prototypes_used"].item() == t.argmax(1).unique().numel()


def test_cross_entropy_is_entropy_when_anchor_equals_target_without_sharpening() -> None:
    sims = _similarities(6)
    _, terms = msn_loss(sims, sims, 0.1, 0.1, sinkhorn_iterations=0, memax_weight=0.0)
    p = F.softmax(sims / 0.1, dim=1)
    torch.testing.assert_close(terms["ce"], _entropy(p).mean())
    # Gibbs: H(p+, p) >= H(p+), equality only at p = p+.
    other = _similarities(6, seed=9)
    _, terms_other = msn_loss(other, sims, 0.1, 0.1, sinkhorn_iterations=0, memax_weight=0.0)
    assert terms_other["ce"] > terms["ce"]


def test_no_gradient_reaches_the_target_similarities() -> None:
    anchor, target = _similarities(8).requires_grad_(), _similarities(4).requires_grad_()
    loss, _ = msn_loss(anchor, target)
    loss.backward()
    assert target.grad is None and anchor.grad.abs().sum() > 0


def test_collapsed_representations_still_get_a_prototype_gradient() -> None:
    """Prop. 1 (App. B): with sharpening, identical representations give p != p+, so a non-zero gradient."""
    z = torch.randn(1, 8, dtype=torch.float64).expand(12, 8)
    protos = torch.randn(K, 8, dtype=torch.float64, requires_grad=True)
    sims = F.normalize(z, dim=1) @ F.normalize(protos, dim=1).t()
    loss, _ = msn_loss(sims, sims[:4].detach(), sinkhorn_iterations=0, memax_weight=1.0)
    loss.backward()
    assert protos.grad.norm() > 1e-3


def test_bad_shapes_and_temperatures_raise() -> None:
    with pytest.raises(ValueError, match="view-major"):
        msn_loss(_similarities(7), _similarities(3))
    with pytest.raises(ValueError, match="same K"):
        msn_loss(_similarities(6, k=8), _similarities(3, k=9))
    with pytest.raises(ValueError, match="temperatures"):
        msn_loss(_similarities(6), _similarities(3), target_temperature=0.0)


# ------------------------------------------------------------------------------------ distributed

WORLD, BATCH, VIEWS, IN_DIM, DIM = 2, 8, 2, 6, 5


class _Head(nn.Module):
    """A linear projection and prototypes: anchor similarities with gradient, target ones without."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(IN_DIM, DIM)
        self.prototypes = Prototypes(K, DIM)

    def forward(self, anchors: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            target_similarities = self.prototypes(self.linear(targets))
        return self.prototypes(self.linear(anchors)), target_similarities


def _msn(anchor_similarities: torch.Tensor, target_similarities: torch.Tensor):
    return msn_loss(anchor_similarities, target_similarities, 0.1, 0.025, sinkhorn_iterations=3, memax_weight=1.5,
                    label_smoothing=0.05)


def _ddp_inputs():
    g = torch.Generator().manual_seed(0)
    x_target = torch.randn(BATCH, IN_DIM, generator=g, dtype=torch.float64)
    x_anchor = x_target + 0.5 * torch.randn(VIEWS, BATCH, IN_DIM, generator=g, dtype=torch.float64)  # (M, B, in)
    torch.manual_seed(0)
    head = _Head().double()
    return x_anchor, x_target, {k: v.clone() for k, v in head.state_dict().items()}


def _msn_on_rank(rank: int, world: int, x_anchor, x_target, state) -> dict:
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    probs = F.softmax(x_target[local] @ x_target[local].new_ones(IN_DIM, K).cumsum(1) / 10, dim=1)
    head = _Head().double()
    head.load_state_dict(state)
    ddp = DistributedDataParallel(head)
    anchors = x_anchor[:, local].reshape(-1, IN_DIM)  # view-major rows of this rank's images
    loss, terms = _msn(*ddp(anchors, x_target[local]))
    loss.backward()
    return {"sinkhorn": sinkhorn_knopp(probs), "loss": loss.detach(), "terms": terms,
            "grads": {n: p.grad.clone() for n, p in head.named_parameters()}}


@pytest.mark.multiprocess
def test_msn_loss_in_two_gloo_processes_matches_one_process_on_the_whole_batch() -> None:
    x_anchor, x_target, state = _ddp_inputs()
    results = run_ddp(_msn_on_rank, WORLD, x_anchor, x_target, state)

    head = _Head().double()
    head.load_state_dict(state)
    loss, terms = _msn(*head(x_anchor.reshape(-1, IN_DIM), x_target))
    loss.backward()
    probs = F.softmax(x_target @ x_target.new_ones(IN_DIM, K).cumsum(1) / 10, dim=1)
    sinkhorn = sinkhorn_knopp(probs)
    assert head.prototypes.weight.grad.abs().max() > 1e-3 and terms["me_max"] > 1e-2  # non-trivial comparison

    for rank, res in enumerate(results):
        local = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        torch.testing.assert_close(res["sinkhorn"], sinkhorn[local], rtol=1e-10, atol=1e-14)  # global column sums
        for key in ("me_max", "mean_entropy", "prototypes_used"):  # p_bar and argmax over the global batch
            torch.testing.assert_close(res["terms"][key], terms[key], rtol=1e-10, atol=1e-12)
        for name, p in head.named_parameters():  # DDP-averaged gradients == full-batch gradients
            torch.testing.assert_close(res["grads"][name], p.grad, rtol=1e-9, atol=1e-12, msg=f"rank {rank} {name}")
    # The cross-entropy is per sample: the ranks' losses average to the full-batch loss.
    mean_loss = sum(r["loss"] for r in results) / WORLD
    assert mean_loss.item() == pytest.approx(loss.item(), rel=1e-12)
