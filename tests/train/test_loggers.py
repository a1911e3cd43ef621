"""``trainer.loggers``: what TensorBoard, W&B (offline) and MLflow (file store) hold, read back with their own readers
and compared with ``metrics.csv``; a run interrupted at step 10 and resumed to 20 is one logger run with steps 1..20.

Each logger's test skips when its extra is not installed (``pip install 'selfsup[tensorboard,wandb,mlflow]'``).
"""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import os
import signal
import struct
from pathlib import Path

import pytest

from selfsup.cli import main
from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.launch import validate
from tiny import ADAMW, tiny_yaml

VIEW = {"preset": "minimal", "num": 1, "params": {"crop_scale": [0.5, 1.0]}}
TINY = tiny_yaml(method={"name": "vicreg", "expander": [64, 64]}, views=[VIEW, VIEW],
                 optim={**ADAMW, "warmup_epochs": 0.5},
                 trainer={"max_steps": 20, "log_every_steps": 1, "checkpoint_every_steps": 4},
                 monitor={"collapse_every_steps": 5, "knn_every_steps": 5, "knn_train_size": 200, "knn_test_size": 100})
INSTALLED = [name for name in ("tensorboard", "wandb", "mlflow") if importlib.util.find_spec(name) is not None]
STEPS = list(range(1, 21))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run with every installed logger, stopped by a SIGINT inside step 10's optimiser step (exit 130, checkpoint
    of step 10), then resumed to step 20."""
    if not INSTALLED:
        pytest.skip("none of tensorboard, wandb, mlflow is installed")
    folder = tmp_path_factory.mktemp("loggers")
    (folder / "tiny.yaml").write_text(TINY)
    run = folder / "run"
    args = ["pretrain", str(folder / "tiny.yaml"), f"trainer.out={run}", f"trainer.loggers=[csv,{','.join(INSTALLED)}]"]
    import selfsup.train.loop as loop

    build, calls = loop.build_optimizer, [0]

    def interrupting(*a):
        optimizer = build(*a)

        def hook(*_):
            calls[0] += 1
            if calls[0] == 10:
                os.kill(os.getpid(), signal.SIGINT)

        optimizer.register_step_pre_hook(hook)
        return optimizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "build_optimizer", interrupting)
        assert main(args) == 130
    ids = json.loads((run / "loggers.json").read_text()) if "wandb" in INSTALLED or "mlflow" in INSTALLED else {}
    (run.parent / "ids_after_10.json").write_text(json.dumps(ids))
    assert main(args) == 0
    return run


def metrics_csv(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Column -> [(step, value)] of metrics.csv (numeric columns, steps where the column has a value)."""
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == STEPS
    columns = [k for k in rows[0] if k not in ("step", "stage")] + [k for r in rows for k in r if k not in rows[0]]
    series = {k: [(int(r["step"]), float(r[k])) for r in rows if r.get(k) not in (None, "")] for k in columns}
    for key in ("loss", "lr", "images_per_s", "knn_top1", "effective_rank", "embedding_std", "invariance"):
        assert series[key], key
    assert [s for s, _ in series["knn_top1"]] == [5, 10, 15, 20]
    return series


def assert_same_series(logged: dict[str, list[tuple[int, float]]], expected: dict[str, list[tuple[int, float]]]):
    assert sorted(logged) == sorted(expected)
    for key, points in expected.items():
        assert [s for s, _ in logged[key]] == [s for s, _ in points], key
        assert [v for _, v in logged[key]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-6), key


def test_unknown_or_missing_logger_is_a_config_error_before_any_work(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="trainer.loggers: 'neptune'; allowed values: csv, tensorboard, wandb"):
        validate(load_config(overrides=["trainer.loggers=[csv,neptune]"]))
    import selfsup.train.loggers as loggers

    real = importlib.util.find_spec
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    (tmp_path / "tiny.yaml").write_text(TINY)
    assert main(["pretrain", str(tmp_path / "tiny.yaml"), f"trainer.out={tmp_path / 'run'}",
                 "trainer.loggers=[csv,wandb]"]) == 2
    assert "pip install 'selfsup[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_default_writes_only_metrics_csv() -> None:
    assert load_config().trainer.loggers == ["csv"]


def test_tensorboard_holds_metrics_csv_hyperparameters_and_plots_in_one_log_dir(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    assert [p.name for p in (run / "tensorboard").iterdir() if p.is_dir()] == []  # no version_1: the same log dir
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # the first run's and the resume's
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert_same_series(logged, metrics_csv(run))
    assert sorted(events.Tags()["images"]) == sorted(f"plots/{p.stem}" for p in (run / "plots").glob("*.png"))
    assert events.Images("plots/loss")[-1].step == 20 and events.Images("plots/loss")[-1].width == 500
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info.hparams
    assert hparams["optim.lr"].number_value == 0.002 and hparams["method.name"].string_value == "vicreg"


def test_mlflow_holds_metrics_csv_params_and_plots_in_one_run(run, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to read a file store

    client = MlflowClient(tracking_uri=f"file:{run / 'mlruns'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "selfsup"]
    [found] = client.search_runs([experiment.experiment_id])
    run_id = json.loads((run / "loggers.json").read_text())["mlflow"]
    assert found.info.run_id == run_id == json.loads((run.parent / "ids_after_10.json").read_text())["mlflow"]
    assert found.info.status == "FINISHED"
    expected = metrics_csv(run)
    logged = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
              for key in found.data.metrics}
    assert_same_series(logged, expected)
    assert found.data.params["optim.lr"] == "0.002" and found.data.params["trainer.max_steps"] == "20"
    assert sorted(a.path for a in client.list_artifacts(run_id, "plots")) == \
        sorted(f"plots/{p.name}" for p in (run / "plots").glob("*.png"))


def wandb_records(path: Path):
    """The protobuf records of an offline run's ``.wandb`` file (a LevelDB log: 32 KiB blocks of 7-byte-headed
    chunks after a 7-byte ``:W&B`` file header), read without the network."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, parts = path.read_bytes(), 32768, 7, b""
    assert struct.unpack("<4sHB", data[:7])[:2] == (b":W&B", 0xBEE1)
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        parts, pos = parts + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            yield wandb_internal_pb2.Record.FromString(parts)
            parts = b""


def test_wandb_offline_run_holds_metrics_csv_config_and_plots_under_one_run_id(run):
    pytest.importorskip("wandb")
    run_id = json.loads((run / "loggers.json").read_text())["wandb"]
    assert json.loads((run.parent / "ids_after_10.json").read_text())["wandb"] == run_id
    files = sorted(glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb")))
    assert [Path(f).name for f in files] == [f"run-{run_id}.wandb"] * 2  # the run and its resume: one id
    logged: dict[str, list[tuple[int, float]]] = {}
    config, images = {}, set()
    for path in files:
        for record in wandb_records(Path(path)):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert record.run.run_id == run_id
            elif kind == "config":
                config.update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = items.pop("trainer/global_step")
                images |= {k.split("/")[1] for k in items if k.startswith("plots/")}
                for key, value in items.items():
                    if not key.startswith(("_", "plots/")):
                        logged.setdefault(key, []).append((step, value))
    assert_same_series(logged, metrics_csv(run))
    assert config["optim.lr"] == 0.002 and config["method.name"] == "vicreg"
    assert images == {p.stem for p in (run / "plots").glob("*.png")}


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_hides_the_steps_a_crash_logged_after_the_last_checkpoint(tmp_path):
    """A crash in step 10 leaves the checkpoint of step 8 and TensorBoard events of step 9; the resume logs step 9
    again, and the reader shows it once (the resumed writer purges the steps after the checkpoint)."""
    pytest.importorskip("tensorboard")
    import selfsup.train.loop as loop

    (tmp_path / "tiny.yaml").write_text(TINY)
    run = tmp_path / "run"
    args = ["pretrain", str(tmp_path / "tiny.yaml"), f"trainer.out={run}", "trainer.loggers=[tensorboard]",
            "monitor.knn_every_steps=0"]
    build, calls = loop.build_optimizer, [0]

    def crashing(*a):
        optimizer = build(*a)

        def hook(*_):
            calls[0] += 1
            if calls[0] == 10:
                raise RuntimeError("crash")

        optimizer.register_step_pre_hook(hook)
        return optimizer

    with pytest.MonkeyPatch.context() as patch, pytest.raises(RuntimeError, match="crash"):
        patch.setattr(loop, "build_optimizer", crashing)
        main(args)
    assert [s for s, _ in tensorboard_scalars(run / "tensorboard")["loss"]] == list(range(1, 10))
    assert main(args) == 0
    assert_same_series(tensorboard_scalars(run / "tensorboard"), metrics_csv_any(run))


def metrics_csv_any(run: Path) -> dict[str, list[tuple[int, float]]]:
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == STEPS
    return {k: [(int(r["step"]), float(r[k])) for r in rows if r.get(k) not in (None, "")]
            for k in dict.fromkeys(k for r in rows for k in r) if k != "step"}


@pytest.mark.multiprocess
def test_under_ddp_only_the_main_process_logs(tmp_path, monkeypatch):
    """2 gloo processes: one TensorBoard event file and one MLflow run, holding metrics.csv's rows once."""
    if not {"tensorboard", "mlflow"} <= set(INSTALLED):
        pytest.skip("needs tensorboard and mlflow")
    import subprocess
    import sys

    (tmp_path / "tiny.yaml").write_text(TINY)
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "selfsup.cli", "pretrain", str(tmp_path / "tiny.yaml"),
                           f"trainer.out={run}", "trainer.loggers=[csv,tensorboard,mlflow]", "trainer.max_steps=6",
                           "trainer.devices=2", "trainer.accelerator=cpu", "monitor.knn_every_steps=0"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, 7))
    assert [s for s, _ in tensorboard_scalars(run / "tensorboard")["loss"]] == list(range(1, 7))
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to read a file store
    client = MlflowClient(tracking_uri=f"file:{run / 'mlruns'}")
    [found] = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "selfsup"])
    assert [m.step for m in client.get_metric_history(found.info.run_id, "loss")] == list(range(1, 7))
