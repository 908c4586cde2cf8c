"""The untuned bit-serial kernels: preferred configs per family, best first, and the rule that
picks the first that fits a workload.

`PREFERRED[mma]` is one list over the families of an MMA kind ("mma_sync" on every arch,
"wgmma" on sm_90a), in the order the measurements ranked them (BENCHMARKS.md, "Bit-serial
defaults"); a family's own preferred list is its entries of that list (the persistent families
take their one-tile sibling's). Each entry names its family's template and sets some of its
knobs (the others neutral); REQUANT is "threshold" wherever the output allows. A config is
picked where it is valid, keeps its accumulators in `ACC_LIMIT` registers, and its regime's
condition holds (`regime_fits`). `bitserial_families.default_bitserial` walks the whole list of
the arch's kind; a family's `default_config` its own entries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...core import Precision, Workload
from ...core.hardware import TARGET
from .bitserial_shape import conv_shape, planes

MMA_SYNC, MMA_SYNC_PERSISTENT = "cuda.bitserial_mma_sync", "cuda.bitserial_mma_sync_persistent"
WGMMA, WGMMA_PERSISTENT = "cuda.bitserial_wgmma", "cuda.bitserial_wgmma_persistent"
TAP_SHIFT = "cuda.bitserial_tap_shift"
#: the family whose preferred list a persistent family takes
PREFERRED_FROM = {MMA_SYNC_PERSISTENT: MMA_SYNC, WGMMA_PERSISTENT: WGMMA}
#: accumulator registers a default may keep per thread (wgmma: + the row sums of w1 x a1)
ACC_LIMIT = {"mma_sync": 128, "wgmma": 136}
# the tap-shift defaults' limit on output channels (the widths they were measured at); the
# two-team ones: 256, and only for two activation planes (a team's MMA phase long enough to
# hide the other's epilogue, NOTES.md "Tap-shift family")
TAP_SHIFT_DEFAULT_MAX_K = 128
TEAMS_DEFAULT_MAX_K = 256

# wgmma defaults use the 32-byte swizzle (up to 1.4x faster than core matrices: session v4 of
# docs/history/bitserial.md);
# the one-tile ones KT=1 with 6 stages
_SW = dict(SWIZZLE=32)
_TILE = dict(KT=1, STAGES=6, **_SW)
#: block ends (a residual read in the 32-bit epilogue) of two activation planes: 64 x 128
#: fused-plane tiles. ResNet-50 b256 w1a2 (bitserial_block_end_probe, H100, 2026-12-07):
#: 264 / 164 / 71 us on layer1-3 against 341 / 178 / 85 for the 192 x 256 tile, exact
BLOCK_END_TILE = dict(BM=64, BN=128, WN=128, KT=1, STAGES=4, FUSE_PLANES=1, **_SW)
#: the planes in one accumulator on 128-row tiles, for binary weights and two activation planes
#: (`regime_fits`):
#: ResNet-50's 1x1 convs of 64 / 128 output channels hold 79-100 registers, against 100-195
#: with an accumulator per plane (two blocks per SM instead of one)
FUSED_TILES = tuple(dict(BM=128, BN=bn, WN=bn, KT=1, STAGES=4, FUSE_PLANES=1, THR_PAIRS=pairs,
                         **_SW) for bn in (128, 64) for pairs in (1, 0))
FUSED_TILES_MAX_K = 128
PREFERRED: dict[str, list[tuple[str, dict]]] = {
    # APNN-TC-like: big warp tiles for small p*q, smaller for larger
    "mma_sync": [(MMA_SYNC, dict(BM=bm, BN=bn, WM=wm, WN=wn, KT=kt, STAGES=st))
                 for bm, bn, wm, wn, kt, st in [
                     (128, 128, 64, 32, 2, 3), (128, 64, 32, 32, 2, 3), (64, 64, 32, 32, 2, 3),
                     (64, 64, 16, 32, 2, 3), (32, 64, 16, 32, 2, 3), (32, 32, 16, 32, 2, 3),
                     (32, 32, 16, 16, 1, 2), (16, 32, 16, 32, 1, 2), (16, 16, 16, 16, 1, 2)]],
    "wgmma": [
        # w1a1 (one accumulator plane): 192 x 256 one-tile blocks, on grids of at least one
        # tile per SM, two columns' thresholds per add where the epilogue allows
        *((WGMMA, dict(BM=192, BN=256, WN=256, KT=1, STAGES=4, THR_PAIRS=pairs, **_SW))
          for pairs in (1, 0)),
        # two activation planes on convs of at most 256 output channels: persistent tap-shift
        # blocks of two teams; row sums from the slab for binary weights
        *((TAP_SHIFT, dict(BM=64, BN=128, WN=128, STAGES=3, PERSIST=1, TEAMS=2, ROW_TABLE=1,
                           ROWSUM=rowsum, THR_PAIRS=1, **_SW)) for rowsum in ("slab", "mma")),
        # block ends and stream-writing shortcuts of binary weights and unsigned two-bit
        # activations (`moves_stream_bytes`)
        (WGMMA, BLOCK_END_TILE),
        # unsigned two-bit activations: the planes in one accumulator, 192 x 256 blocks
        *((WGMMA, dict(BM=192, BN=256, WN=256, KT=1, STAGES=4, FUSE_PLANES=1,
                       THR_PAIRS=pairs, **_SW)) for pairs in (1, 0)),
        # persistent tap-shift blocks for convs of at most 128 output channels; ones columns
        # for the row sums of binary weights; at BN = 64 the slab copies' pixels from the table
        *((TAP_SHIFT, dict(BM=128, BN=bn, WN=bn, STAGES=3, PERSIST=1,
                           ROW_TABLE=1 if bn == 128 else 2, ROWSUM=rowsum, THR_PAIRS=pairs, **_SW))
          for bn in (128, 64) for rowsum in ("cols", "mma") for pairs in (1, 0)),
        # binary weights and unsigned two-bit activations where 192 x 256 does not fit (at
        # most 128 output channels, or grids under one tile per SM): `FUSED_TILES`
        *((WGMMA, tile) for tile in FUSED_TILES),
        # big N per instruction first; fewer warpgroups as p*q grows
        *((WGMMA, dict(BM=bm, BN=bn, WN=wn, **_TILE)) for bm, bn, wn in [
            (128, 256, 128), (128, 256, 256), (128, 128, 128), (128, 64, 64), (128, 64, 32),
            (64, 64, 32), (128, 32, 16), (64, 32, 16), (64, 32, 32), (64, 16, 16)]),
    ],
}


def preferred(family: str) -> list[dict]:
    """A family's preferred configs (its knobs only, REQUANT not set), best first."""
    name = PREFERRED_FROM.get(family, family)
    return [cfg for entries in PREFERRED.values() for fam, cfg in entries if fam == name]


def is_regime(family: str, config: Mapping) -> bool:
    """A regime default (tap-shift, fused planes, two columns' thresholds per add), which
    `plain` defaults leave out."""
    return family == TAP_SHIFT or bool(config.get("FUSE_PLANES") or config.get("THR_PAIRS"))


def moves_stream_bytes(wl: Workload) -> bool:
    """A 32-bit epilogue (`Epilogue.requant32`) that reads a residual (a block end) or stores
    8-bit values (a downsampling shortcut writing the narrow stream): byte-bound epilogues."""
    ep = wl.epilogue
    stores_bytes = ep.store_out and isinstance(ep.out, Precision) and ep.out.bits == 8
    return ep.requant32 and (ep.residual is not None or stores_bytes)


def sets_tile(spec: Mapping, tile: Mapping) -> bool:
    """Whether the parameters `spec` set every knob of the preferred entry `tile`."""
    return all(spec.get(k) == v for k, v in tile.items())


def regime_fits(wl: Workload, spec: Mapping, acc_regs: int) -> bool:
    """Whether a preferred config (full parameters `spec`, `acc_regs` accumulator registers)
    suits `wl`: accumulators within ACC_LIMIT; tap-shift defaults on convs of at most
    TAP_SHIFT_DEFAULT_MAX_K output channels (two teams: TEAMS_DEFAULT_MAX_K, two activation
    planes only); 192-row, tap-shift and FUSED_TILES blocks on grids of at least one tile per
    SM (where two blocks per SM can hide each other's epilogue);
    BLOCK_END_TILE on byte-bound epilogues of binary weights only (where it was measured),
    FUSED_TILES on binary weights, two activation planes and at most FUSED_TILES_MAX_K
    output channels only (where 192 x 256 tiles cannot serve)."""
    from .bitserial_layout import tile_grid

    if acc_regs > ACC_LIMIT[spec["MMA"]]:
        return False
    if sets_tile(spec, BLOCK_END_TILE) and not (
            moves_stream_bytes(wl) and wl.w.bits == 1):
        return False
    fused_tile = any(sets_tile(spec, tile) for tile in FUSED_TILES)
    if fused_tile and not (wl.w.bits == 1 and planes(wl)[0] == 2
                           and conv_shape(wl).kout <= FUSED_TILES_MAX_K):
        return False
    teams = spec["TEAMS"] > 1
    if spec["TAP_SHIFT"] and conv_shape(wl).kout > (
            TEAMS_DEFAULT_MAX_K if teams else TAP_SHIFT_DEFAULT_MAX_K):
        return False
    if teams and planes(wl)[0] < 2:
        return False
    return not ((spec["BM"] == 192 or spec["TAP_SHIFT"] or fused_tile)
                and math.prod(tile_grid(wl, spec)) < TARGET.sms)
