"""The linear probe, low-shot fits and k-means restarts show progress bars when asked (and only then) on a
terminal, and write nothing at all when stderr is not one (short loops: no bar at 0 % leaks into a log file)."""

from __future__ import annotations

import io
import logging

import numpy as np
from rich.console import Console

import selfsup.progress as progress_module
from selfsup.eval.clustering import kmeans_cluster
from selfsup.eval.linear import linear_probe
from selfsup.eval.lowshot import lowshot_logistic

LABELS = ("linear probe: 1 (lr, wd) pairs", "linear probe: final head", "low-shot fits", "k-means restarts")


def evaluate(progress: bool) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)).astype(np.float32), np.repeat(np.arange(4), 50)
    linear_probe(x, y, x, y, lrs=[1e-2], weight_decays=[0.0], epochs=2, progress=progress)
    lowshot_logistic(x, y, x, y, shots=[1], percents=[], num_splits=2, progress=progress)
    kmeans_cluster(x, y, n_init=2, progress=progress)


def test_evaluations_report_progress_on_request(monkeypatch, capsys, caplog):
    caplog.set_level(logging.INFO, logger="selfsup")
    buffer = io.StringIO()
    terminal = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    monkeypatch.setattr(progress_module, "_stderr_console", lambda: terminal)
    for progress in (False, True):
        evaluate(progress)
        drawn = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        for label in LABELS:
            assert (label in drawn) == progress, (label, progress)
    # stderr not a terminal: these loops end within seconds, so not a line, not a 0 % bar
    monkeypatch.undo()
    evaluate(True)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert not [r.getMessage() for r in caplog.records if r.name == "selfsup"]
