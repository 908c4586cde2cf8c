"""The implicit-GEMM conv / GEMM with a network layer's whole epilogue in its own.

A layer whose outputs the kernels' `Epilogue` cannot express (a residual block's end writes
the next layer's input and a wide copy of the residual stream, and adds the shortcut) runs
as the kernel's bare int32 accumulator plus the separate pass `netops.bind_layer_epilogue`,
which reads it back: at batch 256 that round trip is 1.6 GB on ResNet-50's first block end.
`bind_conv_outputs` runs the same `triton.conv2d_int8` / `triton.gemm_int8` main loop
(`igemm.tile_accumulator`) and hands each finished int32 tile, with the residual's tile, to
the pass's own per-output code (`layer_outputs.emit_slot`): the outputs equal
`bind_layer_epilogue(acc, outputs, outs, residual)` bit for bit, with no int32 tensor. A block
end with a narrow (8-bit) residual writes its stored mid value and the outputs derived from it
(tables over the mid value) from one requantization per tile, in 32-bit arithmetic where the
vectors and the accumulator bound allow (`layer_outputs.requant_mode`).

Applies to an `IgemmKernel` of the int8 templates whose workload stores the bare int32
accumulator, with at most FUSED_OUTPUTS_MAX outputs; `fused_reason` says why not otherwise.
A `triton.conv2d_pointwise` kernel runs its own persistent launch
(`pointwise_outputs.bind_pointwise_outputs`): `bind_conv_outputs` is the one entry point.
The fused launch keeps the kernel's reduction knobs (BLOCK_K, stages, loop order) and runs its
own output tile, FUSED_TILE, without split-K: the epilogue's float64 requantization, two
outputs and the residual's tile live beside the accumulator, and a 128 x 128 tile on 4 warps
spilled 672 bytes a thread and ran 3.4x slower than kernel + pass (`conv_outputs_probe`, H200,
ResNet-50's layer1 block end at batch 256: 4028 against 1175 us). 64 x 32 on 2 warps spills
nothing and was the fastest of eight tiles measured on two of three block ends: 1067 against
1175 us (layer1, batch 256), 316 against 339 (layer3), 23 against 98 us (ResNet-18's 3x3 block
end at batch 8, kernel 28 + pass 70).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import triton
import triton.language as tl

from ...core import PackedTensor
from .depthwise import DepthwiseKernel
from .depthwise_outputs import bind_depthwise_outputs
from .epilogue import CONVERSION_FREE_FUSED_OUTPUTS
from .igemm import (
    Launch,
    grouped_tile,
    mainloop_constants,
    output_tiles,
    splits_iters,
    tile_accumulator,
)
from .kernel_outputs import (
    FUSED_OUTPUTS_MAX,
    accumulator_reason,
    emit_tile_outputs,
    fused_arguments,
)
from .layer_outputs import OutputSpec
from .pointwise import PointwiseKernel
from .pointwise_outputs import bind_pointwise_outputs, pointwise_outputs_reason
from .stored import Launcher
from .templates import IgemmKernel

#: the fused launch's output tile (module doc)
FUSED_TILE = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 2}


@triton.jit
def igemm_outputs_kernel(
    x_ptr, w_ptr, zp_ptr, res_ptr,
    M, NOUT, H, W, C, P, Q, conv_stride, pad, x_row, w_row, iters_per_split, res_row, res_plane,
    o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
    o2, a2, b2, c2, d2, t2, row2, plane2,
    R: tl.constexpr, S: tl.constexpr, IS_GEMM: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, A_ZERO: tl.constexpr,
    W_SRC: tl.constexpr, W_BITS: tl.constexpr, W_ENC: tl.constexpr,
    DOT_FP16: tl.constexpr,
    LOOP_CRS: tl.constexpr, EVEN_C: tl.constexpr, ALIGN_C: tl.constexpr, ROW_TAPS: tl.constexpr,
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """`igemm_kernel`'s tile (one reduction split), then up to three layer-epilogue output
    slots of it (`layer_outputs.emit_slot`; module doc)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(NOUT, BLOCK_N),
                                GROUP_M)
    offs_m, _, acc = tile_accumulator(
        x_ptr, w_ptr, zp_ptr, pid_m, pid_n, 0, M, NOUT, H, W, C, P, Q, conv_stride, pad,
        x_row, w_row, iters_per_split, R, S, IS_GEMM, A_SRC, A_BITS, A_ENC, A_ZERO, W_SRC,
        W_BITS, W_ENC, DOT_FP16, False, LOOP_CRS, EVEN_C, ALIGN_C, ROW_TAPS, BLOCK_M,
        BLOCK_N, BLOCK_K)
    emit_tile_outputs(
        acc, offs_m, pid_n * BLOCK_N, M, NOUT, res_ptr, res_row, res_plane,
        o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
        o2, a2, b2, c2, d2, t2, row2, plane2, HAS_RES, RES_LAYOUT, RES_BITS, RES_ENC,
        KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0, TMIN0,
        KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1, TMIN1,
        KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2, TMIN2,
        BLOCK_M, BLOCK_N)


def fused_reason(kernel: object, n_outputs: int) -> str | None:
    """Why `kernel` cannot write `n_outputs` layer-epilogue outputs itself (module doc; a
    `triton.conv2d_pointwise` kernel: `pointwise_outputs.pointwise_outputs_reason`), None
    when it can."""
    if isinstance(kernel, PointwiseKernel):
        return pointwise_outputs_reason(kernel, n_outputs)
    if not isinstance(kernel, IgemmKernel) or type(kernel) is not IgemmKernel:
        return ("only the implicit-GEMM int8 kernels (triton.conv2d_int8, triton.gemm_int8) "
                "and triton.conv2d_pointwise")
    if kernel.problem.dot_fp16:
        return "the fp16-dot template's accumulator is float"
    return accumulator_reason(kernel.workload, n_outputs)


def fused_config(config, tile: Mapping | None = None) -> dict:
    """The fused launch's knobs: `config`'s reduction knobs with `tile` (BLOCK_M, BLOCK_N,
    num_warps; default FUSED_TILE), no split-K."""
    tile = FUSED_TILE if tile is None else dict(tile)
    if set(tile) != set(FUSED_TILE):
        raise ValueError(f"tile must set exactly {sorted(FUSED_TILE)}, got {sorted(tile)}")
    return {**dict(config), **tile, "SPLIT_K": 1, "SPLIT_SUM": "second_kernel"}


def bind_conv_outputs(kernel: IgemmKernel, x: torch.Tensor, w: torch.Tensor, params,
                      outputs: Sequence[OutputSpec], outs: Sequence[PackedTensor | torch.Tensor],
                      residual: PackedTensor | None = None, y_bound: int | None = None,
                      fast: bool = True, requant32: bool = True,
                      tile: Mapping | None = None,
                      conversion_free: bool | None = None) -> Launcher:
    """Bind `kernel` (x, w, params as for `kernel.bind`) with the layer epilogue
    (`netops.bind_layer_epilogue`'s outputs, outs and residual, of the accumulator's logical
    shape, derived outputs and narrow residuals included) in its own epilogue; a launcher
    replaying the one launch. y_bound: max |acc| (default the workload's `acc_bound`), which
    with the vectors chooses each formula's exact mode (`layer_outputs.requant_mode`; fast,
    requant32: allow FAST, INT32; conversion_free: FAST_NARROW, else FAST_NARROW_CVT; None:
    conversion-free except on a block end where this Triton compiles it fatter,
    `epilogue.CONVERSION_FREE_FUSED_OUTPUTS`);
    tile: the output tile (`fused_config`). A `triton.conv2d_pointwise` kernel runs its
    persistent launch instead (`pointwise_outputs.bind_pointwise_outputs`, tile: its knobs;
    FAST_NARROW where it applies). ValueError
    (`fused_reason`, or the outputs' and residual's checks) before any launch."""
    if isinstance(kernel, PointwiseKernel):
        return bind_pointwise_outputs(kernel, x, w, params, outputs, outs, residual, y_bound,
                                      fast, requant32, tile)
    if isinstance(kernel, DepthwiseKernel):
        return bind_depthwise_outputs(kernel, x, w, params, outputs, outs, residual, y_bound,
                                      fast, requant32, tile)
    reason = fused_reason(kernel, len(outputs) if isinstance(outputs, (list, tuple)) else 0)
    if reason:
        raise ValueError(f"the kernel cannot run this layer epilogue: {reason}")
    if conversion_free is None:
        conversion_free = CONVERSION_FREE_FUSED_OUTPUTS or residual is None
    prob = kernel.problem
    cfg = fused_config(kernel.config, tile)
    zp, res_args, slot_args, consts, storage = fused_arguments(
        kernel.workload, prob.a_zero, x, w, params, outputs, outs, residual, y_bound, fast,
        requant32, conversion_free)
    args = (x, w, zp, res_args[0], prob.M, prob.NOUT, prob.H, prob.W, prob.C, prob.P, prob.Q,
            prob.stride, prob.pad, prob.x_row, prob.w_row, splits_iters(prob, cfg),
            res_args[1], res_args[2], *slot_args)
    kwargs: dict = dict(mainloop_constants(prob, cfg), **consts)
    del kwargs["SPLIT_K"]  # one reduction split (fused_config)
    kwargs["enable_fp_fusion"] = False  # float outputs: the pass's rounding, no FMA
    launch = Launch(igemm_outputs_kernel, (output_tiles(prob, cfg), 1), args, kwargs)
    return Launcher((launch,), storage)


__all__ = ["FUSED_OUTPUTS_MAX", "FUSED_TILE", "bind_conv_outputs", "fused_config",
           "fused_reason", "igemm_outputs_kernel"]
