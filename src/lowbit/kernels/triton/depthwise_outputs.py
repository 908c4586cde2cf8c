"""`triton.conv2d_depthwise` with a network layer's whole epilogue in its own.

EfficientNet's depthwise convs end in SiLU, which the kernel's fused epilogue
(`epilogue.epilogue_store`: bias, ReLU, one requantized output) cannot express: the layer
stores a derived output (a table over the requantized mid value) and a requantized one. As
the bare int32 accumulator plus the separate pass `netops.bind_layer_epilogue` the layer
writes and reads back 4 bytes a value, where its input and outputs are one byte each: the
round trip is most of the layer's bytes. `bind_depthwise_outputs` runs the depthwise main
loop (`depthwise.depthwise_accumulator`: either MAC form, dp4a tap groups or one product a
tap) and hands each finished int32 tile to the shared per-output code
(`kernel_outputs.emit_tile_outputs`: a residual's tile, up to FUSED_OUTPUTS_MAX
`layer_outputs.emit_slot` slots), so the outputs equal `bind_layer_epilogue(acc, outputs,
outs, residual)` bit for bit with no int32 tensor.

The launch keeps the kernel's config (tile, warps, tap loop, MAC) unless `tile` overrides
BLOCK_PIX, BLOCK_C and num_warps; bit-plane outputs pack 32 channels a word, so a tile of
16 channels becomes 32 wide and half as tall (`outputs_config`). The epilogue runs after the
taps, whose input tiles are dead by then, but a table output gathers one int32 a value
through its own 64-bit address: offline for sm_90 with the device's Triton 3.6 (ptxas),
EfficientNet-B0's depthwise layers at batch 64 on their default dp4a configs (32 values a
thread on 4 warps) with the SiLU table into s16 beside the stored s8 mid reach 250-255
registers (no spill: one or two programs a SM), with one plain requantized s8 output
112-152. With a table the default tile is halved to TABLE_VALUES_MAX values a thread:
164-168 registers without spill, three programs of 128 threads a SM (Triton 3.9: 72-86).
(tests/test_depthwise_outputs_compile.py)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl

from ...core import PackedTensor
from .depthwise import (
    ACC_PER_THREAD_MAX,
    DepthwiseKernel,
    conv_arguments,
    depthwise_accumulator,
    program_count,
)
from .igemm import Launch
from .kernel_outputs import accumulator_reason, emit_tile_outputs, fused_arguments
from .layer_outputs import OutputSpec
from .stored import Launcher

#: the knobs `tile` may set (`outputs_config`)
TILE_KNOBS = ("BLOCK_PIX", "BLOCK_C", "num_warps")
#: values a thread of a default tile writing a table's output (module doc)
TABLE_VALUES_MAX = 16
#: channels of a bit-plane word: the narrowest tile a bit-plane output is written from
PLANE_WORD = 32


@triton.jit
def depthwise_outputs_kernel(
    x_ptr, w_ptr, res_ptr, M, C, H, W, P, Q, conv_stride, pad, x_row, w_row, res_row,
    res_plane,
    o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
    o2, a2, b2, c2, d2, t2, row2, plane2,
    R: tl.constexpr, S: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr,
    ALIGN_X: tl.constexpr, PIPELINED: tl.constexpr,
    TAP_STAGES: tl.constexpr, MAC_FP32: tl.constexpr, GROUP_C: tl.constexpr,
    GROUP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, W_SIGNED: tl.constexpr,
    DP4A: tl.constexpr, TAP_GROUPS: tl.constexpr, TRANSPOSE: tl.constexpr,
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
    BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """`depthwise_kernel`'s tile, its layer-epilogue outputs written by `emit_tile_outputs`
    (module doc)."""
    offs_m, c0, acc = depthwise_accumulator(
        x_ptr, w_ptr, M, C, H, W, P, Q, conv_stride, pad, x_row, w_row, R, S, A_SRC, A_BITS,
        A_ENC, ALIGN_X, PIPELINED, TAP_STAGES, MAC_FP32, GROUP_C, GROUP_K, GROUP_WORDS,
        W_SIGNED, DP4A, TAP_GROUPS, TRANSPOSE, BLOCK_PIX, BLOCK_C)
    emit_tile_outputs(
        acc, offs_m, c0, M, C, res_ptr, res_row, res_plane,
        o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
        o2, a2, b2, c2, d2, t2, row2, plane2, HAS_RES, RES_LAYOUT, RES_BITS, RES_ENC,
        KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0, TMIN0,
        KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1, TMIN1,
        KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2, TMIN2,
        BLOCK_PIX, BLOCK_C)


def depthwise_outputs_reason(kernel: object, n_outputs: int) -> str | None:
    """Why `kernel` cannot write `n_outputs` layer-epilogue outputs itself (a
    `triton.conv2d_depthwise` / `conv2d_grouped_cuda` kernel whose workload stores the bare
    int32 accumulator, 1..FUSED_OUTPUTS_MAX outputs), None when it can."""
    if not isinstance(kernel, DepthwiseKernel):
        return "only triton.conv2d_depthwise and triton.conv2d_grouped_cuda kernels"
    return accumulator_reason(kernel.workload, n_outputs)


def outputs_config(config: Mapping, bitplane: bool = False, table: bool = False,
                   tile: Mapping | None = None) -> dict:
    """The launch's knobs: `config` with `tile` (BLOCK_PIX, BLOCK_C, num_warps); without
    one, `config`'s own tile, BLOCK_PIX halved down to TABLE_VALUES_MAX values a thread
    where an output is a `table`'s (its gather's addresses take the registers: module doc).
    A tile of fewer than PLANE_WORD channels is made PLANE_WORD wide and as much shorter
    where an output or the residual is `bitplane`. BLOCK_PIX and BLOCK_C powers of two
    >= 16, num_warps 1, 2, 4 or 8, 1..ACC_PER_THREAD_MAX values a thread (ValueError
    otherwise)."""
    cfg = dict(config)
    if tile is not None:
        if set(tile) != set(TILE_KNOBS):
            raise ValueError(f"tile must set exactly {sorted(TILE_KNOBS)}, got {sorted(tile)}")
        cfg.update(tile)
    pix, chans, warps = (cfg[k] for k in TILE_KNOBS)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (pix, chans, warps)) \
            or pix < 16 or pix & (pix - 1) or chans < 16 or chans & (chans - 1) \
            or warps not in (1, 2, 4, 8) \
            or not 1 <= pix * chans // (32 * warps) <= ACC_PER_THREAD_MAX:
        raise ValueError(f"tile {dict((k, cfg[k]) for k in TILE_KNOBS)}: BLOCK_PIX and "
                         "BLOCK_C powers of two >= 16, num_warps 1, 2, 4 or 8, "
                         f"1..{ACC_PER_THREAD_MAX} values a thread")
    if tile is None and table:
        while pix > 16 and pix * chans // (32 * warps) > TABLE_VALUES_MAX:
            pix //= 2
    if bitplane and chans < PLANE_WORD:
        pix, chans = max(16, pix * chans // PLANE_WORD), PLANE_WORD
    return {**cfg, "BLOCK_PIX": pix, "BLOCK_C": chans}


def bind_depthwise_outputs(kernel: DepthwiseKernel, x: torch.Tensor, w: torch.Tensor, params,
                           outputs: Sequence[OutputSpec],
                           outs: Sequence[PackedTensor | torch.Tensor],
                           residual: PackedTensor | None = None, y_bound: int | None = None,
                           fast: bool = True, requant32: bool = True,
                           tile: Mapping | None = None) -> Launcher:
    """`conv_outputs.bind_conv_outputs` for a depthwise (or CUDA-core grouped) kernel: the
    same arguments (x, w, params as for `kernel.bind`; the layer epilogue's outputs, outs and
    residual; y_bound, fast, requant32 choosing each formula's exact mode); a launcher
    replaying the one launch (it keeps the tap-major weights made here: bind again after
    changing them); tile: `outputs_config`. ValueError (`depthwise_outputs_reason`, the
    tile, or the outputs' and residual's checks) before any launch."""
    reason = depthwise_outputs_reason(
        kernel, len(outputs) if isinstance(outputs, (list, tuple)) else 0)
    if reason:
        raise ValueError(f"the kernel cannot run this layer epilogue: {reason}")
    prob = kernel.problem
    zp, res_args, slot_args, consts, storage = fused_arguments(
        kernel.workload, prob.a_zero, x, w, params, outputs, outs, residual, y_bound, fast,
        requant32)
    del zp  # CUDA cores multiply u8 as it is: no zero point
    bitplane = any(consts[f"KIND{j}"] == 1 and consts[f"LAYOUT{j}"] == 2
                   for j in range(len(outputs)))
    table = any(consts[f"TABLE{j}"] for j in range(len(outputs)))
    cfg = outputs_config(kernel.config, bitplane, table, tile)
    args = (x, kernel.weight_taps(x, w), res_args[0], *conv_arguments(prob), res_args[1],
            res_args[2], *slot_args)
    kwargs = dict(kernel.mainloop(cfg), **consts)
    kwargs["enable_fp_fusion"] = False  # float outputs: the pass's rounding, no FMA
    launch = Launch(depthwise_outputs_kernel, (program_count(prob, cfg),), args, kwargs)
    return Launcher((launch,), storage)


__all__ = ["TABLE_VALUES_MAX", "TILE_KNOBS", "bind_depthwise_outputs", "depthwise_outputs_kernel",
           "depthwise_outputs_reason", "outputs_config"]
