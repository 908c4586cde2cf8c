"""Host emulation of the warp-specialized first layer (`stem_ws`): the same CUDA text, run on
the CPU.

`emulate_ws(...)` compiles the kernel's own code (stem_ws.cu, unchanged, with the host
versions of its device primitives: emu_threads.cu + emu_mma_conv_device.cu in place of
mma_conv_device.cu, emu_stem_ws_device.cu in place of stem_ws_device.cu) with the host
compiler and runs every CTA with one std::thread per CUDA thread. The producer and consumer
warps run concurrently; mbarriers are phase counters (a wait blocks until its phase
completes, a block that ends with arrivals pending fails), shared memory starts as 0xCD
garbage, so a missing wait reads stale ring bytes. Slow (threads and barriers per mma and
shuffle): small images only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from ...core import Precision
from ..triton.stem_geometry import StemGeometry
from .cu_source import cu_file
from .host_emu import host_library
from .stem_ws import WsShape, render, ws_arguments

__all__ = ["emulate_ws", "host_source"]


def host_source(shape: WsShape) -> str:
    """The kernel's CUDA text with its device primitives replaced by the host versions."""
    supplied = {"mma_conv_device.cu": cu_file("emu_threads.cu")
                + cu_file("emu_mma_conv_device.cu"),
                "stem_ws_device.cu": cu_file("emu_stem_ws_device.cu")}
    return (cu_file("emu_includes.cu") + "#include <cmath>\n" + render(shape, supplied)
            + cu_file("emu_stem_ws_main.cu"))


def emulate_ws(image: torch.Tensor, table: torch.Tensor | None, weight: torch.Tensor,
               bias: torch.Tensor | None, specs: Sequence[object], outs: Sequence[object],
               geom: StemGeometry, prec: Precision, scale: float,
               status: torch.Tensor | None = None, ctas: int = 2,
               band_rows: int | None = None) -> None:
    """Run the kernel on CPU tensors (arguments as `stem_ws.ws_arguments`; `ctas` persistent
    CTAs), writing `outs` (PackedTensors) and `status`. RuntimeError where a CTA ended with
    mbarrier arrivals pending."""
    shape, args, grid = ws_arguments(image, table, weight, bias, specs, outs, geom, prec,
                                     scale, status, ctas, band_rows)
    lib = host_library(host_source(shape), "stem_ws")
    c_args = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c_args.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, float):
            c_args.append(ctypes.c_float(a))
        else:
            c_args.append(ctypes.c_int(int(a)))
    rc = lib.emu_run(*c_args, ctypes.c_int(grid[0]), ctypes.c_int(grid[1]))
    if rc != 0:
        raise RuntimeError(f"emulated stem_ws failed ({rc}): a CTA ended with mbarrier "
                           "arrivals pending")
