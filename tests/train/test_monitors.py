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


def test_eigenspectrum_hand_values() -> None:
    from selfsup.train.monitors import eigenspectrum

    # Centred rows with covariance proportional to diag(2, 8): normalised eigenvalues 0.8, 0.2, descending.
    z = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -2.0]])
    torch.testing.assert_close(eigenspectrum(z + 5.0), torch.tensor([0.8, 0.2]))
    # B samples make at most B - 1 nonzero eigenvalues; a collapsed batch puts everything on one.
    wide = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    spectrum = eigenspectrum(wide)
    assert spectrum.shape == (3,) and spectrum.sum().item() == pytest.approx(1.0)
    assert (spectrum[:-1] >= spectrum[1:]).all()
    line = torch.arange(6.0)[:, None] * torch.tensor([[1.0, 2.0, -1.0]])
    assert eigenspectrum(line)[0].item() == pytest.approx(1.0, abs=1e-6)


def test_spectrum_log_saves_resumes_and_plots(tmp_path) -> None:
    import numpy as np

    from selfsup.train.monitors import SpectrumLog, eigenspectrum

    g = torch.Generator().manual_seed(0)
    batches = {step: torch.randn(8, 5, generator=g) for step in (10, 20, 30)}
    log = SpectrumLog(tmp_path / "spectra.npz", resume_step=0)
    for step, z in batches.items():
        log.append(step, z)
    log.flush()
    with np.load(tmp_path / "spectra.npz") as saved:
        assert saved["steps"].tolist() == [10, 20, 30]
        np.testing.assert_allclose(saved["eigenvalues"][1], eigenspectrum(batches[20]).numpy())
    resumed = SpectrumLog(tmp_path / "spectra.npz", resume_step=20)  # steps after the checkpoint are dropped
    assert resumed.steps == [10, 20] and len(resumed.spectra) == 2
    resumed.plot(tmp_path / "plots" / "eigenspectrum.png")
    assert (tmp_path / "plots" / "eigenspectrum.png").stat().st_size > 1000
    assert SpectrumLog(tmp_path / "spectra.npz", resume_step=0).steps == []  # a fresh run starts empty
