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
import random
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["block_masks", "num_keep", "random_keep_indices", "multi_mask_keep_indices", "keep_to_mask", "unshuffle"]


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


def _block_mask(grid_h: int, grid_w: int, num_masked: float, log_aspect: tuple[float, float],
                rng: random.Random) -> list[list[bool]]:
    """BEiT's blockwise masking (Bao et al. 2022, Alg. 1), as iBOT's ``ImageFolderMask`` draws it: add rectangles of
    area ``U(min(H, W) // 3) ** 2, remaining)`` and aspect ``exp(U(log_aspect))`` at random positions until
    ``num_masked`` patches are masked or 10 tries in a row add nothing."""
    mask = [[False] * grid_w for _ in range(grid_h)]
    count = 0
    while count < num_masked:
        remaining = num_masked - count
        added = 0
        for _ in range(10):
            area = rng.uniform((min(grid_h, grid_w) // 3) ** 2, remaining)
            aspect = math.exp(rng.uniform(*log_aspect))
            h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if w < grid_w and h < grid_h:
                top, left = rng.randint(0, grid_h - h), rng.randint(0, grid_w - w)
                new = sum(not mask[i][j] for i in range(top, top + h) for j in range(left, left + w))
                if 0 < new <= remaining:
                    for i in range(top, top + h):
                        for j in range(left, left + w):
                            mask[i][j] = True
                    added = new
            if added > 0:
                break
        if added == 0:
            break
        count += added
    return mask


def block_masks(batch: int, num_views: int, grid: tuple[int, int], ratios: Sequence[float] = (0.0, 0.3),
                ratio_vars: Sequence[float] = (0.0, 0.2), aspect: tuple[float, float] = (0.3, 1 / 0.3),
                rng: random.Random | None = None) -> list[Tensor]:
    """iBOT's masks of the student's global views (Zhou et al. 2022, Sec. 3.3 and App.): blockwise (BEiT), with
    a prediction ratio drawn per view of each image: one of ``ratios`` chosen uniformly, each spread uniformly by
    +- its ``ratio_vars`` (their ViT-S/B setting ``[0, 0.3] +- [0, 0.2]``: half the views unmasked, the rest
    0.1-0.5 of the patches).

    Returns ``num_views`` boolean masks ``(B, H * W)``, True = masked (replaced by the mask token). Draws come from
    ``rng`` (Python's ``random``, image by image, view by view: the order and calls of iBOT's loader, so a seed gives
    their masks; tests/test_golden.py), a CPU loop that costs microseconds per mask at these grids.
    """
    _check_batch(batch)
    if len(ratios) != len(ratio_vars) or not ratios:
        raise ValueError(f"give one ratio_var per ratio, got {list(ratios)} and {list(ratio_vars)}")
    if any(not 0 <= v <= r or r + v >= 1 for r, v in zip(ratios, ratio_vars)):
        raise ValueError(f"each mask ratio r needs 0 <= var <= r and r + var < 1, got {list(ratios)} +- "
                         f"{list(ratio_vars)}")
    rng = rng if rng is not None else random.Random(int(torch.randint(2**31 - 1, ())))
    grid_h, grid_w = grid
    log_aspect = (math.log(aspect[0]), math.log(aspect[1]))
    per_image = []
    for _ in range(batch):
        views = []
        for _ in range(num_views):
            drawn = [rng.uniform(r - v, r + v) if v > 0 else r for r, v in zip(ratios, ratio_vars)]
            ratio = rng.choice(drawn) if len(drawn) > 1 else drawn[0]
            views.append(_block_mask(grid_h, grid_w, ratio * grid_h * grid_w, log_aspect, rng))
        per_image.append(views)
    return [torch.tensor([image[v] for image in per_image], dtype=torch.bool).reshape(batch, grid_h * grid_w)
            for v in range(num_views)]
