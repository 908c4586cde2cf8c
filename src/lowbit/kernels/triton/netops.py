"""Triton kernels of the engine's integer network ops on stored tensors, bit-exact against
`lowbit.reference.netops` (formulas there):

- `bind_layer_epilogue`: int32 y = acc + bias [..., K] (+ a residual operand) -> one or more
  outputs, each requantized into its own precision and layout (INT8 or BITPLANE) with ReLU, or
  dequantized to float32 (logits);
- `bind_maxpool2d`, `bind_avgpool2d` (global included): NHWC in INT8 or BITPLANE -> the same
  or the other layout (average pool requantized);
- `bind_quantize_image`: a float NCHW image (fp32 / fp16 / bf16) -> INT8 or BITPLANE NHWC.

Quantized tensors travel as `lowbit.core.PackedTensor` (storage + logical NHWC or [M, C] shape,
precision, layout). Each `bind_*` checks its arguments once (ValueError / TypeError naming the
argument, before any launch) and returns a `Launcher`: calling it replays the launch with every
argument fixed (no host work besides Triton's launch, CUDA-graph capturable). The plain
functions (`layer_epilogue`, `maxpool2d`, ...) allocate the outputs and launch once.

Non-finite image values cannot raise inside a kernel: `bind_quantize_image(..., status=t)`
sets t[0] to 1 when the image held any (the caller reads it after the forward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...core import Layout, PackedTensor, Precision
from ...reference.netops import MULT_LIMIT, FloatOutput, RequantizedOutput
from .igemm import Launch, cdiv
from .pools import avgpool2d, bind_avgpool2d, bind_maxpool2d, maxpool2d
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
    storage_strides,
    store_values,
)

#: layer epilogue outputs per launch (more outputs: more launches, each re-reading y)
MAX_OUTPUTS = 4
KIND_NONE, KIND_REQUANT, KIND_FLOAT = 0, 1, 2
__all__ = ["Launcher", "avgpool2d", "bind_avgpool2d", "bind_layer_epilogue", "bind_maxpool2d",
           "bind_quantize_image", "empty_packed", "layer_epilogue", "maxpool2d",
           "quantize_image"]


# =========================================================================== kernels
@triton.jit
def emit_output(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, row, plane,
                 KIND: tl.constexpr, LAYOUT: tl.constexpr, BITS: tl.constexpr,
                 QLO: tl.constexpr, QMAX: tl.constexpr, HAS_RES: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, FAST: tl.constexpr):
    """One output of the layer epilogue. REQUANT: v1 multiplier, v2 residual multiplier,
    v3 shift (int32 [K]); FLOAT: v1 scale, v2 offset (float64 [K]).
    FAST (no residual): v1 holds m * 2^-s in float64 and q = floor(y * v1 + 0.5): exact where
    |y| < 2^22 and s <= 44 (`fast_requant_ok`: y * m is exact in float64, and the one rounding
    of the sum cannot cross an integer that matters for the clamp)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < K
    if KIND == 1:
        if FAST:
            ms = tl.load(v1_ptr + chan, mask=c_mask, other=0.0)
            v = tl.math.floor(y.to(tl.float64) * ms[None, :] + 0.5)
            q = tl.minimum(tl.maximum(v, QLO), QMAX).to(tl.int32)
        else:
            m = tl.load(v1_ptr + chan, mask=c_mask, other=0).to(tl.int64)
            sh = tl.load(v3_ptr + chan, mask=c_mask, other=1).to(tl.int64)
            z = y.to(tl.int64) * m[None, :]
            if HAS_RES:
                r = tl.load(v2_ptr + chan, mask=c_mask, other=0).to(tl.int64)
                z += res.to(tl.int64) * r[None, :]
            q = requant_round(z, sh[None, :])
            q = tl.minimum(tl.maximum(q, QLO), QMAX).to(tl.int32)
        store_values(out_ptr, q, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0,
                     BLOCK_P, BLOCK_C)
    elif KIND == 2:
        sc = tl.load(v1_ptr + chan, mask=c_mask, other=0.0)
        off = tl.load(v2_ptr + chan, mask=c_mask, other=0.0)
        f = y.to(tl.float64) * sc[None, :] + off[None, :]
        tl.store(out_ptr + pix[:, None] * K + chan[None, :], f.to(tl.float32),
                 mask=pix_mask[:, None] & c_mask[None, :])


def fast_requant_ok(y_bound: int, shifts: torch.Tensor) -> bool:
    """Whether `emit_output`'s FAST float64 requantization is exact: |y| < 2^22 (so
    |y * m| < 2^53) and every shift <= 44 (the rounding of y * m * 2^-s + 0.5 moves it by less
    than 2^-s below any integer of magnitude <= 2^8 + 1, the ones the clamp can tell apart)."""
    return y_bound < 2**22 and int(shifts.max()) <= 44


@triton.jit
def layer_epilogue_kernel(
    y_ptr, res_ptr, M, K, res_row, res_plane,
    o0, a0, b0, c0_, row0, plane0, o1, a1, b1, c1, row1, plane1,
    o2, a2, b2, c2, row2, plane2, o3, a3, b3, c3, row3, plane3,
    HAS_RES: tl.constexpr, RES_LAYOUT: tl.constexpr, RES_BITS: tl.constexpr,
    RES_ENC: tl.constexpr,
    KIND0: tl.constexpr, LAYOUT0: tl.constexpr, BITS0: tl.constexpr, QLO0: tl.constexpr,
    QMAX0: tl.constexpr, RES0: tl.constexpr,
    KIND1: tl.constexpr, LAYOUT1: tl.constexpr, BITS1: tl.constexpr, QLO1: tl.constexpr,
    QMAX1: tl.constexpr, RES1: tl.constexpr,
    KIND2: tl.constexpr, LAYOUT2: tl.constexpr, BITS2: tl.constexpr, QLO2: tl.constexpr,
    QMAX2: tl.constexpr, RES2: tl.constexpr,
    KIND3: tl.constexpr, LAYOUT3: tl.constexpr, BITS3: tl.constexpr, QLO3: tl.constexpr,
    QMAX3: tl.constexpr, RES3: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y (int32 [M, K]) and the residual read once per tile, then up to four outputs."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    pix_mask = pix < M
    chan = c0 + tl.arange(0, BLOCK_C)
    y = tl.load(y_ptr + pix[:, None] * K + chan[None, :],
                mask=pix_mask[:, None] & (chan < K)[None, :], other=0)
    res = y
    if HAS_RES:
        res = load_values(res_ptr, pix, pix_mask, c0, K, res_row, res_plane, RES_LAYOUT,
                          RES_BITS, RES_ENC, BLOCK_P, BLOCK_C)
    emit_output(y, res, pix, pix_mask, c0, K, o0, a0, b0, c0_, row0, plane0, KIND0, LAYOUT0,
                 BITS0, QLO0, QMAX0, RES0, BLOCK_P, BLOCK_C, False)
    if KIND1 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o1, a1, b1, c1, row1, plane1, KIND1,
                     LAYOUT1, BITS1, QLO1, QMAX1, RES1, BLOCK_P, BLOCK_C, False)
    if KIND2 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o2, a2, b2, c2, row2, plane2, KIND2,
                     LAYOUT2, BITS2, QLO2, QMAX2, RES2, BLOCK_P, BLOCK_C, False)
    if KIND3 != 0:
        emit_output(y, res, pix, pix_mask, c0, K, o3, a3, b3, c3, row3, plane3, KIND3,
                     LAYOUT3, BITS3, QLO3, QMAX3, RES3, BLOCK_P, BLOCK_C, False)


@triton.jit
def quantize_image_kernel(
    x_ptr, out_ptr, status_ptr, NHW, HW, C, scale, o_row, o_plane,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, HAS_STATUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """q = clamp(floor(x / scale + 0.5)) in float32 with IEEE division (div_rn), NCHW ->
    NHWC storage; binary: +1 for x >= 0 else -1."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    chan = c0 + tl.arange(0, BLOCK_C)
    pix_mask = pix < NHW
    mask = pix_mask[:, None] & (chan < C)[None, :]
    n = pix // HW
    hw = pix % HW
    x = tl.load(x_ptr + (n * C * HW + hw)[:, None] + (chan * HW)[None, :], mask=mask,
                other=0.0).to(tl.float32)
    q = quantize_f32(x, scale, O_ENC, QMIN, QMAX)
    if HAS_STATUS:
        flag_nonfinite(x, mask, status_ptr)
    store_values(out_ptr, q, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


# =========================================================================== host side
# --------------------------------------------------------------------------- layer epilogue
def output_slot(i: int, spec: object, out: object, shape: tuple[int, ...],
                 device: torch.device, has_residual: bool) -> tuple[tuple, dict]:
    k = shape[-1]
    if isinstance(spec, RequantizedOutput):
        p = check_packed(f"outs[{i}]", out, shape, device)
        if p.precision != spec.precision:
            raise ValueError(f"outs[{i}] holds {p.precision} but outputs[{i}] requantizes to "
                             f"{spec.precision}")
        mult = int_channel_vector(f"outputs[{i}].multiplier", spec.multiplier, k, 0,
                               MULT_LIMIT - 1, device)
        shift = int_channel_vector(f"outputs[{i}].shift", spec.shift, k, 1, 62, device)
        res_on = spec.residual_multiplier is not None
        if res_on and not has_residual:
            raise ValueError(f"outputs[{i}] has a residual_multiplier but no residual was given")
        rmul = int_channel_vector(f"outputs[{i}].residual_multiplier", spec.residual_multiplier,
                               k, -(MULT_LIMIT - 1), MULT_LIMIT - 1, device) if res_on else mult
        row, plane = storage_strides(p)
        args = (p.data, mult, rmul, shift, row, plane)
        consts = dict(KIND=KIND_REQUANT, LAYOUT=layout_code(p), BITS=p.precision.bits,
                      QLO=spec.low, QMAX=spec.precision.qmax, RES=res_on)
        return args, consts
    if isinstance(spec, FloatOutput):
        if (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
                or tuple(out.shape) != shape or not out.is_contiguous()):
            raise ValueError(f"outs[{i}] must be a contiguous float32 tensor of shape {shape} "
                             "(a FloatOutput)")
        check_device(f"outs[{i}]", out, device)
        scale = float_channel_vector(f"outputs[{i}].scale", spec.scale, k, device)
        offset = float_channel_vector(f"outputs[{i}].offset", spec.offset, k, device)
        consts = dict(KIND=KIND_FLOAT, LAYOUT=0, BITS=8, QLO=0, QMAX=0, RES=False)
        return (out, scale, offset, scale, 0, 0), consts
    raise TypeError(f"outputs[{i}] must be a RequantizedOutput or FloatOutput (the kernel's "
                    f"input already is the int32 output), got {type(spec).__name__}")


def bind_layer_epilogue(y: torch.Tensor, outputs: Sequence[RequantizedOutput | FloatOutput],
                        outs: Sequence[PackedTensor | torch.Tensor],
                        residual: PackedTensor | None = None) -> Launcher:
    """Bind the layer epilogue: y int32 [..., K] (acc + bias, contiguous), one spec per output
    (`lowbit.reference.netops`: RequantizedOutput, whose `outs` entry is a PackedTensor of y's
    logical shape in INT8 or BITPLANE layout and the spec's precision; FloatOutput, whose entry
    is a float32 tensor of y's shape), optional residual PackedTensor of y's logical shape
    (|values| <= 255). Equals `reference.epilogue_outputs(y, None, outputs, residual values)`."""
    if not isinstance(y, torch.Tensor) or y.dtype != torch.int32 or y.dim() < 1:
        raise TypeError(f"y must be an int32 tensor [..., K], got "
                        f"{y.dtype if isinstance(y, torch.Tensor) else type(y).__name__}")
    if not y.is_contiguous() or y.numel() == 0:
        raise ValueError("y must be contiguous and non-empty")
    check_device("y", y)
    shape = tuple(y.shape)
    if not isinstance(outputs, (list, tuple)) or not isinstance(outs, (list, tuple)) \
            or len(outputs) != len(outs) or not outputs:
        raise ValueError("outputs and outs must be non-empty sequences of the same length")
    res_args, res_consts = (y, 0, 0), dict(HAS_RES=False, RES_LAYOUT=0, RES_BITS=8, RES_ENC=0)
    if residual is not None:
        r = check_packed("residual", residual, shape, y.device)
        if max(abs(r.precision.qmin), abs(r.precision.qmax)) > 255:
            raise ValueError("residual values must fit |v| <= 255")
        res_args = (r.data, *storage_strides(r))
        res_consts = dict(HAS_RES=True, RES_LAYOUT=layout_code(r), RES_BITS=r.precision.bits,
                          RES_ENC=ENC[r.precision.encoding])
    slots = [output_slot(i, s, o, shape, y.device, residual is not None)
             for i, (s, o) in enumerate(zip(outputs, outs, strict=True))]
    k = shape[-1]
    m = y.numel() // k
    bc = channel_tile(k)
    bp = max(16, 4096 // bc)
    grid = (cdiv(m, bp), cdiv(k, bc))
    launches = []
    for first in range(0, len(slots), MAX_OUTPUTS):
        group = slots[first:first + MAX_OUTPUTS]
        args: list = [y, res_args[0], m, k, res_args[1], res_args[2]]
        kwargs: dict = dict(res_consts)
        for j in range(MAX_OUTPUTS):
            if j < len(group):
                a, c = group[j]
            else:
                a = (y, y, y, y, 0, 0)
                c = dict(KIND=KIND_NONE, LAYOUT=0, BITS=8, QLO=0, QMAX=0, RES=False)
            args += list(a)
            kwargs.update({f"{name}{j}": v for name, v in c.items()})
        kwargs.update(BLOCK_P=bp, BLOCK_C=bc, num_warps=4, enable_fp_fusion=False)
        launches.append(Launch(layer_epilogue_kernel, grid, tuple(args), kwargs))
    results = tuple(o.data if isinstance(o, PackedTensor) else o for o in outs)
    return Launcher(tuple(launches), results)


def layer_epilogue(y: torch.Tensor, outputs: Sequence[RequantizedOutput | FloatOutput],
                   layouts: Sequence[Layout | str] | None = None,
                   residual: PackedTensor | None = None) -> list[PackedTensor | torch.Tensor]:
    """`bind_layer_epilogue` with new outputs (requantized ones in `layouts`, INT8 by
    default), launched once."""
    layouts = [Layout.INT8] * len(outputs) if layouts is None else [Layout(v) for v in layouts]
    if len(layouts) != len(outputs):
        raise ValueError("layouts must have one entry per output")
    outs = [empty_packed(y.shape, s.precision, lay, y.device)
            if isinstance(s, RequantizedOutput) else torch.empty(y.shape, dtype=torch.float32,
                                                                 device=y.device)
            for s, lay in zip(outputs, layouts, strict=True)]
    bind_layer_epilogue(y, outputs, outs, residual)()
    return outs


# --------------------------------------------------------------------------- float image
FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def check_image(x: object) -> torch.Tensor:
    """A contiguous float NCHW tensor (fp32 / fp16 / bf16) on the kernels' device."""
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_INPUTS:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a float32, float16 or bfloat16 tensor, got {got}")
    if x.dim() != 4 or not x.is_contiguous() or x.numel() == 0:
        raise ValueError(f"x must be a contiguous non-empty NCHW tensor, got shape "
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


def bind_quantize_image(x: torch.Tensor, scale: float, out: PackedTensor,
                        status: torch.Tensor | None = None) -> Launcher:
    """Quantize a float NCHW image into `out` (logical NHWC [N, H, W, C], INT8 or BITPLANE):
    `reference.quantize_float(x, scale, out.precision)` permuted to NHWC, bit for bit.
    status: optional int32 device tensor; its element 0 is set to 1 when x held inf or nan
    (the caller zeroes it and reads it; untouched otherwise)."""
    x = check_image(x)
    n, c, h, w = x.shape
    s32 = float32_scale(scale)
    out = check_packed("out", out, (n, h, w, c), x.device)
    if status is not None:
        check_status(status, x.device)
    o_row, o_plane = storage_strides(out)
    prec = out.precision
    # few channels (an RGB image): narrow channel tiles, many pixels per program
    bc = channel_tile(c) if out.layout is Layout.BITPLANE else max(
        4, min(128, 1 << max(0, (c - 1).bit_length())))
    bp = max(16, 4096 // bc)
    grid = (cdiv(n * h * w, bp), cdiv(c, bc))
    args = (x, out.data, x if status is None else status, n * h * w, h * w, c, s32, o_row,
            o_plane)
    kwargs = dict(O_LAYOUT=layout_code(out), O_BITS=prec.bits, O_ENC=ENC[prec.encoding],
                  QMIN=prec.qmin, QMAX=prec.qmax, HAS_STATUS=status is not None,
                  BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    return Launcher((Launch(quantize_image_kernel, grid, args, kwargs),), (out.data,))


def quantize_image(x: torch.Tensor, scale: float, precision: Precision | str,
                   layout: Layout | str = Layout.INT8) -> PackedTensor:
    """`bind_quantize_image` into a new PackedTensor, launched once."""
    x = check_image(x)
    n, c, h, w = x.shape
    out = empty_packed((n, h, w, c), precision, layout, x.device)
    bind_quantize_image(x, scale, out)()
    return out
