"""Collectives for losses with batch statistics.

``gather_with_grad`` concatenates a tensor over all processes and routes gradients back: each
process receives the *sum* over processes of the gradient w.r.t. its own slice. DDP then averages
parameter gradients over the W processes, so a loss that every process computes on the gathered
batch gets exactly the single-process gradient (tests/losses/test_ddp_equivalence.py proves it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.batch = x.shape[0]
        ctx.rank = dist.get_rank()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.batch:(ctx.rank + 1) * ctx.batch]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` (same shape on every process) along dim 0 over all processes, with gradients."""
    return _GatherWithGrad.apply(x) if is_distributed() else x


@torch.no_grad()
def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` along dim 0 over all processes, without gradients (queues, monitors)."""
    if not is_distributed():
        return x.detach()  # no gradient on one process either, as the docstring promises
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)


def all_reduce_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over processes (no gradient through the reduction); identity on one process."""
    if not is_distributed():
        return x.detach()
    x = x.detach().clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x / dist.get_world_size()


class _AllReduceMeanWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x / dist.get_world_size()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad / dist.get_world_size()


def all_reduce_mean_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over processes, with gradients (MSN's mean prediction for ME-MAX).

    Backward follows the ``gather_with_grad`` convention: each process receives the sum over
    processes of the gradient w.r.t. its own ``x``, so after DDP's gradient averaging a loss of the
    global mean gets exactly the single-process gradient. Identity on one process.
    """
    return _AllReduceMeanWithGrad.apply(x) if is_distributed() else x
