"""What a bit-serial kernel needs to know of its workload, whatever its family or config.

The conv view of a workload (`Shape`; a GEMM is a 1x1 conv on 1x1 images), its operand planes,
the epilogue modes it allows, the limits every bit-serial kernel has, and the geometry of the
tables that depend on the workload alone (the weight sums per tap rectangle, the packed
threshold ranges of THR_PAIRS).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

from ...core import ConvWorkload, Encoding, Layout, Workload
from ...core.epilogue import OUT_FP16, OUT_INT16
from ...core.hardware import TARGET
from ...reference.bitserial import plane_coefficients
from ...reference.epilogue import THRESHOLD_MAX_BITS
from ..base import acc_bound, grouped_reason, pow2_ceil

MAX_BITS = 4          # per operand; wider precisions belong to the int8 path
INT16_LIMIT = 2**15   # |accumulator| bound of an int16 output
WGMMA_ARCH = "sm_90a"  # wgmma needs the arch-specific Hopper target
#: bitserial_wtap runs a warp per output column, 4 per block; bitserial_xpop xpop_lanes lanes
#: per input pixel
WTAP_THREADS, XPOP_THREADS = 128, 256
# Split-K and k slices only where the tile grid leaves SMs idle: under two waves of one block
# per SM (larger grids fill the GPU without it, and each split re-stores a tile's sums).
SPLIT_K_MAX_TILES = 2 * TARGET.sms


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


@lru_cache(maxsize=4096)
def conv_shape(wl: Workload) -> Shape:
    """The kernels' view of a workload's shape, one object per workload: every step of a build
    (space, constraints, layout, tables, rendering) reads the same one."""
    bits = 8 if int8_operands(wl) else 1
    if isinstance(wl, ConvWorkload):
        return Shape(wl.N, wl.H, wl.W, wl.C, wl.K, wl.R, wl.S, wl.stride, wl.pad, wl.P, wl.Q,
                     bits)
    m, n, k = wl.gemm_shape
    return Shape(m, 1, 1, k, n, 1, 1, 1, 0, 1, 1, bits)


def copy_vec(shape: Shape) -> int:
    """Words per cp.async chunk: 16-byte copies when the channel words of a tap allow it."""
    return next(v for v in (4, 2, 1) if shape.words % v == 0)


def out_mode(wl: Workload) -> int:
    """The kernels' OUT_MODE: 0 int32, 1 fp16, 2 requantized bytes, 3 requantized bit planes,
    4 int16."""
    epi = wl.epilogue
    if epi.requantizes:
        return 3 if epi.out_layout is Layout.BITPLANE else 2
    return {OUT_FP16: 1, OUT_INT16: 4}.get(epi.out, 0)


def bitplane_output(wl: Workload) -> bool:
    """Requantized output in bit planes (packed 32 columns to a word)."""
    return wl.epilogue.requantizes and wl.epilogue.out_layout is Layout.BITPLANE


def threshold_epilogue(wl: Workload) -> bool:
    """Requantized bit-plane output of <= THRESHOLD_MAX_BITS bits: the epilogue can compare
    each output with per-column thresholds (`requant_thresholds`) instead of requantizing it.
    Never with a residual (a second variable per output): those run the multiply path."""
    return bitplane_output(wl) and wl.epilogue.out.bits <= THRESHOLD_MAX_BITS and \
        wl.epilogue.residual is None and not wl.epilogue.requant32


def needs_rowsum(wl: Workload) -> bool:
    """Binary bit-plane weights: the AND rewrite needs the activation rows' popcounts."""
    return wl.w.encoding is Encoding.BINARY and not int8_operands(wl)


def needs_wtap(wl: Workload) -> bool:
    """Binary bit-plane activations: the epilogue reads the per-column tap table (wtap)."""
    return wl.a.encoding is Encoding.BINARY and not int8_operands(wl)


def fusable_planes(wl: Workload) -> bool:
    """Activation planes whose coefficients (1, 2) the tensor cores can add: plane 1 issued
    twice into plane 0's accumulator (unsigned two-bit activations)."""
    return (planes(wl)[0] == 2 and not int8_operands(wl)
            and wl.a.encoding is Encoding.UNSIGNED)


def two_activation_planes(wl: Workload) -> bool:
    return planes(wl)[0] == 2


def kernel_window(wl: Workload) -> bool:
    """A conv window larger than 1x1 (the halo load has duplicate reads to save)."""
    sh = conv_shape(wl)
    return sh.r * sh.s > 1


def in_place_geometry(wl: Workload) -> bool:
    """Stride 1 and channels a multiple of 256: a k slab is one tap's 256 channels, which the
    wgmma descriptors can address in place in a pixel tile's window."""
    sh = conv_shape(wl)
    return sh.stride == 1 and sh.words % 8 == 0


def few_tiles(wl: Workload) -> bool:
    """A reduction of more than one k tile on a grid that even the largest tiles leave under
    SPLIT_K_MAX_TILES tiles: splitting a tile's k tiles (split-K, k slices) may pay."""
    sh = conv_shape(wl)
    fewest = -(-sh.rows // 256) * -(-sh.kout // 256)
    return fewest < SPLIT_K_MAX_TILES and sh.k_words > 8


def support_limits_reason(wl: Workload) -> str | None:
    """What the kernels cannot do whatever the operands' layout: packed requantized output,
    an int16 output that the accumulator could leave, or row, weight or input-word indices
    past 32 bits; None when within the limits."""
    epi = wl.epilogue
    if grouped_reason(wl):
        return grouped_reason(wl)
    if epi.requantizes and epi.out_layout is Layout.PACKED:
        return "requantized output must be in the int8 or bitplane layout, not packed"
    reason = block_end_reason(wl)
    if reason:
        return reason
    if epi.out == OUT_INT16 and acc_bound(wl) >= INT16_LIMIT:
        return (f"int16 output needs the worst-case |accumulator| below 2^15, got "
                f"{acc_bound(wl)} (use int32)")
    sh = conv_shape(wl)
    if (sh.rows + 256 >= 2**31 or sh.kout * sh.k_words >= 2**31
            or sh.nb * sh.h * sh.w * sh.words >= 2**31):
        return "problem too large for 32-bit row indices"
    return None


def block_end_reason(wl: Workload) -> str | None:
    """What the kernels' block-end epilogue (bitserial_block_end.cu) cannot do: derived
    outputs without the 32-bit path (Epilogue.requant32), or in the packed layout."""
    epi = wl.epilogue
    if epi.derived and not epi.requant32:
        return ("derived outputs (Epilogue.derived) run on the 32-bit block-end path only: "
                "set requant32=True")
    if any(lay is Layout.PACKED for _, lay in epi.derived):
        return "derived outputs must be in the int8 or bitplane layout, not packed"
    return None


def block_end_planes(wl: Workload) -> bool:
    """A block-end epilogue (requant32) writing some output in bit planes: the warp tiles
    pack whole 32-column words in registers (WN % 32 == 0)."""
    epi = wl.epilogue
    return epi.requant32 and ((epi.store_out and epi.out_layout is Layout.BITPLANE)
                              or any(lay is Layout.BITPLANE for _, lay in epi.derived))


def bitplane_reason(wl: Workload) -> str | None:
    """Why the bit-plane kernels cannot run `wl` (None: they can)."""
    if wl.a_layout is not Layout.BITPLANE or wl.w_layout is not Layout.BITPLANE:
        return "operands must be in the bitplane layout"
    if wl.a.bits > MAX_BITS or wl.w.bits > MAX_BITS:
        return f"bit-serial supports 1..{MAX_BITS} bits per operand (wider: int8 path)"
    return support_limits_reason(wl)


def s8_atype(wl: Workload) -> str:
    """PTX type of the activation bytes for the s8 wgmma mode (weights are always .s8)."""
    return "u8" if wl.a.encoding is Encoding.UNSIGNED else "s8"


def xpop_lanes(shape: Shape) -> int:
    """Lanes that share one pixel in bitserial_xpop: its channel words rounded up to a power
    of two, at most a warp."""
    return min(32, pow2_ceil(shape.words))


def wsum_columns(shape: Shape) -> int:
    """Columns of each tap rectangle's row of weight sums (bitserial_wtap part 2): KOUT rounded
    up to the widest block tile, so a block's columns never leave the row."""
    return -(-shape.kout // 256) * 256


def wsum_start(shape: Shape) -> int:
    """Where the tap rectangles' weight sums start in the wtap table: past the KOUT prefix
    tables of (R+1)(S+1) entries, rounded up to even (the kernel reads column pairs)."""
    return -(-shape.kout * (shape.r + 1) * (shape.s + 1) // 2) * 2


def side_table_blocks(wl: Workload) -> tuple[int, int]:
    """Blocks of the bitserial_wtap and bitserial_xpop launches."""
    sh = conv_shape(wl)
    return -(-sh.kout * 32 // WTAP_THREADS), -(-sh.nb * sh.h * sh.w * xpop_lanes(sh)
                                               // XPOP_THREADS)


def threshold_stride(wl: Workload) -> int:
    """ints per column of the threshold tables: qmax - qmin levels, 3 padded to 4 so a column
    pair is two 16-byte loads (rendered as THR_STRIDE)."""
    levels = wl.epilogue.out.qmax - wl.epilogue.out.qmin
    return 4 if levels == 3 else levels


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


def pairs_possible(wl: Workload) -> bool:
    """Thresholds of two columns per 32-bit add (THR_PAIRS) can apply: a threshold epilogue
    whose compared values lie within 2^15 of each other (`pair_range`)."""
    return threshold_epilogue(wl) and pair_range(wl) is not None
