"""Prune launch shapes before measuring (Dao's thesis: workload, coalescing, occupancy).

`space_filters` applies the thesis's filters to a whole space of any template family (the
pruned tuner, `lowbit.tune.strategies.pruned`). The older per-config rule on `launch_shape`:
A config is pruned when the model is sure it is not worth a measurement:
  - it cannot launch (shared memory, registers or threads over the per-block limits);
  - a tile is more than twice the padded problem in M or N (mostly padding work), unless it
    is the smallest tile the space offers for that dimension;
  - the K tile staged per step is narrower than one 16-byte vector (uncoalesced loads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core import ConfigSpace, Workload
from ..core.hardware import H100, GpuSpec
from .analytic import ESTIMATED_RESOURCES, analyze
from .geometry import geometry
from .occupancy import occupancy


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


# ----------------------------------------------------------------------------- thesis filters

def space_filters(template: object, workload: Workload, configs: Sequence[Mapping],
                  gpu: GpuSpec = H100) -> list[str | None]:
    """The thesis's filters (ch. 3) over a whole space, on each config's `Geometry`: None to
    keep a config, else the reason it is filtered.

      launch       the block cannot be resident at all (threads, registers, shared memory;
                   families whose resources are only estimated are left to the template's
                   own constraints, `analytic.ESTIMATED_RESOURCES`)
      fit          a block tile over twice the problem in M or N (mostly padding), unless no
                   config of the space has a smaller tile in that dimension
      coalescing   a K step under one 16-byte vector per row (Triton families; the bit-serial
                   k step is 32 bytes or more)
      concurrency  the grid leaves over three quarters of the SMs idle while some config of
                   the space fills them all (work units >= SMs)
    """
    geoms = [geometry(template, workload, c) for c in configs]
    if not geoms:
        return []
    min_m = min(g.block_m for g in geoms)
    min_n = min(g.block_n for g in geoms)
    fills = any(g.blocks >= gpu.sms for g in geoms)
    out: list[str | None] = []
    for g in geoms:
        occ = occupancy(g.threads, g.regs_per_thread, g.smem_bytes, gpu)
        if occ.blocks_per_sm == 0 and g.family not in ESTIMATED_RESOURCES:
            out.append(f"launch: {g.threads} threads, ~{g.regs_per_thread} regs, "
                       f"{g.smem_bytes} B smem")
        elif g.block_m > min_m and g.block_m >= 2 * max(g.M, 16):
            out.append(f"fit: tile M={g.block_m} over twice M={g.M}")
        elif g.block_n > min_n and g.block_n >= 2 * max(g.N, 16):
            out.append(f"fit: tile N={g.block_n} over twice N={g.N}")
        elif g.family in ("igemm", "tma_conv") and g.k_step * g.a_bytes < 16:
            out.append(f"coalescing: K step of {g.k_step * g.a_bytes:g} B under 16 B")
        elif fills and g.blocks * 4 < gpu.sms:
            out.append(f"concurrency: {g.blocks} blocks on {gpu.sms} SMs")
        else:
            out.append(None)
    return out
