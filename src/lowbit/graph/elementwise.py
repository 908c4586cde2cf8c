"""Realizations of elementwise values (`lowbit.graph.planner`'s `Planner` mixes them in):
clamps, activation functions, products and channel selections.

- A clamp (ReLU6, Hardtanh, `torch.clamp` with constant bounds) of any value is exact as an
  integer clamp of the value's realization, since rounding is monotone:
  clamp(round(y / s)) with the bounds' levels rounded the same way (in float32, as the
  consumer's quantizer rounds them) equals round(clamp(y) / s). A clamp at 0 is the
  realization's ReLU; an upper level below the precision's top is a derived realization
  whose table clamps (`Via`: written by the producing layer's epilogue, or a `Lookup`). A
  wide reader of a clamp at 0 gets a scale at which the top bound is the range's top (no
  table: wide tables do not exist).
- A function of a value the model quantizes itself (`QUANT`: an activation's input
  quantizer, `lowbit.quant.residual`), an activation (hardswish, SiLU, sigmoid, GELU, ...)
  or a clamp of it, is a table over the quantizer's at most 256 values: the consumer's
  quantizer applied to the function of each dequantized value, in float32 as the fake-quant
  model computes it; the product of two such values is a two-dimensional table
  (`TableMul`: squeeze-excite's channel scale, or `x * sigmoid(x)` on one quantizer: a
  one-dimensional table).
- A channel selection (chunk, split, a channel shuffle) commutes with every elementwise
  realization: the input is realized as the consumer reads it, then `Gather`ed.
- Anything else (an activation of a value the model does not quantize, a product of float
  values) runs in float (`FloatFallback`, fp16), with its reason.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core import Encoding, Precision, WidePrecision
from ..quant.quantize import dequantize, round_half_up
from .dataflow import ACT, QUANT, RELU, Value
from .ir import FloatFallback, Gather, Lookup, Quantize, TableMul
from .reads import Req, Via

#: the most values of a quantizer whose functions are tables (one byte)
TABLE_BITS = 8


def levels(x: torch.Tensor, scale: float, prec: Precision | WidePrecision) -> torch.Tensor:
    """The quantizer `prec` at `scale` applied to float32 values x, as int64:
    clamp(floor(x / scale + 0.5), qmin, qmax) in float32 (`lowbit.quant.quantize`'s
    formula; binary: +1 for x >= 0 else -1)."""
    x = x.float()
    if prec.encoding is Encoding.BINARY:
        return torch.where(x >= 0, 1, -1).to(torch.int64)
    q = round_half_up(x / torch.tensor(scale, dtype=torch.float32))
    return q.clamp(prec.qmin, prec.qmax).to(torch.int64)


def _narrow(p: object) -> bool:
    return isinstance(p, Precision) and p.bits <= TABLE_BITS and \
        p.encoding is not Encoding.BINARY


class _Clamp(torch.nn.Module):
    def __init__(self, lo: float | None, hi: float | None) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.lo, self.hi)


class ElementwiseRealizations:
    """The `Planner` methods realizing ACT, MUL and GATHER values (module docstring)."""

    # ------------------------------------------------------------------ functions of Q
    def quant_function(self, u: Value) -> tuple[Value, Callable] | None:
        """(Q, g) where value u is g(Q) for a narrow quantizer value Q of the model (g on the
        dequantized float32 values, as the model computes it), else None."""
        if u.op == QUANT and _narrow(u.attrs["precision"]):
            return u, lambda d: d
        if u.op in (ACT, RELU) and u.inputs[0].op == QUANT and \
                _narrow(u.inputs[0].attrs["precision"]):
            if u.op == RELU:
                return u.inputs[0], torch.relu
            module = _Clamp(u.attrs["lo"], u.attrs["hi"]) if u.attrs["kind"] == "clamp" \
                else u.attrs["module"]
            return u.inputs[0], lambda d: module(d.clone())
        return None

    def _reading(self, y: torch.Tensor, req, relu: bool) -> torch.Tensor:
        """req's integer reading of float32 values y (relu first; a derived req: its mid's
        quantizer, then its table)."""
        y = torch.relu(y) if relu else y
        if req.via is None:
            return levels(y, req.scale, req.precision)
        mid = levels(y, req.via.scale, req.via.precision)
        return self.params[req.via.table][mid - req.via.precision.qmin]

    def _function_table(self, key: str, q: Value, g: Callable, req, relu: bool) -> str:
        """Params key of the table of req's reading of g over every value of quantizer q."""
        if key not in self.params:
            p, s = q.attrs["precision"], q.attrs["scale"]
            d = dequantize(torch.arange(p.qmin, p.qmax + 1), torch.tensor(s))
            with torch.no_grad():
                self._param(key, self._reading(g(d).float(), req, relu))
        return key

    def _of_quant(self, v: Value, q: Value, g: Callable, req, relu: bool) -> str:
        """v = g(q) as req reads it: q's input realized at q's own precision and scale, then
        a table (derived: the producer's epilogue writes it, or a Lookup)."""
        key = _table_key(v, req, relu)
        table = self._function_table(key, q, g, req, relu)
        via = Via(q.attrs["precision"], q.attrs["scale"], table)
        return self.realize(q.inputs[0], Req(req.precision, req.scale, req.layout, via))

    def _through_float(self, v: Value, req, relu: bool, reason: str) -> str:
        """v run in float (`FloatFallback`), quantized by a Quantize step where req is not
        float."""
        v.attrs.setdefault("reason", reason)
        if req.via is not None:  # the mid value, then the table
            src = self.realize(v, req.mid(), relu)
            out = self._tensor(v, req, self.shapes[id(v)], relu)
            self._emit(v.index + 0.75, Lookup(f"lookup.{out}", src, out, req.via.table))
            return out
        src = self._fallback(v)
        if req.is_float and not relu:
            return src
        shape = self.shapes[id(v)]
        if req.is_float:
            return self._float_relu(v, src, shape)
        out = self._tensor(v, req, shape, relu)
        self._emit(v.index + 0.5, Quantize(f"quantize.{out}", src, out, relu))
        return out

    # ------------------------------------------------------------------ act
    def _act(self, v: Value, req, relu: bool) -> str:
        binary = not req.is_float and req.precision.encoding is Encoding.BINARY
        if (f := self.quant_function(v)) is not None and not req.is_float and not binary:
            return self._of_quant(v, *f, req, relu)
        if v.attrs["kind"] == "clamp" and not binary:
            return self._clamp(v, req, relu)
        what = v.attrs["op"]
        return self._through_float(v, req, relu, f"{what}: its input is not quantized in the "
                                   "model (no quantized conv / linear before it, or "
                                   "activation_bits=None)" if v.inputs[0].op != QUANT else
                                   f"{what} of a value read in float")

    def _clamp(self, v: Value, req, relu: bool) -> str:
        """clamp(x, lo, hi) as req reads it (module docstring)."""
        x, lo, hi = v.inputs[0], v.attrs["lo"], v.attrs["hi"]
        if relu:
            lo, hi = max(lo or 0.0, 0.0), None if hi is None else max(hi, 0.0)
        if req.is_float:
            src = self.realize(x, req)
            key = (id(v), "clamped", lo, hi)
            if key not in self.memo:
                out = self._tensor(v, req, self.shapes[id(v)], relu)
                name = f"{v.name}.clamp"
                self.modules[name] = _Clamp(lo, hi)
                self._emit(v.index + 0.25, FloatFallback(f"float.{out}", (src,), out, name,
                                                         "clamp", "clamp of a float tensor"))
                self.memo[key] = out
            return self.memo[key]
        at = req.mid()  # a derived req: the clamp applies to the mid value
        p, s = at.precision, at.scale
        floor = lo is not None and lo >= 0  # the realization's own ReLU clamp
        bottom = max(p.qmin, 0) if floor else p.qmin
        lo_q = bottom if lo is None else int(levels(torch.tensor(lo), s, p))
        hi_q = p.qmax if hi is None else int(levels(torch.tensor(hi), s, p))
        if lo_q <= bottom and hi_q >= p.qmax:
            return self.realize(x, req, floor)
        if not _narrow(p):  # a wide reader of a clamp not at 0: no table of it
            return self._through_float(v, req, relu, "a wide reading of a clamp not at 0")
        key = f"{v.name}.clamp.{p}.{s!r}.{lo_q}.{hi_q}" + (f".{req.via.table}" if req.via
                                                           else "") + ".table"
        if key not in self.params:
            t = torch.arange(p.qmin, p.qmax + 1).clamp(lo_q, hi_q)
            if req.via is not None:
                t = self.params[req.via.table][t - p.qmin]
            self._param(key, t)
        via = Via(p, s, key)
        return self.realize(x, Req(req.precision, req.scale, req.layout, via), floor)

    def clamp_top(self, v: Value) -> float | None:
        """The top bound of a clamp at 0 (ReLU6), whose wide reading takes it as its range's
        top (module docstring), else None."""
        if v.op == ACT and v.attrs["kind"] == "clamp" and v.attrs["lo"] == 0.0 and \
                v.attrs["hi"] is not None and v.attrs["hi"] > 0:
            return float(v.attrs["hi"])
        return None

    # ------------------------------------------------------------------ mul
    def _mul(self, v: Value, req, relu: bool) -> str:
        a, b = v.inputs
        sa, sb, shape = self.shapes[id(a)], self.shapes[id(b)], self.shapes[id(v)]
        fa, fb = self.quant_function(a), self.quant_function(b)
        binary = not req.is_float and req.precision.encoding is Encoding.BINARY
        if req.is_float or binary or fa is None or fb is None:
            which = [u.attrs.get("op", u.name) for u, f in ((a, fa), (b, fb)) if f is None]
            return self._through_float(v, req, relu, (
                f"product of values not quantized in the model ({'; '.join(which)})" if which
                else "a float reading of a product"))
        if fa[0] is fb[0] and sa == sb:  # x * f(x): one table over the quantizer
            ga, gb = fa[1], fb[1]
            return self._of_quant(v, fa[0], lambda d: ga(d) * gb(d), req, relu)
        if sb != shape:  # the broadcast operand first
            (a, fa, sa), (b, fb, sb) = (b, fb, sb), (a, fa, sa)
        if sb != shape or not (sa == shape or (len(sa) == 4 and sa[2:] == (1, 1)
                                               and sa[:2] == shape[:2])):
            return self._through_float(v, req, relu, f"product of shapes {sa} and {sb} (a "
                                       "map times a per-channel scale or a map of its shape)")
        qa, ga = fa
        qb, gb = fb
        ta = self.realize(qa, self.own(qa))
        tb = self.realize(qb, self.own(qb))
        key = _table_key(v, req, relu)
        if key not in self.params:
            pa, pb = qa.attrs["precision"], qb.attrs["precision"]
            da = dequantize(torch.arange(pa.qmin, pa.qmax + 1), torch.tensor(qa.attrs["scale"]))
            db = dequantize(torch.arange(pb.qmin, pb.qmax + 1), torch.tensor(qb.attrs["scale"]))
            with torch.no_grad():
                y = ga(da).float()[:, None] * gb(db).float()[None, :]
            self._param(key, self._reading(y, req, relu).reshape(-1))
        out = self._tensor(v, req, shape, relu)
        self._emit(v.index, TableMul(f"mul.{out}", ta, tb, out, key))
        return out

    # ------------------------------------------------------------------ gather
    def _gather(self, v: Value, req, relu: bool) -> str:
        src = self.realize(v.inputs[0], req, relu)
        out = self._tensor(v, req, self.shapes[id(v)], relu)
        key = f"{v.name}.index"
        if key not in self.params:
            self._param(key, torch.tensor(v.attrs["index"], dtype=torch.int64))
        self._emit(v.index, Gather(f"gather.{out}", src, out, key))
        return out


def _table_key(v: Value, req, relu: bool) -> str:
    via = f".via.{req.via.table}" if req.via is not None else ""
    return f"{v.name}.{req.precision}.{req.scale!r}{'.relu' if relu else ''}{via}.table"


def gather_shape(v: Value, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a channel selection of a value of `shape`."""
    return (shape[0], len(v.attrs["index"]), *shape[2:])


def mul_shape(v: Value, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast shape of a product."""
    return tuple(torch.broadcast_shapes(a, b))
