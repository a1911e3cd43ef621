"""Methods: each builds its heads around a backbone and defines one training step.

``METHODS`` is the registry: a method's name in the YAML -> its class. What a method must define (and the
hooks the engine calls) is written down once, in :mod:`selfsup.methods.base` (:class:`MethodBase`);
:mod:`selfsup.methods.assemble` builds a method around its backbone for training.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from selfsup.config import Config, ConfigError, derived, from_dict, stage_configs
from selfsup.methods.barlow_twins import BarlowTwins
from selfsup.methods.base import MethodConfig, StepOutput
from selfsup.methods.byol import BYOL
from selfsup.methods.dino import DINO
from selfsup.methods.extrema import ExtreMA
from selfsup.methods.ibot import IBOT
from selfsup.methods.mae import MAE
from selfsup.methods.mast import MAST
from selfsup.methods.mocov3 import MoCoV3
from selfsup.methods.msn import MSN
from selfsup.methods.nnclr import NNCLR
from selfsup.methods.simclr import SimCLR
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
    "dino": DINO,
    "ibot": IBOT,
    "simclr": SimCLR,
    "mocov3": MoCoV3,
}


def method_config(spec: dict[str, Any]) -> tuple[type[nn.Module], MethodConfig]:
    """Validate ``method: {name: ..., <hyper-parameters>}`` against the method's own config dataclass."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if not isinstance(name, str) or name not in METHODS:
        raise ConfigError(f"bad value for method.name: {name!r}; allowed values: {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls, from_dict(cls.Config, spec, prefix="method.")


def method_of(cfg: Config) -> tuple[type[nn.Module], MethodConfig]:
    """``cfg``'s method class and typed config: parsed from ``cfg.method`` once (by the loader, or here for a config
    built in Python) and handed down with ``cfg`` while its method section stays the same."""
    return derived(cfg, "method", cfg.method, lambda: method_config(cfg.method))


def check_method_sections(cfg: Config) -> None:
    """The ``method`` section of the config and of every stage, against the method's own config dataclass (whose
    fields declare their ranges as :mod:`selfsup.config`'s do); also checks the stages themselves."""
    for c in [cfg, *(stage.cfg for stage in stage_configs(cfg))]:
        _, method_cfg = method_of(c)
        # Views per image the method's step takes (its config's VIEWS = (least, most or None)), known up front.
        least, most = type(method_cfg).VIEWS
        made = sum(v.num for v in c.views)
        if made < least or (most is not None and made > most):
            need = f"{least}" if least == most else f"at least {least}" if most is None else f"{least} to {most}"
            raise ConfigError(f"method {c.method['name']} needs {need} views per image but the config makes {made} "
                              f"(the sum of views.*.num); e.g. one view spec with views.0.num={least}")
        # Sizes of the views the step stacks, where the config names them (null: data.image_size, else the stored size).
        first = [v.size or c.data.image_size for v in c.views for _ in range(v.num)][:method_cfg.SAME_SIZE_VIEWS]
        if None not in first and len(set(first)) > 1:
            raise ConfigError(f"method {c.method['name']} stacks its first {len(first)} views into one batch, so they "
                              f"need one size, but the config makes them {first} px (views.*.size); give those "
                              f"view specs the same size, e.g. {max(first)}")


def build_method(spec: dict[str, Any], backbone: nn.Module, total_steps: int) -> nn.Module:
    cls, cfg = method_config(spec)
    return cls(backbone, cfg, total_steps)


def check_dataset(spec: dict[str, Any], num_images: int, global_batch: int) -> None:
    """Raise a ConfigError for ``method:`` settings that cannot train on ``num_images`` images (the method config's
    ``check_dataset``). To be called where the training split's size is known, before building."""
    method_config(spec)[1].check_dataset(num_images, global_batch)


__all__ = ["METHODS", "MethodConfig", "StepOutput", "build_method", "check_dataset", "check_method_sections",
           "method_config", "method_of"]
