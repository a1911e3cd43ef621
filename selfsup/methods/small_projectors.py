"""Small projectors with a p-dependent orthogonality weight (Ghosh et al., NeurIPS 2024, §3.3, §4.1, App. D).

The paper's projector is ``Linear(D -> p, bias=False) - BatchNorm - ReLU - Linear(p -> p)``
(hidden width = output width p; 2048 p + p^2 weights on a ResNet-50, Table D.1), and the weight
beta of the orthogonality term must grow as p shrinks (optimal beta roughly proportional to 1/p).
The tuned values below are the authors' (sbatch scripts of kumarkrishna/fastssl, CIFAR-10,
ResNet-50; specs/multiview_small_projectors.md §3):

- Barlow Twins beta (the off-diagonal weight ``lambd``) per p, two views;
- VICReg lambda = mu (``sim_weight`` = ``var_weight``, with ``cov_weight`` = 1), so its
  orthogonality weight relative to invariance is beta = 1 / lambda.

Rule for p outside the table: between two listed widths, interpolate linearly in (log p, log value);
beyond the smallest or largest width, continue the paper's beta ~ 1/p from that end
(Barlow Twins beta * p constant, VICReg lambda / p constant).
"""

from __future__ import annotations

import bisect
import math

from torch import nn

from selfsup.models.heads import mlp

# Barlow Twins, CIFAR-10, two views: p -> beta.
BARLOW_TWINS_BETA: dict[int, float] = {
    64: 0.04, 128: 0.04, 256: 0.02, 512: 0.01, 768: 0.002, 1024: 0.002, 1536: 0.001, 2048: 0.001,
    2304: 0.001, 2560: 0.0008, 3072: 0.001, 4096: 0.0004, 6144: 0.001, 8192: 0.0008,
}
# VICReg, CIFAR-10: p -> lambda = mu (the authors' multi-view runs: 25 at p = 256, 750 at p = 8192).
VICREG_SIM_WEIGHT: dict[int, float] = {64: 20.0, 128: 20.0, 256: 25.0, 512: 25.0, 1024: 25.0, 2048: 75.0,
                                       4096: 200.0, 8192: 800.0}


def tuned_value(table: dict[int, float], p: int, exponent: float) -> float:
    """``table[p]``; between listed widths log-log interpolation; beyond the ends ``value * (p / p_end) ** exponent``."""
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"the projector width p must be a positive int, got {p!r}")
    if p in table:
        return table[p]
    widths = sorted(table)
    if p < widths[0] or p > widths[-1]:
        end = widths[0] if p < widths[0] else widths[-1]
        return table[end] * (p / end) ** exponent
    hi = bisect.bisect(widths, p)
    p0, p1 = widths[hi - 1], widths[hi]
    t = (math.log(p) - math.log(p0)) / (math.log(p1) - math.log(p0))
    return math.exp((1 - t) * math.log(table[p0]) + t * math.log(table[p1]))


def barlow_twins_beta(p: int, num_views: int) -> float:
    """The authors' tuned Barlow Twins beta for output width p and M views.

    For M > 2 their full-data CIFAR-10 runs use half the two-view value at both p = 256 and p = 8192
    (0.01 and 0.0004 for M = 4 and 8), so the table is halved for M > 2.
    """
    if num_views < 2:
        raise ValueError(f"Barlow Twins needs at least 2 views, got {num_views}")
    beta = tuned_value(BARLOW_TWINS_BETA, p, exponent=-1.0)
    return beta if num_views == 2 else beta / 2


def vicreg_sim_weight(p: int) -> float:
    """The authors' tuned VICReg lambda = mu for output width p (the same for any number of views)."""
    return tuned_value(VICREG_SIM_WEIGHT, p, exponent=1.0)


def build_projector(in_dim: int, spec: int | list[int], last_bias: bool) -> nn.Sequential:
    """``spec = p``: the paper's small projector; ``spec = [widths...]``: the classic MLP (``mlp``, BN + ReLU)."""
    if isinstance(spec, int):
        return mlp([in_dim, spec, spec], bias=False)
    return mlp([in_dim, *spec], last_bias=last_bias)


def output_width(spec: int | list[int]) -> int:
    """Embedding width p of a projector spec."""
    return spec if isinstance(spec, int) else spec[-1]
