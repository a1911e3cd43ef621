"""Projector / predictor heads shared by every method.

- :func:`mlp` is the one MLP builder (VICReg/Barlow expanders, BYOL/ExtreMA projector and
  predictor, MSN and MAE-CT projection heads, the multi-view small projectors).
- :class:`Prototypes` holds MSN's learnable prototypes (Assran et al. 2022, Sec. 3).
- :class:`DINOHead` is DINO's and iBOT's projection head: an MLP to a bottleneck, L2-normalised, then a
  weight-normalised linear layer (:class:`NormalizedLinear`) to K logits (Caron et al. 2021, Sec. 3.1 and App.).
- :class:`GeM` and :class:`GaussianHead` give MAST's mean / diagonal-covariance heads
  (Huang et al. 2023, Sec. 3.2 and App. A; GeM from Radenovic et al. 2018).
"""
from __future__ import annotations

import math

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DINOHead", "GaussianHead", "GeM", "NormalizedLinear", "Prototypes", "mlp"]

_NORMS = ("batch", "layer", "none")
_ACTS = ("relu", "gelu")


def _norm(kind: str, dim: int, affine: bool = True) -> nn.Module:
    return nn.BatchNorm1d(dim, affine=affine) if kind == "batch" else nn.LayerNorm(dim, elementwise_affine=affine)


def _act(kind: str) -> nn.Module:
    return nn.ReLU(inplace=True) if kind == "relu" else nn.GELU()


def xavier_linears_(module: nn.Module) -> nn.Module:
    """Re-initialise every ``nn.Linear`` in ``module`` xavier-uniform, bias 0: the init of MAE's and ExtreMA's code
    (``torch.nn.init.xavier_uniform_`` in ``initialize_weights``) for their ViT blocks and heads; our default is
    DeiT's trunc-normal(0.02). Other layers (LayerNorm, patch embedding, tokens) keep their init."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return module


def mlp(
    dims: Sequence[int],
    norm: Literal["batch", "layer", "none"] = "batch",
    act: Literal["relu", "gelu"] = "relu",
    last_norm: bool = False,
    last_act: bool = False,
    bias: bool = True,
    last_bias: bool = True,
    last_affine: bool = True,
) -> nn.Sequential:
    """Build ``Linear -> norm -> act`` hidden layers and a final ``Linear (-> norm) (-> act)``.

    ``dims = [in, hidden..., out]`` gives ``len(dims) - 1`` Linear layers. Examples:
    VICReg expander ``mlp([512, 2048, 2048, 2048])``; BYOL projector ``mlp([512, 4096, 256])``;
    MSN head ``mlp([D, 2048, 2048, 256], act="gelu")``; ExtreMA projector
    ``mlp([D, 4096, 4096, 256], norm="layer", act="gelu")``; MAE-CT projector
    ``mlp([D, 2048, 2048, 256], last_norm=True)`` (last BN, no ReLU); MoCo v3 projector
    ``mlp([D, 4096, 4096, 256], bias=False, last_bias=False, last_norm=True, last_affine=False)``. ``norm="batch"`` uses
    ``BatchNorm1d``; the training engine converts it to SyncBatchNorm when distributed.

    Args:
        bias: bias of the hidden Linear layers.
        last_bias: bias of the final Linear layer.
        last_norm / last_act: append the norm / activation after the final Linear too.
        last_affine: give that last norm a learnable scale and shift (MoCo v3's last BatchNorm has none).
    """
    dims = [int(d) for d in dims]
    if len(dims) < 2 or any(d < 1 for d in dims):
        raise ValueError(
            f"dims must list at least an input and an output size, all positive, got {dims}; "
            "e.g. [512, 2048, 256]"
        )
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    if act not in _ACTS:
        raise ValueError(f"act must be one of {_ACTS}, got {act!r}")
    if last_norm and norm == "none":
        raise ValueError("last_norm=True needs norm='batch' or norm='layer', got norm='none'")
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        last = i == len(dims) - 2
        layers.append(nn.Linear(d_in, d_out, bias=last_bias if last else bias))
        if norm != "none" and (not last or last_norm):
            layers.append(_norm(norm, d_out, affine=last_affine or not last))
        if not last or last_act:
            layers.append(_act(act))
    return nn.Sequential(*layers)


class Prototypes(nn.Module):
    """Learnable prototypes ``W (K, d)``; returns cosine logits ``norm(z) @ norm(W).T``.

    MSN (Assran et al. 2022, Sec. 3) compares L2-normalised anchor/target embeddings with
    L2-normalised prototypes; the loss divides by its temperature. The weight is marked
    ``_no_weight_decay`` (MSN excludes prototypes from weight decay). Init: uniform in
    ``[-1/sqrt(d), 1/sqrt(d)]`` as in the MSN code.
    """

    def __init__(self, num_prototypes: int, dim: int) -> None:
        super().__init__()
        if num_prototypes < 1 or dim < 1:
            raise ValueError(
                f"num_prototypes and dim must be positive, got {num_prototypes} and {dim}"
            )
        bound = dim**-0.5
        self.weight = nn.Parameter(torch.empty(num_prototypes, dim).uniform_(-bound, bound))
        self.weight._no_weight_decay = True  # type: ignore[attr-defined]

    def forward(self, z: Tensor) -> Tensor:
        """``z (B, d)`` -> cosine similarities ``(B, K)``."""
        if z.ndim != 2 or z.shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"expected embeddings of shape (B, {self.weight.shape[1]}), got {tuple(z.shape)}"
            )
        return F.normalize(z, dim=1) @ F.normalize(self.weight, dim=1).t()


class _ZeroGradient(torch.autograd.Function):
    """The identity, with a zero gradient."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return torch.zeros_like(grad)


class NormalizedLinear(nn.Module):
    """Weight-normalised linear layer without bias, ``y = x (g v / ||v||)^T`` with one norm per output row (Salimans
    & Kingma 2016; DINO's ``nn.utils.weight_norm(nn.Linear(d, K, bias=False))``).

    ``learn_norm=False`` fixes ``g`` to 1 (DINO's ``norm_last_layer=True``): every output is a cosine similarity
    and ``g`` is no parameter at all. Parameters: ``weight_v (K, d)`` (nn.Linear's init) and, when learnt,
    ``weight_g (K, 1)`` initialised to 1, as theirs. Rescaling ``v`` changes nothing, so weight decay on ``v``
    only shrinks its norm.
    """

    def __init__(self, in_dim: int, out_dim: int, learn_norm: bool = False) -> None:
        super().__init__()
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"in_dim and out_dim must be positive, got {in_dim} and {out_dim}")
        self.weight_v = nn.Parameter(nn.Linear(in_dim, out_dim, bias=False).weight.detach().clone())
        self.weight_g = nn.Parameter(torch.ones(out_dim, 1)) if learn_norm else None

    def weight(self, frozen: bool = False) -> Tensor:
        """``g v / ||v||``; ``frozen``: the same value, but ``v`` and ``g`` get a zero gradient (DINO freezes the
        last layer early on; a zero keeps every parameter in the graph, as DistributedDataParallel needs)."""
        v, g = self.weight_v, self.weight_g
        if frozen:
            v, g = _ZeroGradient.apply(v), (None if g is None else _ZeroGradient.apply(g))
        w = F.normalize(v, dim=1)
        return w if g is None else g * w

    def forward(self, x: Tensor, frozen: bool = False) -> Tensor:
        """In float32 at least, also under mixed precision: the logits are divided by temperatures of 0.04-0.1
        (MSN's similarities likewise)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.to(dtype), self.weight(frozen).to(dtype))

    def extra_repr(self) -> str:
        k, d = self.weight_v.shape
        return f"in_dim={d}, out_dim={k}, learn_norm={self.weight_g is not None}"


class DINOHead(nn.Module):
    """DINO's projection head (Caron et al. 2021, Sec. 3.1 "Network architecture"; their ``DINOHead``).

    ``x -> mlp([in, hidden x (layers - 1), bottleneck], GELU, BN optional) -> L2-normalise -> NormalizedLinear -> K``
    (3 layers, hidden 2048, bottleneck 256, K = 65536 in the paper). Linear layers of the MLP are
    trunc-normal(0.02), bias 0, as theirs. ``patch_out_dim`` adds iBOT's separate last layer for patch tokens
    (``patch_last_layer``); ``None`` shares the [CLS] one (iBOT's shared head, the ViT-S/B setting).
    """

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 num_layers: int = 3, batch_norm: bool = False, norm_last_layer: bool = True,
                 patch_out_dim: int | None = None) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"the head needs at least one layer, got num_layers={num_layers}")
        dims = [in_dim, *[hidden_dim] * (num_layers - 1), bottleneck_dim]
        self.mlp = mlp(dims, norm="batch" if batch_norm else "none", act="gelu")
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = NormalizedLinear(bottleneck_dim, out_dim, learn_norm=not norm_last_layer)
        self.patch_last_layer = (self.last_layer if patch_out_dim is None
                                 else NormalizedLinear(bottleneck_dim, patch_out_dim, learn_norm=not norm_last_layer))

    def bottleneck(self, x: Tensor) -> Tensor:
        """``(..., in) -> (..., bottleneck)``, L2-normalised (tokens are flattened through the MLP: BatchNorm then
        normalises over images and tokens, as iBOT's head)."""
        shape = x.shape
        return F.normalize(self.mlp(x.reshape(-1, shape[-1])), dim=-1).reshape(*shape[:-1], -1)

    def forward(self, x: Tensor, freeze_last_layer: bool = False) -> Tensor:
        """``(B, in)`` -> logits ``(B, K)``; ``freeze_last_layer``: the last layer gets a zero gradient."""
        return self.last_layer(self.bottleneck(x), frozen=freeze_last_layer)

    def forward_tokens(self, cls: Tensor, patches: Tensor, freeze_last_layer: bool = False) -> tuple[Tensor, Tensor]:
        """iBOT: ``[CLS] (B, in)`` and ``patches (B, N, in)`` through one MLP call -> ``(B, K)``, ``(B, N, K')``."""
        h = self.bottleneck(torch.cat([cls[:, None], patches], dim=1))
        return (self.last_layer(h[:, 0], frozen=freeze_last_layer),
                self.patch_last_layer(h[:, 1:], frozen=freeze_last_layer))


class GeM(nn.Module):
    """Generalised-mean pooling (Radenovic et al. 2018): ``(mean_u clamp(x, eps)^p)^(1/p)``.

    ``(B, C, H, W) -> (B, C)``. ``p = 1`` is average pooling, ``p -> inf`` max pooling; ``p`` is a
    learnable scalar (init 3) unless ``learnable=False``.
    """

    def __init__(self, p: float = 3.0, eps: float = 1e-6, learnable: bool = True) -> None:
        super().__init__()
        if p <= 0 or eps <= 0:
            raise ValueError(f"GeM needs p > 0 and eps > 0, got p={p}, eps={eps}")
        self.eps = eps
        p_tensor = torch.tensor(float(p))
        if learnable:
            self.p = nn.Parameter(p_tensor)
        else:
            self.register_buffer("p", p_tensor)

    def forward(self, x: Tensor) -> Tensor:
        """Computed in log space, ``exp((logsumexp(p log x) - log n) / p)``, with ``p`` clamped to >= 1: large
        exponents (a learnable p can take big steps early in training) neither overflow nor underflow."""
        if x.ndim != 4:
            raise ValueError(f"GeM expects a (B, C, H, W) map, got shape {tuple(x.shape)}")
        p = self.p.clamp(min=1.0)
        log_x = x.clamp(min=self.eps).log().flatten(2)
        return torch.exp((torch.logsumexp(p * log_x, dim=2) - math.log(log_x.shape[2])) / p)

    def extra_repr(self) -> str:
        return f"p={float(self.p):.3f}, eps={self.eps}"


class GaussianHead(nn.Module):
    """MAST projector: shared position-wise trunk, then a mean head and a diagonal-covariance
    head (MAST Sec. 3.2, App. A).

    ``trunk``: for each width in ``trunk_dims`` a 1x1 conv (= a Linear applied at every
    position) + BatchNorm + ReLU (MAST: two layers of 8192). Mean head: ``GeM -> Linear -> mu``.
    Covariance head: ``GeM -> Linear -> ReLU -> var`` (the diagonal of Sigma, >= 0 and possibly
    exactly 0: losses must guard divisions); ``variance="softplus"`` gives a strictly positive
    variance instead (a deviation from the paper). The two heads have their own GeM exponent.

    Input: the backbone's spatial map ``(B, C, H, W)`` (e.g. ``ResNet.forward_feature_map``),
    or a pooled vector ``(B, C)``, treated as a 1x1 map (the spec's cheap small-scale variant;
    GeM is then the identity on positive inputs). Returns ``(mu, var)``, each ``(B, out_dim)``.
    """

    def __init__(self, in_channels: int, out_dim: int, trunk_dims: Sequence[int] = (),
                 variance: str = "relu") -> None:
        super().__init__()
        if variance not in ("relu", "softplus"):
            raise ValueError(f"variance must be 'relu' (the paper) or 'softplus', got {variance!r}")
        self.variance = F.relu if variance == "relu" else F.softplus
        widths = [int(in_channels), *(int(d) for d in trunk_dims), int(out_dim)]
        if any(w < 1 for w in widths):
            raise ValueError(
                f"in_channels, trunk_dims and out_dim must be positive, got {widths}"
            )
        trunk: list[nn.Module] = []
        for d_in, d_out in zip(widths[:-2], widths[1:-1]):
            trunk += [nn.Conv2d(d_in, d_out, 1, bias=False), nn.BatchNorm2d(d_out), nn.ReLU(True)]
        self.trunk = nn.Sequential(*trunk)
        self.in_channels = widths[0]
        self.gem_mu = GeM()
        self.gem_var = GeM()
        self.fc_mu = nn.Linear(widths[-2], out_dim)
        self.fc_var = nn.Linear(widths[-2], out_dim)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        if features.ndim == 2:
            features = features[:, :, None, None]
        if features.ndim != 4 or features.shape[1] != self.in_channels:
            raise ValueError(
                f"expected a (B, {self.in_channels}, H, W) feature map or (B, {self.in_channels}) "
                f"vector, got shape {tuple(features.shape)}"
            )
        t = self.trunk(features)
        mu = self.fc_mu(self.gem_mu(t))
        var = self.variance(self.fc_var(self.gem_var(t)))
        return mu, var
