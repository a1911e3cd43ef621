"""Vision Transformer in plain torch (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words").

What the seed methods need beyond a plain ViT:
- fixed 2-D sin-cos position embeddings (MAE, He et al. 2022; ExtreMA; MAE-CT) or learned ones
  (MSN), re-computed (sin-cos) or bicubically interpolated (learned) for other input sizes
  (MSN's 96x96 focal views);
- token dropping: position embeddings are added first, then only the kept patch tokens enter the
  blocks (MSN Sec. 3, MAE Sec. 3, ExtreMA Sec. 3), optionally several masks per image that share
  one patch embedding (ExtreMA multi-masking);
- CaiT class-attention blocks (Touvron et al. 2021, "Going deeper with Image Transformers",
  Sec. 3) with a late [CLS] token and LayerScale, ExtreMA's pooling;
- feature views: [CLS] before/after the final LayerNorm (MSN evaluates the pre-norm [CLS]) and
  the mean patch token (MAE-CT ViT-B);
- freezing the stem and the first k blocks, and layer ids for layer-wise lr decay (MAE-CT);
- an optional convolutional stem (Xiao et al. 2021, "Early Convolutions Help Transformers See
  Better"): 3x3 conv-BN-ReLU layers (stride 2 unless ``conv_stem_strides`` says 1) before the
  patch projection, which then covers ``patch_size / (product of the strides)`` stem pixels.
  Tokens, grid and masking are unchanged; small ViTs trained briefly on small images learn faster
  with it (docs/benchmarks.md).
"""
from __future__ import annotations

from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from selfsup.config import Depth, ImageSide, Range, Width, check_arguments

__all__ = [
    "VisionTransformer",
    "sincos_pos_embed_2d",
    "vit_base",
    "vit_laptop",
    "vit_small",
    "vit_tiny",
]

POOLS = ("cls", "mean", "cls_prenorm")


def sincos_pos_embed_2d(
    embed_dim: int,
    grid_h: int,
    grid_w: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Fixed 2-D sin-cos position embedding, ``(grid_h * grid_w, embed_dim)`` (MAE layout).

    Tokens are in row-major order (index ``r * grid_w + c``, as ``Conv2d(...).flatten(2)``).
    The first half of the channels encodes the column ``c``, the second half the row ``r``; each
    half is ``[sin(pos * omega), cos(pos * omega)]`` with ``omega_i = 1 / 10000^(2i / (D/2))``,
    ``i = 0 .. D/4 - 1``. Positions are the integer grid indices, so a larger grid extends the
    same embedding rather than stretching it. Computed in float64 on the CPU (some accelerators
    lack float64), then moved to ``device`` / ``dtype``.
    """
    if embed_dim % 4 != 0:
        raise ValueError(
            f"sin-cos position embeddings need embed_dim divisible by 4, got {embed_dim}; "
            "choose another embed_dim or use pos_embed='learned'"
        )
    quarter = embed_dim // 4
    f64, cpu = torch.float64, torch.device("cpu")
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=f64, device=cpu) / quarter)
    rows = torch.arange(grid_h, dtype=f64, device=cpu)
    cols = torch.arange(grid_w, dtype=f64, device=cpu)
    row, col = torch.meshgrid(rows, cols, indexing="ij")

    def encode(pos: Tensor) -> Tensor:
        angles = pos.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)

    return torch.cat([encode(col), encode(row)], dim=1).to(device=device, dtype=dtype)


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., 2016): drop the whole residual branch per sample."""

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class Mlp(nn.Module):
    """Transformer feed-forward: Linear -> GELU -> Linear."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head self-attention via ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + MSA(LN(x))`` then ``x + MLP(LN(x))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop_path: float,
        eps: float,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ClassAttention(nn.Module):
    """CaiT class attention: the query is the [CLS] token only, keys/values are [CLS; patches]."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, u: Tensor) -> Tensor:
        """``u``: normalised ``[CLS; patches]``, ``(B, 1+N, D)`` -> update for CLS ``(B, 1, D)``."""
        b, n, d = u.shape
        h = self.num_heads
        q = self.q(u[:, :1]).reshape(b, 1, h, d // h).transpose(1, 2)
        k, v = self.kv(u).reshape(b, n, 2, h, d // h).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, 1, d))


class ClassAttentionBlock(nn.Module):
    """CaiT class-attention block (Touvron et al. 2021, Sec. 3; ExtreMA Sec. 3).

    ``c <- c + g1 * CA(LN1([c; X]))``, ``c <- c + g2 * MLP(LN2(c))``; the patch tokens ``X`` are
    read but never updated. ``g1, g2`` are LayerScale vectors initialised to ``layer_scale_init``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        eps: float,
        layer_scale_init: float,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = ClassAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.gamma_1 = nn.Parameter(torch.full((dim,), layer_scale_init))
        self.gamma_2 = nn.Parameter(torch.full((dim,), layer_scale_init))

    def forward(self, cls: Tensor, patches: Tensor) -> Tensor:
        """``cls (B, 1, D)``, ``patches (B, N, D)`` -> updated ``cls (B, 1, D)``."""
        u = self.norm1(torch.cat([cls, patches], dim=1))
        cls = cls + self.gamma_1 * self.attn(u)
        return cls + self.gamma_2 * self.mlp(self.norm2(cls))


class VisionTransformer(nn.Module):
    """ViT encoder with token dropping, sin-cos/learned position embeddings and optional CaiT
    class-attention pooling.

    Args:
        img_size: training resolution (square); must be divisible by ``patch_size``. Other
            resolutions work at call time (position embeddings are adapted).
        patch_size: side of the square patches (Conv2d with kernel = stride = patch).
        in_channels: image channels.
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: transformer shape.
        pos_embed: ``"sincos"`` (fixed MAE 2-D sin-cos) or ``"learned"`` (trunc-normal 0.02).
            The [CLS] token gets no position embedding.
        cls_token: whether the model has a [CLS] token. With ``num_class_attention_blocks == 0``
            it is prepended before the blocks (ViT style); otherwise it is appended late and only
            the class-attention blocks see it (CaiT style).
        drop_path_rate: stochastic depth, rising linearly from 0 to this value over the blocks.
        layer_norm_eps: LayerNorm epsilon.
        num_class_attention_blocks: CaiT class-attention blocks after the patch blocks (ExtreMA
            uses 2); requires ``cls_token=True``.
        layer_scale_init: initial LayerScale of the class-attention blocks (ExtreMA: 0.1).
        pool: what :meth:`forward` returns: ``"cls"`` ([CLS] after the final LayerNorm),
            ``"cls_prenorm"`` ([CLS] before it, MSN's evaluation feature) or ``"mean"`` (mean of
            the normalised patch tokens, MAE-CT ViT-B).
        conv_stem: output channels of 3x3 conv-BN-ReLU layers run before the patch projection
            (Xiao et al. 2021); ``patch_size`` must be a multiple of the product of their strides,
            the projection's kernel and stride being ``patch_size / product`` (1 = their 1x1
            projection). ``None`` or ``[]``: the plain patchify convolution.
        conv_stem_strides: one stride (1 or 2) per ``conv_stem`` layer; ``None``: all 2 (Xiao et
            al.). A stride-1 layer adds convolution at full resolution without changing the tokens.

    Attributes:
        num_features: ``embed_dim`` (width of the pooled feature).
        num_patches: patch tokens at ``img_size``.
        grid_size: ``(rows, cols)`` of the patch grid at ``img_size``.
    """

    def __init__(
        self,
        img_size: ImageSide,
        patch_size: ImageSide,
        in_channels: Width,
        embed_dim: Width,
        depth: Depth,
        num_heads: Depth,
        mlp_ratio: Annotated[float, Range(gt=0, le=64, example="4.0")] = 4.0,
        qkv_bias: bool = True,
        pos_embed: Literal["sincos", "learned"] = "sincos",
        cls_token: bool = True,
        drop_path_rate: Annotated[float, Range(ge=0, lt=1, example="0.1")] = 0.0,
        layer_norm_eps: Annotated[float, Range(gt=0, le=1, example="1e-6")] = 1e-6,
        num_class_attention_blocks: Annotated[int, Range(ge=0, le=1000)] = 0,
        layer_scale_init: Annotated[float, Range(ge=0, le=10, example="0.1")] = 0.1,
        pool: Literal["cls", "mean", "cls_prenorm"] = "cls",
        conv_stem: list[Width] | None = None,
        conv_stem_strides: list[Literal[1, 2]] | None = None,
    ) -> None:
        super().__init__()
        check_arguments(VisionTransformer, {k: v for k, v in locals().items() if k not in ("self", "__class__")}, "")
        if img_size % patch_size != 0:
            raise ValueError(
                f"img_size ({img_size}) must be a positive multiple of patch_size ({patch_size}); "
                "e.g. 28 with patch 4, 7 or 14, 32 with patch 4 or 8, 224 with patch 16"
            )
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        if pos_embed == "sincos" and embed_dim % 4 != 0:
            raise ValueError(
                f"pos_embed='sincos' needs embed_dim divisible by 4, got {embed_dim}; "
                "change embed_dim or use pos_embed='learned'"
            )
        if pool != "mean" and not cls_token:
            raise ValueError(
                f"pool={pool!r} needs a [CLS] token; set cls_token=True or use pool='mean'"
            )
        if num_class_attention_blocks > 0 and not cls_token:
            raise ValueError(
                "class-attention blocks pool into a late [CLS] token; set cls_token=True "
                "or num_class_attention_blocks=0"
            )
        conv_stem = list(conv_stem or [])
        strides = [2] * len(conv_stem) if conv_stem_strides is None else list(conv_stem_strides)
        if len(strides) != len(conv_stem):
            raise ValueError(
                f"conv_stem_strides={conv_stem_strides} must give a stride of 1 or 2 for each of the "
                f"{len(conv_stem)} conv_stem layers, e.g. conv_stem [32, 64, 128] with strides [1, 2, 2]"
            )
        stem_stride = 2 ** strides.count(2)
        if patch_size % stem_stride != 0:
            raise ValueError(
                f"conv_stem={conv_stem} (strides {strides}) shrinks the image {stem_stride}x, so patch_size "
                f"({patch_size}) must be a multiple of {stem_stride}; e.g. patch 4 with conv_stem [32, 64], "
                "patch 16 with [48, 96, 192, 384]"
            )

        self.img_size = img_size
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.embed_dim = embed_dim
        self.num_features = embed_dim
        self.depth = depth
        self.pool = pool
        self.pos_embed_type = pos_embed
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.class_attention = num_class_attention_blocks > 0
        self._num_frozen_blocks = -1  # -1: nothing frozen; k >= 0: stem + first k blocks
        # sin-cos embeddings for other grids (e.g. focal views), keyed by grid, device, dtype
        self._sincos_cache: dict[tuple[int, int, torch.device, torch.dtype], Tensor] = {}

        stem: list[nn.Module] = []
        channels = in_channels
        for out_channels, stride in zip(conv_stem, strides):
            stem += [nn.Conv2d(channels, out_channels, 3, stride=stride, padding=1, bias=False),
                     nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)]
            channels = out_channels
        self.stem = nn.Sequential(*stem)  # empty: the identity
        projection = patch_size // stem_stride
        self.patch_embed = nn.Conv2d(channels, embed_dim, projection, stride=projection)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if cls_token else None
        self.pos_embed: Tensor
        if pos_embed == "sincos":
            grid = sincos_pos_embed_2d(embed_dim, *self.grid_size).unsqueeze(0)
            self.register_buffer("pos_embed", grid, persistent=False)
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_patches, embed_dim))
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, rate, layer_norm_eps)
            for rate in rates
        )
        self.ca_blocks = nn.ModuleList(
            ClassAttentionBlock(
                embed_dim, num_heads, mlp_ratio, qkv_bias, layer_norm_eps, layer_scale_init
            )
            for _ in range(num_class_attention_blocks)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self._init_weights()

    def no_weight_decay(self) -> set[str]:
        """The parameters timm/DeiT exclude from weight decay by name. ExtreMA's pretraining excludes them (its method
        lists them for the optimiser); MAE's and MSN's select by shape only and decay the [CLS]."""
        return {"cls_token", "pos_embed"}

    # ------------------------------------------------------------------ init
    def _init_weights(self) -> None:
        """DeiT/MSN init: trunc-normal(0.02) for Linear, LN (1, 0); patch embed as a Linear
        (xavier-uniform on the flattened kernel, MAE); [CLS] and learned pos-emb trunc-normal;
        conv-stem convolutions He-normal (BatchNorm keeps its (1, 0) default)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.stem.modules():  # conv stem: He init, as the ResNet's convolutions
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        w = self.patch_embed.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embed.bias)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    # ------------------------------------------------------------- embedding
    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """Patch grid ``(rows, cols)`` for an input of ``height x width`` pixels."""
        p = self.patch_size
        if height % p != 0 or width % p != 0:
            raise ValueError(
                f"input size {height}x{width} is not divisible by patch_size {p}; resize or crop "
                f"the images to a multiple of {p} (e.g. {height - height % p}x{width - width % p})"
            )
        return height // p, width // p

    def pos_embed_for(self, grid_h: int, grid_w: int) -> Tensor:
        """Position embedding ``(1, grid_h * grid_w, D)`` for a patch grid.

        At the native grid this is ``pos_embed``. Otherwise sin-cos is re-computed exactly for
        the new grid and learned embeddings are bicubically interpolated (MSN's 96x96 views).
        """
        if (grid_h, grid_w) == self.grid_size:
            return self.pos_embed
        if self.pos_embed_type == "sincos":
            key = (grid_h, grid_w, self.pos_embed.device, self.pos_embed.dtype)
            if key not in self._sincos_cache:
                grid = sincos_pos_embed_2d(
                    self.embed_dim, grid_h, grid_w, self.pos_embed.device, self.pos_embed.dtype
                )
                self._sincos_cache[key] = grid.unsqueeze(0)
            return self._sincos_cache[key]
        h0, w0 = self.grid_size
        grid = self.pos_embed.reshape(1, h0, w0, self.embed_dim).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(grid_h, grid_w), mode="bicubic", align_corners=False)
        return grid.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, self.embed_dim)

    def embed_patches(self, x: Tensor, mask: Tensor | None = None, mask_token: Tensor | None = None) -> Tensor:
        """Patch tokens plus position embeddings, ``(B, N, D)`` (no [CLS], nothing dropped).

        ``mask (B, N)`` bool with ``mask_token (D,)``: masked patches' embeddings are replaced by the (learnable,
        the caller's) mask token before the position embedding is added (BEiT; iBOT's ``masked_embed``)."""
        if x.ndim != 4:
            raise ValueError(f"expected images of shape (B, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"expected {self.in_channels} input channels, got {x.shape[1]}; build the ViT "
                f"with in_channels={x.shape[1]} or convert the images"
            )
        grid_h, grid_w = self.grid_for(x.shape[2], x.shape[3])
        tokens = self.patch_embed(self.stem(x)).flatten(2).transpose(1, 2)
        if mask is not None:
            if mask_token is None or mask.shape != tokens.shape[:2]:
                raise ValueError(f"a mask needs a mask_token of width {tokens.shape[2]} and the shape (B, N) = "
                                 f"{tuple(tokens.shape[:2])}, got {tuple(mask.shape)}")
            tokens = torch.where(mask.to(tokens.device).unsqueeze(-1), mask_token.to(tokens.dtype), tokens)
        return tokens + self.pos_embed_for(grid_h, grid_w).to(tokens.dtype)

    @staticmethod
    def _keep(tokens: Tensor, keep_indices: Tensor) -> Tensor:
        """Gather kept tokens. ``keep_indices`` may stack ``m`` masks per image along the batch
        (``(m * B, K)``, mask-major); the embedded tokens are then repeated, not re-computed."""
        b, n, d = tokens.shape
        if keep_indices.ndim != 2 or keep_indices.dtype != torch.long:
            raise ValueError(
                "keep_indices must be a (B, K) int64 tensor of patch indices, got "
                f"shape {tuple(keep_indices.shape)} and dtype {keep_indices.dtype}; "
                "see selfsup.data.masking.random_keep_indices"
            )
        rows, k = keep_indices.shape
        if rows % b != 0:
            raise ValueError(
                f"keep_indices has {rows} rows but the batch has {b} images; pass one row per "
                "image, or m rows per image stacked mask-major (m * B rows)"
            )
        if not 1 <= k <= n:
            raise ValueError(f"keep_indices must keep between 1 and {n} patches, got {k}")
        if rows != b:
            tokens = tokens.repeat(rows // b, 1, 1)
        index = keep_indices.to(tokens.device).unsqueeze(-1).expand(rows, k, d)
        return torch.gather(tokens, 1, index)

    # --------------------------------------------------------------- forward
    def _encode(self, x: Tensor, keep_indices: Tensor | None, mask: Tensor | None = None,
                mask_token: Tensor | None = None) -> tuple[Tensor | None, Tensor]:
        """Run the network; returns ``([CLS] (B, 1, D) or None, patches (B, K, D))`` before the
        final LayerNorm."""
        tokens = self.embed_patches(x, mask, mask_token)
        if keep_indices is not None:
            tokens = self._keep(tokens, keep_indices)
        b = tokens.shape[0]
        if self.cls_token is not None and not self.class_attention:
            tokens = torch.cat([self.cls_token.expand(b, -1, -1), tokens], dim=1)
            for block in self.blocks:
                tokens = block(tokens)
            return tokens[:, :1], tokens[:, 1:]
        for block in self.blocks:
            tokens = block(tokens)
        if not self.class_attention:
            return None, tokens
        cls = self.cls_token.expand(b, -1, -1)
        for ca_block in self.ca_blocks:
            cls = ca_block(cls, tokens)
        return cls, tokens

    def forward_tokens(self, x: Tensor, keep_indices: Tensor | None = None) -> Tensor:
        """Token sequence after the final LayerNorm: ``(B, 1+K, D)`` with [CLS] first, or
        ``(B, K, D)`` without a [CLS]. ``keep_indices (B, K)`` selects the patches to keep
        (position embeddings are added before dropping); ``None`` keeps all N patches."""
        cls, patches = self._encode(x, keep_indices)
        if cls is not None:
            patches = torch.cat([cls, patches], dim=1)
        return self.norm(patches)

    def forward_features(self, x: Tensor, keep_indices: Tensor | None = None, mask: Tensor | None = None,
                         mask_token: Tensor | None = None) -> dict[str, Tensor]:
        """All feature views: ``"patch_tokens"`` (B, K, D) and their ``"mean"`` (B, D) after the
        final LayerNorm, plus ``"cls"`` / ``"cls_prenorm"`` (B, D) when there is a [CLS].
        ``mask`` / ``mask_token``: masked image modelling, see :meth:`embed_patches`."""
        cls, patches = self._encode(x, keep_indices, mask, mask_token)
        patch_tokens = self.norm(patches)
        out = {"patch_tokens": patch_tokens, "mean": patch_tokens.mean(dim=1)}
        if cls is not None:
            out["cls"] = self.norm(cls)[:, 0]
            out["cls_prenorm"] = cls[:, 0]
        return out

    def forward(self, x: Tensor, keep_indices: Tensor | None = None) -> Tensor:
        """Pooled feature ``(B, num_features)`` chosen by ``pool``."""
        cls, patches = self._encode(x, keep_indices)
        if self.pool == "mean":
            return self.norm(patches).mean(dim=1)
        assert cls is not None  # guaranteed by the constructor
        if self.pool == "cls_prenorm":
            return cls[:, 0]
        return self.norm(cls)[:, 0]

    # ------------------------------------------------ freezing and lr decay
    def freeze_blocks(self, k: int) -> None:
        """Freeze the stem (conv stem, patch embed, position embed, early [CLS]) and the first ``k`` blocks.

        Their parameters get ``requires_grad=False`` and the frozen blocks stay in eval mode
        through later ``.train()`` calls (MAE-CT contrastive tuning freezes the lower half).
        The late [CLS] of class-attention models belongs to the pooling head and stays trainable.
        """
        if not 0 <= k <= self.depth:
            raise ValueError(f"k must be in [0, depth={self.depth}], got {k}")
        frozen: list[nn.Parameter] = [*self.stem.parameters(), *self.patch_embed.parameters()]
        if isinstance(self.pos_embed, nn.Parameter):
            frozen.append(self.pos_embed)
        if self.cls_token is not None and not self.class_attention:
            frozen.append(self.cls_token)
        for block in self.blocks[:k]:
            frozen.extend(block.parameters())
        for param in frozen:
            param.requires_grad_(False)
        self._num_frozen_blocks = k
        self.train(self.training)

    def freeze_patch_projection(self) -> None:
        """Keep the map from pixels to patch tokens at its random init (MoCo v3's "random patch projection",
        Chen, Xie & He 2021; the authors' ``--stop-grad-conv1``): the patch projection, and the conv stem's
        convolutions and BatchNorm affines when there is one, get ``requires_grad=False``. The stem's BatchNorm still
        normalises with batch statistics (and updates its running ones) but learns nothing. Position embeddings and
        [CLS] stay trainable."""
        for param in [*self.stem.parameters(), *self.patch_embed.parameters()]:
            param.requires_grad_(False)

    def train(self, mode: bool = True) -> VisionTransformer:
        super().train(mode)
        if self._num_frozen_blocks >= 0:  # a frozen conv stem keeps its BatchNorm statistics
            self.stem.train(False)
        for block in self.blocks[: max(self._num_frozen_blocks, 0)]:
            block.train(False)
        return self

    def layer_id(self, param_name: str) -> int:
        """Depth index of a parameter for layer-wise lr decay (BEiT/MAE-CT convention):
        0 = embeddings, ``i + 1`` = block ``i``, ``depth + 1`` = final norm and class-attention
        head (late [CLS], CA blocks). Names are those of ``self.named_parameters()``."""
        if param_name in ("pos_embed",) or param_name.startswith(("patch_embed.", "stem.")):
            return 0
        if param_name == "cls_token" and self.cls_token is not None:
            return self.depth + 1 if self.class_attention else 0
        if param_name.startswith("blocks."):
            index = param_name.split(".")[1]
            if index.isdigit() and int(index) < self.depth:
                return int(index) + 1
        if param_name.startswith(("norm.", "ca_blocks.")):
            return self.depth + 1
        raise ValueError(
            f"unknown parameter name {param_name!r}; pass names from this ViT's "
            "named_parameters() (strip any parent-module prefix such as 'backbone.')"
        )


def _preset(embed_dim: int, depth: int, num_heads: int, kwargs: dict,
            defaults: dict | None = None) -> VisionTransformer:
    for fixed in ("embed_dim", "depth", "num_heads"):
        if fixed in kwargs:
            raise ValueError(
                f"{fixed} is fixed by this preset; build VisionTransformer directly "
                "(backbone 'vit_custom') to change it"
            )
    args = {"img_size": 224, "patch_size": 16, "in_channels": 3, **(defaults or {}), **kwargs}
    return VisionTransformer(embed_dim=embed_dim, depth=depth, num_heads=num_heads, **args)


def vit_laptop(**kwargs: object) -> VisionTransformer:
    """A ViT that learns on a 2-core CPU: D=128, 4 blocks, 4 heads, MLP ratio 2, behind a conv stem of two
    3x3 stride-2 layers (64, 128 channels) and a 1x1 projection: patch 4, so 49 tokens at 28 px
    (docs/benchmarks.md: its speed and accuracy against patchify ViTs).
    Defaults 32 px, RGB; pass ``img_size`` / ``in_channels`` for other data (the engine does)."""
    return _preset(128, 4, 4, kwargs, {"img_size": 32, "patch_size": 4, "mlp_ratio": 2.0, "conv_stem": [64, 128]})


def vit_tiny(**kwargs: object) -> VisionTransformer:
    """ViT-Ti (DeiT): D=192, 12 blocks, 3 heads. Defaults 224 px, patch 16, RGB."""
    return _preset(192, 12, 3, kwargs)


def vit_small(**kwargs: object) -> VisionTransformer:
    """ViT-S (DeiT; MSN, ExtreMA): D=384, 12 blocks, 6 heads. Defaults 224 px, patch 16, RGB."""
    return _preset(384, 12, 6, kwargs)


def vit_base(**kwargs: object) -> VisionTransformer:
    """ViT-B: D=768, 12 blocks, 12 heads. Defaults 224 px, patch 16, RGB."""
    return _preset(768, 12, 12, kwargs)

