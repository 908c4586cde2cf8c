"""Geometry and resources of one bit-serial kernel: its grid, threads, shared memory and
accumulator registers, from the workload and the kernel's parameters.

`spec` below is a kernel's full parameter set (`bitserial_family.KernelSpec` keys: the knobs
of every family, each family fixing the ones it does not tune), the vocabulary the .cu files
are written in. The families' constraints and the launcher read these functions; the kernels
compute the same quantities as constexprs (bitserial_common.cu and the kernel files).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...core import Layout, Workload
from .bitserial_shape import (
    conv_shape,
    halo_rows,
    needs_rowsum,
    needs_wtap,
    planes,
    rect_slots,
    threshold_stride,
)
from .tap_shift import group_words, shift_plan

# STAGES for A_IN_HALO's weight-only stages: every k tile of a 3 x 3 conv on 1,024 channels at
# KT = 4 (9 k tiles) resident, none refilled (bitserial_wgmma.cu, RESIDENT_STAGES)
RESIDENT_STAGES = 12
# ROWSUM="cols": B rows after each k slab's weight rows, 8 of ones and 8 of zeros (wgmma N
# above 32 is a multiple of 16); bitserial_common.cu's ONES_ROWS
ONES_ROWS = 16
THR_SMEM_BYTES = 16384  # most shared memory a block's threshold slots may take


def wgmma(spec: Mapping) -> bool:
    return spec["MMA"] == "wgmma"


def tap_shift(spec: Mapping) -> bool:
    """The conv runs as shifted views of one input slab per block (`tap_shift.py`)."""
    return bool(spec["TAP_SHIFT"])


def uses_thresholds(spec: Mapping) -> bool:
    """The kernel requantizes by thresholds (REQUANT="threshold")."""
    return spec["REQUANT"] == "threshold"


def rowsum_table(spec: Mapping) -> bool:
    return spec["ROWSUM"] == "table"


def rowsum_slab(spec: Mapping) -> bool:
    return spec["ROWSUM"] == "slab"


def rowsum_cols(spec: Mapping) -> bool:
    return spec["ROWSUM"] == "cols"


def rowsum_mma(wl: Workload, spec: Mapping) -> bool:
    """Binary weights' row popcounts by an MMA against a tile of ones (ROWSUM="mma")."""
    return needs_rowsum(wl) and spec["ROWSUM"] == "mma"


def acc_planes(wl: Workload, spec: Mapping) -> int:
    """Activation planes with accumulators of their own: a_bits, 1 with FUSE_PLANES."""
    return 1 if spec["FUSE_PLANES"] else planes(wl)[0]


def slab_buffers(spec: Mapping) -> int:
    """Input slabs a tap-shift block keeps (rendered as SLAB_BUFFERS): persistent blocks 3
    (the slab two tiles ahead loads into the one the previous tile released), else 1."""
    return 3 if spec["PERSIST"] else 1


def tile_threads(spec: Mapping) -> int:
    """Threads that work one tile (a team's, with TEAMS > 1): a warp per WM x WN warp tile,
    a warpgroup for wgmma."""
    per_tile = 128 if wgmma(spec) else 32
    return (spec["BM"] // spec["WM"]) * (spec["BN"] // spec["WN"]) * per_tile


def threads(spec: Mapping) -> int:
    """Threads per block: the tile's, per team or k slice."""
    return tile_threads(spec) * spec["TEAMS"] * spec["SLICES"]


def tile_rows(spec: Mapping) -> int:
    """A_IN_HALO: output pixel rows of a block tile (8 pixels each): BM / 8, or BM / 16 with
    PLANE_ROWS."""
    return spec["BM"] // 8 // (2 if spec["PLANE_ROWS"] else 1)


def window_shape(wl: Workload, spec: Mapping) -> tuple[int, int]:
    """A_IN_HALO: the pixel tile's input window, (tile rows + R - 1) x (8 + S - 1) pixels (the
    kernels' HALO_H x HALO_W)."""
    sh = conv_shape(wl)
    return tile_rows(spec) + sh.r - 1, 8 + sh.s - 1


def pixel_tiles(wl: Workload, spec: Mapping) -> tuple[int, int]:
    """(tiles down, tiles across) of an A_IN_HALO block grid per image: BM / 8 x 8 output
    pixels per tile; (1, 1) without A_IN_HALO (rendered as TILES_Y, TILES_X)."""
    if not spec["A_IN_HALO"]:
        return 1, 1
    sh = conv_shape(wl)
    return -(-sh.p // tile_rows(spec)), -(-sh.q // 8)


def block_rows(wl: Workload, spec: Mapping) -> int:
    """Rows the block tiles cover: the output rows, the tap-shift grid's virtual rows, or
    A_IN_HALO's pixel tiles (BM rows each, margins included)."""
    sh = conv_shape(wl)
    if tap_shift(spec):
        return shift_plan(sh, spec["BM"]).v_rows
    if spec["A_IN_HALO"]:
        return sh.nb * math.prod(pixel_tiles(wl, spec)) * spec["BM"]
    return sh.rows


def tile_grid(wl: Workload, spec: Mapping) -> tuple[int, int]:
    """(column tiles, row tiles): the grid of the one-tile-per-block kernels."""
    sh = conv_shape(wl)
    return -(-sh.kout // spec["BN"]), -(-block_rows(wl, spec) // spec["BM"])


def persistent_grid(wl: Workload, spec: Mapping, blocks: int) -> tuple[int, int, int]:
    """Grid of a persistent kernel that `blocks` resident blocks fill: one dimension over all
    tiles, or (tap-shift: each block keeps one column tile's weights) every column tile times
    the row-tile strides that fit."""
    cols, rows = tile_grid(wl, spec)
    if tap_shift(spec):
        return cols, max(1, min(rows, blocks // cols)), 1
    return max(1, min(cols * rows, blocks)), 1, 1


def k_tiles(wl: Workload, spec: Mapping) -> int:
    """Pipeline stages of KT k256 slabs in one output tile's reduction (the kernel's KTILES)."""
    return -(-conv_shape(wl).k_words // (8 * spec["KT"]))


def b_rows(wl: Workload, spec: Mapping) -> int:
    """Rows of one k slab's B tile in shared memory: w_bits x BN weight rows, and with
    ROWSUM="cols" the ONES_ROWS after them."""
    return planes(wl)[1] * spec["BN"] + (ONES_ROWS if rowsum_cols(spec) else 0)


def stage_bytes(wl: Workload, spec: Mapping) -> int:
    """Shared memory of one pipeline stage: a_bits*BM (none with A_IN_HALO) + B rows, KT
    slabs of 32 bytes (the kernels' STAGE_WORDS * 4)."""
    a_rows = 0 if spec["A_IN_HALO"] else planes(wl)[0] * spec["BM"]
    return (a_rows + b_rows(wl, spec)) * spec["KT"] * 32


def halo_blocks(wl: Workload, spec: Mapping) -> int:
    """TMA_HALO: channel blocks per plane of the window (0 without)."""
    return conv_shape(wl).words * 4 // spec["TMA_HALO"] if spec["TMA_HALO"] else 0


def mbarrier_bytes(wl: Workload, spec: Mapping) -> int:
    """Shared memory of the one-tile wgmma kernel's mbarriers, after the halo: one per k tile
    with BULK_WEIGHTS, one per channel block of the window with TMA_HALO (8 bytes each)."""
    return 8 * ((k_tiles(wl, spec) if spec["BULK_WEIGHTS"] else 0) + halo_blocks(wl, spec))


def halo_bytes(wl: Workload, spec: Mapping) -> int:
    """Shared memory of the HALO=1 input slab: a_bits planes x rows x W x channel words; with
    A_IN_HALO the pixel tile's window, (BM / 8 + R - 1) x (8 + S - 1) pixels (rounded up to
    odd: the kernel's CHUNK_UNITS); with TMA_HALO its channel blocks of those pixels (rounded
    up to 8, the swizzle's period) and 1,024 bytes of slack per plane (the kernel aligns the
    first block to 1,024 bytes)."""
    if not spec["HALO"]:
        return 0
    sh, q = conv_shape(wl), planes(wl)[0]
    if not spec["A_IN_HALO"]:
        return q * halo_rows(sh, spec["BM"]) * sh.w * sh.words * 4
    pixels = math.prod(window_shape(wl, spec))
    if spec["TMA_HALO"]:  # pixel rows rounded up to the swizzle's period of 8
        return q * (halo_blocks(wl, spec) * -(-pixels // 8) * 8 * spec["TMA_HALO"] + 1024)
    if spec["PLANE_ROWS"]:  # each 16-byte chunk's pixels of both planes, an odd count
        return (q * pixels | 1) * sh.words * 4
    return q * (pixels | 1) * sh.words * 4  # each chunk's pixels, an odd count (CHUNK_UNITS)


def slice_sum_words(wl: Workload, spec: Mapping) -> int:
    """Words of one thread's Acc and RowSum (bitserial_common.cu; wgmma: MT = 1), which a k
    slice past the first stores for the first to add (SLICES > 1)."""
    q, p = planes(wl)
    nt = spec["WN"] // 8
    return q * p * nt * 4 + q * (8 if rowsum_cols(spec) else 4)


def threshold_slots(wl: Workload, spec: Mapping) -> int:
    """Threshold tables a persistent tap-shift block keeps in shared memory for its columns
    (rendered as THR_SLOTS; THR_SMEM in bitserial_tap_shift.cu): 1 without binary
    activations (every row compares with the per-column thresholds), one per tap rectangle of
    `rect_slots` with them (ROW_TABLE: the row table gives each row's slot) while they fit in
    THR_SMEM_BYTES; 0 (thresholds read from global memory) otherwise."""
    if not (tap_shift(spec) and spec["PERSIST"] and uses_thresholds(spec)):
        return 0
    if not needs_wtap(wl):
        return 1
    slots = len(rect_slots(conv_shape(wl)))
    fits = slots * spec["BN"] * threshold_stride(wl) * 4 <= THR_SMEM_BYTES
    return slots if spec["ROW_TABLE"] and fits else 0


def pairs_in_memory(wl: Workload, spec: Mapping) -> bool:
    """THR_PAIRS reading its packed thresholds from global memory (`pair_table`, or for binary
    activations the wtap table's part 4): no `threshold_slots` in shared memory."""
    return bool(spec["THR_PAIRS"]) and not threshold_slots(wl, spec)


def smem_bytes(wl: Workload, spec: Mapping) -> int:
    """Dynamic shared memory of a kernel: STAGES x (a_bits*BM + w_bits*BN) rows x KT*32 bytes
    (wgmma with binary weights: + a 256-byte tile of ones for the row popcounts, with
    ROWSUM="cols" 16 more B rows per k slab instead, with ROWSUM="slab" 4 bytes per slab
    position; HALO=1: + the input slab, A_IN_HALO=1 without the a_bits*BM rows; tap-shift: the
    weights once, the slab buffers and slab popcounts per team, persistent blocks their
    columns' `threshold_slots`; the stages and the packing tile are per team too; SLICES: the
    stages per k slice, and at least the slices' sums, `slice_sum_words`, which go over them)."""
    q = planes(wl)[0]
    operands = (spec["STAGES"] * stage_bytes(wl, spec) * spec["TEAMS"] * spec["SLICES"]
                + halo_bytes(wl, spec))
    operands += mbarrier_bytes(wl, spec)
    ones = 1
    if tap_shift(spec):  # every channel group resident, slab_buffers slabs of it
        plan = shift_plan(conv_shape(wl), spec["BM"])
        slab, weights = group_words(plan, q, b_rows(wl, spec))
        operands = plan.groups * (weights + slab * slab_buffers(spec) * spec["TEAMS"]) * 4
        ones = len(plan.ones_tiles)
        if rowsum_slab(spec):  # two buffers where each thread counts its own copies
            buffers = 2 if plan.groups == 1 and plan.chunks == 1 else 1
            operands += buffers * -(-plan.slab_pix // 4) * 16 * spec["TEAMS"]
    if wgmma(spec) and rowsum_mma(wl, spec):
        operands += 256 * ones
    if slots := threshold_slots(wl, spec):
        operands += slots * spec["BN"] * threshold_stride(wl) * 4
    # SLICES > 1: slices 1.. leave their sums (every thread's Acc and RowSum) over the operands
    operands = max(operands, (spec["SLICES"] - 1) * tile_threads(spec) * 4 * slice_sum_words(
        wl, spec))
    epi = wl.epilogue
    if epi.requantizes and epi.out_layout is Layout.BITPLANE and spec["WN"] % 32:
        packing = epi.out.bits * spec["BM"] * spec["BN"] // 8 * spec["TEAMS"]
        # the persistent kernel keeps its packing tile apart: the next tiles' copies are in flight
        return operands + packing if spec["PERSIST"] else max(operands, packing)
    return operands


def acc_regs(wl: Workload, spec: Mapping) -> int:
    """int32 accumulator registers per thread (plane pairs + row sums for binary weights,
    unless they come from the table)."""
    warp_rows = 16 if wgmma(spec) else spec["WM"]  # a warp's share of m64
    tiles = (warp_rows // 16) * (spec["WN"] // 8) * 4
    q, p = planes(wl)
    extra = (warp_rows // 16) * 4 * q if rowsum_mma(wl, spec) else 0
    if rowsum_cols(spec):  # the row popcounts' and the zero columns' registers
        extra = (warp_rows // 16) * 8 * q
    pingpong = tap_shift(spec) and spec["PERSIST"] and spec["STAGES"] == 4
    return (tiles * acc_planes(wl, spec) * p + extra) * (2 if pingpong else 1)  # two sets
