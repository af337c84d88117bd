"""A zoo of real, varied architectures written in plain PyTorch.

Every family is a *factory*: a function with keyword hyperparameters (and sensible
defaults) that returns an ``nn.Module``.  The corpus is what costaware traces to learn
how peak memory and iteration time depend on the architecture, so the factories obey
two rules:

* construction only allocates parameters through standard ``nn`` layers and
  ``nn.init`` (it works under ``with torch.device("meta"):`` and under
  ``FakeTensorMode``) and never computes with tensor values;
* ``forward`` is traceable with fake tensors: no ``.item()``, no ``nonzero``, no
  boolean-mask indexing and no Python branching on tensor values.

At their reference widths the image models reproduce the torchvision topologies
(and parameter counts) and the language models those of GPT-2 and BERT; every family
scales down to a toy that runs on a CPU in milliseconds.  ``random_dag`` generates
random convolutional cells and random transformer stacks from a seed.

``entries()`` lists a fixed set of representative configurations as ``ZooEntry``
records.  The output of an entry's model is determined by its ``input`` kind:

* ``"image"`` and ``"vector"``: ``(N, classes)`` logits;
* ``"tokens"``: ``(N, T, classes)`` next-token / masked-token logits (``classes`` is
  the vocabulary size);
* ``"segmentation"``: ``(N, classes, H, W)`` per-pixel logits.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "BROAD_FAMILIES",
    "FAMILIES",
    "ZooEntry",
    "bert",
    "convnext",
    "densenet",
    "efficientnet",
    "entries",
    "googlenet",
    "gpt",
    "inception",
    "llama",
    "mlp",
    "mlp_mixer",
    "mobilenet_v2",
    "mobilenet_v3",
    "poolformer",
    "random_dag",
    "regnet",
    "resnet",
    "resnext",
    "rnn",
    "shufflenet_v2",
    "squeezenet",
    "swin",
    "t5",
    "unet",
    "vgg",
    "vit",
]


# --------------------------------------------------------------------------- helpers


def _make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to a multiple of ``divisor`` (never dropping more than 10%)."""
    if min_value is None:
        min_value = divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:
        new_value += divisor
    return new_value


def _conv_bn(
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    act: Callable[[], nn.Module] | None = None,
    eps: float = 1e-5,
    momentum: float = 0.1,
) -> nn.Sequential:
    """Conv (no bias, 'same' padding) -> BatchNorm -> optional activation."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=eps, momentum=momentum),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def _relu() -> nn.Module:
    return nn.ReLU(inplace=True)


def _relu6() -> nn.Module:
    return nn.ReLU6(inplace=True)


def _hardswish() -> nn.Module:
    return nn.Hardswish(inplace=True)


def _on_meta(model: nn.Module) -> bool:
    """True when the parameters live on the meta device: their values do not exist, so
    custom re-initialisation is skipped (the meta ``normal_`` is slow Python)."""
    p = next(model.parameters(), None)
    return p is not None and p.is_meta


def _init_convnet(model: nn.Module) -> None:
    """torchvision-style init: Kaiming (fan_out) convs, unit BN, small-normal linears."""
    if _on_meta(model):
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _init_transformer(model: nn.Module, std: float = 0.02) -> None:
    """GPT/BERT-style init: N(0, 0.02) linears and embeddings, zero biases."""
    if _on_meta(model):
        return
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)


# --------------------------------------------------------------------------- MLP


def mlp(
    in_features: int = 784,
    hidden: Sequence[int] = (512, 512),
    classes: int = 10,
    dropout: float = 0.0,
    norm: bool = False,
) -> nn.Module:
    """Multi-layer perceptron: Flatten -> [Linear -> (LayerNorm) -> ReLU -> (Dropout)]* -> Linear.

    Any input shape ``(N, ...)`` whose trailing dimensions multiply to ``in_features``
    is accepted.  ``norm`` uses LayerNorm so that a batch of one still trains.
    """
    layers: list[nn.Module] = [nn.Flatten(1)]
    width = in_features
    for h in hidden:
        layers.append(nn.Linear(width, h))
        if norm:
            layers.append(nn.LayerNorm(h))
        layers.append(nn.ReLU(inplace=True))
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- VGG

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


# --------------------------------------------------------------------------- ResNet


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


# --------------------------------------------------------------------------- MobileNet


class _InvertedResidualV2(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = round(cin * expand_ratio)
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=_relu6))
        layers += [
            _conv_bn(hidden, hidden, 3, stride, groups=hidden, act=_relu6),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.conv(x)
        return x + out if self.use_res_connect else out

    def extra_repr(self) -> str:
        return f"residual={self.use_res_connect}"


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al., 2018): inverted residuals with linear bottlenecks."""

    # (expand ratio, channels, repeats, stride)
    _SETTING = (
        (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
        (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
    )  # fmt: skip

    def __init__(self, width_mult: float, classes: int, dropout: float = 0.2) -> None:
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=_relu6)]
        for t, c, n, s in self._SETTING:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                layers.append(_InvertedResidualV2(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(_conv_bn(cin, last, 1, act=_relu6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, classes))
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        x = self.classifier(x)
        return x


def mobilenet_v2(width_mult: float = 1.0, classes: int = 1000) -> nn.Module:
    """MobileNetV2 with channel multiplier ``width_mult`` (torchvision topology)."""
    return MobileNetV2(width_mult, classes)


class _SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: Tensor) -> Tensor:
        scale: Tensor = self.gate(self.fc2(self.relu(self.fc1(self.avgpool(x)))))
        return scale * x


def _conv_bn_v3(
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    act: Callable[[], nn.Module] | None = None,
) -> nn.Sequential:
    return _conv_bn(cin, cout, kernel, stride, groups, act, eps=0.001, momentum=0.01)


class _InvertedResidualV3(nn.Module):
    def __init__(
        self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hs: bool, stride: int
    ) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = _hardswish if hs else _relu
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_conv_bn_v3(cin, expanded, 1, act=act))
        layers.append(_conv_bn_v3(expanded, expanded, kernel, stride, expanded, act=act))
        if se:
            layers.append(_SqueezeExcitation(expanded, _make_divisible(expanded // 4, 8)))
        layers.append(_conv_bn_v3(expanded, cout, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.block(x)
        return x + out if self.use_res_connect else out

    def extra_repr(self) -> str:
        return f"residual={self.use_res_connect}"


# (in, kernel, expanded, out, squeeze-excite, hardswish, stride)
_MNV3_SMALL = (
    (16, 3, 16, 16, True, False, 2),
    (16, 3, 72, 24, False, False, 2),
    (24, 3, 88, 24, False, False, 1),
    (24, 5, 96, 40, True, True, 2),
    (40, 5, 240, 40, True, True, 1),
    (40, 5, 240, 40, True, True, 1),
    (40, 5, 120, 48, True, True, 1),
    (48, 5, 144, 48, True, True, 1),
    (48, 5, 288, 96, True, True, 2),
    (96, 5, 576, 96, True, True, 1),
    (96, 5, 576, 96, True, True, 1),
)
_MNV3_LARGE = (
    (16, 3, 16, 16, False, False, 1),
    (16, 3, 64, 24, False, False, 2),
    (24, 3, 72, 24, False, False, 1),
    (24, 5, 72, 40, True, False, 2),
    (40, 5, 120, 40, True, False, 1),
    (40, 5, 120, 40, True, False, 1),
    (40, 3, 240, 80, False, True, 2),
    (80, 3, 200, 80, False, True, 1),
    (80, 3, 184, 80, False, True, 1),
    (80, 3, 184, 80, False, True, 1),
    (80, 3, 480, 112, True, True, 1),
    (112, 3, 672, 112, True, True, 1),
    (112, 5, 672, 160, True, True, 2),
    (160, 5, 960, 160, True, True, 1),
    (160, 5, 960, 160, True, True, 1),
)


class MobileNetV3(nn.Module):
    """MobileNetV3 (Howard et al., 2019): NAS-found blocks with SE and hard-swish."""

    def __init__(self, variant: str, width_mult: float, classes: int) -> None:
        super().__init__()
        setting = _MNV3_SMALL if variant == "small" else _MNV3_LARGE
        last = _make_divisible((1024 if variant == "small" else 1280) * width_mult)

        def adjust(c: int) -> int:
            return _make_divisible(c * width_mult)

        layers: list[nn.Module] = [_conv_bn_v3(3, adjust(16), 3, 2, act=_hardswish)]
        for cin, k, exp, cout, se, hs, s in setting:
            layers.append(_InvertedResidualV3(adjust(cin), k, adjust(exp), adjust(cout), se, hs, s))
        lastconv_in = adjust(setting[-1][3])
        lastconv_out = 6 * lastconv_in
        layers.append(_conv_bn_v3(lastconv_in, lastconv_out, 1, act=_hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(lastconv_out, last),
            nn.Hardswish(inplace=True),
            nn.Dropout(0.2, inplace=True),
            nn.Linear(last, classes),
        )
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        x = self.classifier(x)
        return x


def mobilenet_v3(
    variant: Literal["small", "large"] = "small", width_mult: float = 1.0, classes: int = 1000
) -> nn.Module:
    """MobileNetV3-Small or -Large with channel multiplier ``width_mult``."""
    if variant not in ("small", "large"):
        raise ValueError(f"mobilenet_v3 variant must be 'small' or 'large', got {variant!r}")
    return MobileNetV3(variant, width_mult, classes)


# --------------------------------------------------------------------------- SqueezeNet


class _Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, e1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, e3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        x = self.squeeze_activation(self.squeeze(x))
        a = self.expand1x1_activation(self.expand1x1(x))
        b = self.expand3x3_activation(self.expand3x3(x))
        return torch.cat([a, b], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet (Iandola et al., 2016): Fire modules and a convolutional classifier."""

    def __init__(self, version: str, classes: int) -> None:
        super().__init__()

        def pool() -> nn.Module:
            return nn.MaxPool2d(3, 2, ceil_mode=True)

        relu = nn.ReLU(inplace=True)
        if version == "1_0":
            self.features = nn.Sequential(
                nn.Conv2d(3, 96, 7, 2), relu, pool(),
                _Fire(96, 16, 64, 64), _Fire(128, 16, 64, 64), _Fire(128, 32, 128, 128), pool(),
                _Fire(256, 32, 128, 128), _Fire(256, 48, 192, 192), _Fire(384, 48, 192, 192),
                _Fire(384, 64, 256, 256), pool(),
                _Fire(512, 64, 256, 256),
            )  # fmt: skip
        else:
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 3, 2), relu, pool(),
                _Fire(64, 16, 64, 64), _Fire(128, 16, 64, 64), pool(),
                _Fire(128, 32, 128, 128), _Fire(256, 32, 128, 128), pool(),
                _Fire(256, 48, 192, 192), _Fire(384, 48, 192, 192),
                _Fire(384, 64, 256, 256), _Fire(512, 64, 256, 256),
            )  # fmt: skip
        final_conv = nn.Conv2d(512, classes, 1)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), final_conv, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1))
        )
        for m in () if _on_meta(self) else self.modules():
            if isinstance(m, nn.Conv2d):
                if m is final_conv:
                    nn.init.normal_(m.weight, 0.0, 0.01)
                else:
                    nn.init.kaiming_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.classifier(self.features(x))
        return torch.flatten(x, 1)


def squeezenet(version: Literal["1_0", "1_1"] = "1_1", classes: int = 1000) -> nn.Module:
    """SqueezeNet 1.0 or 1.1 (torchvision topology)."""
    if version not in ("1_0", "1_1"):
        raise ValueError(f"squeezenet version must be '1_0' or '1_1', got {version!r}")
    return SqueezeNet(version, classes)


# --------------------------------------------------------------------------- ShuffleNet


def _channel_shuffle(x: Tensor, groups: int) -> Tensor:
    n, c, h, w = x.shape
    x = x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(n, c, h, w)


class _ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = cout // 2
        if stride > 1:
            self.branch1: nn.Module = nn.Sequential(
                _conv_bn(cin, cin, 3, stride, groups=cin),
                _conv_bn(cin, branch, 1, act=_relu),
            )
        else:
            self.branch1 = nn.Identity()
        self.branch2 = nn.Sequential(
            _conv_bn(cin if stride > 1 else branch, branch, 1, act=_relu),
            _conv_bn(branch, branch, 3, stride, groups=branch),
            _conv_bn(branch, branch, 1, act=_relu),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return _channel_shuffle(out, 2)

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


_SHUFFLE_CHANNELS: dict[float, tuple[int, int, int, int]] = {
    0.5: (48, 96, 192, 1024),
    1.0: (116, 232, 464, 1024),
    1.5: (176, 352, 704, 1024),
    2.0: (244, 488, 976, 2048),
}


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 (Ma et al., 2018): channel split, two branches, channel shuffle."""

    def __init__(self, width_mult: float, classes: int) -> None:
        super().__init__()
        if width_mult in _SHUFFLE_CHANNELS:
            stage_out = _SHUFFLE_CHANNELS[width_mult]
        else:  # interpolate: even branch widths, same 1024-wide head
            s2, s3, s4 = (_make_divisible(c * width_mult, 4) for c in (116, 232, 464))
            stage_out = (s2, s3, s4, 1024 if width_mult <= 1.5 else 2048)
        self.conv1 = _conv_bn(3, 24, 3, 2, act=_relu)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 24
        stages: list[nn.Sequential] = []
        for repeats, cout in zip((4, 8, 4), stage_out[:3], strict=True):
            units = [_ShuffleUnit(cin, cout, 2)]
            units += [_ShuffleUnit(cout, cout, 1) for _ in range(repeats - 1)]
            stages.append(nn.Sequential(*units))
            cin = cout
        self.stage2, self.stage3, self.stage4 = stages
        self.conv5 = _conv_bn(cin, stage_out[3], 1, act=_relu)
        self.fc = nn.Linear(stage_out[3], classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.conv5(self.stage4(self.stage3(self.stage2(x))))
        x = self.fc(x.mean([2, 3]))
        return x


def shufflenet_v2(width_mult: float = 1.0, classes: int = 1000) -> nn.Module:
    """ShuffleNetV2 x0.5/x1.0/x1.5/x2.0 (other multipliers are interpolated)."""
    return ShuffleNetV2(width_mult, classes)


# --------------------------------------------------------------------------- GoogLeNet


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


# --------------------------------------------------------------------------- DenseNet


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


# --------------------------------------------------------------------------- transformers


class _SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and SDPA."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        y = y.transpose(1, 2).reshape(b, t, c)
        out: Tensor = self.resid_drop(self.proj(y))
        return out

    def extra_repr(self) -> str:
        return f"heads={self.heads}, causal={self.causal}, dropout={self.dropout}"


class _FeedForward(nn.Module):
    """Transformer MLP; ``gated`` makes it GLU-style (act(x W1) * (x V) W2)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        act: nn.Module | None = None,
        dropout: float = 0.0,
        gated: bool = False,
    ) -> None:
        super().__init__()
        self.gated = gated
        self.fc1 = nn.Linear(dim, 2 * hidden if gated else hidden)
        self.act = act if act is not None else nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        if self.gated:
            a, g = h.chunk(2, dim=-1)
            h = self.act(a) * g
        else:
            h = self.act(h)
        out: Tensor = self.drop(self.fc2(h))
        return out

    def extra_repr(self) -> str:
        return f"gated={self.gated}"


class _PreLNBlock(nn.Module):
    """x + attn(LN(x)); x + mlp(LN(x))  (GPT-2 / ViT block)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float,
        dropout: float = 0.0,
        causal: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = _SelfAttention(dim, heads, dropout, causal)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = _FeedForward(dim, int(dim * mlp_ratio), nn.GELU(), dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al., 2020): patch embedding, class token."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        classes: int,
        dropout: float,
    ) -> None:
        super().__init__()
        n = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, n + 1, dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(_PreLNBlock(dim, heads, mlp_ratio, dropout, eps=1e-6) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)
        _init_transformer(self)
        if not _on_meta(self):
            nn.init.normal_(self.pos_embed, 0.0, 0.02)
            nn.init.zeros_(self.head.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.drop(torch.cat([cls, x], dim=1) + self.pos_embed)
        x = self.norm(self.blocks(x))
        x = self.head(x[:, 0])
        return x


def vit(
    image_size: int = 224,
    patch: int = 16,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    classes: int = 1000,
    dropout: float = 0.0,
) -> nn.Module:
    """ViT classifier; inputs must be ``image_size`` squared (a multiple of ``patch``)."""
    if image_size % patch:
        raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
    return ViT(image_size, patch, dim, depth, heads, mlp_ratio, classes, dropout)


class RNNModel(nn.Module):
    """Embedding -> multi-layer LSTM/GRU -> linear head (LM or last-state classifier)."""

    def __init__(
        self,
        kind: str,
        vocab: int,
        embed: int,
        hidden: int,
        layers: int,
        classes: int | None,
        dropout: float,
    ) -> None:
        super().__init__()
        self.classify = classes is not None
        self.embedding = nn.Embedding(vocab, embed)
        self.drop = nn.Dropout(dropout)
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(
            embed, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0
        )
        self.head = nn.Linear(hidden, vocab if classes is None else classes)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.drop(self.embedding(input_ids))
        out: Tensor = self.rnn(x)[0]
        out = self.drop(out[:, -1] if self.classify else out)
        out = self.head(out)
        return out


def rnn(
    kind: Literal["lstm", "gru"] = "lstm",
    vocab: int = 10000,
    embed: int = 256,
    hidden: int = 512,
    layers: int = 2,
    classes: int | None = None,
    dropout: float = 0.0,
) -> nn.Module:
    """Recurrent model on token ids ``(N, T)``.

    Returns ``(N, T, vocab)`` language-model logits when ``classes`` is None, else
    ``(N, classes)`` logits from the last time step.
    """
    if kind not in ("lstm", "gru"):
        raise ValueError(f"rnn kind must be 'lstm' or 'gru', got {kind!r}")
    return RNNModel(kind, vocab, embed, hidden, layers, classes, dropout)


class GPT(nn.Module):
    """GPT-2 style decoder: learned positions, pre-LN causal blocks, (tied) LM head."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        dropout: float,
        tie_weights: bool,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(_PreLNBlock(dim, heads, mlp_ratio, dropout, causal=True) for _ in range(depth))
        )
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)
        for block in () if _on_meta(self) else self.blocks:  # GPT-2 scaled residual init
            assert isinstance(block, _PreLNBlock)
            for w in (block.attn.proj.weight, block.mlp.fc2.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * depth))
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x: Tensor = self.drop(self.wte(input_ids) + self.wpe(pos))
        x = self.ln_f(self.blocks(x))
        x = self.lm_head(x)
        return x


def gpt(
    vocab: int = 50257,
    seq_len: int = 1024,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    dropout: float = 0.0,
    tie_weights: bool = True,
) -> nn.Module:
    """GPT-2 decoder; ``forward(input_ids)`` with ``T <= seq_len`` -> ``(N, T, vocab)``."""
    return GPT(vocab, seq_len, dim, depth, heads, mlp_ratio, dropout, tie_weights)


class BERT(nn.Module):
    """BERT encoder (Devlin et al., 2018): post-LN layers with an MLM or [CLS] head."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        classes: int | None,
        dropout: float,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(seq_len, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.emb_norm = nn.LayerNorm(dim, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim,
                heads,
                int(dim * mlp_ratio),
                dropout,
                activation="gelu",
                layer_norm_eps=1e-12,
                batch_first=True,
                norm_first=False,
            )
            for _ in range(depth)
        )
        self.classes = classes
        self.head: nn.Module
        if classes is None:  # masked-LM head, decoder tied to the word embeddings
            decoder = nn.Linear(dim, vocab)
            self.head = nn.Sequential(
                nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim, eps=1e-12), decoder
            )
        else:  # pooler over the first ([CLS]) token, then a classifier
            self.head = nn.Sequential(
                nn.Linear(dim, dim), nn.Tanh(), nn.Dropout(dropout), nn.Linear(dim, classes)
            )
        _init_transformer(self)
        if classes is None:
            decoder.weight = self.word_embeddings.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings.weight[0]  # segment A everywhere
        x = self.drop(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x)
        out: Tensor = self.head(x if self.classes is None else x[:, 0])
        return out


def bert(
    vocab: int = 30522,
    seq_len: int = 512,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    classes: int | None = None,
    dropout: float = 0.1,
) -> nn.Module:
    """BERT on token ids ``(N, T)``, ``T <= seq_len``.

    Returns ``(N, T, vocab)`` masked-LM logits when ``classes`` is None, else
    ``(N, classes)`` logits from the pooled first token.
    """
    return BERT(vocab, seq_len, dim, depth, heads, mlp_ratio, classes, dropout)


# --------------------------------------------------------------------------- U-Net


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn(cin, cout, 3, act=_relu), _conv_bn(cout, cout, 3, act=_relu))


class UNet(nn.Module):
    """U-Net (Ronneberger et al., 2015) with padded convs, BN and transposed-conv upsampling."""

    def __init__(self, in_channels: int, classes: int, base: int, depth: int) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(in_channels, widths[0])])
        self.down.extend(_double_conv(widths[i], widths[i + 1]) for i in range(depth))
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(widths[i + 1], widths[i], 2, 2) for i in reversed(range(depth))
        )
        self.dec = nn.ModuleList(
            _double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth))
        )
        self.head = nn.Conv2d(widths[0], classes, 1)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        skips: list[Tensor] = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        skips.pop()
        for up, dec in zip(self.up, self.dec, strict=True):
            x = dec(torch.cat([skips.pop(), up(x)], dim=1))
        x = self.head(x)
        return x


def unet(in_channels: int = 3, classes: int = 21, base: int = 32, depth: int = 4) -> nn.Module:
    """U-Net returning ``(N, classes, H, W)``; H and W must be divisible by ``2**depth``."""
    return UNet(in_channels, classes, base, depth)


# --------------------------------------------------------------------------- random DAGs

_CELL_OPS = ("conv3x3", "conv1x1", "sep_conv3x3", "bn_relu", "max_pool3x3", "avg_pool3x3", "skip")


def _cell_op(name: str, c: int) -> nn.Module:
    if name == "conv3x3":
        return _conv_bn(c, c, 3, act=_relu)
    if name == "conv1x1":
        return _conv_bn(c, c, 1, act=_relu)
    if name == "sep_conv3x3":
        return nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), _conv_bn(c, c, 1, act=_relu)
        )
    if name == "bn_relu":
        return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True))
    if name == "max_pool3x3":
        return nn.MaxPool2d(3, 1, 1)
    if name == "avg_pool3x3":
        return nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    return nn.Identity()


class _Merge(nn.Module):
    """Combine k same-shaped tensors by sum, or by concat followed by a 1x1 conv + BN."""

    def __init__(self, mode: str, k: int, c: int) -> None:
        super().__init__()
        self.mode = mode
        self.proj: nn.Module = (
            _conv_bn(k * c, c, 1) if mode == "concat" and k > 1 else nn.Identity()
        )

    def forward(self, xs: list[Tensor]) -> Tensor:
        if self.mode == "concat" and len(xs) > 1:
            out: Tensor = self.proj(torch.cat(xs, dim=1))
            return out
        acc = xs[0]
        for t in xs[1:]:
            acc = acc + t
        return acc

    def extra_repr(self) -> str:
        return f"mode={self.mode}"


class _RandomCell(nn.Module):
    """A random DAG: node 0 is the (pre-processed) cell input, each later node applies one
    op per incoming edge and merges the results; all loose ends are merged into the output."""

    def __init__(self, cin: int, c: int, reduction: bool, rng: random.Random) -> None:
        super().__init__()
        self.reduction = reduction
        if reduction:
            self.pre: nn.Module = _conv_bn(cin, c, 3, 2, act=_relu)
        elif cin != c:
            self.pre = _conv_bn(cin, c, 1)
        else:
            self.pre = nn.Identity()
        n = rng.randint(3, 6)  # nodes, including the input node
        self.preds: list[list[int]] = []
        self.edges = nn.ModuleList()
        self.merges = nn.ModuleList()
        used: set[int] = set()
        for j in range(1, n):
            k = min(j, rng.choice((1, 1, 2, 2, 3)))
            preds = sorted(rng.sample(range(j), k))
            ops = [rng.choice(_CELL_OPS) for _ in preds]
            mode = rng.choice(("add", "concat")) if k > 1 else "add"
            self.preds.append(preds)
            self.edges.append(nn.ModuleList(_cell_op(op, c) for op in ops))
            self.merges.append(_Merge(mode, k, c))
            used.update(preds)
        self.outputs = [j for j in range(1, n) if j not in used]
        mode = rng.choice(("add", "concat")) if len(self.outputs) > 1 else "add"
        self.out_merge = _Merge(mode, len(self.outputs), c)

    def forward(self, x: Tensor) -> Tensor:
        nodes: list[Tensor] = [self.pre(x)]
        for preds, edges, merge in zip(self.preds, self.edges, self.merges, strict=True):
            assert isinstance(edges, nn.ModuleList)
            nodes.append(merge([op(nodes[p]) for p, op in zip(preds, edges, strict=True)]))
        out: Tensor = self.out_merge([nodes[j] for j in self.outputs])
        return out

    def extra_repr(self) -> str:
        return f"reduction={self.reduction}, preds={self.preds}, outputs={self.outputs}"


class RandomConvNet(nn.Module):
    """Stem -> random cells (some stride-2 reduction cells) -> global pool -> linear."""

    def __init__(
        self, seed: int, classes: int, image_size: int, in_channels: int, max_width: int
    ) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.seed = seed
        c = min(max_width, rng.choice((16, 24, 32, 48, 64, 96, 128)))
        stem: list[nn.Module] = [
            _conv_bn(in_channels, c, 3, 2 if image_size >= 96 else 1, act=_relu)
        ]
        spatial = image_size // 2 if image_size >= 96 else image_size
        if image_size >= 160 and rng.random() < 0.5:
            stem.append(nn.MaxPool2d(3, 2, 1))
            spatial //= 2
        self.stem = nn.Sequential(*stem)
        n_cells = rng.randint(3, 12)
        max_red = max(0, min(3, int(math.log2(max(spatial, 1))) - 2, n_cells - 1))
        n_red = rng.randint(min(1, max_red), max_red)
        reductions = set(rng.sample(range(1, n_cells), n_red))
        cells: list[nn.Module] = []
        cin = c
        for i in range(n_cells):
            red = i in reductions
            if red:
                c = min(max_width, _make_divisible(c * rng.choice((1.5, 2.0))))
            elif rng.random() < 0.2:
                c = min(max_width, _make_divisible(c * rng.choice((0.75, 1.25))))
            cells.append(_RandomCell(cin, c, red, rng))
            cin = c
        self.cells = nn.Sequential(*cells)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(rng.choice((0.0, 0.0, 0.2, 0.5)))
        self.fc = nn.Linear(c, classes)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.cells(self.stem(x))
        x = self.fc(self.drop(torch.flatten(self.pool(x), 1)))
        return x

    def extra_repr(self) -> str:
        return f"seed={self.seed}"


class _RandomBlock(nn.Module):
    """One random transformer block; ``style`` picks the wiring of attention, MLP, norms."""

    STYLES = ("pre", "pre", "post", "parallel", "attn", "mlp")

    def __init__(
        self,
        dim: int,
        heads: int,
        hidden: int,
        style: str,
        act: nn.Module,
        gated: bool,
        norm: str,
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.style = style

        def make_norm() -> nn.Module:
            return nn.LayerNorm(dim) if norm == "layernorm" else nn.RMSNorm(dim)

        self.norm1 = make_norm()
        self.norm2: nn.Module = make_norm() if style in ("pre", "post") else nn.Identity()
        self.attn: nn.Module = (
            _SelfAttention(dim, heads, dropout, causal) if style != "mlp" else nn.Identity()
        )
        self.mlp: nn.Module = (
            _FeedForward(dim, hidden, act, dropout, gated) if style != "attn" else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.style == "pre":
            x = x + self.attn(self.norm1(x))
            x = x + self.mlp(self.norm2(x))
        elif self.style == "post":
            x = self.norm1(x + self.attn(x))
            x = self.norm2(x + self.mlp(x))
        elif self.style == "parallel":
            h = self.norm1(x)
            x = x + self.attn(h) + self.mlp(h)
        elif self.style == "attn":
            x = x + self.attn(self.norm1(x))
        else:
            x = x + self.mlp(self.norm1(x))
        return x

    def extra_repr(self) -> str:
        return f"style={self.style}"


class RandomTransformer(nn.Module):
    """Token embedding + learned positions -> random blocks -> norm -> head."""

    def __init__(
        self, seed: int, vocab: int, seq_len: int, classes: int | None, max_dim: int
    ) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.seed = seed
        dims = [d for d in (128, 192, 256, 384, 512, 640, 768, 1024) if d <= max_dim]
        dim = rng.choice(dims or [max_dim])
        depth = rng.randint(2, 16 if dim <= 768 else 12)
        norm = rng.choice(("layernorm", "rmsnorm"))
        dropout = rng.choice((0.0, 0.0, 0.1))
        self.causal = classes is None
        self.classify = classes is not None
        head_dims = [h for h in (32, 64, 128) if dim % h == 0] or [dim]
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        blocks = []
        for _ in range(depth):
            style = rng.choice(_RandomBlock.STYLES)
            heads = dim // rng.choice(head_dims)
            ratio = rng.choice((1, 2, 3, 4))
            act_name = rng.choice(("gelu", "gelu_tanh", "relu", "silu"))
            act: nn.Module = {
                "gelu": nn.GELU(),
                "gelu_tanh": nn.GELU(approximate="tanh"),
                "relu": nn.ReLU(),
                "silu": nn.SiLU(),
            }[act_name]
            gated = rng.random() < 0.3
            blocks.append(
                _RandomBlock(dim, heads, ratio * dim, style, act, gated, norm, dropout, self.causal)
            )
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(dim) if norm == "layernorm" else nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab if classes is None else classes, bias=False)
        _init_transformer(self)
        if classes is None and rng.random() < 0.5:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x: Tensor = self.drop(self.embed(input_ids) + self.pos(pos))
        x = self.norm(self.blocks(x))
        x = self.head(x.mean(dim=1) if self.classify else x)
        return x

    def extra_repr(self) -> str:
        return f"seed={self.seed}, causal={self.causal}"


def random_dag(
    seed: int,
    kind: Literal["conv", "transformer"] = "conv",
    classes: int | None = None,
    image_size: int = 32,
    in_channels: int = 3,
    max_width: int = 512,
    vocab: int = 32000,
    seq_len: int = 256,
    max_dim: int = 1024,
) -> nn.Module:
    """Random architecture, fully determined by ``seed`` and the keyword arguments.

    ``kind="conv"``: a stem, 3-12 random cells (DAGs of 3-6 nodes whose edges are drawn
    from conv3x3 / conv1x1 / separable conv / BN+ReLU / 3x3 max & avg pools / skip and
    whose nodes merge by sum or concat + 1x1 conv), random widths (<= ``max_width``)
    and stride-2 reduction cells, then global pool + linear to ``classes`` (default
    1000).  ``image_size`` only bounds the number of reductions; any input size works.

    ``kind="transformer"``: token embedding + learned positions (``seq_len``), 2-16 blocks
    of random style (pre-LN, post-LN, parallel, attention-only, MLP-only), heads,
    MLP ratio, activation and gating, with LayerNorm or RMSNorm.  Returns causal LM
    logits ``(N, T, vocab)`` when ``classes`` is None, else mean-pooled ``(N, classes)``.

    Only a private ``random.Random(seed)`` is used, so the result (and its repr) never
    depends on the global RNG state.
    """
    if kind == "conv":
        return RandomConvNet(
            seed, 1000 if classes is None else classes, image_size, in_channels, max_width
        )
    if kind == "transformer":
        return RandomTransformer(seed, vocab, seq_len, classes, max_dim)
    raise ValueError(f"random_dag kind must be 'conv' or 'transformer', got {kind!r}")


# --------------------------------------------------------------------------- the zoo


@dataclass(frozen=True)
class ZooEntry:
    """One representative configuration of a family.

    ``input_shape`` is per sample (no batch dimension).  ``classes`` is the number of
    classes, or the vocabulary size for ``"tokens"`` entries, whose models return
    per-token logits ``(N, T, classes)``; see the module docstring for output shapes.
    """

    family: str
    name: str
    factory: Callable[[], nn.Module]
    input: str
    input_shape: tuple[int, ...]
    classes: int


FAMILIES: tuple[str, ...] = (
    "mlp",
    "vgg",
    "resnet",
    "mobilenet_v2",
    "mobilenet_v3",
    "squeezenet",
    "shufflenet_v2",
    "googlenet",
    "densenet",
    "vit",
    "rnn",
    "gpt",
    "bert",
    "unet",
    "random_conv",
    "random_transformer",
)

_P = functools.partial


def _image(
    family: str, name: str, factory: Callable[[], nn.Module], size: int = 224, classes: int = 1000
) -> ZooEntry:
    return ZooEntry(family, name, factory, "image", (3, size, size), classes)


def _tokens(
    family: str, name: str, factory: Callable[[], nn.Module], seq: int, vocab: int
) -> ZooEntry:
    return ZooEntry(family, name, factory, "tokens", (seq,), vocab)


def _build_entries() -> list[ZooEntry]:
    # Within a hand-written family the entries go from the smallest to the largest.
    out: list[ZooEntry] = [
        ZooEntry("mlp", "mlp-784-512x2", _P(mlp), "vector", (784,), 10),
        ZooEntry(
            "mlp", "mlp-img-1024x3", _P(mlp, 3 * 32 * 32, (1024,) * 3, 10), "image", (3, 32, 32), 10
        ),
        ZooEntry(
            "mlp",
            "mlp-3072-2048x4-ln",
            _P(mlp, 3072, (2048,) * 4, 100, 0.1, True),
            "vector",
            (3072,),
            100,
        ),
    ]
    out += [
        _image("vgg", "vgg11-bn-w32-cifar", _P(vgg, 11, 32, 100, image_size=32), 32, 100),
        _image("vgg", "vgg16-bn-w64-cifar", _P(vgg, 16, classes=10, image_size=32), 32, 10),
        _image("vgg", "vgg11-bn-w64", _P(vgg, 11)),
        _image("vgg", "vgg16-bn-w64", _P(vgg, 16)),
        _image("vgg", "vgg19-w64", _P(vgg, 19, batch_norm=False)),
    ]
    out += [
        _image("resnet", "resnet50-w32", _P(resnet, 50, 32)),
        _image("resnet", "resnet18-w64-cifar", _P(resnet, 18, classes=10), 32, 10),
    ]
    out += [_image("resnet", f"resnet{d}-w64", _P(resnet, d)) for d in (18, 34, 50, 101, 152)]
    out += [
        _image("mobilenet_v2", f"mobilenet_v2-x{w}", _P(mobilenet_v2, w)) for w in (0.5, 1.0, 1.4)
    ]
    out += [
        _image("mobilenet_v3", "mobilenet_v3-small", _P(mobilenet_v3, "small")),
        _image("mobilenet_v3", "mobilenet_v3-large-x0.75", _P(mobilenet_v3, "large", 0.75)),
        _image("mobilenet_v3", "mobilenet_v3-large", _P(mobilenet_v3, "large")),
    ]
    out += [_image("squeezenet", f"squeezenet{v}", _P(squeezenet, v)) for v in ("1_1", "1_0")]
    out += [
        _image("shufflenet_v2", f"shufflenet_v2-x{w}", _P(shufflenet_v2, w))
        for w in (0.5, 1.0, 1.5, 2.0)
    ]
    out += [
        _image("googlenet", "googlenet-w32", _P(googlenet, width=32)),
        _image("googlenet", "googlenet-w64", _P(googlenet)),
    ]
    out += [_image("densenet", f"densenet{d}", _P(densenet, d)) for d in (121, 169, 201)]
    out += [_image("densenet", "densenet161", _P(densenet, 161, 48))]
    out += [
        _image("vit", "vit-ti16", _P(vit, dim=192, heads=3)),
        _image("vit", "vit-cifar-p4", _P(vit, 32, 4, 384, 6, 8, 2, 10), 32, 10),
        _image("vit", "vit-s16", _P(vit, dim=384, heads=6)),
        _image("vit", "vit-b16", _P(vit)),
        _image("vit", "vit-b32", _P(vit, patch=32)),
        _image("vit", "vit-l16", _P(vit, dim=1024, depth=24, heads=16)),
    ]
    out += [
        _tokens("rnn", "gru-lm-2x512", _P(rnn, "gru"), 64, 10000),
        _tokens("rnn", "lstm-lm-2x512", _P(rnn), 64, 10000),
        _tokens(
            "rnn", "lstm-lm-2x650", _P(rnn, "lstm", 10000, 650, 650, 2, dropout=0.5), 35, 10000
        ),
        _tokens("rnn", "lstm-lm-3x1024", _P(rnn, "lstm", 33278, 400, 1024, 3), 128, 33278),
    ]
    out += [
        _tokens("gpt", "gpt-char-6x384", _P(gpt, 65, 256, 384, 6, 6, dropout=0.2), 256, 65),
        _tokens(
            "gpt", "gpt-mini-6x384", _P(gpt, seq_len=256, dim=384, depth=6, heads=6), 256, 50257
        ),
        _tokens("gpt", "gpt2-small", _P(gpt), 1024, 50257),
        _tokens("gpt", "gpt2-small-512", _P(gpt, dropout=0.1, tie_weights=False), 512, 50257),
        _tokens("gpt", "gpt2-medium", _P(gpt, dim=1024, depth=24, heads=16), 1024, 50257),
    ]
    out += [
        _tokens("bert", "bert-tiny", _P(bert, dim=128, depth=2, heads=2), 128, 30522),
        _tokens("bert", "bert-mini", _P(bert, dim=256, depth=4, heads=4), 128, 30522),
        _tokens("bert", "bert-small", _P(bert, dim=512, depth=4, heads=8), 128, 30522),
        _tokens("bert", "bert-base-128", _P(bert), 128, 30522),
        _tokens("bert", "bert-base-512", _P(bert), 512, 30522),
        _tokens("bert", "bert-large-128", _P(bert, dim=1024, depth=24, heads=16), 128, 30522),
    ]
    out += [
        ZooEntry("unet", "unet-b16-d3", _P(unet, 3, 2, 16, 3), "segmentation", (3, 128, 128), 2),
        ZooEntry("unet", "unet-b32-d4", _P(unet), "segmentation", (3, 256, 256), 21),
        ZooEntry("unet", "unet-b64-d4", _P(unet, 1, 2, 64, 4), "segmentation", (1, 512, 512), 2),
    ]
    conv_cfgs = ((32, 10), (32, 100), (64, 200), (96, 10), (128, 100), (224, 1000))
    for seed, (size, classes) in enumerate(conv_cfgs):
        factory = _P(random_dag, seed, "conv", classes=classes, image_size=size)
        out.append(_image("random_conv", f"random_conv-s{seed}-{size}px", factory, size, classes))
    tf_cfgs = ((128, 8192), (256, 32000), (512, 32000), (128, 50257), (1024, 16384), (256, 256))
    for seed, (seq, vocab) in enumerate(tf_cfgs):
        factory = _P(random_dag, seed, "transformer", vocab=vocab, seq_len=seq)
        out.append(
            _tokens("random_transformer", f"random_transformer-s{seed}-t{seq}", factory, seq, vocab)
        )
    return out


def entries(family: str | None = None) -> list[ZooEntry]:
    """The fixed, ordered list of zoo configurations (optionally of one family).

    Every entry has at most ~355M parameters (GPT-2 medium being the largest).
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return [e for e in _build_entries() if family is None or e.family == family]


# --------------------------------------------------------------------------- broad families
# Families of what people train today beyond the original sixteen (issue 42, item 2):
# ConvNeXt, EfficientNet/MnasNet (depthwise, squeeze-and-excitation, SiLU), Swin (shifted
# windows), MLP-Mixer and pooling mixers, LLaMA-style decoders (RMSNorm, SwiGLU, rotary,
# grouped-query attention), T5-style encoder-decoders, Inception-v3-style multi-branch
# blocks, ResNeXt/RegNet (grouped bottlenecks) and recurrent LMs at realistic sizes. They
# obey the same two rules as the rest of the zoo, and the corpus draws them apart
# (``costaware.measure.corpus``, kinds "gpu-broad" and "cpu-broad"), so that the original corpora
# stay as they were measured.

#: the broad families, in the order the broad corpora draw them
BROAD_FAMILIES: tuple[str, ...] = (
    "convnext",
    "efficientnet",
    "swin",
    "mixer",
    "llama",
    "t5",
    "inception",
    "resnext",
    "rnn_lm",
)


def _layer_scale(dim: int, value: float, *shape: int) -> nn.Parameter:
    """A per-channel scale (ConvNeXt's and PoolFormer's layer scale), ``value`` everywhere."""
    return nn.Parameter(torch.full((dim, *shape), value))


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


class _SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: a channel gate from the global mean, through a bottleneck."""

    def __init__(self, channels: int, squeeze: int, act: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(s)


class _MBConv(nn.Module):
    """Inverted residual (MobileNetV2/EfficientNet): 1x1 expand, depthwise kxk, optional
    squeeze-and-excitation, 1x1 project, residual when the shape allows."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int,
        expand: int,
        se_ratio: float,
        act: Callable[[], nn.Module],
    ) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=act))
        layers.append(_conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se_ratio > 0:
            layers.append(_SqueezeExcite(hidden, max(1, int(cin * se_ratio)), act))
        layers.append(_conv_bn(hidden, cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.block(x)
        return x + y if self.residual else y


#: EfficientNet-B0's stages: (expansion, kernel, stride, channels, repeats)
_EFFICIENTNET_B0 = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)


class EfficientNet(nn.Module):
    """EfficientNet (Tan & Le, 2019) scaled in width and depth; with ``se_ratio=0`` and
    ReLU, a MnasNet-style net of the same inverted residuals."""

    def __init__(
        self,
        width_mult: float,
        depth_mult: float,
        classes: int,
        se_ratio: float,
        activation: str,
        dropout: float,
    ) -> None:
        super().__init__()
        act = nn.SiLU if activation == "silu" else _relu
        cin = _make_divisible(32 * width_mult)
        layers: list[nn.Module] = [_conv_bn(3, cin, 3, 2, act=act)]
        for expand, kernel, stride, channels, repeats in _EFFICIENTNET_B0:
            cout = _make_divisible(channels * width_mult)
            for i in range(math.ceil(repeats * depth_mult)):
                layers.append(
                    _MBConv(cin, cout, kernel, stride if i == 0 else 1, expand, se_ratio, act)
                )
                cin = cout
        head = _make_divisible(1280 * max(1.0, width_mult))
        layers.append(_conv_bn(cin, head, 1, act=act))
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(head, classes)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x).mean((2, 3))
        x = self.fc(self.dropout(x))
        return x


def efficientnet(
    width_mult: float = 1.0,
    depth_mult: float = 1.0,
    classes: int = 1000,
    se_ratio: float = 0.25,
    activation: Literal["silu", "relu"] = "silu",
    dropout: float = 0.2,
) -> nn.Module:
    """EfficientNet-B0 at ``(1.0, 1.0)`` (5.3M parameters); B1-B7 scale width and depth
    (``(1.0, 1.1)``, ``(1.1, 1.2)``, ...). ``se_ratio=0, activation="relu"``: MnasNet-style."""
    if activation not in ("silu", "relu"):
        raise ValueError(f"efficientnet activation must be 'silu' or 'relu', got {activation!r}")
    return EfficientNet(width_mult, depth_mult, classes, se_ratio, activation, dropout)


def _windows(x: Tensor, ws: int) -> Tensor:
    """``(N, H, W, C)`` -> ``(N * H/ws * W/ws, ws * ws, C)``: the non-overlapping windows."""
    n, h, w, c = x.shape
    x = x.view(n, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def _unwindow(x: Tensor, ws: int, n: int, h: int, w: int) -> Tensor:
    c = x.shape[-1]
    x = x.view(n, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h, w, c)


def _shift_mask(h: int, w: int, ws: int, shift: int, like: Tensor) -> Tensor:
    """Swin's mask for shifted windows: ``(windows, ws*ws, ws*ws)``, -100 between tokens
    that the cyclic shift brought together from different regions, 0 elsewhere."""
    img = torch.zeros(1, h, w, 1, device=like.device)
    region = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[:, hs, wsl, :] = float(region)
            region += 1
    win = _windows(img, ws).squeeze(-1)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return torch.zeros(diff.shape, dtype=like.dtype, device=like.device).masked_fill(
        diff != 0, -100.0
    )


class _SwinBlock(nn.Module):
    """Window attention (shifted by half a window in every other block) with a learned
    bias per head over the window's token pairs, then an MLP; pre-norm residuals."""

    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.bias = nn.Parameter(torch.zeros(heads, window * window, window * window))
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        n, h, w, c = x.shape
        ws, s = self.window, self.shift
        y = self.norm1(x)
        if s:
            y = torch.roll(y, (-s, -s), (1, 2))
        y = _windows(y, ws)
        b, t = y.shape[0], y.shape[1]
        q, k, v = self.qkv(y).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        mask = self.bias.to(q.dtype).unsqueeze(0)
        if s:
            shift = _shift_mask(h, w, ws, s, q).repeat(n, 1, 1).unsqueeze(1)
            mask = mask + shift
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.proj(y.transpose(1, 2).reshape(b, t, c))
        y = _unwindow(y, ws, n, h, w)
        if s:
            y = torch.roll(y, (s, s), (1, 2))
        x = x + y
        out: Tensor = x + self.mlp(self.norm2(x))
        return out


class _PatchMerging(nn.Module):
    """2x2 neighbouring tokens concatenated (4C), normalised and projected to 2C."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x))  # type: ignore[no-any-return]


class Swin(nn.Module):
    """Swin Transformer (Liu et al., 2021): patch embedding, stages of (shifted) window
    attention, patch merging between them. A stage whose map is no larger than the window
    attends over the whole map, unshifted."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depths: Sequence[int],
        heads: Sequence[int],
        window: int,
        classes: int,
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.embed_norm = nn.LayerNorm(dim)
        side = image_size // patch
        stages: list[nn.Module] = []
        for i, (depth, h) in enumerate(zip(depths, heads)):
            if i:
                stages.append(_PatchMerging(dim))
                dim, side = 2 * dim, side // 2
            ws = min(window, side)
            stages += [
                _SwinBlock(dim, h, ws, ws // 2 if j % 2 and side > ws else 0) for j in range(depth)
            ]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        _init_transformer(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed_norm(self.patch_embed(x).permute(0, 2, 3, 1))
        x = self.norm(self.stages(x)).mean((1, 2))
        x = self.head(x)
        return x


def swin(
    image_size: int = 224,
    patch: int = 4,
    dim: int = 96,
    depths: Sequence[int] = (2, 2, 6, 2),
    heads: Sequence[int] = (3, 6, 12, 24),
    window: int = 7,
    classes: int = 1000,
) -> nn.Module:
    """Swin; the defaults are Swin-T (28.3M parameters). Every stage's map must split
    into whole windows: ``image_size / patch / 2**i`` a multiple of the window (or no
    larger than it), and each stage's width a multiple of its heads."""
    if len(depths) != len(heads) or not depths:
        raise ValueError(f"swin needs one head count per stage, got {depths=} {heads=}")
    side = image_size // patch
    for i, h in enumerate(heads):
        ws = min(window, side)
        if image_size % patch or side % ws or side == 0 or (dim << i) % h:
            raise ValueError(
                f"swin stage {i}: a {side}x{side} map of width {dim << i} does not split into "
                f"{ws}x{ws} windows and {h} heads (image_size {image_size}, patch {patch})"
            )
        side //= 2
    return Swin(image_size, patch, dim, tuple(depths), tuple(heads), window, classes)


class _MixerBlock(nn.Module):
    """MLP-Mixer block: an MLP across tokens, then an MLP across channels."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens)
        )
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.channel_mlp = nn.Sequential(
            nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))  # type: ignore[no-any-return]


class MLPMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al., 2021): patches, then token- and channel-mixing MLPs."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depth: int,
        token_hidden: int,
        channel_hidden: int,
        classes: int,
    ) -> None:
        super().__init__()
        tokens = (image_size // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(
            *(_MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x)).mean(1)
        x = self.head(x)
        return x


def mlp_mixer(
    image_size: int = 224,
    patch: int = 16,
    dim: int = 512,
    depth: int = 8,
    token_hidden: int = 256,
    channel_hidden: int = 2048,
    classes: int = 1000,
) -> nn.Module:
    """MLP-Mixer; the defaults are Mixer-S/16 (18.5M parameters). Inputs must be
    ``image_size`` squared (a multiple of ``patch``)."""
    if image_size % patch:
        raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
    return MLPMixer(image_size, patch, dim, depth, token_hidden, channel_hidden, classes)


class _PoolBlock(nn.Module):
    """PoolFormer block: average pooling as the token mixer (minus the identity), then a
    1x1-conv MLP; GroupNorm(1) norms and layer scales."""

    def __init__(self, dim: int, layer_scale: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 4 * dim, 1), nn.GELU(), nn.Conv2d(4 * dim, dim, 1))
        self.gamma1 = _layer_scale(dim, layer_scale, 1, 1)
        self.gamma2 = _layer_scale(dim, layer_scale, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm1(x)
        x = x + self.gamma1 * (self.pool(y) - y)
        out: Tensor = x + self.gamma2 * self.mlp(self.norm2(x))
        return out


class PoolFormer(nn.Module):
    """PoolFormer (Yu et al., 2022): a MetaFormer whose token mixer is pooling."""

    def __init__(self, depths: Sequence[int], dims: Sequence[int], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 7, 4, 2)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i:
                layers.append(nn.Conv2d(dims[i - 1], dim, 3, 2, 1))
            layers += [_PoolBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.GroupNorm(1, dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.features(x)).mean((2, 3))
        x = self.head(x)
        return x


def poolformer(
    depths: Sequence[int] = (2, 2, 6, 2),
    dims: Sequence[int] = (64, 128, 320, 512),
    classes: int = 1000,
) -> nn.Module:
    """PoolFormer; the defaults are PoolFormer-S12 (11.9M parameters)."""
    if len(depths) != len(dims) or not depths:
        raise ValueError(f"poolformer needs one depth per stage width, got {depths=} {dims=}")
    return PoolFormer(tuple(depths), tuple(dims), classes)


def _rotate(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding of ``(N, heads, T, d)`` queries or keys (the half-split
    form of GPT-NeoX and LLaMA's Hugging Face port), its angles made from the positions."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


class _LlamaBlock(nn.Module):
    """RMSNorm -> causal attention with rotary embeddings and grouped-query heads ->
    RMSNorm -> SwiGLU MLP; no biases."""

    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm = nn.RMSNorm(dim, eps=eps)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        n, t, dim = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(n, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            _rotate(q), _rotate(k), v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        x = x + self.wo(y.transpose(1, 2).reshape(n, t, dim))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))  # type: ignore[no-any-return]


class Llama(nn.Module):
    """A LLaMA-style decoder (Touvron et al., 2023): token embedding, RMSNorm/SwiGLU
    blocks with rotary, grouped-query causal attention, an untied LM head."""

    def __init__(
        self, vocab: int, dim: int, depth: int, heads: int, kv_heads: int, ffn: int, eps: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(
            *(_LlamaBlock(dim, heads, kv_heads, ffn, eps) for _ in range(depth))
        )
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.norm(self.blocks(self.embed(input_ids)))
        logits: Tensor = self.lm_head(x)
        return logits


def llama(
    vocab: int = 32000,
    dim: int = 2048,
    depth: int = 16,
    heads: int = 32,
    kv_heads: int = 8,
    ffn: int | None = None,
    eps: float = 1e-5,
) -> nn.Module:
    """LLaMA-style decoder on token ids ``(N, T)`` -> ``(N, T, vocab)``; ``ffn`` defaults
    to LLaMA's ``8/3 * dim`` rounded up to a multiple of 256. ``heads`` must be a multiple
    of ``kv_heads`` (equal: multi-head attention) and divide ``dim`` into even head dims."""
    if heads % kv_heads or dim % heads or (dim // heads) % 2:
        raise ValueError(
            f"llama needs heads ({heads}) a multiple of kv_heads ({kv_heads}) and dim ({dim}) "
            "split into even head dims"
        )
    if ffn is None:
        ffn = 256 * math.ceil(8 * dim / 3 / 256)
    return Llama(vocab, dim, depth, heads, kv_heads, ffn, eps)


class _T5Attention(nn.Module):
    """T5 attention: no biases, no 1/sqrt(d) scaling beyond SDPA's own, an additive bias."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, kv: Tensor, bias: Tensor | None) -> Tensor:
        n, t, dim = x.shape
        s, d = kv.shape[1], dim // self.heads
        q = self.q(x).view(n, t, self.heads, d).transpose(1, 2)
        k = self.k(kv).view(n, s, self.heads, d).transpose(1, 2)
        v = self.v(kv).view(n, s, self.heads, d).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if bias is None else bias.to(q.dtype)
        )
        return self.o(y.transpose(1, 2).reshape(n, t, dim))  # type: ignore[no-any-return]


class _T5Layer(nn.Module):
    """Pre-RMSNorm self-attention, cross-attention (decoder only) and a ReLU MLP."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float, decoder: bool) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.self_attn = _T5Attention(dim, heads)
        self.cross: nn.ModuleList | None = None
        if decoder:
            self.cross = nn.ModuleList([nn.RMSNorm(dim, eps=1e-6), _T5Attention(dim, heads)])
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, ffn, bias=False),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(ffn, dim, bias=False),
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, bias: Tensor, memory: Tensor | None = None) -> Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.self_attn(h, h, bias))
        if self.cross is not None and memory is not None:
            x = x + self.drop(self.cross[1](self.cross[0](x), memory, None))
        out: Tensor = x + self.drop(self.mlp(self.norm2(x)))
        return out


class T5(nn.Module):
    """A T5-style encoder-decoder (Raffel et al., 2020) on one token sequence: the encoder
    reads it, the decoder reads it shifted right by one (a start token 0 first) and attends
    to the encoder. Relative positions as learned per-head biases over clipped offsets
    (T5's buckets, linear), causal in the decoder."""

    def __init__(
        self, vocab: int, dim: int, depth: int, heads: int, ffn: int, dropout: float, buckets: int
    ) -> None:
        super().__init__()
        self.buckets = buckets
        self.embed = nn.Embedding(vocab, dim)
        self.enc_bias = nn.Embedding(buckets, heads)
        self.dec_bias = nn.Embedding(buckets, heads)
        self.encoder = nn.ModuleList(
            _T5Layer(dim, heads, ffn, dropout, False) for _ in range(depth)
        )
        self.decoder = nn.ModuleList(_T5Layer(dim, heads, ffn, dropout, True) for _ in range(depth))
        self.enc_norm = nn.RMSNorm(dim, eps=1e-6)
        self.dec_norm = nn.RMSNorm(dim, eps=1e-6)
        self.drop = nn.Dropout(dropout)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)

    def _bias(self, table: nn.Embedding, t: int, device: torch.device, causal: bool) -> Tensor:
        pos = torch.arange(t, device=device)
        rel = pos[None, :] - pos[:, None]  # key - query
        half = self.buckets // 2
        # the decoder sees only earlier keys: offsets 0..buckets-1 back; the encoder both ways
        bucket = (-rel).clamp(0, self.buckets - 1) if causal else rel.clamp(-half, half - 1) + half
        bias: Tensor = table(bucket).permute(2, 0, 1)  # (heads, T, T)
        if causal:
            bias = bias.masked_fill(rel > 0, -1e4)
        return bias

    def forward(self, input_ids: Tensor) -> Tensor:
        t, device = input_ids.shape[1], input_ids.device
        x = self.drop(self.embed(input_ids))
        bias = self._bias(self.enc_bias, t, device, causal=False)
        for layer in self.encoder:
            x = layer(x, bias)
        memory = self.drop(self.enc_norm(x))
        start = torch.zeros_like(input_ids[:, :1])
        y = self.drop(self.embed(torch.cat([start, input_ids[:, :-1]], 1)))
        bias = self._bias(self.dec_bias, t, device, causal=True)
        for layer in self.decoder:
            y = layer(y, bias, memory)
        logits: Tensor = self.lm_head(self.drop(self.dec_norm(y)))
        return logits


def t5(
    vocab: int = 32128,
    dim: int = 512,
    depth: int = 6,
    heads: int = 8,
    ffn: int = 2048,
    dropout: float = 0.1,
    buckets: int = 32,
) -> nn.Module:
    """T5-style encoder-decoder on token ids ``(N, T)`` -> ``(N, T, vocab)``; the defaults
    are T5-small's shape (``depth`` layers in each of the encoder and the decoder)."""
    if dim % heads:
        raise ValueError(f"t5 dim {dim} is not a multiple of heads {heads}")
    return T5(vocab, dim, depth, heads, ffn, dropout, buckets)


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
