"""Roofline floors: max(ops / measured peak, bytes / measured bandwidth).

Peaks are the rates measured on an H100 80GB HBM3 (docs/design.md, section 5, "Hardware facts");
`measure_bandwidth` re-measures the copy bandwidth in the benchmark's own run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core import Workload
from ..core.validate import operand_shapes, out_storage, storage_dtype, storage_shape


@dataclass(frozen=True)
class Peaks:
    """Measured rates: ops/s per instruction class, bytes/s of device memory (read + write)."""

    b1_and: float = 10_279e12   # mma.sync m16n8k256 b1 .and.popc, bit-ops/s
    int8: float = 1_158e12      # Triton tl.dot int8 (wgmma s8), ops/s
    int8_mma_sync: float = 1_280e12
    int4_mma_sync: float = 47e12  # emulated on Hopper
    fp16: float = 708e12        # dense half-precision matmul (bf16 8192^3 measured)
    bandwidth: float = 3.0e12   # device-to-device copy, bytes read + written per second


H100 = Peaks()
# H200: same SMs and clocks, faster HBM3e (4.3 TB/s copy measured on this workplace's H200s)
H200 = replace(H100, bandwidth=4.3e12)


def peaks_for(gpu_name: str) -> Peaks:
    """Best-known peaks for a GPU by name (H100 figures for unknown Hopper parts)."""
    return H200 if "H200" in gpu_name.upper() else H100


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


def workload_floor_us(wl: Workload, impl: str, peaks: Peaks = H100) -> float:
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


__all__ = ["H100", "H200", "Peaks", "floor_us", "measure_bandwidth",
           "peaks_for", "workload_bytes", "workload_floor_us"]
