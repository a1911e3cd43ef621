"""What every method shares: the step output and config validation. Methods compose; they don't inherit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import torch

from selfsup.config import ConfigError, Momentum, Range

# The fields of an EMA teacher, shared by BYOL, MSN and ExtreMA (their ranges are checked on load, with the others).
EMAMomentum = Momentum
EMAMomentumEnd = Annotated[float, Range(ge=0, le=1, example="1")]  # null (None) holds the starting momentum
MomentumHorizon = Annotated[float, Range(gt=0, le=1, example="0.05 (a fraction of the run), or null to use "
                                                            "method.momentum")]


@dataclass
class StepOutput:
    """A training step's result: the loss to minimise, scalar terms to log, embeddings to monitor."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    embeddings: torch.Tensor | None = None  # (B, d) projector output of one view, for collapse monitors


def check_num_views(method: str, views: list[torch.Tensor], expected: int) -> None:
    if len(views) != expected:
        raise ValueError(f"{method} needs {expected} views per image but the config makes {len(views)}; "
                         f"set `views` to {expected} view specs of num 1 (see configs/presets/)")


def check_min_views(method: str, views: list[torch.Tensor], minimum: int) -> None:
    if len(views) < minimum:
        raise ValueError(f"{method} needs at least {minimum} views per image but the config makes {len(views)}; "
                         f"list more view specs or raise their num (e.g. views.0.num={minimum})")


def check_values(cfg: object, checks: dict[str, bool], allowed: dict[str, str]) -> None:
    """Raise a ConfigError for the first ``method.<key>`` whose check is False, with its value and ``allowed[key]``."""
    for key, ok in checks.items():
        if not ok:
            raise ConfigError(f"bad value for method.{key}: {getattr(cfg, key)!r}; use {allowed[key]}")

