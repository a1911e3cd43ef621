"""MAE's reconstruction loss (He et al. 2022, Sec. 3): mean squared error on the masked patches only, against
per-patch normalised pixels (the "norm_pix_loss" variant, MAE Tab. 1d; MAE-CT Sec. 4.2)."""

from __future__ import annotations

import torch


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(B, C, H, W) -> (B, N, p * p * C)``, patches in row-major grid order, pixels (row, col, channel) inside."""
    b, c, h, w = images.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"image size {h}x{w} is not divisible by the patch size {p}")
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(patches: torch.Tensor, patch_size: int, channels: int, grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``(B, N, p * p * C) -> (B, C, H, W)``."""
    b = patches.shape[0]
    p, (gh, gw) = patch_size, grid
    x = patches.reshape(b, gh, gw, p, p, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, gh * p, gw * p)


def patch_mean_std(target: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's pixel mean and ``sqrt(var + eps)`` (unbiased variance, as the authors' code), ``(B, N, 1)`` each."""
    return target.mean(dim=-1, keepdim=True), (target.var(dim=-1, keepdim=True) + eps).sqrt()


def normalized_patches(target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each patch's pixels minus their mean, over ``sqrt(var + eps)``: MAE's normalised-pixel targets."""
    mean, std = patch_mean_std(target, eps)
    return (target - mean) / std


def mae_loss(prediction: torch.Tensor, target: torch.Tensor, masked: torch.Tensor, norm_pix: bool = True) -> torch.Tensor:
    """``(1/|M|) sum_{i in M} mean_pixels (x_hat_i - t_i)^2`` over the masked patches ``M``.

    ``prediction``/``target``: (B, N, p * p * C); ``masked``: (B, N) bool, True where the encoder did not see the
    patch. Every image masks the same number of patches, so each process's mean is the global one under DDP.
    """
    if prediction.shape != target.shape or masked.shape != prediction.shape[:2]:
        raise ValueError(f"prediction {tuple(prediction.shape)}, target {tuple(target.shape)} and mask "
                         f"{tuple(masked.shape)} must be (B, N, P), (B, N, P) and (B, N)")
    if norm_pix:
        target = normalized_patches(target)
    per_patch = (prediction - target).pow(2).mean(dim=-1)
    weights = masked.to(per_patch.dtype)
    return (per_patch * weights).sum() / weights.sum().clamp_min(1)
