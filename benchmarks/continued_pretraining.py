"""Continued pretraining from a start against training from scratch, at equal CPU time (issue 49).

    python benchmarks/continued_pretraining.py --start-steps 600 --continue-steps 300 [--out runs/continued]

On CIFAR-10 with MSN's laptop preset (``configs/cifar10/laptop/msn.yaml``), one after the other on this machine:

1. **start**: MAE (``configs/cifar10/laptop/mae.yaml``'s method and optimiser) on MSN's ViT for ``--start-steps``,
   exported with ``selfsup export --format state_dict``. This stands in for the weights a user starts from;
2. **continued**: MSN from those weights (``model.init_weights``) for ``--continue-steps``;
3. **scratch**: MSN from a random start for as many steps as take the CPU time of 1 and 2 together (measured:
   the CPU seconds of the start, over the continued run's CPU seconds per step, plus the continued run's steps).

Both MSN runs are evaluated on the held-out 10 % of the training split (``eval.holdout=0.1``: kNN, linear, 1- and
5-shot, 1 %). Prints one JSON object: each arm's steps, CPU minutes and scores, and the CPU model.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from pretrain_eval import pretrain_and_evaluate  # noqa: E402
from suite_time import cpu_model  # noqa: E402

MSN = str(REPO / "configs" / "cifar10" / "laptop" / "msn.yaml")
MAE = str(REPO / "configs" / "cifar10" / "laptop" / "mae.yaml")
# MSN's ViT (vit_laptop with a full-resolution stem layer, learned positions), the data root from the repository.
COMMON = [f"data.root={REPO.parent / 'shared' / 'data' / 'cifar10'}", "trainer.num_threads=2",
          "monitor.collapse_every_steps=0"]
# mae.yaml's vit_custom made MSN's: vit_laptop (D 128, 4 blocks, 4 heads, MLP 2, patch 4) with msn.yaml's params.
MSN_VIT = ["model.params.depth=4", "model.params.pool=cls", "model.params.pos_embed=learned",
           "model.params.conv_stem=[32, 64, 128]", "model.params.conv_stem_strides=[1, 2, 2]"]


def cpu_seconds(run: Path) -> float:
    """The run's training CPU seconds (``cpu_time_s`` of the last row of metrics.csv)."""
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("cpu_time_s")]
    return float(rows[-1]["cpu_time_s"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-steps", type=int, default=600)
    parser.add_argument("--continue-steps", type=int, default=300)
    parser.add_argument("--out", default=str(REPO / "runs" / "continued"))
    args = parser.parse_args()
    out = Path(args.out)

    start = out / "start_mae"
    subprocess.run([sys.executable, "-m", "selfsup.cli", "pretrain", MAE, f"trainer.out={start}",
                    f"trainer.max_steps={args.start_steps}", *COMMON, *MSN_VIT], check=True)
    subprocess.run([sys.executable, "-m", "selfsup.cli", "export", str(start), "--format", "state_dict"], check=True)
    weights = start / "export" / "backbone_state_dict.safetensors"

    continued = pretrain_and_evaluate(MSN, [f"trainer.out={out / 'continued_msn'}",
                                            f"trainer.max_steps={args.continue_steps}",
                                            f"model.init_weights={weights}", *COMMON], compare="",
                                      evals="knn,linear,lowshot")
    start_cpu, continued_cpu = cpu_seconds(start), cpu_seconds(out / "continued_msn")
    scratch_steps = args.continue_steps + round(start_cpu / (continued_cpu / args.continue_steps))
    scratch = pretrain_and_evaluate(MSN, [f"trainer.out={out / 'scratch_msn'}", f"trainer.max_steps={scratch_steps}",
                                          *COMMON], compare="", evals="knn,linear,lowshot")
    scratch_cpu = cpu_seconds(out / "scratch_msn")
    keys = ("knn_top1", "linear_top1", "lowshot_1shot_mean", "lowshot_5shot_mean", "lowshot_1pct_mean")
    print(json.dumps({
        "cpu": cpu_model(),
        "start": {"method": "mae", "steps": args.start_steps, "train_cpu_min": round(start_cpu / 60, 2)},
        "continued": {"steps": args.continue_steps, "train_cpu_min": round(continued_cpu / 60, 2),
                      "total_train_cpu_min": round((start_cpu + continued_cpu) / 60, 2),
                      **{k: continued.get(k) for k in keys}},
        "scratch": {"steps": scratch_steps, "train_cpu_min": round(scratch_cpu / 60, 2),
                    **{k: scratch.get(k) for k in keys}},
    }))


if __name__ == "__main__":
    main()
