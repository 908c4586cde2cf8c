"""The wgmma bit-serial families (sm_90a): Hopper warpgroup m64nNk256 b1 AND reading both
operands from shared memory through descriptors (WM = 64 rows per warpgroup, N = w_bits * WN).

- `cuda.bitserial_wgmma` (bitserial_wgmma.cu): one output tile per block; the A tiles gathered
  into the stages (from global memory, or from the block's halo), or read in place from a pixel
  tile's input window (A_IN_HALO, with BULK_WEIGHTS, TMA_HALO, PLANE_ROWS), the k tiles
  optionally split over warpgroup sets (SLICES); and its small-grid defaults;
- `cuda.bitserial_wgmma_persistent` (bitserial_wgmma_persistent.cu): persistent blocks, one or
  two teams of warpgroups (TEAMS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from ...core import Config, ConfigSpace, Workload
from ...core.hardware import TARGET
from ...core.knobs import KnobTable
from ...core.space import Scalar
from . import bitserial_defaults as defaults
from . import bitserial_knobs as K
from .bitserial_family import (
    WGMMA_N,
    BitserialFamily,
    bitplane_words,
    copy_chunks,
    halo_slab,
    k_slices,
    registers,
    row_indices,
    shared_memory,
    tile_waste,
    warp_tiles,
    wgmma_n,
)
from .bitserial_layout import ONES_ROWS, RESIDENT_STAGES, acc_planes, k_tiles, threads, tile_grid
from .bitserial_shape import (
    WGMMA_ARCH,
    conv_shape,
    planes,
)

TILES = (K.BM.but(values=(64, 128, 192, 256),
                 doc="block tile rows: 64 per warpgroup (192: three warpgroups, a row tile "
                     "count between those of 128 and 256)"),
         K.BN, K.WGMMA_WN, K.KT)


def ones_columns(wl: Workload, c: Mapping) -> str | None:
    if c["ROWSUM"] != "cols":
        return None
    if c["BN"] != c["WN"]:
        return "ROWSUM='cols' needs one warpgroup in N (BN = WN)"
    n = planes(wl)[1] * c["WN"] + ONES_ROWS
    return None if n in WGMMA_N else f"wgmma N = WN + {ONES_ROWS} = {n} is not a valid wgmma N"


def in_place_slabs(wl: Workload, c: Mapping) -> str | None:
    slabs = conv_shape(wl).k_words // 8
    if c["A_IN_HALO"] and slabs % c["KT"]:
        return f"A_IN_HALO=1 needs KT to divide the {slabs} k slabs"
    return None


def bulk_resident(wl: Workload, c: Mapping) -> str | None:
    if c["BULK_WEIGHTS"] and k_tiles(wl, c) > c["STAGES"] - 2:
        return (f"BULK_WEIGHTS=1 keeps every k tile resident: {k_tiles(wl, c)} k tiles need "
                f"STAGES >= {k_tiles(wl, c) + 2}")
    return None


def tma_blocks(wl: Workload, c: Mapping) -> str | None:
    if c["TMA_HALO"] and conv_shape(wl).words * 4 % c["TMA_HALO"]:
        return (f"TMA_HALO={c['TMA_HALO']} needs channels a multiple of {8 * c['TMA_HALO']} "
                "(whole channel blocks)")
    return None


def persistent_spill(wl: Workload, c: Mapping) -> str | None:
    # NVRTC 13 (sm_90a), the epilogue living inside the tile loop: m64n256 blocks spill 870 B;
    # 4-warpgroup blocks (capped at 128 registers per thread; two teams of two warpgroups too)
    # spill 488 B with 128 accumulator registers (two m64n128 planes) and none with 64
    n = planes(wl)[1] * c["WN"]
    if c["PERSIST"] and (n > 128 or (threads(c) > 256 and acc_planes(wl, c) * n > 128)):
        return ("persistent wgmma blocks spill beyond N = 128 per wgmma, or beyond one "
                "m64n128 accumulator per thread with more than 2 warpgroups")
    return None


class WgmmaTemplate(BitserialFamily):
    """wgmma bit-serial conv/GEMM, one output tile per block."""

    name = defaults.WGMMA
    kind = "wgmma"
    archs = (WGMMA_ARCH,)
    summary = "wgmma m64nNk256 per warpgroup, one output tile per block"
    entry = "bitserial_wgmma.cu"
    kernels: ClassVar[Mapping[int, str]] = {0: "bitserial_wgmma"}
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "wgmma", "WM": 64}
    knobs = KnobTable(
        *TILES, K.HALO, K.A_IN_HALO, K.WGMMA_STAGES, K.BULK_WEIGHTS, K.TMA_HALO, K.PLANE_ROWS,
        K.SLICES, K.FUSE_PLANES.but(requires={"PLANE_ROWS": (0,)}),
        K.ROWSUM.but(value_requires={"table": {"A_IN_HALO": (0,)},
                                     "cols": {"BULK_WEIGHTS": (0,), "PLANE_ROWS": (0,),
                                              "FUSE_PLANES": (0,)}}),
        K.ROW_TABLE.but(requires={"A_IN_HALO": (0,), "ROWSUM": ("mma", "cols")}),
        K.REQUANT, K.THR_PAIRS, K.SWIZZLE)
    checks = (warp_tiles, wgmma_n, in_place_slabs, bulk_resident, tma_blocks,
              halo_slab, ones_columns, row_indices, k_slices, registers, shared_memory,
              copy_chunks, bitplane_words, tile_waste)

    def refine_default(self, workload: Workload, config: Config, space: ConfigSpace
                       ) -> Config:
        return self.config_of(small_grid_default(workload, self.spec(config), space))


class WgmmaPersistentTemplate(BitserialFamily):
    """wgmma bit-serial conv/GEMM, persistent blocks of one or two teams."""

    name = defaults.WGMMA_PERSISTENT
    kind = "wgmma"
    archs = (WGMMA_ARCH,)
    summary = ("wgmma m64nNk256 per warpgroup, persistent blocks (one or two teams of "
               "warpgroups), the copies pipelined across tiles")
    entry = "bitserial_wgmma_persistent.cu"
    kernels: ClassVar[Mapping[int, str]] = {1: "bitserial_wgmma_persistent"}
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "wgmma", "WM": 64, "PERSIST": 1}
    knobs = KnobTable(
        *TILES, K.STAGES, K.TEAMS, K.FUSE_PLANES,
        K.ROWSUM.but(value_requires={"cols": {"FUSE_PLANES": (0,)}}), K.ROW_TABLE,
        K.REQUANT, K.THR_PAIRS, K.SWIZZLE)
    checks = (warp_tiles, wgmma_n, persistent_spill, ones_columns, row_indices, registers,
              shared_memory, copy_chunks, bitplane_words, tile_waste)


WGMMA = WgmmaTemplate()
WGMMA_PERSISTENT = WgmmaPersistentTemplate()

# Small grids with long reductions (under half a wave of tiles, at least SMALL_GRID_K_TILES k
# tiles): one-warpgroup 64-row blocks, the widest BN of 64 or 32 that still makes half a wave;
# where A_IN_HALO applies with every k tile resident, that (for two activation planes 64 wide
# with bulk weight copies); else the k tiles in two slices, and on convs the halo load with
# KT=2. Measured on an H100: the APNN-TC conv 5.7 (w1a1) and 7.6 us (w1a2) against 15.9 and
# 13.8 for the preferred default, fc_b128 4.4 and 5.3 against 7.6 and 7.3; with 4 k tiles
# (fc_b64) the preferred 64 x 64 default stays (2.2 against 2.6). In place with every k tile
# resident: the APNN-TC conv w1a2 5.4 us, w1a1 4.2, against 7.6 and 5.7 sliced; 64 wide with
# bulk weights, w1a2 5.07 us against 5.46 (w1a1 slower so: 4.6 against 3.8).
SMALL_GRID_K_TILES = 8


def small_grid_default(wl: Workload, spec: Config, space: ConfigSpace) -> Config:
    """A default's full parameters `spec` (of any wgmma family), or, where the grid is small
    and the reduction long, the one-tile wgmma's small-grid default built from it (a
    `WGMMA` spec, valid in `space`, that family's space for `wl`)."""
    if (math.prod(tile_grid(wl, spec)) >= TARGET.sms // 2
            or k_tiles(wl, spec.replace(KT=1)) < SMALL_GRID_K_TILES):
        return spec

    def valid(candidate: Config) -> bool:
        return WGMMA.owns(candidate) and space.is_valid(WGMMA.config_of(candidate))

    def in_place(bn: int, kt: int, bulk: int) -> Config:  # A_IN_HALO, every k tile resident
        return spec.replace(BM=64, BN=bn, WM=64, WN=bn, KT=kt, STAGES=RESIDENT_STAGES, HALO=1,
                            A_IN_HALO=1, BULK_WEIGHTS=bulk, SLICES=1, PERSIST=0, TAP_SHIFT=0,
                            TEAMS=1, ROW_TABLE=0, ROWSUM="mma", THR_PAIRS=0)

    if planes(wl)[0] >= 2:  # two activation planes: 64-wide in-place blocks, bulk weights
        for kt in (4, 2):
            if valid(bulk := in_place(64, kt, 1)):
                return bulk
    for bn in (64, 32):
        for kt in (4, 2):
            resident = in_place(bn, kt, 0)
            if (valid(resident) and k_tiles(wl, resident) <= RESIDENT_STAGES - 2
                    and (bn == 32 or math.prod(tile_grid(wl, resident)) >= TARGET.sms // 2)):
                return resident
        for halo in (1, 0):
            small = spec.replace(BM=64, BN=bn, WM=64, WN=bn, KT=2 if halo else 1, STAGES=4,
                                 HALO=halo, SLICES=2, PERSIST=0, TAP_SHIFT=0, TEAMS=1,
                                 ROW_TABLE=0, ROWSUM="mma")
            if not valid(small):  # THR_PAIRS needs WN >= 64
                small = small.replace(THR_PAIRS=0)
            if valid(small) and (bn == 32 or math.prod(tile_grid(wl, small)) >= TARGET.sms // 2):
                return small
    return spec
