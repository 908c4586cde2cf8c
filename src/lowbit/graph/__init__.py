"""Whole networks as plans of fused integer layers: a torch.fx trace of a quantized model
(`trace_model`) becomes a value graph, and `build_plan` turns it into a `Plan` for one input
shape (tensors with precision / scale / layout, and steps: Quantize, Layer, MaxPool, AvgPool,
Flatten, Concat, ChannelAffine, FloatFallback, Output; see `lowbit.graph.ir`).
`lowbit.compile` (runtime) builds and runs plans."""

from .chooser import Chooser, KernelChoice, ModelChooser, make_chooser
from .dataflow import Dataflow, Value, trace_model
from .impl import BITSERIAL, TORCH_FP16, choose_impl, input_layout, int8_preferring
from .ir import (
    AvgPool,
    ChannelAffine,
    Concat,
    Flatten,
    FloatFallback,
    Layer,
    LayerOutput,
    Lookup,
    MaxPool,
    Output,
    Plan,
    PoolWindow,
    Quantize,
    Step,
    TensorSpec,
)
from .launches import PlanOptions
from .planner import build_plan

__all__ = [
    "BITSERIAL",
    "TORCH_FP16",
    "AvgPool",
    "ChannelAffine",
    "Chooser",
    "Concat",
    "Dataflow",
    "Flatten",
    "FloatFallback",
    "KernelChoice",
    "Layer",
    "LayerOutput",
    "Lookup",
    "MaxPool",
    "ModelChooser",
    "Output",
    "Plan",
    "PlanOptions",
    "PoolWindow",
    "Quantize",
    "Step",
    "TensorSpec",
    "Value",
    "build_plan",
    "choose_impl",
    "input_layout",
    "int8_preferring",
    "make_chooser",
    "trace_model",
]
