"""The mma.sync bit-serial families (sm_80 and newer): warp-level m16n8k256 b1 AND, operand
fragments loaded from cp.async stages.

- `cuda.bitserial_mma_sync` (bitserial_mma_sync.cu): one output tile per block, with the
  duplicate-aware halo load and split-K;
- `cuda.bitserial_mma_sync_persistent` (bitserial_mma_sync_persistent.cu): one wave of
  persistent blocks whose copy pipeline runs across tiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ...core.knobs import KnobDef, KnobTable
from ...core.space import Scalar
from . import bitserial_defaults as defaults
from .bitserial_family import (
    BitserialFamily,
    bitplane_words,
    copy_chunks,
    halo_slab,
    registers,
    row_indices,
    shared_memory,
    split_k,
    tile_waste,
    warp_tiles,
)
from .bitserial_shape import few_tiles, kernel_window, needs_rowsum, threshold_epilogue

TILES = (
    KnobDef("BM", (16, 32, 64, 128, 256), "block tile rows (output pixels)"),
    KnobDef("BN", (16, 32, 64, 128, 256), "block tile columns (output channels)"),
    KnobDef("WM", (16, 32, 64), "warp tile rows"),
    KnobDef("WN", (16, 32, 64), "warp tile columns"),
    KnobDef("KT", (1, 2, 4, 8), "k256 steps per pipeline stage"),
    KnobDef("STAGES", (2, 3, 4), "cp.async pipeline stages"),
)
ROWSUM = KnobDef(
    "ROWSUM", ("mma", "table"),
    "binary weights' activation row popcounts: 'mma' one more MMA per plane and k step "
    "against ones; 'table' a per-pixel popcount table of x (a small kernel first) summed over "
    "the valid taps in the epilogue", applies=needs_rowsum)
ROW_TABLE = KnobDef(
    "ROW_TABLE", (0, 1),
    "1: each row's output row and tap rectangle from a per-row table filled at bind (0: "
    "worked out from the row index in the epilogue)", requires={"ROWSUM": ("mma",)})
REQUANT = KnobDef(
    "REQUANT", ("multiply", "threshold"),
    "requantized 1-2 bit planes: 'multiply' in 64-bit fixed point; 'threshold' compares with "
    "per-column integer thresholds that fold in bias and ReLU", applies=threshold_epilogue)


class MmaSyncTemplate(BitserialFamily):
    """mma.sync bit-serial conv/GEMM, one output tile per block."""

    name = defaults.MMA_SYNC
    kind = "mma_sync"
    summary = "mma.sync m16n8k256 per warp, one output tile per block"
    entry = "bitserial_mma_sync.cu"
    kernels: ClassVar[Mapping[int, str]] = {0: "bitserial_kernel"}
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "mma_sync"}
    knobs = KnobTable(
        *TILES,
        KnobDef("HALO", (0, 1), "1: duplicate-aware load: the input rows of the block's output "
                "pixels plus halo copied once into shared memory, the im2col tiles gathered "
                "from there", applies=kernel_window),
        ROWSUM, ROW_TABLE,
        KnobDef("SPLIT_K", (1, 2, 4, 8), "blocks per output tile along the reduction "
                "(grid.z): each stores its partial sums, the tile's last to arrive adds them "
                "and runs the epilogue; for grids of few tiles with long reductions",
                applies=few_tiles),
        REQUANT)
    checks = (warp_tiles, halo_slab, row_indices, registers, shared_memory, copy_chunks,
              split_k, bitplane_words, tile_waste)


class MmaSyncPersistentTemplate(BitserialFamily):
    """mma.sync bit-serial conv/GEMM, persistent blocks pipelined across tiles."""

    name = defaults.MMA_SYNC_PERSISTENT
    kind = "mma_sync"
    summary = ("mma.sync m16n8k256 per warp, one wave of persistent blocks, the copies "
               "pipelined across tiles")
    entry = "bitserial_mma_sync_persistent.cu"
    kernels: ClassVar[Mapping[int, str]] = {1: "bitserial_persistent"}
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "mma_sync", "PERSIST": 1}
    knobs = KnobTable(*TILES, ROWSUM, ROW_TABLE, REQUANT)
    checks = (warp_tiles, row_indices, registers, shared_memory, copy_chunks, bitplane_words,
              tile_waste)


MMA_SYNC = MmaSyncTemplate()
MMA_SYNC_PERSISTENT = MmaSyncPersistentTemplate()
