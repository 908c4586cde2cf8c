"""Runtime: converted models whose conv / linear layers run as integer ops (torch.library
custom ops over the exact reference; `ops.py`)."""

from .integer_model import (
    IntegerConv2d,
    IntegerLinear,
    convert,
    integer_layers,
    integer_modules,
)

__all__ = ["IntegerConv2d", "IntegerLinear", "convert", "integer_layers", "integer_modules"]
