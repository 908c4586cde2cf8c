"""CUDA C++ kernel templates rendered from Python and compiled at run time with NVRTC.

`nvrtc` compiles (disk-cached) and launches on PyTorch's current stream; `bitserial` is the
APNN-TC bit-serial conv2d/GEMM on b1 AND tensor cores; `int8_wgmma` the same kernel on s8
wgmma for int8-layout operands; `mma_conv` the tiled mma.sync s8/s4 implicit-GEMM conv (the
convolution paper's knobs). Importing this package registers its
templates.
"""

from ..base import register
from .bitserial import BITSERIAL, BitserialKernel, BitserialTemplate
from .int8_wgmma import INT8_WGMMA, Int8WgmmaTemplate
from .mma_conv import S4_TEMPLATE, S8_TEMPLATE, MmaConvTemplate
from .nvrtc import CompileError, CudaError, CudaKernel, compile_cubin, compile_ptx, load_kernel

register(BITSERIAL)
register(INT8_WGMMA)

__all__ = ["BITSERIAL", "INT8_WGMMA", "S4_TEMPLATE", "S8_TEMPLATE", "BitserialKernel",
           "BitserialTemplate", "CompileError", "CudaError", "CudaKernel", "Int8WgmmaTemplate",
           "MmaConvTemplate", "compile_cubin", "compile_ptx", "load_kernel"]
