"""The laptop suite: every method's CIFAR-10 laptop preset, trained for one CPU budget, on one table and one plot.

    python benchmarks/laptop_suite.py --data ../shared/data/cifar10 --cpu-minutes 30 [--methods vicreg,msn,...]
        [--holdout 0.1] [--points 3] [--out runs/laptop_suite] [--evals knn,linear,lowshot,cluster]

For each method, ``configs/cifar10/laptop/<method>.yaml`` is calibrated and sized to ``--cpu-minutes`` on this
machine (``benchmarks/accuracy_per_minute.py``: the schedules follow the sized run), trained with ``--points``
snapshots, and every snapshot is evaluated on the hold-out (``eval.holdout``; 0.1 = 5,000 of CIFAR-10's training
images, labelled only from the other 45,000). Raw pixels (once) and a random-init network of each method's
architecture are evaluated the same way.

Writes into ``--out``: ``<method>/curve.json`` per method (resumable: a method whose curve.json was made with the same
budget, hold-out, evaluations and preset is not retrained; one trained from another version of its preset or other
overrides, its own length aside, is moved aside to ``<method>.replaced-<hash>`` and retrained), ``suite.json`` (every
number, the CPU model, the command; the methods of ``--methods`` and every other preset already finished in ``--out``
for this budget, so a suite run one method at a time ends with one table), ``suite.md`` (the table) and ``suite.png``
(20-NN and linear accuracy against training CPU-minutes, a line per method, raw pixels dashed).
Prints ``suite.json``'s content as its last stdout line.

A staged preset (``stages:``, e.g. ``mae_ct.yaml``: MAE, then the CT head's initialisation, then contrastive tuning)
fits the same budget as a whole, in the preset's proportions: every stage is calibrated, the lengths the preset gives
the stages are priced on this machine, and all of them are scaled by one factor to the budget (``stage_sizes`` in its
result). The first stage (the preset named after its method, ``mae``) is trained for its share into
``<method>/first/``; the later stages continue it. Its curve is the first stage's snapshots followed by the staged
run's end, whose CPU-minutes are all the stages'.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch

from accuracy_per_minute import budget_curve, calibrate, cpu_model
from selfsup.config import Config, stage_configs, to_dict
from selfsup.load import load_config
from selfsup.eval.run import evaluate_run, run_config
from selfsup.launch import pretrain
from selfsup.train.schedules import run_steps

PRESETS = Path(__file__).resolve().parent.parent / "configs" / "cifar10" / "laptop"
METHODS = ("vicreg", "barlow_twins", "byol", "nnclr", "simclr", "mocov3", "multiview_vicreg", "mast5", "mast15", "msn",
           "extrema", "mae", "mae_ct", "dino", "ibot")
# Table columns: (result key, heading).
# knn200_top1: lightly's k = 200, T = 0.1 (selfsup.eval.knn), so the 20-NN numbers compare with lightly's tables.
COLUMNS = (("knn_top1", "20-NN"), ("knn200_top1", "200-NN"), ("linear_top1", "linear"),
           ("lowshot_1shot_mean", "1-shot"), ("lowshot_5shot_mean", "5-shot"), ("lowshot_1pct_mean", "1 %"),
           ("cluster_acc", "k-means"))


def preset(method: str) -> Path:
    path = PRESETS / f"{method}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS.glob("*.yaml"))
        raise SystemExit(f"error: no laptop preset {path}; choose --methods from {', '.join(known)}")
    return path


def finished(curve: Path, args: argparse.Namespace, cpu_minutes: float | None, steps: int | None = None) -> dict | None:
    """The result in ``curve`` (a curve.json) if it was made for this budget (or, given ``steps``, this length),
    hold-out and evaluations and has its random-network scores; None if it must be (re)made."""
    if not curve.is_file():
        return None
    result = json.loads(curve.read_text())
    wanted = {"cpu_minutes_budget": cpu_minutes, "holdout": args.holdout, "evals": args.evals}
    if steps is not None:
        wanted["steps"] = steps
    return result if all(result.get(k) == v for k, v in wanted.items()) and "random" in result else None


def without_stage_overrides(overrides: list[str]) -> list[str]:
    """``stages.*`` overrides are for the staged presets only."""
    return [o for o in overrides if not o.startswith("stages.")]


def fingerprint(cfg: Config) -> str:
    """A preset as it resolves (its ``_base_`` chain and the command line's overrides), hashed. A single-stage preset's
    own length (``trainer.epochs``, ``trainer.max_steps``) is left out: the suite sets that length from the budget, so
    a preset re-sized for direct runs keeps its finished suite runs. A staged preset's stage lengths are kept: the
    suite prices them and keeps their proportions."""
    fields = to_dict(cfg)  # the YAML sections, not what was derived from them (a parse cache)
    if not cfg.stages:
        fields["trainer"] = {k: v for k, v in fields["trainer"].items() if k not in ("epochs", "max_steps")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def same_preset(result: dict, made: str) -> bool:
    """Whether a finished run was trained from the preset whose fingerprint is ``made``; a run from before the suite
    recorded its preset's hash counts as the same."""
    return result.get("preset_sha256", made) == made


def method_config(method: str, data_overrides: list[str]) -> Config:
    """A method's preset with the command line's overrides (``stages.*`` ones only for a staged preset)."""
    if not load_config(preset(method)).stages:
        data_overrides = without_stage_overrides(data_overrides)
    return load_config(preset(method), data_overrides)


def finished_elsewhere(skip: list[str], args: argparse.Namespace, data_overrides: list[str]) -> dict[str, dict]:
    """The other presets' runs already finished in ``--out`` for this budget, hold-out, evaluations and the preset as
    it is now: a suite run one method at a time still gets one table of all of them. A run from another version of
    its preset is left out, with a message."""
    found = {}
    for method in METHODS:
        result = None if method in skip else finished(Path(args.out) / method / "curve.json", args, args.cpu_minutes)
        if result is None:
            continue
        made = fingerprint(method_config(method, data_overrides))
        if not same_preset(result, made):
            print(f"{method}: its run in {args.out} was made from another version of its preset (or other "
                  f"overrides); left out of the table, retrain it with --methods {method}", file=sys.stderr)
            continue
        found[method] = result
    return found


def run_method(method: str, args: argparse.Namespace, data_overrides: list[str]) -> dict:
    """Train (or reuse) one method's budgeted run; its curve plus the random-network baseline. A finished run made
    from another version of the preset (or other overrides) is moved aside to ``<method>.replaced-<hash>`` and the
    method retrained."""
    out = Path(args.out) / method
    done = out / "curve.json"
    cfg = method_config(method, data_overrides)
    made = fingerprint(cfg)
    result = finished(done, args, args.cpu_minutes)
    if result is not None and same_preset(result, made):
        note = "" if "preset_sha256" in result else " (trained before the suite recorded its preset's hash)"
        print(f"{method}: finished earlier in {out}, not retrained{note}", file=sys.stderr)
        return result
    if result is not None:
        aside = out.with_name(f"{method}.replaced-{result['preset_sha256']}")
        shutil.rmtree(aside, ignore_errors=True)  # an older copy of that very preset's run
        out.rename(aside)
        print(f"{method}: the preset or its overrides changed since {out} was trained; that run is now in {aside}, "
              f"retraining", file=sys.stderr)
    stages = stage_configs(cfg)
    if stages:
        result = run_staged(method, stages, args, data_overrides)
    else:
        result = budget_curve(str(preset(method)), data_overrides, args.cpu_minutes, out, args.points, args.evals,
                              args.calibration_steps, args.holdout, with_raw=False, with_random=True)
    result.update(cpu_minutes_budget=args.cpu_minutes, holdout=args.holdout, evals=args.evals, method=method,
                  preset_sha256=made)
    done.write_text(json.dumps(result, indent=2))
    return result


def run_staged(method: str, stages: list, args: argparse.Namespace, data_overrides: list[str]) -> dict:
    """A staged preset within the budget, in the preset's proportions: every stage is calibrated (its CPU-s per step
    on this machine), the lengths the preset gives them are priced, and all are scaled by one factor so that the whole
    costs the budget. The first stage is its method's own preset trained for its scaled steps, its snapshots
    evaluated like any method's; the later stages then continue it. The curve is the first stage's, then the staged
    run's end."""
    out = Path(args.out) / method
    measured_file = out / "stages.json"  # the calibrations, kept: a resumed suite sizes the stages as before
    measured = json.loads(measured_file.read_text()) if measured_file.is_file() else {}
    for stage in stages:
        if stage.name not in measured:
            per_step, per_epoch = calibrate(stage.cfg, out / f"calibration_{stage.name}", args.calibration_steps)
            measured[stage.name] = {"cpu_s_per_step": round(per_step, 4), "steps_per_epoch": per_epoch}
            out.mkdir(parents=True, exist_ok=True)
            measured_file.write_text(json.dumps(measured, indent=2))
    preset_steps = {s.name: run_steps(s.cfg.trainer, measured[s.name]["steps_per_epoch"]) for s in stages}
    preset_cost = sum(preset_steps[n] * measured[n]["cpu_s_per_step"] for n in preset_steps) / 60
    scale = args.cpu_minutes / preset_cost
    sizes = {}
    for name, steps in preset_steps.items():
        scaled = max(1, round(steps * scale))
        per_step = measured[name]["cpu_s_per_step"]
        sizes[name] = {"preset_steps": steps, "steps": scaled, "cpu_s_per_step": per_step,
                       "cpu_min": round(scaled * per_step / 60, 3)}
    base = stages[0].cfg.method["name"]
    first, first_steps = out / "first", sizes[stages[0].name]["steps"]
    result = finished(first / "curve.json", args, None, steps=first_steps)
    if result is None:
        result = budget_curve(str(preset(base)), without_stage_overrides(data_overrides), None, first, args.points,
                              args.evals, args.calibration_steps, args.holdout, steps=first_steps, with_raw=False,
                              with_random=True)
    run = out / "run"
    stage_one = run / "stages" / f"1_{stages[0].name}"
    if not (stage_one / "backbone.json").is_file():
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(first / "run", stage_one, ignore=shutil.ignore_patterns("snapshots"))
    lengths = [f"stages.{name}.trainer.max_steps={size['steps']}" for name, size in sizes.items()]
    pretrain(load_config(preset(method), [*data_overrides, *lengths, f"trainer.out={run}",
                                          "trainer.export_every_steps=0"]))
    meta = json.loads((run / "backbone.json").read_text())
    cfg = run_config(run, [f"eval.holdout={args.holdout}"])
    end = {"step": sum(s["steps"] for s in meta["stages"]), "cpu_min": round(meta["cpu_time_s"] / 60, 3),
           "wall_min": round(meta["train_time_s"] / 60, 3),
           **evaluate_run(run, cfg, args.evals.split(","), progress=False)}
    return {"config": str(preset(method)), "first_stage": {"method": base, "steps": first_steps},
            "scale": round(scale, 4), "stage_sizes": sizes, "stages": meta["stages"], "steps": end["step"],
            "curve": [*result["curve"], end],
            "random": result["random"]}  # the first stage's architecture


def raw_pixels(args: argparse.Namespace, any_run: Path) -> dict:
    """Raw pixels on the same hold-out (cached in ``--out``/raw.json)."""
    cache = Path(args.out) / "raw.json"
    key = {"holdout": args.holdout, "evals": args.evals}
    if cache.is_file() and json.loads(cache.read_text()).get("key") == key:
        return json.loads(cache.read_text())["scores"]
    cfg = run_config(any_run, [f"eval.holdout={args.holdout}"])
    scores = evaluate_run(any_run, cfg, args.evals.split(","), baseline="raw", progress=False)
    cache.write_text(json.dumps({"key": key, "scores": scores}, indent=2))
    return scores


def markdown_table(suite: dict) -> str:
    """One row per method (its final snapshot), then raw pixels; the random networks in a second table."""
    columns = [(k, h) for k, h in COLUMNS if k in suite["raw"]]
    head = "| method | steps | CPU-min | " + " | ".join(h for _, h in columns) + " |"
    rule = "|---" * (3 + len(columns)) + "|"
    rows = [head, rule]

    def cell(scores: dict, key: str) -> str:  # a curve measured before a column existed (knn200_top1) shows a dash
        return f"{scores[key]:.2f}" if key in scores else "–"

    for method, r in suite["methods"].items():
        last = r["curve"][-1]
        rows.append(f"| {method} | {last['step']} | {last['cpu_min']:.1f} | "
                    + " | ".join(cell(last, k) for k, _ in columns) + " |")
    rows.append("| raw pixels | | | " + " | ".join(cell(suite["raw"], k) for k, _ in columns) + " |")
    rows += ["", "Random-init network of each preset's architecture, same protocol:", "",
             "| method | " + " | ".join(h for _, h in columns) + " |", "|---" * (1 + len(columns)) + "|"]
    for method, r in suite["methods"].items():
        rows.append(f"| {method} (random) | " + " | ".join(cell(r["random"], k) for k, _ in columns) + " |")
    return "\n".join(rows) + "\n"


def plot_suite(suite: dict, path: Path) -> None:
    """20-NN and linear accuracy against training CPU-minutes: a line per method, raw pixels dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [k for k in ("knn_top1", "linear_top1") if k in suite["raw"]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics) + 1.5, 4), squeeze=False)
    for ax, key in zip(axes[0], metrics):
        for i, (method, r) in enumerate(suite["methods"].items()):  # 11 presets: the 10 colours come round again
            ax.plot([p["cpu_min"] for p in r["curve"]], [p[key] for p in r["curve"]], color=f"C{i % 10}",
                    linestyle="-" if i < 10 else "--", marker="os^DvP*Xh<>p"[i % 12], label=method)
        ax.axhline(suite["raw"][key], color="gray", linestyle="--", label="raw pixels")
        ax.set_xlabel("training CPU-minutes")
        ax.set_ylabel(f"{dict(COLUMNS)[key]} accuracy (%), held-out {suite['holdout']}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"CIFAR-10 laptop presets, {suite['cpu_minutes_budget']:g} CPU-minutes each, on {suite['cpu_model']} "
                 f"({suite['threads']} threads)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="CIFAR-10 as an image folder: DATA/train/<class>/*.jpg")
    parser.add_argument("--cpu-minutes", type=float, default=30.0, help="training budget of each method")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list of configs/cifar10/laptop/ presets")
    parser.add_argument("--holdout", type=float, default=0.1, help="held-out fraction of the training split")
    parser.add_argument("--points", type=int, default=3, help="evaluated snapshots along each run")
    parser.add_argument("--evals", default="knn,linear,lowshot,cluster")
    parser.add_argument("--calibration-steps", type=int, default=40, help="steps that measure CPU-s per step")
    parser.add_argument("--out", default="runs/laptop_suite")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every preset (e.g. for a smoke test); "
                        "stages.* ones to the staged presets only")
    args = parser.parse_args(argv)
    if not (Path(args.data) / "train").is_dir():
        raise SystemExit(f"error: {args.data} has no train/ folder; pass --data the folder that holds "
                         f"train/<class>/*.jpg (e.g. ../shared/data/cifar10)")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        preset(method)  # every name checked before any training
    Path(args.out).mkdir(parents=True, exist_ok=True)
    data_overrides = [f"data.root={args.data}", *args.overrides]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    done = {m: run_method(m, args, data_overrides) for m in methods} | finished_elsewhere(methods, args, data_overrides)
    results = {m: done[m] for m in dict.fromkeys([*METHODS, *methods]) if m in done}  # the suite's order
    suite = {"command": shlex.join(["python", "benchmarks/laptop_suite.py", *(argv or sys.argv[1:])]),
             "date": started, "cpu_model": cpu_model(), "threads": torch.get_num_threads(),
             "cpu_minutes_budget": args.cpu_minutes, "holdout": args.holdout,
             "raw": raw_pixels(args, Path(args.out) / methods[0] / "run"), "methods": results}
    out = Path(args.out)
    (out / "suite.json").write_text(json.dumps(suite, indent=2))
    (out / "suite.md").write_text(markdown_table(suite))
    plot_suite(suite, out / "suite.png")
    print(json.dumps(suite))
    return suite


if __name__ == "__main__":
    main()
