"""The GPU path: every CIFAR-10 laptop preset trains on CUDA in bf16-mixed, and the evaluation runs there.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``. Each preset keeps its
method, backbone, views and heads, on 48 random 32 px colour images, for 2 steps of a batch of 16 (its queue
shrunk below the dataset, which NNCLR requires). ``SELFSUP_TEST_ACCELERATOR=cpu`` runs the same on the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import selfsup
from selfsup.cli import main

ACCELERATOR = os.environ.get("SELFSUP_TEST_ACCELERATOR", "cuda")
pytestmark = pytest.mark.skipif(ACCELERATOR == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")
PRESETS = sorted(Path("configs/cifar10/laptop").glob("*.yaml"))
SMALL = {  # a queue smaller than the 48 images (NNCLR refuses one as large as the dataset)
    "nnclr": ["method.queue_size=32"],
    "mae_ct": ["stages.1.method.queue_size=32", "stages.2.method.queue_size=32"],
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(24):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "train" / label / f"{i}.jpg")
    return root


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_trains_in_bf16_and_evaluates(preset: Path, photos: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    overrides = [f"data.root={photos}", f"trainer.out={out}", f"trainer.accelerator={ACCELERATOR}",
                 "trainer.precision=bf16-mixed", "trainer.max_steps=2", "trainer.batch_size=16",
                 "trainer.progress=false", "monitor.knn_every_steps=0", *SMALL.get(preset.stem, [])]
    selfsup.pretrain(str(preset), *overrides)
    assert (out / "backbone.safetensors").is_file()
    capsys.readouterr()
    assert main(["eval", "knn", str(out), "eval.holdout=0.25"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= result["knn_top1"] <= 100.0
