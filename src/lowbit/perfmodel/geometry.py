"""Launch geometry of a (template, workload, config), read from the config's knobs.

A template family is recognized by its knob names, not by its template name, so that a new
template with familiar knobs is understood at once. The bit-serial family templates (and
`cuda.int8_wgmma`) leave the parameters they fix out of their configs, so their configs are
read as full kernel parameters first (`kernel_params`: `lowbit.kernels.cuda.kernel_spec`,
which also reads records of the single "cuda.bitserial" template they replaced):

  igemm      BLOCK_M / BLOCK_N / BLOCK_K, num_warps, num_stages, SPLIT_K (Triton implicit GEMM)
  tma_conv   BLOCK_I x BLOCK_P x BLOCK_Q pixel tiles, BLOCK_N, BLOCK_K (Triton TMA conv)
  bitserial  BM, BN, WM, WN, KT, STAGES, MMA, ... (the bit-serial kernel parameters; the s8
             wgmma kernels of `cuda.int8_wgmma` too)
  mma_conv   warps_m / warps_n, tiles_m / tiles_n, k_chunk (CUDA mma.sync conv, Choi et al.)
  generic    anything else: `lowbit.perfmodel.launch_shape`'s aliases (or the template's own
             `launch_shape`), so every template gets a geometry

Resources (shared memory, registers) are estimates from the tile sizes, as in APNN-TC and
the thesis: the model needs their trend across configs, not the compiler's exact count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..core import ConvWorkload, Workload
from ..core.layout import Layout
from ..kernels.cuda import BY_NAME, LEGACY, kernel_spec
from .launch import launch_shape

FAMILIES = ("igemm", "tma_conv", "bitserial", "mma_conv", "generic", "fp16")
RATES = ("int8", "b1_and", "fp16", "int8_mma_sync", "int4_mma_sync")
_B1_STEP_BITS = 256  # bits of K per k256 MMA step (KT counts them)


@dataclass(frozen=True)
class Geometry:
    """Implicit-GEMM view of one launch. Sizes in elements of the reduction (bits for
    bit-serial planes), bytes for shared memory."""

    family: str
    rate: str            # instruction class whose peak bounds the MMAs (RATES)
    M: int               # GEMM rows (output pixels), columns (filters), reduction length
    N: int
    K: int
    block_m: int
    block_n: int
    padded_m: int        # rows the row tiles cover (pixel tiles overhang the image)
    tiles: int           # output tiles
    split: int           # blocks per output tile (split-K)
    k_step: int          # reduction elements per main-loop step
    k_steps: int         # main-loop steps per block
    threads: int
    stages: int
    smem_bytes: int
    regs_per_thread: int
    persistent: bool
    planes: int = 1      # bit-plane products per multiply-accumulate (bit-serial: p*q)
    a_bytes: float = 1.0  # bytes per staged operand element (bit-serial: 1/8 per plane)

    @property
    def blocks(self) -> int:
        """Work units: output tiles x split."""
        return self.tiles * self.split

    @property
    def padded_n(self) -> int:
        return math.ceil(self.N / self.block_n) * self.block_n


def _conv_taps(wl: Workload) -> tuple[int, int]:
    """(taps, channels) of the reduction: R*S and C for a conv, 1 and K for a GEMM."""
    if isinstance(wl, ConvWorkload):
        return wl.R * wl.S, wl.C
    return 1, wl.gemm_shape[2]


def _igemm(wl: Workload, c: Mapping, template: str) -> Geometry:
    m, n, k = wl.gemm_shape
    bm, bn, bk = int(c["BLOCK_M"]), int(c["BLOCK_N"]), int(c["BLOCK_K"])
    warps, stages = int(c.get("num_warps", 4)), int(c.get("num_stages", 2))
    split = int(c.get("SPLIT_K", 1))
    fp16 = template.endswith("fp16")
    elem = 2 if fp16 else 1
    taps, chans = _conv_taps(wl)
    if c.get("LOOP_ORDER") == "r_sc" and isinstance(wl, ConvWorkload):
        steps = wl.R * math.ceil(wl.S * wl.C / bk)
    else:
        steps = taps * math.ceil(chans / bk)
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    return Geometry("igemm", "fp16" if fp16 else "int8", m, n, k, bm, bn,
                    math.ceil(m / bm) * bm, tiles, split, bk, math.ceil(steps / split),
                    32 * warps, stages, stages * (bm + bn) * bk * elem,
                    min(255, bm * bn // (32 * warps) + 40), False, 1, float(elem))


def _tma_conv(wl: Workload, c: Mapping) -> Geometry:
    m, n, k = wl.gemm_shape
    bi, bp, bq = int(c["BLOCK_I"]), int(c["BLOCK_P"]), int(c["BLOCK_Q"])
    bm = bi * bp * bq
    bn, bk = int(c["BLOCK_N"]), int(c["BLOCK_K"])
    warps, stages = int(c.get("num_warps", 4)), int(c.get("num_stages", 2))
    split = int(c.get("SPLIT_K", 1))
    if isinstance(wl, ConvWorkload):
        row_tiles = math.ceil(wl.N / bi) * math.ceil(wl.P / bp) * math.ceil(wl.Q / bq)
    else:
        row_tiles = math.ceil(m / bm)
    taps, chans = _conv_taps(wl)
    steps = taps * math.ceil(chans / bk)
    return Geometry("tma_conv", "int8", m, n, k, bm, bn, row_tiles * bm,
                    row_tiles * math.ceil(n / bn), split, bk, math.ceil(steps / split),
                    32 * warps, stages, stages * (bm + bn) * bk,
                    min(255, bm * bn // (32 * warps) + 40), False)


def _bitserial(wl: Workload, c: Mapping, template: str) -> Geometry:
    m, n, k = wl.gemm_shape
    bm, bn = int(c["BM"]), int(c["BN"])
    wm, wn = int(c.get("WM", bm)), int(c.get("WN", bn))
    kt, stages = int(c.get("KT", 1)), int(c.get("STAGES", 2))
    split = int(c.get("SPLIT_K", 1))
    wgmma = c.get("MMA") == "wgmma"
    team = int(c.get("TEAMS", 1)) * int(c.get("SLICES", 1))
    tile_threads = max(1, bm // max(wm, 1)) * max(1, bn // max(wn, 1)) * (128 if wgmma else 32)
    bitplane = wl.a_layout is Layout.BITPLANE
    p, q = (wl.w.bits, wl.a.bits) if bitplane else (1, 1)
    acc_planes = p * (1 if c.get("FUSE_PLANES") else q)
    taps, chans = _conv_taps(wl)
    in_place = bool(int(c.get("A_IN_HALO", 0)))  # the stages carry the weights only
    if bitplane:
        step = kt * _B1_STEP_BITS
        steps = taps * math.ceil(math.ceil(chans / 32) * 32 / step)
        row_bytes = kt * _B1_STEP_BITS // 8
        smem = stages * ((0 if in_place else bm * q) + bn * p) * row_bytes
        rate, a_bytes = "b1_and", 1 / 8
    else:  # the s8 wgmma mode: a k tile of KT x 32 bytes
        step = kt * 32
        steps = taps * math.ceil(chans / step)
        smem = stages * (bm + bn) * step
        rate, a_bytes = "int8", 1.0
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    other = 32 if wgmma and not c.get("PERSIST") else 48  # bitserial_family's OTHER_REGS*
    regs = min(255, bm * bn * acc_planes // tile_threads + other)
    return Geometry("bitserial", rate, m, n, k, bm, bn, math.ceil(m / bm) * bm, tiles, split,
                    step, math.ceil(steps / split), tile_threads * team, stages, smem, regs,
                    bool(int(c.get("PERSIST", 0))), p * q, a_bytes)


def _mma_conv(wl: Workload, c: Mapping, template: str) -> Geometry:
    m, n, k = wl.gemm_shape
    wm_, wn_ = int(c["warps_m"]), int(c["warps_n"])
    bm, bn = wm_ * int(c.get("tiles_m", 1)) * 16, wn_ * int(c.get("tiles_n", 1)) * 16
    bk = int(c.get("k_chunk", 32))
    four = template.endswith("s4")
    taps, chans = _conv_taps(wl)
    steps = taps * math.ceil(chans / bk)
    elem = 0.5 if four else 1.0
    return Geometry("mma_conv", "int4_mma_sync" if four else "int8_mma_sync", m, n, k, bm, bn,
                    math.ceil(m / bm) * bm, math.ceil(m / bm) * math.ceil(n / bn), 1, bk,
                    steps, 32 * wm_ * wn_, 2, int(2 * (bm + bn) * bk * elem),
                    min(255, bm * bn // (32 * wm_ * wn_) + 48), False, 1, elem)


def _generic(wl: Workload, c: Mapping, template: object) -> Geometry:
    s = launch_shape(wl, c, template if hasattr(template, "launch_shape") else None)
    taps, _ = _conv_taps(wl)
    # the reduction per tap as the launch shape gives it (C, or C / groups padded to a grouped
    # template's tile span)
    steps = taps * math.ceil(s.K // taps / s.block_k)
    tiles = math.ceil(s.M / s.block_m) * math.ceil(s.N / s.block_n)
    bits = s.operand_bits
    rate = "b1_and" if bits < 8 and wl.a_layout is Layout.BITPLANE else "int8"
    return Geometry("generic", rate, s.M, s.N, s.K, s.block_m, s.block_n,
                    math.ceil(s.M / s.block_m) * s.block_m, tiles, s.split_k, s.block_k,
                    math.ceil(steps / s.split_k), s.threads, s.stages, s.smem_bytes,
                    s.regs_per_thread, False, 1, bits / 8)


def fp16_geometry(wl: Workload, block_m: int = 128, block_n: int = 128, split: int = 1
                  ) -> Geometry:
    """The library fp16 path (cuDNN / cuBLAS) seen as one of its tilings: block_m x block_n x
    64 tiles, 8 warps, 3 stages, `split`-way split-K (`calibrate.fp16_estimate_us` takes the
    fastest of a few, as the library's heuristics pick a kernel per shape)."""
    m, n, k = wl.gemm_shape
    taps, chans = _conv_taps(wl)
    steps = taps * math.ceil(chans / 64)
    return Geometry("fp16", "fp16", m, n, k, block_m, block_n, math.ceil(m / block_m) * block_m,
                    math.ceil(m / block_m) * math.ceil(n / block_n), split, 64,
                    math.ceil(steps / split), 256, 3, 3 * (block_m + block_n) * 64 * 2,
                    min(255, block_m * block_n // 256 + 40), False, 1, 2.0)


def kernel_params(template: object, config: Mapping) -> Mapping:
    """What the model reads of a config: the full kernel parameters of a bit-serial template's
    config (`kernel_spec`; legacy "cuda.bitserial" configs included), else the config itself
    (also for a bit-serial config that names no kernel of today: its knobs as they are)."""
    name = template if isinstance(template, str) else getattr(template, "name", "")
    if name in BY_NAME or name == LEGACY:
        try:
            return kernel_spec(name, config)
        except (ValueError, KeyError):
            return config
    return config


def family_of(config: Mapping) -> str:
    """The family whose knobs `config` has (module doc)."""
    if "BLOCK_I" in config:
        return "tma_conv"
    if "BLOCK_M" in config:
        return "igemm"
    if "BM" in config and "KT" in config:
        return "bitserial"
    if "warps_m" in config:
        return "mma_conv"
    return "generic"


def geometry(template: object, workload: Workload, config: Mapping) -> Geometry:
    """Geometry of `config` for `workload` on `template` (a KernelTemplate or its name; the
    name "torch.fp16" gives `fp16_geometry`)."""
    name = template if isinstance(template, str) else getattr(template, "name", "")
    if name == "torch.fp16":
        return fp16_geometry(workload)
    config = kernel_params(name, config)
    fam = family_of(config)
    if fam == "igemm":
        return _igemm(workload, config, name)
    if fam == "tma_conv":
        return _tma_conv(workload, config)
    if fam == "bitserial":
        return _bitserial(workload, config, name)
    if fam == "mma_conv":
        return _mma_conv(workload, config, name)
    return _generic(workload, config, template)
