"""Exact CPU (and device-agnostic) semantics of every op: the oracle kernels are checked against."""

from .bitserial import (
    bitserial_conv2d,
    bitserial_gemm,
    bitserial_gemm_values,
    plane_coefficients,
    popcount,
    valid_mask,
)
from .epilogue import (
    THRESHOLD_MAX_BITS,
    apply_epilogue,
    apply_epilogue_outputs,
    derived_values,
    requant_thresholds,
    requantize,
    requantize32,
)
from .image import normalize_uint8_image, quantize_uint8_image
from .integer import conv2d_int, gemm_int, im2col_nhwc
from .netops import (
    FloatOutput,
    Int32Output,
    LayerOutput,
    RequantizedOutput,
    avgpool2d_int,
    avgpool_multiplier,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
    pool_geometry,
    pool_output_size,
    quantize_float,
    requantize_int,
    uint8_input_table,
)
from .ops import (
    accumulate,
    accumulator_stats,
    random_inputs,
    random_params,
    random_values,
    run,
    run_outputs,
)

__all__ = [
    "THRESHOLD_MAX_BITS", "accumulate", "accumulator_stats", "apply_epilogue",
    "apply_epilogue_outputs", "bitserial_conv2d", "bitserial_gemm", "bitserial_gemm_values",
    "conv2d_int", "derived_values", "gemm_int", "im2col_nhwc", "plane_coefficients", "popcount",
    "random_inputs", "random_params", "random_values", "requant_thresholds", "requantize",
    "requantize32", "run", "run_outputs", "valid_mask",
]
__all__ += [  # network ops (netops)
    "FloatOutput", "Int32Output", "LayerOutput", "RequantizedOutput", "avgpool2d_int",
    "avgpool_multiplier", "epilogue_outputs", "fixed_point_pair", "maxpool2d_int",
    "pool_geometry", "pool_output_size", "quantize_float", "requantize_int",
    "uint8_input_table",
]
__all__ += ["normalize_uint8_image", "quantize_uint8_image"]  # uint8 images (image)
