"""extract_features: eval mode + inference, batched, /255 then transform, modes restored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from selfsup.eval.features import as_feature_tensor, as_label_tensor, extract_features, raw_pixel_features


def _images(n: int = 7) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 1, 2, 3), generator=gen, dtype=torch.uint8)


def _model() -> nn.Module:
    torch.manual_seed(0)
    # BatchNorm and Dropout make train-mode outputs differ from eval-mode outputs.
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 3))


def test_matches_direct_eval_forward_and_restores_train_mode() -> None:
    model, images = _model(), _images()
    model.train()
    model[2].eval()  # a mixed-mode model (frozen BN) must come back exactly as it was
    before = {name: m.training for name, m in model.named_modules()}
    feats = extract_features(model, images, batch_size=3)
    assert {name: m.training for name, m in model.named_modules()} == before
    model.eval()
    with torch.no_grad():
        expected = model(images.float() / 255.0)
    assert feats.dtype == torch.float32 and feats.device.type == "cpu"
    assert feats.shape == (7, 3)
    torch.testing.assert_close(feats, expected)


def test_transform_is_applied_after_scaling() -> None:
    model, images = _model().eval(), _images()
    feats = extract_features(model, images, transform=lambda x: (x - 0.5) / 0.25)
    with torch.no_grad():
        expected = model((images.float() / 255.0 - 0.5) / 0.25)
    torch.testing.assert_close(feats, expected)


def test_batch_size_does_not_change_result_and_progress_runs() -> None:
    model, images = _model(), _images()
    torch.testing.assert_close(
        extract_features(model, images, batch_size=1, progress=True), extract_features(model, images, batch_size=256)
    )


def test_mode_restored_after_model_error() -> None:
    model = nn.Sequential(nn.Flatten(1), nn.Unflatten(1, (2, 3)))  # returns (B, 2, 3): not a feature vector
    model.train()
    with pytest.raises(ValueError, match="pooled feature"):
        extract_features(model, _images())
    assert all(m.training for m in model.modules())


def test_bad_images_fail_clearly() -> None:
    model = _model()
    with pytest.raises(TypeError, match="uint8"):
        extract_features(model, _images().float())
    with pytest.raises(ValueError, match="grayscale"):
        extract_features(model, _images()[:, 0])
    with pytest.raises(ValueError, match="batch_size"):
        extract_features(model, _images(), batch_size=0)


def test_raw_pixel_features() -> None:
    images = torch.tensor([[[[0, 255], [51, 102]]]], dtype=torch.uint8)  # (1, 1, 2, 2)
    feats = raw_pixel_features(images)
    torch.testing.assert_close(feats, torch.tensor([[0.0, 1.0, 0.2, 0.4]]))


def test_input_checks() -> None:
    torch.testing.assert_close(as_feature_tensor(np.ones((2, 3), dtype=np.float64)), torch.ones(2, 3))
    with pytest.raises(ValueError, match="NaN"):
        as_feature_tensor(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="2-D"):
        as_feature_tensor(torch.ones(3))
    assert as_label_tensor(np.array([0.0, 2.0]), 2).tolist() == [0, 2]
    with pytest.raises(ValueError, match="one label per feature row"):
        as_label_tensor([0, 1, 2], 2)
    with pytest.raises(TypeError, match="integer class indices"):
        as_label_tensor(np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="negative"):
        as_label_tensor([0, -1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_returns_cpu_features() -> None:
    model, images = _model().eval(), _images()
    expected = extract_features(model, images)
    feats = extract_features(model.cuda(), images)
    assert feats.device.type == "cpu"
    torch.testing.assert_close(feats, expected, atol=1e-5, rtol=1e-4)


def test_view_averaged_features() -> None:
    from selfsup.data.augment import Augment, augment_config
    from selfsup.eval.features import extract_view_averaged_features

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    images = torch.randint(0, 256, (6, 1, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    normalize = lambda x: (x - 0.5) / 0.25  # noqa: E731
    plain = extract_features(model, images, transform=normalize)
    # One view is the clean feature; "none" views (whole image, nothing random) average back to it.
    assert torch.equal(extract_view_averaged_features(model, images, 1, None, transform=normalize), plain)
    still = Augment(augment_config("none", 8, mean=(0.5,), std=(0.25,)))
    torch.testing.assert_close(extract_view_averaged_features(model, images, 4, still, transform=normalize), plain)
    # Random views: the mean of the clean feature and views - 1 seeded augmented passes; caller's RNG untouched.
    crops = Augment(augment_config("minimal", 8, mean=(0.5,), std=(0.25,)))
    state = torch.get_rng_state()
    averaged = extract_view_averaged_features(model, images, 3, crops, seed=5, transform=normalize)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(5)
    expected = (plain + extract_features(model, images, transform=crops) + extract_features(model, images, transform=crops)) / 3
    torch.testing.assert_close(averaged, expected)
    assert (averaged - plain).abs().max() > 1e-3
    with pytest.raises(ValueError, match="positive int"):
        extract_view_averaged_features(model, images, 0, crops)
    with pytest.raises(ValueError, match="augment"):
        extract_view_averaged_features(model, images, 2, None)
