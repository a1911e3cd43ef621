"""MAE, masked autoencoders (He et al. 2022, arXiv 2111.06377): the ViT encoder sees a random 25 % of the patches;
a light decoder fills the rest with a shared mask token, un-shuffles, and regresses the masked patches' pixels.

One step (MAE Sec. 3; MAE-CT App. A.1 uses the same with two views per image)::

    keep   = random 25 % of the N patch indices per image              # uniform, without replacement
    latent = encoder(x, keep)                                          # (B, 1 + K, D): [CLS] + kept tokens only
    tokens = unshuffle(embed(latent), keep, fill=mask_token) + pos      # (B, N, D_dec), grid order restored
    x_hat  = head(decoder_blocks([CLS; tokens]))                        # (B, N, p * p * C)
    loss   = mean over masked patches of mean_pixels (x_hat - norm(patchify(x)))^2

The decoder is thrown away; the exported backbone is the encoder (pool: ``model.params.pool``, or
``method.eval_pool``: MAE-CT evaluates ViT-B on the mean patch token, larger ViTs on [CLS]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import torch
from torch import nn

from selfsup.config import ConfigError, Range, check_fields
from selfsup.data.masking import keep_to_mask, random_keep_indices, unshuffle
from selfsup.losses.mae import mae_loss, patchify
from selfsup.methods.base import MethodBase, MethodConfig, StepOutput, check_values
from selfsup.models.heads import xavier_linears_
from selfsup.models.vit import Block, VisionTransformer, sincos_pos_embed_2d


@dataclass
class MAEConfig(MethodConfig):
    # one view (MAE) or more (MAE-CT's re-implementation: two), each masked independently
    VIEWS: ClassVar[tuple[int, int | None]] = (1, None)  # views per image (least, most), checked on load
    mask_ratio: Annotated[float, Range(ge=0, lt=1, example="0.75")] = 0.75  # MAE Sec. 4 / MAE-CT Sec. 4.2
    # the authors' decoder: 8 blocks of width 512, 16 heads (MAE Sec. 4; MAE-CT's yamls)
    decoder_dim: Annotated[int, Range(ge=4, le=65536, example="512")] = 512
    decoder_depth: Annotated[int, Range(ge=1, le=256)] = 8
    decoder_heads: Annotated[int, Range(ge=1, le=1024)] = 16
    decoder_mlp_ratio: Annotated[float, Range(gt=0, le=64)] = 4.0
    norm_pix_loss: bool = True  # per-patch normalised pixel targets (MAE Tab. 1d)
    eval_pool: Literal["cls", "mean"] | None = None  # exported feature; None = model.params.pool

    def __post_init__(self) -> None:
        check_fields(self, "method.")
        check_values(self, {"decoder_dim": self.decoder_dim % 4 == 0,
                            "decoder_heads": self.decoder_dim % self.decoder_heads == 0},
                     {"decoder_dim": "a multiple of 4 (sin-cos positions), e.g. 512",
                      "decoder_heads": "a divisor of method.decoder_dim"})


class MAEDecoder(nn.Module):
    """Linear(D -> D_dec), mask tokens + un-shuffle, fixed sin-cos positions, blocks, LayerNorm, Linear(-> p*p*C)."""

    def __init__(self, encoder: VisionTransformer, cfg: MAEConfig) -> None:
        super().__init__()
        d = cfg.decoder_dim
        self.grid = encoder.grid_size
        self.embed = nn.Linear(encoder.embed_dim, d)
        self.mask_token = nn.Parameter(torch.zeros(d))
        self.register_buffer("pos_embed", sincos_pos_embed_2d(d, *self.grid).unsqueeze(0), persistent=False)
        self.blocks = nn.ModuleList(Block(d, cfg.decoder_heads, cfg.decoder_mlp_ratio, True, 0.0, 1e-6)
                                    for _ in range(cfg.decoder_depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, encoder.patch_size ** 2 * encoder.in_channels)
        xavier_linears_(self)  # MAE's initialize_weights: xavier-uniform Linear layers
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, latent: torch.Tensor, keep: torch.Tensor, has_cls: bool) -> torch.Tensor:
        x = self.embed(latent)
        cls, kept = (x[:, :1], x[:, 1:]) if has_cls else (None, x)
        tokens = unshuffle(kept, keep, self.grid[0] * self.grid[1], self.mask_token) + self.pos_embed.to(x.dtype)
        if cls is not None:
            tokens = torch.cat([cls, tokens], dim=1)
        for block in self.blocks:
            tokens = block(tokens)
        out = self.head(self.norm(tokens))
        return out[:, 1:] if cls is not None else out


class MAE(MethodBase):
    """Encoder on the visible patches + decoder regressing the masked ones."""

    Config = MAEConfig

    def __init__(self, backbone: nn.Module, cfg: MAEConfig, total_steps: int) -> None:
        super().__init__()
        if not isinstance(backbone, VisionTransformer) or backbone.class_attention or backbone.pool == "cls_prenorm":
            raise ConfigError("MAE drops patch tokens and needs a ViT backbone without class-attention blocks "
                              "(model.backbone vit_laptop, vit_tiny, vit_small, vit_base or vit_custom) whose "
                              "model.params.pool is cls or mean")
        self.cfg = cfg
        self.encoder = xavier_linears_(backbone)  # MAE's init of the encoder's Linear layers (ours: trunc-normal)
        self.decoder = MAEDecoder(backbone, cfg)
        self.export_params = {"pool": cfg.eval_pool or backbone.pool}

    @property
    def backbone(self) -> nn.Module:
        return self.encoder

    def reconstruct(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(prediction (B, N, p*p*C), target patches (B, N, p*p*C), masked (B, N) bool)`` for one masking."""
        grid = self.encoder.grid_for(x.shape[2], x.shape[3])
        if grid != self.decoder.grid:
            raise ValueError(f"MAE reconstructs the {self.decoder.grid} patch grid of the training size; got images "
                             f"of {x.shape[2]}x{x.shape[3]} (set the views' size to data.image_size)")
        patches = grid[0] * grid[1]
        keep = random_keep_indices(len(x), patches, self.cfg.mask_ratio)  # drawn on the CPU, as with device=
        masked = keep_to_mask(keep, patches).to(x.device)  # checked and made on the CPU: no read of the device
        keep = keep.to(x.device)
        latent = self.encoder.forward_tokens(x, keep)
        prediction = self.decoder(latent, keep, has_cls=self.encoder.cls_token is not None)
        return prediction, patchify(x, self.encoder.patch_size), masked

    def forward(self, views: list[torch.Tensor]) -> StepOutput:
        losses = []
        for view in views:  # one view (MAE) or two (MAE-CT's re-implementation), each masked independently
            prediction, target, masked = self.reconstruct(view)
            losses.append(mae_loss(prediction, target, masked, self.cfg.norm_pix_loss))
        return StepOutput(torch.stack(losses).mean())


__all__ = ["MAE", "MAEConfig", "MAEDecoder"]
