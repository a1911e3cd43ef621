"""What a local crop costs (issue 51's multi-crop bar): DINO's CIFAR-10 laptop preset timed by ``selfsup bench`` with
its 2 global crops alone, and with 6 local crops of 16 px and of 32 px added, in one process, arms interleaved.

    python benchmarks/multicrop_cost.py [--data ../shared/data/cifar10] [--steps 6] [--repeats 3]

A local crop's cost is (step time with the 6 crops - step time without) / 6, per image; the ratio of that cost at 16 px
to that at 32 px should be about 1/4 (a quarter of the tokens and of the conv stem's pixels). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from accuracy_per_minute import cpu_model  # noqa: E402
from selfsup.bench import bench  # noqa: E402
from selfsup.load import load_config  # noqa: E402

PRESET = ROOT / "configs" / "cifar10" / "laptop" / "dino.yaml"
ARMS = {  # name -> overrides of the preset's views (views.2 is its 6 local crops of 16 px)
    "global_only": ["views=[{preset: dino_global1, num: 1, params: {blur_p: 0.0}}, "
                    "{preset: dino_global2, num: 1, params: {blur_p: 0.0}}]"],
    "local_16px": [],
    "local_32px": ["views.2.size=32"],
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cifar10"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):  # interleaved, so a machine that slows down slows every arm alike
        for arm, overrides in ARMS.items():
            cfg = load_config(PRESET, [f"data.root={args.data}", "data.fraction=0.05", *overrides])
            result = bench(cfg, steps=args.steps, warmup=2)
            seconds[arm].append(1.0 / result["train_images_per_s"])  # step seconds per image
    per_image = {arm: statistics.median(values) for arm, values in seconds.items()}
    crop_16 = (per_image["local_16px"] - per_image["global_only"]) / 6
    crop_32 = (per_image["local_32px"] - per_image["global_only"]) / 6
    out = {"benchmark": "multicrop_cost", "cpu": cpu_model(), "preset": str(PRESET.relative_to(ROOT)),
           "step_ms_per_image": {arm: round(1000 * s, 3) for arm, s in per_image.items()},
           "local_crop_ms_per_image": {"16px": round(1000 * crop_16, 3), "32px": round(1000 * crop_32, 3)},
           "cost_ratio_16_to_32": round(crop_16 / crop_32, 3), "steps": args.steps, "repeats": args.repeats,
           "command": "python benchmarks/multicrop_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
