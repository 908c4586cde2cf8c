"""Value graph + input shape -> Plan: shapes, implementations, realizations and parameters.

Realizations (the engine contract): every consumer names what it reads, and the
producer writes exactly that. A layer reads its input at its activation quantizer's precision
and scale, as bit planes when it runs bit-serially, else one value per byte; a residual add,
an average pool and a BatchNorm that folds into no layer (`affine`, part by part of a
concatenation) read a "wide" realization: by default signed 24-bit (int32 storage,
`WidePrecision`) at scale 2 max|v| / (2^23 - 1) or coarser for a residual (`Planner.wide`),
16-bit likewise, or with wide_bits=8 a u8 (a ReLU output) / s8 at max|v| / qmax,
max|v| from the example input; FloatFallback steps and the output read
float. ReLU fuses into the realization (clamp at 0), max-pools and element-copying average
pools push through it (they commute with monotone requantization), flatten is a view, so a
layer's epilogue writes its consumers' tensors directly; a layer whose every output is
max-pooled by one window fuses the pool. Binary (1-bit signed) consumers of a layer read a
float output quantized by a Quantize step (the epilogue has no sign output).

Biases: each requantized output carries the layer's (BN-folded) bias at its own shift,
round(out_bias / s_o 2^s), exact to 2^-s of an output step (exact_bias, default); with
exact_bias=False it is the bias rounded to accumulator units times the multiplier,
which flips outputs of coarse low-bit layers near rounding boundaries (half an accumulator
unit). Either way a layer with one requantized output (no pool) runs its kernel's fused
epilogue where the implementation takes its bias (`kernel_epilogues.kernel_epilogue`: the
shifted bias itself, `Epilogue.shifted_bias`, or the accumulator-unit one) and its wide
residual, if any (`Epilogue.residual`, where the 64-bit sum provably fits).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

import torch

from ..core import (
    ConvWorkload,
    Encoding,
    GemmWorkload,
    Layout,
    Precision,
)
from ..kernels.base import acc_bound
from ..quant.quantize import dequantize, quantize, round_half_up
from ..reference import avgpool_multiplier, fixed_point_pair
from ..reference.netops import uint8_input_table
from .affine import AffineRealizations
from .chooser import Chooser, make_chooser
from .dataflow import (
    ACT,
    AFFINE,
    AVGPOOL,
    CONCAT,
    FLATTEN,
    FLOAT,
    GATHER,
    INPUT,
    LAYER,
    MAXPOOL,
    MUL,
    QUANT,
    RELU,
    Dataflow,
    Value,
)
from .elementwise import ElementwiseRealizations
from .fallbacks import Unrealizable, half_precision, make_float
from .impl import (
    TORCH_FP16,
    ImplChooser,
    choose_int8_impl,
    input_layout,
)
from .ir import (
    WIDE_BITS,
    AvgPool,
    Concat,
    Flatten,
    FloatFallback,
    Layer,
    LayerOutput,
    Lookup,
    MaxPool,
    Output,
    Plan,
    Quantize,
    Step,
    TensorSpec,
    WidePrecision,
)
from .kernel_epilogues import kernel_epilogue
from .launches import PlanOptions, decide_launches, fuse_maxpools
from .pools import single_element_windows, window_counts
from .reads import FLOAT_REQ, Req, Via
from .requant import (
    MIN_MULTIPLIER_BITS,
    NARROW_MULTIPLIER_BITS,
    REQUANT32_SUM_BITS,
    block_end_shift,
    reduced,
    shared_shift,
)
from .shapes import avg_args, infer_shapes, nhwc, nhwc_columns

U8, S8 = Precision(8), Precision(8, Encoding.SIGNED)
_TINY = 1e-8
#: 16-bit wide realizations cover this multiple of the example input's range (values past
#: the range clamp; 2x still leaves 2^14 levels over it)
WIDE_HEADROOM = 2.0




@dataclass(eq=False)
class _LayerState:
    spec: object
    workload: ConvWorkload | GemmWorkload
    impl: str
    reason: str
    weight: torch.Tensor
    input: str = ""
    residual: str | None = None
    residual_scale: float | None = None
    #: the residual is a model quantizer's value (`lowbit.quant.residual`), not a wide one
    narrow: bool = False
    outputs: list[tuple[Req, bool, str]] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)


class Planner(ElementwiseRealizations, AffineRealizations):
    """Builds one Plan; see `build_plan`."""

    def __init__(self, df: Dataflow, input_shape: tuple[int, ...],
                 chooser: Chooser | ImplChooser | str | None = None, wide_bits: int = 24,
                 exact_bias: bool = True, options: PlanOptions | None = None,
                 image_normalization: tuple | None = None) -> None:
        if wide_bits not in (8, *WIDE_BITS):
            raise ValueError(f"wide_bits must be one of {(8, *WIDE_BITS)}, got {wide_bits!r}")
        self.df, self.wide_bits = df, wide_bits
        self.chooser = make_chooser(chooser, records=None) if not isinstance(
            chooser, Chooser) else chooser
        self.options = options or PlanOptions()
        self.image_normalization = image_normalization
        self.exact_bias = exact_bias
        self.tensors: dict[str, TensorSpec] = {}
        self.params: dict[str, torch.Tensor] = {}
        self.modules: dict[str, torch.nn.Module] = {}
        self.steps: list[tuple[float, int, Step]] = []
        self.memo: dict[tuple[int, Req, bool], str] = {}
        self.layers: dict[int, _LayerState] = {}
        self.input_name = "input"
        self.tensors["input"] = TensorSpec("input", input_shape)
        self.shapes, self.flat_from = infer_shapes(df, tuple(input_shape))

    # ------------------------------------------------------------------ helpers
    def _emit(self, key: float, step: Step) -> None:
        self.steps.append((key, len(self.steps), step))

    def _tensor(self, v: Value, req: Req, shape: tuple[int, ...], relu: bool) -> str:
        base = f"{v.name}.{req.tag}" + (".relu" if relu else "")
        name, i = base, 1
        while name in self.tensors:
            i += 1
            name = f"{base}.{i}"
        if req.is_float:
            self.tensors[name] = TensorSpec(name, shape)
        else:
            self.tensors[name] = TensorSpec(name, nhwc(shape), req.precision, req.scale,
                                            req.layout)
        return name

    def _param(self, key: str, t: torch.Tensor) -> str:
        self.params[key] = t.contiguous()
        return key

    def nonneg(self, v: Value) -> bool:
        """Whether the value is >= 0 by construction (a ReLU output, or pooled / flattened /
        concatenated ones)."""
        if v.op == RELU or (v.op == ACT and v.attrs["kind"] == "clamp" and
                            v.attrs["lo"] is not None and v.attrs["lo"] >= 0):
            return True
        if v.op == GATHER:
            return self.nonneg(v.inputs[0])
        if v.op == QUANT:
            return v.attrs["precision"].qmin >= 0 or self.nonneg(v.inputs[0])
        if v.op in (MAXPOOL, AVGPOOL, FLATTEN, CONCAT):
            return all(self.nonneg(i) for i in v.inputs)
        return False

    def wide(self, v: Value) -> Req:
        """The wide realization of v (module docstring), from the example input's range:
        wide_bits 16 / 24 signed at WIDE_HEADROOM x max|v| / qmax, wide_bits 8 u8 / s8 one
        value per byte at max / qmax."""
        stat = self.df.stats[v.fx_name]
        clamp_top = self.clamp_top(v)  # a ReLU6's top is the range's (no clamp table)
        if self.wide_bits in WIDE_BITS:
            prec = WidePrecision(self.wide_bits)
            if clamp_top is not None:
                return Req(prec, clamp_top / (prec.qmax + 0.75), Layout.INT8)
            return Req(prec, max(stat.absmax * WIDE_HEADROOM, _TINY) / prec.qmax, Layout.INT8)
        prec = U8 if self.nonneg(v) else S8
        top = stat.hi if prec is U8 else stat.absmax
        if clamp_top is not None:
            return Req(prec, clamp_top / (prec.qmax + 0.25), Layout.INT8)
        return Req(prec, max(top, _TINY) / prec.qmax, Layout.INT8)

    @staticmethod
    def own(v: Value) -> Req:
        """A model quantizer's value (`QUANT`) at its own precision and scale, one value per
        element (one byte up to 8 bits, int16 at 16)."""
        return Req(v.attrs["precision"], v.attrs["scale"], Layout.INT8)

    def residual_req(self, v: Value) -> Req:
        """What a residual add or an average pool reads of `v`: the model's own quantized
        value where a residual quantizer made it (narrow and exact), else the wide one."""
        return self.own(v) if v.op == QUANT else self.wide(v)

    def _table(self, v: Value, req: Req) -> str:
        """Params key of the table taking each value of the quantizer `v` (its own precision
        and scale) to `req`'s reading of it: the consumer's quantizer on the dequantized value
        in float32, as the fake-quant model computes it."""
        own = self.own(v)
        p = own.precision
        key = f"{v.name}.as.{req.precision}.{req.scale!r}.table"
        if key not in self.params:
            q = torch.arange(p.qmin, p.qmax + 1, dtype=torch.float32)
            x = dequantize(q, torch.tensor(own.scale, dtype=torch.float32))
            t = quantize(x, torch.tensor(req.scale, dtype=torch.float32), req.precision)
            self._param(key, t.to(torch.int64))
        return key

    # ------------------------------------------------------------------ realizations
    def realize(self, v: Value, req: Req, relu: bool = False) -> str:
        """Name of the tensor holding relu?(v) as `req` describes, emitting what makes it."""
        key = (id(v), req, relu)
        if key not in self.memo:
            self.memo[key] = self._make(v, req, relu)
        return self.memo[key]

    def _make(self, v: Value, req: Req, relu: bool) -> str:
        shape = self.shapes[id(v)]
        binary = not req.is_float and req.precision.encoding is Encoding.BINARY
        if v.op == RELU:
            return self.realize(v.inputs[0], req, True)
        if v.op == QUANT:
            return self._quant(v, req, relu, shape)
        if v.op == ACT:
            return self._act(v, req, relu)
        if v.op == MUL:
            return self._mul(v, req, relu)
        if req.via is not None and (v.op not in (LAYER, MAXPOOL, FLATTEN, CONCAT, GATHER)
                                    or isinstance(req.via.precision, WidePrecision)):
            src = self.realize(v, req.mid(), relu)  # then the table, as a step of its own
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index + 0.5, Lookup(f"lookup.{out}", src, out, req.via.table))
            return out
        if v.op == AFFINE:
            return self._affine(v, req, relu)
        if v.op in (INPUT, FLOAT) or (v.op == LAYER and binary):
            src = self.input_name if v.op == INPUT else (
                self._fallback(v) if v.op == FLOAT else self.realize(v, FLOAT_REQ, relu))
            if v.op == INPUT and self.image_normalization is not None:
                return self._image(req, relu, shape)
            if req.is_float and not relu:
                return src
            if req.is_float:  # a ReLU of a float value
                return self._float_relu(v, src, shape)
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index + 0.5, Quantize(f"quantize.{out}", src, out, relu))
            return out
        if v.op == LAYER:
            state = self._layer(v)
            out = self._tensor(v, req, shape, relu)
            state.outputs.append((req, relu, out))
            return out
        if v.op == MAXPOOL:
            src = self.realize(v.inputs[0], req, relu)
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index, MaxPool(f"maxpool.{out}", src, out, v.attrs["window"]))
            return out
        if v.op == AVGPOOL:
            return self._avgpool(v, req, relu, shape)
        if v.op == FLATTEN:
            src = self.realize(v.inputs[0], req, relu)
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index, Flatten(f"flatten.{out}", src, out))
            return out
        if v.op == GATHER:
            return self._gather(v, req, relu)
        if v.op == CONCAT:
            parts = tuple(self.realize(p, req, relu) for p in v.inputs)
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index, Concat(f"concat.{out}", parts, out))
            return out
        raise AssertionError(f"unknown value op {v.op}")

    def _image(self, req: Req, relu: bool, shape: tuple[int, ...]) -> str:
        """A uint8 image as `req` reads it: quantized by lookup (the normalization and the
        reader's quantizer in one table per channel, `reference.uint8_input_table`)."""
        if req.is_float:
            raise ValueError("a uint8 image can only be read by quantized layers: a float "
                             "step reads the model's input (compile without uint8_input)")
        mean, std = self.image_normalization
        table = uint8_input_table(req.scale, req.precision, mean, std)
        key = f"input.{req.precision}.{req.scale!r}" + (".relu" if relu else "") + ".table"
        self._param(key, table.clamp_min(0) if relu else table)
        out = self._tensor(self.df.input, req, shape, relu)
        self._emit(0.5, Quantize(f"quantize.{out}", self.input_name, out, relu, key))
        return out

    def _quant(self, v: Value, req: Req, relu: bool, shape: tuple[int, ...]) -> str:
        """A residual quantizer's value (`lowbit.quant.residual`) as `req` reads it: its own
        precision and scale exactly (the producer's epilogue writes the quantized value), any
        other quantized reading derived from that value by a table, float readers through a
        dequantize."""
        own, x = self.own(v), v.inputs[0]
        if req.is_float:
            src = self.realize(v, own, relu)
            key = (id(v), "dequantized", relu)
            if key not in self.memo:
                out = self._tensor(v, FLOAT_REQ, shape, relu)
                self.modules[f"{v.name}.dequantize"] = torch.nn.Identity()
                self._emit(v.index + 0.5, FloatFallback(
                    f"float.{out}", (src,), out, f"{v.name}.dequantize", "dequantize",
                    "a float reader of a quantized value"))
                self.memo[key] = out
            return self.memo[key]
        if req.via is not None:  # a reading of a reading: one table from our own values
            raise ValueError(f"{v.name}: a residual quantizer read through another one's "
                             "table is not supported")
        if (req.precision, req.scale) == (own.precision, own.scale):
            return self.realize(x, Req(own.precision, own.scale, req.layout), relu)
        via = Via(own.precision, own.scale, self._table(v, req))
        return self.realize(x, Req(req.precision, req.scale, req.layout, via), relu)

    def _fallback(self, v: Value) -> str:
        key = (id(v), None, False)
        if key not in self.memo:
            args = tuple(self.realize(i, FLOAT_REQ) for i in v.inputs)
            out = self._tensor(v, FLOAT_REQ, self.shapes[id(v)], False)
            self.modules[v.name] = half_precision(v.attrs["module"])
            self._emit(v.index, FloatFallback(f"float.{v.name}", args, out, v.name,
                                              v.attrs["op"], v.attrs["reason"]))
            self.memo[key] = out
        return self.memo[key]

    def _float_relu(self, v: Value, src: str, shape: tuple[int, ...]) -> str:
        out = self._tensor(v, FLOAT_REQ, shape, True)
        key = f"{v.name}.relu"
        self.modules[key] = torch.nn.ReLU()
        self._emit(v.index + 0.25, FloatFallback(f"float.{out}", (src,), out, key, "relu",
                                                 "ReLU of a float tensor"))
        return out

    def _avgpool(self, v: Value, req: Req, relu: bool, shape: tuple[int, ...]) -> str:
        x = v.inputs[0]
        _, _, h, w = self.shapes[id(x)]
        args = avg_args(v, h, w)
        copies = single_element_windows(h, w, **args)
        if copies and (h, w) == shape[2:]:
            return self.realize(x, req, relu)  # the identity (adaptive to the same size)
        if not req.is_float and req.precision.encoding is Encoding.BINARY:
            src = self.realize(v, FLOAT_REQ, relu)
            out = self._tensor(v, req, shape, relu)
            self._emit(v.index + 0.5, Quantize(f"quantize.{out}", src, out, False))
            return out
        counts = window_counts(h, w, **args)
        m = s = None
        if copies:  # element copies commute with ReLU and requantization: q_out = q_in
            src = self.realize(x, req, relu)
            out = self._tensor(v, req, shape, relu)
            if not req.is_float:  # m * 2^-s = 1 exactly
                m = self._param(f"{out}.multiplier", torch.tensor([2**30], dtype=torch.int64))
                s = self._param(f"{out}.shift", torch.tensor([30], dtype=torch.int64))
        elif req.is_float:
            src = self.realize(x, FLOAT_REQ)
            out = self._tensor(v, req, shape, relu)
        else:
            wide = self._pool_input(v, x, max(counts))
            src = self.realize(x, wide)
            out = self._tensor(v, req, shape, relu)
            try:
                pairs = [avgpool_multiplier(c, wide.scale, req.scale) for c in counts]
            except ValueError as e:
                raise Unrealizable(v, f"average pool {v.name}: no fixed-point multiplier from "
                                      f"its input's scale to its output's ({e})") from None
            m = self._param(f"{out}.multiplier", torch.stack([p[0] for p in pairs]))
            s = self._param(f"{out}.shift", torch.stack([p[1] for p in pairs]))
        self._emit(v.index, AvgPool(f"avgpool.{out}", src, out, args["mode"], args.get("kernel"),
                                    args.get("stride"), args.get("pad", 0),
                                    args.get("output_hw"), counts, m, s, relu and not copies))
        return out

    def _pool_input(self, v: Value, x: Value, count: int) -> Req:
        """What an average pool of windows of up to `count` elements reads of x: its wide
        realization, narrowed to 16 bits where a window's sum could pass int32 (a global pool
        of a large map), Unrealizable where even that could."""
        wide = self.residual_req(x)
        if max(-wide.precision.qmin, wide.precision.qmax) * count < 2**31:
            return wide
        narrow = WidePrecision(16)
        if 2**15 * count >= 2**31 or not isinstance(wide.precision, WidePrecision):
            raise Unrealizable(v, f"average pool {v.name}: windows of {count} values whose "
                                  "sum could pass int32")
        top = wide.scale * wide.precision.qmax
        return Req(narrow, top / narrow.qmax, Layout.INT8)

    # ------------------------------------------------------------------ layers
    def _layer(self, v: Value) -> _LayerState:
        if id(v) in self.layers:
            return self.layers[id(v)]
        spec, x = v.attrs["spec"], v.inputs[0]
        xs = self.shapes[id(x)]
        weight = spec.weight
        fused = ["bn"] if spec.folded_bn else []
        segments = [seg for seg in self.flat_from[id(x)] or () if seg[1] * seg[2] > 1]
        if spec.kind == "conv2d":
            n, c, h, w = xs
            k, r, s, _ = weight.shape
            wl = ConvWorkload(N=n, H=h, W=w, C=c, K=k, R=r, S=s, stride=spec.stride,
                              pad=spec.pad, w=spec.w, a=spec.a, groups=spec.groups)
        else:
            if segments:  # NCHW flatten order -> (h, w, c), segment by segment
                weight = nhwc_columns(weight, self.flat_from[id(x)])
                fused.append("flatten-permute")
            wl = GemmWorkload(M=xs[0], N=weight.shape[0], K=xs[1], w=spec.w, a=spec.a)
        impl, reason = self.chooser.implementation(wl)
        odd = [seg for seg in segments if seg[0] % 32]
        if input_layout(impl) is Layout.BITPLANE and odd:
            c, h, w = odd[0]
            impl, reason = choose_int8_impl(wl, f"its input is a flattened {h}x{w} map of {c} "
                                                "channels (not a multiple of 32): bit planes "
                                                "would need a re-layout")
        layout = input_layout(impl)
        if v.attrs.get("negated"):
            fused.append(f"negated-channels:{v.attrs['negated']}")
        state = _LayerState(spec, wl.replace(a_layout=layout, w_layout=layout), impl, reason,
                            weight.contiguous(), fused=fused)
        self.layers[id(v)] = state
        state.input = self.realize(x, Req(spec.a, float(spec.a_scale), layout))
        if v.residual is not None:
            wide = self.residual_req(v.residual)
            state.residual = self.realize(v.residual, wide)
            state.residual_scale = wide.scale
            state.narrow = v.residual.op == QUANT
            state.fused.append("residual")
        return state

    @staticmethod
    def _module_path(v: Value) -> str:
        """The model's module path of a layer value (its first source)."""
        src = v.attrs.get("source") or (v.name,)
        return src[0]

    def _layer_step(self, v: Value, state: _LayerState) -> Layer:
        spec = state.spec
        name = v.name
        weight = self._param(f"{name}.weight", state.weight.to(torch.int8))
        acc_bias = round_half_up(spec.out_bias / spec.out_scale).to(torch.int64)
        outs, kernel_bias = [], True
        for req, relu, t in state.outputs:
            if req.is_float:
                sc = self._param(f"{t}.scale", spec.out_scale.double())
                off = self._param(f"{t}.offset", spec.out_bias.double())
                outs.append(LayerOutput(t, relu, scale=sc, offset=off,
                                        residual_scale=state.residual_scale))
                continue
            mid = req.mid()  # the formula's precision and scale (a derived output's table after)
            try:
                ratio = spec.out_scale.double() / mid.scale
                res = None if state.residual is None else self.tensors[state.residual]
                if res is None:
                    steps = (acc_bound(state.workload) * ratio
                             + spec.out_bias.double().abs() / mid.scale)
                    m, r, s = shared_shift(ratio, None, steps, sum_bits=REQUANT32_SUM_BITS)
                    if not self.options.requant32 or bool((m < 2**MIN_MULTIPLIER_BITS).any()):
                        m, r, s = shared_shift(ratio, None, steps)  # too coarse for 32 bits
                elif self.wide_bits == 8 and not state.narrow:
                    m, r, s = fixed_point_pair(ratio, state.residual_scale / mid.scale)
                else:
                    top_res = max(-res.precision.qmin, res.precision.qmax)
                    steps = (acc_bound(state.workload) * ratio
                             + top_res * state.residual_scale / mid.scale
                             + spec.out_bias.double().abs() / mid.scale)
                    m, r, s = None, None, None
                    if state.narrow and self.options.requant32:  # approximate: 32 bits
                        m, r, s = shared_shift(ratio, state.residual_scale / mid.scale,
                                               steps, sum_bits=REQUANT32_SUM_BITS)
                        if bool((torch.minimum(m, r) < 2**NARROW_MULTIPLIER_BITS).any()):
                            m = None  # too coarse for 32 bits: the 64-bit sum
                    if m is None:  # a block end's 64-bit sum takes an int32 m (sum64)
                        pick = block_end_shift if state.narrow else shared_shift
                        m, r, s = pick(ratio, state.residual_scale / mid.scale, steps)
            except ValueError as e:
                raise Unrealizable(v, f"layer {self._module_path(v)}: output {t} has no "
                                      f"fixed-point requantization ({e})") from None
            if self.exact_bias or req.via is not None:  # out_bias at 2^-s output steps
                b = round_half_up(spec.out_bias.double() / mid.scale
                                  * torch.pow(2.0, s.double()))
            else:
                b = acc_bias * m
            if bool((b.abs() >= 2**62).any()):
                raise Unrealizable(v, f"layer {self._module_path(v)}: output {t}'s bias is out "
                                      "of range (>= 2^62 at its shift)")
            b = b.to(torch.int64)
            if not self.options.requant32:  # the same formula at its smallest shift
                m, r, b, s = reduced(m, r, b, s)
            kernel_bias = kernel_bias and torch.equal(b, acc_bias * m) and req.via is None
            outs.append(LayerOutput(
                t, relu, multiplier=self._param(f"{t}.multiplier", m),
                shift=self._param(f"{t}.shift", s),
                residual_multiplier=None if r is None else self._param(f"{t}.residual_mult",
                                                                       r),
                bias=self._param(f"{t}.bias", b),
                mid=None if req.via is None else str(req.via.precision),
                table=None if req.via is None else req.via.table))
        bias = None
        requantized = any(o.requantized for o in outs)
        if requantized and kernel_bias and bool((acc_bias.abs() < 2**31).all()):
            bias = self._param(f"{name}.bias", acc_bias)
        fused = list(state.fused)
        if any(relu for _, relu, _ in state.outputs):
            fused.append("relu")
        return Layer(f"layer.{name}", spec.kind, state.workload, state.input, weight, bias,
                     state.residual, tuple(outs), None, state.impl, state.reason,
                     tuple(fused), v.attrs["source"])

    def _kernel(self, step: Layer) -> Layer:
        """The step with its template and config from the chooser (`lowbit.graph.chooser`)."""
        if step.impl == TORCH_FP16:
            return replace(step, config=None, config_source="default",
                           config_reason="PyTorch fp16 layer")
        try:
            choice = self.chooser.kernel(step.workload, step.impl)
        except ValueError as e:
            raise ValueError(f"layer {step.name.removeprefix('layer.')}: no kernel of "
                             f"{step.impl} for {step.workload.key} ({e})") from None
        return replace(step, impl=choice.template, config=choice.config,
                       config_source=choice.source, config_reason=choice.reason)

    # ------------------------------------------------------------------ assembly
    def build(self) -> Plan:
        out = self.realize(self.df.output, FLOAT_REQ)
        for v in self.df.values:
            if id(v) in self.layers:
                self._emit(v.index, self._layer_step(v, self.layers[id(v)]))
        steps = [s for _, _, s in sorted(self.steps, key=lambda t: (t[0], t[1]))]
        steps = fuse_maxpools(steps, self.tensors)
        steps = [self._kernel(kernel_epilogue(s, self.tensors, self.params,
                                              self.options.guarded_block_ends))
                 if isinstance(s, Layer) else s for s in steps]
        steps = decide_launches(steps, self.input_name, self.tensors, self.params, self.options)
        steps.append(Output("output", out))
        used = {t for s in steps for t in (*s.inputs, *s.outputs)} | {self.input_name}
        tensors = {k: t for k, t in self.tensors.items() if k in used}
        return Plan(self.input_name, tensors, tuple(steps), self.params, self.modules,
                    self.image_normalization)


def build_plan(df: Dataflow, input_shape: tuple[int, ...],
               chooser: Chooser | ImplChooser | str | None = None, wide_bits: int = 24,
               exact_bias: bool = True, options: PlanOptions | None = None,
               image_normalization: tuple | None = None) -> Plan:
    """The plan of the value graph `df` for inputs of `input_shape` (NCHW): each layer's
    implementation, template and config from `chooser` (a `lowbit.graph.Chooser`, "default",
    "model" or an implementation policy; without tuning records unless the Chooser holds
    them), wide realizations of `wide_bits`, biases exact (`exact_bias`) or rounded to
    accumulator units (module docstring), launches as `options` allow; with
    `image_normalization` (mean, std) the image is uint8 pixel values
    (`Plan.image_normalization`). A layer or average pool that cannot be realized exactly
    (`fallbacks.Unrealizable`) becomes a float value of `df` (fp16, its reason in the plan)
    and the plan is built again."""
    shape = tuple(int(s) for s in input_shape)
    limit = sys.getrecursionlimit()  # realizations recurse along the graph's longest path
    sys.setrecursionlimit(max(limit, 1000 + 40 * len(df.values)))
    try:
        for _ in range(len(df.values) + 1):
            try:
                return Planner(df, shape, chooser, wide_bits, exact_bias, options,
                               image_normalization).build()
            except Unrealizable as e:  # it runs in float from now on (`fallbacks.make_float`)
                make_float(e.value, e.reason)
    finally:
        sys.setrecursionlimit(limit)
    raise AssertionError("planning did not converge")
