"""BYOL regression loss (Grill et al., NeurIPS 2020, Eq. 2): ``2 - 2 cos(q, z')`` with a stop-gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selfsup.losses.byol import byol_loss


def test_parallel_vectors_give_zero() -> None:
    t = torch.tensor([[1.0, 2.0, -3.0], [0.5, 0.0, 4.0]])
    assert byol_loss(3.0 * t, t).item() == pytest.approx(0.0, abs=1e-6)


def test_opposite_vectors_give_four() -> None:
    t = torch.tensor([[1.0, 2.0, -3.0], [0.5, 0.0, 4.0]])
    assert byol_loss(-0.1 * t, t).item() == pytest.approx(4.0, abs=1e-6)


def test_orthogonal_vectors_give_two() -> None:
    assert byol_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 5.0]])).item() == pytest.approx(2.0)


def test_matches_normalised_mse_and_is_batch_mean() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.randn(5, 4, generator=g, dtype=torch.float64)
    t = torch.randn(5, 4, generator=g, dtype=torch.float64)
    pn, tn = p.numpy(), t.numpy()
    per_sample = []
    for i in range(5):
        a = pn[i] / np.sqrt(np.sum(pn[i] ** 2))
        b = tn[i] / np.sqrt(np.sum(tn[i] ** 2))
        per_sample.append(np.sum((a - b) ** 2))  # ||q/|q| - z/|z|||^2 = 2 - 2 cos
    assert byol_loss(p, t).item() == pytest.approx(np.mean(per_sample), rel=1e-12)


def test_gradient_flows_to_prediction_only() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    byol_loss(p, t).backward()
    assert t.grad is None
    # d/dp (2 - 2 cos) / B = -2/B * (t / (|p||t|) - cos * p / |p|^2)
    pd, td = p.detach(), t.detach()
    pnorm, tnorm = pd.norm(dim=1, keepdim=True), td.norm(dim=1, keepdim=True)
    cos = (pd * td).sum(dim=1, keepdim=True) / (pnorm * tnorm)
    expected = -2 / 3 * (td / (pnorm * tnorm) - cos * pd / pnorm**2)
    torch.testing.assert_close(p.grad, expected, rtol=1e-10, atol=1e-12)
