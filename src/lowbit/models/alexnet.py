"""AlexNet with torchvision's architecture and module names (Krizhevsky, *One weird trick for
parallelizing convolutional neural networks*, 2014: the single-tower variant torchvision
ships; 61,100,840 parameters at 1000 classes). `width` scales every channel count and the
classifier's hidden width. Inputs need at least 63x63 pixels (three 3x3/2 max-pools after the
11x11/4 conv)."""

from __future__ import annotations

import torch
from torch import nn


class AlexNet(nn.Module):
    def __init__(self, num_classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3, c4 = (max(1, round(c * width)) for c in (64, 192, 384, 256))
        hidden = max(1, round(4096 * width))
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c3, c4, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c4, c4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(c4 * 6 * 6, hidden), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def alexnet(num_classes: int = 1000, width: float = 1.0) -> AlexNet:
    return AlexNet(num_classes, width)
