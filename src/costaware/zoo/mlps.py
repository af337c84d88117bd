"""The plain multi-layer perceptron."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


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
