"""Fine-tuning evaluation: layer-wise lr decay groups, label subsets, and a tiny separable set learned to 100 %."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from selfsup.cli import main
from selfsup.eval.finetune import labelled_subset
from selfsup.train.optim import layer_ids
from selfsup.models import build_backbone
from tiny import tiny_yaml


def test_layer_ids_follow_the_depth() -> None:
    vit = build_backbone("vit", img_size=16, patch_size=4, in_channels=1, embed_dim=16, depth=3, num_heads=2)
    ids, depth = layer_ids(vit)
    assert depth == 3
    assert ids["patch_embed.weight"] == 0 and ids["blocks.0.attn.qkv.weight"] == 1
    assert ids["blocks.2.mlp.fc2.weight"] == 3 and all(v == 4 for k, v in ids.items() if k.startswith("norm"))
    resnet = build_backbone("resnet", block="basic", layers=[1, 1], width=8, small_stem=True)
    ids, depth = layer_ids(resnet)
    assert depth == 2 and ids["stem.0.weight"] == 0
    assert ids["layer1.0.conv1.weight"] == 1 and ids["layer2.0.conv1.weight"] == 2


def test_labelled_subset_is_stratified_and_seeded() -> None:
    labels = np.repeat(np.arange(4), 50)
    tenth = labelled_subset(labels, fraction=0.1, seed=1)
    assert np.bincount(labels[tenth]).tolist() == [5, 5, 5, 5]
    assert np.array_equal(tenth, labelled_subset(labels, fraction=0.1, seed=1))
    assert not np.array_equal(tenth, labelled_subset(labels, fraction=0.1, seed=2))
    assert np.bincount(labels[labelled_subset(labels, per_class=3)]).tolist() == [3, 3, 3, 3]
    assert len(labelled_subset(labels)) == 200


VIEW = {"preset": "minimal", "num": 1, "params": {"crop_scale": [0.8, 1.0], "hflip_p": 0.0}}
RUN = {"views": [VIEW, VIEW], "trainer": {"max_steps": 0, "batch_size": 16},
       "eval": {"finetune_epochs": 15, "finetune_batch_size": 16, "finetune_lr": 0.003, "finetune_warmup": 0.05}}


def separable(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Class 0: a bright top half; class 1: a bright bottom half; plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    images = torch.randint(0, 60, (n, 1, 12, 12), generator=g)
    images[labels == 0, :, :6] += 180
    images[labels == 1, :, 6:] += 180
    return {"images": images.clamp(0, 255).to(torch.uint8), "labels": labels}


def test_finetuning_learns_a_tiny_separable_set(tmp_path: Path, capsys) -> None:
    (tmp_path / "data").mkdir()
    torch.save(separable(64, 0), tmp_path / "data" / "train.pt")
    torch.save(separable(32, 1), tmp_path / "data" / "test.pt")
    config = tmp_path / "c.yaml"
    config.write_text(tiny_yaml(RUN, data={"dataset": "tensors", "root": str(tmp_path / "data")}))
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0  # max_steps 0: the initial backbone
    capsys.readouterr()
    assert main(["eval", "finetune", str(run), "--compare", "random"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["finetune_top1"] == 100.0 and result["random_finetune_top1"] == 100.0
    assert result["finetune_labels"] == 64
    assert main(["eval", "finetune", str(run), "eval.finetune_per_class=4", "eval.finetune_epochs=1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["finetune_labels"] == 8
    assert main(["eval", "finetune", str(run), "--baseline", "raw"]) == 2
    assert main(["eval", "finetune", str(run), "eval.finetune_per_class=40"]) == 2  # a class has 32 labelled images
    assert "eval.finetune_per_class=40" in capsys.readouterr().err
