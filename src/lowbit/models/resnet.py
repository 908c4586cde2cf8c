"""ResNet-18/34/50 with torchvision's architecture and module names (He et al., *Deep Residual
Learning for Image Recognition*, 2016; torchvision's v1.5 variant: the stride of a Bottleneck
sits on its 3x3 conv). A state dict saved from torchvision's resnet18/34/50 loads as it is.

`width` scales every channel count (64 * width at the first stage) for small test models; at
width 1 the parameter counts are torchvision's (11,689,512 / 21,797,672 / 25,557,032 at 1000
classes).
"""

from __future__ import annotations

import torch
from torch import nn


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN; the shortcut (identity or 1x1 conv + BN) added before the ReLU."""

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += shortcut
        return self.relu(out)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand (x4), each with BN; shortcut added
    before the last ReLU."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += shortcut
        return self.relu(out)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max-pool), four stages, global average pool, FC."""

    def __init__(self, block: type[BasicBlock | Bottleneck], layers: tuple[int, ...],
                 num_classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        base = max(1, round(64 * width))
        self.in_planes = base
        self.conv1 = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, base, layers[0], 1)
        self.layer2 = self._stage(block, base * 2, layers[1], 2)
        self.layer3 = self._stage(block, base * 4, layers[2], 2)
        self.layer4 = self._stage(block, base * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base * 8 * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _stage(self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int,
               stride: int) -> nn.Sequential:
        out_planes = planes * block.expansion
        downsample = None
        if stride != 1 or self.in_planes != out_planes:
            downsample = nn.Sequential(_conv1x1(self.in_planes, out_planes, stride),
                                       nn.BatchNorm2d(out_planes))
        layers = [block(self.in_planes, planes, stride, downsample)]
        self.in_planes = out_planes
        layers += [block(out_planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, width: float = 1.0) -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, width)


def resnet34(num_classes: int = 1000, width: float = 1.0) -> ResNet:
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes, width)


def resnet50(num_classes: int = 1000, width: float = 1.0) -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, width)
