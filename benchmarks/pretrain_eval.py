"""Pretrain a config, then evaluate it beside raw pixels; report wall-clock and CPU minutes.

    python benchmarks/pretrain_eval.py CONFIG.yaml [key=value ...] [--compare raw] [--evals knn,linear,lowshot,cluster]

Prints one JSON object (last stdout line): the evaluation results, pretraining wall-clock and
CPU (user+sys) minutes of this process, and the number of threads. Used for the accuracy rows of
docs/benchmarks.md; ``benchmarks/sweep.py`` calls :func:`pretrain_and_evaluate` once per value.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from selfsup.load import load_config
from selfsup.eval.run import evaluate_run, run_config
from selfsup.launch import pretrain


def cpu_minutes() -> float:
    t = os.times()
    return (t.user + t.system) / 60


def pretrain_and_evaluate(config: str, overrides: list[str], compare: str = "raw",
                          evals: str = "knn,linear,lowshot,cluster") -> dict:
    """Pretrain ``config`` with ``overrides``, evaluate the backbone and the ``compare`` baselines; one result dict."""
    cfg = load_config(config, overrides)
    wall, cpu = time.perf_counter(), cpu_minutes()
    run_dir = pretrain(cfg)
    result = {"config": config, "overrides": overrides, "threads": torch.get_num_threads(),
              "pretrain_wall_min": round((time.perf_counter() - wall) / 60, 2),
              "pretrain_cpu_min": round(cpu_minutes() - cpu, 2)}
    eval_cfg = run_config(Path(run_dir), [])
    for baseline in ["none", *[b for b in compare.split(",") if b and b != "none"]]:  # --compare none: once
        prefix = "" if baseline == "none" else f"{baseline}_"
        scores = evaluate_run(Path(run_dir), eval_cfg, evals.split(","), baseline=baseline, progress=False)
        result.update({prefix + k: v for k, v in scores.items()})
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--compare", default="raw")
    parser.add_argument("--evals", default="knn,linear,lowshot,cluster")
    args = parser.parse_args()
    print(json.dumps(pretrain_and_evaluate(args.config, args.overrides, args.compare, args.evals)))


if __name__ == "__main__":
    main()
