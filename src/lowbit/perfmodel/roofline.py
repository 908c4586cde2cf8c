"""Roofline floors: max(ops / measured peak, bytes / measured bandwidth).

The peaks are a GPU's (`lowbit.core.hardware.GpuSpec`); `measure_bandwidth` re-measures the
copy bandwidth in a benchmark's own run.
"""

from __future__ import annotations

import torch

from ..core import Workload
from ..core.hardware import H100, GpuSpec
from ..core.validate import operand_shapes, out_storage, storage_dtype, storage_shape


def measure_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate in bytes/s (read + written) on the current GPU."""
    from ..kernels.timing import time_us

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), rep_ms=200)
    return nbytes / (us * 1e-6)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return _numel(shape) * torch.empty((), dtype=dtype).element_size()


def workload_bytes(wl: Workload) -> int:
    """Fewest bytes a kernel must move: each operand read once, the output written once."""
    xs, ws, _ = operand_shapes(wl)
    total = _nbytes(storage_shape(xs, wl.a, wl.a_layout), storage_dtype(wl.a, wl.a_layout))
    total += _nbytes(storage_shape(ws, wl.w, wl.w_layout), storage_dtype(wl.w, wl.w_layout))
    return total + _nbytes(*out_storage(wl))


def floor_us(ops: float, nbytes: float, peak_ops: float, bandwidth: float) -> float:
    """The roofline floor in microseconds."""
    return max(ops / peak_ops, nbytes / bandwidth) * 1e6


def workload_floor_us(wl: Workload, impl: str, peaks: GpuSpec = H100) -> float:
    """Floor of one workload on one implementation class: 'int8', 'bitserial', 'fp16'.

    Bit-serial work is p*q one-bit products per multiply-accumulate: 2*M*N*K*p*q bit-ops.
    fp16 moves 2 bytes per element of x, w and the output.
    """
    if impl == "bitserial":
        return floor_us(wl.ops * wl.w.bits * wl.a.bits, workload_bytes(wl), peaks.b1_and,
                        peaks.bandwidth)
    if impl == "int8":
        return floor_us(wl.ops, workload_bytes(wl), peaks.int8, peaks.bandwidth)
    if impl == "fp16":
        xs, ws, os_ = operand_shapes(wl)
        nb = 2 * sum(_numel(s) for s in (xs, ws, os_))
        return floor_us(wl.ops, nb, peaks.fp16, peaks.bandwidth)
    raise ValueError(f"impl must be 'int8', 'bitserial' or 'fp16', got {impl!r}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


__all__ = ["floor_us", "measure_bandwidth", "workload_bytes", "workload_floor_us"]
