"""Training-step and augmentation throughput of one or more configs, measured side by side.

    python benchmarks/throughput.py configs/fashion_mnist/quickstart.yaml [more.yaml ...] [--steps 10] [-- key=value ...]
    python benchmarks/throughput.py configs/fashion_mnist/extrema.yaml --variant "method.mask_ratio=0.75" \
        --variant "method.mask_ratio=0.9 method.num_masks=1"

Prints one JSON object: a list of ``selfsup bench`` results (images/s of the full training step, of
the augmentation pipeline alone, their ratio, peak memory), one per config and ``--variant`` (a
space-separated list of overrides on top of the shared ones; none given: the config as it is).
Ratios are what to compare: the machine is shared and absolute speeds move from run to run.
"""

from __future__ import annotations

import argparse
import json
import sys

from selfsup.load import load_config
from selfsup.bench import bench


def main() -> None:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variant", action="append", default=None,
                        help="space-separated overrides measured as one more line per config (repeatable)")
    args = parser.parse_args(argv)
    variants = [v.split() for v in args.variant] if args.variant else [[]]
    results = [dict(config=path, variant=" ".join(variant),
                    **bench(load_config(path, [*overrides, *variant]), steps=args.steps, warmup=args.warmup))
               for path in args.configs for variant in variants]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
