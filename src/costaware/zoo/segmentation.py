"""U-Net, the per-pixel segmentation model."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from costaware.zoo._layers import _conv_bn, _init_convnet, _relu


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
