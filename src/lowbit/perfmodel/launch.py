"""Launch shape of a (workload, config): tiles, warps, stages, grid, estimated resources
(`lowbit.kernels.geometry.LaunchShape`).

A template reports its own by defining `launch_shape(workload, config) -> dict` with the
fields of `LaunchShape`; for one that does not (a template from outside lowbit, a name no
registered template has), this module reads the knobs' common names (BLOCK_M / block_m / BM
..., num_warps, num_stages, or the Choi et al. warp-tiling knobs).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core import Workload
from ..kernels.geometry import LaunchShape

_ALIASES = {
    "block_m": ("BLOCK_M", "block_m", "BM", "tile_m", "TILE_M"),
    "block_n": ("BLOCK_N", "block_n", "BN", "tile_n", "TILE_N"),
    "block_k": ("BLOCK_K", "block_k", "BK", "tile_k", "TILE_K", "chunk_k"),
    "warps": ("num_warps", "warps", "WARPS", "NUM_WARPS"),
    "stages": ("num_stages", "stages", "STAGES", "NUM_STAGES"),
    "split_k": ("SPLIT_K", "split_k"),
}


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
        return LaunchShape.of(workload, template.launch_shape(workload, config))
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
