"""``trainer.budget``: durations, the step timing (on a fake clock), the run sized and recorded in ``budget.json``, a
killed budgeted run resumed to the same weights as a run of that many steps, the stages' shares; and a finished run
asked for more steps, whose error gives a command that trains it further."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import selfsup.train.budget as budget
from selfsup.cli import main
from selfsup.config import ConfigError, parse_duration, stage_configs
from selfsup.load import load_config
from selfsup.train.stages import budget_shares
from tiny import VICREG_8PX, tiny_yaml


@pytest.mark.parametrize("text, seconds", [("30min", 1800), ("2h", 7200), ("90s", 90), ("1h30min", 5400),
                                           ("1.5h", 5400), ("4m", 240), (" 2 min ", 120), ("1d", 86400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "min", "30 minutes", "0s", "-5min", "2h-1min", "400d", "30min!"])
def test_bad_durations_say_what_to_write(text):
    with pytest.raises(ConfigError, match="trainer.budget.*30min"):
        parse_duration(text)


class FakeClock:
    """``time.perf_counter`` of the budget module, advanced by the steps only."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_calibration_times_steps_after_the_warmup_until_its_share_of_the_budget(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    costs = {0: 5.0, 1: 2.0}  # the warm-up steps are slow (allocation, caches) and must not count

    def step(i: int) -> None:
        clock.now += costs.get(i, 0.5)

    cal = budget.Calibration(step, budget_s=100.0)
    # timed steps of 0.5 s until they take 3 % of 100 s: 6 of them
    assert cal.timed_steps == 6 and cal.seconds_per_step == pytest.approx(0.5)
    assert cal.elapsed_s == pytest.approx(7.0 + 3.0)
    # the rest, 90 s, buys 180 steps
    assert budget.budget_steps(100.0, cal) == 180
    # a long budget stops at MAX_TIMED, a short one still times MIN_TIMED
    assert budget.Calibration(step, budget_s=1e6).timed_steps == budget.MAX_TIMED
    assert budget.Calibration(step, budget_s=1.0).timed_steps == budget.MIN_TIMED


def test_calibration_steps_as_many_times_as_every_process_agrees(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(budget.time, "perf_counter", clock)
    calls = []

    def step(i: int) -> None:
        calls.append(i)
        clock.now += 0.5

    # another process wants 4 timed steps: this one (3 wanted at budget 1 s) goes on with it
    asked = []

    def agree(more: bool) -> bool:  # the all-reduce: the other process answers "more" for its first 4 timed steps
        asked.append(more)
        return more or len(asked) <= 4

    cal = budget.Calibration(step, budget_s=1.0, agree=agree)
    assert cal.timed_steps == 4 and calls == list(range(budget.WARMUP_STEPS + 4))


def test_a_budget_that_the_timing_uses_up_is_an_error_but_a_later_stage_trains_one_step(caplog):
    cal = type("C", (), {"elapsed_s": 9.5, "seconds_per_step": 1.0})()
    with pytest.raises(ConfigError, match="no time to train.*larger budget"):
        budget.budget_steps(10.0, cal)
    with caplog.at_level(logging.WARNING, logger="selfsup"):
        assert budget.budget_steps(10.0, cal, floor=True) == 1  # the stages before it are not lost to an error
    assert "went to timing its step" in caplog.text


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_yaml(VICREG_8PX, trainer={"max_steps": None, "checkpoint_every_steps": 1000,
                                                   "log_every_steps": 5}))
    return path


def test_a_budgeted_run_is_sized_on_this_machine_and_recorded(config, tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="selfsup"):
        assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.budget=3s"]) == 0
    entry = json.loads((run / "budget.json").read_text())
    meta = json.loads((run / "backbone.json").read_text())
    assert entry["budget"] == "3s" and entry["share_s"] == 3.0 and entry["images"] == 1500
    assert entry["steps"] == meta["steps"] > 10
    per_step, calibration = entry["seconds_per_step"], entry["calibration_s"]
    bought = (3.0 - calibration) / per_step  # the steps are its floor; both values are rounded in budget.json
    rounding = 0.0005 / per_step + 0.0000005 * bought / per_step
    assert bought - 1 - rounding < entry["steps"] <= bought + rounding
    assert entry["epochs"] == round(entry["steps"] / (1500 // 32), 3)
    assert entry["elapsed_s"] > 0 and entry["cpu"]
    assert f"buys {entry['steps']} steps" in caplog.text
    saved = load_config(run / "config.yaml")
    assert saved.trainer.budget == "3s" and saved.trainer.max_steps is None  # the length lives in budget.json


def test_a_killed_budgeted_run_resumes_to_the_weights_of_a_run_of_that_length(config, tmp_path, caplog, monkeypatch):
    import selfsup.train.loop as loop

    run, build, built = tmp_path / "run", loop.build_optimizer, []

    def build_optimizer(*args):  # SIGINT at the 5th step of the run's optimiser (the 2nd built: the 1st is the timing's)
        optimizer = build(*args)
        built.append(optimizer)
        if len(built) == 2:
            steps = []

            def hook(*_) -> None:
                steps.append(1)
                if len(steps) == 5:
                    os.kill(os.getpid(), signal.SIGINT)

            optimizer.register_step_pre_hook(hook)
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", build_optimizer)
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.budget=2s"]) == 130  # SIGINT's exit code
    monkeypatch.setattr(loop, "build_optimizer", build)
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == 5
    entry = json.loads((run / "budget.json").read_text())
    with caplog.at_level(logging.INFO, logger="selfsup"):
        assert main(["pretrain", str(run)]) == 0
    assert "timing the training step" not in caplog.text  # read from budget.json, not measured again
    assert json.loads((run / "budget.json").read_text())["measured_at"] == entry["measured_at"]
    reference = tmp_path / "reference"
    assert main(["pretrain", str(config), f"trainer.out={reference}", f"trainer.max_steps={entry['steps']}"]) == 0
    got, want = load_file(run / "backbone.safetensors"), load_file(reference / "backbone.safetensors")
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


def test_budget_and_max_steps_together_are_refused(config, tmp_path, capsys):
    assert main(["pretrain", str(config), f"trainer.out={tmp_path / 'r'}", "trainer.budget=1min",
                 "trainer.max_steps=10"]) == 2
    assert "keep one of them" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_stage_cannot_have_its_own_budget(config, tmp_path):
    path = tmp_path / "staged.yaml"
    path.write_text(config.read_text() + "stages:\n  - {name: a, trainer: {budget: 1min}}\n")
    with pytest.raises(ConfigError, match="trainer.budget cannot change per stage"):
        stage_configs(load_config(path))


def test_stages_share_the_budget_by_their_planned_steps(config, tmp_path):
    path = tmp_path / "staged.yaml"
    path.write_text(config.read_text().replace("max_steps: null", "max_steps: 10") + "stages:\n  - {name: a}\n"
                    "  - {name: b, trainer: {max_steps: 30}}\n  - {name: c, trainer: {epochs: 2}}\n")
    cfg = load_config(path, ["trainer.budget=100s"])
    # planned: 10, 30 and 2 epochs of the digits' 1500 images in batches of 32 (46 steps each): 92
    assert budget_shares(cfg, stage_configs(cfg)) == pytest.approx([100 * 10 / 132, 100 * 30 / 132, 100 * 92 / 132])
    assert budget_shares(load_config(path), stage_configs(load_config(path))) == [None] * 3


def test_a_finished_run_asked_for_more_steps_says_how_and_that_command_trains_it_further(config, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", str(config), f"trainer.out={run}", "trainer.max_steps=6"]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["pretrain", str(run), "trainer.max_steps=10"]) == 2
    err = capsys.readouterr().err
    assert "is finished (6 steps" in err and "4 more steps" in err and "Resume it" not in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # left as it was
    command = shlex.split(err.split("`")[1])
    assert command[:3] == ["selfsup", "pretrain", str(run)]
    assert main(command[1:]) == 0
    more = Path(f"{run}_more")
    stage = more / "stages" / "1_more"
    assert json.loads((more / "backbone.json").read_text())["steps"] == 4
    assert load_config(stage / "config.yaml").optim.warmup_fraction == 0.05
    # it started from the finished run's weights (carried over), not afresh: 4 small steps moved it a little from
    # there, far less than the distance from a fresh start
    assert main(["pretrain", str(config), f"trainer.out={tmp_path / 'init'}", "trainer.max_steps=0"]) == 0
    finished, extended = load_file(run / "backbone.safetensors"), load_file(more / "backbone.safetensors")
    fresh = load_file(tmp_path / "init" / "backbone.safetensors")
    moved = sum((extended[k] - finished[k]).float().norm() for k in finished if extended[k].is_floating_point())
    apart = sum((fresh[k] - finished[k]).float().norm() for k in finished if fresh[k].is_floating_point())
    assert 0 < moved < apart / 3
