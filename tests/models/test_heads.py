from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.models import GaussianHead, GeM, Prototypes, mlp


def _layout(model: nn.Sequential) -> list[str]:
    return [type(m).__name__ for m in model]


# ------------------------------------------------------------------ mlp
def test_mlp_vicreg_expander_layout() -> None:
    head = mlp([8, 16, 16, 4])
    assert _layout(head) == [
        "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear",
    ]
    assert [(m.in_features, m.out_features) for m in head if isinstance(m, nn.Linear)] == [
        (8, 16), (16, 16), (16, 4),
    ]
    assert all(m.bias is not None for m in head if isinstance(m, nn.Linear))
    assert head(torch.randn(5, 8)).shape == (5, 4)


def test_mlp_extrema_layernorm_gelu() -> None:
    head = mlp([8, 32, 32, 4], norm="layer", act="gelu")
    assert _layout(head) == ["Linear", "LayerNorm", "GELU", "Linear", "LayerNorm", "GELU", "Linear"]
    # LayerNorm works on a single sample (BN would not in training mode)
    assert head(torch.randn(1, 8)).shape == (1, 4)


def test_mlp_mae_ct_projector_last_bn_without_relu() -> None:
    head = mlp([8, 16, 16, 4], last_norm=True)
    assert _layout(head)[-2:] == ["Linear", "BatchNorm1d"]
    assert head[-1].num_features == 4
    head.train()
    out = head(torch.randn(64, 8))
    # last BN (gamma 1, beta 0) in training mode: zero mean, unit variance, negatives kept
    torch.testing.assert_close(out.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(0, unbiased=False), torch.ones(4), atol=1e-3, rtol=0)
    assert (out < 0).any()


def test_mlp_moco_v3_last_norm_without_affine() -> None:
    """MoCo v3's heads (their builder.py ``_build_mlp``): no Linear bias, the last BN without affine, the hidden ones
    with it; a LayerNorm head likewise loses only its last affine."""
    head = mlp([8, 16, 4], bias=False, last_bias=False, last_norm=True, last_affine=False)
    assert [type(m) for m in head] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    assert head[1].affine and not head[4].affine and head[4].weight is None
    assert sum(p.numel() for p in head.parameters()) == 8 * 16 + 2 * 16 + 16 * 4
    layer = mlp([8, 16, 4], norm="layer", last_norm=True, last_affine=False)
    assert layer[1].elementwise_affine and not layer[4].elementwise_affine
    assert mlp([8, 4], last_norm=True)[-1].affine  # the default keeps it


def test_mlp_last_act_bias_flags_and_no_norm() -> None:
    head = mlp([4, 6, 3], norm="none", act="gelu", last_act=True, bias=False, last_bias=False)
    assert _layout(head) == ["Linear", "GELU", "Linear", "GELU"]
    assert head[0].bias is None and head[2].bias is None
    head = mlp([4, 6, 3], bias=False)
    assert head[0].bias is None and head[-1].bias is not None
    single = mlp([4, 3])
    assert _layout(single) == ["Linear"]
    out = mlp([4, 3], last_act=True)(torch.randn(10, 4))
    assert torch.all(out >= 0)


def test_mlp_rejects_bad_configs() -> None:
    with pytest.raises(ValueError, match="at least an input and an output"):
        mlp([8])
    with pytest.raises(ValueError, match="norm must be one of"):
        mlp([8, 4], norm="group")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="act must be one of"):
        mlp([8, 4], act="tanh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="last_norm=True needs"):
        mlp([8, 4], norm="none", last_norm=True)


def test_mlp_converts_to_sync_batchnorm() -> None:
    head = nn.SyncBatchNorm.convert_sync_batchnorm(mlp([8, 16, 4], last_norm=True))
    assert sum(isinstance(m, nn.SyncBatchNorm) for m in head.modules()) == 2


# ------------------------------------------------------------------ prototypes
def test_prototypes_return_cosine_logits() -> None:
    torch.manual_seed(0)
    protos = Prototypes(10, 6)
    assert protos.weight.shape == (10, 6)
    assert protos.weight._no_weight_decay is True
    assert protos.weight.abs().max() <= 6**-0.5
    z = torch.randn(4, 6)
    logits = protos(z)
    expected = F.cosine_similarity(z[:, None, :], protos.weight[None, :, :], dim=-1)
    torch.testing.assert_close(logits, expected)
    # invariant to the scale of z and of the prototypes; a prototype matches itself with 1
    torch.testing.assert_close(protos(3.0 * z), logits)
    self_logits = protos(protos.weight.detach() * 5)
    torch.testing.assert_close(self_logits.diagonal(), torch.ones(10))
    assert self_logits.max() <= 1 + 1e-6


def test_prototypes_gradient_reaches_weight_and_input() -> None:
    torch.manual_seed(0)
    protos = Prototypes(5, 3)
    z = torch.randn(4, 3, requires_grad=True)
    (protos(z) / 0.1).softmax(-1)[:, 0].sum().backward()
    assert protos.weight.grad is not None and protos.weight.grad.abs().sum() > 0
    assert z.grad is not None and z.grad.abs().sum() > 0
    # the gradient of a cosine is orthogonal to the vector (scale invariance)
    torch.testing.assert_close((z.grad * z).sum(1), torch.zeros(4), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"\(B, 3\)"):
        protos(torch.randn(4, 4))


# ------------------------------------------------------------------ GeM
def test_gem_p1_is_average_pooling_and_large_p_approaches_max() -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 3, 5, 4) + 0.1
    torch.testing.assert_close(GeM(p=1.0)(x), F.adaptive_avg_pool2d(x, 1).flatten(1))
    big = GeM(p=200.0, learnable=False)(x.double())
    torch.testing.assert_close(big, x.double().amax(dim=(2, 3)), rtol=2e-2, atol=0)
    cube = GeM()(x)  # p = 3 default: (mean x^3)^(1/3)
    torch.testing.assert_close(cube, x.pow(3).mean((2, 3)).pow(1 / 3))
    # the eps clamp keeps negative/zero activations from producing NaNs
    assert torch.isfinite(GeM()(-x)).all()
    # log-space: a huge exponent on large activations neither overflows nor underflows (float32)
    huge = GeM(p=5000.0, learnable=False)(100 * x)
    torch.testing.assert_close(huge, 100 * x.amax(dim=(2, 3)), rtol=2e-3, atol=0)
    # p is clamped to >= 1: a learnable exponent pushed below 1 pools like the average
    torch.testing.assert_close(GeM(p=0.5)(x), F.adaptive_avg_pool2d(x, 1).flatten(1))


def test_gem_learnable_p_gets_gradient_fixed_p_is_buffer() -> None:
    gem = GeM()
    assert isinstance(gem.p, nn.Parameter)
    gem(torch.rand(2, 3, 4, 4) + 0.1).sum().backward()
    assert gem.p.grad is not None and gem.p.grad.abs() > 0
    fixed = GeM(p=2.0, learnable=False)
    assert list(fixed.parameters()) == [] and "p" in dict(fixed.named_buffers())
    with pytest.raises(ValueError, match="p > 0"):
        GeM(p=0.0)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        gem(torch.rand(2, 3))


# ------------------------------------------------------------------ Gaussian head
def test_gaussian_head_shapes_and_nonnegative_variance() -> None:
    torch.manual_seed(0)
    head = GaussianHead(16, 8, trunk_dims=[32, 32])
    assert [type(m).__name__ for m in head.trunk] == [
        "Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "BatchNorm2d", "ReLU",
    ]
    assert head.gem_mu.p is not head.gem_var.p
    mu, var = head(torch.randn(4, 16, 3, 3))
    assert mu.shape == var.shape == (4, 8)
    assert torch.all(var >= 0)
    assert (mu < 0).any()  # the mean head has no ReLU
    (mu.sum() + var.sum()).backward()
    assert head.gem_mu.p.grad is not None and head.gem_var.p.grad is not None


def test_gaussian_head_matches_gem_then_linear() -> None:
    torch.manual_seed(0)
    head = GaussianHead(6, 5)  # no trunk
    fmap = torch.rand(3, 6, 4, 4) + 0.05
    mu, var = head(fmap)
    pooled = fmap.pow(3).mean((2, 3)).pow(1 / 3)
    torch.testing.assert_close(mu, head.fc_mu(pooled))
    torch.testing.assert_close(var, F.relu(head.fc_var(pooled)))


def test_gaussian_head_vector_input_is_a_1x1_map() -> None:
    torch.manual_seed(0)
    head = GaussianHead(6, 5, trunk_dims=[7]).eval()
    vec = torch.rand(3, 6) + 0.05
    mu_v, var_v = head(vec)
    mu_m, var_m = head(vec[:, :, None, None])
    torch.testing.assert_close(mu_v, mu_m)
    torch.testing.assert_close(var_v, var_m)
    with pytest.raises(ValueError, match=r"\(B, 6, H, W\)"):
        head(torch.rand(3, 7))


def test_mae_and_extrema_initialise_their_linear_layers_xavier_uniform() -> None:
    """MAE's / ExtreMA's initialize_weights: U(-a, a), a = sqrt(6 / (fan_in + fan_out)); bias 0 (ours: trunc-normal)."""
    import math

    from selfsup.methods import build_method
    from selfsup.models import build_backbone

    def check(linear: nn.Linear) -> None:
        bound = math.sqrt(6 / (linear.in_features + linear.out_features))
        w = linear.weight.detach()
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound  # trunc-normal(0.02) stays below 0.04
        assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.15)
        assert linear.bias is None or torch.count_nonzero(linear.bias) == 0

    torch.manual_seed(0)
    vit = build_backbone("vit_custom", img_size=8, patch_size=4, in_channels=1, embed_dim=32, depth=1, num_heads=2)
    mae = build_method({"name": "mae", "decoder_dim": 32, "decoder_depth": 1, "decoder_heads": 2}, vit, 1)
    for linear in (vit.blocks[0].attn.qkv, vit.blocks[0].mlp.fc2, mae.decoder.embed, mae.decoder.blocks[0].attn.proj,
                   mae.decoder.head):
        check(linear)
    vit = build_backbone("vit_custom", img_size=8, patch_size=4, in_channels=1, embed_dim=32, depth=1, num_heads=2,
                         num_class_attention_blocks=1)
    extrema = build_method({"name": "extrema", "projector": [64, 64, 16], "predictor": [64, 16], "mask_ratio": 0.5,
                            "num_masks": 1}, vit, 1)
    for linear in (vit.blocks[0].attn.qkv, vit.ca_blocks[0].attn.kv, extrema.projector[0], extrema.predictor[-1]):
        check(linear)
    teacher = dict(extrema.target.module.named_parameters())  # the teacher starts as the (re-initialised) student
    assert all(torch.equal(p, teacher[f"0.{n}"]) for n, p in vit.named_parameters())
