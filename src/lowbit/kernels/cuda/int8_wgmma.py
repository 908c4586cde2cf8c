"""int8 conv2d / GEMM on Hopper s8 tensor cores through the bit-serial wgmma kernel.

The bit-serial wgmma kernel (`bitserial.py`, `bitserial_wgmma*.cu`) stages 32-byte k slabs per
row with cp.async (im2col gather, zero-filled padding), keeps one wgmma batch in flight
(`wgmma.wait_group 1`, which Triton does not do for integer dots) and runs the fused epilogue.
A 32-byte slab of int8 channels is exactly the k32 of `wgmma m64nNk32.s32.{s8,u8}.s8`, so with
one "plane" of bytes (CW = C/4 words per pixel, coefficients 1, no row sums) the same kernel is
an int8 implicit GEMM for operands in the int8 layout (NHWC / KRSC, one byte per value).

Template `cuda.int8_wgmma` (sm_90a only): knobs of `cuda.bitserial` with MMA fixed to wgmma
(BM, BN, WN, KT, STAGES, PERSIST, SWIZZLE, HALO, REQUANT; SPLIT_K fixed at 1). Exact: int32
accumulation, the workload's worst-case |sum| must fit (checked), outputs as
`lowbit.reference.run`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ...core import Config, ConfigSpace, Encoding, Knob, Layout, Workload
from ..base import EXACT_INT32, KernelTemplate, acc_bound
from .bitserial import (
    DEFAULTS,
    WGMMA_ARCH,
    BitserialKernel,
    BitserialTemplate,
    _constraints,
    conv_shape,
    requant_knob,
    support_limits_reason,
    target_arch,
)


class Int8WgmmaTemplate(KernelTemplate):
    """NHWC x KRSC int8 conv2d (and GEMM) on s8 wgmma with the bit-serial kernel's pipeline."""

    name = "cuda.int8_wgmma"
    backend = "cuda"
    added_knobs: ClassVar[Mapping[str, object]] = {"REQUANT": "multiply", "SPLIT_K": 1}

    def unsupported_reason(self, workload: Workload) -> str | None:
        wl = workload
        if target_arch() != WGMMA_ARCH:
            return f"needs {WGMMA_ARCH} (wgmma); this GPU is {target_arch()}"
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

    def space(self, workload: Workload, arch: str | None = None) -> ConfigSpace:
        """Configs for `workload` on `arch` (default `target_arch()`); sm_90a only."""
        self.check_supported(workload)
        arch = arch or target_arch()
        if arch != WGMMA_ARCH:
            raise ValueError(f"{self.name} needs {WGMMA_ARCH} (wgmma), got {arch}")
        knobs = [Knob("BM", (64, 128, 256)), Knob("BN", (16, 32, 64, 128, 256)),
                 Knob("WM", (64,)), Knob("WN", (16, 32, 64, 128, 256)),
                 Knob("KT", (1, 2, 4)), Knob("STAGES", (3, 4, 6)), Knob("PERSIST", (0, 1)),
                 Knob("MMA", ("wgmma",)), Knob("SWIZZLE", (0, 32)), Knob("HALO", (0, 1)),
                 Knob("ROWSUM", ("mma",)), requant_knob(workload),
                 Knob("SPLIT_K", (1,))]  # split-K: mma.sync only (bitserial.py)
        return ConfigSpace(knobs, _constraints(workload))

    def default_config(self, workload: Workload, arch: str | None = None) -> Config:
        """The first valid of the bit-serial wgmma defaults (big N per instruction first), on
        this template's knobs: those that set a bit-serial knob it lacks (tap-shift, fused
        planes) are skipped, the others' bit-serial knobs left out."""
        space = self.space(workload, arch)
        lacks = {k: v for k, v in BitserialTemplate.added_knobs.items() if k not in space.names}
        for d in DEFAULTS["wgmma"]:
            if any(d.get(k, v) != v for k, v in lacks.items()):
                continue
            cfg = Config({k: v for k, v in d.items() if k in space.names})
            if space.is_valid(cfg):
                return cfg
        return space.all_configs()[0]

    def build(self, workload: Workload, config: Config, arch: str | None = None
              ) -> BitserialKernel:
        """Compile for `arch` (default sm_90a); ValueError on an invalid config."""
        arch = arch or WGMMA_ARCH
        config = self.checked_config(workload, config, self.space(workload, arch))
        return BitserialKernel(workload, config, arch, template=self.name)


INT8_WGMMA = Int8WgmmaTemplate()
