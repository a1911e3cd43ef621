"""Where a MAST run's masks and its variance head sit: the diagnostic behind docs/reproductions.md ("MAST: why MAST-5
fell to raw pixels").

    python benchmarks/mast_masks.py RUN_DIR [--fraction 0.005] [--top 20]

Reads RUN_DIR/checkpoints/last.pt (masks M = ReLU(U) and the Gaussian head), applies the backbone and head to a seeded
``--fraction`` of the run's training images (0.005: 250 of CIFAR-10's 50,000; normalised as the run normalised them,
with the mean and std in RUN_DIR/backbone.json), and prints one JSON object:

- ``mask_mean`` and, per mask (one per augmentation op), how many of the embedding's dimensions carry more than half
  that mask's largest weight (``dims_above_half_max``): a mask that has shrunk onto a few dimensions shows here;
- ``corr_mask_weight_variance``: the correlation, over dimensions, between the masks' total weight on a dimension
  and the head's mean predicted variance there; near 1 means the head piles variance onto the dimensions the masks
  keep, which lets the masked distance fall with nothing learned;
- ``top_dims_variance_ratio``: the mean variance on the masks' ``--top`` heaviest dimensions over the mean variance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from selfsup.load import load_config
from selfsup.data.datasets import load_dataset
from selfsup.methods.assemble import build_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("--fraction", type=float, default=0.005)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()

    cfg = load_config(args.run / "config.yaml")
    if cfg.method["name"] != "mast":
        raise SystemExit(f"{args.run} is a {cfg.method['name']} run; this diagnostic reads MAST's masks")
    meta = json.loads((args.run / "backbone.json").read_text())
    state = torch.load(args.run / "checkpoints" / "last.pt", weights_only=True, map_location="cpu")
    _, method = build_model(cfg, meta["channels"], meta["image_size"], total_steps=1)
    method.load_state_dict(state["model"])
    method.eval()

    data = load_dataset(cfg.data.dataset, cfg.data.train_split, cfg.data.root, image_size=meta["image_size"],
                        channels=meta["channels"], fraction=args.fraction, progress=False)
    x = torch.as_tensor(data.images).float() / 255
    x = (x - torch.tensor(meta["mean"]).view(1, -1, 1, 1)) / torch.tensor(meta["std"]).view(1, -1, 1, 1)
    with torch.no_grad():
        _, var = method.embed(x)
        masks = method.masks.detach()  # (D, K)
    variance = var.mean(0)
    weight = masks.sum(1)
    top = weight.argsort(descending=True)[: args.top]
    print(json.dumps({
        "run": str(args.run),
        "step": int(state["step"]),
        "ops": list(cfg.method["ops"]),
        "mask_mean": round(masks.mean().item(), 4),
        "dims_above_half_max": [int((masks[:, k] > 0.5 * masks[:, k].max()).sum()) for k in range(masks.shape[1])],
        "corr_mask_weight_variance": round(torch.corrcoef(torch.stack([weight, variance]))[0, 1].item(), 3),
        "top_dims_variance_ratio": round((variance[top].mean() / variance.mean()).item(), 2),
        "variance_mean": round(variance.mean().item(), 4),
        "images": len(x),
    }))


if __name__ == "__main__":
    main()
