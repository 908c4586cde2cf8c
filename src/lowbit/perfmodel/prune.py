"""Prune launch shapes before measuring (Dao's thesis: workload, coalescing, occupancy).

A config is pruned when the model is sure it is not worth a measurement:
  - it cannot launch (shared memory, registers or threads over the per-block limits);
  - a tile is more than twice the padded problem in M or N (mostly padding work), unless it
    is the smallest tile the space offers for that dimension;
  - the K tile staged per step is narrower than one 16-byte vector (uncoalesced loads).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core import ConfigSpace, Workload
from .analytic import analyze
from .hardware import H100, GpuSpec


def prune_reason(workload: Workload, config: Mapping, template: object = None,
                 gpu: GpuSpec = H100, min_tiles: tuple[int, int] = (0, 0)) -> str | None:
    """None to keep `config`, else why the analytic model rules it out."""
    a = analyze(workload, config, template, gpu)
    s = a.shape
    if a.occ.blocks_per_sm == 0:
        return (f"cannot launch: {s.threads} threads, ~{s.regs_per_thread} regs/thread, "
                f"{s.smem_bytes} B smem")
    for dim, tile, size, smallest in (("M", s.block_m, s.M, min_tiles[0]),
                                      ("N", s.block_n, s.N, min_tiles[1])):
        if tile > smallest and tile >= 2 * max(size, 16):
            return f"tile {dim}={tile} is over twice the problem's {dim}={size}"
    if s.block_k * s.operand_bits < 128:
        return f"K tile of {s.block_k} x {s.operand_bits} bits is under one 16-byte load"
    return None


def pruned_space(space: ConfigSpace, workload: Workload, template: object = None,
                 gpu: GpuSpec = H100) -> ConfigSpace:
    """`space` plus the prune rule as a constraint. Falls back to `space` itself when the
    rule would leave nothing."""
    configs = space.all_configs()
    if not configs:
        return space
    shapes = [analyze(workload, c, template, gpu).shape for c in configs]
    min_tiles = (min(s.block_m for s in shapes), min(s.block_n for s in shapes))

    def rule(c: Mapping) -> str | None:
        return prune_reason(workload, c, template, gpu, min_tiles)

    out = ConfigSpace(space.knobs, (*space.constraints, rule))
    return out if out.all_configs() else space
