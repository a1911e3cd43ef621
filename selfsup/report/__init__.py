"""``selfsup report RUN_DIR``: one self-contained HTML page about a run (see :func:`build_report`); and the methods'
own pictures a run draws when it ends (:mod:`selfsup.report.method_figures`).

``build_report`` and ``SECTIONS`` are imported on first use, as :mod:`selfsup`'s API is: the training engine imports
the method figures from this package, and the report (which loads a run through the API, which trains) sits above the
engine, so importing the package must not import the report.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SECTIONS", "build_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        value = getattr(importlib.import_module("selfsup.report.build"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'selfsup.report' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
