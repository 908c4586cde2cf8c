"""Packed-domain pooling kernels on stored tensors, bit-exact against
`lowbit.reference.netops` (maxpool2d_int, avgpool2d_int) and the plan's AvgPool
(`lowbit.graph.ir`): max and average pools (global included) reading and writing INT8 or
BITPLANE (and wide 9-32 bit tensors one value per element, `WidePrecision`); bit-plane
max pools of up to 4 planes run on the words themselves (bit-sliced compares, 32 channels per
operation); a global average pool of few (image, channel block) programs splits its map over
several programs (int32 partial sums, then a second kernel sums and requantizes them:
`global_pool_splits`); `bind_avgpool_windows` takes any windows (adaptive pools, several
divisors, ReLU) from per-axis tables."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor, Precision
from ...core.hardware import TARGET
from ...reference.netops import MULT_LIMIT, pool_geometry
from .igemm import Launch, cdiv
from .stored import (
    ENC,
    Launcher,
    channel_tile,
    check_packed,
    empty_packed,
    layout_code,
    load_values,
    requant_round,
    storage_strides,
    store_values,
    value_bound,
)

#: a global average pool of at most this many (image, 64 channels) programs runs as one
#: reduction per program (H200, 7x7x2048: batch 8, 256 programs, 2.4 us against 13.0 through
#: the window loop); larger ones through `pool2d_kernel`'s window loop (batch 256, 8,192
#: programs: 14.7 us against 29.9). The window loop took ~30 us on an H100 at 1,280 programs
#: as at 8,192 (MobileNet-V2 b64 7x7x1280, ResNet-50 b256), the one-reduction kernel grows
#: ~3.4 ns a program: below ~4,096 programs it is predicted faster (1,280: ~6.5 us)
GLOBAL_POOL_PROGRAMS = 4096


#: a global pool's reduction is split over the map (`global_pool_splits`) so that its programs
#: number at least this many (four per SM) ...
SPLIT_POOL_PROGRAMS = 4 * TARGET.sms
#: ... and each reduces at most this many pixels: 8 tiles of 64 pixels. A program's tiles run
#: one after another at ~1 us a tile (latency-bound: EfficientNet-B0's squeeze-excite pool,
#: b64 112x112x32, 64 programs of 196 tiles, took 190 us on an H100), so 8-tile chunks keep
#: the chain well under the map's read time (17 us there; 1,600 programs of 8 tiles)
SPLIT_POOL_CHUNK = 512
#: ... but no split leaves a program fewer pixels than this (4 tiles): the partial sums'
#: second kernel (~2 us with its launch) costs more than the tiles a smaller chunk saves
SPLIT_POOL_MIN_CHUNK = 256


@triton.jit
def _avg_requant(acc, mult, shift, QMIN: tl.constexpr, QMAX: tl.constexpr):
    """clamp(floor((acc m + 2^(s-1)) / 2^s), QMIN, QMAX) of 2-D int32 sums acc, as int32."""
    sh = tl.full((1, 1), shift, tl.int64)
    q = requant_round(acc.to(tl.int64) * mult, sh)
    return tl.minimum(tl.maximum(q, QMIN), QMAX).to(tl.int32)


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
        acc = _avg_requant(acc, mult, shift, QMIN, QMAX)
    store_values(out_ptr, acc, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


@triton.jit
def global_avgpool_kernel(
    x_ptr, out_ptr, part_ptr, N, HW, C, CHUNK, x_row, x_plane, o_row, o_plane, mult, shift,
    PARTIAL: tl.constexpr, X_LAYOUT: tl.constexpr, X_BITS: tl.constexpr, X_ENC: tl.constexpr,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Global average pool of image n, channels c0 .. c0 + BLOCK_C over pixels
    split * CHUNK .. (split + 1) * CHUNK of its map: their sum as BLOCK_HW-pixel tiles summed
    in a reduction (all loads of a tile in flight at once), then requantized as
    `pool2d_kernel`'s average (CHUNK = HW, one split), or (PARTIAL) stored as int32 at
    part[split, n, c] for `global_pool_finish_kernel`."""
    n = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    split = tl.program_id(2)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, HW)
    acc = tl.zeros((BLOCK_C,), dtype=tl.int32)
    for h0 in range(start, end, BLOCK_HW):
        hw = h0 + tl.arange(0, BLOCK_HW)
        v = load_values(x_ptr, n * HW + hw, hw < end, c0, C, x_row, x_plane, X_LAYOUT, X_BITS,
                        X_ENC, BLOCK_HW, BLOCK_C)
        acc += tl.sum(v, axis=0)
    if PARTIAL:
        chan = c0 + tl.arange(0, BLOCK_C)
        tl.store(part_ptr + (split * N + n) * C + chan, acc, mask=chan < C)
    else:
        q = _avg_requant(acc[None, :], mult, shift, QMIN, QMAX)
        pix = tl.full((1,), n, tl.int32)
        store_values(out_ptr, q, pix, pix >= 0, c0, C, o_row, o_plane, O_LAYOUT, O_BITS,
                     O_ENC, 1, BLOCK_C)


@triton.jit
def global_pool_finish_kernel(
    part_ptr, out_ptr, N, C, SPLITS, o_row, o_plane, mult, shift,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Image n, channels c0 .. c0 + BLOCK_C of a split global pool: the int32 partial sums
    part[0 .. SPLITS, n, c] summed (BLOCK_S splits a load; exact: every partial and running
    sum is a sum of some of the map's values, below 2^31), then requantized."""
    n = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    chan = c0 + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), dtype=tl.int32)
    for s0 in range(0, SPLITS, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        ok = (s < SPLITS)[:, None] & (chan < C)[None, :]
        acc += tl.sum(tl.load(part_ptr + (s[:, None] * N + n) * C + chan[None, :], mask=ok,
                              other=0), axis=0)
    q = _avg_requant(acc[None, :], mult, shift, QMIN, QMAX)
    pix = tl.full((1,), n, tl.int32)
    store_values(out_ptr, q, pix, pix >= 0, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC, 1,
                 BLOCK_C)


@triton.jit
def window_avgpool_kernel(
    x_ptr, out_ptr, win_ptr, cidx_ptr, mult_ptr, shift_ptr, NPQ, H, W, C, P, Q,
    x_row, x_plane, o_row, o_plane,
    KH: tl.constexpr, KW: tl.constexpr, X_LAYOUT: tl.constexpr, X_BITS: tl.constexpr,
    X_ENC: tl.constexpr, O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    QLO: tl.constexpr, QMAX: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Average pool over windows from tables: win [P + Q, 2] int32 holds each output row's
    then each output column's [start, end) of valid input elements (at most KH resp. KW of
    them), cidx [P * Q] the index of each window's divisor in mult / shift (int64)."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    pix_mask = pix < NPQ
    n = pix // (P * Q)
    pq = pix % (P * Q)
    p = pq // Q
    q = pq % Q
    h0 = tl.load(win_ptr + 2 * p, mask=pix_mask, other=0)
    h1 = tl.load(win_ptr + 2 * p + 1, mask=pix_mask, other=0)
    w0 = tl.load(win_ptr + 2 * (P + q), mask=pix_mask, other=0)
    w1 = tl.load(win_ptr + 2 * (P + q) + 1, mask=pix_mask, other=0)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
    for t in range(KH * KW):
        ih = h0 + t // KW
        iw = w0 + t % KW
        ok = pix_mask & (ih < h1) & (iw < w1)
        acc += load_values(x_ptr, (n * H + ih) * W + iw, ok, c0, C, x_row, x_plane, X_LAYOUT,
                           X_BITS, X_ENC, BLOCK_P, BLOCK_C)
    ci = tl.load(cidx_ptr + pq, mask=pix_mask, other=0)
    m = tl.load(mult_ptr + ci, mask=pix_mask, other=0)
    sh = tl.load(shift_ptr + ci, mask=pix_mask, other=1)
    z = acc.to(tl.int64) * m[:, None]
    v = tl.minimum(tl.maximum(requant_round(z, sh[:, None]), QLO), QMAX).to(tl.int32)
    store_values(out_ptr, v, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


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


# =========================================================================== host side
def _codes(x: PackedTensor, out: PackedTensor, low: int | None = None) -> dict:
    """Constexprs of an input and an output operand (low: the clamp's lower bound)."""
    prec = out.precision
    return dict(X_LAYOUT=layout_code(x), X_BITS=min(x.precision.bits, 8),
                X_ENC=ENC[x.precision.encoding], O_LAYOUT=layout_code(out),
                O_BITS=min(prec.bits, 8), O_ENC=ENC[prec.encoding],
                QMIN=int(prec.qmin) if low is None else low, QMAX=int(prec.qmax))


#: programs a pool launch aims for: two per SM
POOL_PROGRAMS = 2 * TARGET.sms


def pool_block_p(npq: int, col_tiles: int, cap: int, floor: int = 16) -> int:
    """Output pixels per program: the largest power of two <= cap (a power of two) whose grid
    over npq pixels and col_tiles column tiles still has POOL_PROGRAMS programs, at least
    floor. AlexNet's 13 x 13 x 192 bit-plane pool at batch 8 had 6 programs of 256 pixels at
    the cap: 12.5 us on an H100, for 0.3 MB."""
    bp = cap
    while bp > floor and cdiv(npq, bp) * col_tiles < POOL_PROGRAMS:
        bp //= 2
    return bp


def _pool_launch(x: PackedTensor, out: PackedTensor, kh: int, kw: int, stride: int, pad: int,
                 avg: bool, mult: int, shift: int, low: int | None = None) -> Launcher:
    n, h, w, c = x.shape
    _, p, q, _ = out.shape
    x_row, x_plane = storage_strides(x)
    o_row, o_plane = storage_strides(out)
    bc = channel_tile(c)
    npq = n * p * q
    bp = pool_block_p(npq, cdiv(c, bc), max(16, 2048 // bc))
    grid = (cdiv(npq, bp), cdiv(c, bc))
    args = (x.data, out.data, npq, h, w, c, p, q, kh, kw, stride, pad, x_row, x_plane, o_row,
            o_plane, mult, shift)
    kwargs = dict(AVG=avg, **_codes(x, out, low), BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    return Launcher((Launch(pool2d_kernel, grid, args, kwargs),), (out.data,))


def _pool_shape(x: PackedTensor, kernel: int, stride: int | None, pad: int, ceil: bool = False
                ) -> tuple[int, int, int]:
    if len(x.shape) != 4:
        raise ValueError(f"x must be NHWC (4 logical dims), got {x.shape}")
    return pool_geometry(x.shape[1], x.shape[2], kernel, stride, pad, ceil)


def bind_maxpool2d(x: PackedTensor, out: PackedTensor, kernel: int, stride: int | None = None,
                   pad: int = 0, ceil: bool = False) -> Launcher:
    """Max pool (`reference.maxpool2d_int`; `ceil`: ceil_mode, its last windows' taps past the
    map masked like padding) of NHWC x into `out` (same precision, either layout, logical [N,
    P, Q, C])."""
    x = check_packed("x", x)
    stride, p, q = _pool_shape(x, kernel, stride, pad, ceil)
    n, _, _, c = x.shape
    out = check_packed("out", out, (n, p, q, c), x.data.device)
    if str(out.precision) != str(x.precision):
        raise ValueError(f"out must have x's precision {x.precision}, got {out.precision}")
    if x.layout is out.layout is Layout.BITPLANE and x.precision.bits <= 4:
        return _planes_pool_launch(x, out, kernel, stride, pad)
    return _pool_launch(x, out, kernel, kernel, stride, pad, False, 1, 1)


def _planes_pool_launch(x: PackedTensor, out: PackedTensor, kernel: int, stride: int,
                        pad: int) -> Launcher:
    n, h, w, _ = x.shape
    _, p, q, _ = out.shape
    words, x_plane = storage_strides(x)
    o_plane = storage_strides(out)[1]
    bw = min(8, 1 << max(0, (words - 1).bit_length()))
    npq = n * p * q
    bp = pool_block_p(npq, cdiv(words, bw), max(32, 2048 // bw))
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


def _check_sum_bound(x: PackedTensor, elements: int) -> None:
    if value_bound(x.precision) * elements >= 2**31:
        raise ValueError(f"a window of {elements} {x.precision} values may sum past int32")


def bind_avgpool2d(x: PackedTensor, out: PackedTensor, kernel: int | None,
                   stride: int | None, pad: int, multiplier: int | torch.Tensor,
                   shift: int | torch.Tensor, relu: bool = False) -> Launcher:
    """Average pool requantized into `out`'s precision (`reference.avgpool2d_int`; scalar
    multiplier and shift; relu: clamp at 0 too); kernel None: global (adaptive to 1x1; its map
    split over programs where they are few, `global_pool_splits`).
    |window sum| must stay below 2^31 (|v| <= 255: windows of up to 2^23 elements)."""
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
    _check_sum_bound(x, kh * kw)
    out = check_packed("out", out, (n, p, q, c), x.data.device)
    if out.precision.encoding is Encoding.BINARY:
        raise ValueError("out cannot be binary: requantize to unsigned or signed")
    low = max(int(out.precision.qmin), 0) if relu else None
    if kernel is None and n * cdiv(c, 64) <= GLOBAL_POOL_PROGRAMS:
        return _global_pool_launch(x, out, m, s, low)
    return _pool_launch(x, out, kh, kw, stride, pad, True, m, s, low)


def bind_avgpool_windows(x: PackedTensor, out: PackedTensor,
                         rows: Sequence[tuple[int, int, int]],
                         cols: Sequence[tuple[int, int, int]], counts: Sequence[int],
                         multipliers: Sequence[int] | torch.Tensor,
                         shifts: Sequence[int] | torch.Tensor, relu: bool = False) -> Launcher:
    """Average pool of NHWC x over the windows rows x cols ((start, end, count) per output
    row / column: valid input elements [start, end), divisor factor count), each window's
    sum requantized with the multiplier / shift of its divisor (row count x column count,
    an entry of `counts`): clamp(floor((sum m + 2^(s-1)) / 2^s), lo, qmax), lo = max(qmin, 0)
    with relu. The plan's AvgPool (`lowbit.graph.pools.axis_windows` makes the tables);
    `out` [N, len(rows), len(cols), C] in any layout and precision (not binary)."""
    x = check_packed("x", x)
    if len(x.shape) != 4:
        raise ValueError(f"x must be NHWC (4 logical dims), got {x.shape}")
    if x.precision.encoding is Encoding.BINARY:
        raise ValueError("average pooling of binary (-1/+1) values is not supported")
    n, h, w, c = x.shape
    counts = [int(v) for v in counts]
    mult = torch.as_tensor(multipliers, dtype=torch.int64).reshape(-1).cpu()
    shift = torch.as_tensor(shifts, dtype=torch.int64).reshape(-1).cpu()
    if not counts or mult.numel() != len(counts) or shift.numel() != len(counts):
        raise ValueError("multipliers and shifts need one entry per count")
    if int(mult.min()) < 0 or int(mult.max()) >= MULT_LIMIT or int(shift.min()) < 1 or \
            int(shift.max()) > 62:
        raise ValueError("multipliers must be in [0, 2^31) and shifts in 1..62")
    for name, wins, size in (("rows", rows, h), ("cols", cols, w)):
        if not wins or any(not 0 <= a < b <= size for a, b, _ in wins):
            raise ValueError(f"{name} must be non-empty (start, end, count) windows inside "
                             f"0..{size}")
    kh = max(b - a for a, b, _ in rows)
    kw = max(b - a for a, b, _ in cols)
    _check_sum_bound(x, kh * kw)
    index = {v: i for i, v in enumerate(counts)}
    try:
        cidx = [index[rc * cc] for _, _, rc in rows for _, _, cc in cols]
    except KeyError as e:
        raise ValueError(f"window divisor {e.args[0]} is not among counts {counts}") from None
    p, q = len(rows), len(cols)
    out = check_packed("out", out, (n, p, q, c), x.data.device)
    if out.precision.encoding is Encoding.BINARY:
        raise ValueError("out cannot be binary: requantize to unsigned or signed")
    dev = x.data.device
    win = torch.tensor([[a, b] for a, b, _ in (*rows, *cols)], dtype=torch.int32, device=dev)
    cidx_t = torch.tensor(cidx, dtype=torch.int32, device=dev)
    x_row, x_plane = storage_strides(x)
    o_row, o_plane = storage_strides(out)
    bc = channel_tile(c)
    bp = max(16, 2048 // bc)
    npq = n * p * q
    low = max(int(out.precision.qmin), 0) if relu else int(out.precision.qmin)
    codes = _codes(x, out, low)
    codes["QLO"] = codes.pop("QMIN")
    args = (x.data, out.data, win, cidx_t, mult.to(dev), shift.to(dev), npq, h, w, c, p, q,
            x_row, x_plane, o_row, o_plane)
    kwargs = dict(KH=kh, KW=kw, **codes, BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    return Launcher((Launch(window_avgpool_kernel, (cdiv(npq, bp), cdiv(c, bc)), args,
                            kwargs),), (out.data,))


def global_pool_splits(n: int, c_blocks: int, hw: int, block_hw: int) -> tuple[int, int]:
    """(splits, pixels a split) of a global pool's reduction over `hw` pixels with n x c_blocks
    (image, channel block) programs: chunks of at most SPLIT_POOL_CHUNK pixels, more splits
    while the programs number fewer than SPLIT_POOL_PROGRAMS and the chunks keep
    SPLIT_POOL_MIN_CHUNK pixels; a chunk is whole block_hw tiles. (1, hw): no split."""
    splits = max(cdiv(hw, SPLIT_POOL_CHUNK),
                 min(cdiv(SPLIT_POOL_PROGRAMS, n * c_blocks), hw // SPLIT_POOL_MIN_CHUNK))
    if splits <= 1:
        return 1, hw
    chunk = cdiv(cdiv(hw, splits), block_hw) * block_hw
    return cdiv(hw, chunk), chunk


def _global_pool_launch(x: PackedTensor, out: PackedTensor, mult: int, shift: int,
                        low: int | None = None) -> Launcher:
    """One reduction per (image, channel block) program, its map split over several programs
    (`global_pool_splits`) into an int32 [splits, N, C] scratch the launcher owns, summed and
    requantized by `global_pool_finish_kernel`."""
    n, h, w, c = x.shape
    x_row, x_plane = storage_strides(x)
    o_row, o_plane = storage_strides(out)
    bc = min(64, channel_tile(c))
    bhw = max(16, min(64, 1 << (h * w - 1).bit_length()))
    splits, chunk = global_pool_splits(n, cdiv(c, bc), h * w, bhw)
    codes = _codes(x, out, low)
    part = (torch.empty((splits, n, c), dtype=torch.int32, device=x.data.device)
            if splits > 1 else out.data)
    args = (x.data, out.data, part, n, h * w, c, chunk, x_row, x_plane, o_row, o_plane, mult,
            shift)
    kwargs = dict(PARTIAL=splits > 1, **codes, BLOCK_HW=bhw, BLOCK_C=bc, num_warps=4)
    launches = [Launch(global_avgpool_kernel, (n, cdiv(c, bc), splits), args, kwargs)]
    if splits > 1:
        args = (part, out.data, n, c, splits, o_row, o_plane, mult, shift)
        kwargs = dict(**{k: v for k, v in codes.items() if not k.startswith("X_")},
                      BLOCK_S=min(32, 1 << (splits - 1).bit_length()), BLOCK_C=bc,
                      num_warps=4)
        launches.append(Launch(global_pool_finish_kernel, (n, cdiv(c, bc)), args, kwargs))
    return Launcher(tuple(launches), (out.data,))


def maxpool2d(x: PackedTensor, kernel: int, stride: int | None = None, pad: int = 0,
              out_layout: Layout | str | None = None, ceil: bool = False) -> PackedTensor:
    """`bind_maxpool2d` into a new PackedTensor (x's layout unless out_layout), launched once."""
    x = check_packed("x", x)
    st, p, q = _pool_shape(x, kernel, stride, pad, ceil)
    out = empty_packed((x.shape[0], p, q, x.shape[3]), x.precision,
                       out_layout or x.layout, x.data.device)
    bind_maxpool2d(x, out, kernel, st, pad, ceil)()
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
