"""Quantization: quantize/dequantize, scales, STE fake-quant, bit packing."""

from .packing import from_bitplanes, pack, pack_dense, to_bitplanes, unpack, unpack_dense
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
    "affine_params", "dequantize", "fake_quantize", "fixed_point", "from_bitplanes", "pack",
    "pack_dense", "quantize", "round_half_up", "scale_from_max", "to_bitplanes", "unpack",
    "unpack_dense",
]
