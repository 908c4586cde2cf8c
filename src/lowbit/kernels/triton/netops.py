"""Triton kernels of the engine's integer network ops on stored tensors, bit-exact against
`lowbit.reference.netops` (formulas there) and the plan semantics of `lowbit.graph.ir`:

- `bind_layer_epilogue`: int32 / int16 y [..., K] (a conv's accumulator) + an optional residual
  operand -> one or more outputs, each requantized into its own precision (<= 8 bits or wide
  16 / 24-bit) and layout (INT8 or BITPLANE) with its bias at the output's shift and ReLU, or
  dequantized to float32 (logits; NHWC or NCHW);
- `bind_maxpool2d`, `bind_avgpool2d`, `bind_avgpool_windows` (pools.py): NHWC in INT8 or
  BITPLANE -> the same or the other layout (average pools requantized);
- `bind_quantize`: a float NCHW (or [N, C]) tensor -> INT8 / BITPLANE / wide NHWC.

Quantized tensors travel as `lowbit.core.PackedTensor` (storage + logical NHWC or [M, C] shape,
precision, layout; wide precisions: `lowbit.core.WidePrecision`). Each `bind_*` checks its arguments
once (ValueError / TypeError naming the argument, before any launch) and returns a `Launcher`:
calling it replays the launch with every argument fixed (no host work besides Triton's launch,
CUDA-graph capturable). The plain functions (`layer_epilogue`, `maxpool2d`, ...) allocate the
outputs and launch once.

Requantized output (`Requantized`; reference `RequantizedOutput` has b = 0):
    q = clamp(floor((y m + b + res r + 2^(s-1)) / 2^s), lo, qmax),  lo = max(qmin, 0) with relu
computed in one of three exact ways chosen at bind (`requant_mode`): float64
floor(y (m 2^-s) + res (r 2^-s) + b 2^-s + 0.5) where every intermediate is an integer below
2^53 scaled by a power of two, hence exact (FAST); else int64 directly where the terms' bounds
keep the sum inside int64 (DIRECT), the reference's split sum otherwise (SPLIT).
Float output (`Dequantized`): float32(y scale + offset + res residual_scale) in float64 (the
terms added in that order, no FMA), then ReLU.

Non-finite floats cannot raise inside a kernel: `bind_quantize(..., status=t)` sets t[0] to 1
when the input held any (the caller reads it after the forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor, Precision
from ...reference.netops import FloatOutput, RequantizedOutput
from .igemm import Launch, cdiv
from .pools import (
    avgpool2d,
    bind_avgpool2d,
    bind_avgpool_windows,
    bind_maxpool2d,
    maxpool2d,
)
from .stored import (
    ENC,
    Launcher,
    channel_tile,
    check_device,
    check_packed,
    empty_packed,
    flag_nonfinite,
    float_channel_vector,
    int_channel_vector,
    layout_code,
    load_values,
    quantize_f32,
    requant_round,
    round_shift_terms,
    storage_strides,
    store_values,
    value_bound,
)

#: layer epilogue outputs per launch (more outputs: more launches, each re-reading y)
MAX_OUTPUTS = 4
KIND_NONE, KIND_REQUANT, KIND_FLOAT, KIND_FLOAT_NCHW = 0, 1, 2, 3
#: requantization modes (module docstring)
DIRECT, SPLIT, FAST = 0, 1, 2
#: FAST whose floors all fit int32 (|v| < 2^31 for the bounds): clamped after the int32
#: conversion, two integer min / max instead of float64 compare-and-selects (a float64 clamp
#: was 3 of the ~36 instructions per output of ResNet-50's block-end pass, ncu on an H200)
FAST_NARROW = 3
#: |residual values| the epilogue takes (24-bit wide realizations)
RESIDUAL_LIMIT = 2**23
#: multipliers and biases are int64: a residual layer's shared shift can give multipliers
#: past 2^31 (`lowbit.graph.planner.shared_shift`); each product must stay in int64
MULT_LIMIT = 2**62
BIAS_LIMIT = 2**62
__all__ = ["Dequantized", "Launcher", "Requantized", "avgpool2d", "bind_avgpool2d",
           "bind_avgpool_windows", "bind_layer_epilogue", "bind_maxpool2d", "bind_quantize",
           "bind_quantize_image", "empty_packed", "layer_epilogue", "maxpool2d",
           "quantize_image", "requant_mode", "residual_slot"]


# =========================================================================== output specs
@dataclass(frozen=True, eq=False)
class Requantized:
    """One requantized output (module docstring). precision: a `Precision` (not binary) or a
    wide signed one (`lowbit.core.WidePrecision`); multiplier [K] in
    [0, 2^62), shift [K] in 1..62, bias [K] (b, in units of 2^-shift output steps,
    |b| < 2^62; None: 0), residual_multiplier [K] (|r| < 2^62; None: no residual term),
    with |y| m and |res| |r| inside int64 (checked at bind). Vectors may be ints
    (broadcast)."""

    precision: object
    multiplier: torch.Tensor | int
    shift: torch.Tensor | int
    bias: torch.Tensor | int | None = None
    residual_multiplier: torch.Tensor | int | None = None
    relu: bool = False

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

    @property
    def low(self) -> int:
        return max(int(self.precision.qmin), 0) if self.relu else int(self.precision.qmin)


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
    """The kernel spec of a reference output spec (RequantizedOutput: b = 0; FloatOutput)."""
    if isinstance(spec, (Requantized, Dequantized)):
        return spec
    if isinstance(spec, RequantizedOutput):
        return Requantized(spec.precision, spec.multiplier, spec.shift, None,
                           spec.residual_multiplier, spec.relu)
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
                 fast: bool = True) -> int:
    """The exact way to compute `spec` (module docstring) for |y| <= y_bound and residual
    values |res| <= res_bound: FAST (float64) where y_bound max(m) + res_bound max|r| +
    max|b| + 2^(max(s) - 1) < 2^53: then y m, y m + res r, ... + b and ... + 2^(s-1) are
    integers below 2^53 in magnitude, so y (m 2^-s), + res (r 2^-s), + b 2^-s and + 0.5 are
    exact in float64 (scalings by powers of two) and the floor is the integer one (the
    residual term's 64-bit multiply-adds made the pass instruction-bound: a ResNet-50 block
    end at batch 256 took 707 us for 2.5 GB on an H200); DIRECT where the int64 sum plus the
    rounding term stays below 2^63; else SPLIT."""
    m = _int64_vector("multiplier", spec.multiplier, k, MULT_LIMIT)
    s = _int64_vector("shift", spec.shift, k, 63)
    b = _int64_vector("bias", spec.bias, k, BIAS_LIMIT)
    r = _int64_vector("residual_multiplier", spec.residual_multiplier, k, MULT_LIMIT)
    terms = y_bound * int(m.max()) + int(b.abs().max()) + 2 ** (int(s.max()) - 1)
    if spec.residual_multiplier is not None:
        terms += res_bound * int(r.abs().max())
    if fast and terms < 2**53:
        return FAST
    return DIRECT if terms < 2**63 else SPLIT


def fits_int32(m: torch.Tensor, r: torch.Tensor, b: torch.Tensor, s: torch.Tensor,
               y_bound: int, res_bound: int) -> bool:
    """Whether every floor((y m + res r + b + 2^(s-1)) / 2^s) lies in int32 for |y| <= y_bound
    and |res| <= res_bound (int64 vectors [K]; exact Python integers)."""
    return all((y_bound * mi + res_bound * abs(ri) + abs(bi) + (1 << (si - 1))) >> si < 2**31 - 1
               for mi, ri, bi, si in zip(m.tolist(), r.tolist(), b.tolist(), s.tolist(),
                                         strict=True))


# =========================================================================== kernels
@triton.jit
def emit_output(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, v4_ptr, row,
                plane, KIND: tl.constexpr, LAYOUT: tl.constexpr, BITS: tl.constexpr,
                QLO: tl.constexpr, QMAX: tl.constexpr, HAS_RES: tl.constexpr,
                MODE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """One output of the layer epilogue (module docstring). REQUANT: v1 multiplier (int64;
    FAST: m 2^-s float64), v2 residual multiplier (int64; FAST: r 2^-s float64), v3 shift
    (int32 [K]), v4 b (int64; FAST: b 2^-s float64). FLOAT: v1 scale, v2 offset, v3 residual scale
    (float64 [K]); QLO 0 means ReLU; FLOAT_NCHW: `row` is H*W, the output NCHW."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < K
    if KIND == 1:
        if MODE >= 2:
            ms = tl.load(v1_ptr + chan, mask=c_mask, other=0.0)
            bs = tl.load(v4_ptr + chan, mask=c_mask, other=0.0)
            v = y.to(tl.float64) * ms[None, :]
            if HAS_RES:
                rs = tl.load(v2_ptr + chan, mask=c_mask, other=0.0)
                v = v + res.to(tl.float64) * rs[None, :]
            v = tl.math.floor(v + bs[None, :] + 0.5)
            if MODE == 3:  # FAST_NARROW
                q = tl.minimum(tl.maximum(v.to(tl.int32), QLO), QMAX)
            else:
                q = tl.minimum(tl.maximum(v, QLO), QMAX).to(tl.int32)
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
        store_values(out_ptr, q, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0,
                     BLOCK_P, BLOCK_C)
    elif KIND >= 2:
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
            tl.store(out_ptr + (n * K * row + hw)[:, None] + (chan * row)[None, :], f,
                     mask=mask)


@triton.jit
def layer_epilogue_kernel(
    y_ptr, res_ptr, M, K, res_row, res_plane,
    o0, a0, b0, c0_, d0, row0, plane0, o1, a1, b1, c1, d1, row1, plane1,
    o2, a2, b2, c2, d2, row2, plane2, o3, a3, b3, c3, d3, row3, plane3,
    HAS_RES: tl.constexpr, RES_LAYOUT: tl.constexpr, RES_BITS: tl.constexpr,
    RES_ENC: tl.constexpr,
    KIND0: tl.constexpr, LAYOUT0: tl.constexpr, BITS0: tl.constexpr, QLO0: tl.constexpr,
    QMAX0: tl.constexpr, RES0: tl.constexpr, MODE0: tl.constexpr,
    KIND1: tl.constexpr, LAYOUT1: tl.constexpr, BITS1: tl.constexpr, QLO1: tl.constexpr,
    QMAX1: tl.constexpr, RES1: tl.constexpr, MODE1: tl.constexpr,
    KIND2: tl.constexpr, LAYOUT2: tl.constexpr, BITS2: tl.constexpr, QLO2: tl.constexpr,
    QMAX2: tl.constexpr, RES2: tl.constexpr, MODE2: tl.constexpr,
    KIND3: tl.constexpr, LAYOUT3: tl.constexpr, BITS3: tl.constexpr, QLO3: tl.constexpr,
    QMAX3: tl.constexpr, RES3: tl.constexpr, MODE3: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y (int32 or int16 [M, K]) and the residual read once per tile, then up to four
    outputs."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    pix_mask = pix < M
    chan = c0 + tl.arange(0, BLOCK_C)
    y = tl.load(y_ptr + pix[:, None] * K + chan[None, :],
                mask=pix_mask[:, None] & (chan < K)[None, :], other=0).to(tl.int32)
    res = y
    if HAS_RES:
        res = load_values(res_ptr, pix, pix_mask, c0, K, res_row, res_plane, RES_LAYOUT,
                          RES_BITS, RES_ENC, BLOCK_P, BLOCK_C)
    emit_output(y, res, pix, pix_mask, c0, K, o0, a0, b0, c0_, d0, row0, plane0, KIND0,
                LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, BLOCK_P, BLOCK_C)
    if KIND1 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o1, a1, b1, c1, d1, row1, plane1, KIND1,
                    LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, BLOCK_P, BLOCK_C)
    if KIND2 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o2, a2, b2, c2, d2, row2, plane2, KIND2,
                    LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, BLOCK_P, BLOCK_C)
    if KIND3 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o3, a3, b3, c3, d3, row3, plane3, KIND3,
                    LAYOUT3, BITS3, QLO3, QMAX3, RES3, MODE3, BLOCK_P, BLOCK_C)


@triton.jit
def quantize_kernel(
    x_ptr, out_ptr, status_ptr, NHW, HW, C, scale, o_row, o_plane,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, RELU: tl.constexpr, HAS_STATUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """q = clamp(floor(relu?(x) / scale + 0.5)) in float32 with IEEE division (div_rn), NCHW
    -> NHWC storage; binary: +1 for x >= 0 else -1."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    chan = c0 + tl.arange(0, BLOCK_C)
    pix_mask = pix < NHW
    mask = pix_mask[:, None] & (chan < C)[None, :]
    n = pix // HW
    hw = pix % HW
    x = tl.load(x_ptr + (n * C * HW + hw)[:, None] + (chan * HW)[None, :], mask=mask,
                other=0.0).to(tl.float32)
    if HAS_STATUS:
        flag_nonfinite(x, mask, status_ptr)
    if RELU:
        x = tl.maximum(x, 0.0)
    q = quantize_f32(x, scale, O_ENC, QMIN, QMAX)
    store_values(out_ptr, q, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


# =========================================================================== host side
# --------------------------------------------------------------------------- layer epilogue
def _unused_slot(placeholder: torch.Tensor) -> tuple[tuple, dict]:
    return ((placeholder,) * 5 + (0, 0),
            dict(KIND=KIND_NONE, LAYOUT=0, BITS=8, QLO=0, QMAX=0, RES=False, MODE=0))


def output_slot(i: int, spec: object, out: object, shape: tuple[int, ...],
                device: torch.device, has_residual: bool, y_bound: int = 2**31,
                res_bound: int = 0, fast: bool = True) -> tuple[tuple, dict]:
    """(args, constexprs) of output i of the epilogue for an int32 y of logical `shape`:
    args (out, v1, v2, v3, v4, row, plane) as `emit_output` reads them."""
    spec = as_output_spec(i, spec)
    k = shape[-1]
    if isinstance(spec, Requantized):
        p = check_packed(f"outs[{i}]", out, shape, device)
        if str(p.precision) != str(spec.precision):
            raise ValueError(f"outs[{i}] holds {p.precision} but outputs[{i}] requantizes to "
                             f"{spec.precision}")
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
        mode = requant_mode(spec, k, y_bound, res_bound, fast)
        if mode == FAST and fits_int32(mult, rmul, bias, shift.cpu(), y_bound, res_bound):
            mode = FAST_NARROW
        if mode in (FAST, FAST_NARROW):  # m, r, b times 2^-s in float64: exact (< 2^53)
            scaled = torch.pow(2.0, -shift.cpu().to(torch.float64))
            v1 = (mult.to(torch.float64) * scaled).to(device)
            v4 = (bias.to(torch.float64) * scaled).to(device)
            rmul = (rmul.to(torch.float64) * scaled).to(device)
        else:
            v1, v4 = mult.to(device), bias.to(device)
            rmul = rmul.to(device)
        row, plane = storage_strides(p)
        consts = dict(KIND=KIND_REQUANT, LAYOUT=layout_code(p), BITS=min(p.precision.bits, 8),
                      QLO=spec.low, QMAX=int(spec.precision.qmax), RES=res_on, MODE=mode)
        return (p.data, v1, rmul, shift, v4, row, plane), consts
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


def bind_layer_epilogue(y: torch.Tensor, outputs: Sequence[OutputSpec],
                        outs: Sequence[PackedTensor | torch.Tensor],
                        residual: PackedTensor | None = None, y_bound: int | None = None,
                        fast: bool = True, tile_values: int | None = None,
                        num_warps: int | None = None) -> Launcher:
    """Bind the layer epilogue: y int32 or int16 [..., K] (contiguous; an int16 y is a
    kernel's `Epilogue(out="int16")` accumulator, half the bytes), one spec per output
    (`Requantized` or reference `RequantizedOutput`: the `outs` entry a PackedTensor of y's
    logical shape in INT8 or BITPLANE layout and the spec's precision; `Dequantized` /
    `FloatOutput`: a float32 tensor of y's shape, or NCHW with channels_first), optional
    residual PackedTensor of y's logical shape (|values| <= 2^23, wide ones included).
    y_bound: max |y| (default 2^31, any int32) for the choice of `requant_mode`; fast: allow
    its FAST mode; tile_values (a power of two >= 512) / num_warps: values and warps per
    program (launch knobs, any exact; default `pass_tile`). With b = 0 equals
    `reference.epilogue_outputs(y, None, outputs, residual values)`; in general the module
    docstring's formulas."""
    if not isinstance(y, torch.Tensor) or y.dtype not in (torch.int32, torch.int16) or \
            y.dim() < 1:
        raise TypeError(f"y must be an int32 or int16 tensor [..., K], got "
                        f"{y.dtype if isinstance(y, torch.Tensor) else type(y).__name__}")
    if not y.is_contiguous() or y.numel() == 0:
        raise ValueError("y must be contiguous and non-empty")
    check_device("y", y)
    shape = tuple(y.shape)
    default_values, default_warps = pass_tile(shape[-1])
    tile_values = default_values if tile_values is None else tile_values
    num_warps = default_warps if num_warps is None else num_warps
    if tile_values not in (512, 1024, 2048, 4096, 8192) or num_warps not in (1, 2, 4, 8):
        raise ValueError(f"tile_values must be a power of two in [512, 8192] and num_warps "
                         f"1, 2, 4 or 8, got {tile_values!r}, {num_warps!r}")
    if not isinstance(outputs, (list, tuple)) or not isinstance(outs, (list, tuple)) \
            or len(outputs) != len(outs) or not outputs:
        raise ValueError("outputs and outs must be non-empty sequences of the same length")
    y_bound = 2**31 if y_bound is None else int(y_bound)
    res_args, res_consts, res_bound = residual_slot(residual, shape, y)
    slots = [output_slot(i, s, o, shape, y.device, residual is not None, y_bound, res_bound,
                         fast)
             for i, (s, o) in enumerate(zip(outputs, outs, strict=True))]
    k = shape[-1]
    m = y.numel() // k
    bc = channel_tile(k)
    bp = max(16, tile_values // bc)  # 2048: 16 values a thread (int64 requantization is
    # register-hungry)
    grid = (cdiv(m, bp), cdiv(k, bc))
    launches = []
    for first in range(0, len(slots), MAX_OUTPUTS):
        group = slots[first:first + MAX_OUTPUTS]
        args: list = [y, res_args[0], m, k, res_args[1], res_args[2]]
        kwargs: dict = dict(res_consts)
        for j in range(MAX_OUTPUTS):
            a, c = group[j] if j < len(group) else _unused_slot(y)
            args += list(a)
            kwargs.update({f"{name}{j}": v for name, v in c.items()})
        kwargs.update(BLOCK_P=bp, BLOCK_C=bc, num_warps=num_warps, enable_fp_fusion=False)
        launches.append(Launch(layer_epilogue_kernel, grid, tuple(args), kwargs))
    results = tuple(o.data if isinstance(o, PackedTensor) else o for o in outs)
    return Launcher(tuple(launches), results)


def residual_slot(residual: PackedTensor | None, shape: tuple[int, ...],
                  placeholder: torch.Tensor) -> tuple[tuple, dict, int]:
    """(args (data, row, plane), constexprs, max |value|) of the layer epilogue's residual
    operand: a PackedTensor of the output's logical `shape` on `placeholder`'s device with
    |values| <= 2^23 (checked), or None (the placeholder stands in, HAS_RES False)."""
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


def pass_tile(k: int) -> tuple[int, int]:
    """(values, warps) per program of the layer epilogue for K channels: 2048 on 4 warps, or
    1024 on 2 warps where the channel tile is 64 or narrower (ResNet-18's 56 x 56 x 64 block
    end at batch 8, two outputs and a 24-bit residual: 5.65 against 8.97 us on an H200; at
    128-512 channels and at batch 256, 2048 / 4 was the fastest measured)."""
    return (1024, 2) if channel_tile(k) <= 64 else (2048, 4)


def new_outputs(outputs: Sequence[OutputSpec], layouts: Sequence[Layout | str] | None,
                shape: tuple[int, ...], device: torch.device) -> list:
    """New (uninitialized) output tensors for specs on y of logical NHWC / [M, K] `shape`:
    PackedTensors in `layouts` (INT8 by default) for requantized outputs, float32 tensors
    (NCHW with channels_first) for float ones."""
    layouts = [Layout.INT8] * len(outputs) if layouts is None else [Layout(v) for v in layouts]
    if len(layouts) != len(outputs):
        raise ValueError("layouts must have one entry per output")
    outs = []
    for i, (s, lay) in enumerate(zip(outputs, layouts, strict=True)):
        spec = as_output_spec(i, s)
        if isinstance(spec, Requantized):
            outs.append(empty_packed(shape, spec.precision, lay, device))
        else:
            nchw = (shape[0], shape[-1], *shape[1:-1]) if spec.channels_first else shape
            outs.append(torch.empty(nchw, dtype=torch.float32, device=device))
    return outs


def layer_epilogue(y: torch.Tensor, outputs: Sequence[OutputSpec],
                   layouts: Sequence[Layout | str] | None = None,
                   residual: PackedTensor | None = None) -> list[PackedTensor | torch.Tensor]:
    """`bind_layer_epilogue` with new outputs (`new_outputs`), launched once."""
    outs = new_outputs(outputs, layouts, tuple(y.shape), y.device)
    bind_layer_epilogue(y, outputs, outs, residual)()
    return outs


# --------------------------------------------------------------------------- float input
FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def check_image(x: object, dims: tuple[int, ...] = (4,)) -> torch.Tensor:
    """A contiguous float tensor (fp32 / fp16 / bf16) on the kernels' device: NCHW (or, with
    2 in `dims`, [N, C])."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUTS:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a float32, float16 or bfloat16 tensor, got {got}")
    if x.dim() not in dims or not x.is_contiguous() or x.numel() == 0:
        what = "NCHW" if dims == (4,) else "NCHW or [N, C]"
        raise ValueError(f"x must be a contiguous non-empty {what} tensor, got shape "
                         f"{tuple(x.shape)}")
    check_device("x", x)
    return x


def float32_scale(scale: object) -> float:
    """The per-tensor scale as the float32 value the kernels divide by (ValueError unless
    finite and > 0 in float32)."""
    s = torch.as_tensor(scale, dtype=torch.float64)
    if s.dim() != 0:
        raise ValueError(f"scale must be one number, got shape {tuple(s.shape)}")
    s32 = float(s.to(torch.float32))
    if not (s32 > 0 and s32 != float("inf")):
        raise ValueError(f"scale must be finite and > 0 in float32, got {float(s)!r}")
    return s32


def check_status(status: object, device: torch.device) -> torch.Tensor:
    if not isinstance(status, torch.Tensor) or status.dtype != torch.int32 or \
            status.numel() < 1 or status.device != device:
        raise ValueError(f"status must be an int32 tensor with at least one element on {device}")
    return status


def bind_quantize(x: torch.Tensor, scale: float, out: PackedTensor, relu: bool = False,
                  status: torch.Tensor | None = None) -> Launcher:
    """Quantize a float NCHW (or [N, C]) tensor into `out` (logical NHWC [N, H, W, C] or
    [N, C]; INT8 / BITPLANE, or a wide precision in INT8): `reference.quantize_float(
    relu?(x), scale, out.precision)` in NHWC order, bit for bit (a wide precision: the same
    float32 formula clamped to its range). status: optional int32 device tensor; its element
    0 is set to 1 when x held inf or nan (the caller zeroes it and reads it)."""
    x = check_image(x, (2, 4))
    n, c = x.shape[:2]
    hw = x.shape[2:]
    s32 = float32_scale(scale)
    out = check_packed("out", out, (n, *hw, c), x.device)
    if status is not None:
        check_status(status, x.device)
    o_row, o_plane = storage_strides(out)
    prec = out.precision
    # few channels (an RGB image): narrow channel tiles, many pixels per program
    bc = channel_tile(c) if out.layout is Layout.BITPLANE else max(
        4, min(128, 1 << max(0, (c - 1).bit_length())))
    bp = max(16, 4096 // bc)
    npix = x.numel() // c
    grid = (cdiv(npix, bp), cdiv(c, bc))
    args = (x, out.data, x if status is None else status, npix, npix // n, c, s32, o_row,
            o_plane)
    kwargs = dict(O_LAYOUT=layout_code(out), O_BITS=min(prec.bits, 8),
                  O_ENC=ENC[prec.encoding], QMIN=int(prec.qmin), QMAX=int(prec.qmax),
                  RELU=bool(relu), HAS_STATUS=status is not None, BLOCK_P=bp, BLOCK_C=bc,
                  num_warps=4)
    return Launcher((Launch(quantize_kernel, grid, args, kwargs),), (out.data,))


def bind_quantize_image(x: torch.Tensor, scale: float, out: PackedTensor,
                        status: torch.Tensor | None = None) -> Launcher:
    """`bind_quantize` of a float NCHW image (no ReLU)."""
    return bind_quantize(check_image(x), scale, out, False, status)


def quantize_image(x: torch.Tensor, scale: float, precision: Precision | str,
                   layout: Layout | str = Layout.INT8) -> PackedTensor:
    """`bind_quantize_image` into a new PackedTensor, launched once."""
    x = check_image(x)
    n, c, h, w = x.shape
    out = empty_packed((n, h, w, c), precision, layout, x.device)
    bind_quantize_image(x, scale, out)()
    return out
