"""int8 implicit-GEMM conv2d for stride-1 and stride-2 convolutions, operands loaded by TMA.

GEMM view as in `igemm.py` (rows = output pixels, columns = filters, reduction over (r, s,
c)), but a row tile is a spatial block: BLOCK_I images x BLOCK_P output rows x BLOCK_Q output
columns. With stride 1 the input window of that block for tap (r, s) is again a dense box,
x[n0 : n0+BI, p0+r-pad : +BP, q0+s-pad : +BQ, c0 : c0+BK], so one 4-D TMA load fetches the
whole im2col tile: the tensor map's bounds zero-fill everything outside x (negative
coordinates included), which is exactly the conv's zero padding and the channel tail. No
per-element addresses, no masks. The weights [K, R*S*C] come through a 2-D descriptor; past
channel C of a tap it reads the next tap's weights, which meet the zero-filled channels of x.

Stride 2 (even H and W): x is described as the 5-D view [N, H/2, 2, W/2, 2*C] (row = 2*hh +
row phase, column = 2*ww + column phase; the column phase joins the channels). Output pixel
(p, q) reads input row 2p + r - pad = 2(p + dr) + fr with dr = floor((r - pad) / 2), fr its
phase, so the input of tap (r, s) for a BP x BQ output block is again one box, [BI, BP, 1,
BQ, BK] at (n0, p0 + dr, fr, q0 + ds, fs*C + c0); rows and columns outside x are zero-filled
as before. Channel chunks must divide C (a tail would read the other column phase's channels).

Knobs (compile-time, `TMA_KNOBS`): BLOCK_I, BLOCK_P, BLOCK_Q (BLOCK_M = BI*BP*BQ rows),
BLOCK_N, BLOCK_K, num_warps, num_stages, GROUP_M, LOOP_ORDER, SPLIT_K.
Descriptors are host-side `TensorDescriptor`s (no device allocator needed); under
TRITON_INTERPRET=1 Triton's interpreter emulates them with the same zero fill.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ...core import Config, ConfigSpace, ConvWorkload, Knob, Layout, Workload
from ...core.epilogue import bias_vector, check_shifted_bias
from ...core.hardware import TARGET
from ...core.knobs import KnobDef, KnobTable
from ...core.validate import check_inputs, output_buffer
from ..base import KernelTemplate, grouped_reason, pow2_ceil
from ..geometry import Geometry, conv_taps
from . import igemm
from .epilogue import epilogue_store
from .igemm import (
    SplitWorkspace,
    arrived_last,
    grouped_tile,
    split_workspace,
    store_partial,
    sum_partials,
    tap_and_chunk,
)
from .templates import (
    ACC_REGS_LIMIT,
    EXACT_INT32,
    SMEM_LIMIT,
    Problem,
    _check_device,
    acc_bound,
    default_warps,
    int8_refusal,
    interpreting,
    placeholder_requant,
    problem,
    split_k_reason,
    u8_weights_reason,
    with_float64_requant,
)
from .zero_point import act_zero_point, bound_terms, shifted_act, with_zero_point

#: the TMA box of x needs 16-byte rows and strides: C must be a multiple of 16 int8 channels
CHANNEL_ALIGN = 16
#: u8 activations need BLOCK_K | C (`zero_point`): C a multiple of the smallest BLOCK_K
U8_CHANNEL_ALIGN = 32
#: row tiles may cover at most this many times the rows of the least-padding tile shape
MAX_ROW_WASTE = 1.35


@triton.jit
def tma_conv_kernel(
    x_desc, w_desc, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr, part_ptr, count_ptr,
    zp_ptr, N, P, Q, C, NOUT, M, pad, out_row, out_plane, iters_per_split,
    R: tl.constexpr, S: tl.constexpr, STRIDE: tl.constexpr, A_ZERO: tl.constexpr,
    HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, LOOP_CRS: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_I * BLOCK_P * BLOCK_Q
    tiles_q = tl.cdiv(Q, BLOCK_Q)
    tiles_pq = tl.cdiv(P, BLOCK_P) * tiles_q
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(N, BLOCK_I) * tiles_pq,
                                tl.cdiv(NOUT, BLOCK_N), GROUP_M)
    n0 = (pid_m // tiles_pq) * BLOCK_I
    p0 = ((pid_m % tiles_pq) // tiles_q) * BLOCK_P
    q0 = (pid_m % tiles_q) * BLOCK_Q
    k0 = pid_n * BLOCK_N

    # out^T = w . im2col(x)^T: the reshaped im2col box is the B operand, which wgmma reads
    # from shared memory as it is (memdesc reshape); as the A operand Triton 3.6 moves it
    # through registers and serializes each wgmma behind that copy
    # (Triton 3.6 waits for each int8 wgmma before the next iteration: no wgmma pipelining
    # for integer dots; per-iteration MMA work and 2+ programs per SM hide that wait)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    chunks = tl.cdiv(C, BLOCK_K)
    it_lo = tl.program_id(1) * iters_per_split
    for it in range(it_lo, tl.minimum(it_lo + iters_per_split, R * S * chunks)):
        rs, cc = tap_and_chunk(it, R * S, chunks, LOOP_CRS)
        c0 = cc * BLOCK_K
        # the input box of tap (r, s); rows/columns outside x (padding) arrive as zeros
        if STRIDE == 1:
            a = x_desc.load([n0, p0 + rs // S - pad, q0 + rs % S - pad, c0])
        else:
            # (r - pad) = STRIDE * dr + fr with 0 <= fr < STRIDE: shifted by STRIDE * pad
            # so that // and % see no negative operand (their rounding differs by backend)
            hr = rs // S + (STRIDE - 1) * pad
            hs = rs % S + (STRIDE - 1) * pad
            a = x_desc.load([n0, p0 + hr // STRIDE - pad, hr % STRIDE, q0 + hs // STRIDE - pad,
                             (hs % STRIDE) * C + c0])
        if A_ZERO != 0:  # u8 activations (`zero_point`): BLOCK_K divides C, so no box
            a = shifted_act(a, A_ZERO)  # meets another tap's weights past channel C
        a = tl.reshape(a, (BLOCK_M, BLOCK_K))
        b = w_desc.load([k0, rs * C + c0])
        acc = tl.dot(b, tl.trans(a), acc, out_dtype=tl.int32)
    acc = tl.trans(acc)
    offs_z = k0 + tl.arange(0, BLOCK_N)
    acc = with_zero_point(acc, zp_ptr, offs_z, offs_z < NOUT, tl.program_id(1), A_ZERO)

    # tile row i -> output pixel (n, p, q); rows past N/P/Q get row index M (masked off)
    i = tl.arange(0, BLOCK_M)
    n = n0 + i // (BLOCK_P * BLOCK_Q)
    p = p0 + (i // BLOCK_Q) % BLOCK_P
    q = q0 + i % BLOCK_Q
    valid = (n < N) & (p < P) & (q < Q)
    offs_m = tl.where(valid, (n * P + p) * Q + q, M)
    finish = True  # this program runs its tile's epilogue
    if SPLIT_K > 1:
        offs_n = k0 + tl.arange(0, BLOCK_N)
        store_partial(acc, offs_m, offs_n, tl.program_id(1), M, NOUT, part_ptr)
        finish = arrived_last(count_ptr + tl.program_id(0), SPLIT_K)
        if finish:
            acc = sum_partials(part_ptr, offs_m, offs_n, M, NOUT, SPLIT_K, False, BLOCK_M,
                               BLOCK_N)
    if finish:
        epilogue_store(acc, offs_m, k0, M, NOUT, out_ptr, out_row, out_plane,
                       bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                       OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_M, BLOCK_N)


def _descriptors(wl: ConvWorkload, cfg: Config, x: torch.Tensor, w: torch.Tensor
                 ) -> tuple[TensorDescriptor, TensorDescriptor]:
    """x as [N, H, W, C] with box [BI, BP, BQ, BK] (stride 2: the phase view [N, H/2, 2, W/2,
    2C] with box [BI, BP, 1, BQ, BK]); w as [K, R*S*C] with box [BN, BK]."""
    n, h, wd, c, st = wl.N, wl.H, wl.W, wl.C, wl.stride
    crs = wl.R * wl.S * c
    bi, bp, bq, bk = cfg["BLOCK_I"], cfg["BLOCK_P"], cfg["BLOCK_Q"], cfg["BLOCK_K"]
    if st == 1:
        xd = TensorDescriptor(x, [n, h, wd, c], [h * wd * c, wd * c, c, 1], [bi, bp, bq, bk])
    else:
        xd = TensorDescriptor(x, [n, h // st, st, wd // st, st * c],
                              [h * wd * c, st * wd * c, wd * c, st * c, 1], [bi, bp, 1, bq, bk])
    wdsc = TensorDescriptor(w, [wl.K, crs], [crs, 1], [cfg["BLOCK_N"], cfg["BLOCK_K"]])
    return xd, wdsc


def row_tiles(wl: ConvWorkload, bi: int, bp: int, bq: int) -> int:
    """Spatial row tiles of BI images x BP output rows x BQ output columns over the output."""
    return math.ceil(wl.N / bi) * math.ceil(wl.P / bp) * math.ceil(wl.Q / bq)


def padded_rows(wl: ConvWorkload, cfg: Config) -> int:
    """GEMM rows the row tiles of `cfg` cover (output pixels plus the tiles' overhang)."""
    bi, bp, bq = cfg["BLOCK_I"], cfg["BLOCK_P"], cfg["BLOCK_Q"]
    return row_tiles(wl, bi, bp, bq) * bi * bp * bq


def output_tiles(wl: ConvWorkload, cfg: Config) -> int:
    """Output tiles (programs per reduction split): row tiles x filter tiles."""
    return (row_tiles(wl, cfg["BLOCK_I"], cfg["BLOCK_P"], cfg["BLOCK_Q"])
            * math.ceil(wl.K / cfg["BLOCK_N"]))


def reduction_steps(wl: ConvWorkload, block_k: int) -> int:
    """Iterations of the reduction loop: taps x channel chunks."""
    return igemm.reduction_steps(wl.R, wl.S, wl.C, block_k)


def launches(wl: ConvWorkload, prob: Problem, cfg: Config,
             descs: tuple[TensorDescriptor, TensorDescriptor], out: torch.Tensor,
             bias, scale, mult, shift, workspace: SplitWorkspace | None = None,
             zero_point: torch.Tensor | None = None) -> list[igemm.Launch]:
    """The launch of one validated call (`descs` = `_descriptors` of the int8 x, w).
    workspace: as for `igemm.launches` (made here when None); zero_point: the int32 [K]
    terms of u8 activations (`zero_point.zero_point_terms`), else None."""
    xd, wdsc = descs
    split = cfg["SPLIT_K"]
    tiles = output_tiles(wl, cfg)
    if workspace is None:
        workspace = split_workspace(prob, split, tiles, out.device)
    scratch = (out, out) if workspace is None else (workspace.partials, workspace.arrivals)
    vecs = [t if t is not None else out for t in (bias, scale, mult, shift)]
    kind, layout, obits, qmin, qmax = prob.out
    zp = out if zero_point is None else zero_point
    args = (xd, wdsc, out, *vecs, *scratch, zp, wl.N, wl.P, wl.Q, wl.C, wl.K, prob.M, wl.pad,
            prob.out_row, prob.out_plane, igemm.cdiv(reduction_steps(wl, cfg["BLOCK_K"]), split))
    kwargs = dict(
        R=wl.R, S=wl.S, STRIDE=wl.stride, A_ZERO=prob.a_zero, HAS_BIAS=prob.bias,
        RELU=prob.relu, OUT_KIND=kind,
        OUT_LAYOUT=layout, OUT_BITS=obits, QMIN=qmin, QMAX=qmax, WIDE=prob.wide,
        LOOP_CRS=cfg["LOOP_ORDER"] == "crs", SPLIT_K=split,
        BLOCK_I=cfg["BLOCK_I"], BLOCK_P=cfg["BLOCK_P"], BLOCK_Q=cfg["BLOCK_Q"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return [igemm.Launch(tma_conv_kernel, (tiles, split), args, kwargs)]


def _as_int8(t: torch.Tensor) -> torch.Tensor:
    # unsigned operands of <= 7 bits (uint8 storage) are < 128: the same bytes as int8
    return t.view(torch.int8) if t.dtype == torch.uint8 else t


class TmaConvKernel:
    """One (stride-1 or -2 conv workload, config): `kernel(x, w, params, out=None) -> out`.

    `out`, if given, must be a contiguous tensor of the output's storage shape and dtype.
    """

    def __init__(self, template: str, workload: ConvWorkload, config: Config):
        self.template = template
        self.workload = workload
        self.config = config
        self.problem = problem(workload, dot_fp16=False)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Validate once, return a no-argument launcher for these tensors."""
        wl = self.workload
        check_inputs(wl, x, w, params)
        check_shifted_bias(wl.epilogue, params, wl.K, x.device)
        _check_device(x)
        for name, t in (("x", x), ("w", w)):
            if t.data_ptr() % 16:
                raise ValueError(f"{name} must start at a 16-byte aligned address for TMA")
        out = output_buffer(wl, x.device, out)
        prob, cfg = self.problem, self.config
        if wl.epilogue.bias:
            top = int(params.bias.to(torch.int64).abs().max()) if params.bias.numel() else 0
            if acc_bound(wl) + top >= EXACT_INT32:
                prob = dataclasses.replace(prob, wide=True)
        # descriptors built once per bind: host-side work kept out of the timed launcher
        descs = _descriptors(wl, cfg, _as_int8(x), _as_int8(w))
        vecs = (bias_vector(wl.epilogue, params), params.scale, params.multiplier, params.shift)
        prob, vecs = with_float64_requant(wl, prob, params, vecs, x.device)
        workspace = split_workspace(prob, cfg["SPLIT_K"], output_tiles(wl, cfg), x.device)
        terms = bound_terms(wl, w, x.device) if prob.a_zero else None
        plan = launches(wl, prob, cfg, descs, out, *vecs, workspace, terms)  # fixed once

        def launcher() -> torch.Tensor:
            igemm.replay(plan)
            return out

        return launcher

    def compile(self):
        """Compile ahead of time without launching; Triton's CompiledKernel (n_regs,
        n_spills, asm), None under the interpreter or without CUDA."""
        if interpreting() or not torch.cuda.is_available():
            return None
        return self.compile_on("cuda")

    def compile_on(self, device: torch.device | str, requant: int | None = None):
        """`compile()` on `device` with placeholder tensors typed as a real call types them
        (descriptors carry the workload's real shape and strides; nothing is read); requant:
        the shifted-bias form (`templates.placeholder_requant`)."""
        from ...core.validate import out_storage

        wl = self.workload
        x = torch.empty(16, dtype=torch.int8, device=device)
        w = torch.empty(16, dtype=torch.int8, device=device)
        out = torch.empty(16, dtype=out_storage(wl)[1], device=device)
        terms = bound_terms(wl, w, device) if self.problem.a_zero else None
        prob, vecs = placeholder_requant(wl, self.problem, requant, device)
        plan = launches(wl, prob, self.config, _descriptors(wl, self.config, x, w), out, *vecs,
                        None, terms)
        return igemm.replay(plan, compile_only=True)


def tma_loop_orders(wl: ConvWorkload) -> tuple[str, ...]:
    return ("rsc", "crs") if wl.R * wl.S > 1 else ("rsc",)


def tma_split_values(wl: ConvWorkload) -> tuple[int, ...]:
    """SPLIT_K's values: deep layers at small batch, where 128-pixel x 128-filter tiles leave
    SMs idle while each tile has a long reduction (ResNet-50 s5 at batch 16: 28 tiles of 36
    steps)."""
    tiles = math.ceil(wl.N * wl.P * wl.Q / 128) * math.ceil(wl.K / 128)
    return (1, 2, 4) if tiles < TARGET.sms and reduction_steps(wl, 128) >= 8 else (1,)


TMA_KNOBS = KnobTable(
    KnobDef("BLOCK_I", (1, 2, 4, 8, 16, 32, 64, 128), "images per row tile"),
    KnobDef("BLOCK_P", (1, 2, 4, 8, 16), "output rows per row tile"),
    KnobDef("BLOCK_Q", (1, 2, 4, 8, 16, 32, 64), "output columns per row tile"),
    KnobDef("BLOCK_N", (64, 128, 256), "filters per tile"),
    KnobDef("BLOCK_K", (32, 64, 128), "channels of a tap per step"),
    KnobDef("num_warps", (4, 8), "warps per program"),
    KnobDef("num_stages", (2, 3, 4), "software-pipeline depth"),
    KnobDef("GROUP_M", (1, 8), "row tiles per group of the swizzled tile order (L2 reuse)"),
    KnobDef("LOOP_ORDER", ("rsc", "crs"), "'rsc': tap outer, channel chunk inner; 'crs' the "
            "other way", choices=tma_loop_orders),
    KnobDef("SPLIT_K", (1, 2, 4), "reduction splits where the tile grid under-fills the GPU; "
            "the last program of a tile to finish sums the int32 partials and runs the "
            "epilogue", choices=tma_split_values),
)


def _least_padded_rows(wl: ConvWorkload, knobs: list[Knob]) -> int:
    """The fewest rows any tile of 64, 128 or 256 pixels covers (the waste constraint's base)."""
    vals = {k.name: k.values for k in knobs}
    return min(row_tiles(wl, bi, bp, bq) * bi * bp * bq
               for bi in vals["BLOCK_I"] for bp in vals["BLOCK_P"] for bq in vals["BLOCK_Q"]
               if bi * bp * bq in (64, 128, 256))


class Conv2dInt8TmaTemplate(KernelTemplate):
    """Stride-1/2 NHWC x KRSC conv2d on int8 tensor cores with TMA-loaded operands."""

    name = "triton.conv2d_int8_tma"
    backend = "triton"
    #: runs Epilogue.shifted_bias (epilogue_store's HAS_BIAS = BIAS_SHIFTED)
    takes_shifted_bias: ClassVar[bool] = True
    added_knobs: ClassVar[Mapping[str, object]] = {"SPLIT_K": 1}

    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, ConvWorkload):
            return f"needs a ConvWorkload, got {type(wl).__name__}"
        reason = grouped_reason(wl) or int8_refusal(wl)
        if reason:
            return reason
        if wl.stride not in (1, 2):
            return (f"stride={wl.stride}: only strides 1 and 2 (the input window of a spatial "
                    "tile is then one TMA box); use triton.conv2d_int8")
        if wl.stride == 2 and (wl.H % 2 or wl.W % 2):
            return (f"stride=2 with H={wl.H}, W={wl.W}: needs even H and W (the input is read "
                    "as a view of row and column phases); use triton.conv2d_int8")
        if wl.stride == 2 and wl.C % 32:
            return (f"stride=2 with C={wl.C}: needs C a multiple of 32 (channel chunks of 32+ "
                    "must divide C); use triton.conv2d_int8")
        for name, layout in (("a_layout", wl.a_layout), ("w_layout", wl.w_layout)):
            if layout is not Layout.INT8:
                return f"{name}={layout.value!r}: only int8 storage (one value per byte)"
        if reason := u8_weights_reason(wl):
            return reason
        if act_zero_point(wl.a) and wl.C % U8_CHANNEL_ALIGN:
            return (f"a={wl.a} with C={wl.C}: u8 activations need C a multiple of "
                    f"{U8_CHANNEL_ALIGN} (BLOCK_K must divide C, `zero_point`); use "
                    "triton.conv2d_int8")
        if wl.C % CHANNEL_ALIGN:
            return (f"C={wl.C} is not a multiple of {CHANNEL_ALIGN}: TMA needs 16-byte "
                    "strides; use triton.conv2d_int8")
        bound = acc_bound(wl)
        if bound >= EXACT_INT32:
            return f"worst-case |accumulator| {bound} >= {EXACT_INT32}: int32 would not be exact"
        return None

    #: the knobs (module doc)
    knobs: ClassVar[KnobTable] = TMA_KNOBS

    def constraints(self, wl: ConvWorkload) -> list:
        def rows(c: Config) -> int:
            return c["BLOCK_I"] * c["BLOCK_P"] * c["BLOCK_Q"]

        least = _least_padded_rows(wl, self.knobs.knobs_for(wl))

        def tile(c: Config) -> str | None:
            # wgmma computes out^T: filters are its M (m64 per warpgroup, 8 warps = two
            # warpgroups), output pixels its N (<= 256)
            if rows(c) not in (64, 128, 256):
                return f"BLOCK_I*BLOCK_P*BLOCK_Q={rows(c)} not in (64, 128, 256)"
            if c["num_warps"] == 8 and c["BLOCK_N"] < 128 and rows(c) < 128:
                return "num_warps=8 needs BLOCK_N >= 128 or BLOCK_M >= 128 (two warpgroups)"
            return None

        def fits(c: Config) -> str | None:
            for knob, extent in (("BLOCK_I", wl.N), ("BLOCK_P", wl.P), ("BLOCK_Q", wl.Q)):
                if c[knob] > pow2_ceil(extent):
                    return f"{knob}={c[knob]} exceeds {extent} rounded up"
            padded = padded_rows(wl, c)
            if padded > MAX_ROW_WASTE * least:
                return (f"row tiles cover {padded} rows for {wl.N * wl.P * wl.Q} output "
                        f"pixels (> {MAX_ROW_WASTE} x the least padding, {least})")
            if c["BLOCK_N"] > max(64, pow2_ceil(wl.K)):
                return f"BLOCK_N={c['BLOCK_N']} exceeds K={wl.K} rounded up"
            if c["BLOCK_K"] > max(32, pow2_ceil(wl.C)):
                return f"BLOCK_K={c['BLOCK_K']} exceeds C={wl.C} rounded up"
            if act_zero_point(wl.a) and wl.C % c["BLOCK_K"]:
                return (f"u8 activations need BLOCK_K dividing C={wl.C} (past channel C a "
                        "box meets the next tap's weights, `zero_point`)")
            if wl.stride == 2 and wl.C % c["BLOCK_K"]:
                return (f"stride 2 needs BLOCK_K dividing C={wl.C} (a channel tail would read "
                        "the other column phase)")
            return None

        def smem(c: Config) -> str | None:
            need = c["num_stages"] * (rows(c) + c["BLOCK_N"]) * c["BLOCK_K"]
            return f"shared memory {need} B > {SMEM_LIMIT} B" if need > SMEM_LIMIT else None

        def registers(c: Config) -> str | None:
            per_thread = rows(c) * c["BLOCK_N"] // (32 * c["num_warps"])
            if per_thread > ACC_REGS_LIMIT:
                return f"{per_thread} accumulator registers per thread > {ACC_REGS_LIMIT}"
            if per_thread == ACC_REGS_LIMIT and c["BLOCK_N"] == 64:
                # offline ptxas (Triton 3.6, sm_90): 64 x 256 tiles on 4 warps spill ~210 B
                return "BLOCK_N=64 x 256 output pixels on 4 warps spills registers"
            if per_thread == ACC_REGS_LIMIT and c["SPLIT_K"] > 1:
                # offline ptxas (Triton 3.6, sm_90): the partial sum beside a 128 x 128 tile on
                # 4 warps spills 240-310 B with a requantizing epilogue
                return "SPLIT_K > 1 with 128 accumulator registers per thread spills registers"
            return None

        def group(c: Config) -> str | None:
            tiles_m = row_tiles(wl, c["BLOCK_I"], c["BLOCK_P"], c["BLOCK_Q"])
            if c["GROUP_M"] > 1 and tiles_m < 2 * c["GROUP_M"]:
                return "GROUP_M > 1 needs at least 2 groups of row tiles"
            return None

        def split(c: Config) -> str | None:
            if c["SPLIT_K"] == 1:
                return None
            return split_k_reason(output_tiles(wl, c), reduction_steps(wl, c["BLOCK_K"]),
                                  c["SPLIT_K"], waves=2)

        return [tile, fits, smem, registers, group, split]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return self.knobs.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """128 output pixels (the most square spatial block with the least padding) x 128
        filters x 64 channels, 4 warps (8 where a requantizing epilogue needs them:
        `templates.default_warps`), 3 stages, GROUP_M 8 where valid."""
        space = self.space(wl)
        bn, bk = min(128, max(64, pow2_ceil(wl.K))), 64 if wl.C > 32 else 32
        want = {"BLOCK_N": bn, "BLOCK_K": bk,
                "num_warps": default_warps(wl, 128, bn, reduction_steps(wl, bk)),
                "num_stages": 3, "GROUP_M": 8, "LOOP_ORDER": "rsc", "SPLIT_K": 1}
        pts = [c for c in space if all(c[k] == v for k, v in want.items() if k != "GROUP_M")]
        if not pts:
            return space.all_configs()[0]

        def cost(c: Config) -> tuple:
            rows = c["BLOCK_I"] * c["BLOCK_P"] * c["BLOCK_Q"]
            return (rows != 128, padded_rows(wl, c), c["BLOCK_I"], abs(c["BLOCK_P"] - c["BLOCK_Q"]),
                    c["GROUP_M"] != 8)

        return min(pts, key=cost)

    def geometry(self, wl: Workload, config: Mapping) -> Geometry:
        """BLOCK_I x BLOCK_P x BLOCK_Q pixel tiles (overhanging the image at its edges) by
        BLOCK_N filters, BLOCK_K channels of a tap a step, SPLIT_K slices, 8-bit tiles."""
        c = config
        m, n, k = wl.gemm_shape
        bi, bp, bq = int(c["BLOCK_I"]), int(c["BLOCK_P"]), int(c["BLOCK_Q"])
        bm = bi * bp * bq
        bn, bk = int(c["BLOCK_N"]), int(c["BLOCK_K"])
        warps, stages = int(c.get("num_warps", 4)), int(c.get("num_stages", 2))
        split = int(c.get("SPLIT_K", 1))
        if isinstance(wl, ConvWorkload):
            row_tiles = math.ceil(wl.N / bi) * math.ceil(wl.P / bp) * math.ceil(wl.Q / bq)
        else:
            row_tiles = math.ceil(m / bm)
        taps, chans = conv_taps(wl)
        steps = taps * math.ceil(chans / bk)
        return Geometry("tma_conv", "int8", m, n, k, bm, bn, row_tiles * bm,
                        row_tiles * math.ceil(n / bn), split, bk, math.ceil(steps / split),
                        32 * warps, stages, stages * (bm + bn) * bk,
                        min(255, bm * bn // (32 * warps) + 40), False)

    def launch_shape(self, wl: Workload, config: Config) -> dict:
        """The launch as plain tiles (`kernels.geometry.LaunchShape` fields; 8-bit tiles in
        shared memory)."""
        rows = config["BLOCK_I"] * config["BLOCK_P"] * config["BLOCK_Q"]
        return dict(block_m=rows, block_n=config["BLOCK_N"], block_k=config["BLOCK_K"],
                    warps=config["num_warps"], stages=config["num_stages"],
                    split_k=config.get("SPLIT_K", 1), operand_bits=8)

    def build(self, wl: Workload, config: Config) -> TmaConvKernel:
        config = self.checked_config(wl, config)
        return TmaConvKernel(self.name, wl, config)
