"""GPU bindings of the plan's steps that run as PyTorch ops (`lowbit.runtime.gpu` calls them):
Concat (a copy into the output: words of bit planes where every part but the last fills whole
words, else values), a uint8 image's table Quantize, wide Lookups, FloatFallback modules and
the Output's dequantization; and the readers and writers of a quantized tensor's values
(logical NHWC, int64) that these and `gpu_elementwise` use.

Each `bind_*` takes the executor (its `plan`, `buffers`, `device`) and a step, and returns
(launches, what runs them), as `gpu_elementwise.bind_elementwise` does. Every launch is
CUDA-graph capturable (no device sync).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..core import Encoding, Layout, Precision
from ..graph.ir import Concat, FloatFallback, Lookup, Output, Quantize
from ..quant.packing import from_bitplanes


def to_bitplanes(values: torch.Tensor, prec: Precision, channels: int) -> torch.Tensor:
    """Bit planes of integer values [..., C] without range checks (no device sync: CUDA-graph
    capturable); `lowbit.quant.packing.to_bitplanes`' layout."""
    v = values.to(torch.int64)
    pat = (v > 0).to(torch.int64) if prec.encoding is Encoding.BINARY else \
        v & ((1 << prec.bits) - 1)
    pad = (-channels) % 32
    pat = F.pad(pat, (0, pad)).reshape(*pat.shape[:-1], -1, 32)
    lane = torch.arange(32, device=pat.device, dtype=torch.int64)
    planes = torch.stack([(((pat >> i) & 1) << lane).sum(-1) for i in range(prec.bits)])
    return torch.where(planes >= 2**31, planes - 2**32, planes).to(torch.int32)


def float_maxpool(x: torch.Tensor, out: torch.Tensor, w) -> Callable[[], None]:
    """A launch of torch's max-pool of window `w` (kernel, stride, pad, ceil) from x into
    out."""
    def launch() -> None:
        out.copy_(F.max_pool2d(x, w.kernel, w.stride, w.pad, ceil_mode=w.ceil))

    return launch


def values_reader(executor: object, name: str) -> Callable[[], torch.Tensor]:
    """A reader of quantized tensor `name`'s values (int64, logical NHWC)."""
    spec, buf = executor.plan.tensors[name], executor.buffers[name]
    if spec.layout is Layout.BITPLANE:
        return lambda: from_bitplanes(buf, spec.precision, spec.shape[-1]).to(torch.int64)
    return lambda: buf.to(torch.int64)


def values_writer(executor: object, name: str) -> Callable[[torch.Tensor], None]:
    """A writer of int64 values (logical NHWC) into quantized tensor `name`."""
    spec, buf = executor.plan.tensors[name], executor.buffers[name]
    if spec.layout is Layout.BITPLANE:
        return lambda v: buf.copy_(to_bitplanes(v, spec.precision, spec.shape[-1]))
    return lambda v: buf.copy_(v.to(buf.dtype))


def bind_concat(executor: object, step: Concat) -> tuple[list, str]:
    out_spec, out = executor.plan.tensors[step.output], executor.buffers[step.output]
    parts = [executor.buffers[p] for p in step.parts]
    specs = [executor.plan.tensors[p] for p in step.parts]
    if out_spec.is_float or out_spec.is_wide or out_spec.layout is Layout.INT8:
        dim = 1 if out_spec.is_float else -1
        return [lambda: torch.cat(parts, dim=dim, out=out)], "torch.cat"
    if all(s.shape[-1] % 32 == 0 for s in specs[:-1]):
        return [lambda: torch.cat(parts, dim=-1, out=out)], "torch.cat of bit-plane words"
    prec, c = out_spec.precision, out_spec.shape[-1]

    def launch() -> None:
        values = torch.cat([from_bitplanes(t, s.precision, s.shape[-1])
                            for t, s in zip(parts, specs, strict=True)], dim=-1)
        out.copy_(to_bitplanes(values, prec, c))

    return [launch], "bit-plane values concatenated (torch)"


def bind_image_lookup(executor: object, step: Quantize) -> tuple[list, str]:
    """A uint8 image quantized by its per-channel table (torch ops)."""
    image, write = executor.buffers[step.input], values_writer(executor, step.output)
    table = executor.plan.params[step.table].to(torch.int64).to(executor.device)
    chan = torch.arange(table.shape[0], device=executor.device).view(1, -1, 1, 1)

    def launch() -> None:
        write(table[chan, image.long()].permute(0, 2, 3, 1))

    return [launch], "uint8 image table lookup (torch)"


def bind_lookup(executor: object, step: Lookup) -> tuple[list, str]:
    spec_in = executor.plan.tensors[step.input]
    table = executor.plan.params[step.table].to(torch.int64).to(executor.device)
    read, write = values_reader(executor, step.input), values_writer(executor, step.output)
    lo = spec_in.precision.qmin

    def launch() -> None:
        write(table[read() - lo])

    return [launch], "table lookup (torch)"


def float_reader(executor: object, name: str) -> Callable[[], torch.Tensor]:
    """A reader of tensor `name` as a FloatFallback reads it: float tensors as they are,
    quantized ones dequantized (scale * q in float64, rounded to float32, NCHW)."""
    spec, buf = executor.plan.tensors[name], executor.buffers[name]
    if spec.is_float:
        return lambda: buf
    read = values_reader(executor, name)

    def dequantized() -> torch.Tensor:
        y = (read().to(torch.float64) * spec.scale).float()
        return y.permute(0, 3, 1, 2) if y.dim() == 4 else y

    return dequantized


def bind_fallback(executor: object, step: FloatFallback) -> tuple[list, str]:
    module = copy.deepcopy(executor.plan.modules[step.module]).to(executor.device).eval()
    readers = [float_reader(executor, a) for a in step.args]
    args = [r() for r in readers]
    out = executor.buffers[step.output]
    with torch.no_grad():  # the module's output must be a float tensor of out's shape
        probe = module(*(torch.zeros_like(a) for a in args))
    if not isinstance(probe, torch.Tensor) or not probe.dtype.is_floating_point or \
            tuple(probe.shape) != tuple(out.shape):
        raise TypeError(f"{step.name}: the fallback module returns "
                        f"{getattr(probe, 'dtype', type(probe).__name__)} "
                        f"{tuple(getattr(probe, 'shape', ()))}, not float {tuple(out.shape)}")

    def launch() -> None:
        with torch.no_grad():
            out.copy_(module(*(r() for r in readers)))

    dtype = "fp16" if type(module).__name__ in ("HalfPrecision", "LayerFallback") else \
        "float32"
    return [launch], f"PyTorch {dtype} ({step.op}: {step.reason})"


def bind_output(executor: object, step: Output) -> tuple[list, str, torch.Tensor]:
    """(launches, what runs them, the result tensor they write): a float input is the result
    itself; a quantized one is dequantized (scale * q in float64, rounded to float32, NCHW)."""
    spec = executor.plan.tensors[step.input]
    if spec.is_float:
        return [], "float result", executor.buffers[step.input]
    shape = (spec.shape[0], spec.shape[-1], *spec.shape[1:-1])
    src = executor.buffers[step.input]
    result = torch.empty(shape, dtype=torch.float32, device=executor.device)

    def launch() -> None:
        if spec.layout is Layout.BITPLANE:
            v = from_bitplanes(src, spec.precision, spec.shape[-1])
        else:
            v = src
        y = v.to(torch.float64) * spec.scale
        result.copy_(y.permute(0, 3, 1, 2) if y.dim() == 4 else y)

    return [launch], "dequantize (float64)", result
