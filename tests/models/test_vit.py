from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from selfsup.models import (
    VisionTransformer,
    build_backbone,
    sincos_pos_embed_2d,
    vit_base,
    vit_small,
    vit_tiny,
)
from selfsup.data.masking import random_keep_indices as random_mask
from selfsup.models.vit import ClassAttentionBlock, DropPath


def random_keep_indices(batch: int, num_patches: int, keep: int, shared: bool) -> Tensor:
    """``keep`` random visible patch indices per image (the shared masking module, by count)."""
    return random_mask(batch, num_patches, 1 - keep / num_patches, shared=shared)


def _tiny(**kwargs: object) -> VisionTransformer:
    args: dict[str, object] = dict(
        img_size=16, patch_size=4, in_channels=3, embed_dim=32, depth=2, num_heads=4
    )
    args.update(kwargs)
    return VisionTransformer(**args)  # type: ignore[arg-type]


def _block0_token_counts(model: VisionTransformer) -> tuple[list[int], RemovableHandle]:
    """Record how many tokens enter the first transformer block on each call."""
    seen: list[int] = []
    handle = model.blocks[0].register_forward_pre_hook(
        lambda _module, args: seen.append(args[0].shape[1])
    )
    return seen, handle


# ------------------------------------------------------------------ shapes and presets
@pytest.mark.parametrize(("img_size", "channels", "tokens"), [(28, 1, 49), (32, 3, 64)])
def test_vit_tiny_shapes(img_size: int, channels: int, tokens: int) -> None:
    torch.manual_seed(0)
    model = vit_tiny(img_size=img_size, patch_size=4, in_channels=channels).eval()
    assert model.num_patches == tokens and model.num_features == 192 and model.patch_size == 4
    x = torch.randn(2, channels, img_size, img_size)
    assert model(x).shape == (2, 192)
    assert model.forward_tokens(x).shape == (2, 1 + tokens, 192)
    feats = model.forward_features(x)
    assert feats["patch_tokens"].shape == (2, tokens, 192)
    assert {k: v.shape for k, v in feats.items() if k != "patch_tokens"} == {
        "cls": (2, 192),
        "cls_prenorm": (2, 192),
        "mean": (2, 192),
    }


def test_presets_have_paper_widths_and_reject_overrides_of_fixed_shape() -> None:
    with torch.device("meta"):  # shapes only: no memory, no init cost
        models = {name: f() for name, f in (("ti", vit_tiny), ("s", vit_small), ("b", vit_base))}
    for name, dim, heads in (("ti", 192, 3), ("s", 384, 6), ("b", 768, 12)):
        model = models[name]
        assert model.embed_dim == dim and len(model.blocks) == 12
        assert model.blocks[0].attn.num_heads == heads
        assert model.num_patches == 196 and model.in_channels == 3
    # DeiT-S/16 has 22,050,664 parameters; ours lacks its 1000-class head and its learned
    # 197 x 384 position embedding (sin-cos is a buffer, not a parameter)
    n = sum(p.numel() for p in models["s"].parameters())
    assert n == 22_050_664 - (384 * 1000 + 1000) - 197 * 384
    with pytest.raises(ValueError, match="vit_custom"):
        vit_tiny(embed_dim=64)


def test_pool_selects_the_matching_feature() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 3, 16, 16)
    reference = _tiny().eval()
    feats = reference.forward_features(x)
    for pool in ("cls", "cls_prenorm", "mean"):
        model = _tiny(pool=pool).eval()
        model.load_state_dict(reference.state_dict())
        torch.testing.assert_close(model(x), feats[pool])
    # post-norm CLS is the LayerNorm of the pre-norm CLS, and differs from it
    torch.testing.assert_close(feats["cls"], reference.norm(feats["cls_prenorm"]))
    assert not torch.allclose(feats["cls"], feats["cls_prenorm"])
    torch.testing.assert_close(feats["mean"], feats["patch_tokens"].mean(1))
    tokens = reference.forward_tokens(x)
    torch.testing.assert_close(tokens[:, 0], feats["cls"])
    torch.testing.assert_close(tokens[:, 1:], feats["patch_tokens"])


def test_model_without_cls_token() -> None:
    model = _tiny(cls_token=False, pool="mean").eval()
    x = torch.randn(2, 3, 16, 16)
    assert model.forward_tokens(x).shape == (2, 16, 32)
    assert set(model.forward_features(x)) == {"patch_tokens", "mean"}
    with pytest.raises(ValueError, match="cls_token=True or use pool='mean'"):
        _tiny(cls_token=False)


# ------------------------------------------------------------------ position embeddings
def test_sincos_values_match_hand_computation() -> None:
    emb = sincos_pos_embed_2d(8, 2, 3)  # quarter = 2 -> omega = [1, 1/100]
    assert emb.shape == (6, 8)
    r, c = 1, 2
    expected = torch.tensor(
        [
            math.sin(c), math.sin(c / 100), math.cos(c), math.cos(c / 100),
            math.sin(r), math.sin(r / 100), math.cos(r), math.cos(r / 100),
        ]
    )
    torch.testing.assert_close(emb[r * 3 + c], expected)
    # token (0, 0): sin 0 = 0, cos 0 = 1
    torch.testing.assert_close(emb[0], torch.tensor([0.0, 0, 1, 1, 0, 0, 1, 1]))
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_pos_embed_2d(6, 2, 2)


def test_sincos_is_a_fixed_buffer_added_to_patch_tokens() -> None:
    model = _tiny()
    assert "pos_embed" not in dict(model.named_parameters())
    torch.testing.assert_close(model.pos_embed[0], sincos_pos_embed_2d(32, 4, 4))
    nn.init.zeros_(model.patch_embed.weight)
    nn.init.zeros_(model.patch_embed.bias)
    embedded = model.embed_patches(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(embedded, model.pos_embed.expand(2, -1, -1))


def test_sincos_at_another_resolution_is_recomputed_exactly() -> None:
    model = _tiny(img_size=28, patch_size=4)
    nn.init.zeros_(model.patch_embed.weight)
    nn.init.zeros_(model.patch_embed.bias)
    small = model.embed_patches(torch.randn(2, 3, 16, 12))  # 4 x 3 grid
    torch.testing.assert_close(small[0], sincos_pos_embed_2d(32, 4, 3))
    model.eval()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 32)
    assert model.forward_tokens(torch.randn(1, 3, 40, 40)).shape == (1, 1 + 100, 32)


def test_learned_pos_embed_is_interpolated_bicubically() -> None:
    model = _tiny(img_size=32, patch_size=4, pos_embed="learned")
    assert isinstance(model.pos_embed, nn.Parameter) and model.pos_embed.shape == (1, 64, 32)
    assert 0.01 < model.pos_embed.std().item() < 0.03  # trunc-normal(0.02)
    # same grid: the parameter itself
    assert model.pos_embed_for(8, 8) is model.pos_embed
    # a spatially constant embedding stays constant under bicubic resampling
    with torch.no_grad():
        model.pos_embed.copy_(torch.linspace(-1, 1, 32).expand(1, 64, 32))
    resized = model.pos_embed_for(4, 4)
    assert resized.shape == (1, 16, 32)
    torch.testing.assert_close(resized, torch.linspace(-1, 1, 32).expand(1, 16, 32))
    # a varying embedding really gets resampled and gradients flow back to it
    with torch.no_grad():
        model.pos_embed.normal_()
    model.eval()
    out = model(torch.randn(2, 3, 16, 16))
    out.pow(2).sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0


def test_input_size_not_divisible_by_patch_is_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of patch_size"):
        _tiny(img_size=30, patch_size=4)
    model = _tiny()
    with pytest.raises(ValueError, match="not divisible by patch_size 4"):
        model(torch.randn(1, 3, 18, 16))
    with pytest.raises(ValueError, match="in_channels=1"):
        model(torch.randn(1, 1, 16, 16))


# ------------------------------------------------------------------ token dropping
def test_block0_sees_cls_plus_kept_tokens() -> None:
    model = _tiny()
    seen, handle = _block0_token_counts(model)
    x = torch.randn(3, 3, 16, 16)
    keep = random_keep_indices(3, 16, 5, shared=False)
    assert model.forward_tokens(x, keep).shape == (3, 6, 32)
    model(x)
    handle.remove()
    assert seen == [1 + 5, 1 + 16]


def test_kept_tokens_are_embedded_patches_with_their_own_position() -> None:
    torch.manual_seed(0)
    model = _tiny()
    captured: list[Tensor] = []
    handle = model.blocks[0].register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    x = torch.randn(2, 3, 16, 16)
    keep = torch.tensor([[3, 0, 15], [7, 7, 1]])
    model(x, keep)
    handle.remove()
    full = model.embed_patches(x)
    expected = torch.stack([full[b, keep[b]] for b in range(2)])
    torch.testing.assert_close(captured[0][:, 1:], expected)
    torch.testing.assert_close(captured[0][:, 0], model.cls_token[0].expand(2, -1))


def test_keeping_every_patch_equals_no_dropping() -> None:
    torch.manual_seed(0)
    model = _tiny().eval()
    x = torch.randn(2, 3, 16, 16)
    everything = torch.arange(16).expand(2, -1)
    torch.testing.assert_close(model.forward_tokens(x, everything), model.forward_tokens(x))
    # any order of all patches gives the same [CLS] (attention is permutation-equivariant)
    shuffled = torch.stack([torch.randperm(16), torch.randperm(16)])
    torch.testing.assert_close(model(x, shuffled), model(x), atol=1e-5, rtol=1e-5)


def test_dropped_patches_get_zero_gradient() -> None:
    torch.manual_seed(0)
    model = _tiny()
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    keep = torch.tensor([[0, 5, 10], [15, 14, 2]])
    model(x, keep).pow(2).sum().backward()
    grad = x.grad.reshape(2, 3, 4, 4, 4, 4).permute(0, 2, 4, 1, 3, 5).reshape(2, 16, -1)
    per_patch = grad.abs().sum(-1)
    for b in range(2):
        kept = set(keep[b].tolist())
        for p in range(16):
            if p in kept:
                assert per_patch[b, p] > 0
            else:
                assert per_patch[b, p] == 0


def test_stacked_masks_share_one_patch_embedding() -> None:
    torch.manual_seed(0)
    model = _tiny().eval()
    x = torch.randn(3, 3, 16, 16)
    keep = torch.cat([random_keep_indices(3, 16, 4, shared=False) for _ in range(2)])  # (2*3, 4)
    stacked = model(x, keep)
    assert stacked.shape == (6, 32)
    torch.testing.assert_close(stacked, model(torch.cat([x, x]), keep))
    with pytest.raises(ValueError, match="m rows per image"):
        model(x, keep[:4])


def test_keep_indices_validation() -> None:
    model = _tiny()
    x = torch.randn(2, 3, 16, 16)
    with pytest.raises(ValueError, match="int64"):
        model(x, torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="int64"):
        model(x, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="between 1 and 16"):
        model(x, torch.zeros(2, 17, dtype=torch.long))


def test_sincos_model_sees_different_grids_with_token_dropping() -> None:
    model = _tiny(img_size=28, patch_size=4).eval()
    x = torch.randn(2, 3, 16, 16)  # focal-sized view: 16 tokens
    keep = random_keep_indices(2, 16, 6, shared=True)
    assert model.forward_tokens(x, keep).shape == (2, 7, 32)


# ------------------------------------------------------------------ class attention
def test_class_attention_model_structure_and_outputs() -> None:
    torch.manual_seed(0)
    model = _tiny(num_class_attention_blocks=2).eval()
    assert len(model.ca_blocks) == 2
    for block in model.ca_blocks:
        torch.testing.assert_close(block.gamma_1, torch.full((32,), 0.1))
        torch.testing.assert_close(block.gamma_2, torch.full((32,), 0.1))
    seen, handle = _block0_token_counts(model)
    x = torch.randn(2, 3, 16, 16)
    keep = random_keep_indices(2, 16, 4, shared=False)
    tokens = model.forward_tokens(x, keep)
    handle.remove()
    assert seen == [4]  # no early [CLS]
    assert tokens.shape == (2, 5, 32)
    feats = model.forward_features(x)
    torch.testing.assert_close(model(x), feats["cls"])
    with pytest.raises(ValueError, match="late \\[CLS\\]"):
        _tiny(num_class_attention_blocks=2, cls_token=False, pool="mean")


def test_class_attention_blocks_do_not_change_patch_tokens() -> None:
    torch.manual_seed(0)
    model = _tiny(num_class_attention_blocks=2).eval()
    x = torch.randn(2, 3, 16, 16)
    before = model.forward_features(x)
    with torch.no_grad():
        for p in model.ca_blocks.parameters():
            p.add_(torch.randn_like(p))
    after = model.forward_features(x)
    torch.testing.assert_close(after["patch_tokens"], before["patch_tokens"])
    assert not torch.allclose(after["cls"], before["cls"])
    # the patch tokens equal the plain blocks' output, normed
    tokens = model.embed_patches(x)
    for block in model.blocks:
        tokens = block(tokens)
    torch.testing.assert_close(after["patch_tokens"], model.norm(tokens))


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as LayerNorm
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_class_attention_block_matches_the_cait_equations() -> None:
    """CaiT Sec. 3 written out per sample and head from the weights (no call to the block's layers):
    z = LN1([c; X]); q = W_q z_0, k = W_k z, v = W_v z; A = softmax(q k^T / sqrt(d_h));
    c' = c + g1 W_o (A v); c'' = c' + g2 MLP(LN2(c'))."""
    torch.manual_seed(0)
    dim, heads, hd = 8, 2, 4
    block = ClassAttentionBlock(dim, heads, 2.0, True, 1e-6, 0.1)
    with torch.no_grad():  # LN affine and LayerScale away from their init, so that a swap shows
        for p in (block.norm1.weight, block.norm1.bias, block.norm2.weight, block.norm2.bias,
                  block.gamma_1, block.gamma_2):
            p.add_(0.3 * torch.randn_like(p))
    w = {k: v.detach() for k, v in block.state_dict().items()}
    cls, patches = torch.randn(3, 1, dim), torch.randn(3, 5, dim)
    expected = torch.empty(3, 1, dim)
    for b in range(3):
        z = _layer_norm(torch.cat([cls[b], patches[b]]), w["norm1.weight"], w["norm1.bias"])  # (6, 8)
        q = z[0] @ w["attn.q.weight"].T + w["attn.q.bias"]  # (8,)
        kv = z @ w["attn.kv.weight"].T + w["attn.kv.bias"]  # (6, 16): keys first, then values
        k, v = kv[:, :dim], kv[:, dim:]
        heads_out = []
        for h in range(heads):
            part = slice(h * hd, (h + 1) * hd)
            scores = (k[:, part] @ q[part]) / hd ** 0.5
            a = torch.exp(scores - scores.max())
            heads_out.append((a / a.sum()) @ v[:, part])
        attended = torch.cat(heads_out) @ w["attn.proj.weight"].T + w["attn.proj.bias"]
        c = cls[b, 0] + w["gamma_1"] * attended
        u = _layer_norm(c, w["norm2.weight"], w["norm2.bias"])
        hidden = u @ w["mlp.fc1.weight"].T + w["mlp.fc1.bias"]
        hidden = 0.5 * hidden * (1 + torch.erf(hidden / 2 ** 0.5))  # exact GELU
        expected[b, 0] = c + w["gamma_2"] * (hidden @ w["mlp.fc2.weight"].T + w["mlp.fc2.bias"])
    torch.testing.assert_close(block(cls, patches), expected)
    # permutation invariance over the patch tokens
    torch.testing.assert_close(block(cls, patches[:, [4, 2, 0, 1, 3]]), expected)


def _explicit_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v for one head: q (Q, d), k and v (N, d); the softmax written out."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return (weights / weights.sum(dim=-1, keepdim=True)) @ v


def test_both_attention_modules_equal_the_explicit_softmax_attention() -> None:
    """The two calls of F.scaled_dot_product_attention (Attention: every token attends; ClassAttention: the [CLS]
    only queries) against the attention written out from their weights, per sample and head, within 1e-6 in fp32
    (measured: about 1e-7; both compute the same sums in another order)."""
    from selfsup.models.vit import Attention, ClassAttention

    torch.manual_seed(0)
    dim, heads, tokens = 16, 4, 7
    hd = dim // heads
    x = torch.randn(3, tokens, dim)
    attention, class_attention = Attention(dim, heads, qkv_bias=True), ClassAttention(dim, heads, qkv_bias=True)
    w = {**{f"a.{k}": v.detach() for k, v in attention.state_dict().items()},
         **{f"c.{k}": v.detach() for k, v in class_attention.state_dict().items()}}
    expected_all, expected_cls = torch.empty(3, tokens, dim), torch.empty(3, 1, dim)
    for b in range(3):
        qkv = x[b] @ w["a.qkv.weight"].T + w["a.qkv.bias"]  # (N, 3D): queries, keys, values, heads in order
        q, k, v = qkv[:, :dim], qkv[:, dim:2 * dim], qkv[:, 2 * dim:]
        out = torch.cat([_explicit_attention(q[:, h * hd:(h + 1) * hd], k[:, h * hd:(h + 1) * hd],
                                             v[:, h * hd:(h + 1) * hd]) for h in range(heads)], dim=1)
        expected_all[b] = out @ w["a.proj.weight"].T + w["a.proj.bias"]
        q = x[b, :1] @ w["c.q.weight"].T + w["c.q.bias"]  # (1, D)
        kv = x[b] @ w["c.kv.weight"].T + w["c.kv.bias"]  # (N, 2D): keys, then values
        k, v = kv[:, :dim], kv[:, dim:]
        out = torch.cat([_explicit_attention(q[:, h * hd:(h + 1) * hd], k[:, h * hd:(h + 1) * hd],
                                             v[:, h * hd:(h + 1) * hd]) for h in range(heads)], dim=1)
        expected_cls[b] = out @ w["c.proj.weight"].T + w["c.proj.bias"]
    with torch.no_grad():
        got_all, got_cls = attention(x), class_attention(x)
    assert expected_all.abs().max() > 0.1 and expected_cls.abs().max() > 0.1  # outputs of order 1, not ~0
    torch.testing.assert_close(got_all, expected_all, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_cls, expected_cls, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ freezing, layer ids, misc
def test_freeze_blocks() -> None:
    model = _tiny(depth=4, pos_embed="learned")
    model.freeze_blocks(2)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    expected = {"patch_embed.weight", "patch_embed.bias", "pos_embed", "cls_token"}
    expected |= {n for n, _ in model.named_parameters() if n.startswith(("blocks.0.", "blocks.1."))}
    assert frozen == expected
    model.train()
    assert [b.training for b in model.blocks] == [False, False, True, True]
    assert model.norm.training
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    for name, p in model.named_parameters():
        assert (p.grad is None) == (name in frozen), name
    with pytest.raises(ValueError, match="k must be in"):
        model.freeze_blocks(5)


def test_freeze_blocks_keeps_late_cls_trainable() -> None:
    model = _tiny(num_class_attention_blocks=1)
    model.freeze_blocks(0)
    assert model.cls_token.requires_grad
    assert not model.patch_embed.weight.requires_grad
    assert all(p.requires_grad for p in model.blocks.parameters())


def test_layer_id_mapping() -> None:
    model = _tiny(depth=3, pos_embed="learned")
    ids = {name: model.layer_id(name) for name, _ in model.named_parameters()}
    assert ids["cls_token"] == 0 and ids["pos_embed"] == 0 and ids["patch_embed.weight"] == 0
    assert ids["blocks.0.attn.qkv.weight"] == 1
    assert ids["blocks.2.mlp.fc2.bias"] == 3
    assert ids["norm.weight"] == 4
    assert set(ids.values()) == {0, 1, 2, 3, 4}
    ca = _tiny(depth=3, num_class_attention_blocks=2)
    assert ca.layer_id("cls_token") == 4
    assert ca.layer_id("ca_blocks.1.gamma_2") == 4
    with pytest.raises(ValueError, match="named_parameters"):
        model.layer_id("backbone.blocks.0.attn.qkv.weight")
    with pytest.raises(ValueError, match="unknown parameter"):
        model.layer_id("blocks.3.norm1.weight")


def test_init_follows_mae_and_deit() -> None:
    torch.manual_seed(0)
    model = _tiny(embed_dim=64, depth=1)
    w = model.blocks[0].mlp.fc1.weight
    assert abs(w.std().item() - 0.02) < 0.002
    assert torch.all(model.blocks[0].mlp.fc1.bias == 0)
    assert torch.all(model.blocks[0].norm1.weight == 1)
    # xavier-uniform on the flattened (D, C*p*p) kernel: bound sqrt(6 / (fan_in + fan_out))
    bound = math.sqrt(6 / (3 * 16 + 64))
    assert model.patch_embed.weight.abs().max() <= bound
    assert model.patch_embed.weight.abs().max() > 0.9 * bound


def test_drop_path_drops_whole_samples_in_training_only() -> None:
    torch.manual_seed(0)
    layer = DropPath(0.5)
    x = torch.ones(200, 3, 4)
    out = layer(x)
    per_sample = out.reshape(200, -1)
    assert set(per_sample.unique().tolist()) <= {0.0, 2.0}
    assert torch.all(per_sample == per_sample[:, :1])
    assert 60 < int((per_sample[:, 0] == 0).sum()) < 140
    torch.testing.assert_close(layer.eval()(x), x)
    model = _tiny(drop_path_rate=0.2, depth=3)
    rates = [
        b.drop_path.drop_prob if isinstance(b.drop_path, DropPath) else 0.0 for b in model.blocks
    ]
    assert rates == pytest.approx([0.0, 0.1, 0.2])


def test_build_backbone_vit() -> None:
    model = build_backbone("vit_tiny", img_size=32, patch_size=4)
    assert isinstance(model, VisionTransformer) and model.num_features == 192
    custom = build_backbone(
        "vit_custom", img_size=28, patch_size=7, in_channels=1, embed_dim=16, depth=1, num_heads=2
    )
    assert custom(torch.randn(2, 1, 28, 28)).shape == (2, 16)
    with pytest.raises(ValueError, match="vit_small"):
        build_backbone("vit_huge")


# ------------------------------------------------------------------ convolutional stem
@pytest.mark.parametrize(("patch", "stem", "kernel"), [(4, [8, 16], 1), (8, [8, 16], 2), (4, [8], 2)])
def test_conv_stem_shapes(patch: int, stem: list[int], kernel: int) -> None:
    """Xiao et al.'s stem: len(stem) 3x3 stride-2 conv-BN-ReLU layers, then a projection covering
    patch / 2**len(stem) stem pixels; the token grid is the plain ViT's at every input size."""
    model = _tiny(img_size=16, patch_size=patch, conv_stem=stem)
    convs = [m for m in model.stem if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride) for c in convs] == [
        (c_in, c_out, (2, 2)) for c_in, c_out in zip([3, *stem[:-1]], stem)]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.stem) == len(stem)
    assert model.patch_embed.in_channels == stem[-1]
    assert model.patch_embed.kernel_size == (kernel, kernel) == model.patch_embed.stride
    for size in (16, 32):  # the training size and a larger one
        tokens = model.embed_patches(torch.randn(3, 3, size, size))
        grid = model.grid_for(size, size)
        assert tokens.shape == (3, grid[0] * grid[1], 32)
    keep = random_keep_indices(3, model.num_patches, max(model.num_patches // 2, 1), shared=False)
    assert model(torch.randn(3, 3, 16, 16), keep_indices=keep).shape == (3, 32)


def test_conv_stem_without_layers_is_the_plain_patchify() -> None:
    torch.manual_seed(0)
    plain = _tiny()
    torch.manual_seed(0)
    empty = _tiny(conv_stem=[])
    assert len(empty.stem) == 0
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(plain(x), empty(x))
    assert set(dict(plain.named_parameters())) == set(dict(empty.named_parameters()))


def test_conv_stem_stride_one_layers_add_convolution_not_tokens() -> None:
    """A stride-1 layer runs at full resolution; the strides' product sets the projection, so
    [8, 16, 16] with strides [1, 2, 2] and patch 4 gives the 1x1 projection and the plain grid."""
    model = _tiny(img_size=16, patch_size=4, conv_stem=[8, 16, 16], conv_stem_strides=[1, 2, 2])
    convs = [m for m in model.stem if isinstance(m, nn.Conv2d)]
    assert [c.stride for c in convs] == [(1, 1), (2, 2), (2, 2)]
    assert model.patch_embed.kernel_size == (1, 1)
    assert model.stem[:3](torch.randn(2, 3, 16, 16)).shape == (2, 8, 16, 16)
    assert model.embed_patches(torch.randn(2, 3, 16, 16)).shape == (2, 16, 32)
    with pytest.raises(ValueError, match="stride of 1 or 2 for each"):
        _tiny(conv_stem=[8, 16], conv_stem_strides=[2])
    with pytest.raises(ValueError, match="bad value for conv_stem_strides.0: 3; allowed values: 1, 2"):
        _tiny(conv_stem=[8, 16], conv_stem_strides=[3, 1])
    with pytest.raises(ValueError, match="multiple of 8"):
        _tiny(img_size=16, patch_size=4, conv_stem=[8, 8, 8], conv_stem_strides=[2, 2, 2])


def test_conv_stem_rejects_a_patch_it_cannot_reach() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        _tiny(img_size=14, patch_size=7, conv_stem=[8, 16])
    with pytest.raises(ValueError, match="bad value for conv_stem.1: 0; use an integer in"):
        _tiny(conv_stem=[8, 0])


def test_conv_stem_is_frozen_and_on_layer_zero() -> None:
    model = _tiny(depth=2, conv_stem=[8, 16])
    ids = {name: model.layer_id(name) for name, _ in model.named_parameters()}
    assert all(ids[n] == 0 for n in ids if n.startswith("stem."))
    model.freeze_blocks(1)
    assert not any(p.requires_grad for p in model.stem.parameters())
    model.train()
    assert not any(m.training for m in model.stem)  # frozen BatchNorm keeps its statistics
    assert model.blocks[1].training
    stats = model.stem[1].running_mean.clone()
    model(torch.randn(4, 3, 16, 16) + 3)
    torch.testing.assert_close(model.stem[1].running_mean, stats)


def test_vit_laptop_preset() -> None:
    """The CPU preset: 128 wide, 4 blocks, MLP 2, conv stem (64, 128), patch 4: 49 tokens at 28 px."""
    model = build_backbone("vit_laptop", img_size=28, in_channels=1)
    assert (model.embed_dim, model.depth, model.num_patches) == (128, 4, 49)
    assert model.blocks[0].mlp.fc1.out_features == 256
    assert [m.out_channels for m in model.stem if isinstance(m, nn.Conv2d)] == [64, 128]
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 128)
    with pytest.raises(ValueError, match="fixed by this preset"):
        build_backbone("vit_laptop", depth=6)
