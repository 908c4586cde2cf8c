"""int8 conv2d / GEMM on Hopper s8 tensor cores through the bit-serial wgmma kernels.

The wgmma bit-serial kernels (`bitserial_wgmma.cu`, `bitserial_wgmma_persistent.cu`) stage
32-byte k slabs per row with cp.async (im2col gather, zero-filled padding), keep one wgmma batch
in flight (`wgmma.wait_group 1`, which Triton does not do for integer dots) and run the fused
epilogue. A 32-byte slab of int8 channels is exactly the k32 of `wgmma m64nNk32.s32.{s8,u8}.s8`,
so with one "plane" of bytes (CW = C/4 words per pixel, coefficients 1, no row sums) the same
kernels are an int8 implicit GEMM for operands in the int8 layout (NHWC / KRSC, one byte per
value).

Template `cuda.int8_wgmma` (sm_90a only): the wgmma families' tile and pipeline knobs, one tile
per block or persistent (PERSIST). Exact: int32 accumulation, the workload's worst-case |sum|
must fit (checked), outputs as `lowbit.reference.run`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from ...core import Config, Encoding, Layout, Workload
from ...core.hardware import TARGET
from ...core.knobs import KnobTable
from ...core.space import Scalar
from ..base import EXACT_INT32, acc_bound
from . import bitserial_defaults as defaults
from . import bitserial_knobs as K
from .bitserial_family import (
    BitserialFamily,
    bitplane_words,
    copy_chunks,
    halo_slab,
    registers,
    shared_memory,
    tile_waste,
    warp_tiles,
    wgmma_n,
)
from .bitserial_layout import k_tiles, tile_grid
from .bitserial_render import render
from .bitserial_shape import WGMMA_ARCH, conv_shape, support_limits_reason
from .bitserial_wgmma import WGMMA, WGMMA_PERSISTENT, persistent_spill

#: tiles a default's grid should have: half the SMs, below which a smaller tile is taken
MIN_DEFAULT_TILES = TARGET.sms // 2
#: (KT, STAGES) a default tries, deepest first: 128 or 64 bytes of reduction per stage
DEEP_STAGES = ((4, 4), (4, 3), (2, 6), (2, 4))
#: the most zero padding a deeper stage may add to the reduction (a fraction of it)
MAX_K_PADDING = 0.125

class Int8WgmmaTemplate(BitserialFamily):
    """NHWC x KRSC int8 conv2d (and GEMM) on s8 wgmma with the bit-serial wgmma kernels."""

    name = "cuda.int8_wgmma"
    kind = "wgmma"
    archs = (WGMMA_ARCH,)
    summary = "int8-layout operands on s8 wgmma through the bit-serial wgmma kernels"
    kernels: ClassVar[Mapping[int, str]] = {0: WGMMA.kernels[0], 1: WGMMA_PERSISTENT.kernels[1]}
    entries: ClassVar[Mapping[int, str]] = {0: WGMMA.entry, 1: WGMMA_PERSISTENT.entry}
    entry = WGMMA.entry
    fixes: ClassVar[Mapping[str, Scalar]] = {"MMA": "wgmma", "WM": 64}
    knobs = KnobTable(
        K.BM.but(values=(64, 128, 256), doc="block tile rows: 64 per warpgroup"),
        K.BN, K.WGMMA_WN.but(doc="columns per warpgroup (wgmma N)"),
        K.KT.but(values=(1, 2, 4), doc="k32 byte slabs per pipeline stage"), K.STAGES,
        K.PERSIST.but(doc=K.PERSIST.doc + " (bitserial_wgmma_persistent.cu)"),
        K.HALO.but(doc=K.HALO.doc + " (one tile per block)", requires={"PERSIST": (0,)}),
        K.REQUANT, K.SWIZZLE)
    checks = (warp_tiles, wgmma_n, persistent_spill, halo_slab, registers, shared_memory,
              copy_chunks, bitplane_words, tile_waste)

    def workload_reason(self, workload: Workload) -> str | None:
        wl = workload
        for name, layout in (("a_layout", wl.a_layout), ("w_layout", wl.w_layout)):
            if layout is not Layout.INT8:
                return f"{name}={layout.value!r}: only the int8 layout (one value per byte)"
        if wl.w.encoding is Encoding.UNSIGNED and wl.w.bits == 8:
            return f"w={wl.w}: weights must fit s8 (the B operand of wgmma is .s8 here)"
        sh = conv_shape(wl)
        if sh.c % 4:
            return f"C={sh.c}: channels must fill whole 4-byte words (C % 4 == 0)"
        bound = acc_bound(wl)
        if bound >= EXACT_INT32:
            return f"worst-case |accumulator| {bound} >= {EXACT_INT32}: int32 would not be exact"
        return support_limits_reason(wl)

    def kernel_name(self, config: Mapping) -> str:
        return self.kernels[config["PERSIST"]]

    def render(self, workload: Workload, config: Mapping, chained: int = 0, cuts=(),
               supplied: Mapping[str, str] | None = None) -> str:
        return render(workload, self.spec(config), self.entries[config["PERSIST"]], chained,
                      cuts, supplied)

    def default_config(self, workload: Workload, arch: str | None = None,
                       plain: bool = False) -> Config:
        """The first valid of the one-tile wgmma family's preferred configs that set no knob
        this template lacks (big N per instruction first) whose grid has at least
        MIN_DEFAULT_TILES tiles, else the valid one with the most tiles; requantizing by
        multiplying; then its deepest pipeline stage that suits the reduction (`_deep_stages`).
        (Small-M layers, e.g. a classifier at batch 256 or 8, took the first config's 128 x 256
        tiles: 8 blocks on 132 SMs for M = 256, N = 1000.)"""
        space = self.space(workload, arch)
        valid = []
        for d in defaults.preferred(defaults.WGMMA):
            if any(k not in self.knobs.names and v != WGMMA.knobs[k].neutral
                   for k, v in d.items()):
                continue
            cfg = Config({**self.knobs.neutral(), **{k: v for k, v in d.items()
                                                     if k in self.knobs.names}})
            if space.is_valid(cfg):
                tiles = math.prod(tile_grid(workload, self.spec(cfg)))
                if tiles >= MIN_DEFAULT_TILES:
                    return self._deep_stages(workload, cfg, space)
                valid.append((tiles, cfg))
        if valid:  # max keeps the first of equals
            return self._deep_stages(workload, max(valid, key=lambda tc: tc[0])[1], space)
        return space.all_configs()[0]

    def _deep_stages(self, workload: Workload, cfg: Config, space) -> Config:
        """`cfg` with the deepest pipeline stage of DEEP_STAGES that is valid and pads the
        reduction by at most MAX_K_PADDING (the preferred configs come from the bit-serial
        kernels, whose k32 slab is 256 products deep; an int8 slab is 32, so KT = 1 pays a
        block barrier and a copy wait per 32 channels of a long reduction)."""
        k_words = conv_shape(workload).k_words
        for kt, stages in DEEP_STAGES:
            deep = cfg.replace(KT=kt, STAGES=stages)
            padded = k_tiles(workload, self.spec(deep)) * 8 * kt
            if padded - k_words <= MAX_K_PADDING * k_words and space.is_valid(deep):
                return deep
        return cfg


INT8_WGMMA = Int8WgmmaTemplate()
