"""CUDA C++ kernel templates rendered from Python and compiled at run time with NVRTC.

`nvrtc` compiles (disk-cached) and launches on PyTorch's current stream; `bitserial` is the
APNN-TC bit-serial conv2d/GEMM on b1 AND tensor cores; `mma_conv` the tiled mma.sync s8/s4
implicit-GEMM conv (the convolution paper's knobs). Importing this package registers its
templates.
"""

from ..base import register
from .bitserial import BITSERIAL, BitserialKernel, BitserialTemplate
from .mma_conv import S4_TEMPLATE, S8_TEMPLATE, MmaConvTemplate
from .nvrtc import CompileError, CudaError, CudaKernel, compile_cubin, compile_ptx, load_kernel

register(BITSERIAL)

__all__ = ["BITSERIAL", "S4_TEMPLATE", "S8_TEMPLATE", "BitserialKernel", "BitserialTemplate",
           "CompileError", "CudaError", "CudaKernel", "MmaConvTemplate", "compile_cubin",
           "compile_ptx", "load_kernel"]
