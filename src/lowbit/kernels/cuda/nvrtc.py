"""Run-time CUDA C++ compilation with NVRTC and kernel launch on PyTorch tensors.

Contract:
- ``compile_cubin(source, arch)`` / ``compile_ptx(source, arch)`` return the compiled bytes;
  results are cached in memory and on disk, keyed by the SHA-256 of (source, arch, options,
  NVRTC version), under ``cache_dir("nvrtc")`` (`lowbit.core.cache`: ``$LOWBIT_CACHE_DIR/nvrtc``
  or ``~/.cache/lowbit/nvrtc``).
  A cache made by one NVRTC version is never read by another (the version is in the key).
- A compile error raises ``CompileError`` whose ``.log`` is the NVRTC program log.
- ``load_kernel(source, name)`` compiles for the current device (``device_arch()``) and returns a
  ``CudaKernel``; ``launch`` runs it on PyTorch's current stream of the tensors' device.
- Kernel names must be unmangled: declare kernels ``extern "C" __global__``.
- Kernel arguments: ``torch.Tensor`` -> its ``data_ptr()`` (a ``T*`` parameter); Python ``int``
  -> C ``int`` (32-bit, range checked); ``float`` -> C ``float``; ``bool`` -> C ``int``; ``None``
  -> a null pointer; any ``ctypes`` scalar (``c_int64``, ``c_uint32``, ``c_double``, ...) -> that
  exact C type.
Only cubins are loaded (SASS), never PTX: a newer NVRTC's PTX may not JIT on an older driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.cache import cache_dir
from ...core.progress import progress

__all__ = [
    "CompileError",
    "CudaError",
    "CudaKernel",
    "compile_cubin",
    "compile_ptx",
    "device_arch",
    "launch_config",
    "load_kernel",
    "nvrtc_version",
    "ptxas_report",
]

DEFAULT_ARCH = "sm_90a"
_BASE_OPTIONS = ("-std=c++17", "-default-device")
_memory_cache: dict[str, bytes] = {}
_lock = threading.Lock()


class CompileError(RuntimeError):
    """NVRTC rejected the source; ``log`` holds the NVRTC program log."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}")
        self.log = log


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _driver():
    from cuda.bindings import driver

    return driver


def _check_nvrtc(result: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        raise RuntimeError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


def _check_cu(result: Any, what: str) -> None:
    driver = _driver()
    if result != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(result)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")


def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the loaded NVRTC library."""
    result, major, minor = _nvrtc().nvrtcVersion()
    _check_nvrtc(result, "nvrtcVersion")
    return int(major), int(minor)


def _normalize_arch(arch: str) -> str:
    arch = arch.strip()
    for prefix in ("sm_", "compute_"):
        if arch.startswith(prefix):
            arch = arch[len(prefix):]
    if not arch[:2].isdigit():
        raise ValueError(f"arch must look like 'sm_90a' or 'sm_80', got {arch!r}")
    return arch


def _cache_key(kind: str, source: str, arch: str, options: Sequence[str]) -> str:
    major, minor = nvrtc_version()
    h = hashlib.sha256()
    for part in (kind, f"nvrtc{major}.{minor}", arch, "\0".join(options), source):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


def _compile(kind: str, source: str, arch: str, options: Sequence[str]) -> bytes:
    arch = _normalize_arch(arch)
    opts = tuple(_BASE_OPTIONS) + tuple(options)
    key = _cache_key(kind, source, arch, opts)
    with _lock:
        if key in _memory_cache:
            return _memory_cache[key]
    path = cache_dir("nvrtc") / f"{key}.{kind}"
    if path.is_file():
        data = path.read_bytes()
        with _lock:
            _memory_cache[key] = data
        return data
    with progress(f"NVRTC: compiling a kernel for sm_{arch}"):
        data = _nvrtc_compile(kind, source, arch, opts)
    _write_atomic(path, data)
    with _lock:
        _memory_cache[key] = data
    return data


@contextlib.contextmanager
def _compiled_program(source: str, target: str, opts: Sequence[str]) -> Iterator[tuple[Any, str]]:
    """Compile `source` with NVRTC for `target` (a --gpu-architecture value) and `opts`; yields
    (program, log) and destroys the program after. CompileError with the log on failure."""
    nvrtc = _nvrtc()
    result, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"lowbit.cu", 0, [], [])
    _check_nvrtc(result, "nvrtcCreateProgram")
    try:
        args = [f"--gpu-architecture={target}".encode()] + [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(args), args)
        log = _program_log(prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC compilation for --gpu-architecture={target} failed", log)
        yield prog, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_compile(kind: str, source: str, arch: str, opts: Sequence[str]) -> bytes:
    nvrtc = _nvrtc()
    target = f"{'sm' if kind == 'cubin' else 'compute'}_{arch}"
    with _compiled_program(source, target, opts) as (prog, _):
        if kind == "cubin":
            result, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check_nvrtc(result, "nvrtcGetCUBINSize")
            buf = bytearray(size)
            (result,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            _check_nvrtc(result, "nvrtcGetCUBIN")
        else:
            result, size = nvrtc.nvrtcGetPTXSize(prog)
            _check_nvrtc(result, "nvrtcGetPTXSize")
            buf = bytearray(size)
            (result,) = nvrtc.nvrtcGetPTX(prog, buf)
            _check_nvrtc(result, "nvrtcGetPTX")
        return bytes(buf)


def ptxas_report(source: str, arch: str, kernel: str) -> dict[str, int]:
    """{'registers', 'spill_bytes'} that ptxas reports for `kernel` of `source` on `arch`
    (an uncached compile with --ptxas-options=-v; needs no GPU). CompileError on failure."""
    opts = ("--ptxas-options=-v", *_BASE_OPTIONS)
    with _compiled_program(source, f"sm_{_normalize_arch(arch)}", opts) as (_, log):
        entry = log.split(f"Compiling entry function '{kernel}'")[-1]
    regs = re.search(r"Used (\d+) registers", entry)
    spill = re.search(r"(\d+) bytes spill stores", entry)
    return {"registers": int(regs.group(1)) if regs else -1,
            "spill_bytes": int(spill.group(1)) if spill else 0}


def _program_log(prog: Any) -> str:
    nvrtc = _nvrtc()
    result, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check_nvrtc(result, "nvrtcGetProgramLogSize")
    # NVRTC writes into the buffer: a bytes object would be mutated in place, and b" " * 1 is
    # the interpreter's shared one-byte b" ".
    buf = bytearray(size)
    (result,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    _check_nvrtc(result, "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0 ").decode(errors="replace")


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache directory only costs a recompile


def compile_cubin(source: str, arch: str = DEFAULT_ARCH, options: Sequence[str] = ()) -> bytes:
    """Compile CUDA C++ ``source`` to a cubin (SASS) for ``arch`` ('sm_90a', 'sm_80'). Cached."""
    return _compile("cubin", source, arch, options)


def compile_ptx(source: str, arch: str = DEFAULT_ARCH, options: Sequence[str] = ()) -> bytes:
    """Compile CUDA C++ ``source`` to PTX text (NUL-terminated bytes) for ``arch``. Cached."""
    return _compile("ptx", source, arch, options)


def device_arch(device: Any = None) -> str:
    """NVRTC arch of a CUDA device: 'sm_90a' on Hopper (wgmma needs the 'a'), else 'sm_XY'."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    suffix = "a" if (major, minor) == (9, 0) else ""
    return f"sm_{major}{minor}{suffix}"


def _ensure_context(device_index: int) -> None:
    """Make PyTorch's (primary) context of ``device_index`` current on this thread."""
    import torch

    driver = _driver()
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream()  # forces torch to create/activate the primary context
        result, ctx = driver.cuCtxGetCurrent()
        _check_cu(result, "cuCtxGetCurrent")
        if int(ctx) == 0:
            (result,) = driver.cuInit(0)
            _check_cu(result, "cuInit")
            result, dev = driver.cuDeviceGet(device_index)
            _check_cu(result, "cuDeviceGet")
            result, ctx = driver.cuDevicePrimaryCtxRetain(dev)
            _check_cu(result, "cuDevicePrimaryCtxRetain")
            (result,) = driver.cuCtxSetCurrent(ctx)
            _check_cu(result, "cuCtxSetCurrent")


def _c_arg(value: Any) -> ctypes._SimpleCData:
    import torch

    if isinstance(value, torch.Tensor):
        return ctypes.c_uint64(value.data_ptr())
    if value is None:
        return ctypes.c_uint64(0)
    if isinstance(value, (ctypes._SimpleCData, ctypes.Array, ctypes.Structure)):
        return value  # by value: a scalar, or raw bytes such as a 128-byte tensor map
    if isinstance(value, bool):
        return ctypes.c_int(int(value))
    if isinstance(value, int):
        if not -(2**31) <= value < 2**31:
            raise ValueError(f"int kernel argument {value} does not fit a C int; "
                             "pass ctypes.c_int64")
        return ctypes.c_int(value)
    if isinstance(value, float):
        return ctypes.c_float(value)
    raise TypeError(
        f"kernel argument of type {type(value).__name__} is not supported: "
        "pass torch.Tensor, int (C int), float (C float), a ctypes scalar, array or structure"
    )


def pack_args(args: Sequence[Any]) -> tuple[ctypes.Array, list]:
    """Build the ``void**`` kernel-parameter array; returns it and the objects it points into."""
    values = [_c_arg(a) for a in args]
    array = (ctypes.c_void_p * max(1, len(values)))()
    for i, v in enumerate(values):
        array[i] = ctypes.addressof(v)
    return array, values


def tensor_map_tiled(address: int, dims: Sequence[int], strides: Sequence[int],
                     box: Sequence[int], swizzle_bytes: int = 0) -> ctypes.Array:
    """A tiled tensor map (cuTensorMapEncodeTiled) of the uint8 tensor at device `address`:
    `dims` and `box` innermost first (elements = bytes), `strides` of dims 1.. in bytes,
    swizzle 0 / 32 / 64 / 128 bytes, zeros out of bounds; returned as the 128 bytes a kernel
    takes by value (a `__grid_constant__` parameter). Needs the CUDA driver."""
    driver = _driver()
    swizzles = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
    if swizzle_bytes not in swizzles:
        raise ValueError(f"swizzle_bytes must be one of {sorted(swizzles)}, got {swizzle_bytes}")
    if not len(dims) == len(box) == len(strides) + 1:
        raise ValueError(f"dims {dims}, box {box} and strides {strides} do not match: "
                         "one stride per dim past the first")
    swizzle = getattr(driver.CUtensorMapSwizzle,
                      f"CU_TENSOR_MAP_SWIZZLE_{swizzles[swizzle_bytes]}")
    result, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, len(dims), address,
        [driver.cuuint64_t(d) for d in dims], [driver.cuuint64_t(s) for s in strides],
        [driver.cuuint32_t(b) for b in box], [driver.cuuint32_t(1)] * len(dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    _check_cu(result, f"cuTensorMapEncodeTiled(dims={list(dims)}, box={list(box)})")
    return (ctypes.c_ubyte * 128).from_buffer_copy(ctypes.string_at(tmap.getPtr(), 128))


class CudaKernel:
    """One ``extern "C" __global__`` function of an NVRTC cubin, loaded lazily per device."""

    def __init__(self, cubin: bytes, name: str) -> None:
        self.cubin = cubin
        self.name = name
        self._functions: dict[int, Any] = {}
        self._modules: dict[int, Any] = {}
        self._max_dynamic_smem: dict[int, int] = {}

    def _function(self, device_index: int) -> Any:
        fn = self._functions.get(device_index)
        if fn is not None:
            return fn
        driver = _driver()
        _ensure_context(device_index)
        result, module = driver.cuModuleLoadData(self.cubin)
        _check_cu(result, f"cuModuleLoadData({self.name})")
        result, fn = driver.cuModuleGetFunction(module, self.name.encode())
        _check_cu(result, f"cuModuleGetFunction({self.name})")
        self._modules[device_index] = module
        self._functions[device_index] = fn
        return fn

    def _set_smem(self, fn: Any, device_index: int, shared_mem: int) -> None:
        if shared_mem <= 48 * 1024 or self._max_dynamic_smem.get(device_index, 0) >= shared_mem:
            return
        driver = _driver()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (result,) = driver.cuFuncSetAttribute(fn, attr, shared_mem)
        _check_cu(result, f"cuFuncSetAttribute(max dynamic smem {shared_mem}) for {self.name}")
        self._max_dynamic_smem[device_index] = shared_mem

    def max_active_blocks(self, block: int, shared_mem: int = 0, device: Any = None) -> int:
        """Resident blocks per SM for this block size and dynamic shared memory (occupancy)."""
        import torch

        device_index = torch.device("cuda" if device is None else device).index
        if device_index is None:
            device_index = torch.cuda.current_device()
        fn = self._function(device_index)
        self._set_smem(fn, device_index, shared_mem)
        driver = _driver()
        result, n = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block, shared_mem)
        _check_cu(result, f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")
        return int(n)

    def launch(
        self,
        grid: Sequence[int] | int,
        block: Sequence[int] | int,
        args: Sequence[Any],
        shared_mem: int = 0,
        device: Any = None,
        programmatic: bool = False,
    ) -> None:
        """Launch on PyTorch's current stream of ``device`` (default: first tensor arg's device).

        ``grid``/``block`` are 1 to 3 ints; ``shared_mem`` is dynamic shared memory in bytes (above
        48 KiB the function's limit is raised first). ``programmatic``: launch as a programmatic
        dependent of the previous kernel on the stream (``cuLaunchKernelEx`` with programmatic
        stream serialization, sm_90+; kept in CUDA-graph capture): the kernel may start before
        that kernel ends, so it must run ``griddepcontrol.wait`` before reading what it wrote.
        Launch errors raise ``CudaError``.
        """
        import torch

        if device is None:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        device_index = torch.device("cuda" if device is None else device).index
        if device_index is None:
            device_index = torch.cuda.current_device()
        g = _dim3(grid, "grid")
        b = _dim3(block, "block")
        fn = self._function(device_index)
        self._set_smem(fn, device_index, shared_mem)
        array, keep = pack_args(args)
        stream = torch.cuda.current_stream(device_index).cuda_stream
        driver = _driver()
        with torch.cuda.device(device_index):
            if programmatic:
                config = launch_config(g, b, shared_mem, stream, programmatic=True)
                (result,) = driver.cuLaunchKernelEx(config, fn, ctypes.addressof(array), 0)
            else:
                (result,) = driver.cuLaunchKernel(
                    fn, *g, *b, shared_mem, driver.CUstream(stream), ctypes.addressof(array), 0
                )
        del keep
        _check_cu(result, f"cuLaunchKernel({self.name}, grid={g}, block={b}, smem={shared_mem}"
                          f"{', programmatic' if programmatic else ''})")


def launch_config(grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                  stream: int, programmatic: bool = False) -> Any:
    """The ``CUlaunchConfig`` of a ``cuLaunchKernelEx`` launch on ``stream`` (a raw handle);
    ``programmatic``: with the programmatic-stream-serialization attribute (PDL)."""
    driver = _driver()
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_mem
    config.hStream = driver.CUstream(stream)
    attrs = []
    if programmatic:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def _dim3(value: Sequence[int] | int, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {value!r}")
    return (*dims, 1, 1)[:3]


_kernel_cache: dict[tuple[str, str, str, tuple[str, ...]], CudaKernel] = {}


def load_kernel(
    source: str, name: str, arch: str | None = None, options: Sequence[str] = ()
) -> CudaKernel:
    """Compile ``source`` (cached) for ``arch`` (default: current device's); return ``name``."""
    arch = arch or device_arch()
    key = (source, name, arch, tuple(options))
    kernel = _kernel_cache.get(key)
    if kernel is None:
        kernel = CudaKernel(compile_cubin(source, arch, options), name)
        _kernel_cache[key] = kernel
    return kernel
