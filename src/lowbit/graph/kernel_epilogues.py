"""What each plan layer's kernel writes itself (its `Workload.epilogue`), chosen after the plan's
realizations are known: the block-end epilogue (`block_end_epilogue`: one formula in 32-bit
arithmetic, or 64-bit (`Epilogue.sum64`) for multipliers that 32 bits cannot hold, a narrow
residual, the formula's value stored and up to two derived outputs) where a template takes it;
the fused requantizing epilogue for a layer with one requantized output (its bias in
accumulator units, or `Epilogue.shifted_bias` at the output's shift; a wide residual where the
64-bit sum provably fits and the layer is small enough for the fused path to pay), else the
bare accumulator (int16 where it fits a bit-serial kernel, int32 otherwise) for the separate
epilogue pass (`lowbit.kernels.triton.netops`), which an int8 layer's kernel runs itself where
its template can (`layer_outputs_impl`)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..core import OUT_INT16, OUT_INT32, Encoding, Epilogue, Layout, Precision, Workload
from ..core.epilogue import MAX_DERIVED
from ..core.validate import block_end_sum_limit
from ..kernels.base import acc_bound
from ..kernels.cuda.bitserial_tables import guarded_forms
from .impl import TORCH_FP16, is_bitserial, runs, template_flag, unsupported_reason
from .ir import Layer, TensorSpec, parse_precision

#: Outputs up to which a layer takes its residual in the kernel's epilogue rather than in the
#: int32 pass. Measured on an H200 (benchmarks/probes/epilogue_probe.py, ResNet-50's 1x1 block
#: end at batch 256, 205 M outputs): the residual's 64-bit multiply-adds cost ~4.0 ps per
#: output over the int32-output kernel (1111 vs 282 us), the separate pass ~2.3 ps (bytes)
#: plus a launch (~4 us); fusing pays below ~2.4 M outputs (ResNet-18 at batch 8), not above.
RESIDUAL_FUSE_MAX_OUTPUTS = 2_000_000

#: the widest mean band of a guarded block end (`_guarded_fits`): about this share of its
#: outputs, those near a rounding step, take the 64-bit redo (a wgmma warp branches once per
#: 128 outputs, so ~1/8 of its tiles at 2^-10); wider bands keep the plain 64-bit sum.
#: ResNet-50 b256 w1a2 res8: layer1-2's block ends average 1e-4 .. 6.5e-4 (guarded), layer3-4's
#: 1.5e-3 .. 3.8e-3 (not); unmeasured on a GPU (`PlanOptions.guarded_block_ends` A/B)
GUARD_MAX_BAND = 2.0**-10


def kernel_epilogue(step: Layer, tensors: dict[str, TensorSpec],
                    params: dict[str, torch.Tensor] | None = None, guarded: bool = True
                    ) -> Layer:
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
    if params is not None:
        block_end = block_end_epilogue(step, tensors, params, guarded)
        if block_end is not None:
            return replace(step, workload=block_end)
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
        if runs(step.impl, fused):
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


def block_end_epilogue(step: Layer, tensors: dict[str, TensorSpec],
                       params: dict[str, torch.Tensor], guarded: bool = True
                       ) -> Workload | None:
    """The step's workload with the block-end epilogue (`Epilogue.requant32`) where its
    template takes it (`takes_block_end`: the bit-serial families, `cuda.int8_wgmma`) and the
    layer is one: every output requantized by one formula (the same multiplier, shift, bias,
    residual multiplier and ReLU; every term inside 32 bits for the accumulator and residual
    bounds, else `Epilogue.sum64`: the 64-bit sum, within `validate.block_end_sum_limit`, run
    as `Epilogue.guarded` where every column has that exact 32-bit form),
    at most one output its value itself (stored in any layout) and at most
    MAX_DERIVED derived ones (bit planes or one value per byte) whose tables are monotone
    (thresholds: `derived_thresholds`), a narrow residual or none, no pool; a bit-serial
    layer with one output of one value per byte too (the block-end epilogue's byte stores:
    ResNet-50's downsampling convs writing the 8-bit shortcut took 487 us at batch 256 on an
    H100 in the plain epilogue against a 73 us floor). None otherwise."""
    outs = step.layer_outputs
    if (step.pool is not None or not template_flag(step.impl, "takes_block_end")
            or not outs or not all(o.requantized for o in outs)):
        return None
    first = outs[0]
    if any((o.multiplier, o.shift, o.bias, o.residual_multiplier, o.relu) !=
           (first.multiplier, first.shift, first.bias, first.residual_multiplier, first.relu)
           and not _same_formula(o, first, params) for o in outs):
        return None
    stored = [o for o in outs if not o.derived]
    derived = [o for o in outs if o.derived]
    if len(stored) > 1 or len(derived) > MAX_DERIVED:
        return None
    if not derived and step.residual is None and (
            tensors[stored[0].tensor].layout is not Layout.INT8 or not is_bitserial(step.impl)):
        return None  # one bit-plane output: the threshold epilogue serves it
    mids = {tensors[o.tensor].precision for o in stored} | {parse_precision(o.mid)
                                                            for o in derived}
    res = tensors[step.residual].precision if step.residual else None
    if len(mids) != 1 or not isinstance(res, (Precision, type(None))):
        return None
    (mid,) = mids
    if not isinstance(mid, Precision) or mid.encoding is Encoding.BINARY:
        return None
    lo = max(mid.qmin, 0) if first.relu else mid.qmin
    for o in derived:
        t = tensors[o.tensor]
        if not isinstance(t.precision, Precision) or t.layout not in (
                Layout.BITPLANE, Layout.INT8) or \
                derived_thresholds(params[o.table], mid, lo, t.precision) is None:
            return None
    layout = tensors[stored[0].tensor].layout if stored else Layout.INT8
    epi = Epilogue(relu=first.relu, out=mid, out_layout=layout, shifted_bias=True,
                   residual=res, requant32=True,
                   derived=tuple((tensors[o.tensor].precision, tensors[o.tensor].layout)
                                 for o in derived),
                   store_out=bool(stored))
    if not _block_end_fits(step, first, params, epi):
        epi = replace(epi, sum64=True)
        if not _block_end_fits(step, first, params, epi):
            return None
        epi = replace(epi, guarded=guarded and _guarded_fits(
            step.workload.replace(epilogue=epi), first, params))
    wl = step.workload.replace(epilogue=epi)
    return wl if runs(step.impl, wl) else None


def _same_formula(a, b, params: dict[str, torch.Tensor]) -> bool:
    """Whether two outputs' formulas are equal (their param vectors, their ReLU)."""
    if a.relu != b.relu or (a.residual_multiplier is None) != (b.residual_multiplier is None):
        return False
    keys = ("multiplier", "shift", "bias") + (("residual_multiplier",)
                                              if a.residual_multiplier else ())
    return all(torch.equal(params[getattr(a, k)], params[getattr(b, k)]) for k in keys)


def _block_end_fits(step: Layer, o, params: dict[str, torch.Tensor], epi: Epilogue) -> bool:
    """The output's formula inside the block-end epilogue `epi`'s arithmetic for the
    accumulator and residual bounds: 32-bit (every term inside int32, shifts 1..31), or with
    Epilogue.sum64 an int32 multiplier, |b|, |r| < 2^62, shifts 1..62 and the sum within
    `validate.block_end_sum_limit` (exact Python integers)."""
    m, b, r, s = _formula(o, params)
    res = epi.narrow_residual
    top_res = 0 if res is None else max(-res.qmin, res.qmax)
    top_acc, top_shift = acc_bound(step.workload), 62 if epi.sum64 else 31
    return all(0 <= mi < 2**31 and 1 <= si <= top_shift and max(abs(bi), abs(ri)) < 2**62
               and top_acc * mi + abs(bi) + top_res * abs(ri) + (1 << (si - 1))
               < block_end_sum_limit(epi, si)
               for mi, si, bi, ri in zip(m, s, b, r, strict=True))


def _formula(o, params: dict[str, torch.Tensor]
             ) -> tuple[list[int], list[int], list[int], list[int]]:
    """Output o's per-channel (multiplier, bias, residual multiplier (0 without one), shift)
    as Python integers."""
    m, s, b = (params[k].tolist() for k in (o.multiplier, o.shift, o.bias))
    r = params[o.residual_multiplier].tolist() if o.residual_multiplier else [0] * len(m)
    return m, b, r, s


def _guarded_fits(wl: Workload, o, params: dict[str, torch.Tensor]) -> bool:
    """Whether every column of the sum64 block end `wl` has a guarded 32-bit form
    (`Epilogue.guarded`, `bitserial_tables.guarded_forms`: the same exact outputs, the
    64-bit sum only for those near a rounding step) whose bands 2H / 2^s' (the share of a
    column's outputs the 64-bit redo takes, for remainders spread evenly) average at most
    GUARD_MAX_BAND."""
    forms = guarded_forms(wl, *_formula(o, params))
    if forms is None:
        return False
    return sum(2 * half / (1 << s2) for *_, s2, half in forms) / len(forms) <= GUARD_MAX_BAND


def derived_thresholds(table: torch.Tensor, mid: Precision, lo: int,
                       out: Precision) -> torch.Tensor | None:
    """The thresholds T (int32 [out.qmax - out.qmin]) with table[q - mid.qmin] ==
    out.qmin + #{i : q >= T[i]} for every value q in [lo, mid.qmax] the formula can give (the
    derived output as compares: `Epilogue.derived`); None where the table is not such a
    staircase (not monotone, or out of the output's range). A level no value reaches gets a
    threshold above mid.qmax."""
    values = table.to(torch.int64)[lo - mid.qmin:]
    q = torch.arange(lo, mid.qmax + 1, dtype=torch.int64)
    if values.numel() != q.numel() or bool((values < out.qmin).any()) or \
            bool((values > out.qmax).any()) or bool((values[1:] < values[:-1]).any()):
        return None
    levels = out.qmax - out.qmin
    thr = torch.full((levels,), mid.qmax + 1, dtype=torch.int64)
    for i in range(1, levels + 1):
        reached = q[values >= out.qmin + i]
        if reached.numel():
            thr[i - 1] = reached[0]
    thr = torch.where(thr <= lo, torch.full_like(thr, lo), thr)  # levels already at lo
    check = out.qmin + (q.view(-1, 1) >= thr.view(1, -1)).sum(1)
    return thr.to(torch.int32) if torch.equal(check, values) else None
