"""Triton templates: int8 implicit-GEMM conv2d and GEMM (wgmma s8 on Hopper), the split-K
weight-streaming GEMV (M <= 64), the conv on fp16 tensor cores, the depthwise conv on CUDA
cores (and grouped convs of few channels per group there), the grouped conv on int8 tensor
cores, the persistent 1x1 conv of few channels, with the fused epilogue and packed sub-byte
I/O. Importing this package registers them (`lowbit.kernels.get_template("triton.conv2d_int8")`)."""

from ..base import register
from .depthwise import Conv2dDepthwiseTemplate, Conv2dGroupedCudaTemplate, DepthwiseKernel
from .gemv import GemvInt8Template, GemvKernel
from .grouped import Conv2dGroupedInt8Template, GroupedKernel
from .pointwise import Conv2dPointwiseTemplate, PointwiseKernel
from .templates import (
    Conv2dFp16Template,
    Conv2dInt8Template,
    GemmInt8Template,
    IgemmKernel,
    conv2d_fp16,
)
from .tma_conv import Conv2dInt8TmaTemplate, TmaConvKernel

CONV2D_INT8 = register(Conv2dInt8Template())
GEMM_INT8 = register(GemmInt8Template())
CONV2D_FP16 = register(Conv2dFp16Template())
CONV2D_INT8_TMA = register(Conv2dInt8TmaTemplate())
GEMV_INT8 = register(GemvInt8Template())
CONV2D_DEPTHWISE = register(Conv2dDepthwiseTemplate())
CONV2D_GROUPED_INT8 = register(Conv2dGroupedInt8Template())
CONV2D_GROUPED_CUDA = register(Conv2dGroupedCudaTemplate())
CONV2D_POINTWISE = register(Conv2dPointwiseTemplate())

__all__ = ["CONV2D_DEPTHWISE", "CONV2D_FP16", "CONV2D_GROUPED_CUDA", "CONV2D_GROUPED_INT8",
           "CONV2D_INT8", "CONV2D_INT8_TMA", "CONV2D_POINTWISE", "GEMM_INT8", "GEMV_INT8",
           "Conv2dDepthwiseTemplate", "Conv2dFp16Template", "Conv2dGroupedCudaTemplate",
           "Conv2dGroupedInt8Template", "Conv2dInt8Template", "Conv2dInt8TmaTemplate",
           "Conv2dPointwiseTemplate", "DepthwiseKernel", "GemmInt8Template", "GemvInt8Template",
           "GemvKernel", "GroupedKernel", "IgemmKernel", "PointwiseKernel", "TmaConvKernel",
           "conv2d_fp16"]
