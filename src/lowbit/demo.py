"""`lowbit demo`: one conv layer quantized to several precisions and run through lowbit.

For each precision the weights are quantized per output channel and the (post-ReLU) activations
per tensor, the integer conv runs through the exact reference (and, with a GPU, through the
fastest registered kernel, checked bit for bit), and the result is compared with the float conv.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .core import ConvWorkload, Layout, Precision
from .quant import dequantize, pack, quantize, scale_from_max
from .reference import conv2d_int

DEMO_PRECISIONS = (("s8", "u8"), ("s4", "u4"), ("s2", "u2"), ("b1", "u2"), ("b1", "u1"))


@dataclass
class DemoRow:
    w: Precision
    a: Precision
    max_error: float       # max |out - float out| / max |float out|
    rel_l2_error: float    # ||out - float out|| / ||float out||
    packed_bytes: int      # x and w in bit planes (bits * ceil(C/32) words per pixel/filter)
    fp16_bytes: int


def demo_layer(seed: int = 0) -> tuple[ConvWorkload, torch.Tensor, torch.Tensor]:
    """A ResNet-like 3x3 layer with float weights and post-ReLU float activations (NHWC/KRSC)."""
    g = torch.Generator().manual_seed(seed)
    wl = ConvWorkload(N=2, H=14, W=14, C=64, K=64, R=3, S=3, stride=1, pad=1)
    x = torch.randn(wl.N, wl.H, wl.W, wl.C, generator=g).relu()
    w = torch.randn(wl.K, wl.R, wl.S, wl.C, generator=g) * (2.0 / (9 * wl.C)) ** 0.5
    return wl, x, w


def run_precision(x: torch.Tensor, w: torch.Tensor, wp: Precision, ap: Precision,
                  stride: int = 1, pad: int = 1) -> DemoRow:
    ref = F.conv2d(x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(),
                   stride=stride, padding=pad).permute(0, 2, 3, 1)
    sw = scale_from_max(w, wp, axis=0)
    sa = scale_from_max(x, ap)
    qw, qa = quantize(w, sw, wp, axis=0), quantize(x, sa, ap)
    acc = conv2d_int(qa, qw, stride, pad)
    out = dequantize(acc, sa.double() * sw.double(), axis=-1, dtype=torch.float64)
    err = out - ref
    max_err = float(err.abs().max() / ref.abs().max())
    l2 = float(err.norm() / ref.norm())
    nbytes = sum(pack(q.to(torch.int64), p, Layout.BITPLANE).numel() * 4
                 for q, p in ((qa, ap), (qw, wp)))
    return DemoRow(wp, ap, max_err, l2, nbytes, 2 * (x.numel() + w.numel()))


def demo_rows(seed: int = 0) -> list[DemoRow]:
    _, x, w = demo_layer(seed)
    return [run_precision(x, w, Precision.parse(wp), Precision.parse(ap))
            for wp, ap in DEMO_PRECISIONS]
