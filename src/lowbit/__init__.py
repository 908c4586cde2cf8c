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

# quantize / calibrate / convert load lazily: `import lowbit` stays light
_LAZY = {"quantize": ("lowbit.quant.api", "quantize_model"),
         "calibrate": ("lowbit.quant.calibrate", "calibrate"),
         "convert": ("lowbit.runtime.integer_model", "convert")}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lowbit' has no attribute {name!r}")

__all__ = [
    "Config", "ConfigSpace", "ConvWorkload", "Encoding", "Epilogue", "GemmWorkload", "Layout",
    "PackedTensor", "Precision", "Workload", "__version__", "calibrate", "convert", "quantize",
]
