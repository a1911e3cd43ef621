"""Run a function in ``world_size`` CPU processes joined by a gloo process group (DDP-equivalence tests).

Usage::

    from ddp_utils import run_ddp

    def _on_rank(rank, world_size, x):
        ...
        return {"loss": loss.detach()}   # tensors / numbers / dicts / lists (saved with torch.save)

    results = run_ddp(_on_rank, 2, x)    # one result per rank, in rank order

The process group is initialised from a FileStore in a fresh temporary directory (no ports to
pick), with one intra-op thread per process. On Linux without CUDA the workers are *forked*: they inherit the
already-imported torch (spawning would re-import torch, and DistributedDataParallel's lazy import
of torch._dynamo, in every worker: ~5 s of CPU each on the 2-core machine). Elsewhere they are
spawned, and ``fn`` must then be defined at module level. An exception in a worker is re-raised
in the calling process by ``torch.multiprocessing``.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Forking is unsafe once CUDA's autograd threads may run in the parent (a test before this one used the GPU).
START_METHOD = ("fork" if "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_available()
                else "spawn")

if START_METHOD == "fork":
    # DistributedDataParallel.__init__ lazily imports torch._dynamo (~800 modules, seconds of CPU):
    # import it once here, before forking, instead of once in every worker.
    import torch._dynamo  # noqa: F401
    import torch.distributed._functional_collectives  # noqa: F401


def _worker(rank: int, world_size: int, fn: Callable[..., Any], args: tuple, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank,
                            world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ddp(fn: Callable[..., Any], world_size: int = 2, *args: Any) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on every rank of a gloo group; return the results in rank order."""
    if dist.is_initialized():
        raise RuntimeError("run_ddp must be called from a process without a default process group")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world_size, fn, args, tmp), nprocs=world_size, join=True,
                           start_method=START_METHOD)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
