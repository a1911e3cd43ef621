"""Training-health monitors: collapse statistics and eigenspectra of embeddings (the online kNN probe is
:mod:`selfsup.eval.monitor`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from selfsup.checkpoint import atomic_write


@torch.no_grad()
def collapse_stats(embeddings: torch.Tensor) -> dict[str, float]:
    """Collapse indicators of a batch of embeddings ``(B, d)``.

    ``embedding_std``: mean per-dimension std of the L2-normalised embeddings, times sqrt(d)
    (SimSiam, Sec. 4.1: ~1 for well-spread embeddings, 0 for complete collapse).
    ``effective_rank``: exp of the entropy of the normalised singular values of the centred
    embeddings (RankMe, Garrido et al. 2023), between 1 and min(B, d).
    """
    z = embeddings.detach().float()
    d = z.shape[1]
    std = F.normalize(z, dim=1).std(dim=0).mean().item() * d ** 0.5
    return {"embedding_std": std, "effective_rank": effective_rank(torch.linalg.svdvals(z - z.mean(dim=0)))}


def effective_rank(singular_values: torch.Tensor) -> float:
    """RankMe (Garrido et al. 2023): exp of the entropy of the normalised singular values."""
    p = singular_values / singular_values.sum().clamp_min(1e-12)
    return float(torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum()))


@torch.no_grad()
def eigenspectrum(embeddings: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of the covariance of a batch of embeddings ``(B, d)``, descending, normalised to sum 1.

    Computed as the squared singular values of the centred batch; the ``min(B - 1, d)`` values a
    batch of B samples can make nonzero. A flat spectrum spreads the information over all
    dimensions; a steep drop is dimensional collapse (Ghosh et al. 2024, Thm 3.2: weak
    orthogonality concentrates the embedding on the top eigenvectors).
    """
    z = embeddings.detach().float()
    eigenvalues = torch.linalg.svdvals(z - z.mean(dim=0)).pow(2)[: min(z.shape[0] - 1, z.shape[1])]
    return eigenvalues / eigenvalues.sum().clamp_min(1e-30)


class SpectrumLog:
    """Eigenspectra of the monitored embeddings during training, in ``spectra.npz``.

    The file holds ``steps`` (K,) and ``eigenvalues`` (K, n), one :func:`eigenspectrum` per
    recorded step. Resuming at step s keeps the spectra of steps <= s, as ``metrics.csv`` does.
    """

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        self.steps: list[int] = []
        self.spectra: list[np.ndarray] = []
        if path.is_file() and resume_step > 0:
            with np.load(path) as saved:
                keep = saved["steps"] <= resume_step
                self.steps = saved["steps"][keep].tolist()
                self.spectra = list(saved["eigenvalues"][keep])

    def append(self, step: int, embeddings: torch.Tensor) -> None:
        self.steps.append(step)
        self.spectra.append(eigenspectrum(embeddings).cpu().numpy())

    def flush(self) -> None:
        if not self.steps:
            return

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, steps=np.array(self.steps), eigenvalues=np.stack(self.spectra))

        atomic_write(self.path, write)

    def plot(self, path: Path, curves: int = 5) -> None:
        """Sorted normalised eigenvalues on a log scale at up to ``curves`` evenly spaced recorded steps."""
        if not self.steps:
            return
        picks = sorted(set(np.linspace(0, len(self.steps) - 1, min(curves, len(self.steps))).round().astype(int)))
        plot_spectra(path, {f"step {self.steps[i]}": self.spectra[i] for i in picks})


def plot_spectra(path: Path, spectra: dict[str, np.ndarray]) -> None:
    """One curve per labelled eigenspectrum: normalised eigenvalue against its rank, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for label, values in spectra.items():
        ax.semilogy(np.arange(1, len(values) + 1), np.where(values > 0, values, np.nan), label=label)
    ax.set_xlabel("eigenvalue rank")
    ax.set_ylabel("normalised eigenvalue")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)

