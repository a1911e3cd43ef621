"""Bad input through the CLI: exit code 2 and one line naming the key or file and the fix, never a traceback;
and the image-folder paths of pretrain / eval / embed with gray images, loose files and sub-folders."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from selfsup.cli import main
from tiny import ONE_BLOCK, QUICK_EVAL, tiny_yaml

RUN = {"model": ONE_BLOCK, "trainer": {"max_steps": 6, "batch_size": 32, "log_every_steps": 3,
                                       "checkpoint_every_steps": 3}, "eval": QUICK_EVAL}
CONFIG = tiny_yaml(RUN)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def gray_folder(tmp_path) -> Path:
    """Gray 8x8 PNGs of three digit classes: train/{0,1,2} and test/{1,2} (the test split lacks class 0)."""
    digits = load_digits()
    root = tmp_path / "gray"
    for split, classes, rows in (("train", (0, 1, 2), range(0, 300)), ("test", (1, 2), range(300, 450))):
        for i in rows:
            if digits.target[i] in classes:
                path = root / split / str(digits.target[i]) / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), mode="L").save(path)
    return root


@pytest.mark.parametrize("override, named", [
    ("data.dataset=foo", "data.dataset"),
    ("trainer.devices=0", "trainer.devices"),
    ("trainer.max_steps=-5", "trainer.max_steps"),
    ("data.image_size=0", "data.image_size"),
    ("data.channels=2", "data.channels"),
    ("trainer.checkpoint_every_steps=0", "trainer.checkpoint_every_steps"),
    ("trainer.log_every_steps=0", "trainer.log_every_steps"),
    ("trainer.batch_size=33 trainer.devices=2", "trainer.batch_size"),
    ("eval.holdout=1.5", "eval.holdout"),
])
def test_bad_config_values_fail_before_any_work(config, tmp_path, capsys, override, named):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", *override.split()]) == 2
    assert named in error_line(capsys)
    assert not run.exists()


@pytest.mark.parametrize("case, message", [
    ("empty", "no images"),
    ("no_root", "needs root"),
    ("corrupt", "none of the 2 images"),
    ("missing", "does not exist"),
])
def test_bad_image_folders_are_one_line_errors(config, tmp_path, capsys, case, message):
    folder = tmp_path / "images"
    folder.mkdir()
    if case == "corrupt":
        (folder / "a.png").write_bytes(b"not a png")
        (folder / "b.jpg").write_bytes(b"")
    root = {"no_root": [], "missing": [f"data.root={tmp_path / 'nowhere'}"]}.get(case, [f"data.root={folder}"])
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "data.dataset=imagefolder", *root]) == 2
    assert message in error_line(capsys)
    assert not run.exists()


def test_gray_image_folder_pretrain_eval_and_embed(config, tmp_path, gray_folder, capsys, caplog):
    run = tmp_path / "run"
    args = ["data.dataset=imagefolder", f"data.root={gray_folder}", "data.channels=1"]
    assert main(["pretrain", str(config), f"trainer.out={run}", *args]) == 0
    assert json.loads((run / "backbone.json").read_text())["channels"] == 1
    capsys.readouterr()
    # The eval split lacks class 0: its labels must still be the training split's (1 and 2, not 0 and 1).
    assert main(["eval", "knn", str(run)]) == 0
    knn = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert knn["knn_top1"] > 90  # 8x8 digits 1 vs 2 are easy; shifted labels would give ~0

    # embed: loose images beside a sub-folder; the row order is written beside the array.
    images = tmp_path / "mixed"
    (images / "sub").mkdir(parents=True)
    sources = sorted((gray_folder / "test").rglob("*.png"))
    for i, src in enumerate(sources[:3]):
        (images / f"{i}.png").write_bytes(src.read_bytes())
    (images / "sub" / "x.png").write_bytes(sources[3].read_bytes())
    (images / "sub" / "broken.png").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="selfsup"):
        assert main(["embed", str(run), str(images), str(tmp_path / "feats.npy")]) == 0
    assert "skipped 1 file" in caplog.text and "sub/broken.png: cannot decode" in caplog.text
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert np.load(tmp_path / "feats.npy").shape[0] == 4 and summary["skipped"] == 1
    assert (tmp_path / "feats.files.txt").read_text().splitlines() == ["0.png", "1.png", "2.png", "sub/x.png"]
    [skipped] = (tmp_path / "feats.skipped.txt").read_text().splitlines()
    assert skipped.startswith("sub/broken.png\tcannot decode")


def test_bad_exports_fail_fast_naming_the_file(config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    meta_path, weights = run / "backbone.json", run / "backbone.safetensors"
    meta = meta_path.read_text()

    meta_path.write_text("{not json")
    assert main(["eval", "knn", str(run)]) == 2
    assert "backbone.json is not valid JSON" in error_line(capsys)
    meta_path.write_text(json.dumps({**json.loads(meta), "channels": "gray"}))
    assert main(["embed", str(run), str(tmp_path), str(tmp_path / "x.npy")]) == 2
    assert "key 'channels'" in error_line(capsys)
    meta_path.write_text(meta)

    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    first = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[first] = tensors[first].fill_(float("nan"))
    save_file(tensors, weights)
    assert main(["eval", "all", str(run)]) == 2
    line = error_line(capsys)
    assert "backbone.safetensors holds non-finite values" in line and first in line


def test_resume_refusal_names_the_option_for_optimiser_changes(config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=3"]) == 0
    assert main(["pretrain", str(run), "optim.weight_decay=0.1", "model.params.width=16"]) == 2
    line = error_line(capsys)
    assert "model.params.width" in line and "--allow-optim-change" not in line
    assert main(["pretrain", str(run), "optim.weight_decay=0.1", "--allow-optim-change",
                 "model.params.width=16"]) == 2
    assert "model.params.width" in error_line(capsys)


def test_snapshots_are_exported_along_the_run_and_evaluate_like_the_run(config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.export_every_steps=2"]) == 0
    snapshots = sorted(p.name for p in (run / "snapshots").iterdir())
    assert snapshots == ["step_000002", "step_000004"]  # the final step is the run's own export
    meta = json.loads((run / "snapshots" / "step_000004" / "backbone.json").read_text())
    assert meta["steps"] == 4 and 0 < meta["cpu_time_s"] and 0 < meta["train_time_s"]
    capsys.readouterr()
    assert main(["eval", "knn", str(run / "snapshots" / "step_000002")]) == 0
    assert 0 < json.loads(capsys.readouterr().out.strip().splitlines()[-1])["knn_top1"] <= 100


def test_pretrain_refuses_an_nnclr_queue_as_large_as_the_dataset(tmp_path, capsys) -> None:
    """digits has 1,500 training images (its train split); a queue of 2,048 would hold every image's own last embedding."""
    path = tmp_path / "nnclr.yaml"
    path.write_text(tiny_yaml(RUN, method={"name": "nnclr", "projector": [16, 16, 8], "predictor": [16, 8],
                                           "queue_size": 2048}))
    assert main(["pretrain", str(path), f"trainer.out={tmp_path / 'run'}"]) == 2
    assert "method.queue_size: 2048 >= the 1500 training images" in error_line(capsys)
    assert not (tmp_path / "run").exists()
    stages = tmp_path / "stages.yaml"  # a stage's own method is checked too, on that stage's data fraction
    stages.write_text(tiny_yaml(RUN, method={"name": "nnclr", "projector": [16, 16, 8], "predictor": [16, 8],
                                             "queue_size": 512},
                                stages=[{"name": "a"}, {"name": "b", "data": {"fraction": 0.25}}]))
    assert main(["pretrain", str(stages), f"trainer.out={tmp_path / 'run2'}"]) == 2
    assert "method.queue_size: 512 >= the 375 training images" in error_line(capsys)
    from selfsup.config import ConfigError
    from selfsup.load import load_config
    from selfsup.launch import pretrain

    with pytest.raises(ConfigError, match="method.queue_size: 2048 >= the 1500 training images"):
        pretrain(load_config(path, [f"trainer.out={tmp_path / 'run3'}"]))  # the engine's entry checks it too
    assert not (tmp_path / "run3").exists()


@pytest.mark.parametrize("kind", ["knn", "linear", "lowshot", "cluster"])
def test_one_class_evaluation_data_is_refused_not_scored_100(config, tmp_path, gray_folder, capsys, kind):
    """Issue 50.8: data of one class made eval lowshot a traceback, and knn / linear / cluster report 100 %."""
    run = tmp_path / "run"
    args = ["data.dataset=imagefolder", f"data.root={gray_folder}", "data.channels=1"]
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=2", *args]) == 0
    for split in ("train", "test"):
        for other in ("0", "2"):
            shutil.rmtree(gray_folder / split / other, ignore_errors=True)
    capsys.readouterr()
    assert main(["eval", kind, str(run), *args, "eval.lowshot_shots=[1]"]) == 2
    assert "imagefolder/train holds images of 1 class only" in error_line(capsys)
