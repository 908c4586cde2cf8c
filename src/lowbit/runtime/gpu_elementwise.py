"""GPU bindings of the plan's elementwise integer steps (`lowbit.runtime.gpu` calls them):
Gather, TableMul and narrow Lookup steps on `lowbit.kernels.triton.elementwise`'s kernels,
ChannelAffine on `lowbit.kernels.triton.affine`'s (one launch per step, whatever its parts:
the kernel reads them through a table of their addresses, bound once; the executor's
buffers are fixed views of its arena), Gather of float or bit-plane tensors
through torch (a copy into the output buffer)."""

from __future__ import annotations

import torch

from ..core import Layout
from ..graph.ir import ChannelAffine, Gather, Lookup, Step, TableMul
from .gpu_torch import values_reader, values_writer


def elementwise_kernels():
    """The Triton elementwise ops (imported on first use: importing Triton is slow)."""
    from ..kernels.triton import elementwise

    return elementwise


def affine_kernels():
    """The Triton channel affine (imported on first use)."""
    from ..kernels.triton import affine

    return affine


def handles(executor: object, step: Step) -> bool:
    """Whether `bind_elementwise` binds this step (Lookups: those of <= 8-bit inputs)."""
    if isinstance(step, (Gather, TableMul, ChannelAffine)):
        return True
    return isinstance(step, Lookup) and \
        not executor.plan.tensors[step.input].is_wide


def bind_elementwise(executor: object, step: Step) -> tuple[list, str]:
    """(launches, what runs them) of a Gather, TableMul, ChannelAffine or narrow Lookup step
    of the executor's plan."""
    plan, params = executor.plan, executor.plan.params
    if isinstance(step, ChannelAffine):  # one launch over every part
        return [affine_kernels().bind_channel_affine(
            [executor.packed(p) for p in step.parts], params[step.multiplier],
            params[step.bias], params[step.shift], executor.packed(step.output),
            step.relu)], f"triton channel affine ({len(step.parts)} parts, one launch)"
    ops = elementwise_kernels()
    if isinstance(step, TableMul):
        return [ops.bind_table_mul(executor.packed(step.a), executor.packed(step.b),
                                   params[step.table], executor.packed(step.output))], \
            "triton table product"
    if isinstance(step, Lookup):
        return [ops.bind_lookup(executor.packed(step.input), params[step.table],
                                executor.packed(step.output))], "triton table lookup"
    spec = plan.tensors[step.input]
    index = params[step.index].to(executor.device)
    if not spec.is_float and spec.layout is Layout.INT8:
        return [ops.bind_gather(executor.packed(step.input), index,
                                executor.packed(step.output))], "triton channel gather"
    src, out = executor.buffers[step.input], executor.buffers[step.output]
    if spec.is_float:
        return [lambda: torch.index_select(src, 1, index, out=out)], "torch channel gather"
    read, write = values_reader(executor, step.input), values_writer(executor, step.output)
    return [lambda: write(read().index_select(-1, index))], "torch bit-plane channel gather"
