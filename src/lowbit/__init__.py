"""lowbit: 1-8 bit quantized convolution and GEMM on auto-tuned NVIDIA Tensor Core kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Everything loads on first use: `import lowbit` (and `lowbit --help`) stays light, and
# `lowbit.tune.dispatch.choose_impl` works without importing lowbit.tune first.
_CORE = ("Config", "ConfigSpace", "ConvWorkload", "Encoding", "Epilogue", "GemmWorkload",
         "Layout", "PackedTensor", "Precision", "Workload")
_LAZY = {**{name: ("lowbit.core", name) for name in _CORE},
         "quantize": ("lowbit.quant.api", "quantize_model"),
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
_SUBPACKAGES = ("core", "quant", "reference", "kernels", "perfmodel", "tune", "graph",
                "runtime", "serialize", "models")

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"lowbit.{name}")
    raise AttributeError(f"module 'lowbit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})


__all__ = [
    "Config", "ConfigSpace", "ConvWorkload", "Encoding", "Epilogue", "GemmWorkload", "Layout",
    "PackedTensor", "Precision", "Workload", "__version__", "autoprecision", "calibrate",
    "compile", "convert", "from_onnx", "load", "models", "quantize", "save", "summary",
    "to_onnx",
]
