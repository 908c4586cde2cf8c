"""`triton.conv2d_pointwise` with a network layer's whole epilogue in its own: persistent.

A residual block's end (ResNet-50's layer1: C=64 -> K=256, the 8-bit residual added, the
requantized stream and outputs derived from it) or a MobileNet-V2 projection with its
residual add writes several outputs from one accumulator (`netops.bind_layer_epilogue`).
`bind_pointwise_outputs` runs the pointwise kernel's persistent main loop (`pointwise`: the
program's weight tile resident, a `tl.range` over its row tiles that Triton software-pipelines
`num_stages` deep, one `tl.dot` a tile) and hands each finished int32 tile to the shared
per-output code (`kernel_outputs.emit_tile_outputs`: the residual's tile, up to
FUSED_OUTPUTS_MAX `layer_outputs.emit_slot` slots), so the outputs equal
`bind_layer_epilogue(acc, outputs, outs, residual)` bit for bit, with no int32 tensor, and the
next tiles' activation loads are in flight while a tile requantizes and stores.

The launch keeps the kernel's num_stages and runs its own tile, OUTPUTS_TILE (BLOCK_M,
BLOCK_N, num_warps, PROGRAMS_PER_SM): the float64 requantization, the residual's tile and the
outputs live beside the accumulator (the implicit GEMM's fused launch spilled at 128 x 128 on
4 warps, `conv_outputs`). 128 x 32 on 4 warps (32 accumulators a thread, wgmma) compiles for
sm_90 to 128-168 registers without spill (offline ptxas, Triton 3.9: ResNet-50's layer1
block end with a u8 residual into a u8 output 128 in INT32, 150 in FAST_NARROW, 154 with a
derived u2 beside it; MobileNet-V2's features_3_conv_2, C=144, 168), so three programs fit
a SM's registers; fewer where their staged activation tiles do not fit its shared memory
(`outputs_config`). 128 x 64 reached 255 registers and spilled with a derived output.

PREFETCH_RESIDUAL (off by default) loads each row tile's residual one iteration ahead, a
loop-carried tile held as int32 words of 4 byte channels (`stored_residual`) and unpacked in
the epilogue (`residual_values`), off the tile's critical path after the MMA. Offline ptxas,
sm_90, Triton 3.9 / 3.6, registers without / with it: u8 residual into u8, INT32 128 / 96 ->
126 / 128, FAST_NARROW 150 / 164 -> 154 / 166; with a derived u2 154 / 255 (3.6 spills) ->
183 / 255 (3.6 spills more); features_3_conv_2 168 / 172 -> 185 / 198: past three programs
a SM where the epilogue is larger, so off until the GPU times it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl

from ...core import PackedTensor
from ...core.hardware import TARGET
from .igemm import Launch
from .kernel_outputs import (
    accumulator_reason,
    emit_loaded_tile_outputs,
    emit_tile_outputs,
    fused_arguments,
)
from .layer_outputs import OutputSpec
from .pointwise import (
    PointwiseKernel,
    block_k,
    device_sms,
    mainloop_constants,
    programs,
    resident_weights,
    row_tile_accumulator,
)
from .stored import Launcher, load_values

#: the launch's output tile and grid (module doc)
OUTPUTS_TILE = {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "PROGRAMS_PER_SM": 3}
#: whether a launch loads each row tile's residual one iteration ahead (module doc)
PREFETCH_RESIDUAL = False


@triton.jit
def pointwise_outputs_kernel(
    x_ptr, w_ptr, zp_ptr, res_ptr, M, NOUT, res_row, res_plane, col_tiles, row_step,
    o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
    o2, a2, b2, c2, d2, t2, row2, plane2,
    C: tl.constexpr, X_ROW: tl.constexpr, W_ROW: tl.constexpr, ALIGN_C: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    HAS_RES: tl.constexpr, RES_LAYOUT: tl.constexpr, RES_BITS: tl.constexpr,
    RES_ENC: tl.constexpr,
    KIND0: tl.constexpr, LAYOUT0: tl.constexpr, BITS0: tl.constexpr, QLO0: tl.constexpr,
    QMAX0: tl.constexpr, RES0: tl.constexpr, MODE0: tl.constexpr, SAME0: tl.constexpr,
    TABLE0: tl.constexpr, TMIN0: tl.constexpr,
    KIND1: tl.constexpr, LAYOUT1: tl.constexpr, BITS1: tl.constexpr, QLO1: tl.constexpr,
    QMAX1: tl.constexpr, RES1: tl.constexpr, MODE1: tl.constexpr, SAME1: tl.constexpr,
    TABLE1: tl.constexpr, TMIN1: tl.constexpr,
    KIND2: tl.constexpr, LAYOUT2: tl.constexpr, BITS2: tl.constexpr, QLO2: tl.constexpr,
    QMAX2: tl.constexpr, RES2: tl.constexpr, MODE2: tl.constexpr, SAME2: tl.constexpr,
    TABLE2: tl.constexpr, TMIN2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PREFETCH_RES: tl.constexpr = False, RES_WORDS: tl.constexpr = 0,
):
    """`pointwise_kernel`'s program (column tile p % col_tiles, its weights resident, row
    tiles p // col_tiles + i row_step), each tile's layer-epilogue outputs written by
    `emit_tile_outputs` (module doc)."""
    pid = tl.program_id(0)
    col = pid % col_tiles
    c_mask, b, zp = resident_weights(w_ptr, zp_ptr, col, NOUT, C, W_ROW, ALIGN_C, W_SRC,
                                     W_BITS, W_ENC, A_ZERO, BLOCK_N, BLOCK_K)
    first = pid // col_tiles
    if HAS_RES and PREFETCH_RES:
        # the residual's tile one iteration ahead, in its storage type while in flight
        res_next = stored_residual(res_ptr, first, M, col * BLOCK_N, NOUT, res_row,
                                   res_plane, RES_LAYOUT, RES_BITS, RES_ENC, RES_WORDS,
                                   BLOCK_M, BLOCK_N)
    for tile in tl.range(first, tl.cdiv(M, BLOCK_M), row_step):
        if HAS_RES and PREFETCH_RES:
            res_tile = res_next
            res_next = stored_residual(res_ptr, tile + row_step, M, col * BLOCK_N, NOUT,
                                       res_row, res_plane, RES_LAYOUT, RES_BITS, RES_ENC,
                                       RES_WORDS, BLOCK_M, BLOCK_N)
        offs_m, acc = row_tile_accumulator(x_ptr, tile, M, c_mask, b, zp, X_ROW, ALIGN_C,
                                           A_SRC, A_BITS, A_ENC, A_ZERO, BLOCK_M, BLOCK_K)
        if HAS_RES and PREFETCH_RES:
            emit_loaded_tile_outputs(
                acc, residual_values(res_tile, RES_WORDS, BLOCK_M, BLOCK_N), offs_m,
                col * BLOCK_N, M, NOUT,
                o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
                o2, a2, b2, c2, d2, t2, row2, plane2,
                KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0, TMIN0,
                KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1, TMIN1,
                KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2, TMIN2,
                BLOCK_M, BLOCK_N)
        else:
            emit_tile_outputs(
                acc, offs_m, col * BLOCK_N, M, NOUT, res_ptr, res_row, res_plane,
                o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
                o2, a2, b2, c2, d2, t2, row2, plane2, HAS_RES, RES_LAYOUT, RES_BITS, RES_ENC,
                KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0, TMIN0,
                KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1, TMIN1,
                KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2, TMIN2,
                BLOCK_M, BLOCK_N)


@triton.jit
def stored_residual(res_ptr, tile, M, c0, NOUT, res_row, res_plane,
                    RES_LAYOUT: tl.constexpr, RES_BITS: tl.constexpr, RES_ENC: tl.constexpr,
                    RES_WORDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The residual's tile of row tile `tile` (channels c0 ..; rows past M, a whole tile past
    the last one included, read 0) as `residual_values` takes it: INT8 layout in its storage
    type, RES_WORDS (1-byte storage, NOUT and res_row multiples of 4) as int32 words of 4 channels
    [BLOCK_M, BLOCK_N // 4]; bit planes as `load_values`' int32 values."""
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = (offs_m < M)[:, None]
    if RES_LAYOUT != 0:
        v = load_values(res_ptr, offs_m, offs_m < M, c0, NOUT, res_row, res_plane,
                        RES_LAYOUT, RES_BITS, RES_ENC, BLOCK_M, BLOCK_N)
    elif RES_WORDS != 0:
        word = c0 // 4 + tl.arange(0, BLOCK_N // 4)
        v = tl.load(res_ptr.to(tl.pointer_type(tl.int32)) + offs_m[:, None] * (res_row // 4)
                    + word[None, :], mask=m_mask & (word < NOUT // 4)[None, :], other=0)
    else:
        chan = c0 + tl.arange(0, BLOCK_N)
        v = tl.load(res_ptr + offs_m[:, None] * res_row + chan[None, :],
                    mask=m_mask & (chan < NOUT)[None, :], other=0)
    return v


@triton.jit
def residual_values(v, RES_WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """int32 values [BLOCK_M, BLOCK_N] of a `stored_residual` tile (RES_WORDS: its bytes
    unpacked, little-endian; 1 uint8 storage, 2 int8)."""
    if RES_WORDS != 0:
        byte = (v[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF
        if RES_WORDS == 2:
            byte = (byte ^ 0x80) - 0x80
        out = tl.reshape(byte, (BLOCK_M, BLOCK_N))
    else:
        out = v.to(tl.int32)
    return out


def pointwise_outputs_reason(kernel: object, n_outputs: int) -> str | None:
    """Why `kernel` cannot write `n_outputs` layer-epilogue outputs in its persistent launch
    (a `triton.conv2d_pointwise` kernel whose workload stores the bare int32 accumulator,
    1..FUSED_OUTPUTS_MAX outputs), None when it can."""
    if not isinstance(kernel, PointwiseKernel):
        return "only triton.conv2d_pointwise kernels"
    return accumulator_reason(kernel.workload, n_outputs)


def outputs_config(config: Mapping, channels: int, tile: Mapping | None = None) -> dict:
    """The launch's knobs for `channels` input channels: `config`'s num_stages with `tile`
    (BLOCK_M, BLOCK_N, num_warps, PROGRAMS_PER_SM; default OUTPUTS_TILE), PROGRAMS_PER_SM
    lowered to the programs whose staged activation tiles and weight tile fit a SM's shared
    memory. BLOCK_M a power of two >= 16, BLOCK_N one >= 32 (bit-plane outputs store whole
    32-channel words), num_warps 1, 2, 4 or 8, PROGRAMS_PER_SM >= 1 (ValueError otherwise)."""
    tile = OUTPUTS_TILE if tile is None else dict(tile)
    if set(tile) != set(OUTPUTS_TILE):
        raise ValueError(f"tile must set exactly {sorted(OUTPUTS_TILE)}, got {sorted(tile)}")
    bm, bn, warps, per_sm = (tile[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps",
                                               "PROGRAMS_PER_SM"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in tile.values()) or \
            bm < 16 or bm & (bm - 1) or bn < 32 or bn & (bn - 1) or \
            warps not in (1, 2, 4, 8) or per_sm < 1:
        raise ValueError(f"tile {tile}: BLOCK_M a power of two >= 16, BLOCK_N one >= 32, "
                         "num_warps 1, 2, 4 or 8, PROGRAMS_PER_SM >= 1")
    bk = block_k(channels)
    smem = config["num_stages"] * bm * bk + bk * bn
    fit = max(1, (TARGET.smem_per_sm - 8 * 1024) // smem)
    return {**dict(config), **tile, "PROGRAMS_PER_SM": min(per_sm, fit)}


def bind_pointwise_outputs(kernel: PointwiseKernel, x: torch.Tensor, w: torch.Tensor, params,
                           outputs: Sequence[OutputSpec],
                           outs: Sequence[PackedTensor | torch.Tensor],
                           residual: PackedTensor | None = None, y_bound: int | None = None,
                           fast: bool = True, requant32: bool = True,
                           tile: Mapping | None = None) -> Launcher:
    """`conv_outputs.bind_conv_outputs` for a `triton.conv2d_pointwise` kernel (the same
    arguments: x, w, params as for `kernel.bind`; the layer epilogue's outputs, outs and
    residual; y_bound, fast, requant32 choosing each formula's exact mode): a launcher
    replaying the one persistent launch, its grid sized for `kernel.sms` (None: the
    device's SMs); tile: `outputs_config`. ValueError (`pointwise_outputs_reason`, the
    tile, or the outputs' and residual's checks) before any launch."""
    reason = pointwise_outputs_reason(
        kernel, len(outputs) if isinstance(outputs, (list, tuple)) else 0)
    if reason:
        raise ValueError(f"the kernel cannot run this layer epilogue: {reason}")
    prob = kernel.problem
    cfg = outputs_config(kernel.config, prob.C, tile)
    zp, res_args, slot_args, consts, storage = fused_arguments(
        kernel.workload, prob.a_zero, x, w, params, outputs, outs, residual, y_bound, fast,
        requant32)
    grid, cols, step = programs(prob.M, prob.NOUT, cfg, kernel.sms or device_sms(x.device))
    args = (x, w, zp, res_args[0], prob.M, prob.NOUT, res_args[1], res_args[2], cols, step,
            *slot_args)
    data, row = res_args[0], res_args[1]
    words = consts["RES_LAYOUT"] == 0 and data.element_size() == 1 and row % 4 == 0 and \
        prob.NOUT % 4 == 0 and data.data_ptr() % 4 == 0
    kwargs = dict(mainloop_constants(prob, cfg), **consts, PREFETCH_RES=PREFETCH_RESIDUAL,
                  RES_WORDS=(1 + (data.dtype == torch.int8)) * bool(words and residual is not None))
    kwargs["enable_fp_fusion"] = False  # float outputs: the pass's rounding, no FMA
    return Launcher((Launch(pointwise_outputs_kernel, (grid,), args, kwargs),), storage)


__all__ = ["OUTPUTS_TILE", "bind_pointwise_outputs", "outputs_config",
           "pointwise_outputs_kernel", "pointwise_outputs_reason"]
