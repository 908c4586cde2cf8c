"""Host emulation of the bit-serial kernels: the same CUDA text, run on the CPU.

`emulate(template, workload, config, x, w, params)` renders the kernel of a bit-serial family (or
cuda.int8_wgmma) for (workload, config) with only its device primitives supplied as host C++ of
their PTX-specified behaviour (emu_device.cu for bitserial_device.cu, emu_wgmma_device.cu for
bitserial_wgmma_device.cu and the rendered wgmma wrappers), compiles it with the host compiler
and runs every block with one std::thread per CUDA thread:
- cp.async copies are queued per thread and land at `cp.async.wait_group` (the latest moment the
  hardware may complete them; src-size 0 zero-fills), so a missing wait or barrier reads stale
  shared memory (which starts as 0xCD garbage, not zeros);
- mma.sync m16n8k256 .b1 .and.popc: the PTX fragment layouts (groupID g = lane/4, t = lane%4;
  A regs 0/1: rows g / g+8, k 32t..32t+31; regs 2/3: k 128+32t..; B regs 0/1: column g, same
  k; C/D: rows g, g+8, columns 2t, 2t+1), operands gathered across the warp;
- wgmma m64nNk256 .b1 .and.popc (and m64nNk32 .s8/.u8 x .s8 for the int8 mode) from
  shared-memory descriptors (start, LBO, SBO, base offset; no swizzle, or the 128 / 64 /
  32-byte swizzle: a row's 16-byte chunk index XORed with its address bits 7.. counted from the
  pattern's start), K-major, executed at `wgmma.wait_group` (the latest legal moment) and at
  issue (the earliest): operands that differ between the two, overwritten or landing late,
  raise `StaleOperands`; each thread computes its own accumulator registers (warp w of the
  warpgroup: rows 16w + g (+8), register k: column 8(k/4) + 2t + k%2);
- mbarriers with bulk copies and tiled tensor copies (swizzled like the descriptors, zeros out
  of bounds): the copies land when a thread waits on their mbarrier, which checks the bytes
  announced by expect_tx;
- griddepcontrol (CHAINED): a thread's copies from x before its wait raise `EarlyInputRead`
  (x is the previous kernel's output, possibly still being written);
- shfl (indexed and xor), bar.sync (the block's and named barriers of a thread count, with
  bar.arrive), __syncwarp, atomicOr on shared memory, cvt.rn.f16.f32 (_Float16), prmt.b32.
It checks the kernels' indexing, pipelines, descriptors and packing on machines without a GPU;
it is slow (threads and barriers per instruction) and meant for small workloads.
"""

from __future__ import annotations

import ctypes
import re
import struct
from collections.abc import Mapping

import torch

from ...core import Config, Workload
from ...core.epilogue import EpilogueParams, check_shifted_bias
from ...core.hardware import TARGET
from ...core.validate import check_inputs, out_storage
from .bitserial_family import BitserialFamily
from .bitserial_layout import (
    k_tiles,
    persistent_grid,
    smem_bytes,
    stage_bytes,
    threads,
    tile_grid,
)
from .bitserial_render import WGMMA_OPS
from .bitserial_shape import (
    WGMMA_ARCH,
    WTAP_THREADS,
    XPOP_THREADS,
    conv_shape,
    s8_atype,
    side_table_blocks,
)
from .bitserial_tables import (
    block_end_args,
    epilogue_thresholds,
    epilogue_vectors,
    halo_map_geometry,
    row_table,
    side_tables,
    split_workspace,
    weight_images,
)
from .cu_source import cu_file
from .host_emu import host_library

#: largest dynamic shared memory a block may use (H100: 227 KiB)
SMEM_LIMIT = TARGET.smem_per_block
#: the weights' image kernel the emulation runs (BULK_WEIGHTS), or a stand-in
WIMAGE = {True: "bitserial_wimage", False: "emu_no_wimage"}


def host_files(supplied: Mapping[str, str] | None = None) -> dict[str, str]:
    """The files the emulation supplies in place of the device primitives (and, for tests
    that check it catches a broken kernel, any others given)."""
    return {"bitserial_device.cu": cu_file("emu_device.cu"),
            "bitserial_wgmma_device.cu": cu_file("emu_wgmma_device.cu"), WGMMA_OPS: "",
            **(supplied or {})}


def host_source(template: BitserialFamily, wl: Workload, config: Mapping, chained: int = 0,
                supplied: Mapping[str, str] | None = None) -> str:
    """The kernel's CUDA text with its device primitives replaced by the host versions."""
    spec = template.spec(config)
    text = template.render(wl, config, chained=chained, supplied=host_files(supplied))
    if re.search(r"\basm\b", text):
        raise RuntimeError("inline PTX left outside the device-primitive files")
    head = (f"#define EMU_SMEM_BYTES {SMEM_LIMIT}\n"
            f"#define EMU_MAIN {template.kernel_name(config)}\n"
            f"#define EMU_WIMAGE {WIMAGE[bool(spec['BULK_WEIGHTS'])]}\n"
            f"#define EMU_A_S8 {int(s8_atype(wl) == 's8')}\n"
            f"#define EMU_XMAP_ARG {', *(const TensorMap*)xmap' if spec['TMA_HALO'] else ''}\n"
            f"#define EMU_BLOCK_END_ARG "
            f"{', *(const BlockEndArgs*)block_end' if wl.epilogue.requant32 else ''}\n")
    return (cu_file("emu_includes.cu") + head + cu_file("emu_threads.cu")
            + cu_file("emu_intrinsics.cu") + text + cu_file("emu_main.cu"))


def emulate(template: BitserialFamily, wl: Workload, config: Mapping, x: torch.Tensor,
            w: torch.Tensor, params: EpilogueParams, persistent_blocks: int = 2,
            poison: int = 0xA5, launches: int = 1, chained: int = 0,
            supplied: Mapping[str, str] | None = None) -> torch.Tensor:
    """Run the kernel of (wl, config) of `template` (a bit-serial family or cuda.int8_wgmma)
    on CPU tensors through the host emulation; returns the output (poisoned before each
    launch). Persistent kernels run `persistent_blocks` blocks, so each loops over several
    tiles. `launches` > 1 runs the main kernel again on the same side buffers (split-K counters
    must come back to zero). chained = 1 or 2 runs the kernels rendered for programmatic
    dependent launch (`bitserial_kernel.CHAIN_TRIGGERS`) and raises `EarlyInputRead` where a
    thread copies from x before its griddepcontrol.wait. `supplied`: .cu files in place of the
    package's (a test's broken kernel, which the emulation must catch)."""
    config = Config(config)
    reason = template.space(wl, WGMMA_ARCH).why_invalid(config)
    if reason:
        raise ValueError(f"config {config} is not in {template.name}'s space for {wl.key}: "
                         f"{reason}")
    spec = template.spec(config)
    check_inputs(wl, x, w, params)
    check_shifted_bias(wl.epilogue, params, conv_shape(wl).kout)
    shape, dtype = out_storage(wl)
    out = torch.empty(shape, dtype=dtype)
    wtap, xpop = side_tables(wl, spec, "cpu")
    split_ws, split_count = split_workspace(wl, spec, "cpu")
    vrows = row_table(wl, spec, "cpu")
    for table in (wtap, xpop, split_ws):
        if table is not None:
            table.fill_(-7)  # garbage until a kernel writes it
    if x.dtype == torch.uint8 or w.dtype == torch.uint8:  # int8 layout: the bytes as they are
        x, w = x.view(torch.int8), w.view(torch.int8)
    lib = host_library(host_source(template, wl, config, chained, supplied), "bitserial")
    x_bytes = ctypes.c_longlong(x.numel() * x.element_size())
    lib.emu_set_input(ctypes.c_void_p(x.data_ptr()), x_bytes)
    ptr = ctypes.c_void_p
    thr = epilogue_thresholds(wl, spec, params)  # held here: args keep only raw pointers
    bias, scale, mult, shift, thr_arg = epilogue_vectors(wl, params, thr)
    xmap = emu_tensor_map(wl, spec, x)  # held here too
    block_end, _held = block_end_args(wl, params)
    args = [ptr(t.data_ptr()) if t is not None else ptr(0)
            for t in (x, w, out, bias, scale, mult, shift, wtap, xpop, thr_arg, split_ws,
                      split_count, vrows, xmap)]
    args.append(ptr(ctypes.addressof(block_end)) if block_end is not None else ptr(0))
    grid = (*tile_grid(wl, spec), spec["SPLIT_K"])
    if spec["PERSIST"]:
        grid = persistent_grid(wl, spec, persistent_blocks)
    wtap_blocks, xpop_blocks = side_table_blocks(wl)
    if wtap is not None:
        _run(lib, 0, args, (wtap_blocks, 1, 1), WTAP_THREADS, 0)
    if xpop is not None:
        _run(lib, 2, args, (xpop_blocks, 1, 1), XPOP_THREADS, 0)
    wimg = weight_images(wl, spec, "cpu")
    if wimg is not None:  # the weights' stage images, then the main kernel reads them as its w
        wimg.fill_(-7)
        image_args = list(args)
        image_args[2] = ptr(wimg.data_ptr())
        _run(lib, 3, image_args, (grid[0], k_tiles(wl, spec), 1), threads(spec),
             stage_bytes(wl, spec))
        args[1] = ptr(wimg.data_ptr())
    for _ in range(launches):
        for buf in (out, *params.derived_out):
            buf.view(torch.uint8).fill_(poison)
        _run(lib, 1, args, grid, threads(spec), smem_bytes(wl, spec))
    return out


def emulate_outputs(template: BitserialFamily, wl: Workload, config: Mapping, x: torch.Tensor,
                    w: torch.Tensor, params: EpilogueParams, **kwargs) -> list[torch.Tensor]:
    """`emulate`'s every output, as `lowbit.reference.run_outputs` lists them: the mid output
    unless Epilogue.store_out is False, then params.derived_out (which the kernel wrote)."""
    out = emulate(template, wl, config, x, w, params, **kwargs)
    return ([out] if wl.epilogue.store_out else []) + list(params.derived_out)


def emu_tensor_map(wl: Workload, spec: Mapping, x: torch.Tensor) -> torch.Tensor | None:
    """TMA_HALO: the emulation's stand-in for the tensor map of `x` (EmuTensorMap in 128
    bytes: the geometry of `halo_map_geometry`, swizzled TMA_HALO bytes); None without it."""
    if not spec["TMA_HALO"]:
        return None
    dims, strides, box = halo_map_geometry(wl, spec)
    raw = struct.pack("<Q4q3q5i", x.data_ptr(), *dims, *strides, *box, spec["TMA_HALO"])
    return torch.frombuffer(bytearray(raw.ljust(128, b"\0")), dtype=torch.uint8)


class StaleOperands(RuntimeError):
    """An emulated wgmma read shared memory that changed before the MMA completed."""


class EarlyInputRead(RuntimeError):
    """A chained kernel copied from its input before waiting for the kernel that writes it."""


def _run(lib: ctypes.CDLL, which: int, args: list, grid: tuple[int, int, int], nthreads: int,
         smem: int) -> None:
    rc = lib.emu_run(ctypes.c_int(which), *args, *(ctypes.c_int(g) for g in grid),
                     ctypes.c_int(nthreads), ctypes.c_longlong(smem))
    if rc == -2:
        raise RuntimeError("the kernel left a named barrier with arrivals pending (bar.arrive "
                           "without the threads that complete its phase)")
    if rc == -4:
        raise EarlyInputRead("a chained kernel copied from x before griddepcontrol.wait (the "
                             "previous kernel, which writes x, may still be running)")
    if rc == -3:
        raise StaleOperands("wgmma operands changed between issue and completion (a stage "
                            "refilled while its MMAs ran, or their copies landing late)")
    if rc:
        raise ValueError(f"launch refused by the emulation: {nthreads} threads, {smem} B "
                         f"of shared memory (at most 512 threads and {SMEM_LIMIT} B)")
