"""Model factories for the examples and the ``costaware predict`` command.

Each is a zero-argument callable returning an ``nn.Module``, which is what
``TrainingSpec(model=...)`` and ``costaware predict file.py:factory`` expect.
"""

from __future__ import annotations

from torch import nn

from costaware import zoo


def resnet18() -> nn.Module:
    return zoo.resnet(depth=18)


def resnet50() -> nn.Module:
    return zoo.resnet(depth=50)


def vit_b16() -> nn.Module:
    return zoo.vit(image_size=224, patch=16, dim=768, depth=12, heads=12)


def gpt_small() -> nn.Module:
    """A GPT-2-small-sized decoder (124M parameters) with 1,024-token context."""
    return zoo.gpt(vocab=50257, seq_len=1024, dim=768, depth=12, heads=12)


def unet() -> nn.Module:
    return zoo.unet(in_channels=3, classes=21, base=32, depth=4)
