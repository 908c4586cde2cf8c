"""The launch geometry a template reports for one (workload, config): `Geometry`, the implicit
GEMM view the performance model reads (`KernelTemplate.geometry`).

Every template says what one launch of its kernel is: the GEMM it computes (M x N x K), the
block tile, how many tiles and split-K slices, the reduction per main-loop step and the steps
per block, threads, pipeline stages, estimated shared memory and registers, and the
instruction class whose peak bounds its MMAs (`RATES`). Resources are estimates from the tile
sizes, as in APNN-TC and the thesis: the model needs their trend across configs, not the
compiler's exact count. A template that stages plain tiles of one implicit GEMM may report a
`LaunchShape` instead (its `launch_shape`), which `launch_geometry` turns into a Geometry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import ConvWorkload, Workload
from ..core.layout import Layout

#: the kinds of launch a Geometry describes (a feature of the learned model: append only)
FAMILIES = ("igemm", "tma_conv", "bitserial", "mma_conv", "generic", "fp16")
#: instruction classes whose peaks bound the MMAs (`lowbit.core.hardware.GpuSpec.rate`)
RATES = ("int8", "b1_and", "fp16", "int8_mma_sync", "int4_mma_sync")


@dataclass(frozen=True)
class Geometry:
    """Implicit-GEMM view of one launch. Sizes in elements of the reduction (bits for
    bit-serial planes), bytes for shared memory."""

    family: str          # FAMILIES
    rate: str            # instruction class whose peak bounds the MMAs (RATES)
    M: int               # GEMM rows (output pixels), columns (filters), reduction length
    N: int
    K: int
    block_m: int
    block_n: int
    padded_m: int        # rows the row tiles cover (pixel tiles overhang the image)
    tiles: int           # output tiles
    split: int           # blocks per output tile (split-K)
    k_step: int          # reduction elements per main-loop step
    k_steps: int         # main-loop steps per block
    threads: int
    stages: int
    smem_bytes: int
    regs_per_thread: int
    persistent: bool
    planes: int = 1      # bit-plane products per multiply-accumulate (bit-serial: p*q)
    a_bytes: float = 1.0  # bytes per staged operand element (bit-serial: 1/8 per plane)

    @property
    def blocks(self) -> int:
        """Work units: output tiles x split."""
        return self.tiles * self.split

    @property
    def padded_n(self) -> int:
        return math.ceil(self.N / self.block_n) * self.block_n


@dataclass(frozen=True)
class LaunchShape:
    """Implicit-GEMM tiling of one launch. Sizes in elements, smem in bytes."""

    M: int
    N: int
    K: int
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split_k: int
    operand_bits: int  # bits per stored operand element that the tiles stage

    @classmethod
    def of(cls, workload: Workload, fields: Mapping) -> LaunchShape:
        """A template's `launch_shape` fields, completed: M, N, K from the workload's GEMM,
        split_k 1, operand_bits the wider operand's bits."""
        m, n, k = workload.gemm_shape
        return cls(**{"M": m, "N": n, "K": k, "split_k": 1,
                      "operand_bits": max(workload.w.bits, workload.a.bits), **fields})

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def grid_blocks(self) -> int:
        return (math.ceil(self.M / self.block_m) * math.ceil(self.N / self.block_n)
                * self.split_k)

    @property
    def smem_bytes(self) -> int:
        """Staged A and B tiles: stages x (BM + BN) x BK x bits / 8."""
        return self.stages * (self.block_m + self.block_n) * self.block_k * self.operand_bits // 8

    @property
    def regs_per_thread(self) -> int:
        """int32 accumulators spread over the block's threads, plus ~40 for addressing,
        operands in flight and the epilogue (an estimate, not the compiler's count)."""
        return min(255, self.block_m * self.block_n // self.threads + 40)


def conv_taps(wl: Workload) -> tuple[int, int]:
    """(taps, channels) of the reduction: R*S and C for a conv, 1 and K for a GEMM."""
    if isinstance(wl, ConvWorkload):
        return wl.R * wl.S, wl.C
    return 1, wl.gemm_shape[2]


def launch_geometry(wl: Workload, s: LaunchShape) -> Geometry:
    """The geometry of a plain tiled launch (family "generic")."""
    taps, _ = conv_taps(wl)
    # the reduction per tap as the launch shape gives it (C, or C / groups padded to a grouped
    # template's tile span)
    steps = taps * math.ceil(s.K // taps / s.block_k)
    tiles = math.ceil(s.M / s.block_m) * math.ceil(s.N / s.block_n)
    bits = s.operand_bits
    rate = "b1_and" if bits < 8 and wl.a_layout is Layout.BITPLANE else "int8"
    return Geometry("generic", rate, s.M, s.N, s.K, s.block_m, s.block_n,
                    math.ceil(s.M / s.block_m) * s.block_m, tiles, s.split_k, s.block_k,
                    math.ceil(steps / s.split_k), s.threads, s.stages, s.smem_bytes,
                    s.regs_per_thread, False, 1, bits / 8)


__all__ = ["FAMILIES", "RATES", "Geometry", "LaunchShape", "conv_taps", "launch_geometry"]
