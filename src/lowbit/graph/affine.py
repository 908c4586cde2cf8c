"""Realizations of affine values (`lowbit.graph.planner`'s `Planner` mixes them in): an eval
BatchNorm that folds into no layer, y = a[c] x + b[c] (`node_forms.batchnorm_affine`), as a
per-channel integer requantization of its input (a `ChannelAffine` step).

What the fake-quant model computes (DenseNet: BN -> ReLU -> conv on the concatenation of
every earlier feature map, the transitions' BN -> ReLU -> conv, norm5 -> ReLU -> pool ->
classifier): the BatchNorm in float32 on float values (conv outputs, pools of them, their
concatenation), then the ReLU, then its reader's quantizer (the next conv's input quantizer,
or the pool's wide reading). The plan reads the BatchNorm's input as the model holds it, part
by part of a concatenation, each at its own realization: a model quantizer's value (`QUANT`)
at its own precision and scale (exact); any other value wide (`Planner.wide`: 24-bit by
default, the residual adds' reading of a float value), so a feature map is realized once
however many BatchNorms read it and no concatenation is copied at a common scale. The step
then computes, per channel c of part i (scale s_i) and the reader's scale s_out,

    q = clamp(floor((x m[c] + b'[c] + 2^(s-1)) / 2^s), lo, qmax),
    m[c] ~ a[c] s_i / s_out 2^s (of a's sign), b'[c] = round(b[c] / s_out 2^s),

the layer epilogue's fixed point (`requant.shared_shift`) with the ReLU as the clamp's
floor: the model's affine to 2^-30 of a step over the input's range. A bit-serial reader
takes bit planes from the step directly where every part but the last fills whole 32-channel
words, else the step writes one value per byte and a Lookup (identity table) writes the
planes. Float readers run the BatchNorm in float (a FloatFallback, fp16), binary ones too
(then quantized); a channel whose multiplier has no fixed point (a / s_out ratio >= 2^30)
makes the BatchNorm float (`fallbacks.Unrealizable`).
"""

from __future__ import annotations

import torch

from ..core import Encoding, Layout
from ..quant.quantize import round_half_up
from ..reference.affine import check_affine_sum
from .dataflow import CONCAT, Value
from .fallbacks import Unrealizable
from .ir import ChannelAffine, Lookup
from .node_forms import batchnorm_affine
from .reads import Req
from .requant import shared_shift
from .shapes import nhwc_columns

#: a channel whose input moves its output by less than this many output steps over the
#: input's whole range is the constant b / s_out (multiplier 0)
NEGLIGIBLE_STEPS = 2.0**-30


def affine_parts(x: Value) -> list[Value]:
    """The values whose channels a BatchNorm's input concatenates (itself if no concat)."""
    if x.op != CONCAT:
        return [x]
    return [p for i in x.inputs for p in affine_parts(i)]


class AffineRealizations:
    """The `Planner` method realizing AFFINE values (module docstring)."""

    def _affine(self, v: Value, req: Req, relu: bool) -> str:
        binary = not req.is_float and req.precision.encoding is Encoding.BINARY
        if req.is_float or binary:
            if binary:
                v.attrs["reason"] = "a BatchNorm read by a binary (-1/+1) layer"
            return self._through_float(v, req, relu, v.attrs["reason"])
        parts = affine_parts(v.inputs[0])
        widths = [self.shapes[id(p)][1] for p in parts]
        shape = self.shapes[id(v)]
        if req.layout is Layout.BITPLANE and any(w % 32 for w in widths[:-1]):
            src = self.realize(v, Req(req.precision, req.scale, Layout.INT8), relu)
            out = self._tensor(v, req, shape, relu)
            p = req.precision
            key = self._param(f"identity.{p}.table", torch.arange(p.qmin, p.qmax + 1))
            self._emit(v.index + 0.5, Lookup(f"lookup.{out}", src, out, key))
            return out
        reads = [self.residual_req(p) for p in parts]
        names = tuple(self.realize(p, r) for p, r in zip(parts, reads, strict=True))
        out = self._tensor(v, req, shape, relu)
        m, b, s = self._affine_params(v, reads, widths, req)
        self._emit(v.index, ChannelAffine(
            f"affine.{out}", names, out, self._param(f"{out}.multiplier", m),
            self._param(f"{out}.bias", b), self._param(f"{out}.shift", s), relu))
        return out

    def _affine_params(self, v: Value, reads: list[Req], widths: list[int], req: Req
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(multiplier, bias, shift) int64 per channel (module docstring)."""
        a, b = batchnorm_affine(v.attrs["module"])
        segments = self.flat_from[id(v.inputs[0])]
        if segments and any(h * w > 1 for _, h, w in segments):  # NHWC flatten order
            a, b = nhwc_columns(torch.stack([a, b]), segments)
        scale = torch.cat([torch.full((w,), r.scale, dtype=torch.float64)
                           for r, w in zip(reads, widths, strict=True)])
        top = [max(-r.precision.qmin, r.precision.qmax)
               for r, w in zip(reads, widths, strict=True) for _ in range(w)]
        ratio = a * scale / req.scale
        beta = b / req.scale
        top_t = torch.tensor(top, dtype=torch.float64)
        constant = ratio.abs() * top_t < NEGLIGIBLE_STEPS
        what = f"BatchNorm {v.attrs['op']}"
        try:
            m, _, s = shared_shift(torch.where(constant, 1.0, ratio.abs()), None,
                                   top_t * ratio.abs() + beta.abs(), sum_bits=62)
            m = torch.where(constant, 0, m) * torch.where(ratio < 0, -1, 1)
            bias = round_half_up(beta * torch.pow(2.0, s.double()))
            if bool((bias.abs() >= 2.0**62).any()):
                raise ValueError("the bias is out of range (>= 2^62 at its shift)")
            bias = bias.to(torch.int64)
            check_affine_sum(top, m, bias, s)
        except ValueError as e:
            raise Unrealizable(v, f"{what}: no fixed-point requantization from its input's "
                                  f"scales to its reader's ({e})") from None
        return m, bias, s
