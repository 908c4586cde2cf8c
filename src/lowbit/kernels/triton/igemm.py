"""The one implicit-GEMM Triton kernel behind the conv and GEMM templates.

GEMM view of conv2d (NHWC x KRSC -> NPQK): rows m = (n, p, q) output pixels, columns = the K
filters, reduction over (r, s, c). The reduction loop is flattened over (r, s, C-chunk) so that
Triton software-pipelines all of it (num_stages), whatever C is; the im2col operand is never
materialized: each iteration gathers BLOCK_M input pixels shifted by (r, s) from NHWC memory,
zero-masking padding and channels past C. A GEMM is the case H = W = R = S = 1 (IS_GEMM skips
the spatial index arithmetic). ROW_TAPS (LOOP_ORDER "r_sc", small C): in NHWC the S taps of a
kernel row are S*C contiguous values of one input row (and of one KRSC weight row), so the loop
runs over (r, chunk of S*C) and a 3-channel 7x7 stem takes 7 steps of 32 instead of 49 steps
with 3 of 32 channels used. Tiles are visited in GROUP_M-row groups (L2 reuse of weights).
Split-K writes int32 partials [SPLIT_K, M, NOUT]; they are summed in a fixed order (so float
partials too give one result) before the epilogue, either by a second small kernel or, with
SUM_IN_KERNEL, by the last program of a tile to finish (one launch; a per-tile arrival counter
in global memory, reset by that program for the next launch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .epilogue import OUT_KIND_FLOAT, SRC_PACKED, epilogue_store, load_operand
from .zero_point import shifted_act, with_zero_point


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program `pid` in the grouped (swizzled) order: GROUP_M row
    tiles run next to each other over every column tile, so they share each weight tile in L2."""
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def tap_and_chunk(it, taps, chunks, LOOP_CRS: tl.constexpr):
    """(tap r*S+s, channel chunk) of reduction step `it`: chunk outer and taps inner when
    LOOP_CRS, else tap outer."""
    if LOOP_CRS:
        return it % taps, it // taps
    return it // chunks, it % chunks


@triton.jit
def store_partial(acc, offs_m, offs_n, pid_k, M, NOUT, part_ptr):
    """Store split `pid_k`'s partial tile into [SPLIT_K, M, NOUT] (rows >= M dropped)."""
    ptrs = part_ptr + pid_k * M * NOUT + offs_m[:, None] * NOUT + offs_n[None, :]
    tl.store(ptrs, acc, mask=(offs_m < M)[:, None] & (offs_n < NOUT)[None, :])


@triton.jit
def arrived_last(counter_ptr, SPLIT_K: tl.constexpr):
    """Count this program's arrival at its tile's counter (after its partial is stored);
    True in the program that arrives last, which also resets the counter to zero.

    The semaphore pattern of CUTLASS's serial split-K: every thread's stores, a CTA barrier,
    then one release increment at GPU scope; the last program's acquire makes the other
    programs' partials visible to it."""
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT_K - 1
    tl.store(counter_ptr, 0, mask=last)
    return last


@triton.jit
def sum_partials(part_ptr, offs_m, offs_n, M, NOUT, SPLIT_K: tl.constexpr, FLOAT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Sum of the SPLIT_K partial tiles at (offs_m, offs_n) of [SPLIT_K, M, NOUT], in split
    order (FLOAT: fp32 partials, OUT_KIND_FLOAT; else int32); read through L2 (.cg): other
    SMs wrote them."""
    mask = (offs_m < M)[:, None] & (offs_n < NOUT)[None, :]
    ptrs = part_ptr + offs_m[:, None] * NOUT + offs_n[None, :]
    if FLOAT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    # a loop, not unrolled: one partial tile live in registers at a time (offline ptxas,
    # sm_90: unrolled, 128 x 128 tiles on 4 warps spilled 0.3-1.4 KB for SPLIT_K 2-4)
    for i in range(SPLIT_K):
        acc += tl.load(ptrs + i * M * NOUT, mask=mask, other=0, cache_modifier=".cg")
    return acc


@triton.jit
def output_pixels(offs_m, P, Q, conv_stride, pad, IS_GEMM: tl.constexpr):
    """(image n, input row p*stride - pad, input column q*stride - pad) of the output pixels
    (n, p, q) that GEMM rows offs_m are (row-major over N x P x Q): tap (r, s) reads input
    pixel (n, ih0 + r, iw0 + s). IS_GEMM: rows are input rows, the three are unused."""
    if IS_GEMM:
        n_img = offs_m
        ih0 = offs_m
        iw0 = offs_m
    else:
        n_img = offs_m // (P * Q)
        pq = offs_m % (P * Q)
        ih0 = (pq // Q) * conv_stride - pad
        iw0 = (pq % Q) * conv_stride - pad
    return n_img, ih0, iw0


@triton.jit
def tap_operands(x_ptr, w_ptr, it, chunks, n_img, ih0, iw0, m_mask, offs_m, w_base, n_mask,
                 H, W, C, x_row, w_row, R: tl.constexpr, S: tl.constexpr, IS_GEMM: tl.constexpr,
                 A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr,
                 A_ZERO: tl.constexpr,
                 W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
                 LOOP_CRS: tl.constexpr, EVEN_C: tl.constexpr, ALIGN_C: tl.constexpr,
                 DOT_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """Operand tiles [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] of reduction step `it`: one tap
    (r, s) and one chunk of its C channels.

    A_ZERO: u8 activations' zero point (`zero_point`: the bytes with their top bit flipped).
    ALIGN_C: a power of two dividing C, x_row and w_row (`channel_alignment`). Triton only
    knows divisibility by 16 of run-time integers, so without the hint a row stride of, say,
    1000 bytes makes every operand load a 1-byte load (no cp.async); with it, the loads are
    ALIGN_C bytes wide and the channel mask of the last chunk keeps that width."""
    rs, cc = tap_and_chunk(it, R * S, chunks, LOOP_CRS)
    chan = cc * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN_C:
        # C % BLOCK_K == 0: no channel mask, so loads stay 16-byte vectors
        c_mask = tl.full([BLOCK_K], 1, tl.int1)
    else:
        c_mask = chan < C
        if ALIGN_C > 1:  # C % ALIGN_C == 0: the mask is constant over aligned runs of channels
            c_mask = tl.max_constancy(c_mask, ALIGN_C)
    if IS_GEMM:
        a_off = offs_m * x_row
        a_mask = m_mask
    else:
        ih = ih0 + rs // S
        iw = iw0 + rs % S
        a_mask = m_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_off = ((n_img * H + ih) * W + iw) * x_row
    w_off = (w_base + rs) * w_row
    if ALIGN_C > 1:
        a_off = tl.multiple_of(a_off, ALIGN_C)
        w_off = tl.multiple_of(w_off, ALIGN_C)
    if A_ZERO != 0:
        a = load_operand(x_ptr, a_off, chan, a_mask, c_mask, A_SRC, A_BITS, A_ENC, True,
                         tl.uint8)
        a = shifted_act(a, A_ZERO)
    else:
        a = load_operand(x_ptr, a_off, chan, a_mask, c_mask, A_SRC, A_BITS, A_ENC, True, DOT_T)
    b = load_operand(w_ptr, w_off, chan, n_mask, c_mask, W_SRC, W_BITS, W_ENC, False, DOT_T)
    return a, b


@triton.jit
def row_taps_operands(x_ptr, w_ptr, it, chunks, n_img, ih0, iw0, m_mask, offs_n, n_mask,
                      H, W, C, R: tl.constexpr, S: tl.constexpr, A_ZERO: tl.constexpr,
                      DOT_T: tl.constexpr, BLOCK_K: tl.constexpr):
    """ROW_TAPS operand tiles of step `it`: kernel row r = it // chunks and a chunk of its S*C
    (tap s, channel c) pairs, k = s*C + c, contiguous in NHWC x and KRSC w rows of exactly C
    values (one value per element: the int8 layout or fp16)."""
    r = it // chunks
    k = (it % chunks) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = k < S * C
    ih = ih0 + r
    iw = iw0[:, None] + (k // C)[None, :]
    a_mask = ((m_mask & (ih >= 0) & (ih < H))[:, None] & k_mask[None, :]
              & (iw >= 0) & (iw < W))
    a_row = ((n_img * H + ih) * W + iw0) * C
    a = tl.load(x_ptr + a_row[:, None] + k[None, :], mask=a_mask, other=0)
    b = tl.load(w_ptr + ((offs_n * R + r) * (S * C))[None, :] + k[:, None],
                mask=k_mask[:, None] & n_mask[None, :], other=0)
    if A_ZERO != 0:
        return shifted_act(a, A_ZERO), b.to(DOT_T)
    return a.to(DOT_T), b.to(DOT_T)


@triton.jit
def tile_accumulator(
    x_ptr, w_ptr, zp_ptr, pid_m, pid_n, pid_k, M, NOUT, H, W, C, P, Q, conv_stride, pad,
    x_row, w_row, iters_per_split,
    R: tl.constexpr, S: tl.constexpr, IS_GEMM: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    DOT_FP16: tl.constexpr, FLOAT_OUT: tl.constexpr, LOOP_CRS: tl.constexpr,
    EVEN_C: tl.constexpr, ALIGN_C: tl.constexpr, ROW_TAPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """(offs_m, offs_n, acc) of output tile (pid_m, pid_n) over reduction split pid_k: the
    rows' output pixels, the columns' filters and the int32 partial sum (fp32 for FLOAT_OUT
    on fp16 tensor cores), with u8 activations' zero-point term in split 0's."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < NOUT
    n_img, ih0, iw0 = output_pixels(offs_m, P, Q, conv_stride, pad, IS_GEMM)
    w_base = offs_n * (R * S)

    if DOT_FP16:
        DOT_T: tl.constexpr = tl.float16
        ACC_T: tl.constexpr = tl.float32
    else:
        DOT_T: tl.constexpr = tl.int8
        ACC_T: tl.constexpr = tl.int32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_T)

    if ROW_TAPS:
        chunks = tl.cdiv(S * C, BLOCK_K)
        total = R * chunks
    else:
        chunks = tl.cdiv(C, BLOCK_K)
        total = R * S * chunks
    it_lo = pid_k * iters_per_split
    it_hi = tl.minimum(it_lo + iters_per_split, total)
    for it in range(it_lo, it_hi):
        if ROW_TAPS:
            a, b = row_taps_operands(x_ptr, w_ptr, it, chunks, n_img, ih0, iw0, m_mask, offs_n,
                                     n_mask, H, W, C, R, S, A_ZERO, DOT_T, BLOCK_K)
        else:
            a, b = tap_operands(x_ptr, w_ptr, it, chunks, n_img, ih0, iw0, m_mask, offs_m,
                                w_base, n_mask, H, W, C, x_row, w_row, R, S, IS_GEMM,
                                A_SRC, A_BITS, A_ENC, A_ZERO, W_SRC, W_BITS, W_ENC, LOOP_CRS,
                                EVEN_C, ALIGN_C, DOT_T, BLOCK_K)
        acc = tl.dot(a, b, acc, out_dtype=ACC_T)
    acc = with_zero_point(acc, zp_ptr, offs_n, n_mask, pid_k, A_ZERO)

    if DOT_FP16 and not FLOAT_OUT:
        # integer operands on fp16 tensor cores: every partial sum is an integer < 2^24 (checked
        # by the template), so the fp32 accumulator holds it exactly
        acc = acc.to(tl.int32)
    return offs_m, offs_n, acc


@triton.jit
def igemm_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr, part_ptr, count_ptr,
    zp_ptr, M, NOUT, H, W, C, P, Q, conv_stride, pad,
    x_row, w_row, out_row, out_plane, iters_per_split,
    R: tl.constexpr, S: tl.constexpr, IS_GEMM: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    DOT_FP16: tl.constexpr,
    HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, SPLIT_K: tl.constexpr, SUM_IN_KERNEL: tl.constexpr,
    LOOP_CRS: tl.constexpr, EVEN_C: tl.constexpr, ALIGN_C: tl.constexpr, ROW_TAPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(NOUT, BLOCK_N),
                                GROUP_M)
    offs_m, offs_n, acc = tile_accumulator(
        x_ptr, w_ptr, zp_ptr, pid_m, pid_n, pid_k, M, NOUT, H, W, C, P, Q, conv_stride, pad,
        x_row, w_row, iters_per_split, R, S, IS_GEMM, A_SRC, A_BITS, A_ENC, A_ZERO, W_SRC,
        W_BITS, W_ENC, DOT_FP16, OUT_KIND == 3, LOOP_CRS, EVEN_C, ALIGN_C, ROW_TAPS, BLOCK_M,
        BLOCK_N, BLOCK_K)
    finish = True  # this program runs its tile's epilogue
    if SPLIT_K > 1:
        store_partial(acc, offs_m, offs_n, pid_k, M, NOUT, part_ptr)
        finish = False  # split_k_epilogue_kernel does
        if SUM_IN_KERNEL:
            finish = arrived_last(count_ptr + tl.program_id(0), SPLIT_K)
            if finish:
                acc = sum_partials(part_ptr, offs_m, offs_n, M, NOUT, SPLIT_K, OUT_KIND == 3,
                                   BLOCK_M, BLOCK_N)
    if finish:
        epilogue_store(acc, offs_m, pid_n * BLOCK_N, M, NOUT, out_ptr, out_row, out_plane,
                       bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                       OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M, BLOCK_N)


@triton.jit
def split_k_epilogue_kernel(
    part_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr,
    M, NOUT, out_row, out_plane,
    SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
    OUT_KIND: tl.constexpr, OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr,
    QMIN: tl.constexpr, QMAX: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Sum the SPLIT_K partial tiles [SPLIT_K, M, NOUT], then run the epilogue."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = sum_partials(part_ptr, offs_m, offs_n, M, NOUT, SPLIT_K, OUT_KIND == 3,
                       BLOCK_M, BLOCK_N)
    epilogue_store(acc, offs_m, tl.program_id(1) * BLOCK_N, M, NOUT, out_ptr, out_row, out_plane,
                   bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                   OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M, BLOCK_N)


@dataclass(frozen=True)
class Problem:
    """Everything the kernel needs to know about one call except the tensors.

    Strides are in storage elements: x_row per input pixel (GEMM row), w_row per (k, r, s)
    filter row, out_row per output row, out_plane per bit plane. `operand` fields are
    (SRC_*, bits, ENC_*) triples; `out` is (OUT_KIND_*, LAYOUT_*, bits, qmin, qmax).
    """

    M: int
    NOUT: int
    H: int
    W: int
    C: int
    P: int
    Q: int
    stride: int
    pad: int
    R: int
    S: int
    is_gemm: bool
    x_row: int
    w_row: int
    out_row: int
    out_plane: int
    a_operand: tuple[int, int, int]
    w_operand: tuple[int, int, int]
    dot_fp16: bool
    bias: bool | int  # the kernels' HAS_BIAS: False, True (accumulator units), BIAS_SHIFTED
    # (its float64 / int32 forms: epilogue.exact_requant)
    relu: bool
    out: tuple[int, int, int, int, int]
    wide: bool = False  # acc + bias may leave int32: bias and ReLU in int64
    #: subtracted from u8 activations in the dot (`zero_point.act_zero_point`), else 0
    a_zero: int = 0


@dataclass(frozen=True)
class SplitWorkspace:
    """Scratch of a split-K launch: `partials` [SPLIT_K, M, NOUT] (int32, fp32 for float
    outputs) and `arrivals` (one int32 counter per output tile, zero between launches). One
    workspace serves one launch at a time (a bound launcher owns one)."""

    partials: torch.Tensor
    arrivals: torch.Tensor


def split_workspace(prob: Problem, split: int, tiles: int, device: torch.device | str
                    ) -> SplitWorkspace | None:
    """The workspace of a launch with `split` reduction splits over `tiles` output tiles
    (None without split-K)."""
    if split == 1:
        return None
    dtype = torch.float32 if prob.out[0] == OUT_KIND_FLOAT else torch.int32
    return SplitWorkspace(torch.empty((split, prob.M, prob.NOUT), dtype=dtype, device=device),
                          torch.zeros(tiles, dtype=torch.int32, device=device))


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host (`triton.cdiv` is a JIT function: ~2 us per host call)."""
    return -(-a // b)


def channel_alignment(prob: Problem) -> int:
    """The largest power of two up to 16 dividing C, x_row and w_row where both operands hold
    one value per element (int8 bytes or fp16), else 1: the igemm kernel's ALIGN_C (16 needs
    no hint: Triton specializes integers divisible by 16 itself)."""
    if prob.a_operand[0] == SRC_PACKED or prob.w_operand[0] == SRC_PACKED:
        return 1
    return math.gcd(prob.C, prob.x_row, prob.w_row, 16)


def reduction_steps(r: int, s: int, c: int, block_k: int, row_taps: bool = False) -> int:
    """Iterations of the reduction loop over an R x S x C reduction in BLOCK_K chunks: per tap
    and channel chunk, or (row_taps, LOOP_ORDER "r_sc") per kernel row and chunk of its S*C
    values. The kernel's own `total` is the same count."""
    return r * cdiv(s * c, block_k) if row_taps else r * s * cdiv(c, block_k)


def output_tiles(prob: Problem, cfg: Mapping) -> int:
    """Output tiles (programs per reduction split) of the igemm kernel under `cfg`."""
    return cdiv(prob.M, cfg["BLOCK_M"]) * cdiv(prob.NOUT, cfg["BLOCK_N"])


@dataclass(frozen=True)
class Launch:
    """One kernel launch with every argument fixed: what a bound launcher replays, so a
    timed or graph-captured call does no host work beyond Triton's own launch."""

    fn: Any
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict
    #: a helper launch (an operand copy) beside the kernel that does the work
    auxiliary: bool = False


def replay(launches: list[Launch], compile_only: bool = False):
    """Run (or, compile_only, compile) the launches in order; returns the CompiledKernel of
    the first one that is not auxiliary when compiling."""
    compiled = [launch_or_compile(s.fn, s.grid, s.args, s.kwargs, compile_only)
                for s in launches]
    if not compile_only:
        return None
    return next(c for c, s in zip(compiled, launches, strict=True) if not s.auxiliary)


def splits_iters(prob: Problem, cfg: Mapping) -> int:
    """Reduction steps per split of the kernel under `cfg` (its `iters_per_split`)."""
    row_taps = cfg.get("LOOP_ORDER", "rsc") == "r_sc"
    return cdiv(reduction_steps(prob.R, prob.S, prob.C, cfg["BLOCK_K"], row_taps),
                int(cfg.get("SPLIT_K", 1)))


def mainloop_constants(prob: Problem, cfg: Mapping) -> dict:
    """The compile-time arguments of `tile_accumulator` (and the tile order and launch knobs)
    for one validated problem under `cfg`."""
    bk = cfg["BLOCK_K"]
    return dict(
        R=prob.R, S=prob.S, IS_GEMM=prob.is_gemm,
        A_SRC=prob.a_operand[0], A_BITS=prob.a_operand[1], A_ENC=prob.a_operand[2],
        A_ZERO=prob.a_zero,
        W_SRC=prob.w_operand[0], W_BITS=prob.w_operand[1], W_ENC=prob.w_operand[2],
        DOT_FP16=prob.dot_fp16, SPLIT_K=int(cfg.get("SPLIT_K", 1)),
        LOOP_CRS=cfg.get("LOOP_ORDER", "rsc") == "crs", EVEN_C=prob.C % bk == 0,
        ALIGN_C=channel_alignment(prob), ROW_TAPS=cfg.get("LOOP_ORDER", "rsc") == "r_sc",
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk,
        GROUP_M=cfg.get("GROUP_M", 8), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


def launches(prob: Problem, cfg: Mapping, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             bias: torch.Tensor | None, scale: torch.Tensor | None,
             mult: torch.Tensor | None, shift: torch.Tensor | None,
             workspace: SplitWorkspace | None = None,
             zero_point: torch.Tensor | None = None) -> list[Launch]:
    """The launches of one validated call: the kernel, and the split-K sum kernel where
    split-K is not summed in the kernel. No checks here. zero_point: the int32 [NOUT] terms
    of u8 activations (`zero_point.zero_point_terms`) where prob.a_zero, else None.

    workspace: `split_workspace(prob, SPLIT_K, output_tiles(prob, cfg), device)`, made here
    when None (a bound launcher passes its own, so a timed or graph-captured launch allocates
    nothing).
    """
    bn = cfg["BLOCK_N"]
    split = int(cfg.get("SPLIT_K", 1))
    in_kernel = split > 1 and cfg.get("SPLIT_SUM", "second_kernel") == "last_program"
    tiles = output_tiles(prob, cfg)
    vecs = [t if t is not None else out for t in (bias, scale, mult, shift)]
    kind, layout, obits, qmin, qmax = prob.out
    epi = dict(HAS_BIAS=prob.bias, RELU=prob.relu, OUT_KIND=kind, OUT_LAYOUT=layout,
               OUT_BITS=obits, QMIN=qmin, QMAX=qmax, WIDE=prob.wide)
    if workspace is None:
        workspace = split_workspace(prob, split, tiles, x.device)
    scratch = (out, out) if workspace is None else (workspace.partials, workspace.arrivals)
    args = (x, w, out, *vecs, *scratch, out if zero_point is None else zero_point,
            prob.M, prob.NOUT, prob.H, prob.W, prob.C, prob.P, prob.Q, prob.stride, prob.pad,
            prob.x_row, prob.w_row, prob.out_row, prob.out_plane, splits_iters(prob, cfg))
    kwargs = dict(**mainloop_constants(prob, cfg), SUM_IN_KERNEL=in_kernel, **epi)
    plan = [Launch(igemm_kernel, (tiles, split), args, kwargs)]
    if split > 1 and not in_kernel:
        rbm, rbn = 64, max(32, min(bn, 128))
        grid = (cdiv(prob.M, rbm), cdiv(prob.NOUT, rbn))
        args = (workspace.partials, out, *vecs, prob.M, prob.NOUT, prob.out_row,
                prob.out_plane)
        kwargs = dict(SPLIT_K=split, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4, **epi)
        plan.append(Launch(split_k_epilogue_kernel, grid, args, kwargs))
    return plan


def launch(prob: Problem, cfg: Mapping, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
           bias: torch.Tensor | None, scale: torch.Tensor | None,
           mult: torch.Tensor | None, shift: torch.Tensor | None,
           workspace: SplitWorkspace | None = None, compile_only: bool = False):
    """Run the kernel for one validated call (`launches`); writes and returns `out`.
    compile_only: compile (fill Triton's cache) without launching (`JITFunction.warmup`) and
    return the main kernel's CompiledKernel (n_regs, n_spills, asm) instead of `out`."""
    compiled = replay(launches(prob, cfg, x, w, out, bias, scale, mult, shift, workspace),
                      compile_only)
    return compiled if compile_only else out


def launch_or_compile(fn, grid: tuple[int, ...], args: tuple, kwargs: dict, compile_only: bool):
    """The one place the Triton kernels are launched (or compiled without a launch:
    `JITFunction.warmup`, returns the CompiledKernel); tests capture launches here."""
    if compile_only:
        return fn.warmup(*args, grid=grid, **kwargs)
    return fn[grid](*args, **kwargs)
