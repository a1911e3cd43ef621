"""DINO's and iBOT's centres in 2 gloo processes == 1 process on the whole batch (GUIDE §6).

The cross-entropies are per sample, so each rank's loss is its half's mean and DDP's gradient averaging gives the
whole batch's gradient; the centres are batch statistics: their batch mean is all-reduced, so both ranks keep the
whole batch's centre, and the *second* step (which uses it) still equals one process. Two steps run on each side.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ddp_utils import run_ddp
from selfsup.losses.dino import TeacherCentre, dino_loss
from selfsup.losses.ibot import ibot_loss

WORLD = 2
BATCH, IN_DIM, K, TOKENS = 8, 6, 5, 3
VIEWS, GLOBAL = 3, 2


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, VIEWS, BATCH, IN_DIM, generator=g, dtype=torch.float64)  # two steps' student inputs
    teacher = 3 * torch.randn(2, GLOBAL, BATCH, K, generator=g, dtype=torch.float64)
    patches = torch.randn(2, GLOBAL, BATCH, TOKENS, IN_DIM, generator=g, dtype=torch.float64)
    teacher_patches = 3 * torch.randn(2, GLOBAL, BATCH, TOKENS, K, generator=g, dtype=torch.float64)
    masks = torch.rand(2, GLOBAL, BATCH, TOKENS, generator=g) > 0.5
    linear = nn.Linear(IN_DIM, K).double()
    return {"x": x, "teacher": teacher, "patches": patches, "teacher_patches": teacher_patches, "masks": masks,
            "state": {k: v.clone() for k, v in linear.state_dict().items()}}


def _steps(data: dict, rows: slice, wrap) -> dict:
    """Two steps of each loss on ``rows`` of the batch, with a (DDP-wrapped) linear student."""
    out: dict = {}
    for name in ("dino", "ibot"):
        model = nn.Linear(IN_DIM, K).double()
        model.load_state_dict(data["state"])
        student = wrap(model)
        centre, patch_centre = TeacherCentre(K, 0.9).double(), TeacherCentre(K, 0.8).double()
        for step in range(2):
            model.zero_grad()
            s = [student(data["x"][step, v, rows]) for v in range(VIEWS)]
            t = list(data["teacher"][step, :, rows])
            if name == "dino":
                loss, _ = dino_loss(s, t, centre, 0.1, 0.04)
            else:
                sp = [student(data["patches"][step, v, rows]) for v in range(GLOBAL)]
                loss, _ = ibot_loss(s, t, sp, list(data["teacher_patches"][step, :, rows]),
                                    list(data["masks"][step, :, rows]), centre, patch_centre, 0.1, 0.04, 0.07)
            loss.backward()
            out[f"{name}/{step}/loss"] = loss.detach()
            out[f"{name}/{step}/grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
            out[f"{name}/{step}/centre"] = centre.center.clone()
            out[f"{name}/{step}/patch_centre"] = patch_centre.center.clone()
    return out


def _on_rank(rank: int, world: int, data: dict) -> dict:
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    return _steps(data, rows, DistributedDataParallel)


@pytest.mark.multiprocess
def test_dino_and_ibot_centres_match_single_process_in_two_gloo_processes() -> None:
    data = _inputs()
    single = _steps(data, slice(None), lambda m: m)
    results = run_ddp(_on_rank, WORLD, data)
    for name in ("dino", "ibot"):
        assert single[f"{name}/1/centre"].abs().max() > 0.05  # the centre moved, so the second step depends on it
        for step in range(2):
            key = f"{name}/{step}"
            rank_mean = sum(r[f"{key}/loss"] for r in results) / WORLD  # equal halves: the mean of the halves
            assert rank_mean.item() == pytest.approx(single[f"{key}/loss"].item(), rel=1e-12), key
            for rank, r in enumerate(results):
                for c in ("centre", "patch_centre"):
                    torch.testing.assert_close(r[f"{key}/{c}"], single[f"{key}/{c}"], rtol=1e-12, atol=1e-14,
                                               msg=f"{key} rank {rank} {c}")
                for pname, grad in single[f"{key}/grads"].items():
                    assert grad.abs().max() > 1e-4
                    torch.testing.assert_close(r[f"{key}/grads"][pname], grad, rtol=1e-10, atol=1e-12,
                                               msg=f"{key} rank {rank} {pname}")
