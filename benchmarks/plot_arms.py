"""Seeds of step- or cost-matched arms side by side: one dot per run, a bar at each group's mean.

    python benchmarks/plot_arms.py OUT.png LABEL=RESULT [LABEL=RESULT ...] [--line 1-shot=19.93]

RESULT is a ``curve.json`` written by ``benchmarks/accuracy_per_minute.py`` or ``laptop_suite.py`` (its last point
counts), or ``ARMS.jsonl:ARM``, one arm of ``benchmarks/gpu_arms.sh``'s output. Results with the same LABEL are one
group (its seeds). Draws one panel per metric (20-NN, linear, 1-shot, 5-shot) with ``--line NAME=VALUE`` dashed (a
bar to clear), and prints one JSON object: per group, its runs and each metric's mean and standard deviation.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METRICS = (("knn_top1", "20-NN"), ("linear_top1", "linear"), ("lowshot_1shot_mean", "1-shot"),
           ("lowshot_5shot_mean", "5-shot"))


def load_result(spec: str) -> dict:
    """The last curve point of one RESULT (see the module docstring)."""
    path, _, arm = spec.partition(".jsonl:")
    if arm:
        for line in Path(path + ".jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["arm"] == arm:
                if not row.get("result"):
                    raise SystemExit(f"arm {arm!r} in {path}.jsonl has no result (exit status {row.get('rc')})")
                return row["result"]["curve"][-1]
        raise SystemExit(f"no arm {arm!r} in {path}.jsonl")
    return json.loads(Path(spec).read_text())["curve"][-1]


def summarise(groups: dict[str, list[dict]]) -> dict:
    out = {}
    for label, points in groups.items():
        out[label] = {"runs": len(points)}
        for key, name in METRICS:
            values = [p[key] for p in points if key in p]
            if values:
                out[label][name] = {"mean": round(statistics.mean(values), 2),
                                    "std": round(statistics.stdev(values), 2) if len(values) > 1 else None}
    return out


def plot(groups: dict[str, list[dict]], lines: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.6))
    for ax, (key, name) in zip(axes, METRICS):
        for x, points in enumerate(groups.values()):
            values = [p[key] for p in points if key in p]
            ax.scatter([x] * len(values), values, s=18, color=f"C{x}")
            if values:
                ax.hlines(statistics.mean(values), x - 0.3, x + 0.3, color=f"C{x}")
        if name in lines:
            ax.axhline(lines[name], color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right", fontsize=7)
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("held-out accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the figure to write (.png)")
    parser.add_argument("results", nargs="+", help="LABEL=RESULT, RESULT a curve.json or ARMS.jsonl:ARM")
    parser.add_argument("--line", action="append", default=[], help="NAME=VALUE, a dashed line on panel NAME")
    args = parser.parse_args(argv)
    groups: dict[str, list[dict]] = {}
    for item in args.results:
        label, sep, spec = item.partition("=")
        if not sep:
            parser.error(f"{item!r} is not LABEL=RESULT")
        groups.setdefault(label, []).append(load_result(spec))
    lines = {}
    for item in args.line:
        name, sep, value = item.partition("=")
        if not sep or name not in {n for _, n in METRICS}:
            parser.error(f"--line {item!r}: give NAME=VALUE with NAME one of {[n for _, n in METRICS]}")
        lines[name] = float(value)
    plot(groups, lines, args.out)
    summary = summarise(groups)
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
