"""VGG-16 with torchvision's architecture and module names (Simonyan and Zisserman, *Very Deep
Convolutional Networks for Large-Scale Image Recognition*, 2015; configuration D, no
BatchNorm: 138,357,544 parameters at 1000 classes), and APNN-TC's VGG variant.

`width` scales every channel count and the classifier's hidden width (small test models).
"""

from __future__ import annotations

import torch
from torch import nn

#: VGG-16 (configuration D): output channels of the 3x3 convs, "M" = 2x2 max-pool
VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")
#: APNN-TC's VGG variant: three stages of two 3x3 convs, each stage ending in a 2x2 max-pool
APNN_VGG_CONFIG = (128, 128, "M", 256, 256, "M", 512, 512, "M")


def _scaled(c: int, width: float) -> int:
    return max(1, round(c * width))


def _features(config: tuple, width: float, batch_norm: bool) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    c_in = 3
    for item in config:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        c_out = _scaled(item, width)
        layers.append(nn.Conv2d(c_in, c_out, 3, padding=1, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm2d(c_out))
        layers.append(nn.ReLU(inplace=True))
        c_in = c_out
    return nn.Sequential(*layers), c_in


def _init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


class VGG(nn.Module):
    """torchvision's VGG: conv features, adaptive average pool to 7x7, three FC layers with
    ReLU and dropout."""

    def __init__(self, config: tuple = VGG16_CONFIG, num_classes: int = 1000,
                 width: float = 1.0) -> None:
        super().__init__()
        self.features, c = _features(config, width, batch_norm=False)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = _scaled(4096, width)
        self.classifier = nn.Sequential(
            nn.Linear(c * 7 * 7, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, num_classes))
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class APNNVGGVariant(nn.Module):
    """APNN-TC's VGG variant (Feng et al., *APNN-TC: Accelerating Arbitrary Precision Neural
    Networks on Ampere GPU Tensor Cores*, SC 2021; the network of its evaluation code
    src/APNN/1_cifar10_vgg.cu in its repository, inherited from TCBNN, Li et al. 2020): six
    3x3 convs (3->128->128, pool, ->256->256, pool, ->512->512, pool), each followed by
    BatchNorm and ReLU, then FC (512 * H/8 * W/8 -> 1024) + BN + ReLU, FC (1024 -> 1024) +
    BN + ReLU and the output FC. The feature map is flattened as it is (no adaptive pool), so
    the first FC's width follows `image_size` (32: CIFAR-10, 8192 inputs)."""

    def __init__(self, num_classes: int = 10, width: float = 1.0,
                 image_size: int | tuple[int, int] = 32) -> None:
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        if h % 8 or w % 8 or h < 8 or w < 8:
            raise ValueError(f"image_size must be a multiple of 8 (three 2x2 pools), got "
                             f"{image_size!r}")
        self.features, c = _features(APNN_VGG_CONFIG, width, batch_norm=True)
        hidden = _scaled(1024, width)
        self.classifier = nn.Sequential(
            nn.Linear(c * (h // 8) * (w // 8), hidden), nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes))
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def vgg16(num_classes: int = 1000, width: float = 1.0) -> VGG:
    return VGG(VGG16_CONFIG, num_classes, width)


def apnn_vgg_variant(num_classes: int = 1000, width: float = 1.0,
                     image_size: int | tuple[int, int] = 32) -> APNNVGGVariant:
    return APNNVGGVariant(num_classes, width, image_size)
