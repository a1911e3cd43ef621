"""ResNet backbones in plain torch (He et al., 2016, "Deep Residual Learning").

Two stems: the ImageNet stem (7x7 conv stride 2 + 3x3 max-pool) and the small "CIFAR" stem
(3x3 conv stride 1, no max-pool) that the multi-view small-projector paper's code uses for
32x32 images. The stride sits in the 3x3 conv of the bottleneck ("ResNet v1.5"), as in the
torchvision weights every seed paper starts from. ``forward`` returns the global-average-pooled
feature; ``forward_feature_map`` returns the last stage's spatial map (MAST's GeM heads).
"""
from __future__ import annotations

from typing import Annotated, Literal

from torch import Tensor, nn

from selfsup.config import Depth, NonEmpty, Width, check_arguments

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50"]


def _conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or 1x1 projection) shortcut; ResNet-18/34."""

    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = _conv3x3(in_channels, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4); ResNet-50/101/152."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = _conv1x1(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, out_channels)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    @property
    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(_conv1x1(in_channels, out_channels, stride), nn.BatchNorm2d(out_channels))


_BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {
    "basic": BasicBlock,
    "bottleneck": Bottleneck,
}


class ResNet(nn.Module):
    """ResNet trunk without the classifier.

    Args:
        block: ``"basic"`` (ResNet-18/34) or ``"bottleneck"`` (ResNet-50 and deeper).
        layers: number of blocks in each stage, e.g. ``[2, 2, 2, 2]``; fewer stages (e.g. ``[1, 1]``)
            give shallow models for tiny images.
        in_channels: image channels (1 for Fashion-MNIST, 3 for RGB).
        width: channels of the stem and of stage 1; stage s has ``width * 2**s`` (times 4 for
            bottlenecks). 64 is the standard network; 16 or 32 give tiny CPU models.
        small_stem: 3x3 stride-1 conv and no max-pool (CIFAR-style, for 32x32-ish inputs)
            instead of the 7x7 stride-2 conv + max-pool ImageNet stem.
        stem_stride: stride of the small stem's conv (2 halves the resolution: 4x fewer FLOPs).
        stage_widths: each stage's width, one per stage, instead of ``width * 2**s``; e.g.
            ``[16, 32, 64, 256]`` widens only the last, cheapest stage for a 256-d feature.
        zero_init_residual: start every residual branch at zero by zeroing the gamma of its
            last BatchNorm (Goyal et al., 2017), so each block begins as the identity.

    Attributes:
        num_features: width of the pooled feature (512 for ResNet-18, 2048 for ResNet-50).
    """

    def __init__(
        self,
        block: Literal["basic", "bottleneck"],
        layers: Annotated[list[Depth], NonEmpty(example="[2, 2, 2, 2]")],
        in_channels: Width = 3,
        width: Width = 64,
        small_stem: bool = False,
        stem_stride: Literal[1, 2] = 1,
        stage_widths: list[Width] | None = None,
        zero_init_residual: bool = True,
    ) -> None:
        super().__init__()
        check_arguments(ResNet, dict(block=block, layers=layers, in_channels=in_channels, width=width,
                                     small_stem=small_stem, stem_stride=stem_stride, stage_widths=stage_widths,
                                     zero_init_residual=zero_init_residual), "")
        if stage_widths is None:
            stage_widths = [width * 2**stage for stage in range(len(layers))]
        if len(stage_widths) != len(layers):
            raise ValueError(
                f"stage_widths must give one positive width per stage ({len(layers)} stages), "
                f"got {stage_widths!r}; e.g. [16, 32, 64, 256] for layers [1, 1, 1, 1]"
            )
        if stem_stride != 1 and not small_stem:
            raise ValueError(f"stem_stride {stem_stride} needs small_stem=True (the ImageNet stem has its own strides)")
        block_cls = _BLOCKS[block]
        self.small_stem = small_stem
        if small_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 3, stride=stem_stride, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        self.num_stages = len(layers)
        channels = width
        for stage, (num_blocks, stage_width) in enumerate(zip(layers, stage_widths)):
            blocks: list[nn.Module] = []
            for i in range(int(num_blocks)):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(block_cls(channels, stage_width, stride))
                channels = stage_width * block_cls.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*blocks))
        self.num_features = channels
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn.weight)

    def forward_feature_map(self, x: Tensor) -> Tensor:
        """Last-stage feature map ``(B, num_features, h, w)`` before global pooling."""
        if x.ndim != 4:
            raise ValueError(f"expected images of shape (B, C, H, W), got shape {tuple(x.shape)}")
        expected = self.stem[0].in_channels
        if x.shape[1] != expected:
            raise ValueError(
                f"expected {expected} input channels, got {x.shape[1]}; build the ResNet with "
                f"in_channels={x.shape[1]} or convert the images"
            )
        x = self.stem(x)
        for stage in range(self.num_stages):
            x = getattr(self, f"layer{stage + 1}")(x)
        return x

    def forward(self, x: Tensor) -> Tensor:
        """Global-average-pooled feature ``(B, num_features)``."""
        return self.forward_feature_map(x).mean(dim=(2, 3))


def resnet18(**kwargs: object) -> ResNet:
    """ResNet-18: basic blocks [2, 2, 2, 2]; 512-d feature (11.18 M parameters without fc)."""
    return ResNet("basic", [2, 2, 2, 2], **kwargs)  # type: ignore[arg-type]


def resnet50(**kwargs: object) -> ResNet:
    """ResNet-50: bottleneck blocks [3, 4, 6, 3]; 2048-d feature (23.51 M without fc)."""
    return ResNet("bottleneck", [3, 4, 6, 3], **kwargs)  # type: ignore[arg-type]
