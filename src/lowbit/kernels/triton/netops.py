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
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor, Precision
from ...core.validate import storage_dtype, storage_shape
from ...reference.netops import (
    MULT_LIMIT,
    FloatOutput,
    RequantizedOutput,
    pool_geometry,
)
from .epilogue import LAYOUT_BITPLANE, LAYOUT_INT8, pack_store
from .igemm import Launch, cdiv, launch_or_compile
from .templates import interpreting

#: layer epilogue outputs per launch (more outputs: more launches, each re-reading y)
MAX_OUTPUTS = 4
#: a global average pool of at most this many (image, 64 channels) programs runs as one
#: reduction per program (H200, 7x7x2048: batch 8 2.4 us against 13.0 through the window
#: loop); larger ones through `pool2d_kernel`'s window loop (batch 256: 14.7 us against 29.9)
GLOBAL_POOL_PROGRAMS = 1024
ENC = {Encoding.UNSIGNED: 0, Encoding.SIGNED: 1, Encoding.BINARY: 2}
KIND_NONE, KIND_REQUANT, KIND_FLOAT = 0, 1, 2
LAYOUTS = (Layout.INT8, Layout.BITPLANE)


# =========================================================================== device helpers
@triton.jit
def load_values(ptr, pix, pix_mask, c0, C, row, plane,
                LAYOUT: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """int32 values [BLOCK_P, BLOCK_C] of pixels `pix` (storage rows) and channels
    c0 .. c0 + BLOCK_C of a stored tensor; masked elements read 0. INT8: `row` elements per
    pixel; BITPLANE: `row` words per pixel and plane, planes `plane` words apart, c0 a
    multiple of 32 (each word is loaded once and split into its 32 channels)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    mask = pix_mask[:, None] & (chan < C)[None, :]
    if LAYOUT == 0:
        v = tl.load(ptr + pix[:, None] * row + chan[None, :], mask=mask, other=0).to(tl.int32)
    else:
        NW: tl.constexpr = BLOCK_C // 32
        word = c0 // 32 + tl.arange(0, NW)
        wmask = pix_mask[:, None] & (word < row)[None, :]
        lane = tl.arange(0, 32)
        pat = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
        for i in tl.static_range(BITS):
            w = tl.load(ptr + i * plane + pix[:, None] * row + word[None, :], mask=wmask,
                        other=0)
            b = (w[:, :, None] >> lane[None, None, :]) & 1
            pat = pat | (tl.reshape(b, (BLOCK_P, BLOCK_C)) << i)
        if ENC == 2:
            v = 2 * pat - 1
        elif ENC == 1:
            v = pat - ((pat >> (BITS - 1)) & 1) * (1 << BITS)
        else:
            v = pat
        v = tl.where(mask, v, 0)
    return v


@triton.jit
def store_values(ptr, q, pix, pix_mask, c0, C, row, plane,
                 LAYOUT: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Store int32 values q [BLOCK_P, BLOCK_C] (in the precision's range) at pixels `pix`,
    channels c0 .. in the layout (BITPLANE: c0 a multiple of 32, padding channels' bits 0)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < C
    if LAYOUT == 0:
        tl.store(ptr + pix[:, None] * row + chan[None, :], q.to(ptr.dtype.element_ty),
                 mask=pix_mask[:, None] & c_mask[None, :])
    else:
        if ENC == 2:
            pat = (q > 0).to(tl.int32)
        else:
            pat = q & ((1 << BITS) - 1)
        pat = tl.where(c_mask[None, :], pat, 0)
        pack_store(pat, pix, pix_mask, c0, ptr, row, plane, 2, BITS, BLOCK_P, BLOCK_C)


@triton.jit
def requant_round(z, sh):
    """clamp-free floor((z + 2^(sh-1)) / 2^sh) of int64 z (|z| + 2^61 < 2^63)."""
    return (z + (tl.full(sh.shape, 1, tl.int64) << (sh - 1))) >> sh


# =========================================================================== kernels
@triton.jit
def _emit_output(y, res, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, row, plane,
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
    """Whether `_emit_output`'s FAST float64 requantization is exact: |y| < 2^22 (so
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
    _emit_output(y, res, pix, pix_mask, c0, K, o0, a0, b0, c0_, row0, plane0, KIND0, LAYOUT0,
                 BITS0, QLO0, QMAX0, RES0, BLOCK_P, BLOCK_C, False)
    if KIND1 != 0:
        _emit_output(y, res, pix, pix_mask, c0, K, o1, a1, b1, c1, row1, plane1, KIND1,
                     LAYOUT1, BITS1, QLO1, QMAX1, RES1, BLOCK_P, BLOCK_C, False)
    if KIND2 != 0:
        _emit_output(y, res, pix, pix_mask, c0, K, o2, a2, b2, c2, row2, plane2, KIND2,
                     LAYOUT2, BITS2, QLO2, QMAX2, RES2, BLOCK_P, BLOCK_C, False)
    if KIND3 != 0:
        _emit_output(y, res, pix, pix_mask, c0, K, o3, a3, b3, c3, row3, plane3, KIND3,
                     LAYOUT3, BITS3, QLO3, QMAX3, RES3, BLOCK_P, BLOCK_C, False)


@triton.jit
def pool2d_kernel(
    x_ptr, out_ptr, NPQ, H, W, C, P, Q, KH, KW, stride, pad, x_row, x_plane, o_row, o_plane,
    mult, shift,
    AVG: tl.constexpr, X_LAYOUT: tl.constexpr, X_BITS: tl.constexpr, X_ENC: tl.constexpr,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Max or average (window sum, zero padding counted, then requantized) over KH x KW
    windows; one program per BLOCK_P output pixels x BLOCK_C channels."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    pix_mask = pix < NPQ
    n = pix // (P * Q)
    pq = pix % (P * Q)
    h0 = (pq // Q) * stride - pad
    w0 = (pq % Q) * stride - pad
    if AVG:
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
    else:
        acc = tl.full((BLOCK_P, BLOCK_C), -2147483647, dtype=tl.int32)
    for t in range(KH * KW):
        ih = h0 + t // KW
        iw = w0 + t % KW
        ok = pix_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        v = load_values(x_ptr, (n * H + ih) * W + iw, ok, c0, C, x_row, x_plane, X_LAYOUT,
                        X_BITS, X_ENC, BLOCK_P, BLOCK_C)
        if AVG:
            acc += v
        else:
            acc = tl.where(ok[:, None], tl.maximum(acc, v), acc)
    if AVG:
        z = acc.to(tl.int64) * mult
        sh = tl.full((1, 1), shift, tl.int64)
        acc = tl.minimum(tl.maximum(requant_round(z, sh), QMIN), QMAX).to(tl.int32)
    store_values(out_ptr, acc, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


@triton.jit
def global_avgpool_kernel(
    x_ptr, out_ptr, HW, C, x_row, x_plane, o_row, o_plane, mult, shift,
    X_LAYOUT: tl.constexpr, X_BITS: tl.constexpr, X_ENC: tl.constexpr,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Global average pool of image n, channels c0 .. c0 + BLOCK_C: the whole map's sum as
    BLOCK_HW-pixel tiles summed in a reduction (all loads of a tile in flight at once), then
    requantized as `pool2d_kernel`'s average."""
    n = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    acc = tl.zeros((BLOCK_C,), dtype=tl.int32)
    for h0 in range(0, HW, BLOCK_HW):
        hw = h0 + tl.arange(0, BLOCK_HW)
        v = load_values(x_ptr, n * HW + hw, hw < HW, c0, C, x_row, x_plane, X_LAYOUT, X_BITS,
                        X_ENC, BLOCK_HW, BLOCK_C)
        acc += tl.sum(v, axis=0)
    sh = tl.full((1, BLOCK_C), shift, tl.int64)
    q = requant_round(acc[None, :].to(tl.int64) * mult, sh)
    q = tl.minimum(tl.maximum(q, QMIN), QMAX).to(tl.int32)
    pix = tl.full((1,), n, tl.int32)
    store_values(out_ptr, q, pix, pix >= 0, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC, 1,
                 BLOCK_C)


@triton.jit
def _plane_words(ptr, pix, ok, word, row, plane, i: tl.constexpr, BITS: tl.constexpr,
                 SIGNED: tl.constexpr):
    """Words [P, NW] of plane i in offset binary (a signed value's top plane flipped), 0 where
    not ok (the smallest value: the max's identity) and for i >= BITS."""
    if i < BITS:
        w = tl.load(ptr + i * plane + pix[:, None] * row + word[None, :],
                    mask=ok[:, None] & (word < row)[None, :], other=0)
        if SIGNED and i == BITS - 1:
            w = ~w
        w = tl.where(ok[:, None], w, 0)
    else:
        w = tl.zeros((pix.shape[0], word.shape[0]), dtype=tl.int32)
    return w


@triton.jit
def _sliced_max(a0, a1, a2, a3, b0, b1, b2, b3, BITS: tl.constexpr):
    """Bit-sliced max of two unsigned BITS-bit numbers (planes a_i, b_i, 32 lanes a word),
    MSB first: A wins where it is known greater."""
    gt = tl.zeros_like(a0)
    lt = tl.zeros_like(a0)
    if BITS > 3:
        gt = gt | (a3 & ~b3)
        lt = lt | (~a3 & b3)
    if BITS > 2:
        und = ~(gt | lt)
        gt = gt | (und & a2 & ~b2)
        lt = lt | (und & ~a2 & b2)
    if BITS > 1:
        und = ~(gt | lt)
        gt = gt | (und & a1 & ~b1)
        lt = lt | (und & ~a1 & b1)
    und = ~(gt | lt)
    gt = gt | (und & a0 & ~b0)
    return ((gt & a0) | (~gt & b0), (gt & a1) | (~gt & b1), (gt & a2) | (~gt & b2),
            (gt & a3) | (~gt & b3))


@triton.jit
def maxpool_planes_kernel(
    x_ptr, out_ptr, NPQ, H, W, P, Q, KH, KW, stride, pad, row, x_plane, o_plane,
    BITS: tl.constexpr, SIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Max pool on bit planes without unpacking: per tap, a bit-sliced max of up to 4 planes,
    32 channels per word op. Signed values compare as offset binary (top plane flipped);
    padding taps read the smallest value (the max's identity)."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    word = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    pmask = pix < NPQ
    n = pix // (P * Q)
    pq = pix % (P * Q)
    h0 = (pq // Q) * stride - pad
    w0 = (pq % Q) * stride - pad
    # the running max starts at the smallest value: all planes 0 (offset binary for signed)
    m0 = tl.zeros((BLOCK_P, BLOCK_W), dtype=tl.int32)
    m1 = m0
    m2 = m0
    m3 = m0
    for t in range(KH * KW):
        ih = h0 + t // KW
        iw = w0 + t % KW
        ok = pmask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        src = (n * H + ih) * W + iw
        b0 = _plane_words(x_ptr, src, ok, word, row, x_plane, 0, BITS, SIGNED)
        b1 = _plane_words(x_ptr, src, ok, word, row, x_plane, 1, BITS, SIGNED)
        b2 = _plane_words(x_ptr, src, ok, word, row, x_plane, 2, BITS, SIGNED)
        b3 = _plane_words(x_ptr, src, ok, word, row, x_plane, 3, BITS, SIGNED)
        m0, m1, m2, m3 = _sliced_max(b0, b1, b2, b3, m0, m1, m2, m3, BITS)
    if SIGNED:  # offset binary -> two's complement: flip the top plane back
        m1 = ~m1 if BITS == 2 else m1
        m2 = ~m2 if BITS == 3 else m2
        m3 = ~m3 if BITS == 4 else m3
    # padding channels: 0 in every tap, so 0 in the max (after the flip back, for signed)
    omask = pmask[:, None] & (word < row)[None, :]
    optr = out_ptr + pix[:, None] * row + word[None, :]
    tl.store(optr, m0, mask=omask)
    if BITS > 1:
        tl.store(optr + o_plane, m1, mask=omask)
    if BITS > 2:
        tl.store(optr + 2 * o_plane, m2, mask=omask)
    if BITS > 3:
        tl.store(optr + 3 * o_plane, m3, mask=omask)


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


@triton.jit
def quantize_f32(x, scale, ENC: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr):
    """int32 clamp(floor(x / scale + 0.5), QMIN, QMAX) of float32 x, IEEE-rounded division and
    add (as `lowbit.quant.quantize.quantize` on the CPU); binary: sign with 0 -> +1."""
    if ENC == 2:
        q = tl.where(x >= 0, 1, -1)
    else:
        v = tl.math.floor(tl.math.div_rn(x, scale) + 0.5)
        q = tl.minimum(tl.maximum(v, QMIN), QMAX).to(tl.int32)
    return q


@triton.jit
def flag_nonfinite(x, mask, status_ptr):
    """status[0] = 1 if any x (float32) under mask is inf or nan."""
    bad = mask & ((x != x) | (tl.abs(x) == float("inf")))
    if tl.max(bad.to(tl.int32)) > 0:
        tl.atomic_max(status_ptr, 1)


# =========================================================================== host side
@dataclass(frozen=True, eq=False)
class Launcher:
    """A bound op: `launcher()` replays its launches with every argument fixed and returns
    `outputs` (a tuple of the output storage tensors)."""

    launches: tuple[Launch, ...]
    outputs: tuple[torch.Tensor, ...]

    def __call__(self) -> tuple[torch.Tensor, ...]:
        for s in self.launches:
            launch_or_compile(s.fn, s.grid, s.args, s.kwargs, False)
        return self.outputs


def empty_packed(shape: Sequence[int], precision: Precision | str, layout: Layout | str,
                 device: torch.device | str) -> PackedTensor:
    """A new (uninitialized) PackedTensor of logical `shape` in `layout`."""
    prec = Precision.parse(precision) if isinstance(precision, str) else precision
    layout = Layout(layout)
    shape = tuple(int(s) for s in shape)
    data = torch.empty(storage_shape(shape, prec, layout), dtype=storage_dtype(prec, layout),
                       device=device)
    return PackedTensor(data, shape, prec, layout)


def _check_device(name: str, t: torch.Tensor, device: torch.device | None = None) -> None:
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(f"{name} must be on a CUDA device for Triton kernels, got {t.device} "
                         "(set TRITON_INTERPRET=1 to run them on the CPU)")


def check_packed(name: str, t: object, shape: tuple[int, ...] | None = None,
                 device: torch.device | None = None) -> PackedTensor:
    """A PackedTensor in INT8 or BITPLANE layout whose data matches its shape, precision and
    layout (and `shape` / `device` where given)."""
    if not isinstance(t, PackedTensor):
        raise TypeError(f"{name} must be a lowbit.core.PackedTensor, got {type(t).__name__}")
    if t.layout not in LAYOUTS:
        raise ValueError(f"{name}.layout must be 'int8' or 'bitplane', got '{t.layout.value}'")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have logical shape {tuple(shape)}, got {t.shape}")
    want_shape = storage_shape(t.shape, t.precision, t.layout)
    want_dtype = storage_dtype(t.precision, t.layout)
    d = t.data
    if d.dtype != want_dtype or tuple(d.shape) != want_shape or not d.is_contiguous():
        raise ValueError(f"{name}.data must be a contiguous {want_dtype} tensor of shape "
                         f"{want_shape} ({t.precision}, layout '{t.layout.value}', logical "
                         f"{t.shape}), got {d.dtype} {tuple(d.shape)}")
    _check_device(f"{name}.data", d, device)
    return t


def _strides(t: PackedTensor) -> tuple[int, int]:
    """(row, plane): storage elements per pixel (INT8: C; BITPLANE: words), words per plane."""
    c = t.shape[-1]
    if t.layout is Layout.BITPLANE:
        words = cdiv(c, 32)
        return words, (t.data.numel() // t.precision.bits)
    return c, 0


def _layout_code(t: PackedTensor) -> int:
    return LAYOUT_BITPLANE if t.layout is Layout.BITPLANE else LAYOUT_INT8


def _operand_constexprs(t: PackedTensor) -> tuple[int, int, int]:
    return _layout_code(t), t.precision.bits, ENC[t.precision.encoding]


def _channel_vector(name: str, v: object, k: int, lo: int, hi: int,
                    device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(v)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or an integer tensor, got {t.dtype}")
    t = t.to(torch.int64).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,):
        raise ValueError(f"{name} must be a scalar or a vector of length {k}, got shape "
                         f"{tuple(t.shape)}")
    if int(t.min()) < lo or int(t.max()) > hi:
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got [{int(t.min())}, "
                         f"{int(t.max())}]")
    return t.to(torch.int32).contiguous().to(device)


def _float_channel_vector(name: str, v: object, k: int, device: torch.device) -> torch.Tensor:
    t = torch.zeros(()) if v is None else torch.as_tensor(v)
    t = t.to(torch.float64).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,) or not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be a finite scalar or vector of length {k}")
    return t.contiguous().to(device)


def _block_c(k: int) -> int:
    """Channel tile: a power of two >= 32 (whole words for bit planes), at most 128."""
    return max(32, min(128, 1 << max(0, (k - 1).bit_length())))


# --------------------------------------------------------------------------- layer epilogue
def _output_slot(i: int, spec: object, out: object, shape: tuple[int, ...],
                 device: torch.device, has_residual: bool) -> tuple[tuple, dict]:
    k = shape[-1]
    if isinstance(spec, RequantizedOutput):
        p = check_packed(f"outs[{i}]", out, shape, device)
        if p.precision != spec.precision:
            raise ValueError(f"outs[{i}] holds {p.precision} but outputs[{i}] requantizes to "
                             f"{spec.precision}")
        mult = _channel_vector(f"outputs[{i}].multiplier", spec.multiplier, k, 0,
                               MULT_LIMIT - 1, device)
        shift = _channel_vector(f"outputs[{i}].shift", spec.shift, k, 1, 62, device)
        res_on = spec.residual_multiplier is not None
        if res_on and not has_residual:
            raise ValueError(f"outputs[{i}] has a residual_multiplier but no residual was given")
        rmul = _channel_vector(f"outputs[{i}].residual_multiplier", spec.residual_multiplier,
                               k, -(MULT_LIMIT - 1), MULT_LIMIT - 1, device) if res_on else mult
        row, plane = _strides(p)
        args = (p.data, mult, rmul, shift, row, plane)
        consts = dict(KIND=KIND_REQUANT, LAYOUT=_layout_code(p), BITS=p.precision.bits,
                      QLO=spec.low, QMAX=spec.precision.qmax, RES=res_on)
        return args, consts
    if isinstance(spec, FloatOutput):
        if (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
                or tuple(out.shape) != shape or not out.is_contiguous()):
            raise ValueError(f"outs[{i}] must be a contiguous float32 tensor of shape {shape} "
                             "(a FloatOutput)")
        _check_device(f"outs[{i}]", out, device)
        scale = _float_channel_vector(f"outputs[{i}].scale", spec.scale, k, device)
        offset = _float_channel_vector(f"outputs[{i}].offset", spec.offset, k, device)
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
    _check_device("y", y)
    shape = tuple(y.shape)
    if not isinstance(outputs, (list, tuple)) or not isinstance(outs, (list, tuple)) \
            or len(outputs) != len(outs) or not outputs:
        raise ValueError("outputs and outs must be non-empty sequences of the same length")
    res_args, res_consts = (y, 0, 0), dict(HAS_RES=False, RES_LAYOUT=0, RES_BITS=8, RES_ENC=0)
    if residual is not None:
        r = check_packed("residual", residual, shape, y.device)
        if max(abs(r.precision.qmin), abs(r.precision.qmax)) > 255:
            raise ValueError("residual values must fit |v| <= 255")
        res_args = (r.data, *_strides(r))
        res_consts = dict(HAS_RES=True, RES_LAYOUT=_layout_code(r), RES_BITS=r.precision.bits,
                          RES_ENC=ENC[r.precision.encoding])
    slots = [_output_slot(i, s, o, shape, y.device, residual is not None)
             for i, (s, o) in enumerate(zip(outputs, outs, strict=True))]
    k = shape[-1]
    m = y.numel() // k
    bc = _block_c(k)
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


# --------------------------------------------------------------------------- pooling
def _pool_launch(x: PackedTensor, out: PackedTensor, kh: int, kw: int, stride: int, pad: int,
                 avg: bool, mult: int, shift: int) -> Launcher:
    n, h, w, c = x.shape
    _, p, q, _ = out.shape
    x_row, x_plane = _strides(x)
    o_row, o_plane = _strides(out)
    bc = _block_c(c)
    bp = max(16, 2048 // bc)
    npq = n * p * q
    grid = (cdiv(npq, bp), cdiv(c, bc))
    prec = out.precision
    args = (x.data, out.data, npq, h, w, c, p, q, kh, kw, stride, pad, x_row, x_plane, o_row,
            o_plane, mult, shift)
    kwargs = dict(AVG=avg, X_LAYOUT=_layout_code(x), X_BITS=x.precision.bits,
                  X_ENC=ENC[x.precision.encoding], O_LAYOUT=_layout_code(out), O_BITS=prec.bits,
                  O_ENC=ENC[prec.encoding], QMIN=prec.qmin, QMAX=prec.qmax,
                  BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    return Launcher((Launch(pool2d_kernel, grid, args, kwargs),), (out.data,))


def _pool_shape(x: PackedTensor, kernel: int, stride: int | None, pad: int
                ) -> tuple[int, int, int]:
    if len(x.shape) != 4:
        raise ValueError(f"x must be NHWC (4 logical dims), got {x.shape}")
    return pool_geometry(x.shape[1], x.shape[2], kernel, stride, pad)


def bind_maxpool2d(x: PackedTensor, out: PackedTensor, kernel: int, stride: int | None = None,
                   pad: int = 0) -> Launcher:
    """Max pool (`reference.maxpool2d_int`) of NHWC x into `out` (same precision, either
    layout, logical [N, P, Q, C])."""
    x = check_packed("x", x)
    stride, p, q = _pool_shape(x, kernel, stride, pad)
    n, _, _, c = x.shape
    out = check_packed("out", out, (n, p, q, c), x.data.device)
    if out.precision != x.precision:
        raise ValueError(f"out must have x's precision {x.precision}, got {out.precision}")
    if x.layout is out.layout is Layout.BITPLANE and x.precision.bits <= 4:
        return _planes_pool_launch(x, out, kernel, stride, pad)
    return _pool_launch(x, out, kernel, kernel, stride, pad, False, 1, 1)


def _planes_pool_launch(x: PackedTensor, out: PackedTensor, kernel: int, stride: int,
                        pad: int) -> Launcher:
    n, h, w, _ = x.shape
    _, p, q, _ = out.shape
    words, x_plane = _strides(x)
    o_plane = _strides(out)[1]
    bw = min(8, 1 << max(0, (words - 1).bit_length()))
    bp = max(32, 2048 // bw)
    npq = n * p * q
    args = (x.data, out.data, npq, h, w, p, q, kernel, kernel, stride, pad, words, x_plane,
            o_plane)
    kwargs = dict(BITS=x.precision.bits, SIGNED=x.precision.encoding is Encoding.SIGNED,
                  BLOCK_P=bp, BLOCK_W=bw, num_warps=4)
    grid = (cdiv(npq, bp), cdiv(words, bw))
    return Launcher((Launch(maxpool_planes_kernel, grid, args, kwargs),), (out.data,))


def _avg_constants(x: PackedTensor, multiplier: object, shift: object) -> tuple[int, int]:
    m, s = int(torch.as_tensor(multiplier)), int(torch.as_tensor(shift))
    if not 0 <= m < MULT_LIMIT or not 1 <= s <= 62:
        raise ValueError(f"multiplier must be in [0, 2^31) and shift in 1..62, got {m}, {s}")
    if x.precision.encoding is Encoding.BINARY:
        raise ValueError("average pooling of binary (-1/+1) values is not supported")
    return m, s


def bind_avgpool2d(x: PackedTensor, out: PackedTensor, kernel: int | None,
                   stride: int | None, pad: int, multiplier: int | torch.Tensor,
                   shift: int | torch.Tensor) -> Launcher:
    """Average pool requantized into `out`'s precision (`reference.avgpool2d_int`; scalar
    multiplier and shift); kernel None: global (adaptive to 1x1). |window sum| must stay below
    2^31 (|v| <= 255: windows of up to 2^23 elements)."""
    x = check_packed("x", x)
    m, s = _avg_constants(x, multiplier, shift)
    if len(x.shape) != 4:
        raise ValueError(f"x must be NHWC (4 logical dims), got {x.shape}")
    n, h, w, c = x.shape
    if kernel is None:
        kh, kw, stride, pad, p, q = h, w, 1, 0, 1, 1
    else:
        stride, p, q = _pool_shape(x, kernel, stride, pad)
        kh = kw = kernel
    if kh * kw * 256 >= 2**31:
        raise ValueError(f"a {kh}x{kw} window's sum may leave int32")
    out = check_packed("out", out, (n, p, q, c), x.data.device)
    if out.precision.encoding is Encoding.BINARY:
        raise ValueError("out cannot be binary: requantize to unsigned or signed")
    if kernel is None and n * cdiv(c, 64) <= GLOBAL_POOL_PROGRAMS:
        return _global_pool_launch(x, out, m, s)
    return _pool_launch(x, out, kh, kw, stride, pad, True, m, s)


def _global_pool_launch(x: PackedTensor, out: PackedTensor, mult: int, shift: int
                        ) -> Launcher:
    n, h, w, c = x.shape
    x_row, x_plane = _strides(x)
    o_row, o_plane = _strides(out)
    bc = min(64, _block_c(c))
    bhw = max(16, min(64, 1 << (h * w - 1).bit_length()))
    prec = out.precision
    args = (x.data, out.data, h * w, c, x_row, x_plane, o_row, o_plane, mult, shift)
    kwargs = dict(X_LAYOUT=_layout_code(x), X_BITS=x.precision.bits,
                  X_ENC=ENC[x.precision.encoding], O_LAYOUT=_layout_code(out), O_BITS=prec.bits,
                  O_ENC=ENC[prec.encoding], QMIN=prec.qmin, QMAX=prec.qmax, BLOCK_HW=bhw,
                  BLOCK_C=bc, num_warps=4)
    return Launcher((Launch(global_avgpool_kernel, (n, cdiv(c, bc)), args, kwargs),),
                    (out.data,))


def maxpool2d(x: PackedTensor, kernel: int, stride: int | None = None, pad: int = 0,
              out_layout: Layout | str | None = None) -> PackedTensor:
    """`bind_maxpool2d` into a new PackedTensor (x's layout unless out_layout), launched once."""
    x = check_packed("x", x)
    st, p, q = _pool_shape(x, kernel, stride, pad)
    out = empty_packed((x.shape[0], p, q, x.shape[3]), x.precision,
                       out_layout or x.layout, x.data.device)
    bind_maxpool2d(x, out, kernel, st, pad)()
    return out


def avgpool2d(x: PackedTensor, kernel: int | None, stride: int | None, pad: int,
              multiplier: int | torch.Tensor, shift: int | torch.Tensor,
              out_precision: Precision | str, out_layout: Layout | str | None = None
              ) -> PackedTensor:
    """`bind_avgpool2d` into a new PackedTensor, launched once."""
    x = check_packed("x", x)
    if kernel is None:
        p = q = 1
    else:
        _, p, q = _pool_shape(x, kernel, stride, pad)
    out = empty_packed((x.shape[0], p, q, x.shape[3]), out_precision,
                       out_layout or x.layout, x.data.device)
    bind_avgpool2d(x, out, kernel, stride, pad, multiplier, shift)()
    return out


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
    _check_device("x", x)
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
    o_row, o_plane = _strides(out)
    prec = out.precision
    # few channels (an RGB image): narrow channel tiles, many pixels per program
    bc = _block_c(c) if out.layout is Layout.BITPLANE else max(
        4, min(128, 1 << max(0, (c - 1).bit_length())))
    bp = max(16, 4096 // bc)
    grid = (cdiv(n * h * w, bp), cdiv(c, bc))
    args = (x, out.data, x if status is None else status, n * h * w, h * w, c, s32, o_row,
            o_plane)
    kwargs = dict(O_LAYOUT=_layout_code(out), O_BITS=prec.bits, O_ENC=ENC[prec.encoding],
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
