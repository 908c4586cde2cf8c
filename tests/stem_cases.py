"""Shared cases and checks of the fused first-layer tests (test_stem*.py): random images,
weights and output specs, the reference chain quantized image -> accumulate ->
epilogue_outputs -> max-pool, and the bit-for-bit comparison of a stem's outputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lowbit.core import ConvWorkload, PackedTensor, Precision
from lowbit.quant.packing import pack
from lowbit.reference import (
    FloatOutput,
    RequantizedOutput,
    accumulate,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
)

#: ResNet's first layer: 7x7/2 pad 3, then the 3x3/2 max-pool pad 1
RESNET = dict(stride=2, pad=3, pool_pad=1)
#: torchvision's ImageNet normalization
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_case(n, h, w, k, r, seed, dtype=torch.float32):
    """A float image [n, 3, h, w] of `dtype`, KRSC s8 weights [k, r, r, 3], an int bias, and
    the generator for what the test draws next."""
    g = torch.Generator().manual_seed(seed)
    image = (torch.randn(n, 3, h, w, generator=g) * 1.5).to(dtype)
    weight = torch.randint(-128, 128, (k, r, r, 3), generator=g)
    bias = torch.randint(-20000, 20000, (k,), generator=g)
    return image, weight, bias, g


def specs_for(k, g, precs=(("u8", True), ("u2", True), ("s8", False))):
    """One RequantizedOutput per (precision, relu), fresh per-channel scales."""
    out = []
    for prec, relu in precs:
        sa = torch.rand(k, generator=g, dtype=torch.float64) * 4e-4 + 2e-5
        m, _, s = fixed_point_pair(sa, 0.0)
        out.append(RequantizedOutput(prec, m, s, relu=relu))
    return out


def derived_specs(k, g, mid="u8", outs=(("u2", True), ("u4", True)), relu=True, span=40):
    """A stored output in `mid` and outputs derived from its value through tables (one
    formula, as a residual quantizer's stream and its readers): per (precision, rises) a
    random table over mid's values, non-decreasing where `rises` (its steps at random
    values within `span` of 0, where these scales put the values), else any."""
    sa = torch.rand(k, generator=g, dtype=torch.float64) * 4e-4 + 2e-5
    m, _, s = fixed_point_pair(sa, 0.0)
    mid_p = Precision.parse(mid)
    n = mid_p.qmax - mid_p.qmin + 1
    specs = [RequantizedOutput(mid_p, m, s, relu=relu)]
    for prec, rises in outs:
        p = Precision.parse(prec)
        if rises:
            z = -mid_p.qmin  # the table's entry of value 0
            lo = z if relu else max(0, z - span)
            cuts = torch.randint(lo, z + span, (p.qmax - p.qmin,), generator=g).sort().values
            table = p.qmin + (torch.arange(n)[:, None] >= cuts[None, :]).sum(1)
        else:
            table = torch.randint(p.qmin, p.qmax + 1, (n,), generator=g)
        specs.append(RequantizedOutput(p, m, s, relu=relu, mid=mid_p, table=table))
    return specs


def reference(q_nchw, weight, bias, specs, stride, pad, pool_pad):
    """The outputs of the quantized image q [N, C, H, W] (NHWC, float ones pooled by
    F.max_pool2d: a float output with scale >= 0 is monotone in y, so pooling commutes)."""
    x = q_nchw.permute(0, 2, 3, 1).contiguous()
    n, h, w, c = x.shape
    k, r = weight.shape[0], weight.shape[1]
    wl = ConvWorkload(N=n, H=h, W=w, C=c, K=k, R=r, S=r, stride=stride, pad=pad)
    acc = accumulate(wl, x, weight)
    outs = epilogue_outputs(acc, bias, specs)
    if pool_pad is None:
        return outs
    return [F.max_pool2d(o.permute(0, 3, 1, 2), 3, 2, pool_pad).permute(0, 2, 3, 1)
            if o.dtype == torch.float32 else maxpool2d_int(o, 3, 2, pool_pad) for o in outs]


def check_outputs(got, ref, layouts, specs):
    """Each output equal to its reference bit for bit (requantized ones as packed in their
    layout, with more than two distinct values); returns how many were checked."""
    checked = 0
    for out, values, layout, spec in zip(got, ref, layouts, specs, strict=True):
        if isinstance(spec, FloatOutput):
            assert torch.equal(out.cpu(), values)
            assert int(values.unique().numel()) > 2
        else:
            assert isinstance(out, PackedTensor) and out.layout is layout
            want = pack(values, spec.precision, layout)
            have = out.data.cpu()
            assert torch.equal(have, want), f"{(have != want).sum().item()} of {want.numel()}"
            assert int(values.unique().numel()) > 2
        checked += 1
    return checked


def replay_with_new_image(launch, image_dev, out, seed):
    """Capture `launch` (a bound stem, run once first) in a CUDA graph, put a fresh random
    image into its input buffer, poison the output, replay; returns the new image (CPU)."""
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    image = torch.randn(image_dev.shape, generator=torch.Generator().manual_seed(seed))
    image_dev.copy_(image)
    out.data.fill_(0x5A5A5A5A)
    graph.replay()
    torch.cuda.synchronize()
    return image
