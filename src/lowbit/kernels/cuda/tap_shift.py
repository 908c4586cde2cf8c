"""Geometry of the tap-shift wgmma conv (cuda.bitserial_tap_shift, `bitserial_tap_shift.cu`).

A stride-1 conv computed in virtual rows: output pixel (n, ho, wo) is row
v = (n * VP + ho) * VQ + wo of a grid VP x VQ per image that leaves zero rows and columns after
each image row and image (VQ >= W + PAD, VP >= H + PAD), so the input pixel of tap (r, s) is
virtual input position v + r * VQ + s - BASE for every row v, BASE = PAD * (VQ + 1). A block of
BM consecutive virtual rows then reads, for every tap, the same BM-row window of one slab of
input positions, shifted by r * VQ + s: the block copies that slab into shared memory once
(zeros where the position is padding) and each tap's wgmma A operand is a descriptor whose start
address points at the shifted window. No im2col copies at all; the rows whose (ho, wo) lie in
the zero margin are computed and dropped ((VP * VQ) / (P * Q) of the MMA work: 1.04x for a
56x56 image, 1.31x for 7x7).

The reduction is cut into 128-bit halves (the two 16-byte core-matrix columns of a k256 wgmma):
- C a multiple of 128 (channel words CW % 4 == 0): a half is one 16-byte channel chunk of one
  tap; halves run chunk-major, so the two halves of a k256 step lie LBO > 0 bytes apart in the
  slab (same chunk: the taps' shift difference; chunk boundary: the chunk stride minus a
  shift). The chunks go in groups of two (256 channels), one cp.async group each, so the MMAs
  of group g start while later groups still load.
- C <= 64 (CW = 1 or 2): a slab entry holds 4 / CW consecutive positions (16 bytes), so one half
  covers that many taps of a kernel row; entries are 16 bytes apart whatever C is.
The weights stay in their (k, r, s, channel word) layout: each half names the span of weight
words it multiplies (zeros past it, and the A bits there meet those zeros).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bitserial_shape import Shape

ENTRY_BYTES = 16  # one core-matrix row: 128 bits of k
MAX_GROUPS = 8    # channel groups of 256 (the kernel's copy_wait ladder)


@dataclass(frozen=True)
class Half:
    """128 bits of a k256 step: slab entry offset (16-byte units from the group's plane base:
    chunk * SLAB_PIX + tap shift) and the weight words it meets (first, count <= 4)."""

    offset: int
    word: int
    words: int


@dataclass(frozen=True)
class Step:
    """One k256 wgmma of channel group `group`, B slab `slab` of that group's stage."""

    group: int
    slab: int
    lo: Half
    hi: Half

    @property
    def lbo(self) -> int:
        """Bytes from the low half's core matrices to the high half's (descriptor LBO)."""
        return (self.hi.offset - self.lo.offset) * ENTRY_BYTES

    @property
    def ones(self) -> tuple[int, int]:
        """(words, words) of ones the row-popcount wgmma needs in each half of its B tile."""
        return self.lo.words, self.hi.words


@dataclass(frozen=True)
class ShiftPlan:
    vq: int            # virtual row pitch (positions per image row)
    vp: int            # virtual image pitch (rows per image)
    base: int          # PAD * (VQ + 1): slab entry 0 is virtual position m0 - base
    v_rows: int        # virtual output rows up to the last real one
    slab_pix: int      # slab entries per chunk (BM + largest shift + 1, rounded up to 8)
    per_entry: int     # positions per 16-byte entry (4 / CW for C <= 64, else 1)
    chunks: int        # 16-byte channel chunks per position (CW / 4; 1 for C <= 64)
    group_chunks: int  # chunks per group (2, or 1 when there is one)
    steps: tuple[Step, ...]

    @property
    def groups(self) -> int:
        return 1 + max(s.group for s in self.steps)

    @property
    def group_steps(self) -> int:
        """B slabs per group stage (the most any group has)."""
        return 1 + max(s.slab for s in self.steps)

    @property
    def ones_tiles(self) -> tuple[tuple[int, int], ...]:
        """Distinct ones patterns of the row-popcount wgmma, in first-use order."""
        return tuple(dict.fromkeys(s.ones for s in self.steps))


def unsupported_reason(sh: Shape) -> str | None:
    """Why TAP_SHIFT=1 cannot run this shape (None: it can)."""
    if sh.stride != 1:
        return "TAP_SHIFT=1 needs stride 1 (a tap is a shift of the same window)"
    if sh.r * sh.s == 1:
        return "TAP_SHIFT=1 needs a kernel window larger than 1x1"
    if sh.chan_bits != 1:
        return "TAP_SHIFT=1 needs bit-plane operands"
    if sh.words > 2 and sh.words % 4:
        return f"TAP_SHIFT=1 needs C <= 64 or a multiple of 128 channels, not {sh.c}"
    if -(-sh.words // 8) > MAX_GROUPS:
        return f"TAP_SHIFT=1 takes at most {MAX_GROUPS * 256} channels"
    return None


def _group_halves(sh: Shape, vq: int, slab: int) -> list[list[Half]]:
    """The halves of each channel group in k order (before a zero half pads an odd count)."""
    cw = sh.words
    if cw <= 2:  # an entry holds `per` positions: one half covers that many taps of a row
        per = 4 // cw
        return [[Half(r * vq + s0, (r * sh.s + s0) * cw, min(per, sh.s - s0) * cw)
                 for r in range(sh.r) for s0 in range(0, sh.s, per)]]
    taps = [(r * vq + s, (r * sh.s + s) * cw) for r in range(sh.r) for s in range(sh.s)]
    return [[Half(lc * slab + shift, word + 4 * (2 * g + lc), 4)
             for lc in range(min(2, cw // 4 - 2 * g)) for shift, word in taps]
            for g in range(-(-cw // 8))]


@cache
def shift_plan(sh: Shape, bm: int) -> ShiftPlan:
    """The tap-shift geometry of `sh` for blocks of `bm` virtual rows."""
    reason = unsupported_reason(sh)
    if reason:
        raise ValueError(reason)
    pad = sh.pad
    # >= S too: the taps' shifts r * VQ + s then rise strictly in k order (every LBO > 0)
    vq = max(sh.w + pad, sh.q + sh.s - 1 - pad, sh.q, sh.s)
    vp = max(sh.h + pad, sh.p + sh.r - 1 - pad, sh.p)
    largest = (sh.r - 1) * vq + sh.s - 1
    slab = -(-(bm + largest + 1) // 8) * 8
    cw = sh.words
    chunks = 1 if cw <= 2 else cw // 4
    steps = []
    for g, halves in enumerate(_group_halves(sh, vq, slab)):
        if len(halves) % 2:  # a zero-weight half one entry on (LBO > 0; the A bits meet zeros)
            halves.append(Half(halves[-1].offset + 1, 0, 0))
        steps += [Step(g, i // 2, halves[i], halves[i + 1]) for i in range(0, len(halves), 2)]
    v_rows = ((sh.nb - 1) * vp + sh.p - 1) * vq + sh.q
    return ShiftPlan(vq, vp, pad * (vq + 1), v_rows, slab, 4 // cw if cw <= 2 else 1, chunks,
                     min(2, chunks), tuple(steps))


def group_words(plan: ShiftPlan, q_bits: int, b_rows: int) -> tuple[int, int]:
    """(slab words, weight words) of one channel group in shared memory: q_bits planes of
    group_chunks x slab_pix 16-byte entries; group_steps B slabs of b_rows 32-byte rows; each
    rounded up to 256 bytes (swizzled B tiles start on 256-byte boundaries)."""
    return (-(-q_bits * plane_words(plan) // 64) * 64,
            -(-plan.group_steps * b_rows * 8 // 64) * 64)


def plane_words(plan: ShiftPlan) -> int:
    """Words of one activation plane's slab in a group stage."""
    return plan.group_chunks * plan.slab_pix * 4


def render_tables(plan: ShiftPlan) -> str:
    """The plan as constexpr parameters and X-macro tables for bitserial_tap_shift.cu:
    SHIFT_STEPS(X) -> X(group, slab, A offset in entries, LBO in entries, ones tile) per k256
    step; SHIFT_HALVES(X) -> X(group, slab, half, first weight word, weight words);
    SHIFT_ONES(X) -> X(tile, words of ones in the low half, in the high half)."""
    ones = plan.ones_tiles
    steps = " ".join(f"X({s.group}, {s.slab}, {s.lo.offset}, {s.lbo // ENTRY_BYTES}, "
                     f"{ones.index(s.ones)})" for s in plan.steps)
    halves = " ".join(f"X({s.group}, {s.slab}, {i}, {h.word}, {h.words})"
                      for s in plan.steps for i, h in enumerate((s.lo, s.hi)))
    tiles = " ".join(f"X({i}, {a}, {b})" for i, (a, b) in enumerate(ones))
    consts = {"VQ": plan.vq, "VP": plan.vp, "SHIFT_BASE": plan.base, "SLAB_PIX": plan.slab_pix,
              "PER_ENTRY": plan.per_entry, "CHUNKS": plan.chunks,
              "GROUP_CHUNKS": plan.group_chunks, "GROUPS": plan.groups,
              "GROUP_STEPS": plan.group_steps, "ONES_TILES": len(ones)}
    lines = [f"constexpr int {k} = {v};" for k, v in consts.items()]
    lines.append(f"constexpr long long V_ROWS = {plan.v_rows}ll;")
    lines += [f"#define SHIFT_STEPS(X) {steps}", f"#define SHIFT_HALVES(X) {halves}",
              f"#define SHIFT_ONES(X) {tiles}"]
    return "\n".join(lines) + "\n"
