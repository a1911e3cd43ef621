"""``small_stem: auto`` and ``patch_size: auto``: the stem and the patch follow ``data.image_size`` (the photo presets),
resolved when the run builds its backbone and recorded resolved in ``backbone.json``."""

from __future__ import annotations

import pytest
import torch

from selfsup.config import ConfigError
from selfsup.load import load_config
from selfsup.methods.assemble import backbone_params
from selfsup.models import build_backbone, check_backbone_params, resolve_auto


@pytest.mark.parametrize("size, stem", [(28, {"small_stem": True, "stem_stride": 1}),
                                        (48, {"small_stem": True, "stem_stride": 1}),
                                        (64, {"small_stem": True, "stem_stride": 2}),
                                        (96, {"small_stem": True, "stem_stride": 2}),
                                        (128, {"small_stem": False}), (224, {"small_stem": False})])
def test_a_resnet_stem_follows_the_image_size(size, stem):
    assert resolve_auto("resnet18", {"small_stem": "auto"}, size) == stem
    model = build_backbone("resnet18", **resolve_auto("resnet18", {"small_stem": "auto"}, size))
    first_map = model.stem(torch.zeros(1, 3, size, size)).shape[-1]
    assert size // 4 <= first_map <= 56  # the first feature map stays between a quarter of the image and 56 px


@pytest.mark.parametrize("size, patch", [(28, 4), (32, 4), (64, 8), (96, 12), (100, 10), (128, 16), (224, 16)])
def test_a_vit_patch_follows_the_image_size(size, patch):
    params = resolve_auto("vit_small", {"patch_size": "auto"}, size)
    assert params == {"patch_size": patch}
    assert size % patch == 0


def test_explicit_values_and_other_backbones_are_left_alone():
    assert resolve_auto("resnet18", {"small_stem": True, "stem_stride": 2}, 224) == {"small_stem": True,
                                                                                     "stem_stride": 2}
    assert resolve_auto("resnet", {"small_stem": "auto", "stem_stride": 1}, 64)["stem_stride"] == 1
    assert resolve_auto("vit_laptop", {"patch_size": 2}, 224) == {"patch_size": 2}


def test_auto_is_checked_before_the_data_and_only_where_it_is_allowed():
    check_backbone_params("resnet18", {"small_stem": "auto"})
    check_backbone_params("vit_laptop", {"patch_size": "auto"})
    with pytest.raises(ConfigError, match="model.params.stem_stride"):
        check_backbone_params("resnet18", {"small_stem": "auto", "stem_stride": 3})
    with pytest.raises(ConfigError, match="model.params.embed_dim"):
        check_backbone_params("vit_laptop", {"patch_size": "auto", "embed_dim": "auto"})


def test_a_run_records_the_resolved_values():
    cfg = load_config(overrides=["model.backbone=resnet18", "model.params={small_stem: auto}"])
    assert backbone_params(cfg, 3, 64) == {"small_stem": True, "stem_stride": 2, "in_channels": 3}
    cfg = load_config(overrides=["model.backbone=vit_laptop", "model.params={patch_size: auto}"])
    assert backbone_params(cfg, 3, 64)["patch_size"] == 8
