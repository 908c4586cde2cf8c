"""Launch shape of a (workload, config): tiles, warps, stages, grid, estimated resources.

Templates name their knobs freely; this module reads the common names (BLOCK_M / block_m /
BM ..., num_warps, num_stages, or the Choi et al. warp-tiling knobs) and a template may
override everything by defining `launch_shape(workload, config) -> dict` with the fields
of `LaunchShape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import Workload

_ALIASES = {
    "block_m": ("BLOCK_M", "block_m", "BM", "tile_m", "TILE_M"),
    "block_n": ("BLOCK_N", "block_n", "BN", "tile_n", "TILE_N"),
    "block_k": ("BLOCK_K", "block_k", "BK", "tile_k", "TILE_K", "chunk_k"),
    "warps": ("num_warps", "warps", "WARPS", "NUM_WARPS"),
    "stages": ("num_stages", "stages", "STAGES", "NUM_STAGES"),
    "split_k": ("SPLIT_K", "split_k"),
}


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


def _pick(config: Mapping, field: str, default: int) -> int:
    for name in _ALIASES[field]:
        if name in config:
            return int(config[name])
    return default


def launch_shape(workload: Workload, config: Mapping, template: object = None) -> LaunchShape:
    """The launch shape of `config` for `workload` (see module doc for the knob names)."""
    m, n, k = workload.gemm_shape
    bits = max(workload.w.bits, workload.a.bits)
    if template is not None and hasattr(template, "launch_shape"):
        d = dict(template.launch_shape(workload, config))
        d.setdefault("M", m)
        d.setdefault("N", n)
        d.setdefault("K", k)
        d.setdefault("split_k", 1)
        d.setdefault("operand_bits", bits)
        return LaunchShape(**d)
    if "block_row_warps" in config:  # Choi et al. / TVM tensor-core tiling
        wm, wn = int(config["block_row_warps"]), int(config["block_col_warps"])
        tm = int(config.get("warp_row_tiles", 1)) * 16
        tn = int(config.get("warp_col_tiles", 1)) * 16
        bk = int(config.get("chunk", 1)) * 16
        return LaunchShape(m, n, k, wm * tm, wn * tn, bk, wm * wn,
                           _pick(config, "stages", 1), 1, bits)
    return LaunchShape(
        M=m, N=n, K=k,
        block_m=_pick(config, "block_m", 64), block_n=_pick(config, "block_n", 64),
        block_k=_pick(config, "block_k", 32), warps=_pick(config, "warps", 4),
        stages=_pick(config, "stages", 2), split_k=_pick(config, "split_k", 1),
        operand_bits=8 if bits > 4 else bits,
    )
