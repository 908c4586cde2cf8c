"""The outputs of a layer's epilogue in the Triton kernels: the specs, their exact ways of
computing the requantization, the device code that writes one output from an int32 tile
(the separate pass `netops.bind_layer_epilogue`, the fused conv `conv_outputs`, the stem) and
the host side that binds one output slot. Bit-exact against
`lowbit.reference.netops.epilogue_outputs`.

Requantized output (`Requantized`; reference `RequantizedOutput`):
    q = clamp(floor((y m + b + res r + 2^(s-1)) / 2^s), lo, qmax),  lo = max(qmin, 0) with relu
A derived output (`mid` and `table`) clamps the same formula to mid's range and writes
table[q - mid.qmin] (any function of the mid value, in the output's precision). Outputs of one
layer with the same formula (m, s, b, r, relu and clamp precision: a stored mid and the
outputs derived from it) compute it once per tile (`layer_slots`: consecutive slots, SAME).

The formula is computed in one of these exact ways, chosen at bind from the actual vectors and
the bounds |y| <= y_bound, |res| <= res_bound (`requant_mode`):
- INT32: where y_bound |m| + |b| + res_bound |r| + 2^(s-1) < 2^31 on every channel
  (`reference.netops.requant32_fits`): int32 multiply-adds of y m + res r + (b + 2^(s-1))
  and an arithmetic shift (every partial sum is an int32);
- FAST: float64 floor(y (m 2^-s) + res (r 2^-s) + b 2^-s + 0.5) where every intermediate is an
  integer below 2^53 scaled by a power of two, hence exact; FAST_NARROW where the results
  also fit int32 and the sums stay below 2^52: the integer nearest y (m 2^-s) + res (r 2^-s)
  + (b + 1/2) 2^-s, with no conversion instruction (`epilogue.nearest_int32`), the clamp in
  int32; FAST_NARROW_CVT the same results as FAST's floor converted to int32 (for the Triton
  versions that compile the conversion-free form in more registers,
  `epilogue.CONVERSION_FREE_FUSED_OUTPUTS`);
- DIRECT: int64 where the sum plus the rounding term stays below 2^63; else SPLIT (the
  reference's split sum).
Float output (`Dequantized`): float32(y scale + offset + res residual_scale) in float64 (the
terms added in that order, no FMA), then ReLU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core import Encoding, PackedTensor, Precision
from ...reference.netops import FloatOutput, RequantizedOutput, derived_table, requant32_fits
from .epilogue import (
    HALF_STEP_EXACT,
    as_float64,
    clamp_integral,
    half_step_bias,
    nearest_int32,
)
from .stored import (
    ENC,
    check_device,
    check_packed,
    float_channel_vector,
    int_channel_vector,
    layout_code,
    requant_round,
    round_shift_terms,
    storage_strides,
    store_values,
    value_bound,
)

KIND_NONE, KIND_REQUANT, KIND_FLOAT, KIND_FLOAT_NCHW = 0, 1, 2, 3
#: requantization modes (module docstring)
DIRECT, SPLIT, FAST = 0, 1, 2
#: FAST whose floors all fit int32 (|v| < 2^31 for the bounds): clamped after the int32
#: conversion, two integer min / max instead of float64 compare-and-selects (a float64 clamp
#: was 3 of the ~36 instructions per output of ResNet-50's block-end pass, ncu on an H200)
FAST_NARROW = 3
#: int32 multiply-adds (module docstring)
INT32 = 4
#: FAST_NARROW's results with conversion instructions: FAST's vectors and floor, the clamp
#: in int32 (module docstring)
FAST_NARROW_CVT = 5
#: |residual values| the epilogue takes (24-bit wide realizations)
RESIDUAL_LIMIT = 2**23
#: multipliers and biases are int64: a residual layer's shared shift can give multipliers
#: past 2^31 (`lowbit.graph.requant.shared_shift`); each product must stay in int64
MULT_LIMIT = 2**62
BIAS_LIMIT = 2**62


# =========================================================================== output specs
@dataclass(frozen=True, eq=False)
class Requantized:
    """One requantized output (module docstring). precision: a `Precision` (not binary) or a
    wide signed one (`lowbit.core.WidePrecision`); multiplier [K] in
    [0, 2^62), shift [K] in 1..62, bias [K] (b, in units of 2^-shift output steps,
    |b| < 2^62; None: 0), residual_multiplier [K] (|r| < 2^62; None: no residual term),
    with |y| m and |res| |r| inside int64 (checked at bind). Vectors may be ints
    (broadcast). mid, table: a derived output (`reference.netops.derived_table`: mid a
    Precision of <= 8 bits, not binary; table of length mid.qmax - mid.qmin + 1 with values in
    `precision`'s range), the output is table[formula clamped to mid - mid.qmin]."""

    precision: object
    multiplier: torch.Tensor | int
    shift: torch.Tensor | int
    bias: torch.Tensor | int | None = None
    residual_multiplier: torch.Tensor | int | None = None
    relu: bool = False
    mid: Precision | None = None
    table: torch.Tensor | None = None

    def __post_init__(self) -> None:
        p = self.precision
        if isinstance(p, str):
            p = Precision.parse(p)
            object.__setattr__(self, "precision", p)
        if not all(hasattr(p, a) for a in ("bits", "encoding", "qmin", "qmax")):
            raise TypeError(f"precision must be a Precision or a wide signed precision, got {p!r}")
        if p.encoding is Encoding.BINARY:
            raise ValueError("precision cannot be binary: requantize to unsigned or signed")
        if not isinstance(self.relu, bool):
            raise TypeError(f"relu must be a bool, got {self.relu!r}")
        mid, table = derived_table(self.mid, self.table, p)
        object.__setattr__(self, "mid", mid)
        object.__setattr__(self, "table", table)

    @property
    def formula_precision(self) -> object:
        """The precision the formula clamps to: mid for a derived output, else precision."""
        return self.precision if self.mid is None else self.mid

    @property
    def low(self) -> int:
        """Lower clamp of the formula: max(qmin, 0) with relu (mid's for a derived output)."""
        p = self.formula_precision
        return max(int(p.qmin), 0) if self.relu else int(p.qmin)

    @property
    def high(self) -> int:
        """Upper clamp of the formula: qmax (mid's for a derived output)."""
        return int(self.formula_precision.qmax)


@dataclass(frozen=True, eq=False)
class Dequantized:
    """A float32 output (module docstring): scale, offset [K] float64 (offset None: 0),
    residual_scale (a number; None: no residual term), relu; channels_first: the float tensor
    is NCHW ([N, K, H, W]) instead of y's NHWC order."""

    scale: torch.Tensor | float
    offset: torch.Tensor | float | None = None
    residual_scale: float | None = None
    relu: bool = False
    channels_first: bool = False


OutputSpec = Requantized | Dequantized | RequantizedOutput | FloatOutput


def as_output_spec(i: int, spec: object) -> Requantized | Dequantized:
    """The kernel spec of a reference output spec (RequantizedOutput: its bias, 0 where None;
    FloatOutput)."""
    if isinstance(spec, (Requantized, Dequantized)):
        return spec
    if isinstance(spec, RequantizedOutput):
        return Requantized(spec.precision, spec.multiplier, spec.shift, spec.bias,
                           spec.residual_multiplier, spec.relu, spec.mid, spec.table)
    if isinstance(spec, FloatOutput):
        return Dequantized(spec.scale, spec.offset)
    raise TypeError(f"outputs[{i}] must be a Requantized / Dequantized (or reference "
                    f"RequantizedOutput / FloatOutput) spec, got {type(spec).__name__}")


def _int64_vector(name: str, v: object, k: int, limit: int) -> torch.Tensor:
    t = torch.as_tensor(0 if v is None else v)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or an integer tensor, got {t.dtype}")
    t = t.to(torch.int64).cpu()
    t = t.expand(k) if t.dim() == 0 else t
    if tuple(t.shape) != (k,):
        raise ValueError(f"{name} must be a scalar or a vector of length {k}, got shape "
                         f"{tuple(t.shape)}")
    if k and int(t.abs().max()) >= limit:
        raise ValueError(f"{name} must satisfy |value| < 2^{limit.bit_length() - 1}")
    return t.contiguous()


def requant_mode(spec: Requantized, k: int, y_bound: int, res_bound: int,
                 fast: bool = True, requant32: bool = False) -> int:
    """The exact way to compute `spec` (module docstring) for |y| <= y_bound and residual
    values |res| <= res_bound: INT32 (with requant32) where every channel's
    y_bound |m| + |b| + res_bound |r| + 2^(s-1) < 2^31; FAST (float64) where y_bound max(m) +
    res_bound max|r| + max|b| + 2^(max(s) - 1) < 2^53: then y m, y m + res r, ... + b and
    ... + 2^(s-1) are integers below 2^53 in magnitude, so y (m 2^-s), + res (r 2^-s), + b 2^-s
    and + 0.5 are exact in float64 (scalings by powers of two) and the floor is the integer one
    (the residual term's 64-bit multiply-adds made the pass instruction-bound: a ResNet-50
    block end at batch 256 took 707 us for 2.5 GB on an H200); DIRECT where the int64 sum
    plus the rounding term stays below 2^63; else SPLIT."""
    m = _int64_vector("multiplier", spec.multiplier, k, MULT_LIMIT)
    s = _int64_vector("shift", spec.shift, k, 63)
    b = _int64_vector("bias", spec.bias, k, BIAS_LIMIT)
    r = _int64_vector("residual_multiplier", spec.residual_multiplier, k, MULT_LIMIT)
    res_on = spec.residual_multiplier is not None
    if requant32 and requant32_fits(m, s, b, r if res_on else None, y_bound, res_bound):
        return INT32
    terms = y_bound * int(m.max()) + int(b.abs().max()) + 2 ** (int(s.max()) - 1)
    if res_on:
        terms += res_bound * int(r.abs().max())
    if fast and terms < 2**53:
        return FAST
    return DIRECT if terms < 2**63 else SPLIT


def sum_bound(m: torch.Tensor, r: torch.Tensor, b: torch.Tensor, s: torch.Tensor,
              y_bound: int, res_bound: int) -> int:
    """The largest |y m + res r + b| + 2^(s-1) over channels for |y| <= y_bound and
    |res| <= res_bound (int64 vectors [K]; an exact Python integer)."""
    return max((y_bound * abs(mi) + res_bound * abs(ri) + abs(bi) + (1 << (si - 1))
                for mi, ri, bi, si in zip(m.tolist(), r.tolist(), b.tolist(), s.tolist(),
                                          strict=True)), default=0)


def fits_int32(m: torch.Tensor, r: torch.Tensor, b: torch.Tensor, s: torch.Tensor,
               y_bound: int, res_bound: int) -> bool:
    """Whether every floor((y m + res r + b + 2^(s-1)) / 2^s) lies in int32 for |y| <= y_bound
    and |res| <= res_bound (int64 vectors [K]; exact Python integers)."""
    return all((y_bound * mi + res_bound * abs(ri) + abs(bi) + (1 << (si - 1))) >> si < 2**31 - 1
               for mi, ri, bi, si in zip(m.tolist(), r.tolist(), b.tolist(), s.tolist(),
                                         strict=True))


# =========================================================================== device code
@triton.jit
def requant_tile(y, res, c0, K, v1_ptr, v2_ptr, v3_ptr, v4_ptr, QLO: tl.constexpr,
                 QMAX: tl.constexpr, HAS_RES: tl.constexpr, MODE: tl.constexpr,
                 BLOCK_C: tl.constexpr):
    """int32 clamp(floor((y m + b + res r + 2^(s-1)) / 2^s), QLO, QMAX) of an int32 tile y
    [rows, BLOCK_C] (channels c0 ..) and its residual values res, in MODE (module docstring).
    v1 multiplier, v2 residual multiplier, v3 shift (int32 [K]), v4 b: int64 (DIRECT,
    SPLIT), times 2^-s in float64 (FAST, FAST_NARROW, FAST_NARROW_CVT), int32 with
    v4 = b + 2^(s-1) (INT32)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < K
    if MODE == 4:  # INT32
        m = tl.load(v1_ptr + chan, mask=c_mask, other=0)
        bb = tl.load(v4_ptr + chan, mask=c_mask, other=0)
        sh = tl.load(v3_ptr + chan, mask=c_mask, other=1)
        z = y * m[None, :] + bb[None, :]
        if HAS_RES:
            r = tl.load(v2_ptr + chan, mask=c_mask, other=0)
            z = z + res * r[None, :]
        q = tl.minimum(tl.maximum(z >> sh[None, :], QLO), QMAX)
    elif MODE >= 2:
        ms = tl.load(v1_ptr + chan, mask=c_mask, other=0.0)
        bs = tl.load(v4_ptr + chan, mask=c_mask, other=0.0)
        # fused multiply-adds in any order are exact here: the bound is on the sum of the
        # terms' magnitudes (`requant_mode`), so every partial sum is an integer below 2^53
        # times 2^-s; the rounding term joins the bias (b + 2^(s-1)) 2^-s, exact as well
        # the rounding term joins the bias: FAST (b + 2^(s-1)) 2^-s, then the floor;
        # FAST_NARROW (b + 1/2) 2^-s, then the nearest integer (`epilogue.half_step_bias`),
        # the int32 -> float64 conversions and that rounding without conversion
        # instructions (`epilogue.int32_to_float64`, `nearest_int32`); FAST_NARROW_CVT as
        # FAST with conversion instructions, the clamp in int32
        if MODE == 3:
            v = tl.fma(as_float64(y, False), ms[None, :], bs[None, :])
        else:
            v = tl.fma(as_float64(y, MODE == 5), ms[None, :], (bs + 0.5)[None, :])
        if HAS_RES:
            rs = tl.load(v2_ptr + chan, mask=c_mask, other=0.0)
            v = tl.fma(as_float64(res, MODE == 5), rs[None, :], v)
        if MODE == 3:  # FAST_NARROW
            q = tl.minimum(tl.maximum(nearest_int32(v), QLO), QMAX)
        elif MODE == 5:  # FAST_NARROW_CVT
            q = tl.minimum(tl.maximum(tl.math.floor(v).to(tl.int32), QLO), QMAX)
        else:
            q = clamp_integral(tl.math.floor(v), QLO, QMAX)
    else:
        m = tl.load(v1_ptr + chan, mask=c_mask, other=0).to(tl.int64)
        sh = tl.load(v3_ptr + chan, mask=c_mask, other=1).to(tl.int64)[None, :]
        b = tl.load(v4_ptr + chan, mask=c_mask, other=0)[None, :]
        t0 = y.to(tl.int64) * m[None, :]
        t2 = tl.zeros_like(t0)
        if HAS_RES:
            r = tl.load(v2_ptr + chan, mask=c_mask, other=0).to(tl.int64)
            t2 = res.to(tl.int64) * r[None, :]
        if MODE == 1:
            q = round_shift_terms(t0, b, t2, sh)
        else:
            q = requant_round(t0 + b + t2, sh)
        q = tl.minimum(tl.maximum(q, QLO), QMAX).to(tl.int32)
    return q


@triton.jit
def store_float(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, row,
                KIND: tl.constexpr, QLO: tl.constexpr, HAS_RES: tl.constexpr,
                BLOCK_C: tl.constexpr):
    """A float output (module docstring): v1 scale, v2 offset, v3 residual scale (float64
    [K]); QLO 0 means ReLU; KIND_FLOAT_NCHW: `row` is H*W, the output NCHW."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < K
    sc = tl.load(v1_ptr + chan, mask=c_mask, other=0.0)
    off = tl.load(v2_ptr + chan, mask=c_mask, other=0.0)
    f = y.to(tl.float64) * sc[None, :] + off[None, :]
    if HAS_RES:
        rs = tl.load(v3_ptr + chan, mask=c_mask, other=0.0)
        f = f + res.to(tl.float64) * rs[None, :]
    f = f.to(tl.float32)
    if QLO == 0:
        f = tl.maximum(f, 0.0)
    mask = pix_mask[:, None] & c_mask[None, :]
    if KIND == 2:
        tl.store(out_ptr + pix[:, None] * K + chan[None, :], f, mask=mask)
    else:
        n = pix // row
        hw = pix % row
        tl.store(out_ptr + (n * K * row + hw)[:, None] + (chan * row)[None, :], f, mask=mask)


@triton.jit
def emit_output(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, v4_ptr, row,
                plane, KIND: tl.constexpr, LAYOUT: tl.constexpr, BITS: tl.constexpr,
                QLO: tl.constexpr, QMAX: tl.constexpr, HAS_RES: tl.constexpr,
                MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """One output of the layer epilogue (module docstring; `output_slot`'s arguments):
    requantized (`requant_tile`) or float (`store_float`)."""
    if KIND == 1:
        q = requant_tile(y, res, c0, K, v1_ptr, v2_ptr, v3_ptr, v4_ptr, QLO, QMAX, HAS_RES,
                         MODE, BLOCK_C)
        store_values(out_ptr, q, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0,
                     BLOCK_P, BLOCK_C)
    elif KIND >= 2:
        store_float(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, row, KIND,
                    QLO, HAS_RES, BLOCK_C)


@triton.jit
def emit_slot(y, res, q_prev, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, v4_ptr,
              t_ptr, row, plane, KIND: tl.constexpr, LAYOUT: tl.constexpr,
              BITS: tl.constexpr, QLO: tl.constexpr, QMAX: tl.constexpr,
              HAS_RES: tl.constexpr, MODE: tl.constexpr, SAME: tl.constexpr,
              TABLE: tl.constexpr, TMIN: tl.constexpr, BLOCK_P: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """One output slot of `layer_slots` (`emit_output` plus formula sharing and tables):
    SAME reuses q_prev (the previous slot's formula value, the same formula) instead of
    computing it; TABLE writes t[q - TMIN] (int32 table) instead of q. Returns the formula's
    value for the next slot."""
    q = q_prev
    if KIND == 1:
        if SAME == 0:
            q = requant_tile(y, res, c0, K, v1_ptr, v2_ptr, v3_ptr, v4_ptr, QLO, QMAX,
                             HAS_RES, MODE, BLOCK_C)
        v = q
        if TABLE:
            v = tl.load(t_ptr + (q - TMIN))  # q in [QLO, QMAX]: always inside the table
        store_values(out_ptr, v, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0,
                     BLOCK_P, BLOCK_C)
    elif KIND >= 2:
        store_float(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, row, KIND,
                    QLO, HAS_RES, BLOCK_C)
    return q


# =========================================================================== host side
def _unused_slot(placeholder: torch.Tensor) -> tuple[tuple, dict]:
    """An unused `emit_output` slot (KIND_NONE)."""
    return ((placeholder,) * 5 + (0, 0),
            dict(KIND=KIND_NONE, LAYOUT=0, BITS=8, QLO=0, QMAX=0, RES=False, MODE=0))


def _requant_slot(i: int, spec: Requantized, out: object, shape: tuple[int, ...],
                  device: torch.device, has_residual: bool, y_bound: int, res_bound: int,
                  fast: bool, requant32: bool, conversion_free: bool = True
                  ) -> tuple[tuple, dict, tuple]:
    """(args, constexprs, formula key) of a requantized output: args (out, v1, v2, v3, v4,
    row, plane) as `requant_tile` reads them; the key equal for outputs of one formula.
    conversion_free: FAST_NARROW where it applies, else FAST_NARROW_CVT."""
    p = check_packed(f"outs[{i}]", out, shape, device)
    if str(p.precision) != str(spec.precision):
        raise ValueError(f"outs[{i}] holds {p.precision} but outputs[{i}] requantizes to "
                         f"{spec.precision}")
    k = shape[-1]
    mult = _int64_vector(f"outputs[{i}].multiplier", spec.multiplier, k, MULT_LIMIT)
    if k and int(mult.min()) < 0:
        raise ValueError(f"outputs[{i}].multiplier must be >= 0")
    shift = int_channel_vector(f"outputs[{i}].shift", spec.shift, k, 1, 62, device)
    bias = _int64_vector(f"outputs[{i}].bias", spec.bias, k, BIAS_LIMIT)
    res_on = spec.residual_multiplier is not None
    if res_on and not has_residual:
        raise ValueError(f"outputs[{i}] has a residual_multiplier but no residual was given")
    rmul = _int64_vector(f"outputs[{i}].residual_multiplier", spec.residual_multiplier, k,
                         MULT_LIMIT)
    if y_bound * int(mult.max()) >= 2**63 or res_bound * int(rmul.abs().max()) >= 2**63:
        raise ValueError(f"outputs[{i}]: y m or res r may leave int64 (|y| <= {y_bound}, "
                         f"|res| <= {res_bound})")
    mode = requant_mode(spec, k, y_bound, res_bound, fast, requant32)
    if mode == FAST and fits_int32(mult, rmul, bias, shift.cpu(), y_bound, res_bound):
        if not conversion_free:
            mode = FAST_NARROW_CVT
        elif sum_bound(mult, rmul, bias, shift.cpu(), y_bound, res_bound) < HALF_STEP_EXACT:
            mode = FAST_NARROW
    key = (str(spec.formula_precision), spec.relu, res_on, *(tuple(v.tolist()) for v in (
        mult, shift.cpu(), bias, rmul)))
    s_cpu = shift.cpu().to(torch.int64)
    if mode == INT32:  # every partial sum an int32 (requant32_fits)
        v1 = mult.to(torch.int32).to(device)
        v4 = (bias + (1 << (s_cpu - 1))).to(torch.int32).to(device)
        rmul = rmul.to(torch.int32).to(device)
    elif mode in (FAST, FAST_NARROW, FAST_NARROW_CVT):  # times 2^-s: exact (< 2^53)
        scaled = torch.pow(2.0, -s_cpu.to(torch.float64))
        v1 = (mult.to(torch.float64) * scaled).to(device)
        v4 = (half_step_bias(bias, scaled) if mode == FAST_NARROW else
              bias.to(torch.float64) * scaled).to(device)
        rmul = (rmul.to(torch.float64) * scaled).to(device)
    else:
        v1, v4 = mult.to(device), bias.to(device)
        rmul = rmul.to(device)
    row, plane = storage_strides(p)
    consts = dict(KIND=KIND_REQUANT, LAYOUT=layout_code(p), BITS=min(p.precision.bits, 8),
                  QLO=spec.low, QMAX=spec.high, RES=res_on, MODE=mode)
    return (p.data, v1, rmul, shift, v4, row, plane), consts, key


def _float_slot(i: int, spec: Dequantized, out: object, shape: tuple[int, ...],
                device: torch.device, has_residual: bool) -> tuple[tuple, dict]:
    k = shape[-1]
    nchw = (shape[0], k, *shape[1:-1])
    want = nchw if spec.channels_first else shape
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
            or tuple(out.shape) != want or not out.is_contiguous()):
        raise ValueError(f"outs[{i}] must be a contiguous float32 tensor of shape {want} "
                         "(a float output)")
    check_device(f"outs[{i}]", out, device)
    scale = float_channel_vector(f"outputs[{i}].scale", spec.scale, k, device)
    offset = float_channel_vector(f"outputs[{i}].offset", spec.offset, k, device)
    res_on = spec.residual_scale is not None
    if res_on and not has_residual:
        raise ValueError(f"outputs[{i}] has a residual_scale but no residual was given")
    rscale = float_channel_vector(f"outputs[{i}].residual_scale", spec.residual_scale, k,
                                  device) if res_on else scale
    hw = 1
    for d in shape[1:-1]:
        hw *= d
    consts = dict(KIND=KIND_FLOAT_NCHW if spec.channels_first else KIND_FLOAT, LAYOUT=0,
                  BITS=8, QLO=0 if spec.relu else -1, QMAX=0, RES=res_on, MODE=0)
    return (out, scale, offset, rscale, scale, hw, 0), consts


def output_slot(i: int, spec: object, out: object, shape: tuple[int, ...],
                device: torch.device, has_residual: bool, y_bound: int = 2**31,
                res_bound: int = 0, fast: bool = True) -> tuple[tuple, dict]:
    """(args, constexprs) of output i of the epilogue for an int32 y of logical `shape`:
    args (out, v1, v2, v3, v4, row, plane) as `emit_output` reads them (no derived output:
    `layer_slots` writes those)."""
    spec = as_output_spec(i, spec)
    if isinstance(spec, Requantized):
        if spec.table is not None:
            raise ValueError(f"outputs[{i}] is a derived output (mid and table): this kernel "
                             "writes requantized outputs without a table")
        return _requant_slot(i, spec, out, shape, device, has_residual, y_bound, res_bound,
                             fast, False)[:2]
    return _float_slot(i, spec, out, shape, device, has_residual)


def _unused_layer_slot(placeholder: torch.Tensor) -> tuple[tuple, dict]:
    """An unused `emit_slot` slot."""
    args, consts = _unused_slot(placeholder)
    return (*args[:5], placeholder, *args[5:]), dict(consts, SAME=0, TABLE=False, TMIN=0)


def layer_slots(outputs: Sequence[OutputSpec], outs: Sequence[PackedTensor | torch.Tensor],
                shape: tuple[int, ...], device: torch.device, placeholder: torch.Tensor,
                has_residual: bool, y_bound: int, res_bound: int, fast: bool,
                requant32: bool, per_launch: int, conversion_free: bool = True
                ) -> list[list[tuple[tuple, dict]]]:
    """The `emit_slot` slots of the outputs, in launches of `per_launch` slots (the last one
    padded with unused slots): each (args (out, v1, v2, v3, v4, table, row, plane),
    constexprs). Outputs of one formula are consecutive slots, all but the first of a launch
    SAME. conversion_free: `_requant_slot`'s. Checks every spec and buffer (ValueError /
    TypeError naming outputs[i] / outs[i])."""
    slots = []  # (args, consts, key)
    for i, (s, o) in enumerate(zip(outputs, outs, strict=True)):
        spec = as_output_spec(i, s)
        if isinstance(spec, Dequantized):
            args, consts = _float_slot(i, spec, o, shape, device, has_residual)
            slots.append(((*args[:5], placeholder, *args[5:]),
                          dict(consts, SAME=0, TABLE=False, TMIN=0), None))
            continue
        args, consts, key = _requant_slot(i, spec, o, shape, device, has_residual, y_bound,
                                          res_bound, fast, requant32, conversion_free)
        table = placeholder if spec.table is None else \
            spec.table.to(torch.int32).contiguous().to(device)
        consts.update(SAME=0, TABLE=spec.table is not None,
                      TMIN=0 if spec.mid is None else int(spec.mid.qmin))
        slots.append(((*args[:5], table, *args[5:]), consts, key))
    firsts = {}
    for j, (_, _, key) in enumerate(slots):
        firsts.setdefault(key, j)
    order = sorted(range(len(slots)), key=lambda j: (firsts[slots[j][2]], j))
    launches = []
    for first in range(0, len(order), per_launch):
        group = [slots[j] for j in order[first:first + per_launch]]
        launch = []
        for j, (args, consts, key) in enumerate(group):
            same = j > 0 and key is not None and key == group[j - 1][2]
            launch.append((args, dict(consts, SAME=int(same))))
        launch += [_unused_layer_slot(placeholder)] * (per_launch - len(group))
        launches.append(launch)
    return launches


def residual_slot(residual: PackedTensor | None, shape: tuple[int, ...],
                  placeholder: torch.Tensor) -> tuple[tuple, dict, int]:
    """(args (data, row, plane), constexprs, max |value|) of the layer epilogue's residual
    operand: a PackedTensor of the output's logical `shape` on `placeholder`'s device with
    |values| <= 2^23 (checked): wide (int16 / int32 storage), 8-bit or narrower in INT8
    (uint8 storage for unsigned values, int8 for signed) or BITPLANE; or None (the
    placeholder stands in, HAS_RES False)."""
    if residual is None:
        return ((placeholder, 0, 0), dict(HAS_RES=False, RES_LAYOUT=0, RES_BITS=8, RES_ENC=0),
                0)
    r = check_packed("residual", residual, shape, placeholder.device)
    res_bound = value_bound(r.precision)
    if res_bound > RESIDUAL_LIMIT:
        raise ValueError("residual values must fit |v| <= 2^23")
    consts = dict(HAS_RES=True, RES_LAYOUT=layout_code(r), RES_BITS=min(r.precision.bits, 8),
                  RES_ENC=ENC[r.precision.encoding])
    return (r.data, *storage_strides(r)), consts, res_bound


def slot_kwargs(slots: Sequence[tuple[tuple, dict]]) -> tuple[list, dict]:
    """The kernel arguments of one launch's slots: the args in order, the constexprs named
    with the slot's index (KIND0, ...)."""
    args: list = []
    kwargs: dict = {}
    for j, (a, c) in enumerate(slots):
        args += list(a)
        kwargs.update({f"{name}{j}": v for name, v in c.items()})
    return args, kwargs


__all__ = ["DIRECT", "FAST", "FAST_NARROW", "FAST_NARROW_CVT", "INT32", "SPLIT", "Dequantized",
           "OutputSpec", "Requantized", "as_output_spec", "emit_output", "emit_slot", "fits_int32",
           "layer_slots", "output_slot", "requant_mode", "requant_tile", "residual_slot",
           "slot_kwargs"]
