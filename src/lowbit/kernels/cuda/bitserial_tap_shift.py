"""The tap-shift wgmma family `cuda.bitserial_tap_shift` (bitserial_tap_shift.cu, sm_90a):
stride-1 convs on C <= 64 or a multiple of 128 channels computed in a zero-margined virtual
pixel grid, each tap's A operand a descriptor view into the block's one input slab, so there
are no im2col copies (geometry: `tap_shift.py`). One tile per block, or persistent blocks with
the weights resident and three slab buffers (STAGES=4: the next tile's MMAs in a second
accumulator set during this tile's epilogue; TEAMS=2: two teams taking the tiles in turn)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ...core import Workload
from ...core.knobs import KnobTable
from ...core.space import Scalar
from . import bitserial_defaults as defaults
from . import bitserial_knobs as K
from .bitserial_family import (
    BitserialFamily,
    bitplane_words,
    registers,
    row_indices,
    shared_memory,
    tile_waste,
    warp_tiles,
    wgmma_n,
)
from .bitserial_shape import WGMMA_ARCH, conv_shape
from .bitserial_wgmma import ones_columns
from .tap_shift import shift_plan
from .tap_shift import unsupported_reason as shift_reason


def virtual_rows(wl: Workload, c: Mapping) -> str | None:
    if shift_plan(conv_shape(wl), c["BM"]).v_rows + 256 >= 2**31:
        return "too many virtual rows for 32-bit row indices"
    return None


class TapShiftTemplate(BitserialFamily):
    """Tap-shift wgmma conv: every tap a shifted view of one input slab per block."""

    name = defaults.TAP_SHIFT
    kind = "wgmma"
    archs = (WGMMA_ARCH,)
    summary = ("wgmma m64nNk256, stride-1 convs as shifted views of one input slab per block "
               "(no im2col), one tile per block or persistent")
    entry = "bitserial_tap_shift.cu"
    kernels: ClassVar[Mapping[int, str]] = {0: "bitserial_wgmma_shift",
                                            1: "bitserial_wgmma_shift_persistent"}
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "wgmma", "WM": 64, "KT": 1, "TAP_SHIFT": 1}
    knobs = KnobTable(
        K.BM.but(values=(64, 128, 256),
                 doc="block tile rows of the virtual grid (64 per warpgroup)"),
        K.BN, K.WGMMA_WN,
        K.PERSIST.but(doc="1: one wave of persistent blocks, each keeping a column tile's "
                      "weights resident and three slab buffers"),
        K.STAGES.but(values=(3, 4), doc="3; 4 (persistent): the next tile's MMAs in a second "
                     "accumulator set during this tile's epilogue",
                     value_requires={4: {"PERSIST": (1,)}}),
        K.TEAMS.but(doc="2: two teams of the tile's warpgroups share the resident weights and "
                    "take the block's tiles in turn, their MMA issue alternating",
                    requires={"PERSIST": (1,), "STAGES": (3,)}),
        K.FUSE_PLANES,
        K.ROWSUM.but(values=("mma", "table", "slab", "cols"),
                     doc=K.ROWSUM.doc + "; 'slab' the popcounts of the block's input slab in "
                     "shared memory, summed over each row's taps while the tile's MMAs run",
                     value_requires={"slab": {"PERSIST": (1,), "STAGES": (3,)},
                                     "cols": {"FUSE_PLANES": (0,)}}),
        K.ROW_TABLE.but(values=(0, 1, 2), doc="1: each row's output row and tap rectangle from "
                        "a per-row table filled at bind; 2: also each slab copy's input pixel",
                        requires={"ROWSUM": ("mma", "slab", "cols")}),
        K.REQUANT, K.THR_PAIRS, K.SWIZZLE)
    checks = (warp_tiles, wgmma_n, virtual_rows, ones_columns, row_indices, registers,
              shared_memory, bitplane_words, tile_waste)

    def workload_reason(self, workload: Workload) -> str | None:
        return super().workload_reason(workload) or shift_reason(conv_shape(workload))


TAP_SHIFT = TapShiftTemplate()
