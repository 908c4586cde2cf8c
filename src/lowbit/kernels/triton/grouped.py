"""Grouped conv2d (1 < groups, not depthwise) on int8 tensor cores: `triton.conv2d_grouped_int8`.

A grouped conv (ResNeXt 32x4d: 4-32 channels per group; RegNet: group widths 8-232) is
`groups` small convs side by side: filter k reads only the Cg = C / groups input channels of
its group k // Kg (Kg = K / groups). A dense implicit GEMM would reduce over all C channels,
groups times the work, or run one launch per group. This kernel is the implicit GEMM of
`igemm` (rows = output pixels, columns = filters, int8 `tl.dot`, fused epilogue) with a
block-diagonal reduction:

- column tile t covers filters [t BLOCK_N, (t + 1) BLOCK_N); its reduction runs over the input
  channels of the groups those filters belong to only, [g_lo Cg, (g_hi + 1) Cg) with g_lo,
  g_hi the groups of its first and last filter: its `span` of at most (BLOCK_N / Kg + 2) Cg
  channels, per tap, in chunks of BLOCK_K (the MMA shape; channels past the span masked);
- the weight tile is block-diagonal: filter n's Cg weights of a tap sit at its group's offset
  within the tile's span, zeros elsewhere. That operand is built once when a launch is planned
  (`block_diagonal_weights`: int8 [K, R*S, CT], CT the widest span rounded up to 16 bytes, each
  row of a tap contiguous), so the kernel loads it as a dense tile;
- activations are gathered from NHWC x as in `igemm` (`igemm.output_pixels`, padding and
  channels past the span masked to the value 0), int8 or PACKED sub-byte values unpacked in
  registers (`epilogue.load_operand`; as packed bytes split in registers where the groups
  start on byte boundaries: `depthwise.channel_tile`), u8 activations by the zero point
  (`zero_point`: the dot takes a - 128; the term 128 sum_k w[n, k] is summed from the
  block-diagonal weights, whose zeros add nothing);
- the epilogue is the implicit-GEMM kernels' (`epilogue.epilogue_store`).

Each column tile reads its own groups' channels, so the activations cross DRAM once whatever
BLOCK_N is; the MMA work per output is span / Cg times the useful work (BLOCK_N = 32 with
Kg = Cg = 4: 8x, still under the int8 peak for the memory traffic at ResNeXt's widths).
A bound launcher keeps its block-diagonal weights and zero-point terms: bind again after
changing the weights.

Knobs (`GROUPED_KNOBS`): BLOCK_PIX (output pixels of a tile), BLOCK_N, BLOCK_K, num_warps,
num_stages, GROUP_M (row tiles sharing the weight tiles in L2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import triton
import triton.language as tl

from ...core import Config, ConfigSpace, ConvWorkload, Workload
from ...core.knobs import KnobDef, KnobTable
from ...core.precision import Encoding
from ...quant.packing import unpack
from ..base import KernelTemplate, pow2_ceil
from .depthwise import (
    channel_tile,
    grouped_conv_reason,
    row_alignment,
    tile_reason,
)
from .epilogue import ENC_CODE, SRC_INT8, SRC_PACKED, epilogue_store, load_operand
from .igemm import (
    Launch,
    Problem,
    cdiv,
    grouped_tile,
    output_pixels,
    reduction_steps,
    tap_and_chunk,
)
from .templates import (
    ACC_REGS_LIMIT,
    SMEM_LIMIT,
    IgemmKernel,
    default_warps,
    problem,
    u8_weights_reason,
)
from .zero_point import ACT_ZERO_POINT, shifted_act, with_zero_point

#: bytes the block-diagonal weight rows are padded to (16-byte vector loads)
ROW_ALIGN = 16


@triton.jit
def grouped_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr, zp_ptr,
    M, NOUT, H, W, P, Q, conv_stride, pad, x_row, out_row, out_plane,
    R: tl.constexpr, S: tl.constexpr, CG: tl.constexpr, KG: tl.constexpr, CT: tl.constexpr,
    IS_GEMM: tl.constexpr, A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr,
    A_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, ALIGN_X: tl.constexpr, TILE_GROUPS: tl.constexpr,
    FULL_SPAN: tl.constexpr, PACKED_BYTES: tl.constexpr, SPAN_VEC: tl.constexpr,
    BLOCK_PIX: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Output tile (pid_m, pid_n): the dot of the pixels' input channels of the tile's groups
    with the block-diagonal weights [K, R*S, CT] over taps x chunks of the span, then the
    fused epilogue (module doc).

    TILE_GROUPS: BLOCK_N / KG where KG divides BLOCK_N, else 0; FULL_SPAN: the span of every
    tile (TILE_GROUPS * CG) where K is a multiple of BLOCK_N too, else 0. With them the
    compiler knows the span's first channel and length as multiples, so its loads and masks
    stay wide vectors. PACKED_BYTES: packed activations whose groups start on byte boundaries
    (CG a multiple of 8 / A_BITS), read as packed bytes split in registers
    (`depthwise.channel_tile`). SPAN_VEC: a power of two dividing every chunk's first and last
    channel and the span's end (in storage elements: bytes of packed activations), the
    width over which the span's mask is constant."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_PIX), tl.cdiv(NOUT, BLOCK_N),
                                GROUP_M)
    offs_m = pid_m * BLOCK_PIX + tl.arange(0, BLOCK_PIX)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < NOUT
    n_img, ih0, iw0 = output_pixels(offs_m, P, Q, conv_stride, pad, IS_GEMM)
    if TILE_GROUPS > 0:
        g_lo = pid_n * TILE_GROUPS
    else:
        g_lo = (pid_n * BLOCK_N) // KG
    if FULL_SPAN > 0:
        span = FULL_SPAN
    else:
        span = ((tl.minimum(pid_n * BLOCK_N + BLOCK_N, NOUT) - 1) // KG - g_lo + 1) * CG
    cin_lo = g_lo * CG
    chunks = tl.cdiv(span, BLOCK_K)
    w_rows = offs_n * (R * S)
    PER: tl.constexpr = 8 // A_BITS  # values a byte of packed activations
    acc = tl.zeros((BLOCK_PIX, BLOCK_N), dtype=tl.int32)
    for it in range(0, R * S * chunks):
        tap, cc = tap_and_chunk(it, R * S, chunks, False)
        j = cc * BLOCK_K + tl.arange(0, BLOCK_K)
        j_mask = j < span
        if SPAN_VEC > 1:
            j_mask = tl.max_constancy(j_mask, SPAN_VEC)
        if IS_GEMM:
            a_mask = m_mask
            a_off = offs_m * x_row
        else:
            ih = ih0 + tap // S
            iw = iw0 + tap % S
            a_mask = m_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_off = ((n_img * H + ih) * W + iw) * x_row
        if ALIGN_X > 1:
            a_off = tl.multiple_of(a_off, ALIGN_X)
        if A_ZERO != 0:
            a = load_operand(x_ptr, a_off, cin_lo + j, a_mask, j_mask, A_SRC, A_BITS, A_ENC,
                             True, tl.uint8)
            a = shifted_act(a, A_ZERO)
        elif PACKED_BYTES:
            a = channel_tile(x_ptr, a_off, cin_lo + cc * BLOCK_K,
                             g_lo * (CG // PER) + cc * (BLOCK_K // PER), cin_lo + span,
                             g_lo * (CG // PER) + span // PER, a_mask, A_SRC, A_BITS, A_ENC,
                             SPAN_VEC, BLOCK_PIX, BLOCK_K).to(tl.int8)
        else:
            a = load_operand(x_ptr, a_off, cin_lo + j, a_mask, j_mask, A_SRC, A_BITS, A_ENC,
                             True, tl.int8)
        b = tl.load(w_ptr + ((w_rows + tap) * CT)[None, :] + j[:, None],
                    mask=j_mask[:, None] & n_mask[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    acc = with_zero_point(acc, zp_ptr, offs_n, n_mask, 0, A_ZERO)
    epilogue_store(acc, offs_m, pid_n * BLOCK_N, M, NOUT, out_ptr, out_row, out_plane,
                   bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                   OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_PIX, BLOCK_N)


def tile_spans(wl: ConvWorkload, block_n: int) -> list[tuple[int, int]]:
    """(first input channel, channels) of each column tile's reduction: the input channels of
    the groups its filters [t block_n, (t + 1) block_n) belong to (the kernel's cin_lo, span)."""
    kg, cg = wl.K // wl.groups, wl.C // wl.groups
    out = []
    for n0 in range(0, wl.K, block_n):
        g_lo, g_hi = n0 // kg, (min(n0 + block_n, wl.K) - 1) // kg
        out.append((g_lo * cg, (g_hi - g_lo + 1) * cg))
    return out


def span_width(wl: ConvWorkload, block_n: int) -> int:
    """CT: the widest column tile's span, rounded up to ROW_ALIGN (the block-diagonal weight
    rows' length)."""
    widest = max(span for _, span in tile_spans(wl, block_n))
    return -(-widest // ROW_ALIGN) * ROW_ALIGN


def block_diagonal_weights(wl: ConvWorkload, w: torch.Tensor, block_n: int) -> torch.Tensor:
    """int8 [K, R*S, CT] on w's device: filter n's tap row holds its Cg weights at its group's
    offset within its column tile's span (`tile_spans`), zeros elsewhere. `w`: the workload's
    validated KRSC weights [K, R, S, C / groups] in their storage layout."""
    k, taps, cg, kg = wl.K, wl.R * wl.S, wl.C // wl.groups, wl.K // wl.groups
    values = unpack(w, wl.w, wl.w_layout, cg).reshape(k, taps, cg)
    n = torch.arange(k, device=w.device)
    first = torch.tensor([lo for lo, _ in tile_spans(wl, block_n)], device=w.device)
    offset = (n // kg) * cg - first[n // block_n]
    cols = (offset[:, None, None] + torch.arange(cg, device=w.device)).expand(k, taps, cg)
    out = torch.zeros((k, taps, span_width(wl, block_n)), dtype=torch.int8, device=w.device)
    return out.scatter_(2, cols, values.to(torch.int8))


def grouped_problem(wl: ConvWorkload) -> Problem:
    """The kernel's view of a grouped workload (`templates.problem`'s strides, epilogue and
    u8 zero point; the weights as the int8 block-diagonal operand)."""
    return dataclasses.replace(problem(wl, False), w_operand=(SRC_INT8, 8,
                                                              ENC_CODE[Encoding.SIGNED]))


def grouped_launch(wl: ConvWorkload, prob: Problem, cfg: Mapping, x: torch.Tensor,
                   w_blocks: torch.Tensor, out: torch.Tensor, vecs: tuple,
                   terms: torch.Tensor | None) -> Launch:
    """The one launch of a validated call (`w_blocks`: `block_diagonal_weights`; `vecs`: bias,
    scale, multiplier, shift or None; `terms`: the int32 [K] zero-point terms where
    prob.a_zero, else None). No checks here."""
    bp, bn = cfg["BLOCK_PIX"], cfg["BLOCK_N"]
    kind, layout, obits, qmin, qmax = prob.out
    vecs = tuple(t if t is not None else out for t in vecs)
    args = (x, w_blocks, out, *vecs, out if terms is None else terms, prob.M, prob.NOUT, prob.H,
            prob.W, prob.P, prob.Q, prob.stride, prob.pad, prob.x_row, prob.out_row,
            prob.out_plane)
    cg, kg = wl.C // wl.groups, wl.K // wl.groups
    tile_groups = bn // kg if bn % kg == 0 else 0
    packed_bytes = prob.a_operand[0] == SRC_PACKED and cg * prob.a_operand[1] % 8 == 0
    per = 8 // prob.a_operand[1] if packed_bytes else 1  # the span's values a stored element
    span_vec = math.gcd(cg // per, cfg["BLOCK_K"] // per, row_alignment(prob))
    kwargs = dict(
        R=prob.R, S=prob.S, CG=cg, KG=kg,
        CT=span_width(wl, bn), IS_GEMM=prob.is_gemm, A_SRC=prob.a_operand[0],
        A_BITS=prob.a_operand[1], A_ENC=prob.a_operand[2], A_ZERO=prob.a_zero,
        HAS_BIAS=prob.bias, RELU=prob.relu, OUT_KIND=kind, OUT_LAYOUT=layout, OUT_BITS=obits,
        QMIN=qmin, QMAX=qmax, WIDE=prob.wide, ALIGN_X=row_alignment(prob),
        TILE_GROUPS=tile_groups,
        FULL_SPAN=tile_groups * cg if tile_groups and wl.K % bn == 0 else 0,
        PACKED_BYTES=packed_bytes, SPAN_VEC=span_vec,
        BLOCK_PIX=bp, BLOCK_N=bn, BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grid = (cdiv(prob.M, bp) * cdiv(prob.NOUT, bn),)
    return Launch(grouped_kernel, grid, args, kwargs)


class GroupedKernel(IgemmKernel):
    """One compiled (workload, config) of `triton.conv2d_grouped_int8`: `kernel(x, w, params,
    out=None)` and `bind(...)` as `IgemmKernel`; a bound launcher owns the block-diagonal
    weights (and u8 activations' zero-point terms) built from `w` at bind."""

    def plan(self, prob: Problem, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             vecs: tuple) -> list[Launch]:
        wl, bn = self.workload, self.config["BLOCK_N"]
        if w.dim() == 1:  # an ahead-of-time compile's placeholder: only the dtype matters
            blocks = torch.empty(16, dtype=torch.int8, device=w.device)
            terms = torch.empty(16, dtype=torch.int32, device=w.device) if prob.a_zero else None
        else:
            blocks = block_diagonal_weights(wl, w, bn)
            terms = None
            if prob.a_zero:
                sums = blocks.reshape(wl.K, -1).sum(dim=1)
                terms = (sums * ACT_ZERO_POINT).to(torch.int32)
        return [grouped_launch(wl, prob, self.config, x, blocks, out, vecs, terms)]


GROUPED_KNOBS = KnobTable(
    KnobDef("BLOCK_PIX", (128, 64, 256), "output pixels per tile (rows of the dot)"),
    KnobDef("BLOCK_N", (32, 16, 64, 128), "filters per tile; its groups' channels reduced"),
    KnobDef("BLOCK_K", (32, 64, 128), "input channels of the span per reduction step"),
    KnobDef("num_warps", (4, 8), "warps per program"),
    KnobDef("num_stages", (3, 2, 4), "software-pipeline depth of the reduction"),
    KnobDef("GROUP_M", (8, 1), "row tiles per group of the swizzled tile order (L2 reuse)"),
)


class Conv2dGroupedInt8Template(KernelTemplate):
    """Grouped conv2d NHWC x KRSC [K, R, S, C / groups] (1 < groups, not depthwise) on int8
    tensor cores with a block-diagonal reduction per column tile, any R x S, stride and
    padding, the implicit-GEMM kernels' fused epilogue; INT8 or PACKED operands (module
    doc)."""

    name = "triton.conv2d_grouped_int8"
    backend = "triton"
    takes_shifted_bias: ClassVar[bool] = True
    layer_outputs_max: ClassVar[int] = 0

    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, ConvWorkload):
            return f"needs a ConvWorkload, got {type(wl).__name__}"
        if wl.groups == 1:
            return "groups=1: a dense conv (triton.conv2d_int8 and the other conv templates)"
        if wl.depthwise:
            return ("depthwise (groups == C == K) runs on triton.conv2d_depthwise (the MMA "
                    "would pad each one-channel reduction to its k32 shape)")
        return u8_weights_reason(wl) or grouped_conv_reason(wl)

    def constraints(self, wl: ConvWorkload) -> list:
        m = wl.gemm_shape[0]

        def fits(c: Config) -> str | None:
            reason = tile_reason(wl, c["BLOCK_PIX"], 64, c["BLOCK_N"], "BLOCK_N")
            if reason:
                return reason
            ct = span_width(wl, c["BLOCK_N"])
            if c["BLOCK_K"] > max(32, pow2_ceil(ct)):
                return f"BLOCK_K={c['BLOCK_K']} exceeds the tiles' span of {ct} channels"
            return None

        def smem(c: Config) -> str | None:
            need = c["num_stages"] * (c["BLOCK_PIX"] + c["BLOCK_N"]) * c["BLOCK_K"]
            return f"shared memory {need} B > {SMEM_LIMIT} B" if need > SMEM_LIMIT else None

        def registers(c: Config) -> str | None:
            per_thread = c["BLOCK_PIX"] * c["BLOCK_N"] // (32 * c["num_warps"])
            if per_thread > ACC_REGS_LIMIT:
                return f"{per_thread} accumulator registers per thread > {ACC_REGS_LIMIT}"
            if c["num_warps"] == 8 and c["BLOCK_PIX"] < 128:
                return "num_warps=8 needs BLOCK_PIX >= 128 (two m64 warpgroups)"
            return None

        def group(c: Config) -> str | None:
            if c["GROUP_M"] > 1 and math.ceil(m / c["BLOCK_PIX"]) < 2 * c["GROUP_M"]:
                return "GROUP_M > 1 needs at least 2 groups of row tiles"
            return None

        return [fits, smem, registers, group]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return GROUPED_KNOBS.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """BLOCK_N: the filters of whole groups, at least 32 (Kg rounded up to a power of two,
        at most 128; K rounded up where smaller), BLOCK_K: the tiles' span rounded up to a
        power of two (32 to 128), 128-pixel tiles, 4 warps (8 where a requantizing epilogue
        needs them: `templates.default_warps`), 3 stages, GROUP_M 8 (1 where the row tiles
        are too few)."""
        space = self.space(wl)
        bn = min(128, max(32, pow2_ceil(wl.K // wl.groups)), max(16, pow2_ceil(wl.K)))
        bk = min(128, max(32, pow2_ceil(span_width(wl, bn))))
        pix = 128 if wl.gemm_shape[0] > 64 else 64
        steps = reduction_steps(wl.R, wl.S, span_width(wl, bn), bk)
        cfg = Config(BLOCK_PIX=pix, BLOCK_N=bn, BLOCK_K=bk,
                     num_warps=default_warps(wl, pix, bn, steps), num_stages=3, GROUP_M=8)
        if not space.is_valid(cfg):
            cfg = cfg.replace(GROUP_M=1)
        return cfg if space.is_valid(cfg) else space.all_configs()[0]

    def launch_shape(self, wl: Workload, config: Config) -> dict:
        """The launch as plain tiles (`kernels.geometry.LaunchShape` fields): the implicit
        GEMM N*P*Q x K whose reduction is a tile's padded span, R*S*CT (the MMA work done,
        zeros included)."""
        ct = span_width(wl, config["BLOCK_N"])
        return dict(M=wl.gemm_shape[0], N=wl.K, K=wl.R * wl.S * ct,
                    block_m=config["BLOCK_PIX"], block_n=config["BLOCK_N"],
                    block_k=config["BLOCK_K"], warps=config["num_warps"],
                    stages=config["num_stages"], split_k=1, operand_bits=8)

    def build(self, wl: Workload, config: Config) -> GroupedKernel:
        config = self.checked_config(wl, config)
        return GroupedKernel(self.name, wl, config, grouped_problem(wl))


__all__ = ["GROUPED_KNOBS", "Conv2dGroupedInt8Template", "GroupedKernel",
           "block_diagonal_weights", "grouped_kernel", "grouped_launch", "grouped_problem",
           "span_width", "tile_spans"]
