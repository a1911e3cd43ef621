"""What every method shares: the method protocol, the step output and config validation.

Methods compose; they don't inherit. A new method is one file that defines a class following :class:`Method`
(plus any of :class:`OptionalHooks`), and one line in ``METHODS`` (``selfsup/methods/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Protocol

import torch
from torch import nn

from selfsup.config import ConfigError, Momentum, Range
from selfsup.data.views import ViewGroup

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


class MethodConfig:
    """What every method's config dataclass shares: the checks the launcher runs on it, each a no-op unless the
    method's config overrides it."""

    def warnings(self, global_batch: int) -> list[str]:
        """Settings that run but are probably wrong for this batch (logged when training starts)."""
        return []

    def check_batch(self, global_batch: int) -> None:
        """Raise a ConfigError for settings that cannot run with this batch (checked before any work)."""

    def check_dataset(self, num_images: int, global_batch: int) -> None:
        """The same once the training split's size is known (NNCLR's queue must stay below the number of images)."""


class Method(Protocol):
    """What the training engine requires of a method (an ``nn.Module``)."""

    # The method's hyper-parameters: a dataclass derived from :class:`MethodConfig` (whose checks it may override),
    # filled from ``method:`` in the YAML.
    Config: ClassVar[type[MethodConfig]]
    # The network that is monitored and exported for evaluation: the online encoder for VICReg/BT/BYOL, the EMA
    # target for MSN and ExtreMA. A method whose trained encoder is another copy names that one ``encoder``
    # (the optimiser's layer decay and ``model.freeze`` apply to ``encoder`` when present, else to ``backbone``).
    backbone: nn.Module

    def __init__(self, backbone: nn.Module, cfg: Any, total_steps: int) -> None:
        """Build the heads around ``backbone``; ``total_steps`` sizes the method's own schedules (EMA momentum)."""

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        """One training step on the step's views (normalised, on the device): the loss and what to log."""


class OptionalHooks(Protocol):
    """Hooks the engine calls only where a method defines them."""

    # Constructor arguments of the exported backbone that differ at evaluation (MSN: ``{"pool": "cls_prenorm"}``).
    export_params: dict[str, Any]

    def attach_views(self, groups: list[ViewGroup]) -> None:
        """Receive the config's view groups once, before training (with :meth:`make_views`)."""

    def make_views(self, images: torch.Tensor, step: int) -> list[torch.Tensor]:
        """Draw the step's views from the batch in [0, 1] instead of the config's view groups (MAST: its loss
        needs to know which augmentations each pair got)."""

    def after_step(self, step: int) -> None:
        """After the optimiser step of ``step`` (counted from 0): EMA updates, queues."""

    def after_carry_over(self) -> None:
        """Once, when a stage starts from another method's weights (EMA copies restart from the carried weights)."""


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

