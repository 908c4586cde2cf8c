"""1x1 stride-1 convs of few input channels on int8 tensor cores: `triton.conv2d_pointwise`.

A 1x1 stride-1 unpadded conv on NHWC is the GEMM [N*H*W, C] x [C, K] (`templates.problem`).
MobileNet-V2 / EfficientNet expansions and projections have C <= 64: one reduction step a
tile, thousands of row tiles and weights of at most C x K bytes. A tile-per-program kernel
loads its A tile, runs one MMA, requantizes, stores and exits, and nothing overlaps across
tiles. This kernel is persistent and streaming instead:

- the grid is PROGRAMS_PER_SM programs per SM (at most the tiles), each owning one column
  tile (BLOCK_N output channels) and every `step`-th row tile of BLOCK_M pixels
  (program p: column tile p % col_tiles, row tiles p // col_tiles + i step, step =
  programs / col_tiles), so programs next to each other read the same pixels (L2 reuse of
  the activations across column tiles);
- the program's weight tile [BLOCK_K, BLOCK_N] (BLOCK_K: C rounded up to a power of two, at
  least 32; channels past C masked to zero) is loaded once, before the loop, and stays
  resident;
- the whole reduction is one `tl.dot` a tile, and the row-tile loop is a `tl.range` that
  Triton software-pipelines `num_stages` deep: the next tiles' activation loads (cp.async)
  are in flight while the current tile runs its dot, the requantizing epilogue and its
  stores; other programs on the same SM fill the remaining gaps;
- operands and epilogue are the implicit-GEMM kernels': int8 or PACKED sub-byte operands
  unpacked in registers (`epilogue.load_operand`), u8 activations by the zero point
  (`zero_point`: the dot takes a - 128, the term 128 sum_c w[n, c] is added to each tile),
  and `epilogue.epilogue_store` (int32, fp16, requantized INT8 / PACKED / BITPLANE outputs,
  bias in accumulator units or shifted, with its float64 / int32 requantization forms), so
  outputs equal `lowbit.reference.run` bit for bit.

A layer epilogue of several outputs (a residual block's end) runs the same main loop in
`pointwise_outputs` (`layer_outputs_max`: the planner keeps such layers here). C above
MAX_CHANNELS is refused (the resident weight tile and the one-dot reduction are for few
channels; wider layers run on the implicit-GEMM templates).

Knobs (`POINTWISE_KNOBS`): BLOCK_M, BLOCK_N, num_warps, num_stages, PROGRAMS_PER_SM.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import triton
import triton.language as tl

from ...core import Config, ConfigSpace, ConvWorkload, Workload
from ...core.hardware import TARGET
from ...core.knobs import KnobDef, KnobTable
from ..base import KernelTemplate, pow2_ceil
from ..geometry import Geometry
from .depthwise import grouped_conv_reason, tile_reason
from .epilogue import epilogue_store, load_operand
from .igemm import Launch, Problem, cdiv, channel_alignment
from .templates import (
    ACC_REGS_LIMIT,
    LAYER_OUTPUTS_MAX,
    SMEM_LIMIT,
    WIDE_REQUANT_ACC_REGS,
    IgemmKernel,
    interpreting,
    problem,
    u8_weights_reason,
    wide_requant,
)
from .zero_point import bound_terms, shifted_act

#: the most input channels the template takes (one dot of K = C rounded up a tile)
MAX_CHANNELS = 256
#: the smallest reduction tile of the int8 dot (k32)
MIN_BLOCK_K = 32
#: registers a thread beside its accumulators (addressing, the operand in flight, the
#: epilogue's vectors): the occupancy estimate of `resident_reason`. Offline sm_90, the
#: 16 -> 96 float64 form on 128 x 32 tiles: 106 registers with Triton 3.9, 152 with 3.6 (the
#: device's): the estimate keeps 3.6's
BASE_REGS = 96


@triton.jit
def resident_weights(w_ptr, zp_ptr, col, NOUT, C: tl.constexpr, W_ROW: tl.constexpr,
                     ALIGN_C: tl.constexpr, W_SRC: tl.constexpr, W_BITS: tl.constexpr,
                     W_ENC: tl.constexpr, A_ZERO: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """A program's resident operands of column tile `col`: (channel mask, the int8 weight tile
    [BLOCK_K, BLOCK_N], the zero-point terms [BLOCK_N] (0 without A_ZERO)). W_ROW: the
    weight row stride in storage elements; ALIGN_C: a power of two dividing C, the row
    strides (the width of the channel loads)."""
    offs_n = col * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < NOUT
    chan = tl.arange(0, BLOCK_K)
    if C == BLOCK_K:
        c_mask = tl.full([BLOCK_K], 1, tl.int1)
    else:
        c_mask = chan < C
        if ALIGN_C > 1:
            c_mask = tl.max_constancy(c_mask, ALIGN_C)
    w_off = offs_n * W_ROW
    if ALIGN_C > 1:
        w_off = tl.multiple_of(w_off, ALIGN_C)
    b = load_operand(w_ptr, w_off, chan, n_mask, c_mask, W_SRC, W_BITS, W_ENC, False, tl.int8)
    zp = tl.zeros([BLOCK_N], tl.int32)
    if A_ZERO != 0:
        zp = tl.load(zp_ptr + offs_n, mask=n_mask, other=0)
    return c_mask, b, zp


@triton.jit
def row_tile_accumulator(x_ptr, tile, M, c_mask, b, zp, X_ROW: tl.constexpr,
                         ALIGN_C: tl.constexpr, A_SRC: tl.constexpr, A_BITS: tl.constexpr,
                         A_ENC: tl.constexpr, A_ZERO: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """(rows, int32 accumulator [BLOCK_M, BLOCK_N]) of row tile `tile`: its activations
    (X_ROW storage elements a row) times the resident weights `b`, one dot over every
    channel, plus the zero-point terms."""
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    chan = tl.arange(0, BLOCK_K)
    a_off = offs_m * X_ROW
    if ALIGN_C > 1:
        a_off = tl.multiple_of(a_off, ALIGN_C)
    if A_ZERO != 0:
        a = load_operand(x_ptr, a_off, chan, m_mask, c_mask, A_SRC, A_BITS, A_ENC, True,
                         tl.uint8)
        a = shifted_act(a, A_ZERO)
    else:
        a = load_operand(x_ptr, a_off, chan, m_mask, c_mask, A_SRC, A_BITS, A_ENC, True,
                         tl.int8)
    acc = tl.dot(a, b, out_dtype=tl.int32)
    if A_ZERO != 0:
        acc = acc + zp[None, :]
    return offs_m, acc


@triton.jit
def pointwise_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr, zp_ptr,
    M, NOUT, out_row, out_plane, col_tiles, row_step,
    C: tl.constexpr, X_ROW: tl.constexpr, W_ROW: tl.constexpr, ALIGN_C: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program p: column tile p % col_tiles, its weight tile resident, then row tiles
    p // col_tiles, + row_step, ... each one dot over all C channels and the fused epilogue
    (module doc). X_ROW / W_ROW: the activation / weight row strides in storage elements;
    ALIGN_C: a power of two dividing C, X_ROW and W_ROW (the width of the channel loads)."""
    pid = tl.program_id(0)
    col = pid % col_tiles
    c_mask, b, zp = resident_weights(w_ptr, zp_ptr, col, NOUT, C, W_ROW, ALIGN_C, W_SRC,
                                     W_BITS, W_ENC, A_ZERO, BLOCK_N, BLOCK_K)
    for tile in tl.range(pid // col_tiles, tl.cdiv(M, BLOCK_M), row_step):
        offs_m, acc = row_tile_accumulator(x_ptr, tile, M, c_mask, b, zp, X_ROW, ALIGN_C,
                                           A_SRC, A_BITS, A_ENC, A_ZERO, BLOCK_M, BLOCK_K)
        epilogue_store(acc, offs_m, col * BLOCK_N, M, NOUT, out_ptr, out_row, out_plane,
                       bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                       OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M, BLOCK_N)


def block_k(channels: int) -> int:
    """The reduction tile: C rounded up to a power of two, at least MIN_BLOCK_K."""
    return max(MIN_BLOCK_K, pow2_ceil(channels))


def programs(m: int, nout: int, cfg: Mapping, sms: int) -> tuple[int, int, int]:
    """(grid, column tiles, row step) of a launch on `sms` SMs: PROGRAMS_PER_SM a SM, a whole
    number of programs per column tile, no more than the tiles."""
    cols, rows = cdiv(nout, cfg["BLOCK_N"]), cdiv(m, cfg["BLOCK_M"])
    per_col = max(1, min(rows, cfg["PROGRAMS_PER_SM"] * sms // cols))
    return per_col * cols, cols, per_col


def device_sms(device: torch.device | str) -> int:
    """SMs of `device` (the design target's count off a GPU: interpreter and ahead-of-time
    compiles)."""
    device = torch.device(device)
    if device.type == "cuda" and not interpreting():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return TARGET.sms


def pointwise_launch(prob: Problem, cfg: Mapping, x: torch.Tensor, w: torch.Tensor,
                     out: torch.Tensor, vecs: tuple, terms: torch.Tensor | None,
                     sms: int) -> Launch:
    """The one launch of a validated call on `sms` SMs (`vecs`: bias, scale, multiplier,
    shift or None; `terms`: the int32 [K] zero-point terms where prob.a_zero). No checks."""
    grid, cols, step = programs(prob.M, prob.NOUT, cfg, sms)
    kind, layout, obits, qmin, qmax = prob.out
    vecs = tuple(t if t is not None else out for t in vecs)
    args = (x, w, out, *vecs, out if terms is None else terms, prob.M, prob.NOUT, prob.out_row,
            prob.out_plane, cols, step)
    kwargs = dict(mainloop_constants(prob, cfg), HAS_BIAS=prob.bias, RELU=prob.relu,
                  OUT_KIND=kind, OUT_LAYOUT=layout, OUT_BITS=obits, QMIN=qmin, QMAX=qmax,
                  WIDE=prob.wide)
    return Launch(pointwise_kernel, (grid,), args, kwargs)


def mainloop_constants(prob: Problem, cfg: Mapping) -> dict:
    """The main loop's constexprs and launch options (operands, tile, warps, stages) of a
    pointwise launch of `cfg`."""
    return dict(
        C=prob.C, X_ROW=prob.x_row, W_ROW=prob.w_row, ALIGN_C=channel_alignment(prob),
        A_SRC=prob.a_operand[0], A_BITS=prob.a_operand[1], A_ENC=prob.a_operand[2],
        A_ZERO=prob.a_zero, W_SRC=prob.w_operand[0], W_BITS=prob.w_operand[1],
        W_ENC=prob.w_operand[2], BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=block_k(prob.C), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


class PointwiseKernel(IgemmKernel):
    """One compiled (workload, config) of `triton.conv2d_pointwise`: `kernel(x, w, params,
    out=None)` and `bind(...)` as `IgemmKernel` (a bound launcher keeps u8 activations'
    zero-point terms, computed at bind: bind again after changing the weights). `sms`: the
    SMs the grid is sized for (None: the device's own count)."""

    def __init__(self, template: str, workload: Workload, config: Config, prob: Problem,
                 sms: int | None = None):
        super().__init__(template, workload, config, prob)
        self.sms = sms

    def plan(self, prob: Problem, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             vecs: tuple) -> list[Launch]:
        terms = bound_terms(self.workload, w, x.device) if prob.a_zero else None
        sms = self.sms or device_sms(x.device)
        return [pointwise_launch(prob, self.config, x, w, out, vecs, terms, sms)]


POINTWISE_KNOBS = KnobTable(
    KnobDef("BLOCK_M", (128, 64, 256), "output pixels (GEMM rows) per row tile"),
    KnobDef("BLOCK_N", (64, 32, 128, 16), "output channels per column tile (a program's "
            "resident weights)"),
    KnobDef("num_warps", (4, 8), "warps per program"),
    KnobDef("num_stages", (3, 2, 4), "software-pipeline depth of the row-tile loop (tiles "
            "whose activations are in flight)"),
    KnobDef("PROGRAMS_PER_SM", (2, 1, 3, 4), "persistent programs a SM (the grid)"),
)


def acc_per_thread(cfg: Mapping) -> int:
    """int32 accumulators a thread holds (the tile over the program's threads)."""
    return cfg["BLOCK_M"] * cfg["BLOCK_N"] // (32 * cfg["num_warps"])


def resident_reason(wl: Workload, cfg: Mapping) -> str | None:
    """Why PROGRAMS_PER_SM programs of `cfg` may not all be resident on one SM (estimated
    registers: the accumulators, twice for a 64-bit requantization, plus BASE_REGS; shared
    memory: the staged activation tiles and the weight tile); None when they fit. A
    persistent grid that does not fit runs its programs in two waves."""
    acc = acc_per_thread(cfg) * (2 if wide_requant(wl) else 1)
    regs = min(255, acc + BASE_REGS) * 32 * cfg["num_warps"] * cfg["PROGRAMS_PER_SM"]
    if regs > TARGET.regs_per_sm:
        return (f"{cfg['PROGRAMS_PER_SM']} programs of {32 * cfg['num_warps']} threads at "
                f"~{min(255, acc + BASE_REGS)} registers exceed the SM's {TARGET.regs_per_sm}")
    threads = 32 * cfg["num_warps"] * cfg["PROGRAMS_PER_SM"]
    if threads > TARGET.max_threads_per_sm:
        return f"{threads} threads a SM > {TARGET.max_threads_per_sm}"
    bk = block_k(wl.C)
    smem = cfg["num_stages"] * cfg["BLOCK_M"] * bk + bk * cfg["BLOCK_N"]
    if smem > SMEM_LIMIT or smem * cfg["PROGRAMS_PER_SM"] > TARGET.smem_per_sm - 8 * 1024:
        return f"shared memory {smem} B x {cfg['PROGRAMS_PER_SM']} programs does not fit a SM"
    return None


class Conv2dPointwiseTemplate(KernelTemplate):
    """1x1 stride-1 unpadded conv2d NHWC x KRSC [K, 1, 1, C] of at most MAX_CHANNELS input
    channels on int8 tensor cores: persistent programs with resident weights streaming row
    tiles (module doc); INT8 or PACKED operands, the implicit-GEMM kernels' fused epilogue."""

    name = "triton.conv2d_pointwise"
    backend = "triton"
    #: runs Epilogue.shifted_bias (epilogue_store's HAS_BIAS = BIAS_SHIFTED)
    takes_shifted_bias: ClassVar[bool] = True
    #: read by the planner and executor: writes a layer epilogue's outputs
    #: (`pointwise_outputs`, through `conv_outputs.bind_conv_outputs`)
    layer_outputs_max: ClassVar[int] = LAYER_OUTPUTS_MAX
    knobs: ClassVar[KnobTable] = POINTWISE_KNOBS

    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, ConvWorkload):
            return f"needs a ConvWorkload (a 1x1 conv), got {type(wl).__name__}"
        if wl.groups > 1:
            return (f"groups={wl.groups}: a dense 1x1 conv template (grouped and depthwise "
                    "convs run on triton.conv2d_grouped_int8 / triton.conv2d_depthwise)")
        if (wl.R, wl.S, wl.stride, wl.pad) != (1, 1, 1, 0):
            return (f"R x S={wl.R}x{wl.S}, stride={wl.stride}, pad={wl.pad}: only 1x1 "
                    "stride-1 unpadded convs (a GEMM over NHWC pixels) run here")
        if wl.C > MAX_CHANNELS:
            return (f"C={wl.C} > {MAX_CHANNELS} input channels: the resident weight tile and "
                    "the one-dot reduction are for few channels (triton.conv2d_int8)")
        return u8_weights_reason(wl) or grouped_conv_reason(wl)

    def constraints(self, wl: ConvWorkload) -> list:
        def fits(c: Config) -> str | None:
            return tile_reason(wl, c["BLOCK_M"], 64, c["BLOCK_N"], "BLOCK_N")

        def registers(c: Config) -> str | None:
            per_thread = acc_per_thread(c)
            limit = WIDE_REQUANT_ACC_REGS if wide_requant(wl) else ACC_REGS_LIMIT
            if per_thread > limit:
                return f"{per_thread} accumulators a thread > {limit} (the epilogue spills)"
            if c["num_warps"] == 8 and c["BLOCK_M"] < 128:
                return "num_warps=8 needs BLOCK_M >= 128 (two m64 warpgroups)"
            return None

        def resident(c: Config) -> str | None:
            return resident_reason(wl, c)

        return [fits, registers, resident]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return self.knobs.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """BLOCK_N: of 32, 64 and 128 the width padding K the least (ties: the wider; 16
        where K <= 16) among those whose accumulators fit the epilogue's registers,
        128-pixel row tiles (64 where N*H*W <= 64), 4 warps, 3 stages, and the most programs
        a SM (up to 4) that `resident_reason` lets fit; the first point of the space where
        none is valid."""
        space = self.space(wl)
        widths = (16,) if wl.K <= 16 else (128, 64, 32)
        bm = 128 if wl.gemm_shape[0] > 64 else 64
        for bn in sorted(widths, key=lambda w: cdiv(wl.K, w) * w):  # stable: wider first
            for per_sm in (4, 3, 2, 1):
                cfg = Config(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3,
                             PROGRAMS_PER_SM=per_sm)
                if space.is_valid(cfg):
                    return cfg
        return space.all_configs()[0]

    def geometry(self, wl: Workload, config: Mapping) -> Geometry:
        """BLOCK_M x BLOCK_N tiles, the whole reduction (C padded to BLOCK_K) in one step,
        PROGRAMS_PER_SM persistent programs a SM; the staged activation tiles and the
        resident weight tile in shared memory, registers estimated from the tile."""
        m, n, k = wl.gemm_shape
        bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
        warps, stages = int(config["num_warps"]), int(config["num_stages"])
        bk = block_k(wl.C)
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        acc = acc_per_thread(config) * (2 if wide_requant(wl) else 1)
        return Geometry("igemm", "int8", m, n, k, bm, bn, math.ceil(m / bm) * bm, tiles, 1,
                        bk, 1, 32 * warps, stages, stages * bm * bk + bk * bn,
                        min(255, acc + BASE_REGS), True, 1, 1.0)

    def build(self, wl: Workload, config: Config) -> PointwiseKernel:
        config = self.checked_config(wl, config)
        return PointwiseKernel(self.name, wl, config, problem(wl, False))


__all__ = ["MAX_CHANNELS", "POINTWISE_KNOBS", "Conv2dPointwiseTemplate", "PointwiseKernel",
           "block_k", "device_sms", "mainloop_constants", "pointwise_kernel",
           "pointwise_launch", "programs", "resident_reason", "resident_weights",
           "row_tile_accumulator"]
