"""Kernel templates: each one a plug-in behind `KernelTemplate` (space, build).

Backends register their templates on import: `lowbit.kernels.triton` (int8 / fp16 implicit GEMM)
and `lowbit.kernels.cuda` (bit-serial and tiled mma.sync, compiled with NVRTC).
"""

from .base import Kernel, KernelTemplate, get_template, register, templates

__all__ = ["Kernel", "KernelTemplate", "get_template", "register", "templates"]
