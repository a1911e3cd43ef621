"""What every method shares: the method base class and its hooks, the step output, the EMA fields, config validation.

A new method is one file that defines a :class:`MethodBase` subclass (overriding the hooks it needs), and one line
in ``METHODS`` (``selfsup/methods/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from torch import nn

from selfsup.config import ConfigError, Momentum, Range
from selfsup.data.views import ViewGroup
from selfsup.train.schedules import ema_momentum_schedule

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


class MethodBase(nn.Module):
    """What the training engine requires of a method, and the hooks it calls on every method (no-ops here).

    A method defines ``Config`` (its hyper-parameters: a :class:`MethodConfig` dataclass, filled from ``method:`` in
    the YAML, with ``VIEWS = (least, most or None)``, the views per image its step takes, checked when the config is
    loaded), ``__init__(backbone, cfg, total_steps)`` (the heads around ``backbone``; ``total_steps`` sizes the
    method's own schedules, e.g. EMA momentum) and ``forward(views) -> StepOutput`` (one training step on the step's
    views, normalised and on the device).

    ``backbone`` is the network that is monitored and exported for evaluation: the online encoder for
    VICReg/BT/BYOL, the EMA target for MSN and ExtreMA. A method whose trained encoder is another copy names that one
    ``encoder`` (the optimiser's layer decay and ``model.freeze`` apply to ``encoder`` when present, else to
    ``backbone``).
    """

    Config: ClassVar[type[MethodConfig]]
    backbone: nn.Module
    # The method draws its views itself (``make_views``) instead of taking the config's view groups.
    OWN_VIEWS: ClassVar[bool] = False
    # Constructor arguments of the exported backbone that differ at evaluation (MSN: ``{"pool": "cls_prenorm"}``).
    export_params: dict[str, Any]

    def __init__(self) -> None:
        super().__init__()
        self.export_params = {}

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        raise NotImplementedError

    def attach_views(self, groups: list[ViewGroup]) -> None:
        """Receive the config's view groups once, before training (methods with ``OWN_VIEWS``)."""

    def make_views(self, images: torch.Tensor, step: int) -> list[torch.Tensor]:
        """With ``OWN_VIEWS``: draw the step's views from the batch in [0, 1] instead of the config's view groups
        (MAST: its loss needs to know which augmentations each pair got)."""
        raise NotImplementedError(f"{type(self).__name__} takes the config's views (OWN_VIEWS is False)")

    def after_step(self, step: int) -> None:
        """After the optimiser step of ``step`` (counted from 0): EMA updates, queues."""

    def after_carry_over(self) -> None:
        """Once, when a stage starts from another method's weights (EMA copies restart from the carried weights)."""

    # A step count for the method's own schedules (DINO's and iBOT's teacher temperature, their frozen last layer)

    def register_step_count(self) -> None:
        """Give the method a ``steps_done`` buffer, saved with its weights (a resumed run continues its schedules),
        and the same count on the host (:meth:`steps_done_now`, :meth:`count_step`): the schedules index with it
        at every step, and reading the buffer would make the host wait for the device's work each time. The host's
        count is read from the buffer when a state dict is loaded (a resume, a carried stage), before training."""
        self.register_buffer("steps_done", torch.zeros((), dtype=torch.long))
        self._steps_done = 0
        self.register_load_state_dict_post_hook(_read_step_count)

    def steps_done_now(self) -> int:
        """The optimiser steps taken, as counted on the host."""
        return self._steps_done

    def count_step(self, step: int) -> None:
        """After optimiser step ``step`` (from 0): ``step + 1`` steps done, in the buffer and on the host."""
        self.steps_done.fill_(step + 1)
        self._steps_done = step + 1


def _read_step_count(method: MethodBase, _incompatible_keys: Any) -> None:
    method._steps_done = int(method.steps_done)


class MethodConfig:
    """What every method's config dataclass shares: the checks the launcher runs on it, each a no-op unless the
    method's config overrides it."""

    # The first k views per image share one size: the step stacks them into one batch (DINO's global crops).
    SAME_SIZE_VIEWS: ClassVar[int] = 0

    def warnings(self, global_batch: int) -> list[str]:
        """Settings that run but are probably wrong for this batch (logged when training starts)."""
        return []

    def check_batch(self, global_batch: int) -> None:
        """Raise a ConfigError for settings that cannot run with this batch (checked before any work)."""

    def check_dataset(self, num_images: int, global_batch: int) -> None:
        """The same once the training split's size is known (NNCLR's queue must stay below the number of images)."""


@dataclass
class EMAConfig(MethodConfig):
    """The momentum fields of a method with an EMA teacher (BYOL, MSN, ExtreMA); its config inherits them."""

    momentum: EMAMomentum = 0.996  # the starting momentum m0 (the papers' value)
    momentum_end: EMAMomentumEnd | None = 1.0  # None: hold the starting momentum
    momentum_horizon: MomentumHorizon | None = None  # instead: start at the momentum averaging this fraction of the run

    def momentum_schedule(self, shape: Callable[..., np.ndarray], total_steps: int,
                          stretch: float = 1.0) -> np.ndarray:
        """The momentum per step, from the start to ``momentum_end`` along ``shape`` (:func:`ema_momentum_schedule`)."""
        return ema_momentum_schedule(shape, self.momentum, self.momentum_horizon, self.momentum_end, total_steps,
                                     stretch)


def check_values(cfg: object, checks: dict[str, bool], allowed: dict[str, str]) -> None:
    """Raise a ConfigError for the first ``method.<key>`` whose check is False, with its value and ``allowed[key]``."""
    for key, ok in checks.items():
        if not ok:
            raise ConfigError(f"bad value for method.{key}: {getattr(cfg, key)!r}; use {allowed[key]}")

