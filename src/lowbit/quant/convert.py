"""Integer form of a trained fake-quant model: integer weights, scales and folded BatchNorm.

For one quantized layer with input scale s_x, per-channel weight scales s_w[k], integer input
q_x and integer weights q_w, the fake-quant forward is (up to float rounding)
    y[k] = s_x s_w[k] acc[k] + b[k],          acc = conv(q_x, q_w) or q_x . q_w^T (exact),
and a BatchNorm right after it (eval statistics; g = gamma / sqrt(var + eps)) gives
    g[k] (y[k] - mu[k]) + beta[k] = out_scale[k] acc[k] + out_bias[k],
    out_scale = s_x s_w g,  out_bias = g (b - mu) + beta.
BN is folded into this per-channel dequantize (the epilogue's scale and bias), not into the
weights: the integers stay exactly the ones QAT trained, so the integer forward equals the
fake-quant forward up to the float rounding of the final dequantize.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.fx
from torch import nn

from ..core import ConvWorkload, Encoding, Epilogue, GemmWorkload, Layout, Precision
from ..core.epilogue import EpilogueParams
from .modules import QUANT_MODULES, ActQuantizer, QuantConv2d, QuantLinear
from .quantize import fixed_point, round_half_up

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d)


@dataclass(eq=False)
class IntegerLayer:
    """One conv2d / linear layer in integer form.

    weight: int8 values in `w`'s range, conv KRSC [K, R, S, C / groups], linear [K, C] (GEMM
    operand b). groups: the conv's channel groups (1 for a linear layer).
    a, a_scale: the input's precision and scale (real = a_scale * q). w_scale: float32 [K].
    out_scale, out_bias: float64 [K], real output = out_scale * acc + out_bias (BN folded).
    """

    kind: str
    weight: torch.Tensor
    w: Precision
    a: Precision
    a_scale: float
    w_scale: torch.Tensor
    out_scale: torch.Tensor
    out_bias: torch.Tensor
    stride: int = 1
    pad: int = 0
    folded_bn: bool = False
    groups: int = 1

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def workload(self, input_shape: tuple[int, ...]) -> ConvWorkload | GemmWorkload:
        """The lowbit workload for an input of `input_shape` (conv: NHWC; linear: [..., C])."""
        if self.kind == "conv2d":
            n, h, w, c = input_shape
            k, r, s, _ = self.weight.shape
            return ConvWorkload(N=n, H=h, W=w, C=c, K=k, R=r, S=s, stride=self.stride,
                                pad=self.pad, groups=self.groups, w=self.w, a=self.a)
        m = 1
        for d in input_shape[:-1]:
            m *= d
        return GemmWorkload(M=m, N=self.out_features, K=input_shape[-1], w=self.w, a=self.a)


def fused_epilogue(layer: IntegerLayer, out: Precision, out_scale: float, relu: bool = True,
                   out_layout: Layout = Layout.INT8) -> tuple[Epilogue, EpilogueParams]:
    """Epilogue that requantizes the layer's accumulators straight into the next layer's input
    (precision `out`, scale `out_scale`), for kernels with a fused epilogue:
        q = clamp((relu(acc + bias) * multiplier + 2^(shift-1)) >> shift, out.qmin, out.qmax),
        bias = round_half_up(out_bias / layer.out_scale)     (accumulator units, int32),
        multiplier * 2^-shift ~ layer.out_scale / out_scale  (lowbit.quant.fixed_point).
    Equal to quantizing relu(dequantized output) up to the bias rounding (half an accumulator
    unit) and float rounding: at most one level apart. Needs layer.out_scale > 0 in every
    channel (a folded BN with negative gamma flips the sign, which the epilogue cannot express).
    """
    if not isinstance(layer, IntegerLayer):
        raise TypeError(f"layer must be an IntegerLayer, got {type(layer).__name__}")
    if not isinstance(out, Precision) or out.encoding is Encoding.BINARY:
        raise ValueError(f"out must be an unsigned or signed Precision, got {out!r}")
    if not isinstance(out_scale, (int, float)) or not out_scale > 0:
        raise ValueError(f"out_scale must be a positive number, got {out_scale!r}")
    if not bool((layer.out_scale > 0).all()):
        raise ValueError("layer.out_scale has channels <= 0 (folded BN with gamma <= 0): "
                         "no fixed-point requantization for them")
    bias = round_half_up(layer.out_bias / layer.out_scale)
    if bool((bias.abs() >= 2**31).any()):
        raise ValueError("layer bias does not fit int32 in accumulator units")
    mult, shift = fixed_point(layer.out_scale / out_scale)
    epilogue = Epilogue(bias=True, relu=relu, out=out, out_layout=out_layout)
    return epilogue, EpilogueParams(bias=bias.to(torch.int32), multiplier=mult, shift=shift)


def _bn_factors(bn: nn.Module | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, shift) with bn(y) = g * y + shift, float64 [K] (identity without BN)."""
    if bn is None:
        return torch.ones(k, dtype=torch.float64), torch.zeros(k, dtype=torch.float64)
    var = bn.running_var.double()
    mean = bn.running_mean.double()
    g = 1.0 / torch.sqrt(var + bn.eps)
    if bn.affine:
        g = g * bn.weight.detach().double()
    shift = -mean * g + (bn.bias.detach().double() if bn.affine else 0.0)
    return g, shift


def integer_layer(layer: QuantConv2d | QuantLinear, bn: nn.Module | None = None) -> IntegerLayer:
    """Integer form of one trained fake-quant layer, folding `bn` (a BatchNorm after it)."""
    if not isinstance(layer, QUANT_MODULES):
        raise TypeError(f"layer must be a QuantConv2d or QuantLinear, got {type(layer).__name__}")
    k = layer.weight.shape[0]
    if bn is not None:
        if not isinstance(bn, _BATCHNORMS) or not bn.track_running_stats:
            raise ValueError("bn must be a BatchNorm1d/2d with running statistics")
        if bn.num_features != k:
            raise ValueError(f"bn has {bn.num_features} features but the layer has {k} outputs")
    aq = layer.act_quant
    a_prec = aq.precision()
    a_scale = aq.scale()
    q, w_scale = layer.weight_quant.integer(layer.weight)
    g, shift = (t.cpu() for t in _bn_factors(bn, k))
    b = torch.zeros(k, dtype=torch.float64) if layer.bias is None else \
        layer.bias.detach().double().cpu()
    q, w_scale = q.cpu(), w_scale.cpu()
    out_scale = a_scale * w_scale.double() * g
    out_bias = b * g + shift
    if isinstance(layer, QuantConv2d):
        return IntegerLayer("conv2d", q.permute(0, 2, 3, 1).contiguous().cpu(),
                            layer.weight_quant.prec, a_prec, a_scale, w_scale.cpu(),
                            out_scale.cpu(), out_bias.cpu(), layer.stride[0], layer.padding[0],
                            bn is not None, layer.groups)
    return IntegerLayer("linear", q.contiguous().cpu(), layer.weight_quant.prec, a_prec, a_scale,
                        w_scale.cpu(), out_scale.cpu(), out_bias.cpu(), folded_bn=bn is not None)


class _LeafTracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:  # quantizers: leaves too
        return isinstance(m, (*QUANT_MODULES, ActQuantizer)) or super().is_leaf_module(
            m, qualname)


def _pairs_fx(model: nn.Module) -> dict[str, str]:
    graph = _LeafTracer().trace(model)
    mods = dict(model.named_modules())
    pairs = {}
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(mods.get(node.target), QUANT_MODULES):
            continue
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_module" and \
                isinstance(mods.get(users[0].target), _BATCHNORMS) and users[0].args[0] is node:
            pairs[node.target] = users[0].target
    return pairs


def _pairs_sequential(model: nn.Module) -> dict[str, str]:
    pairs = {}
    for prefix, mod in model.named_modules():
        if not isinstance(mod, nn.Sequential):
            continue
        children = list(mod.named_children())
        for (n1, m1), (n2, m2) in itertools.pairwise(children):
            if isinstance(m1, QUANT_MODULES) and isinstance(m2, _BATCHNORMS):
                p = prefix + "." if prefix else ""
                pairs[p + n1] = p + n2
    return pairs


def batchnorm_pairs(model: nn.Module) -> dict[str, str]:
    """{quant layer name: name of the BatchNorm that alone consumes its output}. Found on the
    torch.fx graph; models fx cannot trace fall back to neighbours inside nn.Sequential."""
    try:
        return _pairs_fx(model)
    except Exception:
        return _pairs_sequential(model)
