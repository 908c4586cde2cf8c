"""CUDA occupancy: resident blocks per SM from threads, registers and shared memory."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.hardware import H100, GpuSpec


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int  # 0: the block cannot launch at all
    warps_per_sm: int
    limiter: str  # "threads", "registers", "smem", "blocks" or "launch" (cannot launch)

    @property
    def fraction(self) -> float:
        """Resident warps over the SM's maximum (64 on Hopper)."""
        return self.warps_per_sm / 64


def occupancy(threads: int, regs_per_thread: int, smem_bytes: int,
              gpu: GpuSpec = H100) -> Occupancy:
    """Blocks of `threads` threads that fit on one SM at once (the CUDA occupancy calculator
    rules, registers allocated per warp in units of 256)."""
    warps = -(-threads // gpu.warp_size)
    if (threads > 1024 or regs_per_thread > gpu.max_regs_per_thread
            or smem_bytes > gpu.smem_per_block):
        return Occupancy(0, 0, "launch")
    regs_per_warp = -(-regs_per_thread * gpu.warp_size // gpu.reg_alloc_unit) * gpu.reg_alloc_unit
    limits = {
        "threads": gpu.max_threads_per_sm // (warps * gpu.warp_size),
        "registers": gpu.regs_per_sm // max(1, regs_per_warp * warps),
        "smem": gpu.smem_per_sm // smem_bytes if smem_bytes else gpu.max_blocks_per_sm,
        "blocks": gpu.max_blocks_per_sm,
    }
    limiter = min(limits, key=limits.__getitem__)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps, limiter if blocks else "launch")
