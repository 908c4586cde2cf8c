"""Float fallbacks of a plan: what has no integer form runs in PyTorch in fp16 (half the
bytes of fp32, PyTorch's fp16 kernels), with its reason in the plan.

- `half_precision(module)`: a FloatFallback module run in float16 (its inputs cast to fp16,
  its output back to float32, the plan's float tensors; emulated in float32 on the CPU).
  Tolerance against the float32 model: fp16's 11 significant bits, ~1e-3 relative per op
  (`FP16_RTOL`); the quantized layers after a fallback re-quantize its output, so a level
  flips only where a value lies within that of a rounding boundary.
- `Unrealizable`: raised by the planner for a value it cannot realize exactly (a layer whose
  requantization has no fixed-point form: tiny or degenerate scales; an average pool whose
  multiplier underflows); `build_plan` then makes the value float (`make_float`: a layer
  runs its fake-quant computation, input quantizer and dequantized weights, in fp16) and
  plans again, so a model compiles wherever a fallback exists. The reason names the layer's
  module path.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..quant.quantize import dequantize, quantize
from .dataflow import AFFINE, AVGPOOL, FLOAT, LAYER, Value
from .pools import ADAPTIVE, GLOBAL

#: relative tolerance of an fp16 fallback against its float32 computation (one op)
FP16_RTOL = 2.0**-10


class Unrealizable(ValueError):
    """A value the plan cannot realize exactly (`value`), and why: it becomes float."""

    def __init__(self, value: Value, reason: str) -> None:
        super().__init__(reason)
        self.value, self.reason = value, reason


class HalfPrecision(nn.Module):
    """`module` (a copy) in float16: inputs cast to fp16, the output back to float32. On the
    CPU, whose fp16 kernels are slow, the same in float32 arithmetic on the fp16-rounded
    inputs and parameters, the output rounded to fp16 (what a GPU's fp16 kernels with fp32
    accumulation give, to fp16's rounding)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(module).half()
        self.rounded = copy.deepcopy(self.module).float()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        half = [a.half() if a.dtype.is_floating_point else a for a in args]
        if all(a.device.type == "cpu" for a in args):
            out = self.rounded(*(a.float() if a.dtype.is_floating_point else a for a in half))
            return out.half().float()
        return self.module(*half).float()


#: fallback modules run in fp16 (False: float32, for checks of the integer steps around them
#: against a float32 model to the last rounding)
FALLBACK_HALF = True


def half_precision(module: nn.Module) -> nn.Module:
    """A FloatFallback's module run in fp16 (module docstring)."""
    if not FALLBACK_HALF or isinstance(module, (HalfPrecision, LayerFallback)):
        return module
    return HalfPrecision(module)


class LayerFallback(nn.Module):
    """A fake-quant conv / linear layer (BatchNorm folded: its `IntegerLayer` spec) in fp16:
    the input quantized by the layer's own quantizer (float32, as the model), the conv of
    the dequantized input and weights in fp16, the folded BatchNorm and a residual in
    float32."""

    def __init__(self, spec: object, residual: bool) -> None:
        super().__init__()
        self.kind, self.stride, self.pad = spec.kind, spec.stride, spec.pad
        self.groups = int(getattr(spec, "groups", 1))  # grouped convs: KRSC of C / groups
        self.a, self.a_scale, self.residual = spec.a, float(spec.a_scale), residual
        w_scale = spec.w_scale.double()
        weight = spec.weight.double() * w_scale.view(-1, *[1] * (spec.weight.dim() - 1))
        if spec.kind == "conv2d":
            weight = weight.permute(0, 3, 1, 2)  # KRSC -> KCRS
        self.register_buffer("weight", weight.half().contiguous())
        self.register_buffer("gain", (spec.out_scale.double() / (spec.a_scale * w_scale)
                                      ).float())
        self.register_buffer("offset", spec.out_bias.float())

    def forward(self, x: torch.Tensor, res: torch.Tensor | None = None) -> torch.Tensor:
        scale = torch.tensor(self.a_scale, dtype=torch.float32, device=x.device)
        xq, w = dequantize(quantize(x.float(), scale, self.a), scale).half(), self.weight
        if x.device.type == "cpu":  # fp16 operands, float32 arithmetic (`HalfPrecision`)
            xq, w = xq.float(), w.float()
        if self.kind == "conv2d":
            y = F.conv2d(xq, w, None, self.stride, self.pad, 1, self.groups).half().float()
            y = y * self.gain.view(1, -1, 1, 1) + self.offset.view(1, -1, 1, 1)
        else:
            y = F.linear(xq, w).half().float() * self.gain + self.offset
        return y if res is None else y + res


class _AveragePool(nn.Module):
    def __init__(self, attrs: dict) -> None:
        super().__init__()
        self.attrs = dict(attrs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attrs
        if a["mode"] == GLOBAL:
            return x.mean(dim=(2, 3), keepdim=True)
        if a["mode"] == ADAPTIVE:
            return F.adaptive_avg_pool2d(x, a["output_size"])
        return F.avg_pool2d(x, a["kernel"], a["stride"], a["pad"])


def make_float(v: Value, reason: str) -> None:
    """Turn an unrealizable layer, average pool or affine value into a float value (in place)."""
    if v.op == LAYER:
        module = LayerFallback(v.attrs["spec"], v.residual is not None)
        what = f"{', '.join(v.attrs['source'])}: {type(v.attrs['module']).__name__}"
    elif v.op == AVGPOOL:
        module, what = _AveragePool(v.attrs), f"average pool ({v.attrs['mode']})"
    elif v.op == AFFINE:  # the BatchNorm itself
        module, what = v.attrs["module"], v.attrs["op"]
    else:
        raise AssertionError(f"{v.name}: a {v.op} value has no float fallback") from None
    v.op = FLOAT
    v.attrs = {"module": module, "op": what, "reason": reason}
