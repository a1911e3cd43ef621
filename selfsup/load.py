"""``load_config``: a run's config read from YAML and ``key=value`` overrides, every section checked, the method's
own parameters included (parsed once into the method's typed config, which the config then carries).

It sits above both :mod:`selfsup.config` (the typed sections) and :mod:`selfsup.methods` (whose configs are built
from the former), so that neither imports the other's importer.
"""

from __future__ import annotations

from pathlib import Path

from selfsup.config import Config, read_config
from selfsup.methods import check_method_sections


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML (or the defaults), apply ``key=value`` overrides and validate everything."""
    cfg = read_config(path, overrides)
    check_method_sections(cfg)
    return cfg


__all__ = ["load_config"]
