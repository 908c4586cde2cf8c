"""lowbit: 1-8 bit quantized convolution and GEMM on auto-tuned NVIDIA Tensor Core kernels."""

from .core import (
    Config,
    ConfigSpace,
    ConvWorkload,
    Encoding,
    Epilogue,
    GemmWorkload,
    Layout,
    PackedTensor,
    Precision,
    Workload,
)

__version__ = "0.1.0"

__all__ = [
    "Config", "ConfigSpace", "ConvWorkload", "Encoding", "Epilogue", "GemmWorkload", "Layout",
    "PackedTensor", "Precision", "Workload", "__version__",
]
