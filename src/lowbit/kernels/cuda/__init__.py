"""CUDA C++ kernel templates rendered from Python and compiled at run time with NVRTC.

`nvrtc` compiles (disk-cached) and launches on PyTorch's current stream; `bitserial` is the
APNN-TC bit-serial conv2d/GEMM on b1 AND tensor cores. Importing this package registers its
templates.
"""

from ..base import register
from .bitserial import BITSERIAL, BitserialKernel, BitserialTemplate
from .nvrtc import CompileError, CudaError, CudaKernel, compile_cubin, compile_ptx, load_kernel

register(BITSERIAL)

__all__ = ["BITSERIAL", "BitserialKernel", "BitserialTemplate", "CompileError", "CudaError",
           "CudaKernel", "compile_cubin", "compile_ptx", "load_kernel"]
