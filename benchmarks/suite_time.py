"""The test suite's time, an older revision's against this checkout's, one after the other on this machine.

    python benchmarks/suite_time.py --before efcd4fe [--before-args "-q"] [--after-args "-q -n auto --dist worksteal"]

Each revision runs with this checkout's virtual environment: the older one from a temporary git worktree, its
``selfsup`` first on the path (checked: the run fails if it imports this checkout's), with the pytest arguments
its own ``make test`` used; this checkout with today's. Prints one JSON object: the wall and CPU seconds of each
(CPU: user + system of pytest and every process it started), its pytest summary line, their ratio, and the CPU
model. Only the ratio carries over to another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_pytest(tree: Path, args: list[str]) -> dict:
    """pytest in ``tree`` with ``args``, importing that tree's selfsup: wall and CPU seconds, the summary line."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    imported = subprocess.run([sys.executable, "-c", "import selfsup; print(selfsup.__file__)"], cwd=tree, env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
    if not Path(imported).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"error: {tree} imports selfsup from {imported}, not its own")
    cpu, start = children_cpu_s(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    lines = proc.stdout.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), "")
    return {"args": " ".join(args), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "exit_code": proc.returncode,
            "summary": summary}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision of the older suite")
    parser.add_argument("--before-args", default="-q", help="its pytest arguments (its make test's)")
    parser.add_argument("--after-args", default="-q -n auto --dist worksteal", help="this checkout's (make test's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.before], cwd=REPO, check=True,
                       capture_output=True)
        try:
            before = timed_pytest(worktree, shlex.split(args.before_args))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)
    after = timed_pytest(REPO, shlex.split(args.after_args))
    result = {"before": {"revision": args.before, **before}, "after": after,
              "wall_ratio": round(before["wall_s"] / after["wall_s"], 2), "cpu": cpu_model(), "cores": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
