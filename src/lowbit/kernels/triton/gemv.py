"""Weight-streaming split-K int8 GEMV / skinny GEMM: out[M, N] = a[M, K] . w[N, K]^T, M <= 64,
and conv2d whose implicit GEMM is that skinny (M = N*P*Q <= 64 output pixels).

At M <= 16 (a classifier or an FC layer at batch 1-16) a GEMM reads N*K weight bytes to do
2*M*N*K operations: it is bound by the memory bandwidth, not by the tensor cores, and the tile
templates (64-128 row tiles, a grid of cdiv(N, BLOCK_N) tiles) leave most SMs idle at N = 1000
and waste 4-64x the MMA work on padding rows. A batch-1 conv on a 7x7 map is the same case
(49 rows; a 3x3 512 -> 512 reads 2.4 MB of weights for 0.2 GOP). This kernel instead:
  - gives each program BLOCK_N weight rows and one slice of the reduction (SPLIT_K slices), so
    that the grid cdiv(N, BLOCK_N) x SPLIT_K fills the 132 SMs even at N = 1000;
  - streams the weight tile [BLOCK_N, BLOCK_K] with wide loads along the reduction (16-byte
    cp.async where C % 16 == 0, else ALIGN_C bytes: `channel_alignment`), software-pipelined
    `num_stages` deep, so each weight byte crosses DRAM once with several tiles in flight;
  - multiplies on int8 tensor cores with the rows padded to BLOCK_M = 16, 32 or 64 (the padding
    rows are masked off: they load nothing);
  - reduces the slices exactly: each program adds its int32 partial tile into one running
    sum [M, N] with integer atomics (any order gives the same integer; every partial and
    running sum is bounded by the workload's worst-case |accumulator| < 2^31, checked), and
    the program that arrives last at its column tile (an acquire-release arrival counter,
    `igemm.arrived_last`) takes the full sum with an atomic exchange against 0 (which also
    leaves the sum zeroed for the next launch) and runs the fused epilogue once on it.
The epilogue is the int8 templates' (`epilogue.epilogue_store`: int32, fp16, requantized int8
/ packed / bit-plane outputs, bias, shifted bias, ReLU), so outputs equal
`lowbit.reference.run` bit for bit. Operands may be int8 or densely packed sub-byte values
(unpacked in registers: only the packed bytes cross DRAM).

The reduction runs in steps of the implicit-GEMM kernel (`igemm`): step `it` is one filter
tap (r, s) = divmod(it // chunks, S) and one chunk of BLOCK_K of its C channels
(chunks = cdiv(C, BLOCK_K); a GEMM is R = S = 1, C = K), the KRSC order of the weight rows, so a
slice of consecutive steps streams consecutive weight bytes. Slice i of SPLIT_K takes steps
[i T // SPLIT_K, (i + 1) T // SPLIT_K) of the T = R*S*chunks (`split_slices`: sizes differ by
at most one, none empty while SPLIT_K <= T, so a 3x3's 9 x chunks steps take any power of two).
The activation tile of a step is gathered from NHWC x with igemm's own helpers, never as
im2col: row m is output pixel (n, p, q) (`igemm.output_pixels`), which reads input pixel
(n, p*stride - pad + r, q*stride - pad + s) channels c of the chunk (`igemm.tap_operands`);
rows past M, channels past C and taps in the padding are masked loads of the byte 0. A 1x1
stride-1 unpadded conv is exactly the GEMM [N*H*W, C] x [K, C]^T (`templates.problem`): its
rows are NHWC pixels, with no per-row division and no padding masks.

u8 activations (ReLU and average-pool outputs) are taken exactly by a zero point
(`zero_point`): the dot multiplies the stored bytes with their top bit flipped, and the
program that runs the epilogue adds ACT_ZERO_POINT * sum_k w[n, k] (an int32 [N] vector computed
when a launch is planned: bind again after changing the weights) to the full int32 sum. A
padding tap's masked byte 0 enters the dot as -128 and the term adds 128 w back: its true
value 0, exactly (the weights it meets are the layer's own, zeros past C).

Knobs (`GEMV_KNOBS`): BLOCK_N, BLOCK_K (channels of a tap per step), SPLIT_K, num_warps,
num_stages; BLOCK_M is fixed by M.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from ...core import Config, ConfigSpace, ConvWorkload, Workload
from ...core.hardware import TARGET
from ...core.knobs import KnobDef, KnobTable
from ..base import EXACT_INT32, KernelTemplate, acc_bound
from .epilogue import epilogue_store
from .igemm import (
    Launch,
    Problem,
    SplitWorkspace,
    arrived_last,
    cdiv,
    channel_alignment,
    output_pixels,
    tap_operands,
)
from .templates import SMEM_LIMIT, IgemmKernel, _IgemmTemplate, problem, reduction_iters
from .zero_point import (
    ACT_ZERO_POINT,
    SHIFTED_ACT,
    act_zero_point,
    bound_terms,
    with_zero_point,
    zero_point_terms,
)

#: the most rows the template takes (one row tile of the tensor-core dot)
GEMV_MAX_M = 64
#: programs the default config's grid reaches at least: one per SM (with 3 tiles of 16 KB in
#: flight each, 6 MB in flight: twice what the H100's bandwidth x latency product needs), and
#: at most two per SM, one wave
TARGET_PROGRAMS = TARGET.sms
#: the deepest K split (more adds atomics and arrival traffic for no more bandwidth)
MAX_SPLIT = 64
#: above this many rows the dot pads them to 64 and the row tile [64, BLOCK_K] is as large as
#: a 64-wide weight tile: the default takes 32 weight rows a program and half as many programs
#: (H200, CUDA events, against 64 rows and >= TARGET_PROGRAMS: the batch-1 7x7 convs of
#: benchmarks/probes/gemv_probe.py --conv 1.10-1.28x faster, its GEMMs of M = 64 0.83-1.58x,
#: 7 of 8 faster)
MANY_ROWS = 32


@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr, sum_ptr, count_ptr,
    zp_ptr, M, NOUT, H, W, C, P, Q, conv_stride, pad, x_row, w_row, out_row, out_plane,
    R: tl.constexpr, S: tl.constexpr, IS_GEMM: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_C: tl.constexpr, ALIGN_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (column tile, reduction slice): acc = a[:, slice] . w[tile, slice]^T over its
    (tap, channel chunk) steps, then the epilogue (SPLIT_K == 1) or the atomic sum and the
    last arrival's epilogue (module doc). A_ZERO (ACT_ZERO_POINT for u8 activations, else 0):
    the dot takes a - A_ZERO and the program that runs the epilogue adds zp_ptr's
    A_ZERO * sum_k w[n, k] to the full sum."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < NOUT
    n_img, ih0, iw0 = output_pixels(offs_m, P, Q, conv_stride, pad, IS_GEMM)
    w_base = offs_n * (R * S)
    DOT_T: tl.constexpr = tl.int8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    chunks = tl.cdiv(C, BLOCK_K)
    steps = R * S * chunks
    for it in range(pid_k * steps // SPLIT_K, (pid_k + 1) * steps // SPLIT_K):
        a, b = tap_operands(x_ptr, w_ptr, it, chunks, n_img, ih0, iw0, m_mask, offs_m, w_base,
                            n_mask, H, W, C, x_row, w_row, R, S, IS_GEMM, A_SRC, A_BITS, A_ENC,
                            A_ZERO, W_SRC, W_BITS, W_ENC, False, EVEN_C, ALIGN_C, DOT_T,
                            BLOCK_K)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)

    if SPLIT_K == 1:
        acc = with_zero_point(acc, zp_ptr, offs_n, n_mask, 0, A_ZERO)
        epilogue_store(acc, offs_m, pid_n * BLOCK_N, M, NOUT, out_ptr, out_row, out_plane,
                       bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                       OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M, BLOCK_N)
    else:
        mask = m_mask[:, None] & n_mask[None, :]
        sums = sum_ptr + offs_m[:, None] * NOUT + offs_n[None, :]
        tl.atomic_add(sums, acc, mask=mask, sem="relaxed", scope="gpu")
        if arrived_last(count_ptr + pid_n, SPLIT_K):
            total = tl.atomic_xchg(sums, tl.zeros_like(acc), mask=mask, sem="relaxed",
                                   scope="gpu")
            total = with_zero_point(total, zp_ptr, offs_n, n_mask, 0, A_ZERO)
            epilogue_store(total, offs_m, pid_n * BLOCK_N, M, NOUT, out_ptr, out_row,
                           out_plane, bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS,
                           RELU, OUT_KIND, OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M,
                           BLOCK_N)


def block_m(m: int) -> int:
    """Rows of the dot: M rounded up to 16, 32 or 64 (the int8 MMA's smallest row tile)."""
    return max(16, 1 << (m - 1).bit_length())


def target_programs(m: int) -> int:
    """Programs the default config's grid reaches for M rows (where the K steps allow):
    TARGET_PROGRAMS, half as many above MANY_ROWS rows."""
    return TARGET_PROGRAMS // 2 if m > MANY_ROWS else TARGET_PROGRAMS


def reduction_run(wl: Workload) -> int:
    """Reduction elements of one tap, chunked by BLOCK_K: C of a conv, K of a GEMM."""
    return wl.C if isinstance(wl, ConvWorkload) else wl.gemm_shape[2]


def split_slices(steps: int, split: int) -> list[tuple[int, int]]:
    """[lo, hi) reduction steps of each of the `split` slices, as the kernel splits them:
    balanced (sizes differ by at most one; none empty while split <= steps), so that a 3x3
    conv's 9 x chunks steps split into any power of two."""
    return [(i * steps // split, (i + 1) * steps // split) for i in range(split)]


def sum_workspace(prob: Problem, split: int, tiles: int, device: torch.device | str
                  ) -> SplitWorkspace | None:
    """Scratch of a split launch: the running int32 sum [M, NOUT] and one arrival counter per
    column tile, both zero between launches (the last program of a tile leaves them so);
    None without split-K."""
    if split == 1:
        return None
    return SplitWorkspace(torch.zeros((prob.M, prob.NOUT), dtype=torch.int32, device=device),
                          torch.zeros(tiles, dtype=torch.int32, device=device))


def gemv_launch(prob: Problem, cfg: Mapping, x: torch.Tensor, w: torch.Tensor,
                out: torch.Tensor, vecs: tuple, workspace: SplitWorkspace | None,
                terms: torch.Tensor | None = None) -> Launch:
    """The one launch of a validated call (`vecs`: bias, scale, multiplier, shift or None;
    `workspace`: `sum_workspace(...)`; `terms`: the int32 [NOUT] zero-point terms
    (`zero_point.zero_point_terms`) where prob.a_zero, else None). No checks here."""
    split = cfg["SPLIT_K"]
    tiles = cdiv(prob.NOUT, cfg["BLOCK_N"])
    vecs = tuple(t if t is not None else out for t in vecs)
    scratch = (out, out) if workspace is None else (workspace.partials, workspace.arrivals)
    kind, layout, obits, qmin, qmax = prob.out
    args = (x, w, out, *vecs, *scratch, out if terms is None else terms, prob.M, prob.NOUT,
            prob.H, prob.W, prob.C, prob.P, prob.Q, prob.stride, prob.pad, prob.x_row,
            prob.w_row, prob.out_row, prob.out_plane)
    kwargs = dict(
        R=prob.R, S=prob.S, IS_GEMM=prob.is_gemm,
        A_SRC=prob.a_operand[0], A_BITS=prob.a_operand[1], A_ENC=prob.a_operand[2],
        A_ZERO=prob.a_zero, W_SRC=prob.w_operand[0], W_BITS=prob.w_operand[1],
        W_ENC=prob.w_operand[2], HAS_BIAS=prob.bias, RELU=prob.relu, OUT_KIND=kind,
        OUT_LAYOUT=layout, OUT_BITS=obits, QMIN=qmin, QMAX=qmax, WIDE=prob.wide, SPLIT_K=split,
        EVEN_C=prob.C % cfg["BLOCK_K"] == 0, ALIGN_C=channel_alignment(prob),
        BLOCK_M=block_m(prob.M), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return Launch(gemv_kernel, (tiles, split), args, kwargs)


class GemvKernel(IgemmKernel):
    """One compiled (workload, config) of `triton.gemv_int8`: `kernel(x, w, params, out=None)`
    and `bind(...)` as `IgemmKernel` (a bound launcher owns its zeroed sum workspace and, for
    u8 activations, the weights' zero-point terms, computed at bind: it serves new
    activations in x, not new weights)."""

    def plan(self, prob: Problem, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             vecs: tuple) -> list[Launch]:
        cfg = self.config
        workspace = sum_workspace(prob, cfg["SPLIT_K"], cdiv(prob.NOUT, cfg["BLOCK_N"]),
                                  x.device)
        terms = bound_terms(self.workload, w, w.device) if prob.a_zero else None
        return [gemv_launch(prob, cfg, x, w, out, vecs, workspace, terms)]


GEMV_KNOBS = KnobTable(
    KnobDef("BLOCK_N", (64, 32, 128, 256), "weight rows (output columns) per program"),
    KnobDef("BLOCK_K", (256, 32, 64, 128, 512),
            "reduction elements (a conv tap's channels) per pipelined load"),
    KnobDef("SPLIT_K", (1, 2, 4, 8, 16, 32, MAX_SPLIT),
            "balanced reduction slices per column tile, summed by int32 atomics"),
    KnobDef("num_warps", (4, 2, 8), "warps per program"),
    KnobDef("num_stages", (4, 2, 3, 5, 6), "software-pipeline depth of the weight stream"),
)


class GemvInt8Template(_IgemmTemplate):
    """Skinny GEMM a [M, K] x w [N, K]^T, or conv2d NHWC x KRSC whose implicit GEMM has
    M = N*P*Q <= GEMV_MAX_M rows, streaming the weights with split-K (module doc); the
    operands and epilogues of `triton.gemm_int8` / `triton.conv2d_int8` and also u8
    activations (zero point, module doc)."""

    name = "triton.gemv_int8"
    knobs = GEMV_KNOBS
    added_knobs: Mapping[str, object] = {}
    layer_outputs_max = 0  # its own split-K kernel: the separate pass writes the outputs
    #: read by `lowbit.tune.dispatch`: time it by the weight-streaming estimate (the learned
    #: model has no measurements of this template)
    streams_weights = True

    def unsupported_reason(self, wl: Workload) -> str | None:
        shifted = act_zero_point(wl.a) != 0
        # u8 activations: the dot takes a - 128, s8 values; every other check applies to it
        # (the dot's bound: 128 max|w| K), then the true sum's bound (255 max|w| K)
        reason = super().unsupported_reason(wl.replace(a=SHIFTED_ACT) if shifted else wl)
        if reason is None and shifted and acc_bound(wl) >= EXACT_INT32:
            return (f"worst-case |accumulator| {acc_bound(wl)} >= {EXACT_INT32} (a={wl.a}): "
                    "the int32 sum would not be exact")
        m = wl.gemm_shape[0]
        if reason is None and m > GEMV_MAX_M:
            if isinstance(wl, ConvWorkload):
                return (f"M=N*P*Q={m} output pixels > {GEMV_MAX_M}: the weight-streaming GEMV "
                        "serves convs of few output pixels (use triton.conv2d_int8)")
            return (f"M={m} rows > {GEMV_MAX_M}: the weight-streaming GEMV serves skinny "
                    "GEMMs (use triton.gemm_int8)")
        return reason

    def constraints(self, wl: Workload) -> list:
        _, n, _ = wl.gemm_shape
        bm = block_m(wl.gemm_shape[0])
        run = reduction_run(wl)
        run_name = "C" if isinstance(wl, ConvWorkload) else "K"

        def fits(c: Config) -> str | None:
            if c["BLOCK_N"] > max(32, 1 << (n - 1).bit_length()):
                return f"BLOCK_N={c['BLOCK_N']} exceeds N={n} rounded up"
            if c["BLOCK_K"] > max(32, 1 << (run - 1).bit_length()):
                return f"BLOCK_K={c['BLOCK_K']} exceeds {run_name}={run} rounded up"
            if c["BLOCK_N"] < 8 * c["num_warps"]:
                return f"BLOCK_N={c['BLOCK_N']} < 8 columns per warp x {c['num_warps']} warps"
            return None

        def smem(c: Config) -> str | None:
            need = c["num_stages"] * (bm + c["BLOCK_N"]) * c["BLOCK_K"]
            return f"shared memory {need} B > {SMEM_LIMIT} B" if need > SMEM_LIMIT else None

        def split(c: Config) -> str | None:
            steps = reduction_iters(wl, c["BLOCK_K"])
            if c["SPLIT_K"] > steps:
                return (f"SPLIT_K={c['SPLIT_K']} > {steps} reduction steps (taps x chunks of "
                        "BLOCK_K): a K slice would be empty")
            return None

        return [fits, smem, split]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return self.knobs.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """BLOCK_N 64 (32 for N <= 32 and for M > MANY_ROWS), BLOCK_K 256 (128 where C, or a
        GEMM's K, is not a multiple of 4: byte loads, one register each; the run rounded up to
        a power of two when smaller, at least 32), 4 warps, 4 stages, and the smallest
        power-of-two SPLIT_K whose grid reaches `target_programs(M)`, as deep as the
        reduction steps allow. A conv's M and N are its implicit GEMM's."""
        space = self.space(wl)
        m, n, _ = wl.gemm_shape
        run = reduction_run(wl)
        widest = 256 if run % 4 == 0 else 128
        cfg = Config(BLOCK_N=64 if n > 32 and m <= MANY_ROWS else 32,
                     BLOCK_K=min(widest, max(32, 1 << (run - 1).bit_length())), SPLIT_K=1,
                     num_warps=4, num_stages=4)
        tiles = cdiv(n, cfg["BLOCK_N"])
        while tiles * cfg["SPLIT_K"] < target_programs(m) and cfg["SPLIT_K"] < MAX_SPLIT:
            deeper = cfg.replace(SPLIT_K=2 * cfg["SPLIT_K"])
            if not space.is_valid(deeper):
                break
            cfg = deeper
        return cfg if space.is_valid(cfg) else space.all_configs()[0]

    def launch_shape(self, wl: Workload, config: Config) -> dict:
        """The launch as plain tiles (`kernels.geometry.LaunchShape` fields; rows padded to
        BLOCK_M; a conv's M, N, K are those of its implicit GEMM): its geometry."""
        return dict(block_m=block_m(wl.gemm_shape[0]), block_n=config["BLOCK_N"],
                    block_k=config["BLOCK_K"], warps=config["num_warps"],
                    stages=config["num_stages"], split_k=config["SPLIT_K"], operand_bits=8)

    #: its split-K weight stream is plain tiles of one GEMM: the geometry of its launch shape
    geometry = KernelTemplate.geometry

    def build(self, wl: Workload, config: Config) -> GemvKernel:
        config = self.checked_config(wl, config)
        return GemvKernel(self.name, wl, config, problem(wl, False))


__all__ = ["ACT_ZERO_POINT", "GEMV_KNOBS", "GEMV_MAX_M", "GemvInt8Template", "GemvKernel",
           "act_zero_point", "block_m", "gemv_launch", "reduction_run", "split_slices",
           "target_programs", "zero_point_terms"]
