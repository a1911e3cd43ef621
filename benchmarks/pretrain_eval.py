"""Pretrain a config, then evaluate it beside raw pixels; report wall-clock and CPU minutes.

    python benchmarks/pretrain_eval.py CONFIG.yaml [key=value ...] [--compare raw] [--evals knn,linear,lowshot,cluster]

Prints one JSON object (last stdout line): the evaluation results, pretraining wall-clock and
CPU (user+sys) minutes of this process, and the number of threads. Used for the accuracy rows of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from selfsup.config import load_config
from selfsup.eval.run import compute_features, evaluate, run_config
from selfsup.train.engine import pretrain


def cpu_minutes() -> float:
    t = os.times()
    return (t.user + t.system) / 60


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--compare", default="raw")
    parser.add_argument("--evals", default="knn,linear,lowshot,cluster")
    args = parser.parse_args()

    cfg = load_config(args.config, args.overrides)
    wall, cpu = time.perf_counter(), cpu_minutes()
    run_dir = pretrain(cfg)
    result = {"config": args.config, "overrides": args.overrides, "threads": torch.get_num_threads(),
              "pretrain_wall_min": round((time.perf_counter() - wall) / 60, 2),
              "pretrain_cpu_min": round(cpu_minutes() - cpu, 2)}
    eval_cfg = run_config(Path(run_dir), [])
    for baseline in ["none", *[b for b in args.compare.split(",") if b]]:
        feats = compute_features(Path(run_dir), eval_cfg, baseline=baseline, progress=False)
        prefix = "" if baseline == "none" else f"{baseline}_"
        for kind in args.evals.split(","):
            result.update({prefix + k: v for k, v in evaluate(kind, feats, eval_cfg).items()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
