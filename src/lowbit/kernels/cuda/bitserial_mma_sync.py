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

from ...core.knobs import KnobTable
from ...core.space import Scalar
from . import bitserial_defaults as defaults
from . import bitserial_knobs as K
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

TILES = (K.BM, K.BN, K.WM, K.WN, K.KT,
         K.STAGES.but(values=(2, 3, 4), doc="cp.async pipeline stages"))
ROWSUM = K.ROWSUM.but(
    values=("mma", "table"),
    doc="binary weights' activation row popcounts: 'mma' one more MMA per plane and k step "
        "against ones; 'table' a per-pixel popcount table of x (a small kernel first) summed "
        "over the valid taps in the epilogue")
ROW_TABLE = K.ROW_TABLE.but(requires={"ROWSUM": ("mma",)})


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
        K.HALO.but(doc="1: duplicate-aware load: the input rows of the block's output pixels "
                   "plus halo copied once into shared memory, the im2col tiles gathered from "
                   "there"),
        ROWSUM, ROW_TABLE, K.SPLIT_K, K.REQUANT)
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
    knobs = KnobTable(*TILES, ROWSUM, ROW_TABLE, K.REQUANT)
    checks = (warp_tiles, row_indices, registers, shared_memory, copy_chunks, bitplane_words,
              tile_waste)


MMA_SYNC = MmaSyncTemplate()
MMA_SYNC_PERSISTENT = MmaSyncPersistentTemplate()
