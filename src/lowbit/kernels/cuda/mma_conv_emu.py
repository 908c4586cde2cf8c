"""Host emulation of the mma.sync conv kernel: the same CUDA text, run on the CPU.

`emulate(kernel, x, w, params)` compiles the kernel's own code (mma_conv.cu, unchanged, with
emu_mma_conv_device.cu in place of its device primitives) with the host C++ compiler and runs
every block with one std::thread per CUDA thread. Only the device primitives are replaced, each
by its PTX-specified behaviour:
- cp.async copies are queued per thread and land at `cp.async.wait_group` (the latest moment
  the hardware may complete them), so a missing wait or barrier reads stale shared memory;
- ldmatrix (m8n8 .b16, x2/x4): lane i receives bytes 4*(i%4)..+3 of row i/4 of matrix j, whose
  row addresses lanes 8j..8j+7 supplied (rows must be 16-byte aligned and inside the buffer);
- mma.sync m16n8k32 (8-bit) / m16n8k64 (4-bit), A row-major, B column-major: the fragment
  layouts of the PTX ISA (groupID = lane/4, t = lane%4; A reg r: row g + 8*(r%2), elements
  k = t*E + 16*(r/2)*(8/bits)..; B reg r: column g, same k; C/D: rows g, g+8, columns 2t, 2t+1);
- shfl.bfly, bar.sync, cvt.rn.f16.f32 (_Float16), and the shared-memory array.
It is a check of the kernel's indexing, pipeline and packing on machines without a GPU; it is
slow (threads and barriers per instruction) and only meant for small workloads.
"""

from __future__ import annotations

import ctypes

import torch

from ...core.epilogue import EpilogueParams
from ...core.validate import check_inputs, out_storage
from .cu_source import cu_file
from .host_emu import host_library
from .mma_conv import MmaConvKernel, render


def host_source(kernel: MmaConvKernel) -> str:
    """The kernel's CUDA text with its device primitives replaced by the host versions."""
    host = cu_file("emu_threads.cu") + cu_file("emu_mma_conv_device.cu")
    text = render(kernel.workload, kernel.config, kernel.variant,
                  supplied={"mma_conv_device.cu": host})
    return cu_file("emu_includes.cu") + text + cu_file("emu_mma_conv_main.cu")


def _library(kernel: MmaConvKernel) -> ctypes.CDLL:
    return host_library(host_source(kernel), "mma_conv")


def emulate(kernel: MmaConvKernel, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
            poison: int = 0xA5) -> torch.Tensor:
    """Run ``kernel`` on CPU tensors through the host emulation; the output starts poisoned."""
    check_inputs(kernel.workload, x, w, params)
    shape, dtype = out_storage(kernel.workload)
    out = torch.empty(shape, dtype=dtype)
    out.view(torch.uint8).fill_(poison)
    lib = _library(kernel)
    ptr = ctypes.c_void_p
    vecs = [params.bias, params.scale, params.multiplier, params.shift]
    args = [ptr(t.data_ptr()) if t is not None else ptr(0) for t in (x, w, out, *vecs)]
    lib.emu_run(*args, ctypes.c_int(kernel.grid[0]), ctypes.c_int(kernel.grid[1]),
                ctypes.c_int(kernel.smem))
    return out
