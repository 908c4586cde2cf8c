"""What the conv kernels that write a layer epilogue's outputs themselves share on the host:
checking and binding the slots whose device code is `layer_outputs.emit_tile_outputs` (which
the separate pass `netops.bind_layer_epilogue` runs as well: the residual's tile, then up to
FUSED_OUTPUTS_MAX `layer_outputs.emit_slot` slots). Used by the implicit GEMM's fused launch
(`conv_outputs`) and the persistent pointwise one (`pointwise_outputs`); the outputs equal
`netops.bind_layer_epilogue(acc, outputs, outs, residual)` bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...core import OUT_INT32, PackedTensor, Workload
from ...core.validate import check_inputs, out_storage
from ..base import acc_bound
from .layer_outputs import OutputSpec, layer_slots, residual_slot
from .templates import _check_device
from .zero_point import bound_terms

#: output slots of a fused launch (a block end's stored mid value and up to two outputs
#: derived from it, or other requantized / float outputs); the planner fuses up to
#: `templates.LAYER_OUTPUTS_MAX` of them
FUSED_OUTPUTS_MAX = 3


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
                    requant32: bool) -> tuple[torch.Tensor, tuple, tuple, dict, tuple]:
    """The checked arguments of a launch of `wl`'s kernel writing the layer epilogue
    (`conv_outputs.bind_conv_outputs`' conventions): (the zero-point terms where a_zero, else
    x; the residual's (data, row, plane); the slots' runtime tuple `slots`; the residual's
    constexprs and SLOTS (`layer_outputs.layer_slots`); the outputs' storage tensors).
    ValueError / TypeError naming the argument before any launch."""
    if not isinstance(outs, (list, tuple)) or len(outs) != len(outputs):
        raise ValueError("outputs and outs must be sequences of the same length")
    check_inputs(wl, x, w, params)
    _check_device(x)
    shape = tuple(out_storage(wl)[0])
    y_bound = acc_bound(wl) if y_bound is None else int(y_bound)
    res_args, res_consts, res_bound = residual_slot(residual, shape, x)
    ((slots, slot_consts),) = layer_slots(outputs, outs, shape, x.device, x,
                                          residual is not None, y_bound, res_bound, fast,
                                          requant32, FUSED_OUTPUTS_MAX)
    zp = bound_terms(wl, w, x.device) if a_zero else x
    storage = tuple(o.data if isinstance(o, PackedTensor) else o for o in outs)
    return zp, res_args, slots, {**res_consts, "SLOTS": slot_consts}, storage


__all__ = ["FUSED_OUTPUTS_MAX", "accumulator_reason", "fused_arguments"]
