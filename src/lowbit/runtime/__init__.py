"""Runtime: converted models whose conv / linear layers run as integer ops."""

from .integer_model import IntegerConv2d, IntegerLinear, convert, integer_layers

__all__ = ["IntegerConv2d", "IntegerLinear", "convert", "integer_layers"]
