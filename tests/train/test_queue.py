"""The support queue: FIFO order, unit rows, top-k lookup (uniform among the k nearest), distributed enqueue."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from ddp_utils import run_ddp
from selfsup.config import ConfigError
from selfsup.methods import check_dataset
from selfsup.train.queue import FeatureQueue


def test_push_overwrites_the_oldest_rows_in_order_and_cycles() -> None:
    torch.manual_seed(0)
    queue = FeatureQueue(12, 3)
    assert torch.allclose(queue.features.norm(dim=1), torch.ones(12))
    batches = [F.normalize(torch.randn(4, 3), dim=1) for _ in range(4)]
    for i, z in enumerate(batches[:3]):
        queue.push(z * (i + 2))  # rows are stored unit-norm whatever their length
        assert torch.allclose(queue.features[4 * i:4 * i + 4], z)
        assert int(queue.pointer) == (4 * i + 4) % 12
    queue.push(batches[3])  # K / B = 3 pushes cycled it: the fourth overwrites the first
    assert torch.allclose(queue.features[:4], batches[3]) and torch.allclose(queue.features[4:8], batches[1])
    with pytest.raises(ValueError, match="multiple of the global batch 5"):
        queue.push(torch.randn(5, 3))


@pytest.mark.parametrize("spec, hazard", [({"name": "nnclr"}, "its nearest neighbour (a self-positive)"),
                                          ({"name": "extrema", "loss": "infonce"}, "one of its own negatives")])
def test_a_queue_that_holds_an_epoch_is_refused_with_a_size_that_fits(spec, hazard) -> None:
    """Every method with a queue refuses one as large as its training split (the bound itself included), and suggests
    a fitting size: a quarter of the 1,024 images rounded down to a multiple of the batch of 64 (256)."""
    spec = {**spec, "queue_size": 1024}
    with pytest.raises(ConfigError, match=rf"method.queue_size: 1024 >= the 1024 training images: .*{re.escape(hazard)}; "
                                          r"use method.queue_size=256 "):
        check_dataset(spec, 1024, 64)
    check_dataset(spec, 1025, 64)  # one image more than the queue holds: accepted


def test_top1_is_the_nearest_neighbour_and_topk_draws_uniformly_among_the_k_nearest() -> None:
    torch.manual_seed(0)
    queue = FeatureQueue(50, 8)
    z = F.normalize(torch.randn(6, 8, requires_grad=True), dim=1)
    sim = z.detach() @ queue.features.t()
    assert torch.equal(queue.nearest(z, 1), queue.features[sim.argmax(1)])
    top = sim.topk(5, dim=1).indices
    counts = torch.zeros(5)
    for _ in range(2000):
        picked = queue.nearest(z, 5)
        assert not picked.requires_grad
        index = (picked.unsqueeze(1) == queue.features.unsqueeze(0)).all(-1).float().argmax(1)  # rows of the queue
        rank = (top == index.unsqueeze(1)).float().argmax(1)
        assert (top == index.unsqueeze(1)).any(1).all()  # always among the 5 nearest
        counts += torch.bincount(rank, minlength=5)
    expected = counts.sum() / 5
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5, counts  # chi-square, 4 degrees of freedom, p = 0.001


def _enqueue_rank(rank: int, world: int, z: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)  # the same initial queue on every process, as the same seed gives
    queue = FeatureQueue(8, 3)
    queue.push(z[rank * 2:(rank + 1) * 2])
    return queue.features.clone()


@pytest.mark.multiprocess
def test_distributed_enqueue_writes_every_process_rows_in_rank_order() -> None:
    z = F.normalize(torch.randn(4, 3), dim=1)
    results = run_ddp(_enqueue_rank, 2, z)
    torch.testing.assert_close(results[0], results[1])
    torch.testing.assert_close(results[0][:4], z)  # rank 0's rows, then rank 1's
    torch.manual_seed(0)
    assert torch.equal(results[0][4:], FeatureQueue(8, 3).features[4:])  # the rest untouched
