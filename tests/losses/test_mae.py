"""MAE's loss: masked patches only, per-patch normalised pixel targets; patchify / unpatchify."""

from __future__ import annotations

import torch

from selfsup.data.masking import keep_to_mask, random_keep_indices
from selfsup.losses.mae import mae_loss, normalized_patches, patchify, unpatchify


def test_patchify_orders_patches_row_major_and_unpatchify_inverts_it() -> None:
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float64).view(2, 3, 8, 12)
    patches = patchify(images, 4)
    assert patches.shape == (2, 6, 4 * 4 * 3)
    # patch (row 1, col 2) is token 1 * 3 + 2; its first pixel is (channel 0, y 4, x 8)
    assert patches[0, 5, 0] == images[0, 0, 4, 8] and patches[0, 5, 1] == images[0, 1, 4, 8]
    assert torch.equal(unpatchify(patches, 4, 3, (2, 3)), images)


def test_targets_are_normalised_per_patch_with_the_unbiased_variance_and_eps() -> None:
    target = torch.tensor([[[1.0, 2.0, 3.0, 6.0]]], dtype=torch.float64)
    mean, var = 3.0, ((4 + 1 + 0 + 9) / 3)
    expected = (target - mean) / (var + 1e-6) ** 0.5
    torch.testing.assert_close(normalized_patches(target), expected)
    assert abs(float(normalized_patches(target).mean())) < 1e-12


def test_loss_is_zero_at_the_normalised_target_and_ignores_visible_patches() -> None:
    g = torch.Generator().manual_seed(0)
    target = torch.rand(4, 196, 12, generator=g, dtype=torch.float64)
    keep = random_keep_indices(4, 196, 0.75, generator=g)
    masked = keep_to_mask(keep, 196)
    assert keep.shape == (4, 49) and (masked.sum(1) == 147).all()  # mask 0.75 on 196 patches: 147 masked
    exact = normalized_patches(target)
    assert float(mae_loss(exact, target, masked)) == 0.0
    prediction = torch.randn(4, 196, 12, generator=g, dtype=torch.float64, requires_grad=True)
    loss = mae_loss(prediction, target, masked)
    changed = prediction.detach().clone()
    changed[~masked] = 1e3  # anything on the visible patches
    torch.testing.assert_close(mae_loss(changed, target, masked), loss.detach())
    loss.backward()
    assert (prediction.grad[~masked] == 0).all() and (prediction.grad[masked] != 0).any()
    by_hand = ((prediction - exact).pow(2).mean(-1)[masked]).mean()
    torch.testing.assert_close(loss, by_hand)


def test_raw_pixel_targets_without_norm_pix() -> None:
    target = torch.rand(2, 4, 3, dtype=torch.float64)
    masked = torch.tensor([[True, False, False, True], [False, True, False, False]])
    assert float(mae_loss(target, target, masked, norm_pix=False)) == 0.0
    torch.testing.assert_close(mae_loss(target + 1, target, masked, norm_pix=False), torch.tensor(1.0, dtype=torch.float64))
