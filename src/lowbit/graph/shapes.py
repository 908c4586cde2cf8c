"""Shapes and layouts of a value graph's values: `infer_shapes` (every value's shape for an
input shape, and how a flattened value's columns came from maps), NCHW -> NHWC shapes and a
linear layer's weight columns in the NHWC order of its flattened input."""

from __future__ import annotations

import math

import torch

from ..reference import pool_output_size
from .dataflow import (
    ACT,
    AFFINE,
    AVGPOOL,
    CONCAT,
    FLATTEN,
    GATHER,
    INPUT,
    LAYER,
    MAXPOOL,
    MUL,
    QUANT,
    RELU,
    Dataflow,
    Value,
)
from .elementwise import gather_shape, mul_shape
from .pools import ADAPTIVE, pooled_hw

#: (C, H, W) segments of a flattened value's columns, in order
Segments = tuple[tuple[int, int, int], ...]


def nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An NCHW shape in NHWC order (other ranks as they are)."""
    return (shape[0], *shape[2:], shape[1]) if len(shape) == 4 else tuple(shape)


def nhwc_columns(weight: torch.Tensor, segments: Segments) -> torch.Tensor:
    """A linear layer's weight [K, F] with the columns of each (C, H, W) segment of its
    flattened input moved from NCHW order (c, h, w) to NHWC order (h, w, c)."""
    cols, start = [], 0
    for c, h, w in segments:
        part = weight[:, start:start + c * h * w]
        cols.append(part.reshape(-1, c, h, w).permute(0, 2, 3, 1).reshape(weight.shape[0], -1))
        start += c * h * w
    if start != weight.shape[1]:
        raise AssertionError(f"flatten segments cover {start} of {weight.shape[1]} columns")
    return torch.cat(cols, dim=1)


def infer_shapes(df: Dataflow, shape: tuple[int, ...]
                 ) -> tuple[dict[int, tuple[int, ...]], dict[int, Segments | None]]:
    """(shape by id of value, flattened segments by id of value) of every value of `df` for
    inputs of `shape` (NCHW); a 2-d value flattened from maps has its (C, H, W) segments in
    order (concatenated flattens have several), others None (the model's order). Shapes
    that do not fit the model raise ValueError naming the value."""
    same = shape == df.example_shape
    shapes: dict[int, tuple[int, ...]] = {}
    flat_from: dict[int, Segments | None] = {}
    for v in df.values:
        ins = [shapes[id(i)] for i in v.inputs]
        flat = None
        if v.op == INPUT:
            out = shape
        elif v.op == LAYER:
            out = _layer_shape(v, ins)
            flat = None
        elif v.op in (RELU, ACT, AFFINE, QUANT):  # elementwise: the input's shape
            out, flat = ins[0], flat_from[id(v.inputs[0])]
        elif v.op == MUL:
            out = mul_shape(v, *ins)
        elif v.op == GATHER:
            out = gather_shape(v, ins[0])
        elif v.op == MAXPOOL:
            w = v.attrs["window"]
            n, c, h, wd = _map(v, ins[0])
            out = (n, c, pool_output_size(h, w.kernel, w.stride, w.pad, w.ceil),
                   pool_output_size(wd, w.kernel, w.stride, w.pad, w.ceil))
        elif v.op == AVGPOOL:
            n, c, h, wd = _map(v, ins[0])
            out = (n, c, *pooled_hw(h, wd, **avg_args(v, h, wd)))
        elif v.op == FLATTEN:
            out = (ins[0][0], math.prod(ins[0][1:]))
            flat = (tuple(ins[0][1:]),) if len(ins[0]) == 4 else flat_from[id(v.inputs[0])]
        elif v.op == CONCAT:
            out = _concat_shape(v, ins)
            parts = [flat_from[id(i)] or ((s[1], 1, 1),)
                     for i, s in zip(v.inputs, ins, strict=True)]
            if len(out) == 2 and any(flat_from[id(i)] for i in v.inputs):
                flat = tuple(seg for part in parts for seg in part)
        else:  # FLOAT
            out = df.stats[v.fx_name].shape if same else _run_float(v, ins)
        if out and min(out) < 1:
            raise ValueError(f"input shape {shape} is too small for the model: {v.name} "
                             f"would have shape {out}")
        if same and out != df.stats[v.fx_name].shape:
            raise AssertionError(f"planner shape of {v.name} {out} != traced "
                                 f"{df.stats[v.fx_name].shape}")
        shapes[id(v)] = out
        flat_from[id(v)] = flat
    return shapes, flat_from


def _map(v: Value, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise ValueError(f"{v.name}: {v.op} needs an NCHW map, got shape {shape}")
    return shape


def avg_args(v: Value, h: int, w: int) -> dict:
    """The `pools` window arguments of average-pool value v over an h x w map."""
    a = v.attrs
    if a["mode"] == ADAPTIVE:
        oh, ow = (s if s is not None else d for s, d in zip(a["output_size"], (h, w),
                                                            strict=True))
        return {"mode": ADAPTIVE, "output_hw": (oh, ow)}
    return {"mode": a["mode"], "kernel": a["kernel"], "stride": a["stride"],
            "pad": a["pad"]}


def _layer_shape(v: Value, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
    spec, x = v.attrs["spec"], ins[0]
    if spec.kind == "conv2d":
        n, c, h, w = _map(v, x)
        k, r, s, c_w = spec.weight.shape
        if c != c_w * spec.groups:
            raise ValueError(f"input shape does not fit the model: {v.name} expects "
                             f"{c_w * spec.groups} channels, gets {c}")
        p = (h + 2 * spec.pad - r) // spec.stride + 1
        q = (w + 2 * spec.pad - s) // spec.stride + 1
        out = (n, k, p, q)
    else:
        if len(x) != 2 or x[1] != spec.weight.shape[1]:
            raise ValueError(f"input shape does not fit the model: {v.name} expects "
                             f"[N, {spec.weight.shape[1]}], gets {list(x)}")
        out = (x[0], spec.weight.shape[0])
    if v.residual is not None and len(ins) > 1 and ins[1] != out:
        raise ValueError(f"{v.name}: residual of shape {ins[1]} for an output of {out}")
    return out


def _concat_shape(v: Value, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
    rest = {(s[0], *s[2:]) for s in ins}
    if len(rest) != 1:
        raise ValueError(f"{v.name}: concatenated shapes {ins} differ outside dim 1")
    first = ins[0]
    return (first[0], sum(s[1] for s in ins), *first[2:])


def _run_float(v: Value, ins: list[tuple[int, ...]]) -> tuple[int, ...]:
    """A float value's shape for new input shapes: its module run once on zeros (on the
    device of its parameters)."""
    module = v.attrs["module"]
    held = next(module.parameters(), next(module.buffers(), None))
    device = held.device if held is not None else torch.device("cpu")
    with torch.no_grad():
        out = module(*(torch.zeros(s, device=device) for s in ins))
    return tuple(out.shape)
