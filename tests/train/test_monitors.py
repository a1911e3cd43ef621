"""Collapse statistics: SimSiam's normalised std and the RankMe effective rank."""

from __future__ import annotations

import math

import pytest
import torch

from selfsup.train.monitors import collapse_stats


def test_collapsed_batch() -> None:
    z = torch.randn(1, 16).expand(32, 16).clone()  # every row equal
    stats = collapse_stats(z)
    assert stats["embedding_std"] == pytest.approx(0.0, abs=1e-6)
    assert stats["effective_rank"] == pytest.approx(1.0, abs=1e-4)


def test_dimensional_collapse_to_a_line() -> None:
    # Rows are positive multiples of one direction: normalised rows are identical (std 0) and the
    # centred batch has rank 1 (effective rank 1), though the raw embeddings are not constant.
    u = torch.randn(16, dtype=torch.float64)
    z = torch.rand(64, 1, dtype=torch.float64).add(0.5) * u
    stats = collapse_stats(z)
    assert stats["embedding_std"] == pytest.approx(0.0, abs=1e-5)
    assert stats["effective_rank"] == pytest.approx(1.0, abs=1e-4)


def test_isotropic_gaussian_batch() -> None:
    g = torch.Generator().manual_seed(0)
    d = 16
    z = torch.randn(4096, d, generator=g)
    stats = collapse_stats(z)
    assert stats["embedding_std"] == pytest.approx(1.0, abs=0.05)
    assert d - 1.0 < stats["effective_rank"] <= d


def test_rank_of_a_k_dimensional_subspace() -> None:
    # Equal singular values on k directions -> entropy log k -> effective rank exactly k.
    k, d = 4, 12
    basis = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))[0][:, :k]
    h = torch.tensor([[1.0, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64)
    z = torch.cat([h, -h]) @ basis.T  # zero-mean, orthogonal columns with equal norms
    stats = collapse_stats(z)
    assert stats["effective_rank"] == pytest.approx(k, rel=1e-4)
    # Unequal singular values give fewer effective dimensions than the rank.
    z2 = torch.cat([h, -h]) @ torch.diag(torch.tensor([10.0, 1, 1, 1], dtype=torch.float64)) @ basis.T
    assert 1 < collapse_stats(z2)["effective_rank"] < k - 0.5
    p = torch.tensor([10.0, 1, 1, 1]) / 13
    assert collapse_stats(z2)["effective_rank"] == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=1e-4)
