"""A FIFO support set of past embeddings and its nearest-neighbour lookup (NNCLR, Dwibedi et al. 2021; MAE-CT's
top-k variant, Lehner et al. 2023, Eq. 1). One implementation for every method that keeps a queue."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from selfsup.config import ConfigError
from selfsup.train.distributed import gather_no_grad


def check_queue_batch(queue_size: int, global_batch: int) -> None:
    """Each step pushes the global batch: a queue (``method.queue_size``) must hold a whole number of batches."""
    if queue_size % global_batch:
        raise ConfigError(f"bad value for method.queue_size: {queue_size} is not a multiple of the global batch "
                          f"{global_batch}; use e.g. {max(1, queue_size // global_batch) * global_batch}")


def check_queue_dataset(queue_size: int, num_images: int, global_batch: int, hazard: str) -> None:
    """Refuse a queue (``method.queue_size``) that holds a whole epoch: it would hold each image's own embedding from
    its last visit, which ``hazard`` names for the method (its nearest neighbour, or one of its negatives). Below the
    bound, an image drawn near the end of one epoch and near the start of the next can still meet its own earlier
    embedding; the chance grows as the queue nears the dataset's size, so keep it a small fraction of it."""
    if queue_size >= num_images:
        fit = max(global_batch, (num_images // 4) // global_batch * global_batch)
        raise ConfigError(f"bad value for method.queue_size: {queue_size} >= the {num_images} training images: "
                          f"the queue would hold each image's own earlier embedding, {hazard}; use "
                          f"method.queue_size={fit} (a multiple of trainer.batch_size well below the dataset size) "
                          f"or more images")


class FeatureQueue(nn.Module):
    """``size`` unit vectors of width ``dim`` (buffers, so checkpoints and stages carry them), oldest overwritten first.

    It starts as random unit vectors (the MAE-CT code): until it has cycled once, some neighbours are random.
    """

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        if size < 1 or dim < 1:
            raise ValueError(f"a queue needs size >= 1 and dim >= 1, got size={size}, dim={dim}")
        self.register_buffer("features", F.normalize(torch.randn(size, dim), dim=1))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))
        self._pending: torch.Tensor | None = None

    def push_after_step(self, z: torch.Tensor) -> None:
        """Hold ``z`` for :meth:`push_pending`: a step's rows enter only after its backward, which may still need the
        queue's current contents."""
        self._pending = z

    def push_pending(self) -> None:
        """:meth:`push` the rows held by :meth:`push_after_step`, if any (the method's ``after_step``)."""
        if self._pending is not None:
            self.push(self._pending)
            self._pending = None

    @torch.no_grad()
    def nearest(self, z: torch.Tensor, k: int = 1) -> torch.Tensor:
        """For each row of ``z`` (unit vectors), a queue entry drawn uniformly among its ``k`` most cosine-similar
        ones (k = 1: the nearest neighbour). Constants: no gradient flows through the lookup."""
        if not 1 <= k <= len(self.features):
            raise ValueError(f"top-k lookup needs 1 <= k <= queue size {len(self.features)}, got k={k}")
        candidates = (z.detach() @ self.features.t()).topk(k, dim=1).indices  # (B, k)
        pick = torch.randint(0, k, (len(z),), device=z.device)
        return self.features[candidates[torch.arange(len(z), device=z.device), pick]]

    @torch.no_grad()
    def push(self, z: torch.Tensor) -> None:
        """Write the rows of ``z`` from every process (all-gathered, in rank order) over the oldest entries."""
        z = F.normalize(gather_no_grad(z).to(self.features.dtype), dim=1)
        size, n = len(self.features), len(z)
        if size % n:
            raise ValueError(f"the queue size {size} must be a multiple of the global batch {n} (the MAE-CT code's "
                             f"assertion), e.g. {max(1, size // n) * n}")
        # rows pointer .. pointer + n - 1 (no wrap: size is a multiple of n), written without reading the pointer
        # back to the host (which would wait for the device's work)
        rows = self.pointer + torch.arange(n, device=self.pointer.device)
        self.features.index_copy_(0, rows, z)
        self.pointer.add_(n).remainder_(size)
