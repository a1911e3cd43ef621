"""Streaming runs end to end through the CLI: pretrain from a JPEG folder with an unreadable file (counted in
metrics.csv), a kill inside the optimiser step resumed to the same weights as an uninterrupted run, evaluation
and bench reading the files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from data.test_stream import make_folder
from selfsup.cli import main
from test_reliability import SIGNAL_IN_OPTIMIZER_STEP, assert_same_state, cli, finish, resume

# The folder's broken file is deliberate: its replacement is asserted from the logs, its warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore:skipped 1 unreadable images")

# accelerator cpu: a resume is bit-exact on the CPU; CUDA's kernels (cuDNN, atomics) are not deterministic
STREAMING = """
method: {{name: vicreg, expander: [64, 64]}}
data: {{dataset: imagefolder, root: {root}, eval_split: val, image_size: 16, stream: true, num_workers: 2}}
views:
  - {{preset: simclr_cifar, num: 1, params: {{crop_scale: [0.3, 1.0]}}}}
  - {{preset: simclr_cifar, num: 1, params: {{crop_scale: [0.3, 1.0]}}}}
model:
  backbone: resnet
  params: {{block: basic, layers: [1, 1], width: 8, small_stem: true}}
optim: {{name: adamw, lr: 0.002, warmup_epochs: 0.5}}
trainer: {{epochs: 4, batch_size: 16, log_every_steps: 4, checkpoint_every_steps: 4, progress: false,
           accelerator: cpu}}
monitor: {{knn_every_steps: 10, knn_train_size: 40, knn_test_size: 10}}
eval: {{linear_epochs: 3, lowshot_shots: [1], lowshot_splits: 1, cluster_n_init: 1}}
"""
TOTAL_STEPS = 4 * (40 // 16)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    make_folder(root / "train", per_class=20)
    make_folder(root / "val", per_class=5)
    (root / "train" / "c1" / "007.jpg").write_bytes(b"\xff\xd8 truncated")
    path = root / "streaming.yaml"
    path.write_text(STREAMING.format(root=root))
    return path


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("reference") / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"]))
    assert code == 0, err[-2000:]
    assert "data: streaming imagefolder/train (40 images) with 2 loader workers" in err
    assert err.count("unreadable image replaced by another: c1/007.jpg") == 1  # once, although met every epoch
    return run


def unreadable_counts(run: Path) -> list[int]:
    with (run / "metrics.csv").open() as f:
        return [int(r["unreadable_images"]) for r in csv.DictReader(f) if r.get("unreadable_images")]


def test_streaming_run_counts_unreadable_images_in_metrics(reference: Path) -> None:
    with (reference / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r["loss"]][-1] == TOTAL_STEPS
    counts = [int(r["unreadable_images"]) for r in rows if r.get("unreadable_images")]
    assert counts == sorted(counts) and counts[-1] >= 1  # cumulative over the run
    assert any(r.get("knn_top1") for r in rows)  # the kNN monitor reads its images from the files too


def test_a_kill_inside_the_optimizer_step_resumes_to_the_same_weights(config, reference, tmp_path) -> None:
    run = tmp_path / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"], SIGNAL_IN_OPTIMIZER_STEP.format(k=6, signal="SIGINT")))
    assert code == 130 and "stopped: SIGINT at step 6; checkpoint saved" in err, err[-2000:]
    before = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True).get("unreadable_images")
    resume(run)
    assert_same_state(reference, run)
    # The count of replaced images goes on from the checkpoint's (it restarted at 0 after a resume).
    assert unreadable_counts(run)[-1] == unreadable_counts(reference)[-1]
    assert before is not None and before >= 1


def test_eval_and_bench_stream_the_files(config, reference, capsys) -> None:
    assert main(["eval", "knn", str(reference), "--compare", "raw"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= result["knn_top1"] <= 100 and "raw_knn_top1" in result
    assert main(["bench", str(config), "--steps", "2", "--warmup", "1"]) == 0
    bench = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert bench["loader_workers"] == 2 and bench["loader_images_per_s"] > 0 and bench["decode_ms_per_image"] > 0
    assert bench["loader_to_train_ratio"] == pytest.approx(bench["loader_images_per_s"] / bench["train_images_per_s"],
                                                            rel=0.02)


@pytest.mark.multiprocess
def test_two_process_streaming_run(config, tmp_path) -> None:
    """``trainer.devices=2``: Fabric's 2 gloo processes each stream their half of every batch with their own workers."""
    run = tmp_path / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}", "trainer.devices=2",
                            "trainer.accelerator=cpu", "trainer.epochs=2", "data.num_workers=1",
                            "monitor.knn_every_steps=0"]))
    assert code == 0 and "cpu x2" in err, err[-3000:]
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["step"]) == 4 and "unreadable_images" in rows[-1]  # summed over both processes


# Every image read for step 5 or later fails (as if the storage went away): the run must stop with a clear
# error and keep the 5 steps it made, although no checkpoint was due.
STORAGE_LOST_AT_STEP_5 = """
import selfsup.data.stream as stream
_read = stream.decode_crops
def decode_crops(source, mode, choose):
    if stream.torch.initial_seed() >= stream.crop_seed(0, 5, 0):
        raise OSError("storage unreachable")
    return _read(source, mode, choose)
stream.decode_crops = decode_crops
"""


def test_a_data_error_mid_run_keeps_the_steps_done(config, tmp_path) -> None:
    run = tmp_path / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}", "trainer.checkpoint_every_steps=100",
                            "data.num_workers=0", "monitor.knn_every_steps=0"], STORAGE_LOST_AT_STEP_5))
    assert code == 2 and "unreadable images in a row" in err and "storage unreachable" in err, err[-2000:]
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 5
