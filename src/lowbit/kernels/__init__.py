"""Kernel templates: each one a plug-in behind `KernelTemplate` (space, build).

Backends register their templates on import: `lowbit.kernels.triton` (int8 / fp16 implicit GEMM)
and `lowbit.kernels.cuda` (bit-serial and tiled mma.sync, compiled with NVRTC).
"""

import importlib

from .base import Kernel, KernelTemplate, get_template, register, templates

BACKENDS = ("lowbit.kernels.triton", "lowbit.kernels.cuda")


def load_backends() -> dict[str, str]:
    """Import every built-in backend (registering its templates); returns {module: why} for
    those that could not load (e.g. no Triton on this machine), so the others still serve."""
    failed = {}
    for mod in BACKENDS:
        try:
            importlib.import_module(mod)
        except Exception as e:
            failed[mod] = f"{type(e).__name__}: {e}"
    return failed


__all__ = ["BACKENDS", "Kernel", "KernelTemplate", "get_template", "load_backends", "register",
           "templates"]
