"""The methods' own pictures, drawn into a run's ``plots/`` when it ends (beside the metrics' curves): MAST's learned
masks and per-augmentation uncertainty, MAE's reconstructions. Looked up by the method's name in :data:`FIGURES`,
so the method files hold only the methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from selfsup.losses.mae import patch_mean_std, unpatchify

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from selfsup.methods.mae import MAE
    from selfsup.methods.mast import MAST


def mast_figures(mast: MAST, out_dir: Path, rows: list[dict[str, Any]], samples: torch.Tensor | None) -> None:
    """The learned K x d mask heat-map (the paper's Fig. 3a) and each augmentation's uncertainty over training."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _save(mask_figure(*mask_rows(mast.masks, mast.cfg.ops)), out_dir / "mast_masks.png")
    _save(uncertainty_figure(uncertainty_series(rows, mast.cfg.ops)), out_dir / "mast_uncertainty.png")


# The pictures: what each shows is computed by a pure function (mask_rows, uncertainty_series); the figures draw it.
# Lines marked ``# pragma: no mutate`` are cosmetic only (size, dpi, colour map, axis labels, grid, font size).


def mask_rows(masks: torch.Tensor, ops: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """The mask heat-map's data: the K x d matrix whose row k is op k's mask ``M[:, k]`` (``masks`` is d x K, of any
    float dtype: bf16 under ``precision: bf16-true``, which numpy cannot hold), and the row labels, the ops in the
    masks' order."""
    return masks.detach().float().cpu().t().numpy(), list(ops)


def uncertainty_series(rows: list[dict[str, Any]], ops: Sequence[str]) -> dict[str, tuple[tuple, tuple]]:
    """Each op's logged ``uncertainty_<op>`` over training as (steps, values), skipping the rows where it is missing,
    empty (not logged at that step, e.g. no pair drew the op) or not finite; ops with no such row are left out."""
    series = {}
    for op in ops:
        key = f"uncertainty_{op}"
        points = [(int(r["step"]), float(r[key])) for r in rows
                  if r.get(key) not in (None, "") and math.isfinite(float(r[key]))]
        if points:
            series[op] = tuple(zip(*points))
    return series


def mask_figure(matrix: np.ndarray, labels: Sequence[str]) -> Figure:
    """The K x d ``matrix`` as a heat-map, one row per label, with a colour bar of the mask values."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 0.4 * len(labels) + 1.2))  # pragma: no mutate
    ax = fig.subplots()
    image = ax.imshow(matrix)
    image.set(cmap="viridis", interpolation="nearest")  # pragma: no mutate
    ax.set_aspect("auto")  # pragma: no mutate
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("embedding dimension")  # pragma: no mutate
    bar = fig.colorbar(image)
    bar.set_label("mask value")  # pragma: no mutate
    fig.tight_layout()
    return fig


def uncertainty_figure(series: dict[str, tuple[tuple, tuple]]) -> Figure:
    """One curve per op of ``series`` (op -> (steps, values)), labelled with the op."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))  # pragma: no mutate
    ax = fig.subplots()
    for op, (steps, values) in series.items():
        ax.plot(steps, values, label=op)
    ax.set_xlabel("step")  # pragma: no mutate
    ax.set_ylabel("mean tr(Sigma) of pairs that drew the op")  # pragma: no mutate
    if series:  # a run of 0 steps logged nothing
        ax.legend(fontsize=8)  # pragma: no mutate
    ax.grid(alpha=0.3)  # pragma: no mutate
    fig.tight_layout()
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=110)  # pragma: no mutate


@torch.no_grad()
def mae_figures(mae: MAE, out_dir: Path, rows: list[dict[str, Any]], samples: torch.Tensor | None) -> None:
    """``mae_reconstruction.png``: original / masked / reconstruction of a few evaluation images (MAE Fig. 2).

    With normalised-pixel targets the prediction is mapped back with each patch's true mean and std, as the
    authors' visualisation does; visible patches are pasted from the original."""
    if samples is None or not len(samples):
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    was_training = mae.training
    mae.eval()
    x = samples.to(next(mae.parameters()).device)
    torch.manual_seed(0)
    prediction, target, masked = mae.reconstruct(x)
    mae.train(was_training)
    if mae.cfg.norm_pix_loss:
        mean, std = patch_mean_std(target)
        prediction = prediction * std + mean
    hidden = masked.unsqueeze(-1)
    p, c, grid = mae.encoder.patch_size, x.shape[1], mae.decoder.grid
    low, high = float(x.amin()), float(x.amax())
    shown = [x, unpatchify(target.masked_fill(hidden, (low + high) / 2), p, c, grid),  # masked patches grey
             unpatchify(torch.where(hidden, prediction, target), p, c, grid).clamp(low, high)]
    fig, axes = plt.subplots(3, len(x), figsize=(1.3 * len(x), 4.2), squeeze=False)
    for row, (images, title) in enumerate(zip(shown, ("original", f"masked {mae.cfg.mask_ratio:.0%}",
                                                       "reconstruction"))):
        for col in range(len(x)):
            image = images[col].float().cpu().permute(1, 2, 0).numpy()
            ax = axes[row][col]
            ax.imshow(image[..., 0] if c == 1 else (image - low) / (high - low), cmap="gray", vmin=low, vmax=high)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row][0].set_ylabel(title, fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "mae_reconstruction.png", dpi=110)
    plt.close(fig)


# A method's figures: (the method, plots/, the metrics rows, a few normalised evaluation images or None) -> files.
MethodFigures = Callable[[Any, Path, list[dict[str, Any]], "torch.Tensor | None"], None]
FIGURES: dict[str, MethodFigures] = {"mast": mast_figures, "mae": mae_figures}


def has_figures(method: str) -> bool:
    """Whether the method named ``method`` (``method.name``) draws pictures of its own (then a run samples images
    of the evaluation split for them)."""
    return method in FIGURES


def draw_method_figures(method: str, module: nn.Module, out_dir: Path, rows: list[dict[str, Any]],
                        samples: torch.Tensor | None = None) -> None:
    """The pictures of the method named ``method`` (``module``, the trained method, unwrapped), into ``out_dir``,
    from the metrics ``rows`` and ``samples``; nothing for a method without any."""
    figures = FIGURES.get(method)
    if figures is not None:
        figures(module, out_dir, rows, samples)


__all__ = ["FIGURES", "draw_method_figures", "has_figures", "mae_figures", "mask_figure", "mask_rows",
           "mast_figures", "uncertainty_figure", "uncertainty_series"]
