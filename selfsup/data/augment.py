"""Batched, on-device image augmentations for self-supervised pretraining.

The pipeline follows SimCLR (Chen et al., 2020, App. A) and BYOL (Grill et al., 2020, App. B):
random resized crop -> horizontal flip -> colour jitter -> grayscale -> Gaussian blur -> solarize
-> normalise. Every sample in a batch gets its own random parameters, and all of them are drawn
from torch's global CPU generator, so ``torch.manual_seed(s)`` before a call reproduces it exactly
(and gives the same random parameters on any device).

Each op is written as vectorised torch arithmetic over the whole batch (crop and flip are one
bilinear ``F.grid_sample`` with per-sample affine grids; colour ops use per-sample factors), which
on a 2-core CPU ran 2-4x faster than the equivalent kornia 0.9 pipeline in the same process.
Crops are sub-pixel boxes and resampling has no antialiasing, so strongly shrinking a large crop
aliases (as kornia's bilinear crop does). The authors' pipelines (torchvision ``RandomResizedCrop`` in MSN, MAE
and ExtreMA) resize bicubically; bilinear is a deliberate deviation (cheaper on a CPU), not their choice. The colour formulas are torchvision's (the ones kornia's
``ColorJitter`` reproduces; the tests compare them with kornia), and the four jitter ops run in one
random order per call, as in kornia.

``LabelledAugment`` applies the MAST-5 ops (Huang et al., 2023, §3.2) each with its own
probability and returns which ops changed each image.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.config import ConfigError, ImageSide, Positive, Probability, Range, Real, check_arguments, check_fields

__all__ = [
    "AugmentConfig",
    "PRESETS",
    "augment_config",
    "Augment",
    "LabelledAugment",
    "MAST_OPS",
    "MAST15_OPS",
    "sample_op_subsets",
    "augment_throughput",
    "sample_crop_boxes",
]

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as torchvision / PIL "L"
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop rejection-sampling attempts


# The ranges each parameter allows, declared with its type and checked by selfsup.config's validator (as config
# fields are). Jitter strengths stop at 10 (a factor of up to 11: every pixel saturates long before), blur sigmas at
# 100 pixels.
Fraction = Annotated[float, Range(gt=0, le=1)]
Strength = Annotated[float, Range(ge=0, le=10, example="0.4")]
Sigma = Annotated[float, Range(gt=0, le=100, example="0.1")]
AspectRatio = Annotated[float, Range(gt=0, le=100, example="0.75")]


@dataclass
class AugmentConfig:
    """Parameters of one augmentation pipeline (one view). Probabilities are per sample.

    Jitter factors follow torchvision: brightness/contrast/saturation ~ U[max(0, 1 - s), 1 + s],
    hue shift ~ U[-hue, hue] (in turns, hue <= 0.5). Blur sigma ~ U[blur_sigma]; the kernel side is
    ``blur_kernel_frac * size`` rounded down to an odd number >= 3 (SimCLR: 10 % of the side).
    ``mean``/``std`` normalise the output per channel (None: no normalisation).
    """

    size: ImageSide
    crop_scale: tuple[Fraction, Fraction] = (0.08, 1.0)
    crop_ratio: tuple[AspectRatio, AspectRatio] = (3 / 4, 4 / 3)
    hflip_p: Probability = 0.5
    jitter_p: Probability = 0.8
    brightness: Strength = 0.4
    contrast: Strength = 0.4
    saturation: Strength = 0.2
    hue: Annotated[float, Range(ge=0, le=0.5, example="0.1 (turns)")] = 0.1
    grayscale_p: Probability = 0.2
    blur_p: Probability = 0.0
    blur_sigma: tuple[Sigma, Sigma] = (0.1, 2.0)
    blur_kernel_frac: Fraction = 0.1
    solarize_p: Probability = 0.0
    mean: tuple[Real, ...] | None = None
    std: tuple[Positive, ...] | None = None

    def __post_init__(self) -> None:
        check_fields(self, "")
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            low, high = getattr(self, name)
            if low > high:
                raise ConfigError(f"bad value for {name}: {[low, high]}; use [low, high] with low <= high")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("mean and std must be given together (or both null for no normalisation)")
        if self.mean is not None and self.std is not None and (len(self.mean) not in (1, 3)
                                                               or len(self.mean) != len(self.std)):
            raise ConfigError(f"mean and std need one value per channel (1 or 3, the same number), got mean="
                              f"{list(self.mean)}, std={list(self.std)}")

    @property
    def blur_kernel_size(self) -> int:
        """Odd Gaussian kernel side used for ``size`` outputs (>= 3)."""
        return max(3, int(self.blur_kernel_frac * self.size) | 1)


_BYOL = dict(
    crop_scale=(0.08, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1,
    grayscale_p=0.2, blur_sigma=(0.1, 2.0),
)
_NO_COLOUR = dict(jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0)

PRESETS: dict[str, dict[str, Any]] = {
    # SimCLR ImageNet recipe (Chen et al. 2020, App. A): colour strength s = 1, blur p = 0.5.
    "simclr": dict(crop_scale=(0.08, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.8, contrast=0.8,
                   saturation=0.8, hue=0.2, grayscale_p=0.2, blur_p=0.5, solarize_p=0.0),
    # SimCLR CIFAR recipe (App. B.9): s = 0.5, no blur.
    "simclr_cifar": dict(crop_scale=(0.08, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4,
                         saturation=0.4, hue=0.1, grayscale_p=0.2, blur_p=0.0, solarize_p=0.0),
    # BYOL (Grill et al. 2020, Tab. 6): asymmetric blur / solarize. VICReg (Bardes et al. 2022, App. C) uses the same.
    "byol_view1": dict(_BYOL, blur_p=1.0, solarize_p=0.0),
    "byol_view2": dict(_BYOL, blur_p=0.1, solarize_p=0.2),
    "vicreg_view1": dict(_BYOL, blur_p=1.0, solarize_p=0.0),
    "vicreg_view2": dict(_BYOL, blur_p=0.1, solarize_p=0.2),
    # MAE / MAE-CT_min: crop (0.2, 1) + flip only.
    "minimal": dict(crop_scale=(0.2, 1.0), hflip_p=0.5, **_NO_COLOUR),
    # fastssl CIFAR recipe (multi-view BT/VICReg): jitter (0.4, 0.4, 0.4, 0) p 0.8, gray 0.2, no blur.
    "multiview": dict(crop_scale=(0.08, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4,
                      saturation=0.4, hue=0.0, grayscale_p=0.2, blur_p=0.0, solarize_p=0.0),
    # MSN code (data_manager.py) with the ViT-S jitter strength s = 0.5: (0.8s, 0.8s, 0.8s, 0.2s), blur p 0.5.
    "msn": dict(crop_scale=(0.3, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.4,
                hue=0.1, grayscale_p=0.2, blur_p=0.5, blur_sigma=(0.1, 2.0), solarize_p=0.0),
    # MSN focal views: the same pipeline on small crops of scale (0.05, 0.3).
    "msn_focal": dict(crop_scale=(0.05, 0.3), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4,
                      saturation=0.4, hue=0.1, grayscale_p=0.2, blur_p=0.5, blur_sigma=(0.1, 2.0), solarize_p=0.0),
    # DINO (main_dino.DataAugmentationDINO; iBOT's is the same): BYOL's colour ops on global crops of scale (0.4, 1),
    # blur 1.0 on the first, blur 0.1 + solarize 0.2 on the second; local crops of scale (0.05, 0.4), blur 0.5.
    "dino_global1": dict(_BYOL, crop_scale=(0.4, 1.0), blur_p=1.0, solarize_p=0.0),
    "dino_global2": dict(_BYOL, crop_scale=(0.4, 1.0), blur_p=0.1, solarize_p=0.2),
    "dino_local": dict(_BYOL, crop_scale=(0.05, 0.4), blur_p=0.5, solarize_p=0.0),
    # ExtreMA code (lib/augment.py): crop (0.2, 1) + flip, jitter (0.4, 0.4, 0.2, 0.1) p 0.8, gray 0.2, no blur or
    # solarize (§5.1); with the view option shared_crop the crop is shared and the colour differs per branch.
    "extrema": dict(crop_scale=(0.2, 1.0), hflip_p=0.5, jitter_p=0.8, brightness=0.4, contrast=0.4, saturation=0.2,
                    hue=0.1, grayscale_p=0.2, blur_p=0.0, solarize_p=0.0),
    # MAST-5 (Huang et al. 2023, §3.2): VICReg's ops with one probability each (blur: VICReg's 1.0 / 0.1 per view
    # averaged to 0.5, as the two views share one config), solarize left out (not a MAST op).
    "mast": dict(_BYOL, blur_p=0.5, solarize_p=0.0),
    # Evaluation: centred square crop of the whole image resized to ``size``; nothing random.
    "none": dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), hflip_p=0.0, **_NO_COLOUR),
}


def augment_config(preset: str, size: int, **overrides: Any) -> AugmentConfig:
    """Build an ``AugmentConfig`` from a named preset, then apply keyword overrides."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown augmentation preset {preset!r}; choose one of {sorted(PRESETS)}")
    fields = [f.name for f in dataclasses.fields(AugmentConfig) if f.name != "size"]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(f"unknown augmentation override(s) {unknown}; allowed keys: {fields}")
    return AugmentConfig(size=size, **{**PRESETS[preset], **overrides})


# --------------------------------------------------------------------------------------------
# Parameter sampling (CPU, global generator) and the batched ops
# --------------------------------------------------------------------------------------------


def _bernoulli(p: float, batch: int) -> Tensor:
    """(B,) bool, True with probability p. Draws nothing when p is 0 or 1."""
    if p <= 0.0:
        return torch.zeros(batch, dtype=torch.bool)
    if p >= 1.0:
        return torch.ones(batch, dtype=torch.bool)
    return torch.rand(batch) < p


def _uniform(lo: float, hi: float, shape: tuple[int, ...]) -> Tensor:
    return lo + (hi - lo) * torch.rand(shape, dtype=torch.float64)


def _identity_boxes(batch: int, height: int, width: int, ratio: tuple[float, float]) -> Tensor:
    """Largest centred box whose aspect ratio lies in ``ratio`` (torchvision's fallback crop); (B, 4) x0,y0,w,h."""
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = float(width), width / ratio[0]
    elif in_ratio > ratio[1]:
        w, h = height * ratio[1], float(height)
    else:
        w, h = float(width), float(height)
    box = torch.tensor([(width - w) / 2, (height - h) / 2, w, h], dtype=torch.float64)
    return box.expand(batch, 4).clone()


def sample_crop_boxes(batch: int, height: int, width: int, scale: tuple[float, float],
                       ratio: tuple[float, float]) -> Tensor:
    """RandomResizedCrop boxes (Szegedy et al. 2015; torchvision's sampler, vectorised, sub-pixel).

    Up to 10 (area fraction, log aspect ratio) candidates per sample; the first that fits inside
    the image wins; samples without a fitting candidate fall back to the centred box.
    Returns (B, 4) float64 rows (x0, y0, w, h) in pixels.
    """
    area = float(height * width)
    frac = _uniform(scale[0], scale[1], (batch, _CROP_ATTEMPTS))
    log_ratio = _uniform(math.log(ratio[0]), math.log(ratio[1]), (batch, _CROP_ATTEMPTS))
    aspect = log_ratio.exp()
    w = (frac * area * aspect).sqrt()
    h = (frac * area / aspect).sqrt()
    fits = (w <= width) & (h <= height)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)
    offsets = torch.rand(batch, 2, dtype=torch.float64)
    boxes = torch.stack([offsets[:, 0] * (width - w), offsets[:, 1] * (height - h), w, h], dim=1)
    fallback = ~fits.any(dim=1)
    if fallback.any():
        boxes[fallback] = _identity_boxes(int(fallback.sum()), height, width, ratio)
    return boxes


def _resample(x: Tensor, boxes: Tensor, flip: Tensor, size: int) -> Tensor:
    """Crop each sample to its box, resize to size x size (bilinear) and mirror where ``flip``: one grid_sample.

    Output pixel centre u in (-1, 1) (align_corners=False) reads the input at normalised
    x = sign * (w / W) * u + (2 x0 + w) / W - 1, and likewise for y; sign = -1 mirrors.
    """
    _, _, height, width = x.shape
    x0, y0, w, h = boxes.unbind(1)
    params = torch.stack([
        (w / width) * torch.where(flip, -1.0, 1.0), (2 * x0 + w) / width - 1, h / height, (2 * y0 + h) / height - 1,
    ], dim=1).to(device=x.device, dtype=x.dtype)
    centres = (torch.arange(size, device=x.device, dtype=x.dtype) * 2 + 1) / size - 1
    grid_x = params[:, 0:1] * centres + params[:, 1:2]  # (B, size)
    grid_y = params[:, 2:3] * centres + params[:, 3:4]
    grid = torch.stack(torch.broadcast_tensors(grid_x[:, None, :], grid_y[:, :, None]), dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _same_boxes(a: Tensor, b: Tensor, side: int) -> Tensor:
    """(B,) True where two (B, 4) boxes agree up to float error."""
    return ((a - b).abs() <= 1e-6 * side).all(dim=1)


def _view(values: Tensor, like: Tensor) -> Tensor:
    """(B,) CPU parameters -> (B, 1, 1, 1) on the batch's device and dtype."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, 1, 1, 1)


def _flag(values: Tensor, like: Tensor) -> Tensor:
    """(B,) CPU bool switches -> (B, 1, 1, 1) bool on the batch's device."""
    return values.to(like.device).view(-1, 1, 1, 1)


def _gray(x: Tensor) -> Tensor:
    """(B, 3, H, W) RGB -> (B, 1, H, W) luma."""
    r, g, b = x.unbind(1)
    return (_GRAY_WEIGHTS[0] * r + _GRAY_WEIGHTS[1] * g + _GRAY_WEIGHTS[2] * b).unsqueeze(1)


def _adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    """Scale intensities (torchvision ``adjust_brightness``)."""
    return (x * factor).clamp_(0.0, 1.0)


def _adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with the mean gray level of each image (torchvision ``adjust_contrast``)."""
    mean = (_gray(x) if x.shape[1] == 3 else x).mean(dim=(1, 2, 3), keepdim=True)
    return (x * factor).add_((1.0 - factor) * mean).clamp_(0.0, 1.0)


def _adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """Blend with the grayscale image (torchvision ``adjust_saturation``); RGB only."""
    return (x * factor).add_(_gray(x).mul_(1.0 - factor)).clamp_(0.0, 1.0)


def _adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    """Rotate the HSV hue by ``shift`` turns (torchvision ``adjust_hue``); RGB only.

    Value and saturation are kept, so with chroma c = max - min the output is
    ``max - c * clamp(min(k, 4 - k), 0, 1)``, k = (n + 6 h') mod 6 for n = 5, 3, 1 (R, G, B).
    """
    r, g, b = x.unbind(1)
    maxc = x.amax(dim=1)
    chroma = maxc - x.amin(dim=1)
    hue6 = torch.where(  # 6 * hue * chroma; ties resolve to red, then green (torchvision)
        r == maxc, g - b, torch.where(g == maxc, (b - r).add_(chroma, alpha=2.0), (r - g).add_(chroma, alpha=4.0))
    )
    hue6.div_(chroma.clamp_min(1e-12)).add_(6.0 * shift.view(-1, 1, 1))  # gray pixels: 0 / eps = 0
    k = hue6.unsqueeze(1) + torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    scratch = k.div(6.0).floor_().mul_(6.0)  # in-place from here on: fewer large temporaries
    k.sub_(scratch)
    torch.minimum(k, scratch.copy_(k).neg_().add_(4.0), out=k)
    return k.clamp_(0.0, 1.0).mul_(chroma.neg_().unsqueeze(1)).add_(maxc.unsqueeze(1))


def _gaussian_blur(x: Tensor, sigma: Tensor, kernel_size: int) -> Tensor:
    """Separable Gaussian blur with one sigma per sample, reflect padding (torchvision ``GaussianBlur``)."""
    batch, channels, height, width = x.shape
    half = kernel_size // 2
    if half >= min(height, width):
        raise ValueError(
            f"blur kernel {kernel_size} needs images larger than {half} px per side for reflect padding, "
            f"got {height}x{width}; lower blur_kernel_frac or increase size"
        )
    offsets = torch.arange(kernel_size, device=x.device, dtype=x.dtype) - half
    sigma = sigma.to(device=x.device, dtype=x.dtype).view(-1, 1)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(channels, dim=0)  # (B*C, k)
    flat = F.pad(x.reshape(1, batch * channels, height, width), (half, half, half, half), mode="reflect")
    flat = F.conv2d(flat, kernel.view(-1, 1, 1, kernel_size), groups=batch * channels)
    flat = F.conv2d(flat, kernel.view(-1, 1, kernel_size, 1), groups=batch * channels)
    return flat.view(batch, channels, height, width)


def _check_batch(x: Tensor, config: AugmentConfig) -> None:
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"augmentation expects a (B, C, H, W) tensor, got {getattr(x, 'shape', type(x))}")
    if not x.is_floating_point():
        raise ValueError(f"augmentation expects float images in [0, 1], got dtype {x.dtype}; use x.float() / 255")
    if x.shape[1] not in (1, 3):
        raise ValueError(f"augmentation supports 1 (gray) or 3 (RGB) channels, got {x.shape[1]}")
    if config.mean is not None and len(config.mean) != x.shape[1]:
        raise ValueError(
            f"AugmentConfig.mean/std have {len(config.mean)} values but the batch has {x.shape[1]} channel(s); "
            f"give one mean/std per channel"
        )
    if x.numel() and (x.amin() < -1e-3 or x.amax() > 1.0 + 1e-3):
        raise ValueError(
            "augmentation expects un-normalised images in [0, 1]; got values outside it "
            "(pass raw pixels / 255 and let AugmentConfig.mean/std normalise)"
        )


class _Pipeline(nn.Module):
    """Shared implementation: crop, flip, jitter, grayscale, blur, solarize, normalise with per-sample switches."""

    def __init__(self, config: AugmentConfig) -> None:
        super().__init__()
        if not isinstance(config, AugmentConfig):
            raise TypeError(f"expected an AugmentConfig, got {type(config).__name__}; build one with augment_config()")
        self.config = config
        if config.mean is not None and config.std is not None:
            self.register_buffer("mean", torch.tensor(config.mean).view(1, -1, 1, 1), persistent=False)
            self.register_buffer("std", torch.tensor(config.std).view(1, -1, 1, 1), persistent=False)
        else:
            self.mean = self.std = None

    def extra_repr(self) -> str:
        return repr(self.config)

    def _run(self, x: Tensor, crop_on: Tensor, flip_on: Tensor, jitter_on: Tensor, gray_on: Tensor,
             blur_on: Tensor, solarize_on: Tensor, after_geometry=None, before_normalise=None,
             record: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Apply the ops switched on per sample; returns (images, crop_changed (B,) bool).

        ``after_geometry`` / ``before_normalise``: optional ``x -> x`` steps run after crop + flip and before the
        normalisation (MAST-15's RandAugment-style ops and its tensor ops). ``record``: a dict that receives the
        (B,) magnitudes drawn: "crop" (fraction of the image cut away), "jitter" (largest |factor - 1|, or
        the hue shift in turns), "blur" (sigma in pixels); 0 where the op did not act.
        """
        cfg = self.config
        batch, channels, height, width = x.shape
        # 1-2. crop + flip (one resampling pass; skipped when every box is the whole image at output size)
        identity = _identity_boxes(batch, height, width, cfg.crop_ratio)
        boxes = identity
        if crop_on.any():
            sampled = sample_crop_boxes(batch, height, width, cfg.crop_scale, cfg.crop_ratio)
            boxes = torch.where(crop_on.unsqueeze(1), sampled, identity)
        crop_changed = ~_same_boxes(boxes, identity, max(height, width))
        if record is not None:
            record["crop"] = torch.where(crop_changed, 1.0 - boxes[:, 2] * boxes[:, 3] / (height * width), 0.0)
        full = _same_boxes(boxes, _identity_boxes(batch, height, width, (0.0, math.inf)), max(height, width))
        if bool(full.all()) and height == width == cfg.size:
            if flip_on.any():
                x = torch.where(_flag(flip_on, x), x.flip(-1), x)
        else:
            x = _resample(x, boxes, flip_on, cfg.size)
        if after_geometry is not None:
            x = after_geometry(x)
        # 3. colour jitter: torchvision's four ops, in one random order per call (as kornia), per-sample factors
        if jitter_on.any():
            x = torch.where(_flag(jitter_on, x), self._jitter(x, jitter_on, record), x)
        # 4. grayscale (no-op for 1-channel images)
        if channels == 3 and gray_on.any():
            x = torch.where(_flag(gray_on, x), _gray(x).expand_as(x), x)
        # 5. Gaussian blur, computed only on the selected samples
        if blur_on.any():
            sigma = _uniform(cfg.blur_sigma[0], cfg.blur_sigma[1], (batch,))
            idx = blur_on.nonzero().squeeze(1).to(x.device)
            x = x.index_copy(0, idx, _gaussian_blur(x.index_select(0, idx), sigma[blur_on], cfg.blur_kernel_size))
            if record is not None:
                record["blur"] = torch.where(blur_on, sigma, 0.0)
        # 6. solarize: invert pixels >= 0.5 (BYOL)
        if solarize_on.any():
            x = torch.where(_flag(solarize_on, x), torch.minimum(x, 1.0 - x), x)  # = 1 - x where x >= 0.5
        if before_normalise is not None:
            x = before_normalise(x)
        # 7. normalise
        if self.mean is not None:
            x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return x, crop_changed

    def _jitter_ops(self, channels: int) -> list[int]:
        """Indices (0 brightness, 1 contrast, 2 saturation, 3 hue) that can change a ``channels`` image."""
        cfg = self.config
        ops = [i for i, s in enumerate((cfg.brightness, cfg.contrast)) if s > 0]
        if channels == 3:
            ops += [i for i, s in ((2, cfg.saturation), (3, cfg.hue)) if s > 0]
        return ops

    def _jitter(self, x: Tensor, jitter_on: Tensor, record: dict[str, Tensor] | None = None) -> Tensor:
        """Colour jitter with per-sample factors (neutral where ``jitter_on`` is False)."""
        cfg = self.config
        batch = x.shape[0]
        active = self._jitter_ops(x.shape[1])
        largest = torch.zeros(batch, dtype=torch.float64)
        for op in torch.randperm(4).tolist():
            if op not in active:
                continue
            if op == 3:
                shift = torch.where(jitter_on, _uniform(-cfg.hue, cfg.hue, (batch,)), 0.0)
                x = _adjust_hue(x, shift.to(device=x.device, dtype=x.dtype))
                largest = torch.maximum(largest, shift.abs())
            else:
                s = (cfg.brightness, cfg.contrast, cfg.saturation)[op]
                factor = torch.where(jitter_on, _uniform(max(0.0, 1.0 - s), 1.0 + s, (batch,)), 1.0)
                x = (_adjust_brightness, _adjust_contrast, _adjust_saturation)[op](x, _view(factor, x))
                largest = torch.maximum(largest, (factor - 1).abs())
        if record is not None:
            record["jitter"] = largest
        return x


class Augment(_Pipeline):
    """One augmentation pipeline (SimCLR / BYOL order) applied to a whole batch on its device.

    ``forward(x)``: x is (B, C, H, W) float in [0, 1], C in {1, 3}; returns (B, C, size, size),
    normalised if the config has mean/std. On 1-channel input saturation, hue and grayscale are
    no-ops; brightness and contrast apply.
    """

    def forward(self, x: Tensor) -> Tensor:
        cfg = self.config
        _check_batch(x, cfg)
        batch = x.shape[0]
        on = torch.ones(batch, dtype=torch.bool)
        flip_on = _bernoulli(cfg.hflip_p, batch)
        jitter_on = _bernoulli(cfg.jitter_p, batch) if self._jitter_ops(x.shape[1]) else ~on
        gray_on = _bernoulli(cfg.grayscale_p, batch) if x.shape[1] == 3 else ~on
        blur_on = _bernoulli(cfg.blur_p, batch)
        solarize_on = _bernoulli(cfg.solarize_p, batch)
        out, _ = self._run(x, on, flip_on, jitter_on, gray_on, blur_on, solarize_on)
        return out


MAST_OPS: tuple[str, ...] = ("color_jitter", "blur", "flip", "grayscale", "crop")
# MAST-15 (§3.2): MAST-5 plus RandAugment's shear x/y, translate x/y, rotate and invert, and sharpness, Gaussian
# noise, Sobel filter and cutout.
MAST15_OPS: tuple[str, ...] = MAST_OPS + ("shear_x", "shear_y", "translate_x", "translate_y", "rotate", "invert",
                                          "sharpness", "noise", "sobel", "cutout")
# Largest magnitude of each extra op; each draw is uniform in [0, max] (the spec's default for the paper's "random
# magnitude"), with a random sign where the op has one. RandAugment's ranges (Cubuk et al. 2020): shear 0.3,
# translate 0.45 of the side, rotate 30 degrees, sharpness factor 1 +- 0.9; noise std 0.1 of the [0, 1] range;
# cutout side 0.5 of the image (DeVries & Taylor 2017: 16 of 32 px).
MAST15_MAGNITUDES: dict[str, float] = {"shear": 0.3, "translate": 0.45, "rotate": 30.0, "sharpness": 0.9,
                                       "noise": 0.1, "cutout": 0.5}


def _signed(maximum: float, batch: int) -> Tensor:
    """(B,) magnitudes uniform in [0, maximum] with a random sign."""
    sign = torch.where(torch.rand(batch) < 0.5, -1.0, 1.0).double()
    return _uniform(0.0, maximum, (batch,)) * sign


def _affine(x: Tensor, on: Tensor, shear_x: Tensor, shear_y: Tensor, tx: Tensor, ty: Tensor, degrees: Tensor) -> Tensor:
    """Shear, translate (fractions of the side) and rotate the images where ``on``; the uncovered area is black."""
    idx = on.nonzero().squeeze(1)
    if len(idx) == 0:
        return x
    theta = degrees[idx] * math.pi / 180
    cos, sin = theta.cos(), theta.sin()
    rotation = torch.stack([torch.stack([cos, -sin], 1), torch.stack([sin, cos], 1)], 1)
    shear = torch.stack([torch.stack([torch.ones_like(cos), shear_x[idx]], 1),
                         torch.stack([shear_y[idx], torch.ones_like(cos)], 1)], 1)
    matrix = torch.cat([rotation @ shear, 2 * torch.stack([tx[idx], ty[idx]], 1)[:, :, None]], dim=2)
    part = x.index_select(0, idx.to(x.device))
    grid = F.affine_grid(matrix.to(device=x.device, dtype=x.dtype), list(part.shape), align_corners=False)
    return x.index_copy(0, idx.to(x.device), F.grid_sample(part, grid, mode="bilinear", padding_mode="zeros",
                                                           align_corners=False))


def _sharpness(x: Tensor, factor: Tensor) -> Tensor:
    """PIL's ImageEnhance.Sharpness: blend with the 3x3 smoothed image (border pixels kept), ``factor`` 1 = identity."""
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], device=x.device, dtype=x.dtype) / 13
    channels = x.shape[1]
    smooth = F.conv2d(x, kernel.expand(channels, 1, 3, 3), groups=channels)
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = smooth
    return (degenerate + _view(factor, x) * (x - degenerate)).clamp_(0.0, 1.0)


def _sobel(x: Tensor) -> Tensor:
    """Gradient magnitude of the luma (3x3 Sobel, replicate padding), scaled to [0, 1] per image, in every channel."""
    gray = _gray(x) if x.shape[1] == 3 else x
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], device=x.device, dtype=x.dtype)
    padded = F.pad(gray, (1, 1, 1, 1), mode="replicate")
    gx = F.conv2d(padded, kx.view(1, 1, 3, 3))
    gy = F.conv2d(padded, kx.t().reshape(1, 1, 3, 3))
    magnitude = (gx.square() + gy.square()).sqrt()
    magnitude = magnitude / magnitude.flatten(1).amax(dim=1).clamp_min(1e-6).view(-1, 1, 1, 1)
    return magnitude.expand_as(x)


def _cutout(x: Tensor, side: Tensor, cy: Tensor, cx: Tensor) -> Tensor:
    """A square of ``side`` (fraction of the image) centred at (cy, cx) (fractions) filled with mid-gray, clipped."""
    _, _, height, width = x.shape
    rows = torch.arange(height, device=x.device, dtype=x.dtype).view(1, -1, 1) + 0.5
    cols = torch.arange(width, device=x.device, dtype=x.dtype).view(1, 1, -1) + 0.5
    half = (side * min(height, width) / 2).to(device=x.device, dtype=x.dtype).view(-1, 1, 1)
    inside = (((rows - cy.to(x.device, x.dtype).view(-1, 1, 1) * height).abs() < half)
              & ((cols - cx.to(x.device, x.dtype).view(-1, 1, 1) * width).abs() < half))
    return torch.where(inside.unsqueeze(1), torch.full_like(x, 0.5), x)


class LabelledAugment(_Pipeline):
    """MAST's per-op labelled augmentation (Huang et al. 2023, §3.2): MAST-5 (``MAST_OPS``), or MAST-15
    (``MAST15_OPS``) with ``extra_p``.

    Each op k fires independently with its own probability (colour jitter ``jitter_p``, blur
    ``blur_p``, flip ``hflip_p``, grayscale ``grayscale_p``, crop ``crop_p``, each MAST-15 extra op
    ``extra_p``) and its own random magnitude; ops are applied in SimCLR order (crop, flip, jitter,
    grayscale, blur), the extra ops RandAugment-style: the affine ones (shear, translate, rotate: one
    resampling, black fill) and invert and sharpness after the crop, noise, Sobel and cutout last.
    Images whose crop does not fire get the centred square crop resized to ``size``.

    ``forward(x, enabled=None)`` returns ``(images, applied)``, applied a (B, K) bool tensor in
    ``self.ops`` order that is True where op k changed image b: crop only when its box differs from
    the whole image, and grayscale / colour jitter never on 1-channel images where they cannot act.
    ``enabled`` (B, K) bool restricts which ops may fire per image (MAST's sampled op subset, see
    ``sample_op_subsets``; share it between the two views). ``forward(x, enabled, magnitudes=True)``
    also returns a (B, K) float tensor of what each applied op drew (0 where it did not act): colour
    jitter the largest |factor - 1| (or hue shift in turns), blur its sigma in pixels, crop the fraction
    of the image cut away, flip / grayscale / invert / Sobel 1, shear and sharpness |factor - 1|,
    translate the shift as a fraction of the side, rotate the angle in degrees, noise its std, cutout
    the patch side as a fraction of the image.
    """

    def __init__(self, config: AugmentConfig, crop_p: Probability = 1.0, extra_p: Probability | None = None) -> None:
        if config.solarize_p > 0:
            raise ValueError("solarize is not one of the MAST ops; set solarize_p=0 for LabelledAugment")
        check_arguments(LabelledAugment, {"crop_p": crop_p, "extra_p": extra_p}, "")
        super().__init__(config)
        self.crop_p, self.extra_p = float(crop_p), None if extra_p is None else float(extra_p)
        self.ops = MAST_OPS if extra_p is None else MAST15_OPS

    def forward(self, x: Tensor, enabled: Tensor | None = None,
                magnitudes: bool = False) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        _check_batch(x, cfg)
        batch = x.shape[0]
        if enabled is None:
            enabled = torch.ones(batch, len(self.ops), dtype=torch.bool)
        elif enabled.shape != (batch, len(self.ops)) or enabled.dtype != torch.bool:
            raise ValueError(
                f"enabled must be a bool tensor of shape ({batch}, {len(self.ops)}) (ops {self.ops}), "
                f"got {tuple(enabled.shape)} {enabled.dtype}"
            )
        enabled = enabled.cpu()
        gray_input = x.shape[1] == 1
        jitter_on = enabled[:, 0] & _bernoulli(cfg.jitter_p, batch)
        if not self._jitter_ops(x.shape[1]):
            jitter_on = torch.zeros_like(jitter_on)
        blur_on = enabled[:, 1] & _bernoulli(cfg.blur_p, batch)
        flip_on = enabled[:, 2] & _bernoulli(cfg.hflip_p, batch)
        gray_on = enabled[:, 3] & _bernoulli(cfg.grayscale_p, batch) & (not gray_input)
        crop_on = enabled[:, 4] & _bernoulli(self.crop_p, batch)
        no_solarize = torch.zeros(batch, dtype=torch.bool)
        drawn: dict[str, Tensor] = {}
        zero = torch.zeros(batch, dtype=torch.float64)

        def result(out: Tensor, applied: Tensor, extra_magnitudes: list[Tensor]) -> tuple:
            if not magnitudes:
                return out, applied.to(x.device)
            columns = [drawn.get("jitter", zero), drawn.get("blur", zero), flip_on.double(), gray_on.double(),
                       drawn["crop"], *extra_magnitudes]
            return out, applied.to(x.device), (torch.stack(columns, dim=1) * applied).float().to(x.device)

        if self.extra_p is None:
            out, crop_changed = self._run(x, crop_on, flip_on, jitter_on, gray_on, blur_on, no_solarize,
                                          record=drawn)
            return result(out, torch.stack([jitter_on, blur_on, flip_on, gray_on, crop_changed], dim=1), [])
        extra = enabled[:, 5:] & (torch.rand(batch, 10) < self.extra_p)
        mag = MAST15_MAGNITUDES
        shear_x, shear_y = _signed(mag["shear"], batch) * extra[:, 0], _signed(mag["shear"], batch) * extra[:, 1]
        tx, ty = _signed(mag["translate"], batch) * extra[:, 2], _signed(mag["translate"], batch) * extra[:, 3]
        degrees = _signed(mag["rotate"], batch) * extra[:, 4]
        sharpness = 1.0 + _signed(mag["sharpness"], batch) * extra[:, 6]
        noise_std = _uniform(0.0, mag["noise"], (batch,)) * extra[:, 7]
        cut_side, cut_y, cut_x = _uniform(0.0, mag["cutout"], (batch,)), torch.rand(batch), torch.rand(batch)
        noise = torch.randn(batch, x.shape[1], cfg.size, cfg.size).to(device=x.device, dtype=x.dtype)

        def after_geometry(img: Tensor) -> Tensor:
            img = _affine(img, extra[:, :5].any(dim=1), shear_x, shear_y, tx, ty, degrees)
            img = torch.where(_flag(extra[:, 5], img), 1.0 - img, img)
            return torch.where(_flag(extra[:, 6], img), _sharpness(img, sharpness), img)

        def before_normalise(img: Tensor) -> Tensor:
            img = (img + noise * _view(noise_std, img)).clamp_(0.0, 1.0)
            if extra[:, 8].any():
                img = torch.where(_flag(extra[:, 8], img), _sobel(img), img)
            return torch.where(_flag(extra[:, 9], img), _cutout(img, cut_side, cut_y, cut_x), img)

        out, crop_changed = self._run(x, crop_on, flip_on, jitter_on, gray_on, blur_on, no_solarize,
                                      after_geometry, before_normalise, record=drawn)
        applied = torch.cat([torch.stack([jitter_on, blur_on, flip_on, gray_on, crop_changed], dim=1), extra], dim=1)
        one = torch.ones(batch, dtype=torch.float64)
        return result(out, applied, [shear_x.abs(), shear_y.abs(), tx.abs(), ty.abs(), degrees.abs(), one,
                                     (sharpness - 1).abs(), noise_std, one, cut_side])


def sample_op_subsets(batch: int, num_ops: int, count: int) -> Tensor:
    """(B, num_ops) bool with exactly ``count`` random ops per row (MAST stage-2 composition, §3.2)."""
    if not 1 <= count <= num_ops:
        raise ValueError(f"count must lie in [1, num_ops={num_ops}], got {count}")
    ranks = torch.rand(batch, num_ops).argsort(dim=1).argsort(dim=1)
    return ranks < count


def augment_throughput(config: AugmentConfig, batch: int, channels: int, in_size: int, iters: int = 10,
                       device: str | torch.device = "cpu") -> float:
    """Images per second of ``Augment(config)`` on random (batch, channels, in_size, in_size) input.

    One warm-up call, then ``iters`` timed calls. The global RNG state is restored afterwards.
    """
    if batch < 1 or iters < 1 or in_size < 1:
        raise ValueError(f"batch, iters and in_size must be >= 1, got {batch}, {iters}, {in_size}")
    device = torch.device(device)
    augment = Augment(config).to(device)
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[]):  # every draw (input and augmentation) is on the CPU generator
        x = torch.rand(batch, channels, in_size, in_size).to(device)
        augment(x)
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            augment(x)
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    return batch * iters / elapsed
