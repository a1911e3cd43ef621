"""MAE: the encoder sees only the kept patches, the decoder predicts every patch, the loss and the picture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from selfsup.config import ConfigError
from selfsup.losses.mae import mae_loss, patchify
from selfsup.methods.mae import MAE, MAEConfig, MAEDecoder
from selfsup.models.vit import VisionTransformer
from selfsup.report.method_figures import draw_method_figures


def _method(vit_params: dict | None = None, **kwargs) -> MAE:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_channels=1, embed_dim=16, depth=2, num_heads=2,
                            **{"pool": "mean", **(vit_params or {})})
    return MAE(vit, MAEConfig(**{"decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2, **kwargs}), total_steps=1)


def test_masked_pixels_do_not_reach_the_encoder_and_the_step_is_the_masked_loss() -> None:
    method = _method()
    x = torch.randn(3, 1, 16, 16)
    torch.manual_seed(5)
    prediction, target, masked = method.reconstruct(x)
    assert prediction.shape == (3, 16, 16) and target.shape == (3, 16, 16) and (masked.sum(1) == 12).all()
    assert torch.equal(target, patchify(x, 4))
    changed = patchify(x, 4).clone()
    changed[masked] = 100.0  # whatever the hidden patches hold
    x2 = changed.view(3, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(3, 1, 16, 16)
    torch.manual_seed(5)
    prediction2, _, masked2 = method.reconstruct(x2)
    assert torch.equal(masked, masked2)
    torch.testing.assert_close(prediction2, prediction)  # the encoder and decoder saw the same visible patches
    torch.manual_seed(5)
    out = method([x])
    torch.testing.assert_close(out.loss, mae_loss(prediction, target, masked))


def _masked_mse_by_hand(prediction: torch.Tensor, images: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """MAE Sec. 3 from scratch: per-patch normalised pixels (unbiased var + 1e-6), squared error on masked patches."""
    b = images.shape[0]
    target = images.reshape(b, 1, 4, 4, 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(b, 16, 16)  # 4x4 patches, row-major
    target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
    per_patch = ((prediction - target) ** 2).mean(-1)
    return per_patch[masked].mean()


def test_two_views_average_their_losses_and_the_decoder_is_not_exported() -> None:
    method = _method()
    x = torch.randn(2, 1, 16, 16)
    views = [x, x.flip(3) * 2 + 1]
    torch.manual_seed(1)
    both = method(views).loss
    torch.manual_seed(1)  # the same masks, in the same order
    per_view = []
    for view in views:
        prediction, _, masked = method.reconstruct(view)
        per_view.append(_masked_mse_by_hand(prediction, view, masked))
    assert abs(per_view[0].item() - per_view[1].item()) > 1e-3  # a sum or one view alone would differ
    torch.testing.assert_close(both, (per_view[0] + per_view[1]) / 2)
    assert method.backbone is method.encoder and method.export_params == {"pool": "mean"}
    assert _method(eval_pool="cls").export_params == {"pool": "cls"}


def test_reconstruction_picture(tmp_path) -> None:
    draw_method_figures("mae", _method(), tmp_path, [], torch.randn(4, 1, 16, 16))
    assert (tmp_path / "mae_reconstruction.png").stat().st_size > 1000


def test_bad_settings_name_the_key() -> None:
    for key, value in [("mask_ratio", 1.0), ("decoder_dim", 6), ("decoder_heads", 3), ("eval_pool", "max")]:
        with pytest.raises(ConfigError, match=f"method.{key}"):
            MAEConfig(**{key: value})
    cait = VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=1, num_heads=2,
                             num_class_attention_blocks=1)
    with pytest.raises(ConfigError, match="needs a ViT backbone without class-attention"):
        MAE(cait, MAEConfig(decoder_dim=16, decoder_heads=2), 1)
    prenorm = VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=1, num_heads=2,
                                pool="cls_prenorm")
    with pytest.raises(ConfigError, match="pool is cls or mean"):
        MAE(prenorm, MAEConfig(decoder_dim=16, decoder_heads=2), 1)


def test_images_of_another_size_fail_naming_the_training_grid() -> None:
    method = _method()  # 16 x 16 pixels: a 4 x 4 grid of 4-pixel patches
    for height, width in [(8, 16), (16, 8)]:
        with pytest.raises(ValueError, match=rf"the \(4, 4\) patch grid .* got images of {height}x{width} "):
            method.reconstruct(torch.randn(2, 1, height, width))


def _mae_sincos(dim: int, size: int) -> torch.Tensor:
    """facebookresearch/mae util/pos_embed.py get_2d_sincos_pos_embed, written out in numpy: (size^2, dim), the
    first half of the channels [sin, cos](column * omega), the second half the row, omega_i = 10000^(-i / (dim / 4))."""
    columns, rows = np.meshgrid(np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64))

    def one_axis(pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(dim // 4) / (dim / 4))
        angles = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return torch.from_numpy(np.concatenate([one_axis(columns), one_axis(rows)], axis=1)).float()


def test_decoder_is_maes_layers_and_its_fixed_positions_are_not_saved() -> None:
    """models_mae.py's decoder: decoder_embed, mask_token, Blocks with qkv_bias=True and LayerNorm(eps=1e-6),
    decoder_norm, decoder_pred. The sin-cos positions are fixed: rebuilt at construction, not saved (as the
    encoder's own sin-cos positions)."""
    decoder = _method(decoder_depth=2).decoder
    d, hidden, pixels = 16, 64, 16  # decoder width, mlp_ratio 4, 4 x 4 x 1 pixels per patch
    block = {"norm1.weight": (d,), "norm1.bias": (d,), "attn.qkv.weight": (3 * d, d), "attn.qkv.bias": (3 * d,),
             "attn.proj.weight": (d, d), "attn.proj.bias": (d,), "norm2.weight": (d,), "norm2.bias": (d,),
             "mlp.fc1.weight": (hidden, d), "mlp.fc1.bias": (hidden,), "mlp.fc2.weight": (d, hidden),
             "mlp.fc2.bias": (d,)}
    expected = {"embed.weight": (d, 16), "embed.bias": (d,), "mask_token": (d,),
                **{f"blocks.{i}.{name}": shape for i in range(2) for name, shape in block.items()},
                "norm.weight": (d,), "norm.bias": (d,), "head.weight": (pixels, d), "head.bias": (pixels,)}
    assert {name: tuple(t.shape) for name, t in decoder.state_dict().items()} == expected
    assert [m.eps for m in decoder.modules() if isinstance(m, nn.LayerNorm)] == [1e-6] * 5
    torch.testing.assert_close(decoder.pos_embed[0], _mae_sincos(16, 4))


def test_mask_token_starts_normal_with_std_0_02() -> None:
    vit = VisionTransformer(img_size=16, patch_size=4, in_channels=1, embed_dim=16, depth=1, num_heads=2)
    torch.manual_seed(0)
    token = MAEDecoder(vit, MAEConfig(decoder_dim=512, decoder_depth=1, decoder_heads=1)).mask_token.detach()
    assert 0.017 < token.std().item() < 0.023 and abs(token.mean().item()) < 0.004  # 512 draws: std error 0.0006


@pytest.mark.parametrize("cls_token", [True, False])
def test_decoder_fills_mask_tokens_adds_the_fixed_positions_and_predicts_every_patch(cls_token: bool) -> None:
    """MAE's forward_decoder by hand: embed, mask token at the hidden positions, + sin-cos (the [CLS] gets none:
    MAE's zero row), blocks, norm, head, [CLS] row dropped."""
    method = _method({"cls_token": cls_token})
    decoder, b, k = method.decoder, 2, 4
    torch.manual_seed(1)
    latent = torch.randn(b, int(cls_token) + k, 16)
    keep = torch.stack([torch.randperm(16)[:k] for _ in range(b)])
    with torch.no_grad():
        out = decoder(latent, keep, has_cls=cls_token)
        x = latent @ decoder.embed.weight.T + decoder.embed.bias
        cls, kept = x[:, :int(cls_token)], x[:, int(cls_token):]
        tokens = decoder.mask_token.expand(b, 16, 16).clone()
        for i in range(b):
            for j in range(k):
                tokens[i, keep[i, j]] = kept[i, j]
        tokens = torch.cat([cls, tokens + _mae_sincos(16, 4)], dim=1)
        for block in decoder.blocks:
            tokens = block(tokens)
        expected = decoder.head(decoder.norm(tokens))[:, int(cls_token):]
    assert out.shape == (b, 16, 16)
    torch.testing.assert_close(out, expected)
    assert method.reconstruct(torch.randn(b, 1, 16, 16))[0].shape == (b, 16, 16)


def test_norm_pix_loss_false_regresses_the_raw_pixels() -> None:
    method = _method(norm_pix_loss=False)
    x = torch.randn(2, 1, 16, 16) * 3 + 2
    torch.manual_seed(4)
    loss = method([x]).loss
    torch.manual_seed(4)
    prediction, _, masked = method.reconstruct(x)
    raw = x.reshape(2, 1, 4, 4, 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 16)  # 4x4 patches, row-major
    expected = ((prediction - raw) ** 2).mean(-1)[masked].mean()
    torch.testing.assert_close(loss, expected)
    assert abs(expected - _masked_mse_by_hand(prediction, x, masked)) > 0.1  # normalised targets would differ


def test_decoder_tokens_keep_the_autocast_dtype() -> None:
    """Under bfloat16 autocast the fixed positions are cast to the tokens' dtype, as in the encoder: the decoder's
    residual stream stays bfloat16 instead of being promoted to float32."""
    method = _method()
    seen = []
    method.decoder.blocks[0].register_forward_hook(lambda mod, inp, out: seen.append(inp[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        method([torch.randn(2, 1, 16, 16)])
    assert seen == [torch.bfloat16]
