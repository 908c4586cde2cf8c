"""Building the host emulations of the CUDA kernels (`mma_conv_emu.py`, `bitserial_emu.py`).

Each emulation is the kernel's own CUDA text with only the device primitives replaced by host
C++ of their PTX-specified behaviour, compiled with the host compiler into a shared library
(cached on disk by source hash) and run with one std::thread per CUDA thread. The C++ they
share is in emu_includes.cu (headers) and emu_threads.cu (the thread model and block runner).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...core.cache import cache_dir


def compiler() -> str | None:
    """The host C++ compiler used (``$CXX`` or g++ / clang++ on PATH), None if there is none."""
    for cand in (os.environ.get("CXX"), "g++", "clang++"):
        if cand and shutil.which(cand):
            return cand
    return None


def host_library(source: str, stem: str) -> ctypes.CDLL:
    """`source` compiled (C++20, -O1, pthreads) into a shared library, cached by hash."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no host C++ compiler (set $CXX or install g++) for the emulation")
    key = hashlib.sha256((cxx + source).encode()).hexdigest()[:32]
    lib = cache_dir("emu") / f"{stem}_{key}.so"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "emu.cpp"
            src.write_text(source)
            so = Path(tmp) / "emu.so"
            cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-w",
                   str(src), "-o", str(so)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"host compile failed:\n{proc.stderr[-4000:]}")
            os.replace(so, lib)
    return ctypes.CDLL(str(lib))
