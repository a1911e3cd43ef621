"""The public API: selfsup.load_backbone / embed / pretrain / evaluate, as the command line computes them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import selfsup
from selfsup.cli import main

CONFIG = {
    "method": {"name": "vicreg", "expander": [32, 32]},
    "data": {"dataset": "digits"},
    "views": [{"preset": "minimal", "num": 2, "params": {"crop_scale": [0.5, 1.0]}}],
    "model": {"backbone": "resnet", "params": {"block": "basic", "layers": [1, 1], "width": 8, "small_stem": True}},
    "optim": {"name": "adamw", "lr": 0.002},
    "trainer": {"batch_size": 64, "log_every_steps": 5, "progress": False},
    "eval": {"linear_epochs": 2, "lowshot_shots": [1], "lowshot_splits": 1, "cluster_n_init": 1},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    # a dict config, keyword sections and a key=value override, as the command line takes them
    assert selfsup.pretrain(CONFIG, "trainer.max_steps=6", trainer={"out": str(out)}) == out
    return out


def test_import_is_cheap():
    code = "import sys, selfsup; print('torch' in sys.modules, callable(selfsup.load_backbone))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_load_backbone_and_preprocess_match_selfsup_embed(run_dir, tmp_path, capsys):
    model, preprocess = selfsup.load_backbone(run_dir)
    assert not model.training
    assert (preprocess.image_size, preprocess.channels) == (8, 1)
    meta = json.loads((run_dir / "backbone.json").read_text())
    assert preprocess.mean == tuple(meta["mean"]) and preprocess.std == tuple(meta["std"])
    rng = np.random.default_rng(0)
    images = tmp_path / "images"
    images.mkdir()
    pil = [Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)) for _ in range(3)]
    for i, image in enumerate(pil):
        image.save(images / f"{i}.png")
    assert main(["embed", str(run_dir), str(images), str(tmp_path / "out.npy"), "--workers", "0"]) == 0
    expected = torch.from_numpy(np.load(tmp_path / "out.npy"))
    batch = preprocess(pil)
    assert batch.shape == (3, 1, 8, 8) and batch.dtype == torch.float32
    with torch.no_grad():
        assert torch.allclose(model(batch), expected, atol=1e-5)  # PIL images
        assert torch.allclose(model(preprocess(images / "1.png")), expected[1:2], atol=1e-5)  # a path
    assert torch.allclose(selfsup.embed(run_dir, pil), expected, atol=1e-5)


def test_preprocess_takes_uint8_and_float_tensors(run_dir):
    model, preprocess = selfsup.load_backbone(run_dir)
    rgb = torch.randint(0, 256, (4, 3, 16, 12), dtype=torch.uint8)
    pixels = preprocess.pixels(rgb)
    assert pixels.shape == (4, 1, 8, 8) and pixels.dtype == torch.uint8  # gray, shorter side to 8, centre crop
    assert torch.equal(preprocess.pixels(rgb[0]), pixels[:1])  # one (C, H, W) image is a batch of one
    assert torch.allclose(preprocess(rgb.float() / 255), preprocess(rgb), atol=1e-6)
    assert torch.allclose(preprocess.normalize(torch.full((1, 1, 2, 2), preprocess.mean[0])), torch.zeros(1))
    with torch.no_grad():
        direct = model(preprocess(rgb))
    assert torch.allclose(selfsup.embed((model, preprocess), rgb, batch_size=3), direct, atol=1e-5)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        preprocess(rgb.float())
    with pytest.raises(TypeError, match="uint8"):
        preprocess(rgb.int())


def test_evaluate_is_the_cli_and_saves_json(run_dir, capsys):
    scores = selfsup.evaluate(run_dir, "knn", compare=["raw"])
    assert set(scores) == {"knn_top1", "knn_top5", "raw_knn_top1", "raw_knn_top5"}
    saved = json.loads((run_dir / "eval" / "knn.json").read_text())
    assert saved["result"] == scores and saved["baselines"] == ["backbone", "raw"]
    capsys.readouterr()
    assert main(["eval", "knn", str(run_dir), "eval.knn_k=5"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads((run_dir / "eval" / "knn.json").read_text())
    assert saved["overrides"] == ["eval.knn_k=5"] and saved["baselines"] == ["backbone"]
    assert {k: round(v, 4) for k, v in saved["result"].items()} == printed
