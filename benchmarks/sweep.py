"""Sweep one config key: pretrain + evaluate once per value, print one JSON list.

    python benchmarks/sweep.py CONFIG KEY=V1,V2,V3 [key=value ...] [--compare raw] [--evals knn,linear,lowshot,cluster]

e.g. the orthogonality weight of a small projector (Ghosh et al. 2024, §4.1: tune beta per width p)::

    python benchmarks/sweep.py configs/fashion_mnist/multiview_bt_p256_m2.yaml method.lambd=0.005,0.01,0.02,0.04

Each value runs :func:`pretrain_eval.pretrain_and_evaluate` into its own run directory,
``<trainer.out>-<KEY>=<V>`` (re-running the sweep resumes or re-uses them). Values are split at
commas outside brackets, so ``model.params.layers=[1,1],[2,2]`` sweeps two lists. The last stdout
line is a JSON list with one object per value: ``{"key", "value", **results}``.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from pretrain_eval import pretrain_and_evaluate
from selfsup.config import ConfigError, to_dict
from selfsup.load import load_config
from selfsup.launch import validate


def split_values(text: str) -> list[str]:
    """Split ``"a,[1,2],{x: 3}"`` at the commas outside brackets and braces."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    if depth != 0 or any(not v.strip() for v in values):
        raise ConfigError(f"cannot split sweep values {text!r}; write KEY=V1,V2,... with balanced brackets")
    return [v.strip() for v in values]


def sweep_runs(config: str, sweep: str, overrides: list[str]) -> list[tuple[str, Any, list[str]]]:
    """``(key, resolved value, overrides)`` per value, each with its own ``trainer.out`` next to the config's.

    Every value is loaded and validated before any run starts, so a bad value fails fast.
    """
    key, sep, text = sweep.partition("=")
    if not sep or not key or not text:
        raise ConfigError(f"sweep {sweep!r} is not of the form KEY=V1,V2,... (e.g. method.lambd=0.01,0.02)")
    base_out = load_config(config, overrides).trainer.out
    runs = []
    for value in split_values(text):
        name = re.sub(r"[^A-Za-z0-9._=+-]", "_", f"{key}={value}")
        run_overrides = [*overrides, f"{key}={value}", f"trainer.out={base_out}-{name}"]
        cfg = load_config(config, run_overrides)
        validate(cfg)
        resolved: Any = to_dict(cfg)
        for part in key.split("."):
            resolved = resolved[int(part)] if isinstance(resolved, list) else resolved[part]
        if isinstance(resolved, str) and re.fullmatch(r"[-+]?[0-9.]+[eE][-+]?[0-9]+", resolved):
            resolved = float(resolved)  # YAML 1.1 keeps 1e-3 a string inside free-form mappings (method.*)
        runs.append((key, resolved, run_overrides))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("sweep", help="KEY=V1,V2,... e.g. method.lambd=0.005,0.01,0.02")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--compare", default="raw")
    parser.add_argument("--evals", default="knn,linear,lowshot,cluster")
    args = parser.parse_args()
    results = []
    for key, value, overrides in sweep_runs(args.config, args.sweep, args.overrides):
        result = pretrain_and_evaluate(args.config, overrides, args.compare, args.evals)
        results.append({"key": key, "value": value, **result})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
