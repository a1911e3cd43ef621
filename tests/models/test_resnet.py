from __future__ import annotations

import pytest
import torch
from torch import nn

from selfsup.models import BACKBONES, ResNet, build_backbone, resnet18, resnet50
from selfsup.models.resnet import BasicBlock, Bottleneck


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet18_and_resnet50_parameter_counts_match_torchvision_without_fc() -> None:
    # torchvision: resnet18 11,689,512 - fc (512*1000+1000) ; resnet50 25,557,032 - (2048*1000+1000)
    with torch.device("meta"):  # shapes only: no memory, no init cost
        r18, r50 = resnet18(), resnet50()
    assert _count(r18) == 11_689_512 - 513_000 == 11_176_512
    assert _count(r50) == 25_557_032 - 2_049_000 == 23_508_032
    assert r18.num_features == 512
    assert r50.num_features == 2048


def test_small_stem_28px_gray_shapes() -> None:
    torch.manual_seed(0)
    model = ResNet("basic", [1, 1, 1, 1], in_channels=1, width=16, small_stem=True)
    x = torch.randn(2, 1, 28, 28)
    fmap = model.forward_feature_map(x)
    assert fmap.shape == (2, 128, 4, 4)  # 28 -> 28 -> 14 -> 7 -> 4
    out = model(x)
    assert out.shape == (2, model.num_features) == (2, 128)
    torch.testing.assert_close(out, fmap.mean(dim=(2, 3)))


def test_small_stem_32px_rgb_bottleneck_shapes() -> None:
    model = ResNet("bottleneck", [1, 1, 1, 1], width=8, small_stem=True)
    assert model.num_features == 8 * 8 * 4
    x = torch.randn(2, 3, 32, 32)
    assert model.forward_feature_map(x).shape == (2, 256, 4, 4)
    assert model(x).shape == (2, 256)


def test_imagenet_stem_64px_downsamples_by_32() -> None:
    model = ResNet("basic", [1, 1, 1, 1], width=16)
    assert isinstance(model.stem[-1], nn.MaxPool2d)
    assert model.stem[0].kernel_size == (7, 7) and model.stem[0].stride == (2, 2)
    x = torch.randn(2, 3, 64, 64)
    assert model.forward_feature_map(x).shape == (2, 128, 2, 2)
    assert model(x).shape == (2, 128)


def test_small_stem_is_3x3_stride_1_without_maxpool() -> None:
    model = resnet18(small_stem=True)
    conv = model.stem[0]
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_zero_init_residual_zeroes_last_bn_of_every_block() -> None:
    for block_kind, block_cls in (("basic", BasicBlock), ("bottleneck", Bottleneck)):
        model = ResNet(block_kind, [1, 2, 1, 1], width=8, small_stem=True)
        blocks = [m for m in model.modules() if isinstance(m, block_cls)]
        assert len(blocks) == 5
        for block in blocks:
            assert torch.all(block.last_bn.weight == 0)
            assert torch.all(block.bn1.weight == 1)
        plain = ResNet(block_kind, [1, 1, 1, 1], width=8, zero_init_residual=False)
        for block in (m for m in plain.modules() if isinstance(m, block_cls)):
            assert torch.all(block.last_bn.weight == 1)


def test_zero_init_residual_makes_identity_blocks_pass_input_through() -> None:
    torch.manual_seed(0)
    block_model = ResNet("basic", [2, 1, 1, 1], width=8, small_stem=True).eval()
    second = block_model.layer1[1]  # identity shortcut
    x = torch.rand(2, 8, 6, 6)  # non-negative: relu(x + 0) == x
    torch.testing.assert_close(second(x), x)


def test_gradients_reach_the_stem() -> None:
    model = ResNet("basic", [1, 1, 1, 1], width=8, small_stem=True, zero_init_residual=False)
    model(torch.randn(4, 3, 16, 16)).pow(2).sum().backward()
    assert model.stem[0].weight.grad is not None
    assert model.stem[0].weight.grad.abs().sum() > 0


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="bad value for block: 'wide'; allowed values: basic, bottleneck"):
        ResNet("wide", [1, 1, 1, 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bad value for layers.1: 0; use an integer in \[1, 1000\]"):
        ResNet("basic", [1, 0, 1])
    with pytest.raises(ValueError, match="bad value for layers: \\[\\]; use a list of at least one element"):
        ResNet("basic", [])
    with pytest.raises(ValueError, match="stem_stride 2 needs small_stem=True"):
        ResNet("basic", [1], stem_stride=2)
    with pytest.raises(ValueError, match="bad value for stem_stride: True; allowed values: 1, 2"):
        ResNet("basic", [1], small_stem=True, stem_stride=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad value for small_stem: 'abc'; use true or false"):
        ResNet("basic", [1], small_stem="abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bad value for width: 1000000000000; use an integer in \[1, 1048576\]"):
        ResNet("basic", [1], width=10**12)
    model = ResNet("basic", [1, 1, 1, 1], in_channels=1, width=8, small_stem=True)
    with pytest.raises(ValueError, match="in_channels=3"):
        model(torch.randn(1, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model(torch.randn(1, 16, 16))


def test_build_backbone_resnet_presets_and_custom() -> None:
    model = build_backbone("resnet18", small_stem=True, in_channels=1)
    assert isinstance(model, ResNet) and model.num_features == 512 and model.small_stem
    custom = build_backbone("resnet_custom", block="basic", layers=[1, 1, 1, 1], width=4)
    assert custom.num_features == 32
    assert custom(torch.randn(2, 3, 32, 32)).shape == (2, 32)
    assert BACKBONES["resnet50"] is resnet50
    with pytest.raises(ValueError, match="resnet18"):
        build_backbone("resnet34")


def test_fewer_stages_and_strided_small_stem() -> None:
    two = ResNet("basic", [1, 1], in_channels=1, width=8, small_stem=True)
    assert two.num_features == 16
    assert two.forward_feature_map(torch.randn(2, 1, 8, 8)).shape == (2, 16, 4, 4)
    strided = ResNet("basic", [1, 1, 1], in_channels=1, width=8, small_stem=True, stem_stride=2)
    assert strided.forward_feature_map(torch.randn(2, 1, 28, 28)).shape == (2, 32, 4, 4)


def test_stage_widths_set_each_stage_and_the_feature_width() -> None:
    model = ResNet("basic", [1, 1, 1, 1], in_channels=1, width=16, small_stem=True, stage_widths=[16, 32, 64, 256])
    assert model.num_features == 256
    assert [getattr(model, f"layer{s}")[0].conv2.out_channels for s in (1, 2, 3, 4)] == [16, 32, 64, 256]
    assert model.forward_feature_map(torch.randn(2, 1, 28, 28)).shape == (2, 256, 4, 4)
    default = ResNet("basic", [1, 1, 1, 1], in_channels=1, width=16, small_stem=True)
    explicit = ResNet("basic", [1, 1, 1, 1], in_channels=1, width=16, small_stem=True, stage_widths=[16, 32, 64, 128])
    assert [p.shape for p in default.parameters()] == [p.shape for p in explicit.parameters()]
    with pytest.raises(ValueError, match="one positive width per stage"):
        ResNet("basic", [1, 1, 1, 1], stage_widths=[16, 32, 64])
    with pytest.raises(ValueError, match=r"bad value for stage_widths.1: 0; use an integer in \[1, "):
        ResNet("basic", [1, 1], stage_widths=[16, 0])
