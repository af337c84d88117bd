"""Shared fixtures: small real models that trace in well under a second."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import costaware as ca


class TinyCNN(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(self.pool(x).flatten(1))


def tiny_cnn(width: int = 8, classes: int = 10) -> nn.Module:
    return TinyCNN(width, classes)


@pytest.fixture
def cnn_spec() -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=8),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=16,
        optimizer="adamw",
        dataset_size=1000,
    )
