"""What the conv kernels that write a layer epilogue's outputs themselves share: the device
code that writes a finished int32 accumulator tile's outputs (its residual tile, up to
FUSED_OUTPUTS_MAX `layer_outputs.emit_slot` slots) and the host side that checks and binds
those slots. Used by the implicit GEMM's fused launch (`conv_outputs`) and the persistent
pointwise one (`pointwise_outputs`); the outputs equal `netops.bind_layer_epilogue(acc,
outputs, outs, residual)` bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...core import OUT_INT32, PackedTensor, Workload
from ...core.validate import check_inputs, out_storage
from ..base import acc_bound
from .layer_outputs import OutputSpec, emit_slot, layer_slots, residual_slot, slot_kwargs
from .stored import load_values
from .templates import _check_device
from .zero_point import bound_terms

#: output slots of a fused launch (a block end's stored mid value and up to two outputs
#: derived from it, or other requantized / float outputs); the planner fuses up to
#: `templates.LAYER_OUTPUTS_MAX` of them
FUSED_OUTPUTS_MAX = 3


@triton.jit
def emit_tile_outputs(
    acc, offs_m, c0, M, NOUT, res_ptr, res_row, res_plane,
    o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
    o2, a2, b2, c2, d2, t2, row2, plane2,
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The layer-epilogue outputs of the int32 tile `acc` (rows offs_m, channels c0 ..):
    the residual's tile, then up to three `emit_slot` slots (`layer_slots`' arguments)."""
    res = acc
    if HAS_RES:
        res = load_values(res_ptr, offs_m, offs_m < M, c0, NOUT, res_row, res_plane,
                          RES_LAYOUT, RES_BITS, RES_ENC, BLOCK_M, BLOCK_N)
    emit_loaded_tile_outputs(
        acc, res, offs_m, c0, M, NOUT,
        o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
        o2, a2, b2, c2, d2, t2, row2, plane2,
        KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0, TMIN0,
        KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1, TMIN1,
        KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2, TMIN2,
        BLOCK_M, BLOCK_N)


@triton.jit
def emit_loaded_tile_outputs(
    acc, res, offs_m, c0, M, NOUT,
    o0, a0, b0, c0_, d0, t0, row0, plane0, o1, a1, b1, c1, d1, t1, row1, plane1,
    o2, a2, b2, c2, d2, t2, row2, plane2,
    KIND0: tl.constexpr, LAYOUT0: tl.constexpr, BITS0: tl.constexpr, QLO0: tl.constexpr,
    QMAX0: tl.constexpr, RES0: tl.constexpr, MODE0: tl.constexpr, SAME0: tl.constexpr,
    TABLE0: tl.constexpr, TMIN0: tl.constexpr,
    KIND1: tl.constexpr, LAYOUT1: tl.constexpr, BITS1: tl.constexpr, QLO1: tl.constexpr,
    QMAX1: tl.constexpr, RES1: tl.constexpr, MODE1: tl.constexpr, SAME1: tl.constexpr,
    TABLE1: tl.constexpr, TMIN1: tl.constexpr,
    KIND2: tl.constexpr, LAYOUT2: tl.constexpr, BITS2: tl.constexpr, QLO2: tl.constexpr,
    QMAX2: tl.constexpr, RES2: tl.constexpr, MODE2: tl.constexpr, SAME2: tl.constexpr,
    TABLE2: tl.constexpr, TMIN2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """`emit_tile_outputs` with the residual's tile already loaded: `res` its int32 values
    [BLOCK_M, BLOCK_N] (unused without a residual: any tile of that shape, acc)."""
    pix_mask = offs_m < M
    q = emit_slot(acc, res, acc, offs_m, pix_mask, c0, NOUT, o0, a0, b0, c0_, d0, t0, row0,
                  plane0, KIND0, LAYOUT0, BITS0, QLO0, QMAX0, RES0, MODE0, SAME0, TABLE0,
                  TMIN0, BLOCK_M, BLOCK_N)
    if KIND1 != 0:
        q = emit_slot(acc, res, q, offs_m, pix_mask, c0, NOUT, o1, a1, b1, c1, d1, t1, row1,
                      plane1, KIND1, LAYOUT1, BITS1, QLO1, QMAX1, RES1, MODE1, SAME1, TABLE1,
                      TMIN1, BLOCK_M, BLOCK_N)
    if KIND2 != 0:
        emit_slot(acc, res, q, offs_m, pix_mask, c0, NOUT, o2, a2, b2, c2, d2, t2, row2,
                  plane2, KIND2, LAYOUT2, BITS2, QLO2, QMAX2, RES2, MODE2, SAME2, TABLE2,
                  TMIN2, BLOCK_M, BLOCK_N)


def accumulator_reason(wl: Workload, n_outputs: int) -> str | None:
    """Why a kernel of `wl` cannot write `n_outputs` layer-epilogue outputs from its
    accumulator tiles (its workload must store the bare int32 accumulator; 1 to
    FUSED_OUTPUTS_MAX outputs); None when it can."""
    if wl.epilogue.out != OUT_INT32 or wl.epilogue.requantizes:
        return "the kernel's workload must store the bare int32 accumulator"
    if not 1 <= n_outputs <= FUSED_OUTPUTS_MAX:
        return f"{n_outputs} outputs (the fused epilogue writes 1..{FUSED_OUTPUTS_MAX})"
    return None


def fused_arguments(wl: Workload, a_zero: int, x: torch.Tensor, w: torch.Tensor, params,
                    outputs: Sequence[OutputSpec],
                    outs: Sequence[PackedTensor | torch.Tensor],
                    residual: PackedTensor | None, y_bound: int | None, fast: bool,
                    requant32: bool, conversion_free: bool = True
                    ) -> tuple[torch.Tensor, tuple, list, dict, tuple]:
    """The checked arguments of a launch of `wl`'s kernel writing the layer epilogue
    (`conv_outputs.bind_conv_outputs`' conventions; conversion_free: `layer_slots`'): (the
    zero-point terms where a_zero, else x; the residual's (data, row, plane); the slots'
    arguments in order; the residual's and the slots' constexprs; the outputs' storage
    tensors). ValueError / TypeError naming the argument before any launch."""
    if not isinstance(outs, (list, tuple)) or len(outs) != len(outputs):
        raise ValueError("outputs and outs must be sequences of the same length")
    check_inputs(wl, x, w, params)
    _check_device(x)
    shape = tuple(out_storage(wl)[0])
    y_bound = acc_bound(wl) if y_bound is None else int(y_bound)
    res_args, res_consts, res_bound = residual_slot(residual, shape, x)
    (slots,) = layer_slots(outputs, outs, shape, x.device, x, residual is not None, y_bound,
                           res_bound, fast, requant32, FUSED_OUTPUTS_MAX, conversion_free)
    zp = bound_terms(wl, w, x.device) if a_zero else x
    slot_args, slot_consts = slot_kwargs(slots)
    storage = tuple(o.data if isinstance(o, PackedTensor) else o for o in outs)
    return zp, res_args, slot_args, {**res_consts, **slot_consts}, storage


__all__ = ["FUSED_OUTPUTS_MAX", "accumulator_reason", "emit_loaded_tile_outputs",
           "emit_tile_outputs", "fused_arguments"]
