"""Shared test settings and guards.

- One intra-op torch thread per test process: tiny tensors run faster so, and the suite's two pytest-xdist workers
  (``make test`` runs ``-n 2``) each keep to one core.
- A test marked ``multiprocess`` starts processes that keep both cores busy (two gloo ranks): it runs alone. It takes
  an exclusive lock that every other test takes shared, across the xdist workers, so the machine is never
  oversubscribed and the other worker waits instead of halving both tests' speed.
- Every test leaves the process as it found it: signal handlers, torch's thread count, default dtype and grad mode,
  the working directory, the environment and the umask are compared after each test; a change is put back and
  reported as an error of that test, naming the setting (a stop-signal handler left behind once made the pytest
  process ignore CI's SIGTERM).
- Hypothesis draws the same examples on every run (``derandomize``): CI is reproducible, and a failure found once is
  found again.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

# Imported before any test, since importing them sets environment variables (PYTORCH_NVML_BASED_CUDA_CHECK,
# TORCHINDUCTOR_CACHE_DIR, KMP_*): the first test to train in this process would otherwise be blamed for them.
import lightning.fabric  # noqa: F401
import pytest
import sklearn  # noqa: F401
import torch
import torch._inductor.config  # noqa: F401
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("selfsup", derandomize=True, database=None, deadline=None)
settings.load_profile("selfsup")

# SIGCHLD: torch's DataLoader installs its handler once per process, at the first loader with workers (it chains to
# the one before); that is torch's, not a test's.
pytest_plugins = ["pytester"]  # tests/test_conftest.py runs these guards on tests of its own

SIGNALS = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# pytest names the running test here: not a test's doing.
OWN_ENVIRONMENT = {"PYTEST_CURRENT_TEST"}


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in OWN_ENVIRONMENT}


def restore_environment(env: dict[str, str]) -> None:
    for key in set(os.environ) - set(env) - OWN_ENVIRONMENT:
        del os.environ[key]
    os.environ.update(env)


# Each process-wide setting a test could change: how to read it, and how to put it back.
SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "signal handlers": (lambda: {s: signal.getsignal(s) for s in SIGNALS},
                        lambda handlers: [signal.signal(s, h) for s, h in handlers.items() if h is not None]),
    "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
    "working directory": (os.getcwd, os.chdir),
    "environment": (environment, restore_environment),
    "umask": (_umask, os.umask),
}


def changed_settings(before: dict[str, Any]) -> list[str]:
    """The settings that differ from ``before``, each put back, described as 'name: before -> after'."""
    changes = []
    for name, (read, restore) in SETTINGS.items():
        now = read()
        if now != before[name]:
            if isinstance(now, dict):
                keys = sorted(k for k in now.keys() | before[name].keys() if now.get(k) != before[name].get(k))
                now, was = {k: now.get(k) for k in keys}, {k: before[name].get(k) for k in keys}
            else:
                was = before[name]
            changes.append(f"{name}: {was!r} -> {now!r}")
            restore(before[name])
    return changes


@pytest.fixture(autouse=True)
def process_left_as_found(request) -> Iterator[None]:
    before = {name: read() for name, (read, _) in SETTINGS.items()}
    yield
    changes = changed_settings(before)
    if changes:
        pytest.fail(f"{request.node.nodeid} changed process-wide settings (put back now; the test must restore them, "
                    f"e.g. with monkeypatch): " + "; ".join(changes), pytrace=False)


def pytest_configure(config) -> None:
    """An xdist worker dies with the pytest process that started it: a CI time-out's SIGTERM ends that process
    (it runs no test, so nothing defers the signal), and the workers must not run on without it."""
    if "PYTEST_XDIST_WORKER" in os.environ and sys.platform == "linux":
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def cores(folder: Path, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock over the xdist workers (flock: released by the OS if a worker dies). The gate makes it
    fair: a test waiting for the cores alone holds the gate, so no new shared holder can starve it."""
    with open(folder / "cores.gate", "a") as gate, open(folder / "cores.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around the whole test (its fixtures' set-up and tear-down included): the cores lock, under xdist."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    # The workers' base temporary folders are siblings in one folder that is this session's alone.
    folder = item.config._tmp_path_factory.getbasetemp().parent
    with cores(folder, exclusive=item.get_closest_marker("multiprocess") is not None):
        yield
