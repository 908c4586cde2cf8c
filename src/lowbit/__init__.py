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
         "convert": ("lowbit.runtime.integer_model", "convert"),
         "compile": ("lowbit.runtime.compiled", "compile_model"),
         "summary": ("lowbit.quant.overview", "summary"),
         "save": ("lowbit.serialize", "save"),
         "load": ("lowbit.serialize", "load"),
         "autoprecision": ("lowbit.runtime.autoprecision", "autoprecision"),
         "from_onnx": ("lowbit.quant.onnx_qdq", "from_onnx"),
         "to_onnx": ("lowbit.quant.onnx_export", "to_onnx"),
         "models": ("lowbit.models", None)}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'lowbit' has no attribute {name!r}")

__all__ = [
    "Config", "ConfigSpace", "ConvWorkload", "Encoding", "Epilogue", "GemmWorkload", "Layout",
    "PackedTensor", "Precision", "Workload", "__version__", "autoprecision", "calibrate",
    "compile", "convert", "from_onnx", "load", "models", "quantize", "save", "summary",
    "to_onnx",
]
