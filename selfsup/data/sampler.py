"""Batch indices as a pure function of the global step, so a resumed run sees the same batches."""

from __future__ import annotations

import torch

from selfsup.config import ConfigError


class StepSampler:
    """Epoch ``e`` is a permutation seeded with ``(seed, e)``; step ``s`` takes the ``s``-th global batch.

    Each of the ``world_size`` processes takes its contiguous slice of the global batch. The last
    incomplete batch of an epoch is dropped (batch statistics need full batches).
    """

    def __init__(self, num_samples: int, global_batch: int, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if global_batch % world_size:
            raise ConfigError(f"trainer.batch_size={global_batch} must be divisible by the number of processes "
                              f"({world_size})")
        if num_samples < global_batch:
            # Known once the data is listed, before any model is built: a bad input (exit 2), not a crash.
            raise ConfigError(f"bad value for trainer.batch_size: {global_batch}; the training split has only "
                              f"{num_samples} images (a step needs a full batch): lower trainer.batch_size to at "
                              f"most {num_samples}, or use more data (data.fraction, another split)")
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.rank, self.local_batch = rank, global_batch // world_size
        self.steps_per_epoch = num_samples // global_batch
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> torch.Tensor:
        epoch, position = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_samples, generator=generator)
        start = position * self.global_batch + self.rank * self.local_batch
        return self._perm[start:start + self.local_batch]
