"""The tiny runs the tests train, from one factory: VICReg on scikit-learn's 8x8 digits (1,500 training images),
a ResNet of two basic blocks of width 8 with the small stem; a real pretrain of it takes seconds.

``tiny(**sections)`` is that config as a mapping with each given section merged over it key by key (the config's own
merge: a section whose ``name`` changes, ``method={"name": "mast", ...}``, replaces the old one, a changed
``backbone`` drops the old ``params``, a list replaces the old list); ``tiny_yaml`` is the same as YAML text, for a
file or for ``_base_``. Each test module names its variant once, with the overrides it needs.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from selfsup.config import deep_merge

BASE: dict[str, Any] = {
    "method": {"name": "vicreg", "expander": [32, 32]},
    "data": {"dataset": "digits"},
    "views": [{"preset": "minimal", "num": 2, "params": {"crop_scale": [0.5, 1.0]}}],
    "model": {"backbone": "resnet", "params": {"block": "basic", "layers": [1, 1], "width": 8, "small_stem": True}},
    "trainer": {"batch_size": 64, "progress": False},
}
ADAMW = {"name": "adamw", "lr": 0.002}
# Evaluation at its cheapest: two linear-probe epochs, one 1-shot split, one k-means start.
QUICK_EVAL = {"linear_epochs": 2, "lowshot_shots": [1], "lowshot_splits": 1, "cluster_n_init": 1}
ONE_BLOCK = {"params": {"layers": [1]}}  # model= for a ResNet of one basic block
# An 8 px VICReg run that trains nothing by default: what the CLI tests validate or train (a few steps).
VICREG_8PX = {"data": {"image_size": 8}, "model": ONE_BLOCK, "trainer": {"max_steps": 0, "batch_size": 32},
              "monitor": {"knn_every_steps": 0}}

# A MAST run (four ops, a small Gaussian head), one epoch: what the method's tests and the benchmark scripts' tests
# train.
MAST_RUN = {"method": {"name": "mast", "ops": ["color_jitter", "blur", "flip", "crop"], "embedding_dim": 32,
                       "trunk": [32], "variance": "softplus"},
            "views": [{"preset": "mast", "num": 2, "params": {"crop_scale": [0.5, 1.0]}}],
            "optim": {**ADAMW, "warmup_epochs": 0.5}, "trainer": {"epochs": 1, "log_every_steps": 5}}


def tiny(*variants: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """The tiny config with each of ``variants`` (mappings of sections, e.g. :data:`VICREG_8PX`), then ``sections``,
    merged over it (a fresh copy each call)."""
    config = copy.deepcopy(BASE)
    for layer in [*variants, sections]:
        config = deep_merge(config, copy.deepcopy(layer))
    return config


def tiny_yaml(*variants: dict[str, Any], **sections: Any) -> str:
    return yaml.safe_dump(tiny(*variants, **sections), sort_keys=False)


__all__ = ["ADAMW", "BASE", "MAST_RUN", "ONE_BLOCK", "QUICK_EVAL", "VICREG_8PX", "tiny", "tiny_yaml"]
