"""Plot one logged metric of several runs against epochs and against training wall-clock.

    python benchmarks/plot_runs.py OUT.png RUN_DIR[=LABEL] [RUN_DIR[=LABEL] ...] [--metric knn_top1]
    python benchmarks/plot_runs.py OUT.png RUN_DIR[=LABEL] ... --spectra

Reads each run's ``metrics.csv`` (``epoch``, ``train_time_s`` and the metric) and draws two panels
side by side: the metric per epoch, and per minute of training time (monitors and checkpoints
excluded). Used for the figures of docs/reproductions.md, e.g. the online kNN accuracy of M = 2
and M = 4 views (Ghosh et al. 2024, Fig. 4). Prints one JSON object: the final value of the
metric per run, with its epoch and minute.

``--spectra`` instead draws each run's last recorded embedding eigenspectrum (``spectra.npz``,
normalised eigenvalues by rank, log scale) and prints each run's effective rank there.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import torch

from selfsup.train.monitors import effective_rank, plot_spectra


def read_curve(run_dir: Path, metric: str) -> list[tuple[float, float, float]]:
    """``(epoch, minutes, value)`` for every row of ``metrics.csv`` that logged ``metric``."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise SystemExit(f"{run_dir} has no metrics.csv; pass run directories written by `selfsup pretrain`")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if rows and "train_time_s" not in rows[0]:
        raise SystemExit(f"{path} has no train_time_s column (written by an older selfsup); re-run the pretraining")
    curve = [(float(r["epoch"]), float(r["train_time_s"]) / 60, float(r[metric])) for r in rows if r.get(metric)]
    if not curve:
        raise SystemExit(f"{path} logged no {metric!r}; columns: {', '.join(rows[0]) if rows else 'none'}")
    return curve


def last_spectrum(run_dir: Path) -> np.ndarray:
    """The normalised eigenvalues of the last step recorded in ``spectra.npz``."""
    path = run_dir / "spectra.npz"
    if not path.is_file():
        raise SystemExit(f"{run_dir} has no spectra.npz (set monitor.collapse_every_steps > 0 and re-run)")
    with np.load(path) as saved:
        return saved["eigenvalues"][-1]


def plot_spectra_of_runs(out: Path, runs: list[str]) -> dict[str, float]:
    """Plot the last eigenspectrum of each ``RUN_DIR[=LABEL]``; return each run's effective rank there."""
    spectra = {}
    for spec in runs:
        run, _, label = spec.partition("=")
        spectra[label or Path(run).name] = last_spectrum(Path(run))
    plot_spectra(out, spectra)
    # Singular values of the embeddings are the square roots of their covariance eigenvalues.
    return {label: round(effective_rank(torch.from_numpy(np.sqrt(values))), 2) for label, values in spectra.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    parser.add_argument("--metric", default="knn_top1")
    parser.add_argument("--spectra", action="store_true", help="plot the last eigenspectrum of each run instead")
    args = parser.parse_args()
    if args.spectra:
        print(json.dumps({"effective_rank": plot_spectra_of_runs(args.out, args.runs)}))
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    finals = {}
    for spec in args.runs:
        run, _, label = spec.partition("=")
        curve = read_curve(Path(run), args.metric)
        epochs, minutes, values = zip(*curve)
        label = label or Path(run).name
        by_epoch.plot(epochs, values, marker="o", ms=3, label=label)
        by_time.plot(minutes, values, marker="o", ms=3, label=label)
        finals[label] = {"epoch": epochs[-1], "minutes": round(minutes[-1], 2), args.metric: values[-1]}
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("training time (min)")
    by_epoch.set_ylabel(args.metric)
    for ax in (by_epoch, by_time):
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    print(json.dumps(finals))


if __name__ == "__main__":
    main()
