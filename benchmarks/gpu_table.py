"""Issue 53's tables from the OUT_DIR of ``benchmarks/gpu_check.sh``, in markdown, with the GPU's name.

    python benchmarks/gpu_table.py OUT_DIR

Reads OUT_DIR/env.txt (its first line: nvidia-smi's name, memory, driver), OUT_DIR/bench.jsonl (``selfsup bench``
results, each with gpu_check.sh's step name and config) and OUT_DIR/sbs.jsonl (``benchmarks/anchors_cuda.py``'s
lines). Prints: the step per config and precision (images/s, GFLOPs per image, TFLOP/s, MFU, peak memory); bf16-mixed
against fp32; the loader against the step; selfsup's step against the authors'; the issue's goals, each met, missed
or not measured; and the steps that failed. Numbers are printed as measured: nothing is averaged or corrected.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CONFIG_NAMES = {"msn_vit_s16": "MSN ViT-S/16", "mae_vit_b16": "MAE ViT-B/16", "mast5_resnet50": "MAST-5 ResNet-50"}
# The goals of issue 53: selfsup's step against the authors', MAE's MFU in bf16, the loader against MSN's step.
SPEED_GOAL, MFU_GOAL, LOADER_GOAL = 1.5, 0.40, 1.2


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def device_name(out: Path) -> str:
    """The GPU's name from env.txt's first line (nvidia-smi: ``name, memory, driver``), or what env.txt says."""
    env = out / "env.txt"
    lines = env.read_text().splitlines() if env.is_file() else []
    if not lines or lines[0].startswith("no GPU"):
        return "no GPU (CPU)"
    name, *rest = (part.strip() for part in lines[0].split(","))
    return f"{name} ({', '.join(rest)})" if rest else name


def _label(config: str) -> str:
    return f"{CONFIG_NAMES.get(config, config)} (`{config}.yaml`)"


def _n(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _rate(value: float | None) -> str:
    """Images/s: whole numbers, a decimal below 100 (a dry run's CPU rates)."""
    return _n(value, 0 if value is None or value >= 100 else 1)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f} %"


def _verdict(value: float | None, goal: float) -> str:
    return "not measured" if value is None else ("met" if value >= goal else "missed")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def step_rows(bench: list[dict]) -> list[list[str]]:
    rows = []
    for r in bench:
        if "error" in r or r.get("data") != "synthetic":
            continue
        precision = r["precision"] + (", compiled" if r["name"].endswith("_compile") else "")
        rows.append([_label(r["config"]), precision, str(r["batch_size"]), _rate(r["train_images_per_s"]),
                     _n(r["gflops_per_image"], 1), _n(r["tflops_per_s"], 1), _pct(r["mfu"]),
                     _n(r["peak_memory_mib"]), r["peak_source"]])
    return rows


def precision_ratios(bench: list[dict]) -> dict[str, tuple[float, float, float]]:
    """config -> (fp32 images/s, bf16 images/s, bf16 / fp32), eager synthetic lines only."""
    speed: dict[str, dict[str, float]] = {}
    for r in bench:
        if "error" not in r and r.get("data") == "synthetic" and not r["name"].endswith("_compile"):
            speed.setdefault(r["config"], {})[r["precision"]] = r["train_images_per_s"]
    return {c: (s["32-true"], s["bf16-mixed"], s["bf16-mixed"] / s["32-true"])
            for c, s in speed.items() if "32-true" in s and "bf16-mixed" in s}


def loader_lines(bench: list[dict]) -> list[dict]:
    return [r for r in bench if "error" not in r and r.get("data") == "streamed"]


def tables(out: Path) -> str:
    bench, sbs = read_jsonl(out / "bench.jsonl"), read_jsonl(out / "sbs.jsonl")
    gpu = device_name(out)
    env = (out / "env.txt").read_text() if (out / "env.txt").is_file() else ""
    lines = [f"GPU: **{gpu}**", ""]
    if "dry run" in env:
        lines += ["**Dry run (GPU_CHECK_DRY=1): CPU, tiny sizes. Not a benchmark.**", ""]
    lines += [f"### selfsup's training step, `selfsup bench --synthetic` ({gpu})", ""]
    lines += _table(["config", "precision", "batch", "images/s", "GFLOPs/image", "TFLOP/s", "MFU", "peak MiB",
                     "peak from"], step_rows(bench)) + [""]

    ratios = precision_ratios(bench)
    lines += [f"### bf16-mixed against fp32 ({gpu})", ""]
    lines += _table(["config", "fp32 images/s", "bf16-mixed images/s", "bf16 / fp32"],
                    [[_label(c), _rate(f), _rate(b), f"{r:.2f}x"] for c, (f, b, r) in ratios.items()]) + [""]

    loaders = loader_lines(bench)
    lines += [f"### The streaming loader against the step ({gpu})", ""]
    lines += _table(["config", "precision", "batch", "workers", "loader images/s", "step images/s", "loader / step",
                     "decode ms/image", "bottleneck"],
                    [[_label(r["config"]), r["precision"], str(r["batch_size"]), str(r["loader_workers"]),
                      _rate(r["loader_images_per_s"]), _rate(r["train_images_per_s"]), f"{r['loader_to_train_ratio']:.2f}x",
                      _n(r["decode_ms_per_image"], 2), r["bottleneck"]] for r in loaders]) + [""]

    lines += [f"### The authors' step against selfsup's, same batch, input and precision ({gpu})", ""]
    lines += _table(["config", "precision", "implementation", "batch", "s/step", "images/s", "GFLOPs/step", "MFU",
                     "peak MiB", "speed vs the authors'"],
                    [[_label(r["config"]), r["precision"], r["impl"], str(r["batch"]), _n(r["step_s_mean"], 4),
                      _rate(r["images_per_s"]), _n(r["gflops_per_step"], 1), _pct(r["mfu"]), _n(r["peak_memory_mib"]),
                      f"{r['speed_vs_authors']:.2f}x" if "speed_vs_authors" in r else ""]
                     for r in sbs if "error" not in r]) + [""]

    speed = {r["config"]: r["speed_vs_authors"] for r in sbs
             if r["impl"] == "selfsup" and r["precision"] == "bf16-mixed" and "speed_vs_authors" in r}
    mae_mfu = next((r["mfu"] for r in bench if r.get("name") == "bench_mae_vit_b16_bf16" and "error" not in r), None)
    slowest_bf16 = min((r for _, _, r in ratios.values()), default=None)
    loader = min((r["loader_to_train_ratio"] for r in loaders if r["config"] == "msn_vit_s16"), default=None)
    goals = [
        (f"MSN ViT-S/16 step >= {SPEED_GOAL}x the authors' (bf16-mixed)", speed.get("msn_vit_s16"), SPEED_GOAL, "x"),
        (f"MAE ViT-B/16 step >= {SPEED_GOAL}x the authors' (bf16-mixed)", speed.get("mae_vit_b16"), SPEED_GOAL, "x"),
        (f"MFU >= {MFU_GOAL:.0%} for MAE ViT-B/16 in bf16-mixed", mae_mfu, MFU_GOAL, "%"),
        ("bf16-mixed faster than fp32 for every config (the slowest ratio)", slowest_bf16, 1.0, "x"),
        (f"loader >= {LOADER_GOAL}x the step's images/s for ViT-S/16", loader, LOADER_GOAL, "x"),
    ]
    lines += [f"### Issue 53's goals ({gpu})", ""]
    lines += _table(["goal", "measured", "verdict"],
                    [[text, "" if v is None else (_pct(v) if unit == "%" else f"{v:.2f}x"), _verdict(v, goal)]
                     for text, v, goal, unit in goals]) + [""]

    failed = [f"- {r.get('name') or r['impl'] + ' ' + r['config'] + ' ' + r['precision']}: "
              f"{' '.join(str(r['error']).split())[-300:]}" for r in bench + sbs if "error" in r]
    if failed:
        lines += ["### Failed or skipped", ""] + failed + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="the OUT_DIR of benchmarks/gpu_check.sh")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    if not (out / "bench.jsonl").is_file() and not (out / "sbs.jsonl").is_file():
        parser.error(f"{out} has neither bench.jsonl nor sbs.jsonl: is it the OUT_DIR of benchmarks/gpu_check.sh?")
    print(tables(out))


if __name__ == "__main__":
    main()
