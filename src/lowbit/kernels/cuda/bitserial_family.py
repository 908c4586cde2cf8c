"""A bit-serial kernel family as a template: its knob table, the parameters it fixes, its .cu
entry file, and the named constraints its space keeps.

Every bit-serial kernel is rendered from one vocabulary of parameters (`SPEC_NEUTRAL`'s keys:
the .cu files' BM, BN, ..., TAP_SHIFT, ...). A family tunes some of them (its `KnobTable`) and
fixes the others (`fixed`, else the neutral value); `spec(config)` is a config's full
parameter set, which the geometry (`bitserial_layout`), the tables and the renderer read. The
"knob X belongs to kernel Y" rules are the families themselves plus the tables' `applies` and
`requires`; what remains are the constraints below, small functions (workload, spec) -> reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import ClassVar

import torch

from ...core import Config, ConfigSpace, Workload
from ...core.hardware import TARGET
from ...core.knobs import KnobTable
from ...core.layout import Layout
from ...core.space import Constraint, Scalar
from ..base import KernelTemplate, pow2_ceil
from ..geometry import Geometry, conv_taps
from . import bitserial_defaults as defaults
from .bitserial_layout import (
    acc_planes,
    acc_regs,
    block_rows,
    k_tiles,
    smem_bytes,
    tap_shift,
    threads,
    tile_grid,
    tile_threads,
)
from .bitserial_render import render
from .bitserial_shape import (
    SPLIT_K_MAX_TILES,
    WGMMA_ARCH,
    bitplane_output,
    bitplane_reason,
    block_end_planes,
    conv_shape,
    copy_vec,
    halo_rows,
    planes,
    threshold_epilogue,
)
from .nvrtc import DEFAULT_ARCH, device_arch

#: every kernel parameter and its neutral value (the kernel without that feature); the tile
#: sizes have none
SPEC_NEUTRAL: dict[str, Scalar | None] = {
    "BM": None, "BN": None, "WM": None, "WN": None, "KT": None, "STAGES": None,
    "MMA": None, "PERSIST": 0, "TAP_SHIFT": 0, "TEAMS": 1, "FUSE_PLANES": 0, "SWIZZLE": 0,
    "HALO": 0, "A_IN_HALO": 0, "BULK_WEIGHTS": 0, "TMA_HALO": 0, "PLANE_ROWS": 0,
    "ROWSUM": "mma", "ROW_TABLE": 0, "REQUANT": "multiply", "SPLIT_K": 1, "SLICES": 1,
    "THR_PAIRS": 0}

MAX_ACC_REGS = 160    # int32 accumulators per thread (p*q plane pairs share the register file)
OTHER_REGS = 48       # registers besides the accumulators (fragments, addresses), estimated
# One-tile wgmma blocks without tap-shift and with one accumulator plane (w1a1, or two-bit
# activations with FUSE_PLANES) keep fewer: ptxas (NVRTC 13.0, sm_90a) fits BM=192, BN=WN=256
# (132 accumulator registers with w1a1's row sums, 136 with fused w1a2's, 384 threads) in 168
# registers with 12-32 (w1a1) and 132-152 (fused w1a2, without the halo) bytes of spill, and
# those blocks ran faster than every config inside the 48-register estimate (NOTES.md, "Wide
# one-tile blocks"); blocks of several accumulator planes that it would admit spill 76-232 B.
OTHER_REGS_WGMMA_TILE = 32
#: bits of K per k256 MMA step (KT counts them)
B1_STEP_BITS = 256
MAX_SMEM = 160 * 1024  # bytes of dynamic shared memory a config may use (sm_80: 163 KB)
MAX_COPY_ITERS = 16   # copy chunks per thread per stage (row index registers)
GRID_Y_MAX = 65535
# N of wgmma m64nNk256 for s32 b1 (PTX ISA): multiples of 8 to 32, then of 16 to 256
WGMMA_N = frozenset([8, 16, 24, 32, *range(48, 257, 16)])
MAX_WARPGROUPS = 4

Check = Callable[[Workload, Mapping], "str | None"]
"""A named constraint of a family's space: (workload, spec) -> None, or why the spec fails."""


def target_arch() -> str:
    """The arch a space is for when none is named: the current GPU's, else NVRTC's default."""
    return device_arch() if torch.cuda.is_available() else DEFAULT_ARCH


# ---- the constraints the knob tables cannot express (shared by the families) ----

def warp_tiles(wl: Workload, c: Mapping) -> str | None:
    if c["BM"] % c["WM"] or c["BN"] % c["WN"]:
        return "block tile must be a multiple of the warp tile"
    warps = tile_threads(c) // 32
    if not 1 <= warps <= 16:
        return f"{warps} warps per block (1..16 allowed)"
    if c["MMA"] == "wgmma" and threads(c) // 128 > MAX_WARPGROUPS:  # every team's or slice's
        return f"more than {MAX_WARPGROUPS} warpgroups per block"
    return None


def wgmma_n(wl: Workload, c: Mapping) -> str | None:
    n = planes(wl)[1] * c["WN"]
    return None if n in WGMMA_N else f"wgmma N = w_bits*WN = {n} is not a valid wgmma N"


def registers(wl: Workload, c: Mapping) -> str | None:
    n = acc_regs(wl, c)
    if n > MAX_ACC_REGS:
        return f"{n} accumulator registers > {MAX_ACC_REGS}"
    one_plane = acc_planes(wl, c) * planes(wl)[1] == 1
    lean = c["MMA"] == "wgmma" and not c["PERSIST"] and not tap_shift(c) and one_plane
    n += OTHER_REGS_WGMMA_TILE if lean else OTHER_REGS
    if threads(c) * n > TARGET.regs_per_sm:
        return f"{threads(c)} threads x {n} registers exceed the register file"
    return None


def shared_memory(wl: Workload, c: Mapping) -> str | None:
    n = smem_bytes(wl, c)
    return f"{n} bytes of shared memory > {MAX_SMEM}" if n > MAX_SMEM else None


def copy_chunks(wl: Workload, c: Mapping) -> str | None:
    iters = -(-c["BM"] * c["KT"] * 8 // copy_vec(conv_shape(wl)) // tile_threads(c))
    return f"{iters} copy chunks per thread" if iters > MAX_COPY_ITERS else None


def halo_slab(wl: Workload, c: Mapping) -> str | None:
    sh = conv_shape(wl)
    if c["HALO"] and (halo_rows(sh, c["BM"]) + sh.r) * sh.w * sh.words >= 2**31:
        return "halo slab too large for 32-bit word offsets"
    return None


def row_indices(wl: Workload, c: Mapping) -> str | None:
    if c["ROW_TABLE"] and block_rows(wl, c) + 256 >= 2**31:
        return "too many rows for ROW_TABLE's 32-bit row indices"
    return None


def bitplane_words(wl: Workload, c: Mapping) -> str | None:
    if bitplane_output(wl) and c["BN"] % 32:
        return "bit-plane output packs 32-column words per block: BN must be a multiple of 32"
    if block_end_planes(wl) and c["WN"] % 32:
        return ("the block-end epilogue packs bit planes in registers: WN must be a multiple "
                "of 32")
    return None


def tile_waste(wl: Workload, c: Mapping) -> str | None:
    sh = conv_shape(wl)
    if c["BN"] > max(32, pow2_ceil(sh.kout)):
        return f"BN={c['BN']} wider than the {sh.kout} output columns"
    rows = block_rows(wl, c)
    if c["BM"] > max(64 if c["MMA"] == "wgmma" else 32, pow2_ceil(rows)):  # m64
        return f"BM={c['BM']} taller than the {rows} block rows"
    if -(-rows // c["BM"]) > GRID_Y_MAX:
        return "too many row tiles for grid.y"
    return None


def split_k(wl: Workload, c: Mapping) -> str | None:
    n = c["SPLIT_K"]
    if n == 1:
        return None
    kt = k_tiles(wl, c)
    if -(-kt // n) * (n - 1) >= kt:
        return f"SPLIT_K={n} leaves a split without k tiles ({kt} k tiles)"
    cols, rows = tile_grid(wl, c)
    if cols * rows >= SPLIT_K_MAX_TILES:
        return f"{cols * rows} tiles fill the GPU without split-K"
    return None


def k_slices(wl: Workload, c: Mapping) -> str | None:
    n = c["SLICES"]
    if n == 1:
        return None
    if k_tiles(wl, c) < 2 * n:
        return f"SLICES={n} leaves a slice under two of the {k_tiles(wl, c)} k tiles"
    cols, rows = tile_grid(wl, c)
    if cols * rows >= SPLIT_K_MAX_TILES:
        return f"{cols * rows} tiles fill the GPU without splitting a block's k tiles"
    return None


class _SpecView(Mapping):
    """A family config seen as a full spec: the family's fixed parameters, then the config
    (a partial config's unset knobs still raise while its space is walked)."""

    __slots__ = ("_config", "_fixed")

    def __init__(self, config: Mapping, fixed: Mapping) -> None:
        self._config, self._fixed = config, fixed

    def __getitem__(self, key: str) -> Scalar:
        return self._fixed[key] if key in self._fixed else self._config[key]

    def __iter__(self) -> Iterator[str]:
        return iter(SPEC_NEUTRAL)

    def __len__(self) -> int:
        return len(SPEC_NEUTRAL)


class BitserialFamily(KernelTemplate):
    """One bit-serial kernel family: its knobs, fixed parameters, constraints and .cu entry."""

    backend = "cuda"
    #: runs Epilogue.shifted_bias (bitserial_epilogue.cu's SHIFTED_BIAS; thresholds fold it in)
    takes_shifted_bias: ClassVar[bool] = True
    #: runs Epilogue.residual (HAS_BIAS 3 / 4: the multiply path adds res r in 64 bits)
    takes_residual: ClassVar[bool] = True
    #: its kernels launch as programmatic dependents of the previous kernel (bind chained=True)
    chainable: ClassVar[bool] = True
    #: runs the block-end epilogue (Epilogue.requant32: a narrow residual, derived outputs,
    #: store_out=False; HAS_BIAS 5, bitserial_block_end.cu)
    takes_block_end: ClassVar[bool] = True
    #: knobs of this family (declared once: space, docs, requirements)
    knobs: ClassVar[KnobTable]
    #: the parameters this family's kernels always have (besides the neutral ones)
    fixes: ClassVar[Mapping[str, Scalar]] = {}
    #: the constraints its space keeps, in the order its walk can decide them
    checks: ClassVar[tuple[Check, ...]] = ()
    #: the .cu entry file, and its main kernel (by PERSIST where it has two)
    entry: ClassVar[str]
    kernels: ClassVar[Mapping[int, str]]
    #: archs its kernels compile for (wgmma: sm_90a only)
    archs: ClassVar[tuple[str, ...] | None] = None
    #: MMA kind ("mma_sync", "wgmma") whose preferred list holds its defaults
    kind: ClassVar[str]
    summary: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs) -> None:
        """The family's docstring lists its knobs, from its table (declared once)."""
        super().__init_subclass__(**kwargs)
        if "knobs" in cls.__dict__:
            cls.__doc__ = "\n".join([(cls.__doc__ or "").rstrip(), "", "Knobs:",
                                     *cls.knobs.describe(indent="    ")])

    @property
    def fixed(self) -> dict[str, Scalar]:
        """Every parameter outside the knob table, at this family's value."""
        out = {k: v for k, v in SPEC_NEUTRAL.items() if k not in self.knobs.names}
        out.update(self.fixes)
        return out

    def spec(self, config: Mapping) -> Config:
        """The full kernel parameters of a config of this family."""
        extra = set(config) - set(self.knobs.names)
        if extra:
            raise ValueError(f"{self.name} has no knobs {sorted(extra)}; knobs: "
                             f"{', '.join(self.knobs.names)}")
        return Config({**self.fixed, **config})

    def owns(self, spec: Mapping) -> bool:
        """Whether a full parameter set is one of this family's kernels."""
        return all(spec.get(k) == v for k, v in self.fixed.items())

    def config_of(self, spec: Mapping) -> Config:
        """This family's config of a full parameter set it owns."""
        if not self.owns(spec):
            raise ValueError(f"parameters {dict(spec)} are not a {self.name} kernel's")
        return Config({k: spec[k] for k in self.knobs.names})

    def kernel_name(self, config: Mapping) -> str:
        return self.kernels[self.spec(config)["PERSIST"]]

    def arch_reason(self, arch: str) -> str | None:
        if self.archs is not None and arch not in self.archs:
            return f"needs {' or '.join(self.archs)}, not {arch}"
        return None

    def workload_reason(self, workload: Workload) -> str | None:
        """Why this family's kernels cannot run `workload` on any arch (None: they can)."""
        return bitplane_reason(workload)

    def unsupported_reason(self, workload: Workload) -> str | None:
        """`workload_reason`, or this machine's arch (`target_arch`) that the kernels lack."""
        return self.workload_reason(workload) or self.arch_reason(target_arch())

    def check_supported(self, workload: Workload) -> None:
        """ValueError where the kernels cannot run `workload` (whatever this machine is: a
        space or build for a named arch compiles offline)."""
        reason = self.workload_reason(workload)
        if reason:
            raise ValueError(f"{self.name} does not support {workload.key}: {reason}")

    def space(self, workload: Workload, arch: str | None = None,
              relax: Collection[str] = ()) -> ConfigSpace:
        """Configs for `workload` on `arch` (default `target_arch()`); `relax` names checks
        to leave out (probes that time configs outside an estimate, e.g. "registers")."""
        self.check_supported(workload)
        reason = self.arch_reason(arch or target_arch())
        if reason:
            raise ValueError(f"{self.name} {reason}")
        fixed = self.fixed

        def constraint(check: Check) -> Constraint:
            def named(config: Config) -> str | None:
                return check(workload, _SpecView(config, fixed))
            named.__name__ = check.__name__
            return named

        unknown = set(relax) - {c.__name__ for c in self.checks}
        if unknown:
            raise ValueError(f"relax names no check of {self.name}: {sorted(unknown)}")
        return self.knobs.space(workload, [constraint(c) for c in self.checks
                                           if c.__name__ not in relax])

    def preferred_configs(self, workload: Workload) -> list[Config]:
        """This family's preferred configs for `workload`, best first (bitserial_defaults)."""
        requant = "threshold" if threshold_epilogue(workload) else "multiply"
        return [Config({**self.knobs.neutral(), **d, "REQUANT": requant})
                for d in defaults.preferred(self.name)]

    def default_config(self, workload: Workload, arch: str | None = None,
                       plain: bool = False) -> Config:
        """The first preferred config that is valid and fits (`bitserial_defaults`), then the
        family's regime refinement (`refine_default`); `plain`: without the regime defaults
        (a stable base to build variants from). The space's first config where none fits."""
        space = self.space(workload, arch)
        for cfg in self.preferred_configs(workload):
            if plain and defaults.is_regime(self.name, cfg):
                continue
            spec = self.spec(cfg)
            if space.is_valid(cfg) and defaults.regime_fits(workload, spec,
                                                            acc_regs(workload, spec)):
                return cfg if plain else self.refine_default(workload, cfg, space)
        first = next(iter(space.all_configs()), None)
        if first is None:
            raise ValueError(f"{self.name} has no config for {workload.key}")
        return first

    def refine_default(self, workload: Workload, config: Config, space: ConfigSpace
                       ) -> Config:
        """A family's regime default in place of its first preferred config (the one-tile
        wgmma family's small-grid defaults); the config itself by default."""
        return config

    def geometry(self, workload: Workload, config: Mapping) -> Geometry:
        """BM x BN block tiles of WM x WN warp (wgmma: warpgroup) tiles, KT k256 MMA steps of
        one-bit planes a main-loop step (the s8 mode: KT x 32 bytes), STAGES stages of the
        bit planes it copies (the weights alone with A_IN_HALO), p*q plane products per
        multiply-accumulate (p with FUSE_PLANES's fused activation planes), TEAMS x SLICES
        tiles' threads a block, SPLIT_K slices; registers: the accumulator planes over the
        tile's threads plus OTHER_REGS (OTHER_REGS_WGMMA_TILE for one-tile wgmma blocks)."""
        c = self.spec(config)
        m, n, k = workload.gemm_shape
        bm, bn = int(c["BM"]), int(c["BN"])
        wm, wn = int(c.get("WM", bm)), int(c.get("WN", bn))
        kt, stages = int(c.get("KT", 1)), int(c.get("STAGES", 2))
        split = int(c.get("SPLIT_K", 1))
        wgmma = c.get("MMA") == "wgmma"
        team = int(c.get("TEAMS", 1)) * int(c.get("SLICES", 1))
        warp_threads = 128 if wgmma else 32
        tile_threads_ = max(1, bm // max(wm, 1)) * max(1, bn // max(wn, 1)) * warp_threads
        bitplane = workload.a_layout is Layout.BITPLANE
        p, q = (workload.w.bits, workload.a.bits) if bitplane else (1, 1)
        acc_planes_ = p * (1 if c.get("FUSE_PLANES") else q)
        taps, chans = conv_taps(workload)
        in_place = bool(int(c.get("A_IN_HALO", 0)))  # the stages carry the weights only
        if bitplane:
            step = kt * B1_STEP_BITS
            steps = taps * math.ceil(math.ceil(chans / 32) * 32 / step)
            row_bytes = kt * B1_STEP_BITS // 8
            smem = stages * ((0 if in_place else bm * q) + bn * p) * row_bytes
            rate, a_bytes = "b1_and", 1 / 8
        else:  # the s8 wgmma mode: a k tile of KT x 32 bytes
            step = kt * 32
            steps = taps * math.ceil(chans / step)
            smem = stages * (bm + bn) * step
            rate, a_bytes = "int8", 1.0
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        other = OTHER_REGS_WGMMA_TILE if wgmma and not c.get("PERSIST") else OTHER_REGS
        regs = min(255, bm * bn * acc_planes_ // tile_threads_ + other)
        return Geometry("bitserial", rate, m, n, k, bm, bn, math.ceil(m / bm) * bm, tiles,
                        split, step, math.ceil(steps / split), tile_threads_ * team, stages,
                        smem, regs, bool(int(c.get("PERSIST", 0))), p * q, a_bytes)

    def render(self, workload: Workload, config: Mapping, chained: int = 0,
               cuts: Collection[str] = (), supplied: Mapping[str, str] | None = None) -> str:
        """CUDA source of the kernel of (workload, config) (`bitserial_render.render`)."""
        return render(workload, self.spec(config), self.entry, chained, cuts, supplied)

    def build(self, workload: Workload, config: Mapping, arch: str | None = None):
        """Compile for `arch` (default: the current device's); ValueError on an invalid config."""
        from .bitserial_kernel import BitserialKernel

        arch = arch or device_arch()
        try:
            config = self.checked_config(workload, Config(config), self.space(workload, arch))
        except ValueError as e:
            raise ValueError(f"{e} (on {arch})") from None
        return BitserialKernel(self, workload, config, arch)

    def describe(self, workload: Workload | None = None) -> list[str]:
        """The family, its knobs (values on `workload` where given) and its checks."""
        lines = [f"{self.name}: {self.summary}", f"  kernel file {self.entry}; archs "
                 f"{', '.join(self.archs) if self.archs else 'sm_80 and newer'}",
                 *self.knobs.describe(workload, "    ")]
        lines.append("    checks: " + ", ".join(c.__name__ for c in self.checks))
        return lines


__all__ = ["SPEC_NEUTRAL", "WGMMA_ARCH", "BitserialFamily", "target_arch"]
