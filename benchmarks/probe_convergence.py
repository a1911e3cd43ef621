"""Does the default linear probe converge? (issue 52, part 1) Our probe against the optimum of its own objective.

    python benchmarks/probe_convergence.py [--datasets digits] [--min-steps 0,5000,20000]

For each dataset (raw pixels, standardised with the training statistics as the probe does) and each ``min_steps``,
runs ``linear_probe`` with the default grid and 30 passes, then solves the same objective (mean cross-entropy +
wd / 2 ||W||^2 at the weight decay the probe chose) in float64 with full-batch L-BFGS: the converged reference. Reports
the objective's gap, both test accuracies and the probe's seconds. ``digits`` is scikit-learn's 1,500 / 297 split (6
Adam steps per pass at batch 256). ``fashion_mnist`` (60,000 / 10,000, 235 per pass) also runs, but its float64 L-BFGS
on 784 pixels took more than 8 minutes on a 2-core machine. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from accuracy_per_minute import cpu_model  # noqa: E402
from selfsup.data.datasets import load_dataset  # noqa: E402
from selfsup.eval.linear import linear_probe  # noqa: E402


def pixels(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    splits = ("train", "test")
    data = [load_dataset(name, split) for split in splits]
    flat = [d.images.reshape(len(d.images), -1).float() / 255 for d in data]
    return flat[0], torch.as_tensor(data[0].labels), flat[1], torch.as_tensor(data[1].labels)


def lbfgs(x: torch.Tensor, y: torch.Tensor, wd: float, classes: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The probe's objective, mean CE + wd / 2 ||W||^2 (bias not decayed), minimised by full-batch L-BFGS in float64:
    the converged reference, ``(minimum, W, b)`` (also tests/eval/test_linear.py's)."""
    x = x.double()
    w = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=5000, tolerance_grad=1e-12, tolerance_change=1e-15,
                            history_size=50, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + wd / 2 * w.square().sum()
        loss.backward()
        return loss

    opt.step(objective)
    with torch.no_grad():
        minimum = float(torch.nn.functional.cross_entropy(x @ w + b, y) + wd / 2 * w.square().sum())
    return minimum, w.detach(), b.detach()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits")
    parser.add_argument("--min-steps", default="0,5000,20000")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.datasets.split(","):
        train_x, train_y, test_x, test_y = pixels(name)
        mean, std = train_x.mean(0), train_x.std(0, unbiased=False)
        std = torch.where(std > 0, std, torch.ones_like(std))
        references: dict[float, tuple[float, float]] = {}
        for min_steps in (int(v) for v in args.min_steps.split(",")):
            start = time.perf_counter()
            result = linear_probe(train_x, train_y, test_x, test_y, epochs=30, min_steps=min_steps)
            seconds = time.perf_counter() - start
            wd = result["best_wd"]
            if wd not in references:
                minimum, w, b = lbfgs((train_x - mean) / std, train_y, wd, int(train_y.max()) + 1)
                logits = ((test_x - mean) / std).double() @ w + b
                accuracy = 100.0 * float((logits.argmax(1) == test_y).float().mean())
                references[wd] = (minimum, accuracy)
            minimum, accuracy = references[wd]
            rows.append({"dataset": name, "train": len(train_x), "min_steps": min_steps, "best_lr": result["best_lr"],
                         "best_wd": wd, "objective_gap": round(result["train_objective"] - minimum, 5),
                         "top1": round(result["top1"], 2), "lbfgs_top1": round(accuracy, 2),
                         "top1_minus_lbfgs": round(result["top1"] - accuracy, 2), "probe_s": round(seconds, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    out = {"benchmark": "probe_convergence", "cpu": cpu_model(), "rows": rows,
           "command": "python benchmarks/probe_convergence.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
