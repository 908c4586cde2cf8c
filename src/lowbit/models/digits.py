"""Small networks for scikit-learn's digits (1 x 8 x 8 images, 10 classes): quick
quantization-aware training on the CPU (accuracy tests of `lowbit.compile`)."""

from __future__ import annotations

import torch
from torch import nn

from .resnet import BasicBlock


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride, 1), nn.BatchNorm2d(c_out), nn.ReLU()]


def digits_cnn(num_classes: int = 10, width: float = 1.0) -> nn.Sequential:
    """4 conv + BN + ReLU layers (16, 32 /2, 32, 64 /2 channels), global average pool and a
    linear classifier, ~33k parameters: `benchmarks/accuracy.py`'s model."""
    c1, c2, c3 = (max(1, round(c * width)) for c in (16, 32, 64))
    return nn.Sequential(*_conv_bn_relu(1, c1, 1), *_conv_bn_relu(c1, c2, 2),
                         *_conv_bn_relu(c2, c2, 1), *_conv_bn_relu(c2, c3, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c3, num_classes))


class DigitsResNet(nn.Module):
    """3x3 stem (16 channels) with BN and ReLU, two ResNet BasicBlocks (16 channels, then 32
    at stride 2 with a 1x1 downsample shortcut), global average pool, linear classifier."""

    def __init__(self, num_classes: int = 10, width: float = 1.0) -> None:
        super().__init__()
        c1, c2 = (max(1, round(c * width)) for c in (16, 32))
        self.stem = nn.Sequential(*_conv_bn_relu(1, c1, 1))
        down = nn.Sequential(nn.Conv2d(c1, c2, 1, 2, bias=False), nn.BatchNorm2d(c2))
        self.blocks = nn.Sequential(BasicBlock(c1, c1), BasicBlock(c1, c2, 2, down))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def digits_resnet(num_classes: int = 10, width: float = 1.0) -> DigitsResNet:
    return DigitsResNet(num_classes, width)
