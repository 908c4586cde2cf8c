"""Run a converted model's conv / linear layers as integer ops through `lowbit.reference`.

`convert(model)` turns every fake-quant layer of a trained (or calibrated) model into an
IntegerConv2d / IntegerLinear and folds the BatchNorm that follows it (`lowbit.quant.convert`);
all other modules stay as they are. An integer layer quantizes its float input with the layer's
activation scale (round half up), runs the exact integer conv / GEMM (`lowbit::conv2d_int` /
`lowbit::gemm_int`, custom ops over `lowbit.reference.run`, ops.py), and dequantizes in float64:
    y = out_scale[k] * acc + out_bias[k]   -> float32.
It equals the fake-quant forward up to the float32 rounding of that forward (relative ~1e-6);
an input landing within that rounding of a half step can quantize one level apart.

Every number that affects the output is a buffer (weight, a_scale, w_scale, out_scale, out_bias)
and the structure is one more (`qlayout`: precisions, stride, pad, groups): `load_state_dict`
restores the scales, and refuses a state of another precision or geometry with a ValueError.
The model exports with `torch.export` (the custom ops have fake implementations).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core import Encoding, Precision
from ..quant.api import quant_layers
from ..quant.convert import IntegerLayer, batchnorm_pairs, integer_layer
from ..quant.overview import LayerRow
from . import ops  # noqa: F401  (registers the lowbit:: custom ops)

_ENCODINGS = (Encoding.UNSIGNED, Encoding.SIGNED, Encoding.BINARY)


def _layout(spec: IntegerLayer) -> torch.Tensor:
    """int64 [6]: w bits, w encoding, a bits, a encoding, stride, pad; [7] with the conv's
    groups where they are not 1 (the states of ungrouped layers keep their 6)."""
    fields = [spec.w.bits, _ENCODINGS.index(spec.w.encoding), spec.a.bits,
              _ENCODINGS.index(spec.a.encoding), spec.stride, spec.pad]
    return torch.tensor(fields if spec.groups == 1 else [*fields, spec.groups])


def _describe(layout: torch.Tensor) -> str:
    wb, we, ab, ae, stride, pad, *groups = (int(v) for v in layout)
    w, a = Precision(wb, _ENCODINGS[we]), Precision(ab, _ENCODINGS[ae])
    return f"w={w} a={a} stride {stride} pad {pad}" + (f" groups {groups[0]}" if groups else "")


class _IntegerBase(nn.Module):
    """Buffers: weight (int8 values), a_scale (float64 scalar), w_scale (float32 [K]),
    out_scale / out_bias (float64 [K]), qlayout (int64 [6], [7] for a grouped conv).
    `layer_name` names the layer in errors; `nonfinite` is the layer's input guard ("raise" or
    "clamp"); `folded_bn_name` is the BatchNorm folded into it (replaced by nn.Identity), if
    any."""

    kind = "abstract"

    def __init__(self, spec: IntegerLayer, layer_name: str = "", nonfinite: str = "raise",
                 folded_bn_name: str | None = None) -> None:
        super().__init__()
        if spec.kind != self.kind:
            raise ValueError(f"{type(self).__name__} needs a {self.kind} spec, got {spec.kind}")
        self.w, self.a, self.stride, self.pad = spec.w, spec.a, spec.stride, spec.pad
        self.groups = spec.groups
        self.layer_name, self.nonfinite, self.folded_bn_name = layer_name, nonfinite, \
            folded_bn_name
        self.register_buffer("weight", spec.weight)
        self.register_buffer("a_scale", torch.tensor(float(spec.a_scale), dtype=torch.float64))
        self.register_buffer("w_scale", spec.w_scale)
        self.register_buffer("out_scale", spec.out_scale)
        self.register_buffer("out_bias", spec.out_bias)
        self.register_buffer("qlayout", _layout(spec))

    @property
    def spec(self) -> IntegerLayer:
        """The layer as an IntegerLayer, read from the current buffers."""
        return IntegerLayer(self.kind, self.weight, self.w, self.a, float(self.a_scale),
                            self.w_scale, self.out_scale, self.out_bias, self.stride, self.pad,
                            self.folded_bn_name is not None, self.groups)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        got = state_dict.get(prefix + "qlayout")
        if got is not None and not torch.equal(got.cpu().long(), self.qlayout.cpu()):
            name = self.layer_name or prefix.rstrip(".")
            raise ValueError(f"{name}: the state holds {_describe(got)}, but this layer is "
                             f"{_describe(self.qlayout)}: load a state of the same architecture "
                             "and precisions")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check(self, x: object, shape_ok: bool, want: str) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{self.layer_name or self.kind}: x must be a floating-point "
                            f"tensor, got {got}")
        if not shape_ok:
            raise ValueError(f"{self.layer_name or self.kind}: x must be {want}, got "
                             f"{tuple(x.shape)}")
        return x

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.lowbit.quantize_activation(x, self.a_scale, str(self.a),
                                                    self.layer_name, self.nonfinite)

    def _dequantize(self, acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The real output in float64, returned as float32 (as float64 for a float64 input:
        the model run in float64 carries exact values between its integer layers)."""
        y = acc.double() * self.out_scale + self.out_bias
        return y if dtype == torch.float64 else y.float()

    def summary_row(self, name: str) -> LayerRow:
        return LayerRow(name, type(self).__name__, "integer", str(self.w), str(self.a),
                        None, float(self.a_scale), float(self.w_scale.min()),
                        float(self.w_scale.max()),
                        f"folded {self.folded_bn_name}" if self.folded_bn_name else "")

    def extra_repr(self) -> str:
        groups = f", groups={self.groups}" if self.groups != 1 else ""
        return (f"{self.kind}, w={self.w}, a={self.a}, a_scale={float(self.a_scale):.4g}, "
                f"folded_bn={self.folded_bn_name}{groups}")


class IntegerConv2d(_IntegerBase):
    """NCHW float in -> integer conv (NHWC/KRSC, lowbit::conv2d_int) -> NCHW float out."""

    kind = "conv2d"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.weight.shape[3] * self.groups
        x = self._check(x, isinstance(x, torch.Tensor) and x.dim() == 4 and x.shape[1] == c,
                        f"[N, {c}, H, W]")
        q = self._quantize(x).permute(0, 2, 3, 1).contiguous()
        acc = torch.ops.lowbit.conv2d_int(q, self.weight, str(self.w), str(self.a),
                                          self.stride, self.pad, self.groups)
        return self._dequantize(acc, x.dtype).permute(0, 3, 1, 2).contiguous()


class IntegerLinear(_IntegerBase):
    """[..., C] float in -> integer GEMM (lowbit::gemm_int) -> [..., K] float out."""

    kind = "linear"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.weight.shape[1]
        x = self._check(x, isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == c,
                        f"[..., {c}]")
        q = self._quantize(x).reshape(-1, c)
        acc = torch.ops.lowbit.gemm_int(q, self.weight, str(self.w), str(self.a))
        return self._dequantize(acc, x.dtype).reshape(*x.shape[:-1], self.weight.shape[0])


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _untrained(name: str, layer: nn.Module) -> str | None:
    """Why a mix layer never trained at its deployed precision (None if it did, or if it
    never trained at all: a calibrated model)."""
    aq = layer.act_quant
    steps = int(aq.observer.steps)
    if aq.mix is None or steps == 0 or int(aq.target_steps) > 0:
        return None
    return (f"{name}: {steps} QAT steps, none at its deployed {aq.bits} activation bits "
            f"(training precision now {aq.mix.bits_at(steps - 1)} bits, warm-up ends at step "
            f"{aq.mix.until})")


def convert(model: nn.Module, fold_bn: bool = True, *, allow_untrained: bool = False
            ) -> nn.Module:
    """Integer copy (eval mode) of a trained or calibrated fake-quant model: every QuantConv2d /
    QuantLinear becomes an IntegerConv2d / IntegerLinear, and (fold_bn) a BatchNorm that alone
    consumes a layer's output is folded into its dequantize and replaced by nn.Identity.

    ValueError (naming the layers and the numbers) for a layer without an activation range, a
    NaN / inf / vanishing scale or NaN / inf weights, and for a layer with a mix schedule that
    was trained but never at its deployed precision (`allow_untrained=True` converts it
    anyway)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for arg, v in (("fold_bn", fold_bn), ("allow_untrained", allow_untrained)):
        if not isinstance(v, bool):
            raise TypeError(f"{arg} must be a bool, got {v!r}")
    layers = quant_layers(model)
    if not layers:
        raise ValueError("model has no lowbit fake-quant layers: call lowbit.quantize first")
    for name, layer in layers:
        if int(layer.act_quant.observer.seen) == 0:
            raise ValueError(f"layer {name} has no activation range: train it (QAT) or run "
                             "lowbit.calibrate(model, loader) before convert")
    untrained = [why for name, layer in layers if (why := _untrained(name, layer))]
    if untrained and not allow_untrained:
        raise ValueError("never trained at the deployed precision: " + "; ".join(untrained)
                         + ". Train longer (or give quantize(train_steps=...) the real "
                         "length), or pass allow_untrained=True to convert anyway")
    model = copy.deepcopy(model).eval()
    pairs = batchnorm_pairs(model) if fold_bn else {}
    mods = dict(model.named_modules())
    for name, layer in quant_layers(model):
        bn_name = pairs.get(name)
        spec = integer_layer(layer, mods[bn_name] if bn_name else None)
        cls = IntegerConv2d if spec.kind == "conv2d" else IntegerLinear
        _set_module(model, name, cls(spec, name, layer.act_quant.nonfinite, bn_name))
        if bn_name is not None:
            _set_module(model, bn_name, nn.Identity())
    return model


def integer_layers(model: nn.Module) -> dict[str, IntegerLayer]:
    """{name: IntegerLayer} of a converted model (weights, scales, workloads for the kernels)."""
    return {n: m.spec for n, m in model.named_modules() if isinstance(m, _IntegerBase)}


def integer_modules(model: nn.Module) -> dict[str, IntegerConv2d | IntegerLinear]:
    """{name: module} of a converted model's integer layers."""
    return {n: m for n, m in model.named_modules() if isinstance(m, _IntegerBase)}
