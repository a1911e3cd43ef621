"""selfsup: label-efficient self-supervised visual pretraining.

The Python API (imported lazily, so ``import selfsup`` stays cheap: torch loads on first use)::

    model, preprocess = selfsup.load_backbone(RUN_DIR)   # nn.Module (eval mode) + its resize/normalise transform
    features = model(preprocess(images))                 # a list of PIL images, paths or uint8 tensors -> (B, D)
    features = selfsup.embed(RUN_DIR, images)            # the same for a batch, in one call
    features, files = selfsup.embed(RUN_DIR, "photos/", return_files=True)   # a folder, = selfsup embed
    run_dir = selfsup.pretrain("config.yaml", "trainer.epochs=1")   # = selfsup pretrain
    scores = selfsup.evaluate(run_dir, "all", compare=["raw", "random"])   # = selfsup eval
    run_dir = selfsup.pretrain("config.yaml", backbone=my_module)   # your own nn.Module (see register_backbone)

``selfsup export`` and ``selfsup report`` are :func:`selfsup.export.export` and :func:`selfsup.report.build_report`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Preprocess", "embed", "evaluate", "load_backbone", "pretrain", "register_backbone"]

_LAZY = {"Preprocess": "selfsup.api", "embed": "selfsup.api", "evaluate": "selfsup.api",
         "load_backbone": "selfsup.api", "pretrain": "selfsup.api", "register_backbone": "selfsup.models"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfsup' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
