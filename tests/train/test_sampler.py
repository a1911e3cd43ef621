"""StepSampler: a batch is a pure function of the global step; ranks split the global batch."""

from __future__ import annotations

import pytest
import torch

from selfsup.config import ConfigError
from selfsup.data.sampler import StepSampler


def test_each_index_at_most_once_per_epoch() -> None:
    s = StepSampler(num_samples=23, global_batch=5, seed=3)
    assert s.steps_per_epoch == 4  # the last incomplete batch (3 images) is dropped
    for epoch in range(3):
        seen = torch.cat([s.indices(epoch * 4 + i) for i in range(4)])
        assert len(seen) == 20 and len(set(seen.tolist())) == 20
        assert seen.min() >= 0 and seen.max() < 23
    assert all(len(s.indices(step)) == 5 for step in range(12))


def test_epochs_are_different_permutations() -> None:
    s = StepSampler(num_samples=40, global_batch=8, seed=0)
    assert not torch.equal(s.indices(0), s.indices(5))  # step 0 of epoch 0 vs step 0 of epoch 1
    other_seed = StepSampler(num_samples=40, global_batch=8, seed=1)
    assert not torch.equal(s.indices(0), other_seed.indices(0))


def test_deterministic_regardless_of_query_order() -> None:
    steps = list(range(15))
    forward = StepSampler(num_samples=30, global_batch=6, seed=7)
    expected = {step: forward.indices(step).clone() for step in steps}
    shuffled = StepSampler(num_samples=30, global_batch=6, seed=7)
    order = [14, 0, 9, 3, 3, 12, 1, 7, 5, 10, 2, 13, 4, 11, 6, 8]  # jumps across epochs (5 steps each)
    for step in order:
        assert torch.equal(shuffled.indices(step), expected[step]), step
    resumed = StepSampler(num_samples=30, global_batch=6, seed=7)  # e.g. a resumed run starting at step 11
    assert torch.equal(resumed.indices(11), expected[11])


def test_ranks_get_disjoint_slices_of_the_global_batch() -> None:
    whole = StepSampler(num_samples=50, global_batch=12, seed=2)
    ranks = [StepSampler(num_samples=50, global_batch=12, seed=2, rank=r, world_size=3) for r in range(3)]
    for step in [0, 1, 3, 4, 9]:
        parts = [r.indices(step) for r in ranks]
        assert all(len(p) == 4 for p in parts)
        assert len(set(torch.cat(parts).tolist())) == 12
        assert torch.equal(torch.cat(parts), whole.indices(step))


def test_errors() -> None:
    with pytest.raises(ConfigError, match="trainer.batch_size: 16; the training split has only 10 images"):
        StepSampler(num_samples=10, global_batch=16)
    with pytest.raises(ValueError, match="divisible"):
        StepSampler(num_samples=100, global_batch=10, world_size=4)
