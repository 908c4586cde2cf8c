"""Runtime: converted models whose conv / linear layers run as integer ops (torch.library
custom ops over the exact reference; `ops.py`), and compiled networks (`lowbit.compile`): a plan
run by the exact reference executor or, on a GPU, by the kernels under one CUDA graph."""

from .compiled import EXECUTORS, CompiledModel, compile_model
from .engine import ReferenceExecutor, run_plan
from .integer_model import (
    IntegerConv2d,
    IntegerLinear,
    convert,
    integer_layers,
    integer_modules,
)

__all__ = ["EXECUTORS", "CompiledModel", "IntegerConv2d", "IntegerLinear", "ReferenceExecutor",
           "compile_model", "convert", "integer_layers", "integer_modules", "run_plan"]
