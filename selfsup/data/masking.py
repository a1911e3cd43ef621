"""Random token masks for masked image modelling and masked Siamese methods.

A mask is given by the *kept* (visible) token indices, sorted per row, so that encoders can
gather the visible tokens (MAE, He et al. 2022; MSN, Assran et al. 2022; ExtreMA, Wu et al. 2023).
The number kept is fixed per batch: K = floor(N (1 - ratio)), at least 1.

Random draws use ``generator`` when given, otherwise torch's global CPU generator; they are made
on the generator's device (CPU by default) and moved to ``device``, so a seed gives the same
masks on every device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["num_keep", "random_keep_indices", "multi_mask_keep_indices", "keep_to_mask", "unshuffle"]


def num_keep(num_patches: int, mask_ratio: float) -> int:
    """Tokens kept at ``mask_ratio``: floor(N (1 - ratio)), but at least 1.

    ``mask_ratio`` must lie in [0, 1): 0 keeps every token; a ratio so close to 1 that the floor
    is 0 keeps one token (an encoder needs at least one). A ratio of 1 is an error.
    """
    if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
        raise ValueError(f"num_patches must be a positive int, got {num_patches!r}")
    ratio = float(mask_ratio)
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"mask_ratio must lie in [0, 1) (fraction of tokens dropped), got {mask_ratio}")
    # The epsilon stops float error from losing a token, e.g. 10 * (1 - 0.9) = 0.99999...
    return max(1, math.floor(num_patches * (1.0 - ratio) + 1e-9))


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")


def _uniform_noise(shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(shape, generator=generator, device=device)


def random_keep_indices(batch: int, num_patches: int, mask_ratio: float, shared: bool = False,
                        generator: torch.Generator | None = None,
                        device: torch.device | str | None = None) -> Tensor:
    """Uniformly random visible tokens per image (MAE §3 random sampling without replacement).

    Returns (B, K) long, K = ``num_keep(num_patches, mask_ratio)``, each row sorted and without
    repeats. ``shared=True`` uses one draw for the whole batch (MSN's code: one ``randperm`` per
    mini-batch), so every row is identical.
    """
    _check_batch(batch)
    keep = num_keep(num_patches, mask_ratio)
    rows = 1 if shared else batch
    indices = _uniform_noise((rows, num_patches), generator).argsort(dim=1)[:, :keep].sort(dim=1).values
    if shared:
        indices = indices.expand(batch, keep).contiguous()
    return indices.to(device) if device is not None else indices


def multi_mask_keep_indices(batch: int, num_patches: int, num_masks: int, keep_per_mask: int,
                            disjoint: bool = True, generator: torch.Generator | None = None,
                            device: torch.device | str | None = None) -> Tensor:
    """ExtreMA multi-masking (Wu et al. 2023, §3): ``num_masks`` visible sets per image.

    Returns (num_masks, B, K) long, rows sorted. ``disjoint=True`` (the paper's "without
    replacement") slices one permutation per image, so each token is visible in at most one mask;
    this needs ``num_masks * keep_per_mask <= num_patches``. ``disjoint=False`` draws each mask
    independently. Use ``num_keep(N, ratio)`` for ``keep_per_mask``.
    """
    _check_batch(batch)
    if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
        raise ValueError(f"num_patches must be a positive int, got {num_patches!r}")
    if isinstance(num_masks, bool) or not isinstance(num_masks, int) or num_masks < 1:
        raise ValueError(f"num_masks must be a positive int, got {num_masks!r}")
    if isinstance(keep_per_mask, bool) or not isinstance(keep_per_mask, int) or not 1 <= keep_per_mask <= num_patches:
        raise ValueError(f"keep_per_mask must be an int in [1, num_patches={num_patches}], got {keep_per_mask!r}")
    if disjoint:
        if num_masks * keep_per_mask > num_patches:
            raise ValueError(
                f"{num_masks} disjoint masks of {keep_per_mask} visible tokens need {num_masks * keep_per_mask} "
                f"tokens but there are {num_patches}; use at most {num_patches // keep_per_mask} masks, "
                f"fewer visible tokens, or disjoint=False"
            )
        perm = _uniform_noise((batch, num_patches), generator).argsort(dim=1)
        indices = perm[:, : num_masks * keep_per_mask].view(batch, num_masks, keep_per_mask).transpose(0, 1)
    else:
        perm = _uniform_noise((num_masks, batch, num_patches), generator).argsort(dim=2)
        indices = perm[..., :keep_per_mask]
    indices = indices.sort(dim=-1).values.contiguous()
    return indices.to(device) if device is not None else indices


def keep_to_mask(keep: Tensor, num_patches: int) -> Tensor:
    """Boolean mask (..., N) from kept indices (..., K): True = masked (dropped), False = visible."""
    if keep.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"keep must hold integer token indices, got dtype {keep.dtype}")
    if keep.dim() < 1:
        raise ValueError("keep must have a last dimension of token indices, got a scalar")
    if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= num_patches):
        raise ValueError(f"keep holds indices outside [0, num_patches={num_patches})")
    mask = torch.ones(*keep.shape[:-1], num_patches, dtype=torch.bool, device=keep.device)
    return mask.scatter_(-1, keep.long(), False)


def unshuffle(kept: Tensor, keep: Tensor, num_patches: int, fill: Tensor) -> Tensor:
    """Put the encoded kept tokens back at their grid positions: ``(B, K, D) -> (B, N, D)``, ``fill`` (D,) (MAE's
    shared mask token) everywhere else. The inverse of gathering ``keep`` (B, K) out of N tokens."""
    b, k, d = kept.shape
    if keep.shape != (b, k):
        raise ValueError(f"keep must be (B, K) = {(b, k)} for tokens {tuple(kept.shape)}, got {tuple(keep.shape)}")
    full = fill.to(kept.dtype).expand(b, num_patches, d).clone()
    return full.scatter(1, keep.to(kept.device).unsqueeze(-1).expand(b, k, d), kept)
