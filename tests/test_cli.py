"""End-to-end CLI: pretrain -> resume -> eval/embed/bench on scikit-learn's 8x8 digits (fast, offline)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from labelled_photos import labelled_run
from selfsup.cli import main
from tiny import ADAMW, tiny_yaml

# accelerator cpu: a resume is bit-exact on the CPU; CUDA's kernels (cuDNN, atomics) are not deterministic
VIEW = {"preset": "minimal", "num": 1, "params": {"crop_scale": [0.5, 1.0]}}
RUN = {"method": {"name": "vicreg", "expander": [64, 64]}, "views": [VIEW, VIEW],
       "optim": {**ADAMW, "warmup_epochs": 0.5},
       "trainer": {"epochs": 2, "log_every_steps": 5, "checkpoint_every_steps": 4, "accelerator": "cpu"},
       "eval": {"linear_epochs": 5, "lowshot_shots": [1, 5], "lowshot_splits": 2, "cluster_n_init": 1}}
TINY = tiny_yaml(RUN)


def write_config(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return path


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def table_lines(err: str) -> list[str]:
    """The score table `selfsup eval` prints at the end of stderr: from its header row (metric ...) on."""
    lines = err.splitlines()
    return lines[max(i for i, line in enumerate(lines) if line.startswith("metric ")):]


def test_pretrain_writes_run_directory_and_eval_prints_json(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(write_config(tmp_path)), f"trainer.out={run}"]) == 0
    for name in ("config.yaml", "metrics.csv", "checkpoints/last.pt", "backbone.safetensors", "backbone.json"):
        assert (run / name).is_file(), name
    assert list((run / "plots").glob("loss.png"))
    rows = (run / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,epoch,lr,loss,invariance")
    assert len(rows) > 2

    capsys.readouterr()
    assert main(["eval", "knn", str(run)]) == 0
    knn = last_json(capsys)
    assert 10.0 < knn["knn_top1"] <= 100.0

    assert main(["eval", "all", str(run), "--compare", "raw,random"]) == 0
    result = last_json(capsys)
    for key in ("knn_top1", "raw_knn_top1", "random_knn_top1", "linear_top1", "raw_linear_top1",
                "lowshot_1shot_mean", "lowshot_5shot_mean", "cluster_acc", "raw_cluster_nmi"):
        assert key in result, key
    assert result["raw_knn_top1"] > 90  # raw 8x8 digits are easy for kNN


def test_eval_of_a_csv_labelled_folder_prints_a_table_on_stderr_and_the_json_alone_on_stdout(tmp_path, capsys):
    """A flat folder, 30 of its 60 images labelled in a CSV: `eval all` on a hold-out (no val or test), the 50-shot
    count dropped (10 labelled per class), a table per metric on stderr, one JSON line on stdout for scripts."""
    run, _, labels = labelled_run(tmp_path, "eval.lowshot_shots=[1, 50]", "eval.lowshot_percents=[]")
    capsys.readouterr()
    assert main(["eval", "all", str(run), "--compare", "raw"]) == 0
    captured = capsys.readouterr()
    [line] = captured.out.splitlines()  # the JSON line alone
    result = json.loads(line)
    assert "lowshot_1shot_mean" in result and not [k for k in result if "50shot" in k]
    header, *rows = table_lines(captured.err)
    assert header.split() == ["metric", "backbone", "raw"]
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    shown = [k for k in result if not k.startswith("raw_") and not k.endswith(("_lr", "_wd", "_splits"))]
    assert list(cells) == shown  # every score a row; the chosen hyperparameters and per-split lists stay in the JSON
    for key, (backbone, raw) in cells.items():
        assert (backbone, raw) == (f"{result[key]:.2f}", f"{result['raw_' + key]:.2f}"), key

    assert main(["eval", "knn", str(run)]) == 0  # without baselines: a table of one column
    captured = capsys.readouterr()
    top1 = json.loads(captured.out)["knn_top1"]
    assert table_lines(captured.err) == [f"{'metric':<10}{'backbone':>12}", f"{'knn_top1':<10}{top1:>12.2f}",
                                         f"{'knn_top5':<10}{json.loads(captured.out)['knn_top5']:>12.2f}"]
    labels.write_text("img_00.png,red\nimg_01.png,green\nimg_02.png,blue\nimg_00.png,green\n")
    assert main(["eval", "knn", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"error: data.labels: {labels} lines 1 and 4 give img_00.png two labels (red, green)" in err


def test_the_evaluation_split_and_the_labels_may_change_when_a_run_is_resumed(tmp_path, capsys):
    """data.eval_split and data.labels say what evaluation and the monitor read, not what trains: a run saved with
    eval_split: test (before auto was the default) resumes from a YAML without the key, and a CSV of labels may be
    added to a run of a folder of photos later."""
    run, root, labels = labelled_run(tmp_path)
    cfg = write_config(tmp_path, tiny_yaml(RUN, data={"dataset": "imagefolder", "root": str(root), "image_size": 8}))
    steps = ["trainer.max_steps=2", "trainer.batch_size=16", f"trainer.out={tmp_path / 'new'}"]
    assert main(["pretrain", str(cfg), *steps, "data.eval_split=test"]) == 0
    assert main(["pretrain", str(cfg), *steps]) == 0
    assert main(["pretrain", str(cfg), *steps, f"data.labels={labels}"]) == 0
    assert main(["pretrain", str(cfg), *steps, "data.image_size=4"]) == 2  # what trains is still checked
    assert "different config" in capsys.readouterr().err


def test_resnet_trained_on_views_smaller_than_the_images_is_evaluated_at_the_images_size(tmp_path, capsys):
    """resnet_30min.yaml trains on 22 px views of 28 px images: the export records the data's size, not the views',
    and evaluation embeds whole images at that size."""
    run = tmp_path / "run"
    text = tiny_yaml(RUN, views=[{**VIEW, "size": 6}] * 2)
    assert text.count("size: 6") == 2
    assert main(["pretrain", str(write_config(tmp_path, text)), f"trainer.out={run}"]) == 0
    assert json.loads((run / "backbone.json").read_text())["image_size"] == 8  # digits are 8 x 8
    capsys.readouterr()
    assert main(["eval", "knn", str(run)]) == 0
    assert 10.0 < last_json(capsys)["knn_top1"] <= 100.0


def test_rerun_of_finished_run_is_a_noop_and_changed_config_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = write_config(tmp_path)
    assert main(["pretrain", str(cfg), f"trainer.out={run}"]) == 0
    before = load_file(run / "backbone.safetensors")
    assert main(["pretrain", str(run)]) == 0  # resume a finished run: nothing to train
    after = load_file(run / "backbone.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert main(["pretrain", str(cfg), f"trainer.out={run}", "optim.lr=0.5"]) == 2
    assert "different config" in capsys.readouterr().err


def test_killed_and_resumed_run_ends_with_the_same_weights(tmp_path):
    """SIGKILL a pretraining process after its first checkpoint, resume it, compare with an uninterrupted run."""
    cfg = write_config(tmp_path)
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert main(["pretrain", str(cfg), f"trainer.out={reference}"]) == 0

    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", "import sys, torch; torch.set_num_threads(1); from selfsup.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "pretrain", str(cfg), f"trainer.out={resumed}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = resumed / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    step, saved_time = saved["step"], saved["train_time_s"]
    assert 0 < step < 46
    assert not (resumed / "backbone.safetensors").exists()

    assert main(["pretrain", str(resumed)]) == 0
    a, b = load_file(reference / "backbone.safetensors"), load_file(resumed / "backbone.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    with (resumed / "metrics.csv").open() as f:  # training time is continued across the resume, never reset
        rows = [(int(row["step"]), float(row["train_time_s"])) for row in csv.DictReader(f)]
    times, after_resume = [t for _, t in rows], [t for s, t in rows if s > step]
    # Times are rounded to 0.01 s: two rows one fast step apart (the last two) may be equal on a fast machine.
    assert saved_time > 0 and times[0] > 0 and after_resume and min(after_resume) >= saved_time
    assert all(b >= a for a, b in zip(times, times[1:])) and times[-1] > saved_time


def test_bad_config_fails_before_work_naming_the_key(tmp_path, capsys):
    cfg = write_config(tmp_path)
    assert main(["pretrain", str(cfg), "optim.lrr=0.1", f"trainer.out={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert "optim.lrr" in err and "allowed keys" in err
    assert main(["pretrain", str(cfg), "optim.name=adamx", f"trainer.out={tmp_path / 'x'}"]) == 2
    assert "adamw" in capsys.readouterr().err
    assert main(["pretrain", str(cfg), "method.name=simclr", f"trainer.out={tmp_path / 'x'}"]) == 2
    assert "vicreg" in capsys.readouterr().err
    assert main(["pretrain", str(cfg), "views.0.params.crop_scalez=1", f"trainer.out={tmp_path / 'x'}"]) == 2
    assert "crop_scalez" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_corrupt_checkpoint_is_reported_not_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "last.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"not a checkpoint")
    assert main(["pretrain", str(write_config(tmp_path)), f"trainer.out={run}"]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert ckpt.read_bytes() == b"not a checkpoint"


def test_embed_and_bench(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    cfg = write_config(tmp_path)
    assert main(["pretrain", str(cfg), f"trainer.out={run}", "trainer.epochs=0.5"]) == 0
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(images / f"{i}.png")
    (images / "broken.jpg").write_bytes(b"garbage")
    (images / "IMG_1.HEIC").write_bytes(b"a phone's photo")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the files not used are logged and listed, never a Python warning
        assert main(["embed", str(run), str(images), str(tmp_path / "out.npy")]) == 0
    summary = last_json(capsys)
    feats = np.load(tmp_path / "out.npy")
    assert feats.shape == (5, 16) and summary["skipped"] == 2
    listed = (tmp_path / "out.skipped.txt").read_text().splitlines()
    assert [line.split("\t")[0] for line in listed] == ["IMG_1.HEIC", "broken.jpg"]
    assert listed[0].split("\t")[1].startswith("HEIC/HEIF is not read; convert it to JPEG")
    assert listed[1].split("\t")[1] == "cannot decode (UnidentifiedImageError: cannot identify image file)"
    assert f"skipped 1 file of 7 in {images}: IMG_1.HEIC: HEIC/HEIF is not read" in caplog.text
    assert f"skipped 1 file in {images}: broken.jpg: cannot decode" in caplog.text

    assert main(["bench", str(cfg), "--steps", "2", "--warmup", "1"]) == 0
    b = last_json(capsys)
    assert b["train_images_per_s"] > 0 and b["augment_images_per_s"] > 0 and b["peak_memory_mib"] > 0
    assert b["precision"] == "32-true"


def test_embed_lists_names_that_are_not_utf8_and_a_failed_embed_keeps_the_previous_output(tmp_path, capsys,
                                                                                          monkeypatch):
    """Issue 50.2: a file name that is not valid UTF-8 was a UnicodeEncodeError after OUT.npy had been replaced and
    OUT.files.txt emptied; an unwritable OUT was found only after every feature was computed."""
    run = tmp_path / "run"
    assert main(["pretrain", str(write_config(tmp_path)), f"trainer.out={run}", "trainer.max_steps=2"]) == 0
    rng = np.random.default_rng(0)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder, count in zip(folders, (4, 2)):
        folder.mkdir()
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    odd = os.fsdecode(b"caf\xe9.png")  # Latin-1 bytes: not valid UTF-8
    Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(folders[1] / odd)
    out, listing = tmp_path / "x.npy", tmp_path / "x.files.txt"
    assert main(["embed", str(run), str(folders[0]), str(out), "--workers", "0"]) == 0
    before = out.read_bytes(), listing.read_bytes()

    # The disk full while the list is written (after the array): the previous array and list stay as they were.
    real_write_bytes = Path.write_bytes

    def disk_full_at_the_list(self, data):
        if ".x.files.txt." in self.name:
            raise OSError(28, "No space left on device")
        return real_write_bytes(self, data)

    monkeypatch.setattr(Path, "write_bytes", disk_full_at_the_list)
    capsys.readouterr()
    assert main(["embed", str(run), str(folders[1]), str(out), "--workers", "0"]) == 2
    assert "error: No space left on device (errno 28); free space on that disk" in capsys.readouterr().err
    monkeypatch.undo()
    assert (out.read_bytes(), listing.read_bytes()) == before and len(before[1].splitlines()) == 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left

    # The name that is not UTF-8 is listed as its bytes, and opens its file.
    assert main(["embed", str(run), str(folders[1]), str(out), "--workers", "0"]) == 0
    names = listing.read_bytes().splitlines()
    assert np.load(out).shape[0] == len(names) == 3 and b"caf\xe9.png" in names
    assert all((folders[1] / os.fsdecode(name)).is_file() for name in names)

    # An output folder that cannot be made is refused before any feature is computed.
    import selfsup.eval.features

    def no_features(*args, **kwargs):
        raise AssertionError("features computed before the output path was checked")

    monkeypatch.setattr(selfsup.eval.features, "extract_features", no_features)
    (tmp_path / "file").write_text("")
    capsys.readouterr()
    assert main(["embed", str(run), str(folders[0]), str(tmp_path / "file" / "x.npy")]) == 2
    assert "cannot create the output folder" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_two_process_ddp_run_on_cpu(tmp_path):
    """``trainer.devices=2`` on CPU: Fabric launches 2 gloo processes, each on half of the global batch."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "selfsup.cli", "pretrain", str(write_config(tmp_path)), f"trainer.out={run}",
           "trainer.devices=2", "trainer.accelerator=cpu", "trainer.epochs=0.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cpu x2" in proc.stderr
    assert (run / "backbone.safetensors").is_file()
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 12  # round(0.5 * (1500 // 64)): the global batch is split over the 2 processes
