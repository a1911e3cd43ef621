"""The papers' trends from a laptop suite's runs: one figure per comparison, curves against training CPU-minutes.

    python benchmarks/suite_trends.py --suite runs/laptop_suite [--out docs/figures] [--prefix cifar10_]

Reads ``<suite>/<method>/curve.json`` (written by ``benchmarks/laptop_suite.py``) and ``<suite>/raw.json``. For each
comparison whose methods are all in the suite, writes ``<out>/<prefix><name>.png``: 20-NN and linear accuracy along
each run against its training CPU-minutes, and the label-scarce evaluations (1-shot, 5-shot, 1 %, k-means) at each
run's end, raw pixels dashed. Prints one JSON object: per comparison, each method's end point and the differences
from the comparison's first method.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# name: (methods, the paper's claim the figure checks); the first method is the reference.
COMPARISONS = {
    "mae_ct": (("mae", "mae_ct"), "MAE-CT: MAE then contrastive tuning, against MAE, at one budget"),
    "mast": (("vicreg", "mast5", "mast15"), "MAST: low-shot above VICReg; MAST-15 above MAST-5"),
    "multiview": (("vicreg", "multiview_vicreg"), "Multi-view: more views with a small projector"),
    "vit": (("msn", "extrema", "mae"), "The ViT methods at one budget"),
    "simclr": (("simclr", "mast5", "multiview_vicreg"), "MAST and multi-view VICReg against SimCLR, their papers' "
                                                        "contrastive baseline"),
    "ema": (("byol", "mocov3"), "MoCo v3 (ExtreMA's base: an EMA target with negatives) beside BYOL (without)"),
    "distillation": (("msn", "dino", "ibot"), "MSN ahead of DINO and iBOT in low-shot (MSN Tab. 1-2, ExtreMA); DINO at "
                                              "least level with MSN at equal CPU (issue 51)"),
}
CURVES = (("knn_top1", "20-NN"), ("linear_top1", "linear"))
END = (("lowshot_1shot_mean", "1-shot"), ("lowshot_5shot_mean", "5-shot"), ("lowshot_1pct_mean", "1 %"),
       ("cluster_acc", "k-means"))


def load(suite: Path) -> tuple[dict[str, dict], dict]:
    runs = {p.parent.name: json.loads(p.read_text()) for p in sorted(suite.glob("*/curve.json"))}
    raw_file = suite / "raw.json"
    raw = json.loads(raw_file.read_text())["scores"] if raw_file.is_file() else {}
    return runs, raw


def summarise(methods: tuple[str, ...], runs: dict[str, dict]) -> dict:
    ends = {m: {"step": runs[m]["curve"][-1]["step"], "cpu_min": runs[m]["curve"][-1]["cpu_min"],
                **{k: runs[m]["curve"][-1][k] for k, _ in (*CURVES, *END) if k in runs[m]["curve"][-1]}}
            for m in methods}
    first = ends[methods[0]]
    gains = {m: {k: round(v - first[k], 2) for k, v in ends[m].items() if k in first and k != "step"}
             for m in methods[1:]}
    return {"ends": ends, f"minus_{methods[0]}": gains}


def plot(name: str, methods: tuple[str, ...], claim: str, runs: dict[str, dict], raw: dict, path: Path,
         cpu_model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, label) in zip(axes[:2], CURVES):
        for i, m in enumerate(methods):  # styles differ so that curves that share points (a staged run's first
            points = [p for p in runs[m]["curve"] if key in p]  # stage is another method's run) stay visible
            ax.plot([p["cpu_min"] for p in points], [p[key] for p in points], label=m, marker="os^"[i % 3],
                    linestyle=("-", "--", ":")[i % 3], linewidth=max(3.0 - 1.0 * i, 1.0))
        if key in raw:
            ax.axhline(raw[key], color="gray", linestyle="--", label="raw pixels")
        ax.set_xlabel("training CPU-minutes")
        ax.set_ylabel(f"{label} accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    keys = [(k, label) for k, label in END if all(k in runs[m]["curve"][-1] for m in methods)]
    width = 0.8 / (len(methods) + 1)
    for i, m in enumerate(methods):
        axes[2].bar([j + i * width for j in range(len(keys))], [runs[m]["curve"][-1][k] for k, _ in keys], width,
                    label=f"{m} ({runs[m]['curve'][-1]['cpu_min']:.1f} CPU-min)")
    if keys and all(k in raw for k, _ in keys):
        axes[2].bar([j + len(methods) * width for j in range(len(keys))], [raw[k] for k, _ in keys], width,
                    color="lightgray", label="raw pixels")
    axes[2].set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [label for _, label in keys])
    axes[2].set_ylabel("accuracy at the run's end (%)")
    axes[2].legend(fontsize=7)
    axes[2].grid(alpha=0.3, axis="y")
    fig.suptitle(f"{claim} (held-out; {cpu_model})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", required=True, help="a benchmarks/laptop_suite.py --out folder")
    parser.add_argument("--out", default="docs/figures")
    parser.add_argument("--prefix", default="cifar10_")
    args = parser.parse_args(argv)
    suite = Path(args.suite)
    runs, raw = load(suite)
    if not runs:
        raise SystemExit(f"error: no <method>/curve.json in {suite}; run benchmarks/laptop_suite.py --out {suite} first")
    cpu = json.loads((suite / "suite.json").read_text()).get("cpu_model", "") if (suite / "suite.json").is_file() else ""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = {}
    for name, (methods, claim) in COMPARISONS.items():
        if all(m in runs for m in methods):
            plot(name, methods, claim, runs, raw, Path(args.out) / f"{args.prefix}{name}.png", cpu)
            result[name] = summarise(methods, runs)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
