"""What each plan layer's kernel writes itself (its `Workload.epilogue`), chosen after the plan's
realizations are known: the fused requantizing epilogue for a layer with one requantized
output (its bias in accumulator units, or `Epilogue.shifted_bias` at the output's shift; a
wide residual where the 64-bit sum provably fits and the layer is small enough for the fused
path to pay), else the bare accumulator (int16 where it fits a bit-serial kernel, int32
otherwise) for the separate epilogue pass (`lowbit.kernels.triton.netops`), which an int8
layer's kernel runs itself where its template can (`layer_outputs_impl`)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..core import OUT_INT16, OUT_INT32, Epilogue, Precision, Workload
from ..kernels.base import acc_bound
from .impl import TORCH_FP16, is_bitserial, template_flag, unsupported_reason
from .ir import Layer, TensorSpec

#: Outputs up to which a layer takes its residual in the kernel's epilogue rather than in the
#: int32 pass. Measured on an H200 (benchmarks/probes/epilogue_probe.py, ResNet-50's 1x1 block
#: end at batch 256, 205 M outputs): the residual's 64-bit multiply-adds cost ~4.0 ps per
#: output over the int32-output kernel (1111 vs 282 us), the separate pass ~2.3 ps (bytes)
#: plus a launch (~4 us); fusing pays below ~2.4 M outputs (ResNet-18 at batch 8), not above.
RESIDUAL_FUSE_MAX_OUTPUTS = 2_000_000


def kernel_epilogue(step: Layer, tensors: dict[str, TensorSpec],
                    params: dict[str, torch.Tensor] | None = None) -> Layer:
    """The layer's workload with the kernel's own epilogue (`lowbit.core.Epilogue`) where the
    layer has one output, requantized to a Precision, and the implementation takes it: bias in
    accumulator units where the output's bias is exactly `step.bias` times its multiplier
    (kernel-bias plans), else the output's own bias at its shift (`Epilogue.shifted_bias`,
    exact-bias plans) on templates that declare `takes_shifted_bias`; with a wide residual
    (`Epilogue.residual`, given `params`, never with a pool) on templates that declare
    `takes_residual` where `residual_fits` proves the kernel's 64-bit sum exact and the output
    has at most RESIDUAL_FUSE_MAX_OUTPUTS values; otherwise the bare accumulator
    (`accumulator_workload`) for a separate epilogue pass (which adds each output's shifted
    bias and the residual). A max-pooled layer's kernel writes the full-size output and a
    max-pool of that tensor follows: the reference's order (pool of the requantized values),
    and on VGG-16's pooled w1a2 layers at batch 8 a 2-bit output instead of an int32
    accumulator, pool and pass (113 us for features_2 on an H100)."""
    outs = step.layer_outputs
    wl = accumulator_workload(step)
    if not (len(outs) == 1 and outs[0].requantized and not outs[0].derived
            and step.impl != TORCH_FP16 and (step.pool is None or step.residual is None)):
        return layer_outputs_impl(replace(step, workload=wl))
    t = tensors[outs[0].tensor]
    if not isinstance(t.precision, Precision):  # a 16-bit wide output: epilogue pass
        return layer_outputs_impl(replace(step, workload=wl))
    if step.residual is not None:
        fuse = params is not None and math.prod(t.shape) <= RESIDUAL_FUSE_MAX_OUTPUTS \
            and residual_fits(step, tensors, params)
        kinds = [dict(shifted_bias=True, residual=tensors[step.residual].precision)] \
            if fuse else []
    else:
        kinds = ([dict(bias=True)] if step.bias is not None else []) + \
            ([dict(shifted_bias=True)] if takes_shifted_bias(step.impl) else [])
    for kind in kinds:
        fused = wl.replace(epilogue=Epilogue(relu=outs[0].relu, out=t.precision,
                                             out_layout=t.layout, **kind))
        if unsupported_reason(step.impl, fused) is None:
            return replace(step, workload=fused)
    return layer_outputs_impl(replace(step, workload=wl))


#: the int8 templates whose kernels write a layer epilogue's outputs themselves, by op
LAYER_OUTPUTS_IMPLS = {"conv2d": "triton.conv2d_int8", "linear": "triton.gemm_int8"}


def layer_outputs_impl(step: Layer) -> Layer:
    """An int8 layer left with a separate epilogue pass (its workload stores the bare
    accumulator, no fused pool) moves to the int8 template of its op whose kernel writes the
    layer epilogue's outputs itself (`layer_outputs_max`, `kernels.triton.conv_outputs`),
    where that template runs the workload: no int32 round trip. A layer already on such a
    template keeps it. Measured on an H200
    (`conv_outputs_probe`): ResNet-50's layer1 block end at batch 256, 1067 against 1175 us
    (kernel + pass), ResNet-18's 3x3 block end at batch 8, 23 against 98 us. Bit-serial,
    fp16, weight-streaming and pooled layers stay as they are."""
    target = LAYER_OUTPUTS_IMPLS.get(step.op)
    if (target is None or step.impl == TORCH_FP16 or is_bitserial(step.impl)
            or step.pool is not None or template_flag(step.impl, "streams_weights")
            or template_flag(step.impl, "layer_outputs_max")
            or len(step.layer_outputs) > template_flag(target, "layer_outputs_max")
            or unsupported_reason(target, step.workload) is not None):
        return step
    return replace(step, impl=target, impl_reason=f"{step.impl_reason}; its layer epilogue "
                   f"written by {target}'s kernel (no int32 round trip)")


def accumulator_workload(step: Layer) -> Workload:
    """The step's workload storing its bare accumulator for a separate epilogue pass: int16
    where a bit-serial kernel writes it and the worst-case |acc| is below 2^15 (a w1a2 / w2a2
    layer up to K = C R S of ~5,000: half the bytes of the int32 round trip, which bounds
    ResNet-50's block ends at batch 256), without a fused pool (the pool reads int32); int32
    otherwise (the template's `unsupported_reason` names the bound it checks)."""
    wl = step.workload
    if step.pool is None and is_bitserial(step.impl):
        narrow = wl.replace(epilogue=Epilogue(out=OUT_INT16))
        if unsupported_reason(step.impl, narrow) is None:
            return narrow
    return wl.replace(epilogue=Epilogue(out=OUT_INT32))


def residual_fits(step: Layer, tensors: dict[str, TensorSpec],
                  params: dict[str, torch.Tensor]) -> bool:
    """Whether the step's one output can take its residual in a kernel's epilogue: the
    template declares `takes_residual`, the residual is a wide tensor of the output's shape,
    and |acc| m + |b| + |res| |r| + 2^(s-1) < 2^63 per channel for the workload's accumulator
    bound and the residual precision's range (exact Python integers, as engine._direct)."""
    res, (o,) = tensors[step.residual], step.layer_outputs
    if not (template_flag(step.impl, "takes_residual") and res.is_wide
            and o.residual_multiplier is not None and res.shape == tensors[o.tensor].shape):
        return False
    top_acc, top_res = acc_bound(step.workload), -res.precision.qmin
    m, b, r, s = (params[k].tolist() for k in (o.multiplier, o.bias, o.residual_multiplier,
                                               o.shift))
    return all(top_acc * mi + abs(bi) + top_res * abs(ri) + (1 << (si - 1)) < 2**63
               for mi, bi, ri, si in zip(m, b, r, s, strict=True))


def takes_shifted_bias(impl: str) -> bool:
    """Whether the registered template `impl` runs `Epilogue.shifted_bias` (its class says so
    with `takes_shifted_bias = True`; templates without the attribute never get one)."""
    return template_flag(impl, "takes_shifted_bias")
