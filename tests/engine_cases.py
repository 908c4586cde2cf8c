"""Shared cases of the graph / engine tests: small zoo models quantized and calibrated on random
data, and the precision plans of issue 32 (w1a2, w2a2, w4a4, w8a8, mixed)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import lowbit
import lowbit.models as zoo
from lowbit.bench.recipes import randomize_batchnorms

PRECISIONS = ("w1a2", "w2a2", "w4a4", "w8a8", "mixed")
#: (width, input H x W) per zoo network: small for the CPU; VGG-16 (no BatchNorm, 4 channels
#: at 1/16 width) wider so that a near-tie rounded differently by `convert`'s float32 does not
#: swing its logits by a percent
SIZES = {"resnet18": (0.125, (32, 32)), "resnet34": (0.125, (32, 32)),
         "resnet50": (0.125, (32, 32)), "vgg16": (0.25, (32, 32)),
         "alexnet": (0.125, (64, 64)), "apnn_vgg_variant": (0.125, (32, 32))}


def layer_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]


def quantize(model: nn.Module, precision: str) -> nn.Module:
    """w<b>a<b>, or 'mixed': first and last layer w8a8, the others w1a2."""
    if precision == "mixed":
        names = layer_names(model)
        eight = {"weight_bits": 8, "act_bits": 8}
        return lowbit.quantize(model, weight_bits=1, act_bits=2,
                               layers={names[0]: eight, names[-1]: eight})
    return lowbit.quantize(model, weight_bits=int(precision[1]), act_bits=int(precision[3]))




def calibrated(name: str, precision: str, seed: int = 0, size: tuple[int, int] | None = None,
               width: float | None = None, calib_batch: int = 4, **options: object
               ) -> tuple[nn.Module, torch.Tensor]:
    """(fake-quant model calibrated on random images, the calibration batch)."""
    w, hw = SIZES.get(name, (1.0, (8, 8)))
    width = w if width is None else width
    hw = size or hw
    torch.manual_seed(seed)
    model = zoo.get(name, num_classes=10, width=width, **options).eval()
    randomize_batchnorms(model, seed)
    channels = 1 if name.startswith("digits") else 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize(model, precision)
    calib = torch.randn(calib_batch, channels, *hw, generator=torch.Generator().manual_seed(seed))
    lowbit.calibrate(q, [calib])
    return q, calib


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())
