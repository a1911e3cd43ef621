"""Single-process fallbacks of the collectives are the identity (multi-process: tests/losses/test_ddp_equivalence.py)."""

from __future__ import annotations

import torch

from selfsup.train import distributed


def test_not_distributed_without_process_group() -> None:
    assert distributed.is_distributed() is False
    assert distributed.world_size() == 1
    assert distributed.rank() == 0


def test_gather_with_grad_is_identity_and_keeps_gradient() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    y = distributed.gather_with_grad(x)
    assert y is x
    (y * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(3.0).expand(4, 3))


def test_gather_no_grad_and_all_reduce_mean_are_identity() -> None:
    x = torch.randn(5, 2)
    assert torch.equal(distributed.gather_no_grad(x), x)
    assert torch.equal(distributed.all_reduce_mean(x), x)
    # "without gradients" holds on one process too (as it does on several, where all_gather cuts the graph)
    y = torch.randn(3, requires_grad=True)
    assert not distributed.gather_no_grad(y).requires_grad
    assert not distributed.all_reduce_mean(y).requires_grad
