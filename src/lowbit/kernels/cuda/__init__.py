"""CUDA C++ kernel templates rendered from Python and compiled at run time with NVRTC.

`nvrtc` compiles (disk-cached) and launches on PyTorch's current stream. The APNN-TC
bit-serial conv2d/GEMM on b1 AND tensor cores is five kernel families, each its own template
(`bitserial_mma_sync`, `bitserial_mma_sync_persistent`, `bitserial_wgmma`,
`bitserial_wgmma_persistent`, `bitserial_tap_shift`; `python -m lowbit.kernels.cuda --list`
prints their knobs); `default_bitserial` picks the best untuned one for a workload and
`migrate_config` reads records of the single template they replaced ("cuda.bitserial").
`int8_wgmma` runs int8-layout operands through the wgmma families' kernels; `mma_conv` is the
tiled mma.sync s8/s4 implicit-GEMM conv (the convolution paper's knobs). Importing this package
registers its templates.
"""

from ..base import register
from .bitserial_families import (
    BY_NAME,
    FAMILIES,
    LEGACY,
    default_bitserial,
    family_of,
    kernel_spec,
    migrate_config,
)
from .bitserial_family import BitserialFamily, target_arch
from .bitserial_kernel import BitserialKernel
from .bitserial_mma_sync import MMA_SYNC, MMA_SYNC_PERSISTENT
from .bitserial_shape import WGMMA_ARCH
from .bitserial_tap_shift import TAP_SHIFT
from .bitserial_wgmma import WGMMA, WGMMA_PERSISTENT
from .int8_wgmma import INT8_WGMMA, Int8WgmmaTemplate
from .mma_conv import S4_TEMPLATE, S8_TEMPLATE, MmaConvTemplate
from .nvrtc import CompileError, CudaError, CudaKernel, compile_cubin, compile_ptx, load_kernel

for _template in (*FAMILIES, INT8_WGMMA):
    register(_template)

__all__ = ["BY_NAME", "FAMILIES", "INT8_WGMMA", "LEGACY", "MMA_SYNC", "MMA_SYNC_PERSISTENT",
           "S4_TEMPLATE", "S8_TEMPLATE", "TAP_SHIFT", "WGMMA", "WGMMA_ARCH", "WGMMA_PERSISTENT",
           "BitserialFamily", "BitserialKernel", "CompileError", "CudaError", "CudaKernel",
           "Int8WgmmaTemplate", "MmaConvTemplate", "compile_cubin", "compile_ptx",
           "default_bitserial", "family_of", "kernel_spec", "load_kernel", "migrate_config",
           "target_arch"]
