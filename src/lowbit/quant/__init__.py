"""Quantization: quantize/dequantize, scales, STE fake-quant, bit packing, observers, QAT modules,
adaptive training precision, calibration and integer conversion (data)."""

from .api import precision_schedule, quant_layers, quantize_model
from .calibrate import calibrate
from .convert import IntegerLayer, batchnorm_pairs, fused_epilogue, integer_layer
from .modules import ActQuantizer, QuantConv2d, QuantLinear, WeightQuantizer
from .observers import METHODS
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

__all__ = [
    "METHODS",
    "ActQuantizer",
    "AdaptivePrecision",
    "IntegerLayer",
    "QuantConv2d",
    "QuantLinear",
    "WeightQuantizer",
    "affine_params",
    "batchnorm_pairs",
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
    "round_half_up",
    "scale_from_max",
    "to_bitplanes",
    "unpack",
    "unpack_dense",
]
