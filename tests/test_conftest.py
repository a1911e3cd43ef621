"""The suite's own guards (tests/conftest.py): a test that leaves a process-wide setting changed is an error naming
it, and the setting is put back for the tests after it."""

from __future__ import annotations

import signal
from pathlib import Path

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


def test_a_test_that_leaves_a_stop_signal_handler_is_an_error_and_the_handler_is_put_back(pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner="""
        import os, signal, torch

        def test_leaves_a_handler():
            signal.signal(signal.SIGTERM, lambda *a: None)

        def test_leaves_threads_and_environment():
            torch.set_num_threads(3)
            os.environ["SELFSUP_LEFT_BEHIND"] = "1"

        def test_restores_what_it_changes(monkeypatch):
            monkeypatch.setenv("SELFSUP_PUT_BACK", "1")
            monkeypatch.chdir(os.path.dirname(__file__))
    """)
    before = signal.getsignal(signal.SIGTERM)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*test_leaves_a_handler changed process-wide settings*signal handlers*SIGTERM*",
                                 "*torch.get_num_threads(): 1 -> 3*environment: {'SELFSUP_LEFT_BEHIND': None} -> "
                                 "{'SELFSUP_LEFT_BEHIND': '1'}*"])
    assert signal.getsignal(signal.SIGTERM) == before
