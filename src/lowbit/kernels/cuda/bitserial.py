"""Bit-serial (APNN-TC) conv2d and GEMM on 1-bit tensor cores (mma.sync m16n8k256 b1 AND).

Operands are in `Layout.BITPLANE` (`core/layout.py`): activations x [a_bits, N, H, W, ceil(C/32)]
(GEMM: [a_bits, M, ceil(K/32)]), weights w [w_bits, K, R, S, ceil(C/32)] (GEMM: [w_bits, N,
ceil(K/32)]), int32 words. A GEMM runs as the conv with H = W = R = S = 1. Every encoding pair is
rewritten onto AND-popcounts (`lowbit.reference.bitserial`); padded pixels contribute nothing
(input-aware padding). The fused epilogue gives int32, fp16, or requantized output in the INT8
or BITPLANE layout (bit planes packed in registers so the next layer reads them directly).

Knobs (the CUDA template parameters): BM x BN block tile (output rows x columns; BM=192, three
warpgroups in M, for wgmma kernels without tap-shift: a row tile count between those of 128 and
256, which can fill the SMs evenly where neither does), WM x WN warp tile, KT k256 steps per
pipeline stage, STAGES cp.async stages (12 only with A_IN_HALO), PERSIST (0: one tile per
block; 1: one wave of persistent blocks whose copy pipeline runs across tiles, hiding the load
latency of short reductions such as 3x3 convs on 64 channels; both MMA kinds), MMA ("mma_sync":
m16n8k256 per warp, fragments loaded from shared memory; "wgmma": Hopper warpgroup m64nNk256
reading both operands from shared memory through descriptors, sm_90a only, WM = 64 rows per
warpgroup, N = w_bits * WN), SWIZZLE (wgmma shared-memory layout: 0 = 8x16-byte core matrices,
32 = the 32-byte swizzle; mma.sync: 0), HALO (1: duplicate-aware load: the input rows of a
block's output pixels plus halo are copied once into shared memory and the im2col tiles are
gathered from there; convs with R*S > 1 and PERSIST=0 only), A_IN_HALO (one-tile wgmma kernels
with HALO=1, stride 1, channels a multiple of 256: 1 makes each block tile a BM / 8 x 8 tile of
output pixels whose input window sits in shared memory as 16-byte channel chunks by pixel, so
the wgmma descriptors address every tap's A tile in place: no im2col copies or gather at all,
the stages carry the weights only), BULK_WEIGHTS (A_IN_HALO with every k tile resident, one k
slice: 1 brings each k tile's weights as one bulk copy on an mbarrier from a stage image made at
bind, `bitserial_wimage`, instead of 16-byte cp.async by every thread), TMA_HALO (A_IN_HALO,
one k slice; 32, 64 or 128: the input window by the tensor copy engine, one copy per plane and
channel block of that many bytes per pixel, into pixel rows with that swizzle that the MMAs
read in place, a barrier per block, instead of 16-byte cp.async by channel group; the launcher
passes a tensor map of x), PLANE_ROWS (A_IN_HALO with two activation planes, one k slice: 1
makes a warp's 16 rows one output row's 8 pixels in each plane, so one wgmma per slab covers
both planes, BM / 16 x 8 pixel tiles), ROWSUM (binary weights
only: "mma" computes the activation rows' popcounts with one more MMA per plane and k step
against a tile of ones; "table" reads them from a per-pixel popcount table of x made by a small
kernel first, summed over the valid taps in the epilogue; "slab", persistent TAP_SHIFT=1 kernels
with STAGES=3: popcounts of the block's input slab in shared memory, summed over each row's taps
while the tile's MMAs run; "cols", wgmma kernels with BN = WN: ones columns appended to the
weights, so the products' wgmma (N = WN + 16) gives the popcounts too and reads each A tile once
instead of twice), REQUANT (requantized bit-plane output of 1-2 bits
only: "multiply" requantizes each output in 64-bit fixed point; "threshold" compares it with
per-column integer thresholds that fold in bias and ReLU, `lowbit.reference.requant_thresholds`,
and for binary activations each tap rectangle's weight sums: one multiply-add and the compares
per output), SPLIT_K (one-tile-per-block kernels: the k tiles split over SPLIT_K blocks per
tile, grid.z; each stores its k-linear partial sums to a workspace and the tile's last block to
arrive adds them up and runs the epilogue: for grids of few tiles with long reductions; mma.sync
only), TAP_SHIFT (1: wgmma convs of stride 1 on C <= 64 or a multiple of 128 channels computed
in a zero-margined virtual pixel grid, each tap's A operand a descriptor view into the block's
one input slab: no im2col copies, `tap_shift.py`; KT=1; STAGES=3, or with PERSIST=1 (weights
resident, three slab buffers) 4: the next tile's MMAs in a second accumulator set during this
tile's epilogue), ROW_TABLE (without ROWSUM="table": 0 works out each row's output row and
tap rectangle from its row index in the epilogue; 1 reads them from a per-row table that bind
fills from the geometry; 2, TAP_SHIFT=1 only, also each slab copy's input pixel), TEAMS
(persistent wgmma kernels, with TAP_SHIFT=1 STAGES=3: 2 puts two teams of the tile's
warpgroups in one block, each with its own stages or slabs, taking the block's tiles in turn,
their MMA issue alternating so that one team's MMAs run while the other team's epilogue does;
TAP_SHIFT=1 teams share the resident weights), FUSE_PLANES (wgmma, unsigned two-bit
activations: 1 sums the activation planes in one accumulator on the tensor cores, plane 1
issued twice, a0 + a1 + a1: three MMAs per k step instead of two, for half the accumulator
registers and one multiply-add less per output; for epilogue-bound layers), SLICES (one-tile
wgmma kernels without tap-shift or split-K, on grids under two waves: 2 or 4 sets of the tile's
warpgroups reduce k tile ranges of the same tile, each with its own stages and named barrier,
the first adding the others' sums from shared memory before the epilogue), THR_PAIRS
(wgmma threshold kernels, WN = 64, 128 or 256, the compared values within 2^15 of each other,
`pair_range`: 1 compares two columns per 32-bit add in 16-bit halves, each lane's columns
holding contiguous output channels, the weights' B rows permuted to match, so its threshold
bits pack into its own bytes: about 5 instructions per output instead of 9).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import ClassVar

import torch

from ...core import Config, ConfigSpace, ConvWorkload, Encoding, Knob, Layout, Workload
from ...core.epilogue import OUT_FP16, EpilogueParams
from ...core.validate import check_inputs, output_buffer
from ...reference.bitserial import plane_coefficients
from ...reference.epilogue import INT32_MAX, THRESHOLD_MAX_BITS, requant_thresholds
from ..base import NUM_SMS, KernelTemplate
from .nvrtc import DEFAULT_ARCH, CudaKernel, compile_cubin, device_arch, tensor_map_tiled
from .tap_shift import group_words, render_tables, shift_plan
from .tap_shift import unsupported_reason as shift_unsupported_reason

MAX_BITS = 4          # per operand; wider precisions belong to the int8 path
MAX_ACC_REGS = 160    # int32 accumulators per thread (p*q plane pairs share the register file)
OTHER_REGS = 48       # registers besides the accumulators (fragments, addresses), estimated
# One-tile wgmma blocks without tap-shift and with one accumulator plane (w1a1, or two-bit
# activations with FUSE_PLANES) keep fewer: ptxas (NVRTC 13.0, sm_90a) fits BM=192, BN=WN=256
# (132 accumulator registers with w1a1's row sums, 136 with fused w1a2's, 384 threads) in 168
# registers with 12-32 (w1a1) and 132-152 (fused w1a2, without the halo) bytes of spill. The
# w1a1 block ran 1.14-1.5x faster than every config inside the 48-register estimate on
# ResNet-50 s4 / s5 (NOTES.md, "Wide one-tile blocks"), the fused w1a2 one 9% faster than the
# best committed config on s5 and 1.4% on GEMM 4096 (12% slower on s4). Blocks of several
# accumulator planes that the smaller estimate would admit spill 76-232 bytes.
OTHER_REGS_WGMMA_TILE = 32
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80, sm_90)
MAX_SMEM = 160 * 1024  # bytes of dynamic shared memory a config may use (sm_80: 163 KB)
MAX_COPY_ITERS = 16   # copy chunks per thread per stage (row index registers)
GRID_Y_MAX = 65535
SPLIT_K_VALUES = (1, 2, 4, 8)
SLICES_VALUES = (1, 2, 4)
# Split-K only where the tile grid leaves SMs idle: under two waves of one block per SM
# (larger grids fill the GPU without it, and each split re-stores a tile's sums).
SPLIT_K_MAX_TILES = 2 * NUM_SMS
WGMMA_ARCH = "sm_90a"  # wgmma needs the arch-specific Hopper target
# N of wgmma m64nNk256 for s32 b1 (PTX ISA): multiples of 8 to 32, then of 16 to 256
WGMMA_N = frozenset([8, 16, 24, 32, *range(48, 257, 16)])
MAX_WARPGROUPS = 4
# STAGES for A_IN_HALO's weight-only stages: every k tile of a 3 x 3 conv on 1,024 channels at
# KT = 4 (9 k tiles) resident, none refilled (bitserial_wgmma.cu, RESIDENT_STAGES)
RESIDENT_STAGES = 12
# ROWSUM="cols": B rows after each k slab's weight rows, 8 of ones and 8 of zeros (wgmma N
# above 32 is a multiple of 16); bitserial_common.cu's ONES_ROWS
ONES_ROWS = 16


@cache
def _cu(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


def kernel_file(config: Mapping) -> str:
    """The .cu body of a config's kernel (after bitserial_common.cu)."""
    if tap_shift(config):  # both kernels, one tile per block and persistent
        return "bitserial_wgmma_shift.cu"
    if config["MMA"] == "wgmma":
        return "bitserial_wgmma_persistent.cu" if config["PERSIST"] else "bitserial_wgmma.cu"
    return "bitserial_persistent.cu" if config["PERSIST"] else "bitserial.cu"


def kernel_name(config: Mapping) -> str:
    if tap_shift(config):
        return "bitserial_wgmma_shift_persistent" if config["PERSIST"] else "bitserial_wgmma_shift"
    return {"bitserial_wgmma.cu": "bitserial_wgmma",
            "bitserial_wgmma_persistent.cu": "bitserial_wgmma_persistent",
            "bitserial_persistent.cu": "bitserial_persistent",
            "bitserial.cu": "bitserial_kernel"}[kernel_file(config)]


def _asm_operands(names: list[str]) -> tuple[str, str]:
    regs = ", ".join(f"%{i}" for i in range(len(names)))
    return regs, ", ".join(f'"+r"({n})' for n in names)


def wgmma_source(w_bits: int, wn: int, s8_atype: str | None = None,
                 ones_cols: bool = False) -> str:
    """wgmma_planes (one activation plane x all w_bits weight planes of WN columns: m64nNk256,
    N = w_bits * WN) and wgmma_rowsum (m64n8k256 against ones) as inline PTX. Register d[k] of
    the s32 m64nN fragment is row g (+8 for k % 4 >= 2), column 8 (k / 4) + 2 t4 + k % 2: the
    mma.sync m16n8 layout per n8 tile, so acc[i][j][0][ni][e] is register (j * NT + ni) * 4 + e.
    s8_atype ("s8" / "u8"): the int8 mode, m64nNk32 .s32.<s8_atype>.s8 on a 32-byte k slab.
    `accumulate` is the instruction's scale-d: 0 writes d = a * b, ignoring d's old values (a
    tile's first k step; no zeroed accumulators: ptxas 13.0 miscompiled those, reusing a
    register the previous wgmma had written as a zero source). ones_cols (ROWSUM="cols"):
    also wgmma_planes_ones, m64n(N+16)k256 whose last 16 B rows are the ones and zeros after
    the weights: rs[0][0..3] the row popcounts' registers, rs[0][4..7] the zero columns'."""
    n = w_bits * wn
    regs_of = [f"d[{j}][0][{ni}][{e}]" for j in range(w_bits) for ni in range(wn // 8)
               for e in range(4)]
    if s8_atype:
        main = f"m64n{n}k32.s32.{s8_atype}.s8"
    else:
        main = f"m64n{n}k256.s32.b1.b1.and.popc"
    out = []
    wrappers = [("wgmma_planes", main, regs_of, "int (&d)[P_BITS][MT][NT][4]"),
                ("wgmma_rowsum", "m64n8k256.s32.b1.b1.and.popc",
                 [f"d[0][{e}]" for e in range(4)], "int (&d)[MT][RS_REGS]")]
    if ones_cols:
        wrappers.append(("wgmma_planes_ones", f"m64n{n + ONES_ROWS}k256.s32.b1.b1.and.popc",
                         regs_of + [f"rs[0][{e}]" for e in range(8)],
                         "int (&d)[P_BITS][MT][NT][4], int (&rs)[MT][RS_REGS]"))
    for fn, op, names, arr in wrappers:
        regs, ops = _asm_operands(names)
        k = len(names)
        out.append(
            f"__device__ __forceinline__ void {fn}({arr}, u64 da, u64 db, int accumulate) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.{op} "\n'
            f'      "{{{regs}}}, %{k}, %{k + 1}, p;\\n}}\\n"\n'
            f'      : {ops}\n      : "l"(da), "l"(db), "r"(accumulate));\n}}\n')
    if not ones_cols:  # named in a discarded `if constexpr` branch of the tap-shift kernel
        out.append("__device__ void wgmma_planes_ones(int (&d)[P_BITS][MT][NT][4], "
                   "int (&rs)[MT][RS_REGS], u64 da, u64 db, int accumulate);\n")
    return "".join(out)


@dataclass(frozen=True)
class Shape:
    """The conv view of a workload: GEMMs are 1x1 convs on 1x1 images."""

    nb: int
    h: int
    w: int
    c: int
    kout: int
    r: int
    s: int
    stride: int
    pad: int
    p: int
    q: int

    chan_bits: int = 1  # bits per channel in a word row: 1 (bit planes) or 8 (int8 layout)

    @property
    def words(self) -> int:
        return -(-self.c * self.chan_bits // 32)

    @property
    def rows(self) -> int:
        return self.nb * self.p * self.q

    @property
    def k_words(self) -> int:
        return self.r * self.s * self.words


def int8_operands(wl: Workload) -> bool:
    """Operands in the int8 layout (the s8 wgmma mode, `int8_wgmma.py`), not bit planes."""
    return wl.a_layout is Layout.INT8


def planes(wl: Workload) -> tuple[int, int]:
    """(activation planes, weight planes) of the kernel: the bit widths, or (1, 1) of bytes."""
    return (1, 1) if int8_operands(wl) else (wl.a.bits, wl.w.bits)


def conv_shape(wl: Workload) -> Shape:
    bits = 8 if int8_operands(wl) else 1
    if isinstance(wl, ConvWorkload):
        return Shape(wl.N, wl.H, wl.W, wl.C, wl.K, wl.R, wl.S, wl.stride, wl.pad, wl.P, wl.Q,
                     bits)
    m, n, k = wl.gemm_shape
    return Shape(m, 1, 1, k, n, 1, 1, 1, 0, 1, 1, bits)


def copy_vec(shape: Shape) -> int:
    """Words per cp.async chunk: 16-byte copies when the channel words of a tap allow it."""
    return next(v for v in (4, 2, 1) if shape.words % v == 0)


def _out_mode(wl: Workload) -> int:
    epi = wl.epilogue
    if epi.requantizes:
        return 3 if epi.out_layout is Layout.BITPLANE else 2
    return 1 if epi.out == OUT_FP16 else 0


def threshold_epilogue(wl: Workload) -> bool:
    """Requantized bit-plane output of <= THRESHOLD_MAX_BITS bits: the epilogue can compare
    each output with per-column thresholds (`requant_thresholds`) instead of requantizing it."""
    epi = wl.epilogue
    return (epi.requantizes and epi.out_layout is Layout.BITPLANE
            and epi.out.bits <= THRESHOLD_MAX_BITS)


def requant_knob(wl: Workload) -> Knob:
    """REQUANT: "threshold" where `threshold_epilogue` allows it."""
    return Knob("REQUANT", ("multiply", "threshold") if threshold_epilogue(wl) else ("multiply",))


def uses_thresholds(config: Mapping) -> bool:
    """The kernel requantizes by thresholds (knob REQUANT="threshold")."""
    return config.get("REQUANT", "multiply") == "threshold"


def epilogue_thresholds(wl: Workload, config: Mapping, params: EpilogueParams
                        ) -> torch.Tensor | None:
    """The int32 [wsum_columns, threshold_stride] table a REQUANT="threshold" kernel reads
    (None otherwise), on the device of params.multiplier: `requant_thresholds` in front, padded
    past KOUT and past the levels with INT32_MAX (never reached), so the kernel loads every
    column of a block tile unguarded and a column pair's thresholds as 16-byte loads."""
    if not uses_thresholds(config):
        return None
    thr = requant_thresholds(wl.epilogue, params)
    table = torch.full((wsum_columns(conv_shape(wl)), threshold_stride(wl)), INT32_MAX,
                       dtype=torch.int32)
    table[: thr.shape[0], : thr.shape[1]] = thr
    if pairs_in_memory(wl, config) and not needs_wtap(wl):
        table = pair_table(wl, config, table)  # binary activations: wtap part 4 instead
    return table.to(params.multiplier.device)


def pair_channel(j: torch.Tensor, wn: int) -> torch.Tensor:
    """The output channel that accumulator column j of a THR_PAIRS warp tile of wn columns
    holds (bitserial_common.cu's pair_channel: lane t4 owns channels [wn/4 t4, wn/4 (t4 + 1)))."""
    ni, t4, e = j // 8, j % 8 // 2, j % 2
    return wn // 4 * t4 + 16 * (ni // 8) + 8 * e + ni % 8


def pair_table(wl: Workload, config: Mapping, table: torch.Tensor) -> torch.Tensor:
    """THR_PAIRS without thresholds in shared memory: the int32 [rows / 2, PAIR_STRIDE] table of
    packed words from the [rows, threshold_stride] thresholds, per pair of accumulator columns
    (2p, 2p + 1; their channels by `pair_channel` within each WN-wide warp tile) and level:
    0x8000 + base - t in each 16-bit half, t clamped to [base, hi + 1] (`pair_range`)."""
    r, wn = pair_range(wl), config["WN"]
    cols = torch.arange(table.shape[0])
    chans = cols // wn * wn + pair_channel(cols % wn, wn)
    levels = wl.epilogue.out.qmax - wl.epilogue.out.qmin
    t = table[chans, :levels].to(torch.int64).clamp(r.base, r.hi + 1)
    half = 0x8000 + r.base - t
    words = half[0::2] | (half[1::2] << 16)
    out = torch.zeros(table.shape[0] // 2, threshold_stride(wl), dtype=torch.int64)
    out[:, :levels] = words
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


def threshold_stride(wl: Workload) -> int:
    """ints per column of the threshold tables: qmax - qmin levels, 3 padded to 4 so a column
    pair is two 16-byte loads (rendered as THR_STRIDE)."""
    levels = wl.epilogue.out.qmax - wl.epilogue.out.qmin
    return 4 if levels == 3 else levels


def slab_buffers(config: Mapping) -> int:
    """Input slabs a TAP_SHIFT=1 block keeps (rendered as SLAB_BUFFERS): persistent blocks 3
    (the slab two tiles ahead loads into the one the previous tile released), else 1."""
    return 3 if config["PERSIST"] else 1


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def render(wl: Workload, config: Config, wgmma_asm: bool = True, chained: int = 0) -> str:
    """CUDA source for (workload, config): constexpr parameters + the bitserial.cu body.
    wgmma_asm=False leaves out the inline-PTX wgmma wrappers (the host emulation supplies its
    own, `bitserial_emu.py`); chained = 1 or 2 renders the kernels for launch as programmatic
    dependents of the previous kernel on the stream, letting the next kernel launch at their
    start (1) or once their MMAs are issued (2) (`CHAIN_TRIGGERS`, `BitserialKernel.bind`)."""
    sh = conv_shape(wl)
    elem8 = int8_operands(wl)
    if elem8:  # one plane of bytes, products summed by the s8 tensor cores: coefficients 1
        aa, ba, ab, bb = 1, 0, 1, 0
    else:
        aa, ba, _ = plane_coefficients(wl.a)
        ab, bb, _ = plane_coefficients(wl.w)
    q, p = planes(wl)
    epi = wl.epilogue
    out = epi.out if epi.requantizes else None
    params = {
        "Q_BITS": q, "P_BITS": p, "ELEM8": int(elem8),
        "A_SIGNED": int(wl.a.encoding is Encoding.SIGNED and not elem8),
        "W_SIGNED": int(wl.w.encoding is Encoding.SIGNED and not elem8),
        "A_ALPHA": aa, "A_BETA": ba, "W_ALPHA": ab, "W_BETA": bb,
        "NB": sh.nb, "H": sh.h, "W": sh.w, "C": sh.c, "CW": sh.words, "KOUT": sh.kout,
        "R": sh.r, "S": sh.s, "STRIDE": sh.stride, "PAD": sh.pad, "P_OUT": sh.p, "Q_OUT": sh.q,
        "BM": config["BM"], "BN": config["BN"], "WM": config["WM"], "WN": config["WN"],
        "KT": config["KT"], "STAGES": config["STAGES"], "PERSIST": config["PERSIST"],
        "WGMMA": int(config["MMA"] == "wgmma"), "SWIZZLE": config["SWIZZLE"],
        "HALO": config["HALO"], "ROWSUM_TABLE": int(rowsum_table(config)),
        "ROWSUM_SLAB": int(rowsum_slab(config)), "ROWSUM_COLS": int(rowsum_cols(config)),
        "SPLIT_K": split_k(config), "TAP_SHIFT": int(tap_shift(config)),
        "ROW_TABLE": int(config.get("ROW_TABLE", 0)), "TEAMS": teams(config),
        "SLICES": slices(config), "SLICE_SUM_WORDS": slice_sum_words(wl, config),
        "HALO_WORDS": halo_bytes(wl, config) // 4 // q, "A_IN_HALO": int(a_in_halo(config)),
        "TILES_Y": pixel_tiles(wl, config)[0], "TILES_X": pixel_tiles(wl, config)[1],
        "BULK_WEIGHTS": int(bulk_weights(config)), "TMA_HALO": int(tma_halo(config)),
        "PLANE_ROWS": int(plane_rows(config)),
        "VEC": copy_vec(sh), "XPOP_LANES": xpop_lanes(sh), "KPAD": wsum_columns(sh),
        "WSUM0": wsum_start(sh),
        "HAS_BIAS": int(epi.bias), "RELU": int(epi.relu), "OUT_MODE": _out_mode(wl),
        "OUT_THRESH": int(uses_thresholds(config)),
        "OUT_BITS": out.bits if out else 1, "OUT_QMIN": out.qmin if out else 0,
        "OUT_QMAX": out.qmax if out else 0,
        "THR_STRIDE": threshold_stride(wl) if uses_thresholds(config) else 1,
        "THR_SLOTS": threshold_slots(wl, config),
        "FUSE_PLANES": fuse_planes(config),
        "THR_PAIRS": int(thr_pairs(config)), "CHAINED": int(chained),
        **pair_params(wl, config),
    }
    lines = [f"// lowbit bit-serial kernel for {wl.key}", f"// config {config.to_json()}"]
    lines += [f"constexpr int {k} = {int(v)};" for k, v in params.items()]
    lines.append(f"constexpr long long M_ROWS = {sh.rows}ll;")
    tma = tma_halo(config)  # the tensor map parameter, and what the kernel passes on of it
    lines.append("#define BITSERIAL_XMAP_PARAM" + (", const __grid_constant__ TensorMap xmap"
                                                   if tma else ""))
    lines.append(f"#define BITSERIAL_XMAP {'&xmap' if tma else 'nullptr'}")
    slots = rect_slots(sh) if params["THR_SLOTS"] and needs_wtap(wl) else [0]
    lines.append(f"__device__ constexpr int RECT_OF_SLOT[] = {{{', '.join(map(str, slots))}}};")
    if tap_shift(config):
        lines.append(render_tables(shift_plan(sh, config["BM"])))
        lines.append(f"constexpr int SLAB_BUFFERS = {slab_buffers(config)};")
    else:  # out_row's virtual grid: the output itself, or A_IN_HALO's pixel tiles
        lines.append("constexpr int VQ = 1, VP = 1;\n"
                     f"constexpr long long V_ROWS = {block_rows(wl, config)}ll;")
    body = _cu("bitserial_common.cu")
    if config["MMA"] == "wgmma":
        if wgmma_asm:
            body += wgmma_source(p, config["WN"], s8_atype(wl) if elem8 else None,
                                 rowsum_cols(config))
        body += _cu("bitserial_wgmma_common.cu")
    return "\n".join(lines) + "\n" + body + _cu(kernel_file(config))


def tap_shift(config: Mapping) -> bool:
    """The conv runs as shifted views of one input slab per block (knob TAP_SHIFT=1,
    `tap_shift.py`)."""
    return bool(config.get("TAP_SHIFT", 0))


def teams(config: Mapping) -> int:
    """Teams of warpgroups per block, each working its own tiles (knob TEAMS; 1 where a config
    lacks it)."""
    return int(config.get("TEAMS", 1))


def fuse_planes(config: Mapping) -> bool:
    """The activation planes summed in one accumulator by the MMAs (knob FUSE_PLANES; 0 where
    a config lacks it)."""
    return bool(config.get("FUSE_PLANES", 0))


def thr_pairs(config: Mapping) -> bool:
    """Threshold bits of two columns per 32-bit add (knob THR_PAIRS; 0 where absent)."""
    return bool(config.get("THR_PAIRS", 0))


def pairs_in_memory(wl: Workload, config: Mapping) -> bool:
    """THR_PAIRS reading its packed thresholds from global memory (`pair_table`, or for binary
    activations the wtap table's part 4): no `threshold_slots` in shared memory."""
    return thr_pairs(config) and not threshold_slots(wl, config)


def pair_params(wl: Workload, config: Mapping) -> dict[str, int]:
    """PAIR_YLO, PAIR_YHI, PAIR_DOT_LO of `pair_range` (zeros without THR_PAIRS)."""
    r = pair_range(wl) if thr_pairs(config) else None
    return {"PAIR_YLO": r.base if r else 0, "PAIR_YHI": r.hi if r else 0,
            "PAIR_DOT_LO": r.dot_lo if r else 0}


PAIR_SPAN = 1 << 15  # the values a THR_PAIRS half compares: under 2^15 apart, no carries


@dataclass(frozen=True)
class PairRange:
    """Bounds of what a THR_PAIRS epilogue packs into 16-bit halves (rendered as PAIR_YLO,
    PAIR_YHI, PAIR_DOT_LO): the compared value y = S * dot + term (S = A_ALPHA * W_ALPHA, dot =
    sum_ij c_i d_j acc_ij, term = A_ALPHA * W_BETA * sum_i c_i rs_i) lies in [base, hi], base
    also <= S * dot_lo + term's least value, so each half holds y - base as the sum of
    S * (dot - dot_lo) >= 0 and the row's term - base + S * dot_lo >= 0."""
    base: int
    hi: int
    dot_lo: int


@cache
def pair_range(wl: Workload) -> PairRange | None:
    """The THR_PAIRS bounds of `wl`, or None where THR_PAIRS cannot apply: the int8 mode, or y
    spanning 2^15 values or more (16-bit halves would carry). Every product popcount acc_ij and
    row popcount rs_i counts at most K = R * S * C bits (a GEMM's K); binary weights (one plane)
    also have acc_i <= rs_i, so a plane's W_ALPHA * acc_i + W_BETA * rs_i is extreme at
    (acc_i, rs_i) = (0, 0), (0, K) or (K, K)."""
    if int8_operands(wl):
        return None
    aa, _, ca = plane_coefficients(wl.a)
    ab, bb, cw = plane_coefficients(wl.w)
    sh = conv_shape(wl)
    k = sh.r * sh.s * sh.c
    prods = [ci * dj for ci in ca for dj in cw]
    dot_lo, dot_hi = k * sum(min(0, p) for p in prods), k * sum(max(0, p) for p in prods)
    if bb:
        ends = [ab * acc + bb * rs for acc, rs in ((0, 0), (0, k), (k, k))]
        lo = sum(aa * min(c * e for e in ends) for c in ca)
        hi = sum(aa * max(c * e for e in ends) for c in ca)
        term_lo = k * sum(min(0, aa * bb * c) for c in ca)
    else:
        lo, hi, term_lo = aa * ab * dot_lo, aa * ab * dot_hi, 0
    base = min(lo, aa * ab * dot_lo + term_lo)
    if aa * ab <= 0 or hi - base + 1 > PAIR_SPAN:
        return None
    return PairRange(base, hi, dot_lo)


def acc_planes(wl: Workload, config: Mapping) -> int:
    """Activation planes with accumulators of their own: a_bits, 1 with FUSE_PLANES."""
    return 1 if fuse_planes(config) else planes(wl)[0]


def fusable_planes(wl: Workload) -> bool:
    """Activation planes whose coefficients (1, 2) the tensor cores can add: plane 1 issued
    twice into plane 0's accumulator (unsigned two-bit activations)."""
    return (planes(wl)[0] == 2 and not int8_operands(wl)
            and wl.a.encoding is Encoding.UNSIGNED)


def uses_row_table(config: Mapping) -> bool:
    """The epilogue reads each row's output row and tap rectangle from a table (knob
    ROW_TABLE=1 or 2) instead of working them out from the (virtual) row; with 2 the slab
    copies of a TAP_SHIFT=1 kernel read their input pixels from one too."""
    return bool(config.get("ROW_TABLE", 0))


def row_table(wl: Workload, config: Mapping, device: torch.device | str
              ) -> torch.Tensor | None:
    """ROW_TABLE=1: int32 [row tiles * BM, 2], for every row v the blocks tile (the output rows,
    or the tap-shift grid's virtual rows) its output row (M_ROWS where v lies in the margin or
    past the last image: dropped) and the
    id of its tap rectangle (the taps whose input lies inside the image; the kernel's
    `rect_id` of `tap_range` on both axes; with `threshold_slots` of binary activations its
    slot in `rect_slots`). ROW_TABLE=2: flat, followed by the input pixel of
    every virtual input position f >= -BASE a slab copy reads, at f + BASE (-1 in the margin,
    before the first image or past the last: copied as zeros). Depends on the geometry alone;
    None without ROW_TABLE."""
    if not uses_row_table(config):
        return None
    sh = conv_shape(wl)
    if not tap_shift(config):  # the output rows themselves
        return _row_entries(sh, sh.q, sh.p, sh.rows, config["BM"], device)
    plan = shift_plan(sh, config["BM"])
    rows = _row_entries(sh, plan.vq, plan.vp, plan.v_rows, config["BM"], device)
    if threshold_slots(wl, config) and needs_wtap(wl):  # rect ids -> slots (no pixel's: 0)
        slot = torch.zeros((sh.r + 1) ** 2 * (sh.s + 1) ** 2, dtype=torch.int32, device=device)
        ids = torch.tensor(rect_slots(sh), device=device)
        slot[ids] = torch.arange(len(ids), dtype=torch.int32, device=device)
        rows[:, 1] = slot[rows[:, 1].long()]
    if config["ROW_TABLE"] < 2:
        return rows
    f = torch.arange(rows.shape[0] + plan.slab_pix + plan.per_entry, device=device) - plan.base
    n, y, col = _grid_coords(f, plan.vq, plan.vp)
    inside = (n >= 0) & (n < sh.nb) & (y < sh.h) & (col < sh.w)
    pix = torch.where(inside, (n * sh.h + y) * sh.w + col, torch.full_like(f, -1))
    return torch.cat([rows.flatten(), pix.to(torch.int32)])


def _grid_coords(v: torch.Tensor, vq: int, vp: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(n, y, col) of v = (n * vp + y) * vq + col, 0 <= y < vp, 0 <= col < vq, floor-wise (the
    kernel's vpos_floor: n < 0 before the grid)."""
    t = v // vq  # torch's // floors, like Python's
    return t // vp, t % vp, v % vq


def _row_entries(sh: Shape, vq: int, vp: int, v_rows: int, bm: int,
                 device: torch.device | str) -> torch.Tensor:
    """ROW_TABLE's [row tiles * BM, 2] {output row, tap rectangle id} part (row_table) for
    rows v = (n * vp + y) * vq + col: the tap-shift grid's, or the output's (vq, vp = Q, P)."""
    v = torch.arange(-(-v_rows // bm) * bm, device=device)
    n, y, col = _grid_coords(v, vq, vp)
    inside = (n < sh.nb) & (y < sh.p) & (col < sh.q)
    m = torch.where(inside, (n * sh.p + y) * sh.q + col, torch.full_like(v, sh.rows))

    def tap_range(start: torch.Tensor, extent: int, taps: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        lo = (-start).clamp(min=0)
        return lo, torch.maximum((extent - start).clamp(max=taps), lo)

    rlo, rhi = tap_range(y * sh.stride - sh.pad, sh.h, sh.r)
    slo, shi = tap_range(col * sh.stride - sh.pad, sh.w, sh.s)
    rect = ((rlo * (sh.r + 1) + rhi) * (sh.s + 1) + slo) * (sh.s + 1) + shi
    return torch.stack([m, rect], 1).to(torch.int32).contiguous()


def block_rows(wl: Workload, config: Mapping) -> int:
    """Rows the block tiles cover: the output rows, TAP_SHIFT's virtual rows, or A_IN_HALO's
    pixel tiles (BM rows each, margins included)."""
    sh = conv_shape(wl)
    if tap_shift(config):
        return shift_plan(sh, config["BM"]).v_rows
    if a_in_halo(config):
        return sh.nb * math.prod(pixel_tiles(wl, config)) * config["BM"]
    return sh.rows


def a_in_halo(config: Mapping) -> bool:
    """The MMAs read the A tiles in place from a pixel tile's halo (knob A_IN_HALO=1)."""
    return bool(config.get("A_IN_HALO", 0))


def bulk_weights(config: Mapping) -> bool:
    """Each k tile's weights arrive as one bulk copy of a bind-time image (knob BULK_WEIGHTS)."""
    return bool(config.get("BULK_WEIGHTS", 0))


def tma_halo(config: Mapping) -> int:
    """The swizzle width in bytes (32, 64, 128) of the channel blocks in which the input window
    arrives by tensor copies and is read in place; 0: cp.async (knob TMA_HALO)."""
    return int(config.get("TMA_HALO", 0))


def plane_rows(config: Mapping) -> bool:
    """A warp's 16 rows: one output row's 8 pixels in each of two activation planes, so one
    wgmma per slab covers both (knob PLANE_ROWS)."""
    return bool(config.get("PLANE_ROWS", 0))


def tile_rows(config: Mapping) -> int:
    """A_IN_HALO: output pixel rows of a block tile (8 pixels each): BM / 8, or BM / 16 with
    PLANE_ROWS."""
    return config["BM"] // 8 // (2 if plane_rows(config) else 1)


def window_shape(wl: Workload, config: Mapping) -> tuple[int, int]:
    """A_IN_HALO: the pixel tile's input window, (tile rows + R - 1) x (8 + S - 1) pixels (the
    kernels' HALO_H x HALO_W)."""
    sh = conv_shape(wl)
    return tile_rows(config) + sh.r - 1, 8 + sh.s - 1


def halo_blocks(wl: Workload, config: Mapping) -> int:
    """TMA_HALO: channel blocks per plane of the window (0 without)."""
    return conv_shape(wl).words * 4 // tma_halo(config) if tma_halo(config) else 0


def mbarrier_bytes(wl: Workload, config: Mapping) -> int:
    """Shared memory of the one-tile wgmma kernel's mbarriers, after the halo: one per k tile
    with BULK_WEIGHTS, one per channel block of the window with TMA_HALO (8 bytes each)."""
    return 8 * ((k_tiles(wl, config) if bulk_weights(config) else 0) + halo_blocks(wl, config))


def halo_map_geometry(wl: Workload, config: Mapping) -> tuple[list[int], list[int], list[int]]:
    """TMA_HALO's tensor map of x ([plane][image][row][column][channel words]): its dims and
    box (innermost first: bytes of a pixel's channels, columns, rows, plane x image) and its
    strides in bytes (dims 1..3). A box is one channel block (TMA_HALO bytes per pixel) of the
    pixel tile's HALO_H x HALO_W window."""
    sh = conv_shape(wl)
    pix = sh.words * 4
    dims = [pix, sh.w, sh.h, sh.nb * planes(wl)[0]]
    strides = [pix, pix * sh.w, pix * sh.w * sh.h]
    rows, cols = window_shape(wl, config)
    box = [tma_halo(config), cols, rows, 1]
    return dims, strides, box


def halo_tensor_map(wl: Workload, config: Mapping, x: torch.Tensor) -> ctypes.Array | None:
    """TMA_HALO: the tensor map of `x` (on the GPU) that the kernel's window copies read,
    swizzled TMA_HALO bytes, zeros out of bounds; None without TMA_HALO."""
    if not tma_halo(config):
        return None
    dims, strides, box = halo_map_geometry(wl, config)
    return tensor_map_tiled(x.data_ptr(), dims, strides, box, swizzle_bytes=tma_halo(config))


def weight_images(wl: Workload, config: Mapping, device: torch.device | str
                  ) -> torch.Tensor | None:
    """BULK_WEIGHTS: the int32 buffer of the weights' stage images [column tiles][k tiles]
    [stage words] that bitserial_wimage fills (None otherwise)."""
    if not bulk_weights(config):
        return None
    cols = tile_grid(wl, config)[0]
    words = stage_bytes(wl, config) // 4
    return torch.empty(cols * k_tiles(wl, config) * words, dtype=torch.int32, device=device)


def stage_bytes(wl: Workload, config: Mapping) -> int:
    """Shared memory of one pipeline stage: a_bits*BM (none with A_IN_HALO) + B rows, KT
    slabs of 32 bytes (the kernels' STAGE_WORDS * 4)."""
    a_rows = 0 if a_in_halo(config) else planes(wl)[0] * config["BM"]
    return (a_rows + b_rows(wl, config)) * config["KT"] * 32


def pixel_tiles(wl: Workload, config: Mapping) -> tuple[int, int]:
    """(tiles down, tiles across) of an A_IN_HALO block grid per image: BM / 8 x 8 output
    pixels per tile; (1, 1) without A_IN_HALO (rendered as TILES_Y, TILES_X)."""
    if not a_in_halo(config):
        return 1, 1
    sh = conv_shape(wl)
    return -(-sh.p // tile_rows(config)), -(-sh.q // 8)


def split_k(config: Mapping) -> int:
    """Blocks per output tile along the reduction (knob SPLIT_K; 1 where a config lacks it)."""
    return int(config.get("SPLIT_K", 1))


def k_tiles(wl: Workload, config: Mapping) -> int:
    """Pipeline stages of KT k256 slabs in one output tile's reduction (the kernel's KTILES)."""
    return -(-conv_shape(wl).k_words // (8 * config["KT"]))


def split_workspace(wl: Workload, config: Mapping, device: torch.device | str
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """SPLIT_K > 1: the int32 partial sums [SPLIT_K, row tiles * BM, column tiles * BN] and the
    per-tile arrival counters (zeros; the last block of a tile resets its counter, so both are
    reused by every launch of one bound kernel); (None, None) otherwise."""
    splits = split_k(config)
    if splits == 1:
        return None, None
    cols, rows = tile_grid(wl, config)
    ws = torch.empty(splits * rows * config["BM"] * cols * config["BN"], dtype=torch.int32,
                     device=device)
    return ws, torch.zeros(rows * cols, dtype=torch.int32, device=device)


def split_k_values(wl: Workload) -> tuple[int, ...]:
    """Values of the SPLIT_K knob: (1,) where no config could split (even the largest tiles
    make SPLIT_K_MAX_TILES tiles or more, or the reduction is a single k tile)."""
    sh = conv_shape(wl)
    fewest = -(-sh.rows // 256) * -(-sh.kout // 256)
    one_k_tile = sh.k_words <= 8
    return (1,) if fewest >= SPLIT_K_MAX_TILES or one_k_tile else SPLIT_K_VALUES


def slices_values(wl: Workload, arch: str) -> tuple[int, ...]:
    """Values of the SLICES knob (the k tiles of a one-tile wgmma block split over groups of
    its warpgroups): where split-K could apply, on sm_90a."""
    return SLICES_VALUES if arch == WGMMA_ARCH and len(split_k_values(wl)) > 1 else (1,)


def slices(config: Mapping) -> int:
    """Warpgroup sets that split a one-tile wgmma block's k tiles (knob SLICES; 1 where a
    config lacks it)."""
    return int(config.get("SLICES", 1))


def threads(config: Mapping) -> int:
    """Threads per block: a warp per WM x WN warp tile, a warpgroup for wgmma, per team or
    k slice."""
    return tile_threads(config) * teams(config) * slices(config)


def tile_threads(config: Mapping) -> int:
    """Threads that work one tile (a team's, with TEAMS > 1)."""
    per_tile = 128 if config["MMA"] == "wgmma" else 32
    return (config["BM"] // config["WM"]) * (config["BN"] // config["WN"]) * per_tile


@cache
def halo_rows(sh: Shape, bm: int) -> int:
    """Input rows (of the flattened image x row axis) that a block of `bm` output pixels reads,
    the maximum over all blocks: the height of the HALO=1 shared-memory slab."""
    most = 0
    for m0 in range(0, sh.rows, bm):
        m1 = min(m0 + bm, sh.rows) - 1
        (n0, p0), (n1, p1) = divmod(m0 // sh.q, sh.p), divmod(m1 // sh.q, sh.p)
        first = n0 * sh.h + max(0, p0 * sh.stride - sh.pad)
        last = n1 * sh.h + min(sh.h - 1, p1 * sh.stride - sh.pad + sh.r - 1)
        most = max(most, last - first + 1)
    return most


def halo_bytes(wl: Workload, config: Mapping) -> int:
    """Shared memory of the HALO=1 input slab: a_bits planes x rows x W x channel words; with
    A_IN_HALO the pixel tile's window, (BM / 8 + R - 1) x (8 + S - 1) pixels (rounded up to
    odd: the kernel's CHUNK_UNITS); with TMA_HALO its channel blocks of those pixels (rounded
    up to 8, the swizzle's period) and 1,024 bytes of slack per plane (the kernel aligns the
    first block to 1,024 bytes)."""
    if not config["HALO"]:
        return 0
    sh, q = conv_shape(wl), planes(wl)[0]
    if not a_in_halo(config):
        return q * halo_rows(sh, config["BM"]) * sh.w * sh.words * 4
    pixels = math.prod(window_shape(wl, config))
    if tma_halo(config):  # pixel rows rounded up to the swizzle's period of 8
        return q * (halo_blocks(wl, config) * -(-pixels // 8) * 8 * tma_halo(config) + 1024)
    if plane_rows(config):  # each 16-byte chunk's pixels of both planes, an odd count
        return (q * pixels | 1) * sh.words * 4
    return q * (pixels | 1) * sh.words * 4  # each chunk's pixels, an odd count (CHUNK_UNITS)


def needs_rowsum(wl: Workload) -> bool:
    """Binary bit-plane weights: the AND rewrite needs the activation rows' popcounts."""
    return wl.w.encoding is Encoding.BINARY and not int8_operands(wl)


def needs_wtap(wl: Workload) -> bool:
    """Binary bit-plane activations: the epilogue reads the per-column tap table (wtap)."""
    return wl.a.encoding is Encoding.BINARY and not int8_operands(wl)


def support_limits_reason(wl: Workload) -> str | None:
    """What the kernel cannot do whatever the operands' layout: packed requantized output,
    or row, weight or input-word indices past 32 bits; None when within the limits."""
    epi = wl.epilogue
    if epi.requantizes and epi.out_layout is Layout.PACKED:
        return "requantized output must be in the int8 or bitplane layout, not packed"
    sh = conv_shape(wl)
    if (sh.rows + 256 >= 2**31 or sh.kout * sh.k_words >= 2**31
            or sh.nb * sh.h * sh.w * sh.words >= 2**31):
        return "problem too large for 32-bit row indices"
    return None


#: bitserial_wtap runs a warp per output column, 4 per block; bitserial_xpop xpop_lanes lanes
#: per input pixel
WTAP_THREADS, XPOP_THREADS = 128, 256


def xpop_lanes(shape: Shape) -> int:
    """Lanes that share one pixel in bitserial_xpop: its channel words rounded up to a power
    of two, at most a warp."""
    return min(32, _pow2_ceil(shape.words))


def tile_grid(wl: Workload, config: Mapping) -> tuple[int, int]:
    """(column tiles, row tiles): the grid of the one-tile-per-block kernels."""
    sh = conv_shape(wl)
    return math.ceil(sh.kout / config["BN"]), math.ceil(block_rows(wl, config) / config["BM"])


def persistent_grid(wl: Workload, config: Mapping, blocks: int) -> tuple[int, int, int]:
    """Grid of a PERSIST=1 kernel that `blocks` resident blocks fill: one dimension over all
    tiles, or (TAP_SHIFT: each block keeps one column tile's weights) every column tile times
    the row-tile strides that fit."""
    cols, rows = tile_grid(wl, config)
    if tap_shift(config):
        return cols, max(1, min(rows, blocks // cols)), 1
    return max(1, min(cols * rows, blocks)), 1, 1


def wsum_columns(shape: Shape) -> int:
    """Columns of each tap rectangle's row of weight sums (bitserial_wtap part 2): KOUT rounded
    up to the widest block tile, so a block's columns never leave the row."""
    return -(-shape.kout // 256) * 256


def wsum_start(shape: Shape) -> int:
    """Where the tap rectangles' weight sums start in the wtap table: past the KOUT prefix
    tables of (R+1)(S+1) entries, rounded up to even (the kernel reads column pairs)."""
    return -(-shape.kout * (shape.r + 1) * (shape.s + 1) // 2) * 2


def side_tables(wl: Workload, config: Mapping, device: torch.device | str
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The int32 tables a launch fills before the main kernel (None where not needed): wtap
    [KOUT x (R+1)(S+1) prefix sums, then ((R+1)(S+1))^2 tap rectangles x KOUT rounded up to
    256 weight sums, then (REQUANT="threshold") as many x levels thresholds less those sums,
    then (THR_PAIRS without shared-memory slots) those packed, per rectangle KOUT/2 column pairs
    x PAIR_STRIDE words] for binary activations, xpop [planes x pixels] for ROWSUM="table"."""
    sh = conv_shape(wl)
    wtap = xpop = None
    if needs_wtap(wl):  # the prefix table, the weight sums per tap rectangle, their thresholds
        tab = (sh.r + 1) * (sh.s + 1)
        stride = threshold_stride(wl) if uses_thresholds(config) else 0
        rects = tab * tab * wsum_columns(sh)
        pairs = rects // 2 * stride if pairs_in_memory(wl, config) else 0
        wtap = torch.empty(wsum_start(sh) + rects * (1 + stride) + pairs, dtype=torch.int32,
                           device=device)
    if rowsum_table(config):
        xpop = torch.empty(planes(wl)[0] * sh.nb * sh.h * sh.w, dtype=torch.int32,
                           device=device)
    return wtap, xpop


def side_table_blocks(wl: Workload) -> tuple[int, int]:
    """Blocks of the bitserial_wtap and bitserial_xpop launches."""
    sh = conv_shape(wl)
    return (math.ceil(sh.kout * 32 / WTAP_THREADS),
            math.ceil(sh.nb * sh.h * sh.w * xpop_lanes(sh) / XPOP_THREADS))


def s8_atype(wl: Workload) -> str:
    """PTX type of the activation bytes for the s8 wgmma mode (weights are always .s8)."""
    return "u8" if wl.a.encoding is Encoding.UNSIGNED else "s8"


def rowsum_table(config: Mapping) -> bool:
    """Binary weights' row popcounts from the per-pixel table (knob ROWSUM="table")."""
    return config.get("ROWSUM", "mma") == "table"


def rowsum_slab(config: Mapping) -> bool:
    """Binary weights' row popcounts from the tap-shift slab in shared memory (ROWSUM="slab")."""
    return config.get("ROWSUM", "mma") == "slab"


def rowsum_cols(config: Mapping) -> bool:
    """Binary weights' row popcounts from ones columns appended to the weights' wgmma
    (ROWSUM="cols", wgmma kernels with BN = WN)."""
    return config.get("ROWSUM", "mma") == "cols"


def b_rows(wl: Workload, config: Mapping) -> int:
    """Rows of one k slab's B tile in shared memory: w_bits x BN weight rows, and with
    ROWSUM="cols" the ONES_ROWS after them."""
    return planes(wl)[1] * config["BN"] + (ONES_ROWS if rowsum_cols(config) else 0)


def rowsum_mma(wl: Workload, config: Mapping) -> bool:
    """Binary weights' row popcounts by an MMA against a tile of ones (ROWSUM="mma")."""
    return needs_rowsum(wl) and config.get("ROWSUM", "mma") == "mma"


def smem_bytes(wl: Workload, config: Mapping) -> int:
    """Dynamic shared memory of a config: STAGES x (a_bits*BM + w_bits*BN) rows x KT*32 bytes
    (wgmma with binary weights: + a 256-byte tile of ones for the row popcounts, with
    ROWSUM="cols" 16 more B rows per k slab instead, with ROWSUM="slab" 4 bytes per slab
    position; HALO=1: + the input slab, A_IN_HALO=1 without the a_bits*BM rows; TAP_SHIFT=1: the
    weights once, the slab buffers and slab popcounts per team, persistent blocks their
    columns' `threshold_slots`; the stages and the packing tile are per team too; SLICES: the
    stages per k slice, and at least the slices' sums, `slice_sum_words`, which go over them)."""
    q = planes(wl)[0]
    operands = (config["STAGES"] * stage_bytes(wl, config) * teams(config) * slices(config)
                + halo_bytes(wl, config))
    operands += mbarrier_bytes(wl, config)
    ones = 1
    if tap_shift(config):  # every channel group resident, slab_buffers slabs of it
        plan = shift_plan(conv_shape(wl), config["BM"])
        slab, weights = group_words(plan, q, b_rows(wl, config))
        operands = plan.groups * (weights + slab * slab_buffers(config) * teams(config)) * 4
        ones = len(plan.ones_tiles)
        if rowsum_slab(config):  # two buffers where each thread counts its own copies
            buffers = 2 if plan.groups == 1 and plan.chunks == 1 else 1
            operands += buffers * -(-plan.slab_pix // 4) * 16 * teams(config)
    if config["MMA"] == "wgmma" and rowsum_mma(wl, config):
        operands += 256 * ones
    if slots := threshold_slots(wl, config):
        operands += slots * config["BN"] * threshold_stride(wl) * 4
    # SLICES > 1: slices 1.. leave their sums (every thread's Acc and RowSum) over the operands
    operands = max(operands, (slices(config) - 1) * tile_threads(config) * 4 * slice_sum_words(
        wl, config))
    epi = wl.epilogue
    if epi.requantizes and epi.out_layout is Layout.BITPLANE and config["WN"] % 32:
        packing = epi.out.bits * config["BM"] * config["BN"] // 8 * teams(config)
        # the persistent kernel keeps its packing tile apart: the next tiles' copies are in flight
        return operands + packing if config["PERSIST"] else max(operands, packing)
    return operands


def slice_sum_words(wl: Workload, config: Mapping) -> int:
    """Words of one thread's Acc and RowSum (bitserial_common.cu; wgmma: MT = 1), which a k
    slice past the first stores for the first to add (SLICES > 1)."""
    q, p = planes(wl)
    nt = config["WN"] // 8
    return q * p * nt * 4 + q * (8 if rowsum_cols(config) else 4)


THR_SMEM_BYTES = 16384  # most shared memory a block's threshold slots may take


def threshold_slots(wl: Workload, config: Mapping) -> int:
    """Threshold tables a persistent tap-shift block keeps in shared memory for its columns
    (rendered as THR_SLOTS; THR_SMEM in bitserial_wgmma_shift.cu): 1 without binary
    activations (every row compares with the per-column thresholds), one per tap rectangle of
    `rect_slots` with them (ROW_TABLE: the row table gives each row's slot) while they fit in
    THR_SMEM_BYTES; 0 (thresholds read from global memory) otherwise."""
    if not (uses_thresholds(config) and tap_shift(config) and config["PERSIST"]):
        return 0
    if not needs_wtap(wl):
        return 1
    slots = len(rect_slots(conv_shape(wl)))
    fits = slots * config["BN"] * threshold_stride(wl) * 4 <= THR_SMEM_BYTES
    return slots if uses_row_table(config) and fits else 0


def rect_slots(sh: Shape) -> list[int]:
    """Ids (the kernel's rect_id) of the tap rectangles some output pixel has, one per slot:
    per axis the valid-tap ranges [lo, hi) of the kernel's rect_used."""
    def ranges(extent: int, taps: int, outputs: int) -> list[tuple[int, int]]:
        last = extent + sh.pad - (outputs - 1) * sh.stride
        hi_min = 0 if 2 * sh.pad > taps else min(taps, last)
        return [(lo, hi) for lo in range(min(sh.pad, taps) + 1) for hi in range(lo, taps + 1)
                if hi >= hi_min]

    return [((rlo * (sh.r + 1) + rhi) * (sh.s + 1) + slo) * (sh.s + 1) + shi
            for rlo, rhi in ranges(sh.h, sh.r, sh.p) for slo, shi in ranges(sh.w, sh.s, sh.q)]


def acc_regs(wl: Workload, config: Mapping) -> int:
    """int32 accumulator registers per thread (plane pairs + row sums for binary weights,
    unless they come from the table)."""
    warp_rows = 16 if config["MMA"] == "wgmma" else config["WM"]  # a warp's share of m64
    tiles = (warp_rows // 16) * (config["WN"] // 8) * 4
    q, p = planes(wl)
    extra = (warp_rows // 16) * 4 * q if rowsum_mma(wl, config) else 0
    if rowsum_cols(config):  # the row popcounts' and the zero columns' registers
        extra = (warp_rows // 16) * 8 * q
    pingpong = tap_shift(config) and config["PERSIST"] and config["STAGES"] == 4
    return (tiles * acc_planes(wl, config) * p + extra) * (2 if pingpong else 1)  # two sets


#: BitserialKernel.bind(chained=True, trigger=...): when the next kernel may launch -> the
#: CHAINED value the kernels are rendered with (bitserial_common.cu, chain_begin)
CHAIN_TRIGGERS = {"start": 1, "after_mma": 2}


def chain_trigger(blocks: int, per_sm: int, sms: int, persistent: bool) -> str:
    """The trigger bind(chained=True, trigger="auto") takes for a grid of `blocks` blocks, of
    which `per_sm` fit an SM at once: "after_mma" for one wave of blocks that share SMs (a
    trigger at the start lets later layers' blocks fill the SMs' free slots and wait there,
    so the next layer's blocks double up: the APNN-TC conv's 32-wide blocks ran 11.1 us per
    layer against 6.1), else "start" (the next layer's blocks take the SMs this grid leaves
    free, or the last wave's start is late anyway). 24 of 27 configs measured on an H100 took
    the faster trigger by this rule, the other 3 lost <= 0.6 us (NOTES.md, "Chained layers")."""
    if persistent or per_sm < 2 or blocks > per_sm * sms:
        return "start"
    return "after_mma"


class BitserialKernel:
    """Compiled bit-serial kernel for one (workload, config); call as kernel(x, w, params)."""

    def __init__(self, workload: Workload, config: Config, arch: str | None = None,
                 template: str = "cuda.bitserial") -> None:
        self.template = template
        self.workload = workload
        self.config = config
        self.source = render(workload, config)
        self.arch = arch or device_arch()
        cubin = compile_cubin(self.source, self.arch)
        self._persistent = bool(config["PERSIST"])
        self._main = CudaKernel(cubin, kernel_name(config))
        self._wtap = CudaKernel(cubin, "bitserial_wtap")
        self._xpop = CudaKernel(cubin, "bitserial_xpop")
        self._wimage = CudaKernel(cubin, "bitserial_wimage") if bulk_weights(config) else None
        self._chained: dict[int, tuple[CudaKernel, CudaKernel]] = {}  # (main, xpop) by mode
        self._grid = tile_grid(workload, config)
        self._threads = threads(config)
        self._smem = smem_bytes(workload, config)

    def chained_kernels(self, trigger: str = "start") -> tuple[CudaKernel, CudaKernel]:
        """The (main, xpop) kernels rendered for programmatic dependent launch with the next
        kernel's launch at `trigger` (`CHAIN_TRIGGERS`; compiled on first use)."""
        mode = CHAIN_TRIGGERS[trigger]
        if mode not in self._chained:
            cubin = compile_cubin(render(self.workload, self.config, chained=mode), self.arch)
            self._chained[mode] = (CudaKernel(cubin, kernel_name(self.config)),
                                   CudaKernel(cubin, "bitserial_xpop"))
        return self._chained[mode]

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """Validate, then launch; `out` (optional) is a preallocated contiguous output buffer."""
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None, chained: bool = False,
             trigger: str = "auto") -> Callable[[], torch.Tensor]:
        """Validate once and return a no-argument launcher (CUDA-graph capture, timing):
        `check_inputs` reads the epilogue vectors, which syncs the device.

        chained=True (sm_90+; a network's layers, each reading the previous one's output): the
        launcher's kernels go out as programmatic dependents of the previous kernel on the
        stream (PDL), so their blocks start on the SMs that kernel leaves free, issue what
        depends on the layer's constants alone (with BULK_WEIGHTS the weights' copies, the
        epilogue's prefetches), then wait for it to finish before reading `x` or writing `out`.
        Same results; what it saves is the launch gap and the weights' arrival, per layer.
        `trigger` says when the next kernel may launch: "start" (at once), "after_mma" (once
        a one-tile block has issued its last MMAs: where several blocks fit an SM, later
        layers' waiting blocks then do not crowd this layer's; persistent kernels: at exit),
        or "auto" (`chain_trigger`, from the grid and the blocks that fit an SM).

        What depends on the layer's constants alone is worked out here, once, not per launch:
        the requantization thresholds (from `params`) and, for binary activations, the weight
        sums per tap rectangle (`bitserial_wtap`, from `w` and those thresholds; a dependent
        kernel of ~1-4 us that every launch used to run first), and with BULK_WEIGHTS the
        weights' stage images (`bitserial_wimage`, passed to the main kernel as its `w`). The
        launcher therefore
        reads `x` afresh each call but keeps the `w` and `params` of bind time: after changing
        `w` in place, call its `refresh_tables()` (or bind again). The launcher's
        `split_workspace` is the split-K partial-sum tensor it writes (None without split-K)."""
        wl = self.workload
        check_inputs(wl, x, w, params)
        if trigger != "auto" and trigger not in CHAIN_TRIGGERS:
            raise ValueError(f"trigger must be 'auto' or one of {sorted(CHAIN_TRIGGERS)}, "
                             f"got {trigger!r}")
        if chained and int(self.arch.removeprefix("sm_").rstrip("a")) < 90:
            raise ValueError(f"chained=True needs sm_90 or newer (programmatic dependent "
                             f"launch), this kernel is built for {self.arch}")
        if x.device.type != "cuda":
            raise ValueError(f"x must be a CUDA tensor for {wl.key}, got device {x.device}")
        for name, t in (("x", x), ("w", w)):
            if t.data_ptr() % 16:
                raise ValueError(f"{name} must start at a 16-byte aligned address")
        out = output_buffer(wl, x.device, out)
        wtap, xpop = side_tables(wl, self.config, x.device)
        wtap_blocks, xpop_blocks = side_table_blocks(wl)
        thr = epilogue_thresholds(wl, self.config, params)
        split_ws, split_count = split_workspace(wl, self.config, x.device)
        vrows = row_table(wl, self.config, x.device)
        wimg = weight_images(wl, self.config, x.device)
        xmap = halo_tensor_map(wl, self.config, x)
        args = [x, w if wimg is None else wimg, out, params.bias, params.scale, params.multiplier,
                params.shift, wtap, xpop, thr, split_ws, split_count, vrows]
        args += [] if xmap is None else [xmap]
        grid: tuple[int, ...] = (*self._grid, split_k(self.config))
        if self._persistent:  # one wave of resident blocks, each looping over tiles
            per_sm = self._main.max_active_blocks(self._threads, self._smem, x.device)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            grid = persistent_grid(wl, self.config, per_sm * sms)

        def refresh_tables() -> None:
            if wtap is not None:
                self._wtap.launch(wtap_blocks, WTAP_THREADS, [w, thr, wtap])
            if wimg is not None:
                self._wimage.launch((self._grid[0], k_tiles(wl, self.config)), self._threads,
                                    [w, wimg], shared_mem=stage_bytes(wl, self.config))

        if wtap is not None or wimg is not None:
            refresh_tables()
            # done before any launch on another stream (CUDA-graph timing captures on a side one)
            torch.cuda.current_stream(x.device).synchronize()

        if chained and trigger == "auto":
            per_sm = self._main.max_active_blocks(self._threads, self._smem, x.device)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            trigger = chain_trigger(math.prod(grid), per_sm, sms, self._persistent)
        main, xpop_kernel = (self.chained_kernels(trigger) if chained
                             else (self._main, self._xpop))

        def launch() -> torch.Tensor:
            if xpop is not None:
                xpop_kernel.launch(xpop_blocks, XPOP_THREADS, [x, xpop], programmatic=chained)
            main.launch(grid, self._threads, args, shared_mem=self._smem, programmatic=chained)
            return out

        launch.chain_trigger = trigger if chained else None  # type: ignore[attr-defined]
        launch.split_workspace = split_ws  # type: ignore[attr-defined]  # split-K diagnostics
        launch.refresh_tables = refresh_tables  # type: ignore[attr-defined]
        return launch


def _constraints(wl: Workload) -> list:
    sh = conv_shape(wl)
    bitplane_out = wl.epilogue.requantizes and wl.epilogue.out_layout is Layout.BITPLANE
    vec = copy_vec(sh)

    def tiles(c: Config) -> str | None:
        if c["BM"] % c["WM"] or c["BN"] % c["WN"]:
            return "block tile must be a multiple of the warp tile"
        warps = tile_threads(c) // 32
        if not 1 <= warps <= 16:
            return f"{warps} warps per block (1..16 allowed)"
        return None

    def mma(c: Config) -> str | None:
        if c["MMA"] == "mma_sync":
            if c["WM"] > 64 or c["WN"] > 64 or c["STAGES"] > 4:
                return "mma.sync warp tiles are at most 64 x 64, with at most 4 stages"
            if c["SWIZZLE"]:
                return "SWIZZLE is a wgmma layout (mma.sync: 0)"
            return None
        if c["WM"] != 64:
            return "a wgmma warpgroup owns WM=64 rows"
        if planes(wl)[1] * c["WN"] not in WGMMA_N:
            return f"wgmma N = w_bits*WN = {planes(wl)[1] * c['WN']} is not a valid wgmma N"
        if c["STAGES"] < 3:
            return "the wgmma pipeline needs STAGES >= 3 (one stage stays in flight)"
        wgmma_n = planes(wl)[1] * c["WN"]
        if c["PERSIST"] and not tap_shift(c) and (
                wgmma_n > 128 or (threads(c) > 256 and acc_planes(wl, c) * wgmma_n > 128)):
            # NVRTC 13 (sm_90a), the epilogue living inside the tile loop: m64n256 blocks spill
            # 870 B; 4-warpgroup blocks (capped at 128 registers per thread; two teams of two
            # warpgroups too) spill 488 B with 128 accumulator registers (two m64n128 planes)
            # and none with 64 (one plane)
            return ("persistent wgmma blocks spill beyond N = 128 per wgmma, or beyond one "
                    "m64n128 accumulator per thread with more than 2 warpgroups")
        if threads(c) // 128 > MAX_WARPGROUPS:  # every team's
            return f"more than {MAX_WARPGROUPS} warpgroups per block"
        return None

    def three_warpgroup_rows(c: Config) -> str | None:
        # BM=192: a row tile count between those of 128 and 256 (ResNet-50 s5 b256: 66 x 2
        # column tiles of 256, 132 tiles, one per SM, where 128 x 256 makes 196)
        if c["BM"] == 192 and (c["MMA"] != "wgmma" or tap_shift(c)):
            return "BM=192 (three warpgroups in M) is a wgmma kernel's without TAP_SHIFT"
        return None

    def registers(c: Config) -> str | None:
        n = acc_regs(wl, c)
        if n > MAX_ACC_REGS:
            return f"{n} accumulator registers > {MAX_ACC_REGS}"
        one_plane = acc_planes(wl, c) * planes(wl)[1] == 1
        lean = c["MMA"] == "wgmma" and not c["PERSIST"] and not tap_shift(c) and one_plane
        n += OTHER_REGS_WGMMA_TILE if lean else OTHER_REGS
        if threads(c) * n > REGISTER_FILE:
            return f"{threads(c)} threads x {n} registers exceed the register file"
        return None

    def shared(c: Config) -> str | None:
        n = smem_bytes(wl, c)
        return f"{n} bytes of shared memory > {MAX_SMEM}" if n > MAX_SMEM else None

    def halo(c: Config) -> str | None:
        if not c["HALO"]:
            return None
        if c["PERSIST"]:
            return "HALO=1 is implemented in the one-tile-per-block kernels only (PERSIST=0)"
        if sh.r * sh.s == 1:
            return "HALO=1 needs a kernel window larger than 1x1 (no duplicate reads otherwise)"
        if (halo_rows(sh, c["BM"]) + sh.r) * sh.w * sh.words >= 2**31:
            return "halo slab too large for 32-bit word offsets"
        return None

    def halo_in_place(c: Config) -> str | None:
        if not a_in_halo(c):
            return ("STAGES=12 (every k tile resident) is A_IN_HALO=1's, whose stages hold "
                    "weights only" if c["STAGES"] == RESIDENT_STAGES else None)
        if c["MMA"] != "wgmma" or not c["HALO"] or c["PERSIST"] or tap_shift(c):
            return "A_IN_HALO=1 is the one-tile wgmma kernel's, with HALO=1"
        if sh.stride != 1 or sh.words % 8:
            return ("A_IN_HALO=1 needs stride 1 and channels a multiple of 256 (a k slab in "
                    "one tap)")
        if sh.k_words // 8 % c["KT"]:
            return f"A_IN_HALO=1 needs KT to divide the {sh.k_words // 8} k slabs"
        if rowsum_table(c) or uses_row_table(c):
            return "A_IN_HALO=1 keeps each row's pixel: not with ROWSUM='table' or ROW_TABLE"
        return None

    def bulk(c: Config) -> str | None:
        if not bulk_weights(c):
            return None
        if not a_in_halo(c) or slices(c) > 1 or rowsum_cols(c):
            return "BULK_WEIGHTS=1 is A_IN_HALO=1's, in one k slice, without ROWSUM='cols'"
        if k_tiles(wl, c) > c["STAGES"] - 2:
            return (f"BULK_WEIGHTS=1 keeps every k tile resident: {k_tiles(wl, c)} k tiles "
                    f"need STAGES >= {k_tiles(wl, c) + 2}")
        return None

    def planes_as_rows(c: Config) -> str | None:
        if plane_rows(c) and not (a_in_halo(c) and planes(wl)[0] == 2 and slices(c) == 1
                                  and not tma_halo(c) and not fuse_planes(c)
                                  and not rowsum_cols(c)):
            return ("PLANE_ROWS=1 is A_IN_HALO=1's with two activation planes, in one k slice, "
                    "without TMA_HALO, FUSE_PLANES or ROWSUM='cols'")
        return None

    def tensor_window(c: Config) -> str | None:
        if not tma_halo(c):
            return None
        if not a_in_halo(c) or slices(c) > 1:
            return "TMA_HALO is A_IN_HALO=1's, in one k slice"
        if sh.words * 4 % tma_halo(c):
            return (f"TMA_HALO={tma_halo(c)} needs channels a multiple of "
                    f"{8 * tma_halo(c)} (whole channel blocks)")
        return None

    def shifted(c: Config) -> str | None:
        if not tap_shift(c):
            return None
        if c["MMA"] != "wgmma" or c["HALO"] or split_k(c) > 1:
            return "TAP_SHIFT=1 is a wgmma kernel without HALO or SPLIT_K"
        if c["KT"] != 1 or c["STAGES"] not in ((3, 4) if c["PERSIST"] else (3,)):
            return ("TAP_SHIFT=1 loads whole channel groups: KT=1; STAGES=3, or 4 with "
                    "PERSIST=1 (two tiles' MMAs in flight)")
        if shift_plan(sh, c["BM"]).v_rows + 256 >= 2**31:
            return "too many virtual rows for 32-bit row indices"
        return None

    def fused(c: Config) -> str | None:
        if fuse_planes(c) and c["MMA"] != "wgmma":  # (cuda.int8_wgmma has no such knob)
            return "FUSE_PLANES=1 is a wgmma kernel's (accumulators of m64nNk256)"
        return None

    def k_slices(c: Config) -> str | None:
        n = slices(c)
        if n == 1:
            return None
        if c["MMA"] != "wgmma" or c["PERSIST"] or tap_shift(c) or split_k(c) > 1:
            return ("SLICES > 1 is implemented in the one-tile wgmma kernel without TAP_SHIFT "
                    "and SPLIT_K")
        if k_tiles(wl, c) < 2 * n:
            return f"SLICES={n} leaves a slice under two of the {k_tiles(wl, c)} k tiles"
        cols, rows = tile_grid(wl, c)
        if cols * rows >= SPLIT_K_MAX_TILES:
            return f"{cols * rows} tiles fill the GPU without splitting a block's k tiles"
        return None

    def team_tiles(c: Config) -> str | None:
        if teams(c) == 1:
            return None
        if not (c["MMA"] == "wgmma" and c["PERSIST"]) or (tap_shift(c) and c["STAGES"] != 3):
            return ("TEAMS > 1 is implemented in the persistent wgmma kernels (TAP_SHIFT=1: "
                    "STAGES=3)")
        return None

    def rowsums(c: Config) -> str | None:
        if rowsum_slab(c) and not (tap_shift(c) and c["PERSIST"] and c["STAGES"] == 3):
            return "ROWSUM='slab' is implemented in the persistent TAP_SHIFT=1 kernel, STAGES=3"
        if rowsum_cols(c):
            if c["MMA"] != "wgmma" or c["BN"] != c["WN"] or fuse_planes(c):
                return ("ROWSUM='cols' is implemented in the wgmma kernels with one warpgroup "
                        "in N (BN = WN), without FUSE_PLANES")
            if planes(wl)[1] * c["WN"] + ONES_ROWS not in WGMMA_N:
                return f"wgmma N = WN + {ONES_ROWS} = {c['WN'] + ONES_ROWS} is not a valid wgmma N"
        if uses_row_table(c) and rowsum_table(c):
            return "ROW_TABLE=1 and 2 keep no row's pixel: not with ROWSUM='table'"
        if c.get("ROW_TABLE", 0) == 2 and not tap_shift(c):
            return "ROW_TABLE=2 (the slab copies' pixels) is a TAP_SHIFT=1 kernel's"
        if uses_row_table(c) and block_rows(wl, c) + 256 >= 2**31:
            return "too many rows for ROW_TABLE's 32-bit row indices"
        return None

    def copies(c: Config) -> str | None:
        iters = -(-c["BM"] * c["KT"] * 8 // vec // tile_threads(c))
        if iters > MAX_COPY_ITERS and not tap_shift(c):  # TAP_SHIFT: no im2col copy rows
            return f"{iters} copy chunks per thread"
        return None

    def splits(c: Config) -> str | None:
        n = split_k(c)
        if n == 1:
            return None
        if c["PERSIST"]:
            return "SPLIT_K > 1 is implemented in the one-tile-per-block kernels only (PERSIST=0)"
        if c["MMA"] != "mma_sync":
            # H100, NVRTC 13.0: wgmma split-K configs exact in the host emulation gave wrong
            # outputs on the GPU (NOTES.md, "Split-K"); mma.sync ones were all exact
            return "SPLIT_K > 1 only with MMA='mma_sync' (wgmma split-K was wrong on an H100)"
        per_split = -(-k_tiles(wl, c) // n)
        if per_split * (n - 1) >= k_tiles(wl, c):
            return f"SPLIT_K={n} leaves a split without k tiles ({k_tiles(wl, c)} k tiles)"
        cols, rows = tile_grid(wl, c)
        if cols * rows >= SPLIT_K_MAX_TILES:
            return f"{cols * rows} tiles fill the GPU without split-K"
        return None

    def pairs(c: Config) -> str | None:
        if not thr_pairs(c):
            return None
        if c["MMA"] != "wgmma" or not uses_thresholds(c):
            return "THR_PAIRS=1 is a wgmma kernel's with REQUANT='threshold'"
        if c["WN"] not in (64, 128, 256):
            return "THR_PAIRS=1 gives a lane 16, 32 or 64 output channels: WN = 64, 128 or 256"
        if pair_range(wl) is None:
            return "THR_PAIRS=1 needs the compared values within 2^15 of each other"
        return None

    def output(c: Config) -> str | None:
        if bitplane_out and c["BN"] % 32:
            return "bit-plane output packs 32-column words per block: BN must be a multiple of 32"
        return None

    def waste(c: Config) -> str | None:
        if c["BN"] > max(32, _pow2_ceil(sh.kout)):
            return f"BN={c['BN']} wider than the {sh.kout} output columns"
        rows = block_rows(wl, c)
        if c["BM"] > max(64 if c["MMA"] == "wgmma" else 32, _pow2_ceil(rows)):  # m64
            return f"BM={c['BM']} taller than the {rows} block rows"
        if -(-rows // c["BM"]) > GRID_Y_MAX:
            return "too many row tiles for grid.y"
        return None

    return [tiles, mma, fused, three_warpgroup_rows, halo, halo_in_place, bulk, tensor_window,
            planes_as_rows,
            shifted, team_tiles,
            rowsums, registers, shared, copies, splits, k_slices, output, pairs, waste]


# Preferred defaults, best first (APNN-TC-like: big warp tiles for small p*q, smaller for larger).
_MMA_SYNC_DEFAULTS = [
    dict(BM=128, BN=128, WM=64, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=128, BN=64, WM=32, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=64, BN=64, WM=32, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=64, BN=64, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=64, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=32, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=32, WM=16, WN=16, KT=1, STAGES=2, PERSIST=0),
    dict(BM=16, BN=32, WM=16, WN=32, KT=1, STAGES=2, PERSIST=0),
    dict(BM=16, BN=16, WM=16, WN=16, KT=1, STAGES=2, PERSIST=0),
]
_WGMMA_DEFAULTS = [  # big N per instruction first; fewer warpgroups as p*q grows. Measured on
    # H100 (NOTES.md, v4 run 2): 32-byte swizzle up to 1.4x faster than core matrices; KT=1 with
    # 6 stages best for 2 warpgroups, and (third session, both REQUANT modes) for w1a1's 4
    # warpgroups of 64 x 128 too: GEMM 4096 43.4 vs 47.6 us with KT=4, 3 stages.
    # w1a1 (one accumulator plane, the only precision it fits): 192 x 256 one-tile blocks ran
    # 1.45x faster than 128 x 256 on ResNet-50 s4 / s5 b256 (fifteenth bit-serial session);
    # default only on grids of at least one tile per SM (`default_config`)
    # ... with two columns' thresholds per add where the epilogue allows (below, fused: H100,
    # same run, ResNet-50 s5 b256 w1a2 20.1 -> 18.0 us, GEMM 4096 53.9 -> 48.2, the spill
    # gone; bitserial-20261126-004253.json)
    *(dict(BM=192, BN=256, WM=64, WN=256, KT=1, STAGES=4, THR_PAIRS=pairs) for pairs in (1, 0)),
    # two activation planes on convs of at most 256 output channels: persistent tap-shift
    # blocks of two teams with two columns' thresholds per add, ResNet-50 s3 / s4 b256 w1a2
    # 21.7 / 19.8 us (slab row sums) against 23.6 / 24.7 for the defaults after it (H100,
    # bitserial-20261126-000329.json); on grids of at least one tile per SM. Row sums from
    # the slab for binary weights (no row-sum accumulators), none for unsigned ones.
    *(dict(BM=64, BN=128, WM=64, WN=128, KT=1, STAGES=3, PERSIST=1, TAP_SHIFT=1, TEAMS=2,
           ROW_TABLE=1, ROWSUM=rowsum, THR_PAIRS=1) for rowsum in ("slab", "mma")),
    # w1a2 (unsigned two-bit activations) the same with the planes in one accumulator: ResNet-50
    # s4 / s5 b256 24.6 / 21.0 us, GEMM 4096 53.9 as the default, against 27.7 / 26.9 / 61.5
    # for the 128 x 128 default below in earlier runs (sixteenth bit-serial session)
    *(dict(BM=192, BN=256, WM=64, WN=256, KT=1, STAGES=4, FUSE_PLANES=1, THR_PAIRS=pairs)
      for pairs in (1, 0)),
    # persistent tap-shift blocks, for convs of at most 128 output channels (C = K = 64, 128
    # measured as the default: ResNet-50 s2 / s3 b256 w1a1 30.4 / 17.9 us, w1a2 47.3 / 28.8,
    # w2a2 61.9 / 40.0, against 45.2 / 39.0, 73.9 / 53.8, 227 / 150 for the defaults below),
    # on grids of at least one tile per SM; ones columns for the row sums of binary weights;
    # two columns' thresholds per add where the epilogue allows (H200, same process: s2 / s3
    # w1a2 -21% / -15%, w1a1 -12% / -3%, config_probe-20261125-s20-pairs.json); the slab
    # copies' pixels from the row table too at BN = 64 (s2 w1a1 / w1a2 26.3 / 37.8 us against
    # 27.7 / 39.5, w2a2 a tie; H100, bitserial-20261126-000329.json, -001900.json)
    *(dict(BM=128, BN=bn, WM=64, WN=bn, KT=1, STAGES=3, PERSIST=1, TAP_SHIFT=1,
           ROW_TABLE=1 if bn == 128 else 2, ROWSUM=rowsum, THR_PAIRS=pairs)
      for bn in (128, 64) for rowsum in ("cols", "mma") for pairs in (1, 0)),
    dict(BM=128, BN=256, WM=64, WN=128, KT=1, STAGES=6),
    dict(BM=128, BN=256, WM=64, WN=256, KT=1, STAGES=6),
    dict(BM=128, BN=128, WM=64, WN=128, KT=1, STAGES=6),
    dict(BM=128, BN=64, WM=64, WN=64, KT=1, STAGES=6),
    dict(BM=128, BN=64, WM=64, WN=32, KT=1, STAGES=6),
    dict(BM=64, BN=64, WM=64, WN=32, KT=1, STAGES=6),
    dict(BM=128, BN=32, WM=64, WN=16, KT=1, STAGES=6),
    dict(BM=64, BN=32, WM=64, WN=16, KT=1, STAGES=6),
    dict(BM=64, BN=32, WM=64, WN=32, KT=1, STAGES=6),
    dict(BM=64, BN=16, WM=64, WN=16, KT=1, STAGES=6),
]
DEFAULTS = {"mma_sync": [dict(d, MMA="mma_sync", SWIZZLE=0, HALO=0, ROWSUM="mma",
                              REQUANT="multiply", SPLIT_K=1, TAP_SHIFT=0, ROW_TABLE=0,
                              TEAMS=1, FUSE_PLANES=0, SLICES=1, THR_PAIRS=0,
                              A_IN_HALO=0, BULK_WEIGHTS=0, TMA_HALO=0, PLANE_ROWS=0)
                         for d in _MMA_SYNC_DEFAULTS],
            "wgmma": [dict(dict(PERSIST=0, MMA="wgmma", SWIZZLE=32, HALO=0, ROWSUM="mma",
                                REQUANT="multiply", SPLIT_K=1, TAP_SHIFT=0, ROW_TABLE=0,
                                TEAMS=1, FUSE_PLANES=0, SLICES=1, THR_PAIRS=0,
                                A_IN_HALO=0, BULK_WEIGHTS=0, TMA_HALO=0,
                                PLANE_ROWS=0), **d)
                      for d in _WGMMA_DEFAULTS]}
# the tap-shift defaults' limit on output channels (the widths they were measured at); the
# two-team ones: 256, and only for two activation planes (a team's MMA phase long enough to
# hide the other's epilogue, NOTES.md "Teams")
TAP_SHIFT_DEFAULT_MAX_K = 128
TEAMS_DEFAULT_MAX_K = 256


# Small grids with long reductions (the preferred default under half a wave of tiles, at
# least SMALL_GRID_K_TILES k tiles): one-warpgroup 64-row blocks, the widest BN of 64 or 32
# that still makes half a wave; on convs where A_IN_HALO applies with every k tile resident,
# that (for two activation planes 64 wide with bulk weight copies); else the k tiles in two
# slices, and on convs the halo load with KT=2. Measured on an
# H100 (bitserial-20261125-210302.json): the APNN-TC conv 5.7 (w1a1) and 7.6 us (w1a2) against
# 15.9 and 13.8 for the preferred default, fc_b128 4.4 and 5.3 against 7.6 and 7.3; with 4 k
# tiles (fc_b64) the preferred 64 x 64 default stays (2.2 against 2.6).
SMALL_GRID_K_TILES = 8


def small_grid_default(wl: Workload, cfg: Config, space: ConfigSpace) -> Config:
    """`cfg` (a wgmma default), or the small-grid default above where it applies; on convs
    that allow it, first the in-place halo (A_IN_HALO) with every k tile resident."""
    if (math.prod(tile_grid(wl, cfg)) >= NUM_SMS // 2
            or k_tiles(wl, cfg.replace(KT=1)) < SMALL_GRID_K_TILES):
        return cfg
    def in_place(bn: int, kt: int, bulk: int) -> Config:  # A_IN_HALO, every k tile resident
        return cfg.replace(BM=64, BN=bn, WM=64, WN=bn, KT=kt, STAGES=RESIDENT_STAGES, HALO=1,
                           A_IN_HALO=1, BULK_WEIGHTS=bulk, SLICES=1, PERSIST=0, TAP_SHIFT=0,
                           TEAMS=1, ROW_TABLE=0, ROWSUM="mma", THR_PAIRS=0)

    if planes(wl)[0] >= 2:  # two activation planes: 64-wide in-place blocks whose weights
        # come by bulk copies (H100, same run: the APNN-TC conv w1a2 5.07 / 5.10 us against
        # 5.46 / 5.49 for the 32-wide default below, bitserial-20261126-030142.json, -030205;
        # w1a1 slower so, 4.6 against 3.8); the window by tensor copies (TMA_HALO=128) measured
        # even there: 5.05 / 5.07 / 5.12 / 4.99 us against 5.12 / 5.14 / 5.10 / 5.09 in four
        # runs (bitserial-20261126-040328.json, apconv_probe-20261126-s22-tma.json, -041106,
        # -043525)
        for kt in (4, 2):
            if space.is_valid(bulk := in_place(64, kt, 1)):
                return bulk
    for bn in (64, 32):
        for kt in (4, 2):  # H100 (bitserial-20261126-020748.json): the APNN-TC conv w1a2 5.4 us,
            # w1a1 4.2, against 7.6 and 5.7 for the sliced halo-gather default below
            resident = in_place(bn, kt, 0)
            if (space.is_valid(resident) and k_tiles(wl, resident) <= RESIDENT_STAGES - 2
                    and (bn == 32 or math.prod(tile_grid(wl, resident)) >= NUM_SMS // 2)):
                return resident
        for halo in (1, 0):
            small = cfg.replace(BM=64, BN=bn, WM=64, WN=bn, KT=2 if halo else 1, STAGES=4,
                                HALO=halo, SLICES=2, PERSIST=0, TAP_SHIFT=0, TEAMS=1,
                                ROW_TABLE=0, ROWSUM="mma")
            if not space.is_valid(small):  # THR_PAIRS needs WN >= 64
                small = small.replace(THR_PAIRS=0)
            if space.is_valid(small) and (
                    bn == 32 or math.prod(tile_grid(wl, small)) >= NUM_SMS // 2):
                return small
    return cfg


def target_arch() -> str:
    """The arch a space is for when none is named: the current GPU's, else NVRTC's default."""
    return device_arch() if torch.cuda.is_available() else DEFAULT_ARCH


class BitserialTemplate(KernelTemplate):
    """APNN-TC bit-serial conv2d/GEMM for bit-plane operands of 1..4 bits, any encoding."""

    name = "cuda.bitserial"
    backend = "cuda"
    added_knobs: ClassVar[Mapping[str, object]] = {"ROWSUM": "mma", "REQUANT": "multiply",
                                                   "SPLIT_K": 1, "TAP_SHIFT": 0,
                                                   "ROW_TABLE": 0, "TEAMS": 1,
                                                   "FUSE_PLANES": 0, "SLICES": 1,
                                                   "THR_PAIRS": 0, "A_IN_HALO": 0,
                                                   "BULK_WEIGHTS": 0, "TMA_HALO": 0,
                                                   "PLANE_ROWS": 0}

    def unsupported_reason(self, workload: Workload) -> str | None:
        wl = workload
        if wl.a_layout is not Layout.BITPLANE or wl.w_layout is not Layout.BITPLANE:
            return "operands must be in the bitplane layout"
        if wl.a.bits > MAX_BITS or wl.w.bits > MAX_BITS:
            return f"bit-serial supports 1..{MAX_BITS} bits per operand (wider: int8 path)"
        return support_limits_reason(wl)

    def space(self, workload: Workload, arch: str | None = None) -> ConfigSpace:
        """Configs for `workload` on `arch` (default `target_arch()`): MMA="wgmma" only on
        sm_90a."""
        self.check_supported(workload)
        arch = arch or target_arch()
        mma = ("mma_sync", "wgmma") if arch == WGMMA_ARCH else ("mma_sync",)
        knobs = [Knob("BM", (16, 32, 64, 128, 192, 256)), Knob("BN", (16, 32, 64, 128, 256)),
                 Knob("WM", (16, 32, 64)), Knob("WN", (16, 32, 64, 128, 256)),
                 Knob("KT", (1, 2, 4, 8)), Knob("STAGES", (2, 3, 4, 6, RESIDENT_STAGES)),
                 Knob("PERSIST", (0, 1)),
                 Knob("MMA", mma), Knob("TAP_SHIFT", self._tap_shift_values(workload, arch)),
                 Knob("TEAMS", (1, 2) if arch == WGMMA_ARCH else (1,)),
                 Knob("FUSE_PLANES", (0, 1) if arch == WGMMA_ARCH and fusable_planes(workload)
                      else (0,)),
                 Knob("SWIZZLE", (0, 32)), Knob("HALO", (0, 1)),
                 Knob("A_IN_HALO", (0, 1) if arch == WGMMA_ARCH else (0,)),
                 Knob("BULK_WEIGHTS", (0, 1) if arch == WGMMA_ARCH else (0,)),
                 Knob("TMA_HALO", (0, 32, 64, 128) if arch == WGMMA_ARCH else (0,)),
                 Knob("PLANE_ROWS", (0, 1) if arch == WGMMA_ARCH and planes(workload)[0] == 2
                      else (0,)),
                 Knob("ROWSUM", ("mma", "table", "slab", "cols")
                      if workload.w.encoding is Encoding.BINARY else ("mma",)),
                 Knob("ROW_TABLE", (0, 1, 2) if 1 in self._tap_shift_values(workload, arch)
                      else (0, 1)),
                 requant_knob(workload),
                 Knob("SPLIT_K", split_k_values(workload)),
                 Knob("SLICES", slices_values(workload, arch)),
                 Knob("THR_PAIRS", (0, 1) if arch == WGMMA_ARCH
                      and threshold_epilogue(workload) and pair_range(workload) else (0,))]
        return ConfigSpace(knobs, _constraints(workload))

    @staticmethod
    def _tap_shift_values(workload: Workload, arch: str) -> tuple[int, ...]:
        """TAP_SHIFT=1 where the wgmma tap-shift conv runs (sm_90a, `tap_shift.py`). Placed
        right after MMA: the constraints that read it then prune early."""
        ok = arch == WGMMA_ARCH and shift_unsupported_reason(conv_shape(workload)) is None
        return (0, 1) if ok else (0,)

    def default_config(self, workload: Workload, mma: str | None = None,
                       arch: str | None = None) -> Config:
        """The first valid preferred config of the `mma` kind ("mma_sync" or "wgmma"; None:
        wgmma on sm_90a, else mma.sync), requantizing by thresholds where the output allows.
        Measured on an H100 (BENCHMARKS.md, 2026-11-23 third session): these wgmma defaults
        with REQUANT="threshold" ran 1.3-2.1x faster than the mma.sync ones on every GEMM and
        ResNet-50 row, and the threshold twin won every row of both kinds. wgmma defaults by
        regime: fused-plane wide blocks and persistent tap-shift blocks (in the preferred list),
        small grids with long reductions (`small_grid_default`)."""
        cfg, space, mma = self._first_default(workload, mma, arch, plain=False)
        return small_grid_default(workload, cfg, space) if mma == "wgmma" else cfg

    def plain_config(self, workload: Workload, mma: str | None = None,
                     arch: str | None = None) -> Config:
        """The first valid one-tile preferred config without the regime defaults (tap-shift,
        fused planes, two columns' thresholds per add, k slices): a stable base that tests and
        benchmarks build variants from (`default_config` of before those regimes)."""
        return self._first_default(workload, mma, arch, plain=True)[0]

    def _first_default(self, workload: Workload, mma: str | None, arch: str | None,
                       plain: bool) -> tuple[Config, ConfigSpace, str]:
        arch = arch or target_arch()
        mma = mma or ("wgmma" if arch == WGMMA_ARCH else "mma_sync")
        space = self.space(workload, arch)
        requant = "threshold" if threshold_epilogue(workload) else "multiply"
        limit = 128 if mma == "mma_sync" else 136  # wgmma: + row sums of w1 x a1
        for d in DEFAULTS[mma]:  # defaults keep the accumulators well inside the register file
            cfg = Config(d).replace(REQUANT=requant)
            regime = d["TAP_SHIFT"] or d["FUSE_PLANES"] or d["THR_PAIRS"]
            if (plain and regime) or not space.is_valid(cfg) or acc_regs(workload, d) > limit:
                continue
            teams = d.get("TEAMS", 1) > 1
            if d["TAP_SHIFT"] and conv_shape(workload).kout > (
                    TEAMS_DEFAULT_MAX_K if teams else TAP_SHIFT_DEFAULT_MAX_K):
                continue
            if teams and planes(workload)[0] < 2:
                continue
            if (d["BM"] == 192 or d["TAP_SHIFT"]) and math.prod(tile_grid(workload, d)) < NUM_SMS:
                continue  # wide and persistent tap-shift blocks: one tile per SM at least
            return cfg, space, mma
        fallback = [c for c in space.all_configs() if c["MMA"] == mma]
        if not fallback:
            raise ValueError(f"no {mma} config of {self.name} for {workload.key} on {arch}")
        return fallback[0], space, mma

    def build(self, workload: Workload, config: Config, arch: str | None = None) -> BitserialKernel:
        """Compile for `arch` (default: the current device's); ValueError on an invalid config."""
        arch = arch or device_arch()
        try:
            config = self.checked_config(workload, config, self.space(workload, arch))
        except ValueError as e:
            raise ValueError(f"{e} (on {arch})") from None
        return BitserialKernel(workload, config, arch)


BITSERIAL = BitserialTemplate()

__all__ = ["BITSERIAL", "BitserialKernel", "BitserialTemplate", "render"]
