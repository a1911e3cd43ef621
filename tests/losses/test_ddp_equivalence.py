"""Losses with batch statistics: 2 gloo processes on CPU == 1 process on the whole batch (GUIDE §6).

Each rank holds its half of the batch; the loss gathers the global batch with
``gather_with_grad``. Every rank must see the single-process loss, get ``world_size x`` the
single-process gradient on its own slice (the gradient all-reduce sums), and a model wrapped in
DistributedDataParallel (which averages parameter gradients) must get exactly the single-process
full-batch parameter gradient. All checks share one spawn to keep the test fast.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_ddp
from selfsup.losses.barlow import barlow_twins_loss
from selfsup.losses.infonce import info_nce_loss, moco_contrastive_loss, nt_xent_loss
from selfsup.losses.mast import mast_loss
from selfsup.losses.multiview import barlow_twins_multiview_loss, vicreg_multiview_loss
from selfsup.losses.vicreg import vicreg_loss
from selfsup.train import distributed

WORLD = 2
BATCH, DIM, IN_DIM = 8, 5, 6


def _mast(a, b, **options):
    """MAST on means a, b; variances from them; masks fixed; the active subspaces a function of each row (stay with
    it)."""
    return mast_loss(a, nn.functional.softplus(a), b, nn.functional.softplus(b.flip(1)),
                     torch.linspace(0, 1, DIM * 2, dtype=a.dtype).view(DIM, 2), (a[:, :2] > 0).to(a.dtype), **options)[0]


# Every loss that gathers the batch over processes; add new ones here.
LOSSES = {
    "vicreg": lambda a, b: vicreg_loss(a, b)[0],
    "barlow_twins": lambda a, b: barlow_twins_loss(a, b, lambd=0.1)[0],
    # M = 3 views: the two inputs and a third one made from both (its rows stay with their samples).
    "barlow_twins_multiview": lambda a, b: barlow_twins_multiview_loss([a, b, 0.5 * (a + b.flip(1))], lambd=0.1)[0],
    "vicreg_multiview": lambda a, b: vicreg_multiview_loss([a, b, 0.5 * (a + b.flip(1))])[0],
    "mast": lambda a, b: _mast(a, b),
    # The guard's batch means (per dimension) are batch statistics too.
    "mast_scale_free_dimension": lambda a, b: _mast(a, b, scale_free=True, variance_scale="dimension"),
}

# Contrastive losses whose negatives are the other processes' rows: each process averages over its own queries
# (its loss is its share, the mean over processes is the single-process loss), and DDP's gradient averaging must
# give the single-process gradient.
LOCAL_MEAN_LOSSES = {
    # MoCo v3's symmetric ctr(q1, k2) + ctr(q2, k1); the keys are constants (gathered without gradient).
    "mocov3": lambda a, b: moco_contrastive_loss(a, b, 0.2) + moco_contrastive_loss(b, a, 0.2),
    # NNCLR / MAE-CT: gradients into every process's keys through the all-gather.
    "info_nce_key_gradient": lambda a, b: info_nce_loss(a, b, 0.15, key_gradient=True),
    # SimCLR: the 2N views of the global batch, gathered with gradients, every one an anchor.
    "nt_xent": lambda a, b: nt_xent_loss(a, b, 0.5),
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    z_a = torch.randn(BATCH, DIM, generator=g, dtype=torch.float64) * 0.6
    z_b = z_a + 0.3 * torch.randn(BATCH, DIM, generator=g, dtype=torch.float64)
    x_a = torch.randn(BATCH, IN_DIM, generator=g, dtype=torch.float64)
    x_b = x_a + 0.2 * torch.randn(BATCH, IN_DIM, generator=g, dtype=torch.float64)
    linear = nn.Linear(IN_DIM, DIM).double()
    return z_a, z_b, x_a, x_b, {k: v.clone() for k, v in linear.state_dict().items()}


def _on_rank(rank: int, world: int, z_a, z_b, x_a, x_b, linear_state) -> dict:
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    out: dict = {
        "is_distributed": distributed.is_distributed(),
        "world_size": distributed.world_size(),
        "rank": distributed.rank(),
        "gather_no_grad": distributed.gather_no_grad(z_a[local]),
        "all_reduce_mean": distributed.all_reduce_mean(torch.tensor([float(rank + 1)])),
    }
    for name, loss_fn in {**LOSSES, **LOCAL_MEAN_LOSSES}.items():
        a = z_a[local].clone().requires_grad_()
        b = z_b[local].clone().requires_grad_()
        loss = loss_fn(a, b)
        loss.backward()
        out[name] = {"loss": loss.detach(), "grad_a": a.grad, "grad_b": b.grad}

        model = nn.Linear(IN_DIM, DIM).double()
        model.load_state_dict(linear_state)
        ddp = DistributedDataParallel(model)
        z = ddp(torch.cat([x_a[local], x_b[local]]))
        ddp_loss = loss_fn(*z.chunk(2))
        ddp_loss.backward()
        out[name]["ddp_loss"] = ddp_loss.detach()
        out[name]["ddp_grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


@pytest.mark.multiprocess
def test_losses_match_single_process_in_two_gloo_processes() -> None:
    z_a, z_b, x_a, x_b, linear_state = _inputs()
    results = run_ddp(_on_rank, WORLD, z_a, z_b, x_a, x_b, linear_state)

    for rank, res in enumerate(results):
        assert res["is_distributed"] is True
        assert res["world_size"] == WORLD
        assert res["rank"] == rank
        torch.testing.assert_close(res["gather_no_grad"], z_a)
        torch.testing.assert_close(res["all_reduce_mean"], torch.tensor([1.5]))

    for name, loss_fn in {**LOSSES, **LOCAL_MEAN_LOSSES}.items():
        a, b = z_a.clone().requires_grad_(), z_b.clone().requires_grad_()
        loss = loss_fn(a, b)
        loss.backward()
        assert a.grad.abs().max() > 1e-3  # a non-trivial gradient, so the comparison means something

        model = nn.Linear(IN_DIM, DIM).double()
        model.load_state_dict(linear_state)
        full_loss = loss_fn(*model(torch.cat([x_a, x_b])).chunk(2))
        full_loss.backward()

        if name in LOCAL_MEAN_LOSSES:  # each process's share: their mean is the loss
            assert sum(res[name]["loss"].item() for res in results) / WORLD == pytest.approx(loss.item(), rel=1e-12)
            assert sum(res[name]["ddp_loss"].item() for res in results) / WORLD == pytest.approx(full_loss.item(),
                                                                                                rel=1e-12)
        for rank, res in enumerate(results):
            local = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
            r = res[name]
            if name not in LOCAL_MEAN_LOSSES:
                assert r["loss"].item() == pytest.approx(loss.item(), rel=1e-12), (name, rank)
                assert r["ddp_loss"].item() == pytest.approx(full_loss.item(), rel=1e-12), (name, rank)
            torch.testing.assert_close(r["grad_a"], WORLD * a.grad[local], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(r["grad_b"], WORLD * b.grad[local], rtol=1e-10, atol=1e-12)
            for pname, p in model.named_parameters():
                torch.testing.assert_close(r["ddp_grads"][pname], p.grad, rtol=1e-10, atol=1e-12,
                                           msg=f"{name} rank {rank} {pname}")
