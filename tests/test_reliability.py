"""Fault injection: signals at random steps and inside the optimiser step, divergence, kills during writes.

Every interrupted run is resumed and compared with an uninterrupted one, tensor by tensor (model and
optimiser state of the final checkpoint, and the exported backbone). Runs that are signalled or killed go through
the CLI in subprocesses with one thread, as a user's would, and so does the reference run; the others call
``selfsup.cli.main`` in this process (one thread too), which spares each a second interpreter's start.
"""

from __future__ import annotations

import csv
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from selfsup.cli import main
from test_cli import TINY

# test_cli.py's tiny VICReg run on scikit-learn's digits, made long enough to interrupt.
# accelerator cpu: a resume is bit-exact on the CPU; CUDA's kernels (cuDNN, atomics) are not deterministic
LONGER = """
_base_: tiny.yaml
trainer: {epochs: 6, checkpoint_every_steps: 20, accelerator: cpu}
monitor: {collapse_every_steps: 10}
"""
TOTAL_STEPS = 6 * (1500 // 64)  # 23 steps per epoch; checkpoints every 20 steps and every epoch

# Installs an optimiser whose step pre-hook sends a signal (format: signal=SIGINT, SIGKILL, ...) to the process on its
# k-th call: the signal arrives inside optimizer.step(), after the forward pass has updated BatchNorm's statistics.
SIGNAL_IN_OPTIMIZER_STEP = """
import os, signal
import selfsup.train.loop as loop
_build, _calls = loop.build_optimizer, [0]
def _hook(optimizer, args, kwargs):
    _calls[0] += 1
    if _calls[0] == {k}:
        os.kill(os.getpid(), signal.{signal})
def build_optimizer(model, cfg, *args):
    optimizer = _build(model, cfg, *args)
    optimizer.register_step_pre_hook(_hook)
    return optimizer
loop.build_optimizer = build_optimizer
"""


def cli(args: list[str], prelude: str = "") -> subprocess.Popen:
    """``selfsup ARGS`` in a subprocess with one intra-op thread (what the reference run uses too).

    ``prelude``: Python code run before the CLI (then through ``-c``, which Fabric cannot re-launch: one process).
    """
    command = ["-c", f"{prelude}\nimport sys\nfrom selfsup.cli import main\nsys.exit(main(sys.argv[1:]))"] if prelude \
        else ["-m", "selfsup.cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, *command, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def resume(run: Path) -> None:
    """Resume in this process (one intra-op thread, set by conftest.py, as in the subprocesses)."""
    assert torch.get_num_threads() == 1
    assert main(["pretrain", str(run)]) == 0


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def state_tensors(run: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a run's final checkpoint (model and optimiser state) and of its exported backbone."""
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    tensors = {f"model.{k}": v for k, v in ckpt["model"].items()}
    for pid, state in ckpt["optimizer"]["state"].items():
        tensors.update({f"optimizer.{pid}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
    tensors.update({f"backbone.{k}": v for k, v in load_file(run / "backbone.safetensors").items()})
    return tensors


def assert_same_state(reference: Path, resumed: Path) -> None:
    a, b = state_tensors(reference), state_tensors(resumed)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)}/{len(a)} tensors differ after the resume, e.g. {different[:3]}"


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.stderr.read()[-2000:]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cfg")
    (folder / "tiny.yaml").write_text(TINY)
    (folder / "run.yaml").write_text(LONGER)
    return folder / "run.yaml"


@pytest.fixture(scope="module")
def reference(config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("reference") / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"]))
    assert code == 0, err[-2000:]
    return run


@pytest.mark.parametrize("signum, delay_seed", [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGTERM, 3)])
def test_signal_at_a_random_step_then_resume_is_exact(config, reference, tmp_path, signum, delay_seed):
    """SIGINT (Ctrl-C) or SIGTERM (SLURM pre-emption, docker stop) at a random moment of training."""
    run = tmp_path / "run"
    proc = cli(["pretrain", str(config), f"trainer.out={run}"])
    wait_for(run / "checkpoints" / "last.pt", proc)
    time.sleep(random.Random(delay_seed).uniform(0.0, 0.8))
    proc.send_signal(signum)
    code, err = finish(proc)
    assert code == 128 + signum, err[-2000:]
    stopped = int(re.search(r"stopped: \w+ at step (\d+); checkpoint saved", err).group(1))
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == stopped
    assert stopped < TOTAL_STEPS and not (run / "backbone.safetensors").exists()

    resume(run)
    assert_same_state(reference, run)
    with (run / "metrics.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS  # no row lost or repeated by the resume


def test_signal_inside_the_optimizer_step_is_deferred_to_the_step_boundary(config, reference, tmp_path):
    run = tmp_path / "run"
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={run}"],
                           SIGNAL_IN_OPTIMIZER_STEP.format(k=31, signal="SIGINT")))
    assert code == 130, err[-2000:]
    assert "stopped: SIGINT at step 31; checkpoint saved" in err
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 31
    resume(run)
    assert_same_state(reference, run)


def test_sigkill_during_training_keeps_the_last_checkpoint_and_the_training_time(config, reference, tmp_path):
    run = tmp_path / "run"
    proc = cli(["pretrain", str(config), f"trainer.out={run}", "trainer.log_every_steps=1000",
                "monitor.collapse_every_steps=0"])
    ckpt = run / "checkpoints" / "last.pt"
    wait_for(ckpt, proc)
    proc.kill()
    proc.wait()
    (ckpt.parent / ".last.pt.killed.tmp").write_bytes(b"half a checkpoint")  # as a kill mid-write leaves it
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["train_time_s"] > 0  # kept although no metrics row was logged before the kill

    resume(run)
    assert not list(ckpt.parent.glob(".*.tmp"))
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [TOTAL_STEPS]
    assert float(rows[-1]["train_time_s"]) > saved["train_time_s"]
    ref, out = load_file(reference / "backbone.safetensors"), load_file(run / "backbone.safetensors")
    assert all(torch.equal(ref[k], out[k]) for k in ref)


@pytest.mark.multiprocess
def test_sigterm_stops_every_ddp_process_at_the_same_step(config, tmp_path):
    """2 gloo processes: a SIGTERM to the launching process stops both at one step; the resume is exact."""
    reference, run = tmp_path / "reference", tmp_path / "run"
    ddp = ["trainer.devices=2", "trainer.accelerator=cpu", "trainer.epochs=2"]
    code, err = finish(cli(["pretrain", str(config), f"trainer.out={reference}", *ddp]))
    assert code == 0, err[-2000:]
    proc = cli(["pretrain", str(config), f"trainer.out={run}", *ddp])
    wait_for(run / "checkpoints" / "last.pt", proc)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 143, err[-2000:]
    stopped = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"]
    assert 20 <= stopped < 2 * (1500 // 64)
    code, err = finish(cli(["pretrain", str(run), *ddp]))
    assert code == 0, err[-2000:]
    assert_same_state(reference, run)


# ----------------------------------------------------------------------------------------------
# Divergence


def explode_then_nan(monkeypatch, explode_at: int, nan_at: int) -> None:
    """From step ``explode_at`` a BatchNorm scale is 1e9 (exploding weights, the loss still finite: the next
    BatchNorm normalises the scale away); from step ``nan_at`` the loss is NaN."""
    import selfsup.methods.assemble as assemble

    build_model = assemble.build_model

    def patched(*args, **kwargs):
        params, method = build_model(*args, **kwargs)
        forward, calls = method.forward, [0]

        def wrapped(views):
            calls[0] += 1
            if calls[0] == explode_at + 1:
                with torch.no_grad():
                    dict(method.named_parameters())["backbone.layer1.0.bn1.weight"].fill_(1e9)
            out = forward(views)
            if calls[0] >= nan_at + 1:
                out.loss = out.loss * float("nan")
            return out

        method.forward = wrapped
        return params, method

    monkeypatch.setattr(assemble, "build_model", patched)


def test_divergence_keeps_the_last_sane_checkpoint_and_resumes_with_a_lower_lr(config, tmp_path, monkeypatch, capsys,
                                                                               caplog):
    run = tmp_path / "run"
    explode_then_nan(monkeypatch, explode_at=25, nan_at=47)
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # Training stops at the first checkpoint the exploded weights fail (not at the NaN of step 47).
    assert err.startswith("error: step 40 not checkpointed: parameter backbone.layer1.0.bn1.weight reaches "
                          "|w| = 1e+09")
    assert "the checkpoint of step 23" in err and "17 steps before the failure" in err
    assert "--allow-optim-change" in err
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert ckpt["step"] == 23 and max(v.abs().max() for v in ckpt["model"].values() if v.is_floating_point()) < 1e6
    with (run / "metrics.csv").open() as f:  # the rows logged before the failure are on disk
        assert [int(r["step"]) for r in csv.DictReader(f)][-1] == 40

    monkeypatch.undo()
    assert main(["pretrain", str(run), "optim.lr=0.001"]) == 2
    assert "--allow-optim-change" in capsys.readouterr().err
    assert main(["pretrain", str(run), "optim.lr=0.001", "--allow-optim-change"]) == 0
    assert "step 23: optim.lr: 0.002 -> 0.001" in (run / "config_changes.log").read_text()
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["config"]["optim"]["lr"] == 0.001
    assert (run / "backbone.safetensors").is_file()


def test_divergence_before_any_checkpoint_says_so(config, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    explode_then_nan(monkeypatch, explode_at=100, nan_at=7)
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 1
    err = capsys.readouterr().err
    assert "loss is nan at step 7; no checkpoint that passed the health checks was written; lower optim.lr" in err
    assert "intact" not in err and not (run / "checkpoints" / "last.pt").exists()
    with (run / "metrics.csv").open() as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [5]


def poison_adam_state(monkeypatch, k: int) -> None:
    """Poisons Adam's second moment of the first parameter after the K-th optimiser step: the loss stays finite
    (Adam's update of those entries becomes 0), only the optimiser state is unfit to save (as optim.lr=30 leaves it)."""
    import selfsup.train.loop as loop

    build, calls = loop.build_optimizer, [0]

    def hook(optimizer, args, kwargs):
        calls[0] += 1
        if calls[0] == k:
            next(iter(optimizer.state.values()))["exp_avg_sq"].fill_(float("inf"))

    def build_optimizer(model, cfg, *args):
        optimizer = build(model, cfg, *args)
        optimizer.register_step_post_hook(hook)
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", build_optimizer)

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "fashion_mnist" / "quickstart.yaml"
DIGITS = ["data.dataset=digits", "data.image_size=8", "trainer.batch_size=64", "monitor.knn_every_steps=0",
          "trainer.progress=false"]


def error_line(err: str) -> str:
    """The one ``error:`` line of a failed command, checked to be alone and without a traceback."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    """``selfsup ARGV`` in this process (where no second process is needed): its exit code and stderr."""
    code = main(argv)
    return code, capsys.readouterr().err


def test_unfit_optimizer_state_stops_training_at_once(config, tmp_path, monkeypatch, capsys):
    """Issue 31.2: a checkpoint refused for non-finite optimiser state stops the run (it used to train to the end,
    refusing every checkpoint, and exit 1 with nothing saved)."""
    run = tmp_path / "run"
    poison_adam_state(monkeypatch, k=12)
    code, err = run_main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=60",
                          "trainer.checkpoint_every_steps=5"], capsys)
    assert code == 1, err[-2000:]
    line = error_line(err)
    assert line.startswith("error: step 15 not checkpointed: optimiser state 'exp_avg_sq' is not finite; "
                           "the checkpoint of step 10"), line
    assert "5 steps before the failure" in line
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 10
    with (run / "metrics.csv").open() as f:
        assert [int(r["step"]) for r in csv.DictReader(f)][-1] <= 15


def test_divergence_with_finite_numbers_keeps_the_checkpoint_before_it(tmp_path, capsys):
    """Issue 31.3: at lr 30 the quick-start's loss goes 23 -> 51 -> 5e5 while every number stays finite; the
    checkpoint whose weights give 5e5 is not kept, the one before is, and resumes at a sane lr."""
    run = tmp_path / "run"
    code, err = run_main(["pretrain", str(QUICKSTART), *DIGITS, f"trainer.out={run}", "optim.lr=30",
                          "trainer.checkpoint_every_steps=1", "trainer.max_steps=20"], capsys)
    assert code == 1, err[-2000:]
    line = error_line(err)
    assert re.match(r"error: loss is \S+, \S+x its running median \S+ over the last 6 steps \(> 100x: diverging\) "
                    r"at step 6; the checkpoint of step 5 \(\S+\), 1 step before the failure, passed", line), line
    ckpt = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert ckpt["step"] == 5 and len(ckpt["health"]["losses"]) == 5
    assert torch.load(run / "checkpoints" / "diverged.pt", map_location="cpu", weights_only=True)["step"] == 6

    code, err = run_main(["pretrain", str(run), "optim.lr=0.3", "--allow-optim-change"], capsys)
    assert code == 0, err[-2000:]
    resumed = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert resumed["step"] == 20 and resumed["health"]["first_loss"] == ckpt["health"]["first_loss"]


def test_resume_accepts_changes_that_do_not_change_the_computation(config, tmp_path, capsys):
    """Issue 31.1: monitor, eval and logging settings may change on a resume (recorded); optim.lr may not. An
    older checkpoint (without the health state and the unreadable count) still resumes."""
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=30",
                 "trainer.checkpoint_every_steps=10", "monitor.knn_every_steps=20"]) == 0
    path = run / "checkpoints" / "last.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt.pop("health", None), ckpt.pop("unreadable_images", None)  # as an older version wrote it
    torch.save(ckpt, path)
    changed = ["monitor.knn_every_steps=10", "monitor.knn_k=5", "monitor.knn_train_size=200",
               "trainer.log_every_steps=3", "eval.knn_k=7", "trainer.checkpoint_every_steps=7"]
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=30", *changed]) == 0
    log = (run / "config_changes.log").read_text()
    assert "step 30: monitor.knn_k: 20 -> 5" in log and "step 30: eval.knn_k: 20 -> 7" in log
    assert "monitor.knn_train_size: 5000 -> 200" in log and "trainer.log_every_steps: 5 -> 3" in log
    capsys.readouterr()
    assert main(["pretrain", str(run), "optim.lr=0.5"]) == 2
    assert "different config (optim.lr" in capsys.readouterr().err


@pytest.fixture(scope="module")
def short_run(config, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("short") / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=4"]) == 0
    return run


@pytest.mark.parametrize("damage", ["no config", "nan weights"])
def test_hand_damaged_checkpoint_is_a_clear_error(short_run, tmp_path, capsys, damage):
    """Issue 31.7: a checkpoint without ``config`` (a KeyError traceback) or with NaN weights (loaded, then called
    sane when it diverged) is exit 2 with one line naming the file."""
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    path = run / "checkpoints" / "last.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if damage == "no config":
        del ckpt["config"]
    else:
        ckpt["model"]["backbone.stem.0.weight" if "backbone.stem.0.weight" in ckpt["model"]
                      else next(k for k, v in ckpt["model"].items() if v.is_floating_point())].fill_(float("nan"))
    torch.save(ckpt, path)
    code, err = run_main(["pretrain", str(run), "trainer.max_steps=8"], capsys)
    assert code == 2, err[-2000:]
    line = error_line(err)
    assert str(path) in line
    assert ("key 'config' is missing" if damage == "no config" else "non-finite values in model.") in line


def test_empty_config_yaml_of_a_run_is_a_clear_error(short_run, tmp_path, capsys):
    """Issue 31.7: an emptied config.yaml made `eval knn` evaluate the defaults' dataset and exit 0."""
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    (run / "config.yaml").write_text("")
    code, err = run_main(["eval", "knn", str(run)], capsys)
    assert code == 2, err[-2000:]
    assert str(run / "config.yaml") in error_line(err)


# ----------------------------------------------------------------------------------------------
# Steps, re-runs, file modes


def test_max_steps_zero_exports_the_initial_backbone(config, tmp_path):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=0"]) == 0
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 0
    assert '"steps": 0' in (run / "backbone.json").read_text()


def test_rerunning_the_same_yaml_resumes_and_files_follow_the_umask(config, tmp_path):
    run = tmp_path / "run"
    old = os.umask(0o022)
    try:
        assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=30"]) == 0
        assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=30"]) == 0
    finally:
        os.umask(old)
    for name in ("checkpoints/last.pt", "backbone.safetensors", "backbone.json", "metrics.csv", "config.yaml",
                 "spectra.npz"):
        assert (run / name).stat().st_mode & 0o777 == 0o644, name


def test_one_run_per_directory_and_a_killed_run_leaves_no_stale_lock(config, tmp_path, capsys):
    """Issue 50.4: two processes trained into one trainer.out side by side, each overwriting the other's files. The
    second now stops before touching the directory, naming the first one's PID; once the first is killed (SIGKILL:
    no clean-up of its own), the OS has released its lock and the run resumes."""
    run = tmp_path / "run"
    proc = cli(["pretrain", str(config), f"trainer.out={run}"])
    wait_for(run / "checkpoints" / "last.pt", proc)
    proc.send_signal(signal.SIGSTOP)  # paused, the lock held: whatever changes in the directory now is the second's
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()}
    code, err = run_main(["pretrain", str(config), f"trainer.out={run}"], capsys)
    assert code == 2 and f"{run} is in use by process {proc.pid}" in error_line(err), err
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run.rglob("*") if p.is_file()} == files
    proc.kill()
    proc.wait()
    assert main(["pretrain", str(config), f"trainer.out={run}"]) == 0
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == TOTAL_STEPS


def test_a_run_that_fails_before_writing_leaves_no_directory(config, tmp_path, capsys):
    run = tmp_path / "new" / "run"
    code, err = run_main(["pretrain", str(config), f"trainer.out={run}", "data.dataset=imagefolder",
                          f"data.root={tmp_path / 'missing'}"], capsys)
    assert code == 2 and not run.exists(), err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) and its bytes: what a refused command must leave as is."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_without_its_checkpoints_is_never_retrained_over(short_run, tmp_path, capsys):
    """Issue 50.1: a finished run whose checkpoints/ were deleted to save space was retrained from scratch with exit
    0, its backbone, metrics.csv and config.yaml replaced and its eval/*.json left describing another backbone."""
    run = tmp_path / "run"
    shutil.copytree(short_run, run)
    assert main(["eval", "knn", str(run)]) == 0
    shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    code, err = run_main(["pretrain", str(run / "config.yaml"), f"trainer.out={run}", "trainer.max_steps=2"], capsys)
    assert code == 2 and "holds a run's results (backbone.safetensors, eval) but no checkpoints/last.pt" in \
        error_line(err), err
    assert snapshot(run) == before


def test_a_folder_of_the_users_own_files_is_refused_as_trainer_out(config, tmp_path, capsys):
    """Issue 50.1: a trainer.out holding other files had its config.yaml and metrics.csv overwritten."""
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "config.yaml").write_text("my own config\n")
    (folder / "holiday.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    before = snapshot(folder)
    code, err = run_main(["pretrain", str(config), f"trainer.out={folder}", "trainer.max_steps=2"], capsys)
    assert code == 2 and f"{folder} holds files that are not a selfsup run's (holiday.jpg)" in error_line(err), err
    assert snapshot(folder) == before  # no lock file left behind either


@pytest.mark.parametrize("stream", ["false", "true"])
def test_a_resume_on_changed_data_is_refused_and_moved_data_resumes(config, tmp_path, capsys, stream):
    """Issue 50.5: replacing the images under the same data.root resumed with exit 0 (the epoch length silently
    changed), while the same data moved to another path was refused. Now the content is checked (pixels in memory,
    file names and sizes when streamed), not the path."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    root = tmp_path / "images"
    for i in range(120):
        path = root / "train" / str(digits.target[i] % 3) / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits.images[i] * 255 / 16).astype("uint8"), mode="L").save(path)
    data = ["data.dataset=imagefolder", f"data.root={root}", "data.channels=1", "data.image_size=8",
            f"data.stream={stream}", "trainer.batch_size=32", "monitor.knn_every_steps=0"]
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=3", *data]) == 0
    original = snapshot(root)

    # Half the images replaced by others (the same names; other pixels, so other sizes as PNGs).
    for name in sorted(original)[::2]:
        i = int(Path(name).stem)
        Image.fromarray((digits.images[i + 500] * 255 / 16).astype("uint8"), mode="L").save(root / name)
    capsys.readouterr()
    code, err = run_main(["pretrain", str(run)], capsys)
    assert code == 2 and "was trained on other data than imagefolder" in error_line(err), err

    # The original data, moved: the same content at another path resumes.
    moved = tmp_path / "moved"
    for name, content in original.items():
        (moved / name).parent.mkdir(parents=True, exist_ok=True)
        (moved / name).write_bytes(content)
    code, err = run_main(["pretrain", str(run), f"data.root={moved}"], capsys)
    assert code == 0, err


def test_a_full_disk_at_a_checkpoint_is_exit_2_keeping_the_checkpoint_before(config, tmp_path, capsys, monkeypatch):
    """Issue 50.6: a disk that filled during a checkpoint was exit 1 with torch's `RuntimeError: [enforce fail at
    inline_container.cc:672] ... unexpected pos`. Now: exit 2, one line naming the file, the last checkpoint intact."""
    run = tmp_path / "run"
    real_save, calls = torch.save, [0]

    def disk_fills(obj, f, *args, **kwargs):  # as torch's zip writer fails on a full disk: part written, then raise
        calls[0] += 1
        if calls[0] < 2:
            return real_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", disk_fills)
    code, err = run_main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=12",
                          "trainer.checkpoint_every_steps=4"], capsys)
    monkeypatch.undo()
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: {run / 'checkpoints' / 'last.pt'}: could not be written"), err
    assert "MiB free on its disk" in line and "the files it had are kept" in line
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 4
    assert not list(run.rglob("*.tmp"))
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=12",
                 "trainer.checkpoint_every_steps=4"]) == 0


@pytest.mark.parametrize("out, fix", [("file", "a file stands where a folder is needed"),
                                      ("long", "a name in the path is too long")])
def test_an_unusable_trainer_out_is_exit_2_naming_the_fix(config, tmp_path, capsys, out, fix):
    """Issue 50.6: trainer.out that is a file, or with a component over 255 bytes, was a traceback."""
    (tmp_path / "file").write_text("mine\n")
    path = tmp_path / "file" if out == "file" else tmp_path / ("x" * 300) / "run"
    code, err = run_main(["pretrain", str(config), f"trainer.out={path}", "trainer.max_steps=2"], capsys)
    assert code == 2 and fix in error_line(err), err
    assert (tmp_path / "file").read_text() == "mine\n"


def test_too_little_free_space_for_a_checkpoint_is_refused_before_writing(config, tmp_path, capsys, monkeypatch):
    """Issue 50: free space is checked before a checkpoint is written (the state's tensors against the disk's free
    bytes), so a nearly full disk stops the run with exit 2 before a byte of the new file, the last one kept."""
    run = tmp_path / "run"
    real_usage, real_save, saved = shutil.disk_usage, torch.save, []

    def disk_fills_after_the_first_checkpoint(path):
        total, used, free = real_usage(path)
        return shutil._ntuple_diskusage(total, used, free if not saved else 1024)

    def save(obj, f, *args, **kwargs):
        saved.append(f)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(shutil, "disk_usage", disk_fills_after_the_first_checkpoint)
    monkeypatch.setattr(torch, "save", save)
    code, err = run_main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=12",
                          "trainer.checkpoint_every_steps=4"], capsys)
    monkeypatch.undo()
    line = error_line(err)
    assert code == 2 and line.startswith(f"error: {run / 'checkpoints' / 'last.pt'}: needs "), line
    assert "MiB but 0 MiB is free on its disk (the checkpoint before is kept)" in line and "free space" in line
    assert len(saved) == 1  # the second checkpoint was refused before torch.save
    assert torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 4


def test_sizes_beyond_the_machines_memory_are_refused_before_allocating(config, tmp_path, capsys, monkeypatch):
    """Issue 50.7: data.image_size=8192 (in range) tried to allocate 100 GB and died with the allocator's traceback;
    a model or views far beyond memory did the same at the first step. With 4 GiB free (reported by the check's
    source, whatever this machine has): one line naming the sizes and the settings to change, nothing written."""
    import selfsup.memory

    monkeypatch.setattr(selfsup.memory, "available_bytes", lambda device=None: 4 * 2**30)
    for override, named in [
        # 1,500 x 8192**2 bytes (93.75 GiB) + one image's float working copies (0.5 GiB)
        ("data.image_size=8192", "error: resizing 1,500 images to 8192 x 8192 (data.image_size) needs at least 94.3"),
        # two stages of 65536 and 131072 channels: 9 x (2 x 65536**2 + 65536 x 131072 + 131072**2) + 65536 x 131072
        ("model.params.width=65536", "error: the training step (a model of 317,8"),
        ("views.0.size=4096", "error: the training step (a model of "),
    ]:
        code, err = run_main(["pretrain", str(config), f"trainer.out={tmp_path / 'run'}", override], capsys)
        line = error_line(err)
        assert code == 2 and line.startswith(named) and "but 4.0 GiB is free in this machine's memory" in line, line
        assert not (tmp_path / "run").exists()
    code, err = run_main(["pretrain", str(config), f"trainer.out={tmp_path / 'run'}", "trainer.max_steps=2"], capsys)
    assert code == 0, err  # the tiny run itself fits
