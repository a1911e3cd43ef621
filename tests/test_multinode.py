"""Two nodes on the real engine (issue 50): ``torchrun --nnodes 2 --nproc-per-node 1`` on localhost, gloo, each node
its own torchrun agent as on two machines, joined by a c10d rendezvous.

- The two nodes end bit-identical to the same run on one machine, one process per half of the batch (Fabric's own
  launcher, ``trainer.devices=2``): the nodes change nothing of the computation.
- Killing one node's worker mid-run (SIGKILL, as a machine lost) with ``--max-restarts 1``: both agents restart their
  workers, which resume from the last checkpoint and end bit-identical to the uninterrupted two-node run.

A single process is not bit-identical to two by design, and the test does not claim it: each process draws its
half's augmentations from a seed of (step, rank), and on the CPU each normalises BatchNorm with its own half's
statistics (SyncBatchNorm needs CUDA). What does hold for one process, every loss with batch statistics giving the
single-process value under DDP, is tested loss by loss (tests/losses, ``run_ddp``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from test_cli import TINY
from test_reliability import SIGNAL_IN_OPTIMIZER_STEP, assert_same_state

STEPS = ["trainer.max_steps=24", "trainer.checkpoint_every_steps=4", "trainer.accelerator=cpu",
         "monitor.knn_every_steps=0", "monitor.collapse_every_steps=0"]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# The worker torchrun starts on each node: ``selfsup pretrain``; on node 1's first attempt, the optimiser's step
# pre-hook SIGKILLs the worker on its 11th step (after the checkpoint of step 8), as a machine lost mid-run.
WORKER = ("import os, sys\n"
          'if os.environ["GROUP_RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" '
          'and "KILL" in os.environ:'
          + textwrap.indent(SIGNAL_IN_OPTIMIZER_STEP.format(k=11, signal="SIGKILL"), "    ")
          + "from selfsup.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def two_nodes(config: Path, run: Path, tmp_path: Path, kill: bool = False) -> list[subprocess.Popen]:
    """Start node 0 and node 1 (one torchrun agent each, one worker each) on a fresh rendezvous; ``kill``: node 1's
    first worker dies at its 11th step."""
    port, run_id = free_port(), f"test{time.monotonic_ns()}"
    (tmp_path / "worker.py").write_text(WORKER)
    # Each worker its own process-group store, not the agents' rendezvous store: with the shared store a restarted
    # worker can read the previous attempt's address of its peer (the restart counts of the two agents differ) and
    # fail to connect or hang, 2 restarts in 4 here without this (pytorch/pytorch#135712).
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               **({"KILL": "1"} if kill else {}))
    nodes = []
    for node in range(2):
        log = open(tmp_path / f"{run.name}.node{node}.log", "w")  # noqa: SIM115 - closed with the process
        nodes.append(subprocess.Popen(
            [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", run_id, "--max-restarts", "1",
             "--monitor-interval", "0.5", str(tmp_path / "worker.py"), "pretrain", str(config), f"trainer.out={run}",
             "trainer.num_nodes=2", "trainer.devices=1", *STEPS],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
    return nodes


def wait(nodes: list[subprocess.Popen], tmp_path: Path, run: Path, timeout: float = 150) -> None:
    for node, proc in enumerate(nodes):
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in nodes:
                p.kill()
            code = "timeout"
        log = (tmp_path / f"{run.name}.node{node}.log").read_text()
        assert code == 0, f"node {node}: {code}\n{log[-4000:]}"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("multinode") / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.mark.multiprocess
def test_two_torchrun_nodes_train_as_one_process_and_survive_a_killed_node(config, tmp_path):
    one_machine = tmp_path / "one_machine"
    proc = subprocess.run([sys.executable, "-m", "selfsup.cli", "pretrain", str(config), f"trainer.out={one_machine}",
                           "trainer.devices=2", *STEPS], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    reference = tmp_path / "two"
    wait(two_nodes(config, reference, tmp_path), tmp_path, reference)
    log = (tmp_path / "two.node0.log").read_text()
    assert "Starting with 2 processes" in log and "24 steps of 64 (1.0 epochs)" in log and "cpu x2" in log, log[-3000:]
    assert torch.load(reference / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["step"] == 24
    assert_same_state(one_machine, reference)

    killed = tmp_path / "killed"
    wait(two_nodes(config, killed, tmp_path, kill=True), tmp_path, killed)
    logs = [(tmp_path / f"killed.node{n}.log").read_text() for n in range(2)]
    assert "failed (exitcode: -9)" in logs[1], logs[1][-3000:]  # node 1's worker was killed, and restarted:
    assert "resuming vicreg" in logs[0] and "Starting with 2 processes" in logs[0], logs[0][-3000:]
    assert_same_state(reference, killed)
