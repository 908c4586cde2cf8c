"""APNN-TC's tile heuristic quantities and the analytic time model.

APNN-TC (Feng et al., SC'21) picks tile sizes by two numbers:
  Eq. 3  TLP = (M / BM) * (N / BN)      thread blocks that run concurrently (work parallelism)
  Eq. 4  CI  = 2 * BM * BN * BK / ((BM + BN) * BK) = 2 * BM * BN / (BM + BN)
         operations per operand element loaded into shared memory (compute intensity).
Larger tiles raise CI (fewer global loads per op) and lower TLP; a good tile keeps
TLP >= the number of SMs (at least one full wave) while maximising CI.

`estimate` is the analytic time model on a `Geometry` (any template family, `geometry.py`):

  t = overhead + max(compute, dram, l2) + waves x steps x step latency

  compute  the busiest SM's blocks (ceil(blocks / SMs), blocks sharing an SM share its MMA
           rate) x the padded tile's MMA work / (peak / SMs), at the rate of the instruction
           class (int8 wgmma, b1 AND, fp16, mma.sync s8 / s4), times a per-class efficiency
  dram     the fewest bytes the layer must move (`roofline.workload_bytes`) / HBM bandwidth
  l2       the bytes the tiles stage (each A tile re-read per column tile, each B tile per row
           tile, split-K partials) / L2 bandwidth
  latency  a step of the main loop cannot take less than one pipelined load: short reductions
           and deep waves of small tiles are latency-bound (the thesis's "waves x per-wave
           time" model, `sampling.py`)

The constants (`AnalyticParams`) were fitted by least squares on log time over the recorded H100
measurements (`benchmarks/perfmodel.py --calibrate`); the learned model corrects the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import Workload
from ..core.hardware import H100, GpuSpec
from ..kernels.geometry import Geometry, LaunchShape
from .launch import launch_shape
from .occupancy import Occupancy, occupancy
from .roofline import workload_bytes


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


# Order-of-magnitude H100 rates for the estimate only (the measured ones: docs/design.md,
# section 5, "Hardware facts").
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


@dataclass(frozen=True)
class AnalyticParams:
    """Constants of `estimate` (module doc). Times in microseconds, events timing."""

    overhead_us: float = 13.4        # launch + event pair + prologue / epilogue of one block
    step_us: float = 0.197           # fewest microseconds per main-loop step per wave
    l2_bytes_per_s: float = 18.5e12  # L2 -> SM bandwidth for the staged tiles
    efficiency: tuple[tuple[str, float], ...] = (
        ("b1_and", 0.95), ("fp16", 0.8), ("int4_mma_sync", 0.12), ("int8", 0.51),
        ("int8_mma_sync", 0.165))

    def eff(self, rate: str) -> float:
        return dict(self.efficiency).get(rate, 0.5)


DEFAULT_PARAMS = AnalyticParams()
#: families whose resource figures are rough estimates (the template's own constraints decide
#: what launches): never ruled out by them
ESTIMATED_RESOURCES = ("bitserial", "mma_conv")


@dataclass(frozen=True)
class Estimate:
    """The terms of `estimate` for one launch (microseconds unless named otherwise)."""

    occ: Occupancy
    waves: float          # blocks / resident slots (fractional)
    full_waves: int       # ceil(waves)
    blocks_per_sm: int    # ceil(blocks / SMs): the busiest SM's blocks
    compute_us: float
    dram_us: float
    l2_us: float
    latency_us: float
    total_us: float


def estimate(geom: Geometry, workload: Workload, gpu: GpuSpec = H100,
             params: AnalyticParams = DEFAULT_PARAMS) -> Estimate:
    """Analytic time of the launch `geom` of `workload` on `gpu` (module doc). A launch whose
    estimated resources cannot fit one block on an SM gets total_us = inf, except in the CUDA
    families (`ESTIMATED_RESOURCES`), whose register and shared-memory figures are rough
    and whose templates admit only configs that launch: those count one block per SM."""
    occ = occupancy(geom.threads, geom.regs_per_thread, geom.smem_bytes, gpu)
    per_sm = max(occ.blocks_per_sm, 1)
    blocks = geom.blocks
    slots = gpu.sms * per_sm
    waves = blocks / slots
    full = math.ceil(waves)
    busiest = math.ceil(blocks / gpu.sms)
    tile_ops = 2.0 * geom.block_m * geom.block_n * geom.k_step * geom.k_steps * geom.planes
    sm_rate = gpu.rate(geom.rate) * params.eff(geom.rate) / gpu.sms
    compute = busiest * tile_ops / sm_rate * 1e6
    dram = workload_bytes(workload) / gpu.bandwidth * 1e6 if geom.family != "fp16" else (
        2.0 * _fp16_elems(workload) / gpu.bandwidth * 1e6)
    staged = blocks * geom.k_steps * geom.k_step * (geom.block_m + geom.block_n) * geom.a_bytes
    if geom.rate == "b1_and":
        staged *= max(1, geom.planes)
    l2 = staged / params.l2_bytes_per_s * 1e6
    latency = full * geom.k_steps * params.step_us
    total = params.overhead_us + max(compute, dram, l2) + latency
    if occ.blocks_per_sm == 0 and geom.family not in ESTIMATED_RESOURCES:
        total = float("inf")
    return Estimate(occ, waves, full, busiest, compute, dram, l2, latency, total)


def _fp16_elems(wl: Workload) -> int:
    """Elements of x, w and the output (each moved once in fp16)."""
    from ..core.validate import operand_shapes

    return sum(math.prod(s) for s in operand_shapes(wl))
