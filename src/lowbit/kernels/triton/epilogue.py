"""Triton device helpers shared by the implicit-GEMM kernels: operand unpacking and the fused
epilogue (bias, ReLU, int32 / fp16 / requantized output, register-level packing).

The integer semantics are exactly those of `lowbit.core.epilogue` (the oracle is
`lowbit.reference.apply_epilogue`); storage formats are those of `lowbit.core.layout`.
Encodings and layouts travel as small integer constexprs (see the ENC_* / OUT_* / LAYOUT_*
constants) so each combination compiles to straight-line code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout
from ...reference.netops import requant32_fits

# operand encodings (constexpr ints)
ENC_UNSIGNED, ENC_SIGNED, ENC_BINARY = 0, 1, 2
ENC_CODE = {Encoding.UNSIGNED: ENC_UNSIGNED, Encoding.SIGNED: ENC_SIGNED,
            Encoding.BINARY: ENC_BINARY}
# operand storage kinds
SRC_INT8, SRC_PACKED, SRC_FLOAT = 0, 1, 2
# output kinds
OUT_KIND_INT32, OUT_KIND_FP16, OUT_KIND_REQUANT, OUT_KIND_FLOAT = 0, 1, 2, 3
# HAS_BIAS: no bias (0 / False), int32 in accumulator units (1 / True), int64 at the output's
# shift (2: Epilogue.shifted_bias, added after the multiply), or the same requantization in
# float64 (3: `float64_requant`, where it is exact) or in int32 (4: `int32_requant`, where
# every partial sum fits)
BIAS_SHIFTED = 2
BIAS_SHIFTED_FLOAT64 = 3
BIAS_SHIFTED_INT32 = 4
#: float64 holds every integer below 2^53 exactly
FLOAT64_EXACT = 2**53
#: the float64 form's |results| stay below this (`nearest_int32` needs 2^31 - 1)
FLOOR_INT32_LIMIT = 2**30
#: the float64 form's integer sums stay below this: with the half step added they are
#: integers below 2^53 times 2^-(s+1) (`half_step_bias`)
HALF_STEP_EXACT = 2**52
#: float32 holds every integer up to 2^24 exactly
FLOAT32_EXACT_INT: tl.constexpr = tl.constexpr(2**24)
#: whether the implicit GEMM's fused layer outputs (`conv_outputs`) requantize without
#: conversion instructions (`layer_outputs.FAST_NARROW`) or with them (FAST_NARROW_CVT):
#: Triton 3.9 compiles either in the same registers (ResNet-50 w8a8 b256 block ends on 64 x
#: 32 tiles, sm_90: 129 against 128); Triton 3.6 moves the accumulator into the store's
#: layout ahead of the exponent trick (16 channels a thread, three float64 vectors of 16),
#: 126-132 registers against 106 with the conversions (8 programs of 2 warps a SM against 9;
#: on an H100 the layer2 / layer3 block ends ran 231 / 148 against 208 / 131 us). Layers
#: without a residual keep the conversion-free form on any Triton: EfficientNet-B0 b64's
#: expansion convs (SiLU table outputs) ran 15-25% slower with conversions on Triton 3.6 (H100,
#: features_6_0 block 0 27.0 against 33.7 us, network-20261207-224712 / 20261208-004037)
CONVERSION_FREE_FUSED_OUTPUTS: bool = tuple(
    int(p) for p in triton.__version__.split(".")[:2]) >= (3, 9)
# output layouts
LAYOUT_CODE = {Layout.INT8: 0, Layout.PACKED: 1, Layout.BITPLANE: 2}
LAYOUT_INT8, LAYOUT_PACKED, LAYOUT_BITPLANE = 0, 1, 2


#: the float64 whose high word is 0x43300000 and low word u is 2^52 + u: with u = y + 2^31 (y an
#: int32, its sign bit flipped) that is this plus y (`int32_to_float64`)
INT32_FLOAT64_BIAS: tl.constexpr = tl.constexpr(4503601774854144.0)  # 2^52 + 2^31
#: 1.5 2^52: a float64 of magnitude below 2^51 added to it lands on the integer nearest it,
#: held in the sum's low word (`nearest_int32`)
ROUND_MAGIC: tl.constexpr = tl.constexpr(6755399441055744.0)


@triton.jit
def int32_to_float64(y):
    """float64(y) of an int32 tile, exactly, with no conversion instruction (those run at a
    quarter of the integer rate on sm_80 / sm_90 and bounded the float64 epilogues): the
    float64 whose high word is 0x43300000 and low word y ^ 2^31 is 2^52 + 2^31 + y, and one
    subtraction of 2^52 + 2^31 leaves y."""
    low = (y.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.uint64)
    return (low | 0x4330000000000000).to(tl.float64, bitcast=True) - INT32_FLOAT64_BIAS


@triton.jit
def as_float64(y, CONVERT: tl.constexpr):
    """float64(y) of an int32 tile: a conversion instruction with CONVERT, else
    `int32_to_float64`."""
    if CONVERT:
        f = y.to(tl.float64)
    else:
        f = int32_to_float64(y.to(tl.int32))
    return f


@triton.jit
def nearest_int32(v):
    """The int32 nearest each float64 of a tile with |v| < 2^31 - 1 that is never halfway
    between two integers, with no conversion instruction: v + 1.5 2^52 rounds to
    1.5 2^52 + that integer, whose low word is the integer in two's complement.

    The floor((a + 2^(s-1)) / 2^s) of the requantizations, a an integer, is the integer
    nearest (a + 1/2) 2^-s, which lies strictly inside (q - 1/2, q + 1/2) (`half_step_bias`):
    one multiply-add and this."""
    return (v + ROUND_MAGIC).to(tl.int64, bitcast=True).to(tl.int32)


@triton.jit
def clamp_integral(v, QMIN: tl.constexpr, QMAX: tl.constexpr):
    """int32 clamp(v, QMIN, QMAX) of integer-valued float64 v, in float32 where the bounds
    are within 2^24 (one register a value instead of two; exact: float32 holds the integers
    to 2^24, and a larger |v| rounds to a value still past the bound)."""
    if QMAX < FLOAT32_EXACT_INT and -QMIN <= FLOAT32_EXACT_INT:
        q = tl.minimum(tl.maximum(v.to(tl.float32), QMIN), QMAX).to(tl.int32)
    else:
        q = tl.minimum(tl.maximum(v, QMIN), QMAX).to(tl.int32)
    return q


@triton.jit
def decode_values(pat, BITS: tl.constexpr, ENC: tl.constexpr):
    """The integer values of BITS-bit patterns (int32) in encoding ENC: unsigned (0), two's
    complement signed (1), binary 0 -> -1, 1 -> +1 (2)."""
    if ENC == 2:
        val = 2 * pat - 1
    elif ENC == 1:
        val = pat - ((pat >> (BITS - 1)) & 1) * (1 << BITS)
    else:
        val = pat
    return val


@triton.jit
def load_operand(ptr, row_off, chan, row_mask, chan_mask,
                 SRC: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr,
                 ROWS_FIRST: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Load one operand tile and return it as DOT_DTYPE values (masked elements are 0).

    row_off: element (int8/fp16) or byte (packed) offset of each row's channel 0; chan: channel
    indices. ROWS_FIRST gives a [rows, chans] tile, else [chans, rows].
    PACKED rows hold 8 // BITS elements per byte, LSB first (core.layout); they are unpacked
    here, in registers, so only the packed bytes cross DRAM.
    """
    if ROWS_FIRST:
        mask = row_mask[:, None] & chan_mask[None, :]
    else:
        mask = chan_mask[:, None] & row_mask[None, :]
    if SRC == 1:
        PER: tl.constexpr = 8 // BITS
        byte = chan // PER
        shift = (chan % PER) * BITS
        if ROWS_FIRST:
            raw = tl.load(ptr + row_off[:, None] + byte[None, :], mask=mask, other=0)
            pat = (raw.to(tl.int32) >> shift[None, :]) & ((1 << BITS) - 1)
        else:
            raw = tl.load(ptr + byte[:, None] + row_off[None, :], mask=mask, other=0)
            pat = (raw.to(tl.int32) >> shift[:, None]) & ((1 << BITS) - 1)
        val = tl.where(mask, decode_values(pat, BITS, ENC), 0)
    else:
        if ROWS_FIRST:
            val = tl.load(ptr + row_off[:, None] + chan[None, :], mask=mask, other=0)
        else:
            val = tl.load(ptr + chan[:, None] + row_off[None, :], mask=mask, other=0)
    return val.to(DOT_DTYPE)


@triton.jit
def epilogue_store(acc, offs_m, n0, M, NOUT, out_ptr, out_row, out_plane,
                   bias_ptr, scale_ptr, mult_ptr, shift_ptr,
                   HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
                   OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr,
                   QMIN: tl.constexpr, QMAX: tl.constexpr, WIDE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Apply the epilogue to an accumulator tile [BLOCK_M, BLOCK_N] and store it.

    Rows are output pixels (GEMM rows), columns output channels. out_row is the storage row
    stride (elements of the output dtype), out_plane the bit-plane stride (int32 words);
    n0 is the tile's first output channel (a multiple of BLOCK_N).
    WIDE: acc + bias may leave int32 (the launcher checks |acc| bound + max|bias|), so bias and
    ReLU run in int64; otherwise in int32, which halves the epilogue's registers (an int64
    tile of 128 x 128 over 128 threads alone is 256 registers per thread).
    HAS_BIAS == BIAS_SHIFTED (requantized outputs): bias_ptr holds int64 biases in units of
    2^-shift output steps, added to acc * multiplier (|sum| < 2^63) and rounded without
    overflow; ReLU is then the clamp at QMIN, which the launcher passes as max(qmin, 0).
    """
    offs_n = n0 + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < NOUT
    mask = m_mask[:, None] & n_mask[None, :]
    if OUT_KIND == 3:
        # float path (conv2d_fp16): fp32 accumulator -> fp16, no epilogue
        ptrs = out_ptr + offs_m[:, None] * out_row + offs_n[None, :]
        tl.store(ptrs, acc.to(tl.float16), mask=mask)
    else:
        if WIDE:
            y = acc.to(tl.int64)
        else:
            y = acc
        if HAS_BIAS == 1:
            b = tl.load(bias_ptr + offs_n, mask=n_mask, other=0)
            y = y + b.to(y.dtype)[None, :]
        if RELU:
            if HAS_BIAS < 2:  # shifted biases: ReLU is the clamp at QMIN
                y = tl.maximum(y, 0)
        if OUT_KIND == 0:
            ptrs = out_ptr + offs_m[:, None] * out_row + offs_n[None, :]
            tl.store(ptrs, y.to(tl.int32), mask=mask)
        elif OUT_KIND == 1:
            sc = tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)
            ptrs = out_ptr + offs_m[:, None] * out_row + offs_n[None, :]
            tl.store(ptrs, (y.to(tl.float32) * sc[None, :]).to(tl.float16), mask=mask)
        else:
            if HAS_BIAS == 4:
                # (acc m + (b + 2^(s-1))) >> s in int32: every partial sum fits (the launcher
                # checked |acc| m + |b| + 2^(s-1) < 2^31), two integer instructions a value
                mul = tl.load(mult_ptr + offs_n, mask=n_mask, other=0)
                sb = tl.load(bias_ptr + offs_n, mask=n_mask, other=0)
                sh = tl.load(shift_ptr + offs_n, mask=n_mask, other=1)
                z = y.to(tl.int32) * mul[None, :] + sb[None, :]
                q = tl.minimum(tl.maximum(z >> sh[None, :], QMIN), QMAX)
            elif HAS_BIAS == 3:
                # floor((acc m + b + 2^(s-1)) / 2^s), the integer nearest acc (m 2^-s) +
                # (b + 1/2) 2^-s: that sum is an integer below 2^52 times 2^-(s+1) (the
                # launcher checked), so the fused multiply-add is exact, and its rounding
                # lies in int32 (checked too); the int64 form below costs ~15 integer
                # instructions a value (64-bit emulation). No conversion instructions
                # (`int32_to_float64`, `nearest_int32`); the clamp in int32
                ms = tl.load(mult_ptr + offs_n, mask=n_mask, other=0.0)
                bs = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
                v = tl.fma(int32_to_float64(y.to(tl.int32)), ms[None, :], bs[None, :])
                q = tl.minimum(tl.maximum(nearest_int32(v), QMIN), QMAX)
            else:
                mul = tl.load(mult_ptr + offs_n, mask=n_mask, other=1).to(tl.int64)
                sh = tl.load(shift_ptr + offs_n, mask=n_mask, other=1).to(tl.int64)
                rnd = tl.full([BLOCK_N], 1, tl.int64) << (sh - 1)
                if HAS_BIAS == 2:
                    sb = tl.load(bias_ptr + offs_n, mask=n_mask, other=0).to(tl.int64)
                    z = y.to(tl.int64) * mul[None, :] + sb[None, :]
                    low = z & ((rnd << 1) - 1)[None, :]  # the rounding term joins the low bits
                    q = (z >> sh[None, :]) + ((low + rnd[None, :]) >> sh[None, :])
                else:
                    # fixed-point requantization, round half up; the int64 product is exact
                    q = (y.to(tl.int64) * mul[None, :] + rnd[None, :]) >> sh[None, :]
                q = tl.minimum(tl.maximum(q, QMIN), QMAX).to(tl.int32)
            if OUT_LAYOUT == 0:
                ptrs = out_ptr + offs_m[:, None] * out_row + offs_n[None, :]
                tl.store(ptrs, q.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                pat = tl.where(n_mask[None, :], q & ((1 << OUT_BITS) - 1), 0)
                pack_store(pat, offs_m, m_mask, n0, out_ptr, out_row, out_plane,
                           OUT_LAYOUT, OUT_BITS, BLOCK_M, BLOCK_N)


@triton.jit
def pack_store(pat, offs_m, m_mask, n0, out_ptr, out_row, out_plane,
               OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pack OUT_BITS-bit patterns [BLOCK_M, BLOCK_N] along channels in registers and store.

    PACKED: 8 // OUT_BITS patterns per uint8, LSB first. BITPLANE: one int32 word per 32
    channels and plane (channel c -> bit c % 32), planes out_plane words apart. Patterns of
    channels >= K are 0 on entry, so the padding bits come out 0.
    """
    if OUT_LAYOUT == 1:
        PER: tl.constexpr = 8 // OUT_BITS
        NB: tl.constexpr = BLOCK_N // PER
        p3 = tl.reshape(pat, (BLOCK_M, NB, PER))
        sh = tl.arange(0, PER) * OUT_BITS
        byte = tl.sum(p3 << sh[None, None, :], axis=2)
        col = n0 // PER + tl.arange(0, NB)
        ptrs = out_ptr + offs_m[:, None] * out_row + col[None, :]
        bmask = m_mask[:, None] & (col[None, :] < out_row)
        tl.store(ptrs, byte.to(tl.uint8), mask=bmask)
    else:
        NW: tl.constexpr = BLOCK_N // 32
        p3 = tl.reshape(pat, (BLOCK_M, NW, 32)).to(tl.uint32)
        lane = tl.arange(0, 32).to(tl.uint32)
        col = n0 // 32 + tl.arange(0, NW)
        wmask = m_mask[:, None] & (col[None, :] < out_row)
        for i in tl.static_range(OUT_BITS):
            word = tl.sum(((p3 >> i) & 1) << lane[None, None, :], axis=2)
            ptrs = out_ptr + i * out_plane + offs_m[:, None] * out_row + col[None, :]
            tl.store(ptrs, word.to(tl.int32, bitcast=True), mask=wmask)


def int32_requant(acc_top: int, params, device: torch.device | str
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(b + 2^(s-1), m, s) int32 [K] on `device` for the shifted-bias requantization
    floor((acc m + b + 2^(s-1)) / 2^s) of accumulators |acc| <= acc_top in int32 arithmetic,
    where every partial sum fits: acc_top m + |b| + 2^(s-1) < 2^31 on every channel
    (`reference.netops.requant32_fits`); None where a channel's may not."""
    m = params.multiplier.to(torch.int64).cpu()
    s = params.shift.to(torch.int64).cpu()
    b = params.shifted_bias.to(torch.int64).cpu()
    if not requant32_fits(m, s, b, None, acc_top):
        return None
    return tuple(v.to(torch.int32).contiguous().to(device) for v in (b + (1 << (s - 1)), m, s))


def exact_requant(acc_top: int, params, device: torch.device | str
                  ) -> tuple[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """(HAS_BIAS, (bias, multiplier, shift) vectors) of the cheapest exact shifted-bias
    requantization of accumulators |acc| <= acc_top: int32 (`int32_requant`), else float64
    (`float64_requant`; the shift vector as given); None where neither is exact (the int64
    form, BIAS_SHIFTED)."""
    narrow = int32_requant(acc_top, params, device)
    if narrow is not None:
        return BIAS_SHIFTED_INT32, narrow
    scaled = float64_requant(acc_top, params, device)
    if scaled is not None:
        return BIAS_SHIFTED_FLOAT64, (scaled[0], scaled[1], params.shift)
    return None


def float64_requant(acc_top: int, params, device: torch.device | str
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """((b + 1/2) 2^-s, m 2^-s) float64 [K] on `device` for the shifted-bias requantization
    floor((acc m + b + 2^(s-1)) / 2^s) of accumulators |acc| <= acc_top, computed as the
    integer nearest acc (m 2^-s) + (b + 1/2) 2^-s (`half_step_bias`), where that is exact in
    float64: acc_top |m| + |b| + 2^(s-1) < 2^52 on every channel (then the sum is an integer
    below 2^53 times 2^-(s+1)), and the result below FLOOR_INT32_LIMIT in magnitude (the
    kernels' `nearest_int32`); None where a channel's may not be."""
    m = params.multiplier.to(torch.int64).cpu()
    s = params.shift.to(torch.int64).cpu()
    b = params.shifted_bias.to(torch.int64).cpu()
    if not all(acc_top * abs(mi) + abs(bi) + (1 << (si - 1)) < HALF_STEP_EXACT and
               (acc_top * abs(mi) + abs(bi) + (1 << (si - 1))) >> si < FLOOR_INT32_LIMIT
               for mi, bi, si in zip(m.tolist(), b.tolist(), s.tolist(), strict=True)):
        return None
    scaled = torch.pow(2.0, -s.to(torch.float64))
    return half_step_bias(b, scaled).to(device), (m.to(torch.float64) * scaled).to(device)


def half_step_bias(b: torch.Tensor, scaled: torch.Tensor) -> torch.Tensor:
    """(b + 1/2) 2^-s in float64 (scaled: 2^-s) for integer biases |b| < 2^52: with it the
    floor((a + b + 2^(s-1)) / 2^s) of an integer a is the integer nearest a 2^-s + this, never
    a halfway case: (a + b + 1/2) / 2^s lies within 1/2 - 2^-(s+1) of that floor."""
    return (b.to(torch.float64) + 0.5) * scaled

