"""torchvision classification models at the smallest widths their constructors allow, for the
model matrix (`test_any_cnn_models.py`). torchvision is imported through
`lowbit.runtime.model_source.torchvision_models` (stand-in op schemas where its compiled ops
do not load beside the installed torch); without torchvision the matrix is skipped.

Each entry builds torchvision's own model class (the architecture and its forward as
torchvision writes them) with fewer / narrower blocks: VGG and AlexNet keep their classifier
structure (linear, ReLU, dropout, ...) with 64 hidden units instead of 4096."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import nn

NUM_CLASSES = 10


def tv():
    """torchvision.models, or skip the test."""
    try:
        from lowbit.runtime.model_source import torchvision_models

        return torchvision_models()
    except ImportError:
        pytest.skip("torchvision is not installed")


def _resnet(**kw) -> nn.Module:
    m = tv()
    block = kw.pop("block", "basic")
    cls = m.resnet.BasicBlock if block == "basic" else m.resnet.Bottleneck
    return m.resnet.ResNet(cls, [1, 1, 1, 1], num_classes=NUM_CLASSES, **kw)


def _mobilenet_v3(arch: str) -> nn.Module:
    mv3 = tv().mobilenetv3
    setting, last = mv3._mobilenet_v3_conf(arch, width_mult=0.25)
    return mv3.MobileNetV3(setting, last, num_classes=NUM_CLASSES)


def _efficientnet(width: float, depth: float) -> nn.Module:
    en = tv().efficientnet
    setting, last = en._efficientnet_conf("efficientnet_b0", width_mult=width, depth_mult=depth)
    return en.EfficientNet(setting, 0.2, last_channel=last, num_classes=NUM_CLASSES)


def _regnet(se: float | None) -> nn.Module:
    rn = tv().regnet
    params = rn.BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8,
                                             se_ratio=se)
    return rn.RegNet(params, num_classes=NUM_CLASSES)


def _small_head(model: nn.Module, features: int) -> nn.Module:
    """The classifier's linear layers at 64 hidden units (its structure kept)."""
    linears = [i for i, m in enumerate(model.classifier) if isinstance(m, nn.Linear)]
    sizes = [features] + [64] * (len(linears) - 1) + [NUM_CLASSES]
    for j, i in enumerate(linears):
        model.classifier[i] = nn.Linear(sizes[j], sizes[j + 1])
    return model


def _vgg() -> nn.Module:
    vgg = tv().vgg
    cfg = [16, "M", 32, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"]
    model = vgg.VGG(vgg.make_layers(cfg, batch_norm=False), num_classes=NUM_CLASSES)
    return _small_head(model, 64 * 7 * 7)


def _alexnet() -> nn.Module:
    return _small_head(tv().alexnet(num_classes=NUM_CLASSES), 256 * 6 * 6)


def _densenet() -> nn.Module:
    return tv().densenet.DenseNet(growth_rate=8, block_config=(2, 2, 2, 2),
                                  num_init_features=16, bn_size=2, num_classes=NUM_CLASSES)


def _shufflenet() -> nn.Module:
    return tv().shufflenetv2.ShuffleNetV2([2, 2, 2], [24, 24, 48, 96, 128],
                                          num_classes=NUM_CLASSES)


def _convnext() -> nn.Module:
    cn = tv().convnext
    setting = [cn.CNBlockConfig(16, 32, 1), cn.CNBlockConfig(32, 64, 1),
               cn.CNBlockConfig(64, None, 1)]
    return cn.ConvNeXt(setting, num_classes=NUM_CLASSES)


#: name -> (builder, input size)
MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "resnet": (lambda: _resnet(), 32),
    "resnext": (lambda: _resnet(block="bottleneck", groups=4, width_per_group=4), 32),
    "wide_resnet": (lambda: _resnet(block="bottleneck", width_per_group=32), 32),
    "mobilenet_v2": (lambda: tv().mobilenet_v2(num_classes=NUM_CLASSES, width_mult=0.25), 32),
    "mobilenet_v3_small": (lambda: _mobilenet_v3("mobilenet_v3_small"), 32),
    "mobilenet_v3_large": (lambda: _mobilenet_v3("mobilenet_v3_large"), 32),
    "efficientnet_b0": (lambda: _efficientnet(0.25, 0.5), 32),
    "efficientnet_b1": (lambda: _efficientnet(0.25, 0.55), 32),
    "efficientnet_b2": (lambda: _efficientnet(0.275, 0.6), 32),
    "efficientnet_b3": (lambda: _efficientnet(0.3, 0.7), 32),
    "regnet_x": (lambda: _regnet(None), 32),
    "regnet_y": (lambda: _regnet(0.25), 32),
    "densenet": (_densenet, 32),
    "vgg": (_vgg, 32),
    "alexnet": (_alexnet, 64),
    "squeezenet": (lambda: tv().squeezenet1_1(num_classes=NUM_CLASSES), 32),
    "shufflenet_v2": (_shufflenet, 32),
    "mnasnet": (lambda: tv().mnasnet.MNASNet(0.35, num_classes=NUM_CLASSES), 32),
    "googlenet": (lambda: tv().googlenet(num_classes=NUM_CLASSES, aux_logits=False,
                                         init_weights=False), 32),
    "convnext": (_convnext, 32),
}
