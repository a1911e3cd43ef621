from __future__ import annotations

import pytest
import torch

from selfsup.data.masking import keep_to_mask, multi_mask_keep_indices, num_keep, random_keep_indices


@pytest.mark.parametrize(
    ("num_patches", "ratio", "expected"),
    [(64, 0.75, 16), (64, 0.8, 12), (196, 0.75, 49), (10, 0.9, 1), (64, 0.0, 64), (64, 0.999, 1), (49, 0.7, 14)],
)
def test_num_keep_is_floor_of_kept_fraction(num_patches: int, ratio: float, expected: int) -> None:
    assert num_keep(num_patches, ratio) == expected


@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5, float("nan")])
def test_bad_ratios_raise(ratio: float) -> None:
    with pytest.raises(ValueError, match="mask_ratio"):
        random_keep_indices(2, 16, ratio)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="num_patches"):
        num_keep(0, 0.5)
    with pytest.raises(ValueError, match="batch"):
        random_keep_indices(0, 16, 0.5)


def test_random_keep_counts_sorted_unique_in_range() -> None:
    torch.manual_seed(0)
    keep = random_keep_indices(32, 64, 0.75)
    assert keep.shape == (32, 16) and keep.dtype == torch.long
    assert torch.equal(keep, keep.sort(dim=1).values)
    assert (keep[:, 1:] > keep[:, :-1]).all()  # sorted and strictly increasing -> unique
    assert keep.min() >= 0 and keep.max() < 64
    assert len({tuple(row.tolist()) for row in keep}) > 1  # rows are independent draws


def test_random_keep_covers_tokens_uniformly() -> None:
    torch.manual_seed(0)
    keep = random_keep_indices(4000, 16, 0.5)
    counts = torch.bincount(keep.flatten(), minlength=16).float()
    expected = 4000 * 8 / 16
    assert (counts - expected).abs().max() < 0.08 * expected


def test_ratio_zero_keeps_everything() -> None:
    keep = random_keep_indices(3, 10, 0.0)
    assert torch.equal(keep, torch.arange(10).expand(3, 10))
    assert not keep_to_mask(keep, 10).any()


def test_extreme_ratio_keeps_one_token() -> None:
    keep = random_keep_indices(5, 10, 0.95)
    assert keep.shape == (5, 1)
    assert keep_to_mask(keep, 10).sum(dim=1).tolist() == [9] * 5


def test_shared_rows_are_identical() -> None:
    torch.manual_seed(1)
    keep = random_keep_indices(8, 64, 0.5, shared=True)
    assert keep.shape == (8, 32)
    assert (keep == keep[0]).all()


def test_random_keep_determinism_global_seed_and_generator() -> None:
    torch.manual_seed(3)
    a = random_keep_indices(4, 49, 0.6)
    torch.manual_seed(3)
    b = random_keep_indices(4, 49, 0.6)
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(random_keep_indices(4, 49, 0.6, generator=g1), random_keep_indices(4, 49, 0.6, generator=g2))
    assert not torch.equal(random_keep_indices(4, 49, 0.6, generator=g1), a)


def test_generator_does_not_touch_global_rng() -> None:
    torch.manual_seed(5)
    random_keep_indices(4, 49, 0.6, generator=torch.Generator().manual_seed(0))
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))


def test_device_argument() -> None:
    keep = random_keep_indices(2, 16, 0.5, device="cpu")
    assert keep.device.type == "cpu"


def test_multi_mask_disjoint_sets_cover_each_token_at_most_once() -> None:
    torch.manual_seed(0)
    keep = multi_mask_keep_indices(6, 64, num_masks=5, keep_per_mask=12)
    assert keep.shape == (5, 6, 12) and keep.dtype == torch.long
    assert (keep[..., 1:] > keep[..., :-1]).all()
    for b in range(6):
        tokens = keep[:, b].flatten()
        assert tokens.unique().numel() == 60  # 5 x 12 distinct tokens: the masks are pairwise disjoint
    masks = keep_to_mask(keep, 64)  # (M, B, N)
    visible_count = (~masks).sum(dim=0)
    assert visible_count.max() == 1 and visible_count.sum() == 6 * 60


def test_multi_mask_full_partition_when_it_fits_exactly() -> None:
    keep = multi_mask_keep_indices(3, 64, num_masks=4, keep_per_mask=16)
    assert ((~keep_to_mask(keep, 64)).sum(dim=0) == 1).all()  # every token visible in exactly one mask


def test_multi_mask_disjoint_too_many_raises() -> None:
    with pytest.raises(ValueError, match="at most 5 masks"):
        multi_mask_keep_indices(2, 64, num_masks=6, keep_per_mask=12)


def test_multi_mask_independent_masks_overlap_as_independent_draws() -> None:
    """Two independent uniform 8-of-16 sets share 8 * 8 / 16 = 4 tokens on average (hypergeometric mean)."""
    torch.manual_seed(0)
    keep = multi_mask_keep_indices(200, 16, num_masks=3, keep_per_mask=8, disjoint=False)
    assert keep.shape == (3, 200, 8)
    assert (keep[..., 1:] > keep[..., :-1]).all()
    visible = (~keep_to_mask(keep, 16)).float()  # (3, 200, 16)
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        shared = (visible[a] * visible[b]).sum(dim=1)  # tokens visible in both masks, per image
        assert shared.mean().item() == pytest.approx(4.0, abs=0.3)  # sd of the mean ~ 1.03 / sqrt(200) = 0.07
        assert shared.min() < 8  # identical masks would share all 8 tokens
    # each mask on its own is uniform over the tokens: every token visible in about half the images
    assert visible.mean(dim=1).sub(0.5).abs().max().item() < 0.15


def test_multi_mask_determinism_and_bad_args() -> None:
    torch.manual_seed(2)
    a = multi_mask_keep_indices(4, 64, 2, 8)
    torch.manual_seed(2)
    assert torch.equal(a, multi_mask_keep_indices(4, 64, 2, 8))
    with pytest.raises(ValueError, match="keep_per_mask"):
        multi_mask_keep_indices(2, 16, 2, 0)
    with pytest.raises(ValueError, match="keep_per_mask"):
        multi_mask_keep_indices(2, 16, 1, 17)
    with pytest.raises(ValueError, match="num_masks"):
        multi_mask_keep_indices(2, 16, 0, 4)


def test_keep_to_mask_values() -> None:
    keep = torch.tensor([[0, 2], [1, 3]])
    mask = keep_to_mask(keep, 4)
    assert mask.tolist() == [[False, True, False, True], [True, False, True, False]]
    assert mask.dtype == torch.bool


def test_keep_to_mask_rejects_bad_indices() -> None:
    with pytest.raises(ValueError, match="outside"):
        keep_to_mask(torch.tensor([[0, 4]]), 4)
    with pytest.raises(ValueError, match="integer"):
        keep_to_mask(torch.tensor([[0.0, 1.0]]), 4)


def test_unshuffle_puts_the_kept_tokens_back_at_their_positions() -> None:
    from selfsup.data.masking import unshuffle

    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(3, 10, 4, generator=g)  # every position's own token
    keep = random_keep_indices(3, 10, 0.6, generator=g)
    kept = torch.gather(tokens, 1, keep.unsqueeze(-1).expand(-1, -1, 4))  # what the encoder saw, in keep order
    fill = torch.full((4,), -7.0)
    full = unshuffle(kept, keep, 10, fill)
    hidden = keep_to_mask(keep, 10)
    assert torch.equal(full[~hidden], tokens[~hidden])
    assert (full[hidden] == -7.0).all()
    shuffled = keep[:, torch.randperm(keep.shape[1], generator=g)]  # any order of the kept indices
    kept = torch.gather(tokens, 1, shuffled.unsqueeze(-1).expand(-1, -1, 4))
    assert torch.equal(unshuffle(kept, shuffled, 10, fill), full)


def test_argument_edges_of_multi_masks_and_keep_to_mask() -> None:
    """The smallest valid arguments pass and wrong types are refused by name (mutation-testing survivors)."""
    assert multi_mask_keep_indices(1, 1, num_masks=1, keep_per_mask=1).tolist() == [[[0]]]  # one patch, kept
    assert multi_mask_keep_indices(2, 5, num_masks=1, keep_per_mask=5).tolist() == [[list(range(5))] * 2]  # all kept
    for kwargs, key in [({"num_patches": 4.0}, "num_patches"), ({"num_patches": True}, "num_patches"),
                        ({"num_masks": True}, "num_masks"), ({"keep_per_mask": True}, "keep_per_mask")]:
        args = {"batch": 2, "num_patches": 4, "num_masks": 1, "keep_per_mask": 2, **kwargs}
        with pytest.raises(ValueError, match=f"^{key} must be a"):
            multi_mask_keep_indices(**args)
    with pytest.raises(ValueError, match=r"^num_patches must be a positive int, got 4\.0$"):
        multi_mask_keep_indices(2, 4.0, 1, 2)
    assert keep_to_mask(torch.tensor([0, 2]), 4).tolist() == [False, True, False, True]  # one row: 1-D is fine
    with pytest.raises(ValueError, match="^keep must have a last dimension of token indices, got a scalar$"):
        keep_to_mask(torch.tensor(1), 4)


def test_unshuffle_returns_the_tokens_dtype_whatever_the_fill() -> None:
    from selfsup.data.masking import unshuffle

    kept = torch.ones(1, 1, 2)
    out = unshuffle(kept, torch.tensor([[1]]), 2, torch.zeros(2, dtype=torch.float64))  # e.g. an fp32 mask token
    assert out.dtype == torch.float32 and out.tolist() == [[[0.0, 0.0], [1.0, 1.0]]]


def test_smallest_sizes_pass_and_booleans_are_refused() -> None:
    assert num_keep(1, 0.5) == 1  # one patch: keep it
    assert random_keep_indices(1, 4, 0.5).shape == (1, 2)  # a batch of one
    with pytest.raises(ValueError, match="^num_patches must be a positive int, got True$"):
        num_keep(True, 0.5)
    with pytest.raises(ValueError, match="^batch must be a positive int, got True$"):
        random_keep_indices(True, 4, 0.5)
    with pytest.raises(ValueError, match="^6 disjoint masks of 12 visible tokens need 72 tokens but there are 64;"):
        multi_mask_keep_indices(2, 64, num_masks=6, keep_per_mask=12)


@pytest.mark.parametrize("disjoint", [True, False])
def test_multi_masks_draw_from_the_given_generator_and_go_to_the_given_device(disjoint: bool) -> None:
    state = torch.random.get_rng_state()
    a = multi_mask_keep_indices(3, 16, 2, 4, disjoint, generator=torch.Generator().manual_seed(7))
    b = multi_mask_keep_indices(3, 16, 2, 4, disjoint, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    assert multi_mask_keep_indices(3, 16, 2, 4, disjoint, device="meta").device.type == "meta"
    assert random_keep_indices(3, 16, 0.5, device="meta").device.type == "meta"


# ------------------------------------------------------------------------------------- iBOT's block masks
def test_block_masks_shape_ratio_and_blocks() -> None:
    import random

    from selfsup.data.masking import block_masks

    masks = block_masks(64, 2, (8, 8), ratios=[0.4], ratio_vars=[0.0], rng=random.Random(0))
    assert len(masks) == 2 and all(m.shape == (64, 64) and m.dtype == torch.bool for m in masks)
    counts = torch.stack(masks).sum(-1).float()
    # BEiT's loop stops once the target (25.6 patches) is reached, overshooting by less than a block; or it gives up
    assert counts.min() >= 8 and counts.max() <= 40 and abs(counts.mean().item() - 25.6) < 4
    # blocks, not scattered patches: most masked patches have a masked 4-neighbour
    grid = masks[0].view(64, 8, 8)
    neighbour = torch.zeros_like(grid)
    neighbour[:, 1:] |= grid[:, :-1]
    neighbour[:, :-1] |= grid[:, 1:]
    neighbour[:, :, 1:] |= grid[:, :, :-1]
    neighbour[:, :, :-1] |= grid[:, :, 1:]
    assert (grid & neighbour).sum() > 0.9 * grid.sum()


def test_block_masks_ratio_zero_half_the_time() -> None:
    import random

    from selfsup.data.masking import block_masks

    masks = torch.stack(block_masks(200, 2, (8, 8), ratios=[0.0, 0.3], ratio_vars=[0.0, 0.2], rng=random.Random(1)))
    unmasked = (masks.sum(-1) == 0).float().mean().item()
    assert 0.4 < unmasked < 0.6  # iBOT's [0, 0.3]: one of the two ratios per view


def test_block_masks_reject_bad_ratios() -> None:
    from selfsup.data.masking import block_masks

    with pytest.raises(ValueError, match="0 <= var <= r"):
        block_masks(2, 1, (4, 4), ratios=[0.3], ratio_vars=[0.4])
