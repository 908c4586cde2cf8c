"""Run a converted model's conv / linear layers as integer ops through `lowbit.reference`.

`convert(model)` turns every fake-quant layer of a trained (or calibrated) model into an
IntegerConv2d / IntegerLinear and folds the BatchNorm that follows it (`lowbit.quant.convert`);
all other modules stay as they are. An integer layer quantizes its float input with the layer's
activation scale (round half up), runs the exact integer conv / GEMM of its workload with
`lowbit.reference.run` (int32 output), and dequantizes in float64:
    y = out_scale[k] * acc + out_bias[k]   -> float32.
It equals the fake-quant forward up to the float32 rounding of that forward (relative ~1e-6);
an input landing within that rounding of a half step can quantize one level apart.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core.epilogue import EpilogueParams
from ..quant.api import quant_layers
from ..quant.convert import IntegerLayer, batchnorm_pairs, integer_layer
from ..quant.quantize import quantize
from ..reference import run


class _IntegerBase(nn.Module):
    def __init__(self, spec: IntegerLayer) -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("weight", spec.weight)
        self.register_buffer("out_scale", spec.out_scale)
        self.register_buffer("out_bias", spec.out_bias)

    def _check(self, x: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x must be a floating-point tensor, got {got}")
        return x

    def _accumulate(self, q: torch.Tensor) -> torch.Tensor:
        wl = self.spec.workload(tuple(q.shape))
        return run(wl, q, self.weight.to(q.device), EpilogueParams())

    def _dequantize(self, acc: torch.Tensor) -> torch.Tensor:
        y = acc.double() * self.out_scale.to(acc.device) + self.out_bias.to(acc.device)
        return y.float()

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.kind}, w={s.w}, a={s.a}, a_scale={s.a_scale:.4g}, folded_bn={s.folded_bn}"


class IntegerConv2d(_IntegerBase):
    """NCHW float in -> integer conv (NHWC/KRSC, lowbit.reference) -> NCHW float out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check(x)
        if x.dim() != 4 or x.shape[1] != self.spec.weight.shape[3]:
            raise ValueError(f"x must be [N, {self.spec.weight.shape[3]}, H, W], "
                             f"got {tuple(x.shape)}")
        q = quantize(x.float(), torch.tensor(self.spec.a_scale), self.spec.a)
        acc = self._accumulate(q.permute(0, 2, 3, 1).contiguous())
        return self._dequantize(acc).permute(0, 3, 1, 2).contiguous()


class IntegerLinear(_IntegerBase):
    """[..., C] float in -> integer GEMM (lowbit.reference) -> [..., K] float out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._check(x)
        c = self.spec.weight.shape[1]
        if x.dim() < 1 or x.shape[-1] != c:
            raise ValueError(f"x must be [..., {c}], got {tuple(x.shape)}")
        q = quantize(x.float(), torch.tensor(self.spec.a_scale), self.spec.a)
        acc = self._accumulate(q.reshape(-1, c).contiguous())
        return self._dequantize(acc).reshape(*x.shape[:-1], -1)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def convert(model: nn.Module, fold_bn: bool = True) -> nn.Module:
    """Integer copy (eval mode) of a trained or calibrated fake-quant model: every QuantConv2d /
    QuantLinear becomes an IntegerConv2d / IntegerLinear, and (fold_bn) a BatchNorm that alone
    consumes a layer's output is folded into its dequantize and replaced by nn.Identity."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(fold_bn, bool):
        raise TypeError(f"fold_bn must be a bool, got {fold_bn!r}")
    layers = quant_layers(model)
    if not layers:
        raise ValueError("model has no lowbit fake-quant layers: call lowbit.quantize first")
    for name, layer in layers:
        if int(layer.act_quant.observer.seen) == 0:
            raise ValueError(f"layer {name} has no activation range: train it (QAT) or run "
                             "lowbit.calibrate(model, loader) before convert")
    model = copy.deepcopy(model).eval()
    pairs = batchnorm_pairs(model) if fold_bn else {}
    mods = dict(model.named_modules())
    for name, layer in quant_layers(model):
        bn = mods[pairs[name]] if name in pairs else None
        spec = integer_layer(layer, bn)
        cls = IntegerConv2d if spec.kind == "conv2d" else IntegerLinear
        _set_module(model, name, cls(spec))
        if bn is not None:
            _set_module(model, pairs[name], nn.Identity())
    return model


def integer_layers(model: nn.Module) -> dict[str, IntegerLayer]:
    """{name: IntegerLayer} of a converted model (weights, scales, workloads for the kernels)."""
    return {n: m.spec for n, m in model.named_modules() if isinstance(m, _IntegerBase)}
