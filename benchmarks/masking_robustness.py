"""Robustness of ViT features to test-time masking (MSN, Assran et al. 2022, Tab. 16).

    python benchmarks/masking_robustness.py RUN_DIR [RUN_DIR ...] [--ratios 0.15,0.3,0.5,0.7,0.9] [--limit 2000]

For each run's exported ViT and each eval mask ratio r: the mean cosine similarity between the
feature of a test image and the feature of the same image with a random fraction r of its patch
tokens dropped (per-image masks from a seeded generator, so every run sees the same masks). MSN
trains its anchors on masked views, so its features should stay close to 1 as r grows, while a
no-mask joint-embedding model's (DINO in the paper) fall off. Prints one JSON list, one object
per run: ``{"run", "mask_ratio_<r>": mean cosine, ...}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.checkpoint import load_backbone
from selfsup.data.datasets import load_dataset
from selfsup.data.masking import random_keep_indices
from selfsup.eval.features import extract_features
from selfsup.eval.run import evaluation_split, run_config
from selfsup.models.vit import VisionTransformer


class MaskedEncoder(nn.Module):
    """A ViT that drops a random fraction of each image's patch tokens before encoding."""

    def __init__(self, vit: VisionTransformer, mask_ratio: float, seed: int) -> None:
        super().__init__()
        self.vit, self.mask_ratio = vit, mask_ratio
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.vit.grid_for(x.shape[2], x.shape[3])
        keep = random_keep_indices(len(x), grid[0] * grid[1], self.mask_ratio, generator=self.generator,
                                   device=x.device)
        return self.vit(x, keep)


def masked_similarities(run_dir: Path, ratios: list[float], limit: int, seed: int = 0) -> dict[str, float]:
    cfg = run_config(run_dir, [])
    vit, meta = load_backbone(run_dir)
    if not isinstance(vit, VisionTransformer):
        raise SystemExit(f"{run_dir}: test-time masking needs a ViT backbone, got {meta['backbone']}")
    split = evaluation_split(cfg).name or cfg.data.train_split  # a hold-out's images are the training split's
    data = load_dataset(cfg.data.dataset, split, root=cfg.data.root, image_size=cfg.data.image_size,
                        channels=cfg.data.channels, progress=False)
    images = data.images[torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:limit]]
    mean = torch.tensor(meta["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(meta["std"]).view(1, -1, 1, 1)

    def normalize(x: torch.Tensor) -> torch.Tensor:
        return (x - mean) / std

    clean = extract_features(vit, images, transform=normalize, device="cpu")
    result: dict[str, float] = {"run": str(run_dir), "images": len(images)}
    for ratio in ratios:
        masked = extract_features(MaskedEncoder(vit, ratio, seed), images, transform=normalize, device="cpu")
        result[f"mask_ratio_{ratio}"] = round(F.cosine_similarity(clean, masked, dim=1).mean().item(), 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--ratios", default="0.15,0.3,0.5,0.7,0.9")
    parser.add_argument("--limit", type=int, default=2000, help="test images used (a seeded random subset)")
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    print(json.dumps([masked_similarities(run, ratios, args.limit) for run in args.runs]))


if __name__ == "__main__":
    main()
