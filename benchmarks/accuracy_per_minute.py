"""Accuracy against CPU-minutes: train a config for a CPU budget, evaluating its backbone along the way.

    python benchmarks/accuracy_per_minute.py CONFIG.yaml --cpu-minutes 30 [key=value ...]
        [--points 6] [--evals knn,linear] [--holdout 0.1] [--out DIR]
    python benchmarks/accuracy_per_minute.py CONFIG.yaml --steps 676 [key=value ...] [...]

1. Calibrate: a short run of the config (``--calibration-steps``) measures the training step's CPU
   seconds (user + system, all threads) on this machine.
2. Size the run to the budget: ``trainer.max_steps`` = budget / CPU seconds per step, so the
   schedules (cosine, ``optim.warmup_fraction``, EMA) follow the budgeted length. The backbone is
   exported ``--points`` times along the way (``trainer.export_every_steps``).
   A shared machine's speed drifts (on the 2-core VM of docs/benchmarks.md, two calibrations of
   resnet_30min.yaml measured 0.89 and 1.59 CPU-s per step), so arms run at different times get
   different step counts from the same budget.
   The result records the run's own CPU-s per step and warns when it is more than 15 % off the
   calibration. ``--steps N`` skips the calibration and trains N steps: use it to compare settings
   that cost the same per step.
3. Evaluate every snapshot, the final backbone and raw pixels with the same protocol. Evaluation is
   not counted in the budget. ``--holdout F`` evaluates on a held-out fraction F of the labelled training
   split instead of the test split (``eval.holdout``): use it to choose settings, then report the test split.

Writes ``DIR/curve.json`` and ``DIR/curve.png``: accuracy against CPU-minutes, with raw pixels as a
horizontal line. Prints the same JSON as its last stdout line, with the CPU model and thread count.
Compare curves only within one machine.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import platform
import sys
from pathlib import Path

import torch

from selfsup.config import Config
from selfsup.load import load_config
from selfsup.eval.run import evaluate_run, evaluation_split, run_config
from selfsup.launch import pretrain


def cpu_model() -> str:
    """The processor's model name (what ``lscpu`` prints), for the record beside every figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_seconds_per_step(run_dir: Path) -> float:
    """Training CPU seconds per step from a run's metrics.csv, leaving out the first logged window (warm-up)."""
    with (run_dir / "metrics.csv").open() as f:
        rows = [(int(r["step"]), float(r["cpu_time_s"])) for r in csv.DictReader(f) if r.get("cpu_time_s")]
    if len(rows) < 2:
        raise SystemExit(f"calibration in {run_dir} logged {len(rows)} rows; raise --calibration-steps")
    (s0, c0), (s1, c1) = rows[0], rows[-1]
    return (c1 - c0) / (s1 - s0)


def steps_per_epoch(run_dir: Path) -> int:
    """Steps per epoch of a run, from its last metrics.csv row (``epoch`` = step / steps per epoch)."""
    with (run_dir / "metrics.csv").open() as f:
        last = [r for r in csv.DictReader(f) if r.get("epoch")][-1]
    return max(1, round(int(last["step"]) / float(last["epoch"])))


def calibrate(cfg: Config, out: Path, steps: int) -> tuple[float, int]:
    """Train ``cfg`` for ``steps`` steps into ``out`` (no exports, no monitors): its training CPU-s per step on this
    machine and its steps per epoch."""
    trainer = dataclasses.replace(cfg.trainer, out=str(out), max_steps=steps, log_every_steps=max(1, steps // 4),
                                  export_every_steps=0)
    monitor = dataclasses.replace(cfg.monitor, knn_every_steps=0, collapse_every_steps=0)
    pretrain(dataclasses.replace(cfg, trainer=trainer, monitor=monitor))
    return cpu_seconds_per_step(out), steps_per_epoch(out)


def budget_curve(config: str, overrides: list[str], cpu_minutes: float | None, out: Path, points: int = 6,
                 evals: str = "knn,linear", calibration_steps: int = 40, holdout: float | None = None,
                 steps: int | None = None, with_raw: bool = True, with_random: bool = False) -> dict:
    """Calibrate, train for ``cpu_minutes`` (or exactly ``steps``), evaluate the snapshots (and, ``with_raw``, raw
    pixels; ``with_random``, a random-init network of the run's architecture); the result dict, written to ``out``
    once every number is in it."""
    if (cpu_minutes is None) == (steps is None):
        raise ValueError("give exactly one of cpu_minutes (a CPU budget) and steps (a fixed length)")
    per_step = None
    if steps is None:
        per_step, _ = calibrate(load_config(config, overrides), out / "calibration", calibration_steps)
        steps = max(points, int(cpu_minutes * 60 / per_step))

    run = out / "run"
    pretrain(load_config(config, [*overrides, f"trainer.out={run}", f"trainer.max_steps={steps}",
                                  f"trainer.export_every_steps={math.ceil(steps / points)}"]))
    cfg = run_config(run, [] if holdout is None else [f"eval.holdout={holdout}"])
    kinds = evals.split(",")
    snapshots = sorted((run / "snapshots").glob("step_*")) + [run]
    curve = []
    for folder in snapshots:
        meta = json.loads((folder / "backbone.json").read_text())
        scores = evaluate_run(folder, cfg, kinds, progress=False)
        curve.append({"step": meta["steps"], "cpu_min": round(meta["cpu_time_s"] / 60, 3),
                      "wall_min": round(meta["train_time_s"] / 60, 3), **scores})
    raw = evaluate_run(run, cfg, kinds, baseline="raw", progress=False) if with_raw else None
    random = evaluate_run(run, cfg, kinds, baseline="random", progress=False) if with_random else None
    run_per_step = curve[-1]["cpu_min"] * 60 / curve[-1]["step"]
    if per_step is not None and abs(run_per_step / per_step - 1) > 0.15:
        print(f"warning: the run took {run_per_step:.3f} CPU-s per step, the calibration {per_step:.3f}: it used "
              f"{curve[-1]['cpu_min']:.1f} of its {cpu_minutes:g} CPU-minutes. The machine's speed drifted; compare "
              f"arms run at different times at equal steps (--steps {steps}), not equal budgets", file=sys.stderr)
    choice = evaluation_split(cfg)  # data.eval_split (auto resolved) or eval.holdout, as evaluate_run reads it
    result = {"config": config, "overrides": overrides, "cpu_model": cpu_model(), "threads": torch.get_num_threads(),
              "eval_set": choice.name or f"held-out {choice.holdout:g} of {cfg.data.train_split}",
              "cpu_minutes_budget": cpu_minutes, "holdout": holdout, "evals": evals,
              "calibration_cpu_s_per_step": None if per_step is None else round(per_step, 4),
              "run_cpu_s_per_step": round(run_per_step, 4), "steps": steps, "curve": curve, "raw": raw,
              **({"random": random} if with_random else {})}
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps(result, indent=2))
    plot_curve(result, out / "curve.png")
    return result


def plot_curve(result: dict, path: Path) -> None:
    """One panel per evaluated metric: the backbone against CPU-minutes, raw pixels (if evaluated) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [k for k in ("knn_top1", "linear_top1", "lowshot_1shot_mean", "cluster_acc") if k in result["curve"][-1]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.2), squeeze=False)
    minutes = [p["cpu_min"] for p in result["curve"]]
    for ax, key in zip(axes[0], metrics):
        ax.plot(minutes, [p[key] for p in result["curve"]], marker="o", label="backbone")
        if result["raw"]:
            ax.axhline(result["raw"][key], color="gray", linestyle="--", label="raw pixels")
        ax.set_xlabel("training CPU-minutes")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{Path(result['config']).name} on {result['cpu_model']} ({result['threads']} threads)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--cpu-minutes", type=float, help="training budget in CPU-minutes")
    length.add_argument("--steps", type=int, help="train exactly this many steps (no calibration): compares settings "
                        "that cost the same per step, whatever the machine's speed at the time")
    parser.add_argument("--points", type=int, default=6, help="evaluated snapshots along the run")
    parser.add_argument("--evals", default="knn,linear", help="comma list of knn, linear, lowshot, cluster")
    parser.add_argument("--calibration-steps", type=int, default=40)
    parser.add_argument("--holdout", type=float, default=None,
                        help="evaluate on this held-out fraction of the training split (choosing settings), not the test split")
    parser.add_argument("--out", default=None, help="output folder (default runs/budget_<config name>)")
    parser.add_argument("--no-raw", action="store_true",
                        help="skip raw pixels (the same for every arm of a screen; \"raw\" is then null)")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be a positive number of training steps, got {args.steps}")
    out = Path(args.out or f"runs/budget_{Path(args.config).stem}")
    result = budget_curve(args.config, args.overrides, args.cpu_minutes, out, args.points, args.evals,
                          args.calibration_steps, args.holdout, args.steps, with_raw=not args.no_raw)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
