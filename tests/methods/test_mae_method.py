"""MAE: the encoder sees only the kept patches, the decoder predicts every patch, the loss and the picture."""

from __future__ import annotations

import pytest
import torch

from selfsup.config import ConfigError
from selfsup.losses.mae import mae_loss, patchify
from selfsup.methods.mae import MAE, MAEConfig
from selfsup.models.vit import VisionTransformer


def _method(**kwargs) -> MAE:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, in_channels=1, embed_dim=16, depth=2, num_heads=2, pool="mean")
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
    _method().plot(tmp_path, [], torch.randn(4, 1, 16, 16))
    assert (tmp_path / "mae_reconstruction.png").stat().st_size > 1000


def test_bad_settings_name_the_key() -> None:
    for key, value in [("mask_ratio", 1.0), ("decoder_dim", 6), ("decoder_heads", 3), ("eval_pool", "max")]:
        with pytest.raises(ConfigError, match=f"method.{key}"):
            MAEConfig(**{key: value})
    cait = VisionTransformer(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=1, num_heads=2,
                             num_class_attention_blocks=1)
    with pytest.raises(ConfigError, match="needs a ViT backbone without class-attention"):
        MAE(cait, MAEConfig(decoder_dim=16, decoder_heads=2), 1)
