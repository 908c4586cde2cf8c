"""The bit-serial kernel parameters as knobs, declared once.

Every bit-serial family's `KnobTable` is built from these: a family takes a knob as it is, or
overrides what differs for its kernels (`KnobDef.but`: other values, another doc, more
requirements). A parameter a family fixes is not in its table (`BitserialFamily.fixes`); its
neutral value is the first of its values (`bitserial_family.SPEC_NEUTRAL` for the fixed ones).
"""

from __future__ import annotations

from ...core.knobs import KnobDef
from .bitserial_layout import RESIDENT_STAGES
from .bitserial_shape import (
    few_tiles,
    fusable_planes,
    in_place_geometry,
    kernel_window,
    needs_rowsum,
    pairs_possible,
    threshold_epilogue,
    two_activation_planes,
)

# ---------------------------------------------------------------- tiles
BM = KnobDef("BM", (16, 32, 64, 128, 256), "block tile rows (output pixels)")
BN = KnobDef("BN", (16, 32, 64, 128, 256), "block tile columns (output channels)")
WM = KnobDef("WM", (16, 32, 64), "warp tile rows")
WN = KnobDef("WN", (16, 32, 64), "warp tile columns")
#: wgmma: one warpgroup's columns, N of the MMA
WGMMA_WN = WN.but(values=(16, 32, 64, 128, 256),
                  doc="columns per warpgroup (wgmma N = w_bits * WN)")
KT = KnobDef("KT", (1, 2, 4, 8), "k256 steps per pipeline stage")
STAGES = KnobDef("STAGES", (3, 4, 6), "cp.async pipeline stages (one stays in flight)")

# ---------------------------------------------------------------- operand delivery
HALO = KnobDef("HALO", (0, 1), "1: the block's input rows plus halo copied once into shared "
               "memory, the im2col tiles gathered from there", applies=kernel_window)
A_IN_HALO = KnobDef(
    "A_IN_HALO", (0, 1), "1: a block tile is a BM / 8 x 8 tile of output pixels whose input "
    "window sits in shared memory as 16-byte channel chunks by pixel; the wgmma descriptors "
    "address every tap's A tile in place (no im2col), the stages carry the weights only",
    requires={"HALO": (1,)}, applies=in_place_geometry)
#: STAGES of the wgmma one-tile family: RESIDENT_STAGES keeps every k tile of A_IN_HALO's
#: weight-only stages resident
WGMMA_STAGES = STAGES.but(
    values=(3, 4, 6, RESIDENT_STAGES),
    doc=f"cp.async pipeline stages (one stays in flight; {RESIDENT_STAGES}: A_IN_HALO's "
        "weight-only stages, every k tile resident)",
    value_requires={RESIDENT_STAGES: {"A_IN_HALO": (1,)}})
BULK_WEIGHTS = KnobDef(
    "BULK_WEIGHTS", (0, 1), "1: each k tile's weights as one bulk copy on an mbarrier from a "
    "stage image made at bind (every k tile resident)", requires={"A_IN_HALO": (1,)})
TMA_HALO = KnobDef(
    "TMA_HALO", (0, 32, 64, 128), "the input window by the tensor copy engine, one copy per "
    "plane and channel block of this many bytes per pixel, into swizzled pixel rows the MMAs "
    "read in place", requires={"A_IN_HALO": (1,)})
PLANE_ROWS = KnobDef(
    "PLANE_ROWS", (0, 1), "1: a warp's 16 rows are one output row's 8 pixels in each of two "
    "activation planes: one wgmma per slab covers both planes",
    requires={"A_IN_HALO": (1,), "TMA_HALO": (0,)}, applies=two_activation_planes)
SWIZZLE = KnobDef("SWIZZLE", (0, 32), "shared-memory layout of the stages: 0 = 8x16-byte core "
                  "matrices, 32 = the 32-byte swizzle")

# ---------------------------------------------------------------- work split
PERSIST = KnobDef("PERSIST", (0, 1), "1: one wave of persistent blocks, the copies pipelined "
                  "across tiles")
TEAMS = KnobDef("TEAMS", (1, 2), "2: two teams of the tile's warpgroups, each with its own "
                "stages, take the block's tiles in turn, their MMA issue alternating so one "
                "team's MMAs run while the other's epilogue does")
SPLIT_K = KnobDef("SPLIT_K", (1, 2, 4, 8), "blocks per output tile along the reduction "
                  "(grid.z): each stores its partial sums, the tile's last to arrive adds them "
                  "and runs the epilogue; for grids of few tiles with long reductions",
                  applies=few_tiles)
SLICES = KnobDef("SLICES", (1, 2, 4), "sets of the tile's warpgroups that reduce k tile ranges "
                 "of the same tile, the first adding the others' sums from shared memory; for "
                 "grids under two waves", applies=few_tiles,
                 requires={"BULK_WEIGHTS": (0,), "TMA_HALO": (0,), "PLANE_ROWS": (0,)})
FUSE_PLANES = KnobDef(
    "FUSE_PLANES", (0, 1), "1: the two activation planes summed in one accumulator by the "
    "tensor cores (plane 1 issued twice): half the accumulators, three MMAs per k step instead "
    "of two", applies=fusable_planes)

# ---------------------------------------------------------------- epilogue
ROWSUM = KnobDef(
    "ROWSUM", ("mma", "table", "cols"),
    "binary weights' activation row popcounts: 'mma' a second wgmma per plane and k step "
    "against a tile of ones; 'table' a per-pixel popcount table of x summed over the valid "
    "taps in the epilogue; 'cols' 16 ones-and-zeros columns appended to the weights (needs "
    "BN = WN), the products' wgmma reading each A tile once", applies=needs_rowsum)
ROW_TABLE = KnobDef(
    "ROW_TABLE", (0, 1), "1: each row's output row and tap rectangle from a per-row table "
    "filled at bind (0: worked out from the row index in the epilogue)",
    requires={"ROWSUM": ("mma", "cols")})
REQUANT = KnobDef(
    "REQUANT", ("multiply", "threshold"),
    "requantized 1-2 bit planes: 'multiply' in 64-bit fixed point; 'threshold' compares with "
    "per-column integer thresholds that fold in bias and ReLU", applies=threshold_epilogue)
THR_PAIRS = KnobDef(
    "THR_PAIRS", (0, 1), "1: threshold bits of two columns per 32-bit add (16-bit halves; a "
    "lane's columns hold contiguous output channels, the weights' rows permuted to match)",
    requires={"REQUANT": ("threshold",), "WN": (64, 128, 256)}, applies=pairs_possible)
