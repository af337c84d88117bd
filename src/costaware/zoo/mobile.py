"""Networks built for small devices: MobileNetV2/V3 (inverted residuals,
squeeze-and-excitation, hard-swish), SqueezeNet (fire modules), ShuffleNetV2 (channel
shuffles) and EfficientNet/MnasNet (MBConv blocks, SiLU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from costaware.zoo._layers import (
    _conv_bn,
    _hardswish,
    _init_convnet,
    _make_divisible,
    _on_meta,
    _relu,
    _relu6,
    _SqueezeExcite,
)


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
