"""APNN-TC's tile heuristic quantities and a roofline-style time estimate.

APNN-TC (Feng et al., SC'21) picks tile sizes by two numbers:
  Eq. 3  TLP = (M / BM) * (N / BN)      thread blocks that run concurrently (work parallelism)
  Eq. 4  CI  = 2 * BM * BN * BK / ((BM + BN) * BK) = 2 * BM * BN / (BM + BN)
         operations per operand element loaded into shared memory (compute intensity).
Larger tiles raise CI (fewer global loads per op) and lower TLP; a good tile keeps
TLP >= the number of SMs (at least one full wave) while maximising CI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import Workload
from .hardware import H100, GpuSpec
from .launch import LaunchShape, launch_shape
from .occupancy import Occupancy, occupancy


@dataclass(frozen=True)
class Analysis:
    shape: LaunchShape
    occ: Occupancy
    tlp: float  # Eq. 3: thread blocks
    compute_intensity: float  # Eq. 4: ops per staged element
    waves: float  # grid blocks / (SMs x resident blocks per SM)
    wave_efficiency: float  # useful fraction of the last wave's slots, in (0, 1]
    padding_efficiency: float  # M*N / (padded M * padded N): work not wasted on tile edges
    global_bytes: float  # bytes the tiles read from global memory (A and B re-reads included)
    est_us: float  # crude max(compute, memory) estimate in microseconds

    def features(self) -> dict[str, float]:
        """Numeric features for the cost model."""
        s = self.shape
        return {
            "block_m": s.block_m, "block_n": s.block_n, "block_k": s.block_k,
            "warps": s.warps, "stages": s.stages, "split_k": s.split_k,
            "threads": s.threads, "grid_blocks": s.grid_blocks,
            "smem_kb": s.smem_bytes / 1024, "regs_per_thread": s.regs_per_thread,
            "blocks_per_sm": self.occ.blocks_per_sm, "occupancy": self.occ.fraction,
            "log2_tlp": math.log2(max(self.tlp, 1)), "compute_intensity": self.compute_intensity,
            "waves": self.waves, "wave_efficiency": self.wave_efficiency,
            "padding_efficiency": self.padding_efficiency,
            "log2_global_bytes": math.log2(max(self.global_bytes, 1)),
            "log2_est_us": math.log2(max(self.est_us, 1e-3)),
        }


# Order-of-magnitude H100 rates for the estimate only (DESIGN.md has the measured ones).
_INT8_OPS_PER_US = 1.1e6  # ~1,100 TOPS
_BYTES_PER_US = 3.0e6  # ~3 TB/s


def analyze(workload: Workload, config: Mapping, template: object = None,
            gpu: GpuSpec = H100) -> Analysis:
    """Launch shape, occupancy and the APNN-TC quantities of one (workload, config)."""
    s = launch_shape(workload, config, template)
    occ = occupancy(s.threads, s.regs_per_thread, s.smem_bytes, gpu)
    tlp = math.ceil(s.M / s.block_m) * math.ceil(s.N / s.block_n) * s.split_k
    ci = 2 * s.block_m * s.block_n / (s.block_m + s.block_n)
    slots = gpu.sms * max(occ.blocks_per_sm, 1)
    waves = s.grid_blocks / slots
    wave_eff = waves / math.ceil(waves)
    pm = math.ceil(s.M / s.block_m) * s.block_m
    pn = math.ceil(s.N / s.block_n) * s.block_n
    pad_eff = (s.M * s.N) / (pm * pn)
    elem = s.operand_bits / 8
    gbytes = elem * s.K * (pm * math.ceil(s.N / s.block_n) + pn * math.ceil(s.M / s.block_m))
    compute_us = 2 * pm * pn * s.K / _INT8_OPS_PER_US / max(wave_eff, 1e-3)
    est = max(compute_us, gbytes / _BYTES_PER_US)
    if occ.blocks_per_sm == 0:
        est = float("inf")
    return Analysis(s, occ, tlp, ci, waves, wave_eff, pad_eff, gbytes, est)
