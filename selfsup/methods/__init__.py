"""Methods: each builds its heads around a backbone and defines one training step.

The contract the engine relies on (no base class; methods compose shared pieces):

- ``Config``: a dataclass of the method's hyper-parameters (validated from ``method:`` in the YAML);
- ``__init__(backbone, cfg, total_steps)``; ``forward(views: list[Tensor]) -> StepOutput``;
- ``backbone``: the network that is monitored and exported for evaluation (the online encoder for
  VICReg/BT/BYOL, the EMA target for MSN and ExtreMA);
- optional ``attach_views(groups)`` + ``make_views(images, step) -> views``: the method draws its own views
  from the [0, 1] batch (MAST, whose loss needs to know which augmentations each pair got);
- optional ``plot(out_dir, metrics_rows, samples)``: the method's own pictures, drawn at the end of a run
  (``samples``: a few normalised images of the evaluation split, e.g. for MAE's reconstructions);
- optional ``after_carry_over()``: called once when a stage starts from the previous stage's weights (EMA
  copies restart from the carried weights);
- optional ``after_step(step)`` (EMA updates) and ``export_params`` (constructor arguments that
  differ at evaluation, e.g. MSN's ``{"pool": "cls_prenorm"}``);
- optional ``Config.warnings(global_batch) -> list[str]``: settings that run but are probably wrong
  for this batch (logged when training starts); optional ``Config.check_batch(global_batch)``: raise a
  ConfigError for settings that cannot run with this batch (checked before any work); optional
  ``Config.check_dataset(num_images, global_batch)``: the same once the training split's size is known
  (:func:`check_dataset`; NNCLR's queue must stay below the number of images).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from selfsup.config import ConfigError, from_dict
from selfsup.methods.barlow_twins import BarlowTwins
from selfsup.methods.base import StepOutput
from selfsup.methods.byol import BYOL
from selfsup.methods.extrema import ExtreMA
from selfsup.methods.mae import MAE
from selfsup.methods.mast import MAST
from selfsup.methods.msn import MSN
from selfsup.methods.nnclr import NNCLR
from selfsup.methods.vicreg import VICReg

METHODS: dict[str, type[nn.Module]] = {
    "vicreg": VICReg,
    "barlow_twins": BarlowTwins,
    "byol": BYOL,
    "msn": MSN,
    "extrema": ExtreMA,
    "mast": MAST,
    "mae": MAE,
    "nnclr": NNCLR,
}


def method_config(spec: dict[str, Any]) -> tuple[type[nn.Module], Any]:
    """Validate ``method: {name: ..., <hyper-parameters>}`` against the method's own config dataclass."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in METHODS:
        raise ConfigError(f"bad value for method.name: {name!r}; allowed values: {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls, from_dict(cls.Config, spec, prefix="method.")


def build_method(spec: dict[str, Any], backbone: nn.Module, total_steps: int) -> nn.Module:
    cls, cfg = method_config(spec)
    return cls(backbone, cfg, total_steps)


def check_dataset(spec: dict[str, Any], num_images: int, global_batch: int) -> None:
    """Raise a ConfigError for ``method:`` settings that cannot train on ``num_images`` images (the method config's
    optional ``check_dataset``). To be called where the training split's size is known, before building."""
    _, cfg = method_config(spec)
    if hasattr(cfg, "check_dataset"):
        cfg.check_dataset(num_images, global_batch)


__all__ = ["METHODS", "StepOutput", "build_method", "check_dataset", "method_config"]
