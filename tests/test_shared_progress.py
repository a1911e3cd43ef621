"""`selfsup.progress`: a bar with its ETA on an 80-column terminal; log lines with step/total, percent and ETA when
stderr is not a terminal; nothing at all for a short loop."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.console import Console

import selfsup.progress as progress_module
from selfsup.progress import Progress, track
from selfsup.train.metrics_log import Progress as TrainingProgress

TRAINING_INFO = ("step=3000 epoch=12.5 lr=0.0001707 loss=19.56 invariance=0.1088 variance=0.6677 covariance=0.1458 "
                 "images_per_s=219.7 train_time_s=120.5 cpu_time_s=240.9")


def terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, force_terminal=True, color_system=None), buffer


def last_line(buffer: io.StringIO) -> str:
    """The last line drawn on the terminal, escape codes left out."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())
    return [line for line in re.split(r"[\r\n]", text) if line.strip()][-1]


class Clock:
    """A ``time.monotonic`` the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module, "monotonic", clock)
    return clock


def selfsup_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "selfsup"]


def test_the_bar_and_its_eta_survive_an_80_column_terminal():
    console, buffer = terminal(80)
    bar = Progress("pretrain", 4000, console=console)
    bar.update(2000, TRAINING_INFO)
    bar.update(3000, TRAINING_INFO)  # two updates: rich knows a rate, hence an ETA
    bar.close()  # the bar's last state stays on the terminal
    line = last_line(buffer)
    assert len(line) <= 80
    assert re.fullmatch(r"pretrain ━{15}\s+75%\s+3000/4000 ETA \d:\d\d:\d\d step=3000 .*…", line), line
    # a label longer than the room left is cut, not the bar
    console, buffer = terminal(80)
    with Progress("decoding " + "a_very_long_folder_name_" * 3, 10, console=console) as bar:
        bar.update(5, "x" * 60)
        bar.update(6, "x" * 60)
    line = last_line(buffer)
    assert re.fullmatch(r"decoding a\S*… ━{12}\s+60%\s+6/10 ETA \d:\d\d:\d\d x+…", line), line
    assert len(line) <= 80


def test_log_lines_carry_count_percent_and_eta_when_stderr_is_not_a_terminal(clock, caplog):
    caplog.set_level(logging.INFO, logger="selfsup")
    # training (trainer.progress on, stderr a file): a line per logged row; resumed at step 20
    training = TrainingProgress(enabled=True, total=100, start=20)
    clock.now += 10.0
    training.update(30, "step=30 loss=2.5", force_log=False)  # not a logged row: no line
    clock.now += 10.0
    training.update(40, "step=40 loss=1.5", force_log=True)
    training.close()
    # 20 steps in 20 s since the resume: 1 step/s, 60 steps left
    assert selfsup_lines(caplog) == ["pretrain 40/100 steps (40%) ETA 0:01:00 | step=40 loss=1.5"]
    caplog.clear()
    # any other loop: a line at most every LOG_INTERVAL_S (30 s), none before the first 30 s, a last one at the end
    bar = Progress("features", 10, unit="batches")
    for seconds in (10.0, 10.0, 11.0, 9.0, 21.5):  # t = 10, 20, 31, 40, 61.5
        clock.now += seconds
        bar.advance()
    clock.now += 8.5
    bar.close()
    # 3 batches in 31 s: 7 left take 72.3 s; 5 in 61.5 s: 5 left take 61.5 s
    assert selfsup_lines(caplog) == ["features 3/10 batches (30%) ETA 0:01:12",
                                     "features 5/10 batches (50%) ETA 0:01:02",
                                     "features 5 batches done in 0:01:10"]


def test_a_short_loop_prints_nothing_when_stderr_is_not_a_terminal(clock, caplog, capsys):
    caplog.set_level(logging.INFO, logger="selfsup")
    for _ in track(range(5), "k-means restarts", unit="fits", leave=False):
        clock.now += 5.0
    # a first unit slower than the interval: still no 0 % line
    bar = Progress("low-shot fits", 4, unit="fits")
    clock.now += 45.0
    bar.update(0)
    bar.close()
    assert selfsup_lines(caplog) == []
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_bars_open_at_once_share_one_display(monkeypatch):
    console, buffer = terminal(80)
    monkeypatch.setattr(progress_module, "_stderr_console", lambda: console)
    with Progress("eval all", 3, unit="evaluations") as outer:
        for _ in track(range(4), "linear probe", unit="epochs", leave=False):  # a second bar while one is live
            pass
        outer.advance()
    assert progress_module._Shared.display is None and progress_module._Shared.users == 0
    assert re.fullmatch(r"eval all [━╸]+\s+33% 1/3 ETA .*", last_line(buffer))
