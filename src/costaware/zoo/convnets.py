"""Convolutional networks: VGG, ResNet and its grouped variants (ResNeXt, RegNet),
GoogLeNet and Inception-v3 (multi-branch blocks), DenseNet, ConvNeXt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from costaware.zoo._layers import (
    _conv_bn,
    _init_convnet,
    _layer_scale,
    _on_meta,
    _relu,
    _SqueezeExcite,
)

_VGG_CFGS: dict[int, tuple[int | str, ...]] = {
    11: (1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"),
    13: (1, 1, "M", 2, 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"),
    16: (1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"),
    19: (1, 1, "M", 2, 2, "M", 4, 4, 4, 4, "M", 8, 8, 8, 8, "M", 8, 8, 8, 8, "M"),
}


class VGG(nn.Module):
    """VGG (Simonyan & Zisserman, 2014): 3x3 conv stacks, max pools, 3-layer classifier."""

    def __init__(
        self, depth: int, width: int, classes: int, batch_norm: bool, image_size: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for v in _VGG_CFGS[depth]:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            assert isinstance(v, int)
            cout = v * width
            layers.append(nn.Conv2d(cin, cout, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(cout))
            layers.append(nn.ReLU(inplace=True))
            cin = cout
        self.features = nn.Sequential(*layers)
        pool = max(1, image_size // 32)
        self.avgpool = nn.AdaptiveAvgPool2d((pool, pool))
        hidden = 64 * width
        self.classifier = nn.Sequential(
            nn.Linear(cin * pool * pool, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(hidden, classes),
        )
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = torch.flatten(self.avgpool(x), 1)
        x = self.classifier(x)
        return x


def vgg(
    depth: int = 16,
    width: int = 64,
    classes: int = 1000,
    batch_norm: bool = True,
    image_size: int = 224,
) -> nn.Module:
    """VGG-11/13/16/19 with ``width`` base channels (64 = original).

    The classifier's hidden size is ``64 * width`` (4096 at width 64).  An adaptive
    average pool to ``max(1, image_size // 32)`` squared feeds the classifier, so the
    model accepts any input size (7x7 at 224 as in torchvision, 1x1 for CIFAR).
    """
    if depth not in _VGG_CFGS:
        raise ValueError(f"vgg depth must be one of {sorted(_VGG_CFGS)}, got {depth}")
    return VGG(depth, width, classes, batch_norm, image_size)


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out: Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        out = self.relu(out)
        return out


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out: Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        out = self.relu(out)
        return out


_RESNET_LAYERS: dict[int, tuple[type[_BasicBlock] | type[_Bottleneck], tuple[int, ...]]] = {
    18: (_BasicBlock, (2, 2, 2, 2)),
    34: (_BasicBlock, (3, 4, 6, 3)),
    50: (_Bottleneck, (3, 4, 6, 3)),
    101: (_Bottleneck, (3, 4, 23, 3)),
    152: (_Bottleneck, (3, 8, 36, 3)),
}


class ResNet(nn.Module):
    """ResNet v1.5 (He et al., 2015; stride on the 3x3 conv as in torchvision)."""

    def __init__(self, depth: int, width: int, classes: int) -> None:
        super().__init__()
        block, counts = _RESNET_LAYERS[depth]
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = width
        stages: list[nn.Sequential] = []
        for i, n in enumerate(counts):
            planes = width * 2**i
            stride = 1 if i == 0 else 2
            blocks: list[nn.Module] = []
            for j in range(n):
                s = stride if j == 0 else 1
                downsample: nn.Module | None = None
                if s != 1 or inplanes != planes * block.expansion:
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes * block.expansion, 1, s, bias=False),
                        nn.BatchNorm2d(planes * block.expansion),
                    )
                blocks.append(block(inplanes, planes, s, downsample))
                inplanes = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, classes)
        _init_convnet(self)
        if not _on_meta(self):
            bound = 1.0 / math.sqrt(inplanes)
            nn.init.uniform_(self.fc.weight, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        x = self.fc(x)
        return x


def resnet(depth: int = 50, width: int = 64, classes: int = 1000) -> nn.Module:
    """ResNet-18/34 (BasicBlock) or -50/101/152 (Bottleneck); ``width`` = stem channels."""
    if depth not in _RESNET_LAYERS:
        raise ValueError(f"resnet depth must be one of {sorted(_RESNET_LAYERS)}, got {depth}")
    return ResNet(depth, width, classes)


def _basic_conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return _conv_bn(cin, cout, kernel, stride, act=_relu, eps=0.001)


class _Inception(nn.Module):
    def __init__(
        self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool_proj: int
    ) -> None:
        super().__init__()
        self.branch1 = _basic_conv(cin, c1, 1)
        self.branch2 = nn.Sequential(_basic_conv(cin, c3r, 1), _basic_conv(c3r, c3, 3))
        self.branch3 = nn.Sequential(_basic_conv(cin, c5r, 1), _basic_conv(c5r, c5, 5))
        self.branch4 = nn.Sequential(
            nn.MaxPool2d(3, 1, 1, ceil_mode=True), _basic_conv(cin, pool_proj, 1)
        )
        self.out_channels = c1 + c3 + c5 + pool_proj

    def forward(self, x: Tensor) -> Tensor:
        branches = [self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)]
        return torch.cat(branches, 1)


_INCEPTION_CFG: tuple[tuple[int, int, int, int, int, int] | str, ...] = (
    (64, 96, 128, 16, 32, 32),  # 3a
    (128, 128, 192, 32, 96, 64),  # 3b
    "M",
    (192, 96, 208, 16, 48, 64),  # 4a
    (160, 112, 224, 24, 64, 64),  # 4b
    (128, 128, 256, 24, 64, 64),  # 4c
    (112, 144, 288, 32, 64, 64),  # 4d
    (256, 160, 320, 32, 128, 128),  # 4e
    "M2",
    (256, 160, 320, 32, 128, 128),  # 5a
    (384, 192, 384, 48, 128, 128),  # 5b
)


class GoogLeNet(nn.Module):
    """GoogLeNet / Inception v1 (Szegedy et al., 2014) with BN, without auxiliary heads."""

    def __init__(self, classes: int, width: int) -> None:
        super().__init__()

        def s(c: int) -> int:
            return max(1, round(c * width / 64))

        layers: list[nn.Module] = [
            _basic_conv(3, s(64), 7, 2),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            _basic_conv(s(64), s(64), 1),
            _basic_conv(s(64), s(192), 3),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        ]
        cin = s(192)
        for cfg in _INCEPTION_CFG:
            if cfg == "M":
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
            elif cfg == "M2":
                layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
            else:
                assert not isinstance(cfg, str)
                block = _Inception(cin, *(s(c) for c in cfg))
                layers.append(block)
                cin = block.out_channels
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(cin, classes)
        for m in () if _on_meta(self) else self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, 0.0, 0.01)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        x = self.fc(self.dropout(x))
        return x


def googlenet(classes: int = 1000, width: int = 64) -> nn.Module:
    """GoogLeNet with all channel counts scaled by ``width / 64``.

    Follows the paper (5x5 convs in the third branch; torchvision uses 3x3 there) with
    torchvision's batch-normalised convolutions and no auxiliary classifiers.
    """
    return GoogLeNet(classes, width)


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth_rate, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, 1, 1, bias=False)

    def forward(self, features: list[Tensor]) -> Tensor:
        x: Tensor = torch.cat(features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        x = self.conv2(self.relu2(self.norm2(x)))
        return x


class _DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        for i in range(layers):
            self[f"denselayer{i + 1}"] = _DenseLayer(cin + i * growth_rate, growth_rate, bn_size)

    def forward(self, x: Tensor) -> Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


_DENSENET_BLOCKS: dict[int, tuple[int, ...]] = {
    121: (6, 12, 24, 16),
    161: (6, 12, 36, 24),
    169: (6, 12, 32, 32),
    201: (6, 12, 48, 32),
}


class DenseNet(nn.Module):
    """DenseNet-BC (Huang et al., 2016): dense blocks with bottlenecks and transitions."""

    def __init__(
        self, block_config: Sequence[int], growth_rate: int, init_features: int, classes: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, init_features, 7, 2, 3, bias=False),
            nn.BatchNorm2d(init_features),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        ]
        c = init_features
        for i, n in enumerate(block_config):
            layers.append(_DenseBlock(n, c, growth_rate, bn_size=4))
            c += n * growth_rate
            if i != len(block_config) - 1:
                layers += [
                    nn.BatchNorm2d(c),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(c, c // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2),
                ]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)
        _init_convnet(self)
        if not _on_meta(self):
            nn.init.kaiming_uniform_(self.classifier.weight, a=math.sqrt(5))

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(F.adaptive_avg_pool2d(self.features(x), (1, 1)), 1)
        x = self.classifier(x)
        return x


def densenet(
    depth: int = 121,
    growth_rate: int = 32,
    classes: int = 1000,
    block_config: Sequence[int] | None = None,
) -> nn.Module:
    """DenseNet-121/161/169/201 (DenseNet-161 is usually built with growth_rate=48).

    ``block_config`` overrides the per-block layer counts implied by ``depth``; the stem
    has ``2 * growth_rate`` channels, the bottleneck ``4 * growth_rate``, compression 0.5.
    """
    if block_config is None:
        if depth not in _DENSENET_BLOCKS:
            raise ValueError(f"densenet depth must be one of {sorted(_DENSENET_BLOCKS)}")
        block_config = _DENSENET_BLOCKS[depth]
    return DenseNet(tuple(block_config), growth_rate, 2 * growth_rate, classes)


class _LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an ``(N, C, H, W)`` map, as ConvNeXt normalises."""

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        )
        return y.permute(0, 3, 1, 2)


class _ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 -> LayerNorm -> Linear 4x -> GELU -> Linear, layer-scaled residual."""

    def __init__(self, dim: int, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = _layer_scale(dim, layer_scale)

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt (Liu et al., 2022): a 4x4 patchify stem, four stages of depthwise 7x7
    blocks with LayerNorm and inverted MLPs, 2x2 strided downsampling between them."""

    def __init__(self, depths: Sequence[int], dims: Sequence[int], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), _LayerNorm2d(dims[0], eps=1e-6)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i:
                layers += [_LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [_ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x).mean((2, 3))
        x = self.head(self.norm(x))
        return x


def convnext(
    depths: Sequence[int] = (3, 3, 9, 3),
    dims: Sequence[int] = (96, 192, 384, 768),
    classes: int = 1000,
) -> nn.Module:
    """ConvNeXt; the defaults are ConvNeXt-T (28.6M parameters). Inputs of at least 32 px."""
    if len(depths) != len(dims) or not depths:
        raise ValueError(f"convnext needs one depth per stage width, got {depths=} {dims=}")
    return ConvNeXt(tuple(depths), tuple(dims), classes)


def _cbr(cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1) -> nn.Sequential:
    """Conv (same padding, also for 1xn and nx1 kernels) -> BatchNorm -> ReLU."""
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    pad = (k[0] // 2, k[1] // 2)
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, pad, bias=False),
        nn.BatchNorm2d(cout, eps=0.001),
        nn.ReLU(inplace=True),
    )


class _InceptionA(nn.Module):
    """Inception-v3 block A: 1x1, 1x1-5x5, 1x1-3x3-3x3 and pool-1x1 branches."""

    def __init__(self, cin: int, s: Callable[[int], int], pool: int) -> None:
        super().__init__()
        self.b1 = _cbr(cin, s(64), 1)
        self.b5 = nn.Sequential(_cbr(cin, s(48), 1), _cbr(s(48), s(64), 5))
        self.b3 = nn.Sequential(_cbr(cin, s(64), 1), _cbr(s(64), s(96), 3), _cbr(s(96), s(96), 3))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), _cbr(cin, s(pool), 1))
        self.out_channels = s(64) + s(64) + s(96) + s(pool)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(x)], 1)


class _InceptionB(nn.Module):
    """Inception-v3 grid reduction: a strided 3x3, a 1x1-3x3-strided 3x3, a max pool."""

    def __init__(self, cin: int, s: Callable[[int], int]) -> None:
        super().__init__()
        self.b3 = _cbr(cin, s(384), 3, 2)
        self.b3d = nn.Sequential(
            _cbr(cin, s(64), 1), _cbr(s(64), s(96), 3), _cbr(s(96), s(96), 3, 2)
        )
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.out_channels = s(384) + s(96) + cin

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b3(x), self.b3d(x), self.pool(x)], 1)


class _InceptionC(nn.Module):
    """Inception-v3 block C: the factorised 7x7 branches (1x7 and 7x1 convolutions)."""

    def __init__(self, cin: int, s: Callable[[int], int], c7: int) -> None:
        super().__init__()
        c7 = s(c7)
        self.b1 = _cbr(cin, s(192), 1)
        self.b7 = nn.Sequential(_cbr(cin, c7, 1), _cbr(c7, c7, (1, 7)), _cbr(c7, s(192), (7, 1)))
        self.b7d = nn.Sequential(
            _cbr(cin, c7, 1),
            _cbr(c7, c7, (7, 1)),
            _cbr(c7, c7, (1, 7)),
            _cbr(c7, c7, (7, 1)),
            _cbr(c7, s(192), (1, 7)),
        )
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), _cbr(cin, s(192), 1))
        self.out_channels = 4 * s(192)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b7d(x), self.bp(x)], 1)


class InceptionV3(nn.Module):
    """An Inception-v3-style net (Szegedy et al., 2016): its stem, three A blocks, a grid
    reduction, ``blocks_c`` factorised C blocks, global pooling. Padded throughout, so
    small inputs keep a map (a 32 px input reaches the C blocks at 2x2)."""

    def __init__(self, width: float, blocks_c: int, classes: int, dropout: float) -> None:
        super().__init__()

        def s(c: int) -> int:
            return max(4, round(c * width))

        layers: list[nn.Module] = [
            _cbr(3, s(32), 3, 2),
            _cbr(s(32), s(32), 3),
            _cbr(s(32), s(64), 3),
            nn.MaxPool2d(3, 2, 1),
            _cbr(s(64), s(80), 1),
            _cbr(s(80), s(192), 3),
            nn.MaxPool2d(3, 2, 1),
        ]
        cin = s(192)
        for pool in (32, 64, 64):
            a = _InceptionA(cin, s, pool)
            layers.append(a)
            cin = a.out_channels
        b = _InceptionB(cin, s)
        layers.append(b)
        cin = b.out_channels
        for i in range(blocks_c):
            c = _InceptionC(cin, s, (128, 160, 160, 192)[min(i, 3)])
            layers.append(c)
            cin = c.out_channels
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(cin, classes)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x).mean((2, 3))
        x = self.fc(self.dropout(x))
        return x


def inception(
    width: float = 1.0, blocks_c: int = 4, classes: int = 1000, dropout: float = 0.5
) -> nn.Module:
    """Inception-v3-style classifier, channel counts scaled by ``width``."""
    if width <= 0 or blocks_c < 0:
        raise ValueError(f"inception needs width > 0 and blocks_c >= 0, got {width=} {blocks_c=}")
    return InceptionV3(width, blocks_c, classes, dropout)


class _XBlock(nn.Module):
    """A grouped bottleneck (ResNeXt; RegNet's X block, Y with squeeze-and-excitation):
    1x1 -> grouped 3x3 (the stride) -> [SE] -> 1x1, projected shortcut where needed."""

    def __init__(
        self, cin: int, cout: int, stride: int, width: int, groups: int, se_ratio: float
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            _conv_bn(cin, width, 1, act=_relu),
            _conv_bn(width, width, 3, stride, groups=groups, act=_relu),
        ]
        if se_ratio > 0:
            layers.append(_SqueezeExcite(width, max(1, int(cin * se_ratio)), _relu))
        layers.append(_conv_bn(width, cout, 1))
        self.block = nn.Sequential(*layers)
        self.shortcut = (
            _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.block(x) + self.shortcut(x))  # type: ignore[no-any-return]


class GroupedResNet(nn.Module):
    """A stem, stages of :class:`_XBlock` (the first of each strided but the first
    stage's), global pooling: ResNeXt and RegNet are both this net."""

    def __init__(
        self,
        stem: int,
        stages: Sequence[tuple[int, int, int, int]],
        se_ratio: float,
        classes: int,
        deep_stem: bool,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, stem, 7 if deep_stem else 3, 2, act=_relu)]
        if deep_stem:
            layers.append(nn.MaxPool2d(3, 2, 1))
        cin = stem
        for i, (depth, cout, width, groups) in enumerate(stages):
            for j in range(depth):
                stride = 2 if j == 0 and (i > 0 or not deep_stem) else 1
                layers.append(_XBlock(cin, cout, stride, width, groups, se_ratio))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.fc(self.features(x).mean((2, 3)))
        return x


def resnext(
    depth: int = 50, groups: int = 32, width_per_group: int = 4, classes: int = 1000, base: int = 64
) -> nn.Module:
    """ResNeXt-50/101 (32x4d by default: 25.0M parameters); wide ResNets are ``groups=1``
    with a large ``width_per_group`` (Wide ResNet-50-2: ``groups=1, width_per_group=128``)."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
    if depth not in blocks:
        raise ValueError(f"resnext depth must be one of {sorted(blocks)}, got {depth}")
    stages = [
        (n, base * 4 << i, groups * width_per_group << i, groups)
        for i, n in enumerate(blocks[depth])
    ]
    return GroupedResNet(base, stages, 0.0, classes, deep_stem=True)


def regnet(
    depths: Sequence[int] = (1, 3, 7, 5),
    widths: Sequence[int] = (64, 128, 288, 672),
    group_width: int = 16,
    se_ratio: float = 0.0,
    classes: int = 1000,
) -> nn.Module:
    """RegNetX (``se_ratio=0``) or RegNetY (``se_ratio=0.25``) with bottleneck ratio 1;
    the defaults are RegNetX-800MF's stages. Each width must be a multiple of the group
    width (or smaller than it: one group)."""
    if len(depths) != len(widths) or not depths:
        raise ValueError(f"regnet needs one depth per stage width, got {depths=} {widths=}")
    stages = [(d, w, w, max(1, w // group_width)) for d, w in zip(depths, widths)]
    for _, w, _, g in stages:
        if w % g:
            raise ValueError(f"regnet width {w} does not split into groups of {group_width}")
    return GroupedResNet(32, stages, se_ratio, classes, deep_stem=False)
