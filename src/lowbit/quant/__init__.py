"""Quantization: quantize/dequantize, scales, STE fake-quant, bit packing, observers, QAT modules,
adaptive training precision, calibration, value guards, per-layer recipes, the layer summary
and integer conversion (data)."""

from .api import precision_schedule, quant_layers, quantize_model
from .calibrate import calibrate
from .convert import IntegerLayer, batchnorm_pairs, fused_epilogue, integer_layer
from .guards import NONFINITE_MODES
from .modules import ActQuantizer, QuantConv2d, QuantLinear, WeightQuantizer
from .observers import METHODS
from .overview import LayerRow, summary
from .packing import from_bitplanes, pack, pack_dense, to_bitplanes, unpack, unpack_dense
from .precision_mix import AdaptivePrecision
from .quantize import (
    affine_params,
    dequantize,
    fake_quantize,
    fixed_point,
    quantize,
    round_half_up,
    scale_from_max,
)
from .recipe import LayerRecipe, build_quant_layer, recipe_of

__all__ = [
    "METHODS",
    "NONFINITE_MODES",
    "ActQuantizer",
    "AdaptivePrecision",
    "IntegerLayer",
    "LayerRecipe",
    "LayerRow",
    "QuantConv2d",
    "QuantLinear",
    "WeightQuantizer",
    "affine_params",
    "batchnorm_pairs",
    "build_quant_layer",
    "calibrate",
    "dequantize",
    "fake_quantize",
    "fixed_point",
    "from_bitplanes",
    "fused_epilogue",
    "integer_layer",
    "pack",
    "pack_dense",
    "precision_schedule",
    "quant_layers",
    "quantize",
    "quantize_model",
    "recipe_of",
    "round_half_up",
    "scale_from_max",
    "summary",
    "to_bitplanes",
    "unpack",
    "unpack_dense",
]
