"""The tables a bound bit-serial kernel reads besides its operands, made at bind: the
requantization thresholds (and their packed pairs), the per-row table, the side tables the
small kernels fill (weight sums per tap rectangle, pixel popcounts), the weights' stage images,
the split-K workspace and TMA_HALO's tensor map. `spec`: the kernel's parameters
(`bitserial_layout`)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import torch

from ...core import Encoding, Layout, Precision, Workload
from ...core.epilogue import MAX_DERIVED, EpilogueParams, bias_vector
from ...reference.epilogue import INT32_MAX, requant_thresholds
from ..base import acc_bound
from .bitserial_layout import (
    k_tiles,
    pairs_in_memory,
    rowsum_table,
    stage_bytes,
    tap_shift,
    threshold_slots,
    tile_grid,
    uses_thresholds,
    window_shape,
)
from .bitserial_shape import (
    Shape,
    conv_shape,
    needs_wtap,
    pair_range,
    planes,
    rect_slots,
    threshold_stride,
    wsum_columns,
    wsum_start,
)
from .nvrtc import tensor_map_tiled
from .tap_shift import shift_plan


def epilogue_thresholds(wl: Workload, spec: Mapping, params: EpilogueParams
                        ) -> torch.Tensor | None:
    """The int32 [wsum_columns, threshold_stride] table a REQUANT="threshold" kernel reads
    (None otherwise), on the device of params.multiplier: `requant_thresholds` in front, padded
    past KOUT and past the levels with INT32_MAX (never reached), so the kernel loads every
    column of a block tile unguarded and a column pair's thresholds as 16-byte loads."""
    if not uses_thresholds(spec):
        return None
    thr = requant_thresholds(wl.epilogue, params)
    table = torch.full((wsum_columns(conv_shape(wl)), threshold_stride(wl)), INT32_MAX,
                       dtype=torch.int32)
    table[: thr.shape[0], : thr.shape[1]] = thr
    if pairs_in_memory(wl, spec) and not needs_wtap(wl):
        table = pair_table(wl, spec, table)  # binary activations: wtap part 4 instead
    return table.to(params.multiplier.device)


def epilogue_vectors(wl: Workload, params: EpilogueParams, thr: torch.Tensor | None
                     ) -> list[torch.Tensor | None]:
    """The kernel's (bias, scale, mult, shift, thr) arguments (BITSERIAL_KERNEL_PARAMS order):
    the vectors of `params` and the threshold table `thr`; with Epilogue.residual (multiply
    path, no thresholds) the pointers that path leaves unused carry the residual term
    (bitserial_epilogue.cu, HAS_BIAS 3 / 4): bias the int64 shifted bias, scale the int64
    residual multipliers, mult the int64 multipliers, thr the residual tensor. With
    Epilogue.requant32 (bitserial_block_end.cu): mult the column table
    (`requant32_columns`), thr the narrow residual (or None), the others as given."""
    bias = bias_vector(wl.epilogue, params)
    if wl.epilogue.requant32:
        return [bias, params.residual_multiplier, requant32_columns(wl, params), params.shift,
                params.residual]
    if wl.epilogue.residual is None:
        return [bias, params.scale, params.multiplier, params.shift, thr]
    if thr is not None:
        raise ValueError("a residual epilogue runs the multiply path, not thresholds")
    return [bias, params.residual_multiplier, params.multiplier, params.shift, params.residual]


#: the low 32-bit word of a Python integer
MASK32 = 0xFFFFFFFF


def requant32_columns(wl: Workload, params: EpilogueParams) -> torch.Tensor:
    """The block-end epilogue's column table on the params' device, int32 [wsum_columns, 4]:
    per output column {m, b + 2^(s-1), r, s} (r 0 without a residual), past KOUT {0, 0, 0, 1}
    (z = 0: the kernel reads every column of a block tile unguarded, one 16-byte load each).
    With Epilogue.sum64 int32 [wsum_columns, 8]: {m, s, c lo, c hi} {r lo, r hi, max(s - 32,
    0), 0} with c = b + 2^(s-1) - o r, r and c as 64-bit words (two's complement mod 2^64), o
    128 for a signed residual (the kernel reads its bytes offset by 128, as unsigned: res r =
    (res + o) r - o r), else 0; past KOUT {0, 1, 0, 0} {0, 0, 0, 0}. With Epilogue.guarded
    int32 [wsum_columns * 12], flat: the 32-bit entries of `guarded_columns` (16 bytes a
    column) followed by the sum64 table."""
    k = conv_shape(wl).kout
    s = params.shift.cpu().to(torch.int64)
    r = (params.residual_multiplier.cpu().to(torch.int64)
         if params.residual_multiplier is not None else torch.zeros_like(s))
    b = params.shifted_bias.cpu().to(torch.int64)
    m = params.multiplier.cpu().to(torch.int64)
    if not wl.epilogue.sum64:
        table = torch.zeros(wsum_columns(conv_shape(wl)), 4, dtype=torch.int64)
        table[:, 3] = 1
        table[:k] = torch.stack([m, b + (1 << (s - 1)), r, s], 1)
        return table.to(torch.int32).to(params.multiplier.device)
    offset = residual_offset(wl)
    rows = [[0, 1, 0, 0, 0, 0, 0, 0] for _ in range(wsum_columns(conv_shape(wl)))]
    for c, (mc, bc, rc, sc) in enumerate(zip(m.tolist(), b.tolist(), r.tolist(), s.tolist(),
                                             strict=True)):
        const = (bc + (1 << (sc - 1)) - offset * rc) % 2**64  # exact Python integers
        rw = rc % 2**64
        rows[c] = [mc, sc, const & MASK32, const >> 32, rw & MASK32, rw >> 32, max(sc - 32, 0),
                   0]
    if wl.epilogue.guarded:
        entries = guarded_columns(wl, m.tolist(), b.tolist(), r.tolist(), s.tolist())
        if entries is None:
            raise ValueError(f"params: no guarded 32-bit form of {wl.epilogue.key} for the "
                             f"accumulator and residual bounds (guarded_columns); use the "
                             f"plain sum64 form")
        pad = [[0, 0, 0, 1]] * (len(rows) - len(entries))
        rows = [w for e in entries + pad for w in e] + [w for row in rows for w in row]
    table = torch.tensor(rows, dtype=torch.int64)
    table = torch.where(table >= 2**31, table - 2**32, table)  # the words' bit patterns
    return table.to(torch.int32).to(params.multiplier.device)


def residual_offset(wl: Workload) -> int:
    """What the sum64 / guarded block end adds to each residual byte (it reads them unsigned):
    128 for a signed residual, else 0."""
    res = wl.epilogue.narrow_residual
    return 128 if res is not None and res.encoding is Encoding.SIGNED else 0


#: the guarded block end's band B (bitserial_block_end.cu) is a power of two >= 2^GUARD_SHIFT_BITS:
#: its shift word {s | 2^s - B} holds s in the low bits the mask 2^s - B leaves free
GUARD_SHIFT_BITS = 5


def guarded_form(m: int, b: int, r: int, s: int, top_acc: int, top_res: int
                 ) -> tuple[int, int, int, int, int] | None:
    """(m', b', r', s', H) of one column: the exact block end floor((y m + u r + b + 2^(s-1))
    / 2^s) (its 64-bit form, |y| <= top_acc, |u| <= top_res) at the largest shift s' <= 30
    whose rounded multipliers m' = round(m 2^(s'-s)), r', b' keep |y| m' + |u| |r'| + |b'| +
    2^(s'-1) + H below 2^31 (the kernel adds H), and H the band's half-width: the power of
    two >= max(E, 2^(GUARD_SHIFT_BITS - 1)) for E = ceil(e 2^s') + 1, e the largest |x - x'|
    of the exact x = (y m + u r + b) / 2^s and x' = (y m' + u r' + b') / 2^s'. Where the
    32-bit sum z' (its 2^(s'-1) included) lies >= H from every multiple of 2^s',
    floor(z' / 2^s') is the exact output (a step between x and x' would lie within e of x').
    None where no shift fits or 2H > 2^(s'-1). Exact Python integers."""
    for s2 in range(30, 0, -1):
        def at(v: int, s2: int = s2) -> int:  # v 2^(s2 - s), rounded half up
            return v << (s2 - s) if s2 >= s else (v + (1 << (s - s2 - 1))) >> (s - s2)

        m2, r2, b2 = at(m), at(r), at(b)
        # e 2^s2 = (top_acc |m 2^s2 - m2 2^s| + ...) / 2^s, exactly; E its ceiling plus one
        num = (top_acc * abs((m << s2) - (m2 << s)) + top_res * abs((r << s2) - (r2 << s))
               + abs((b << s2) - (b2 << s)))
        near = -(-num >> s) + 1
        half = 1 << max((near - 1).bit_length(), GUARD_SHIFT_BITS - 1)
        if top_acc * abs(m2) + top_res * abs(r2) + abs(b2) + (1 << (s2 - 1)) + half >= 2**31:
            continue
        if 2 * half > 1 << (s2 - 1):
            return None
        return m2, b2, r2, s2, half
    return None


def guarded_columns(wl: Workload, m: list[int], b: list[int], r: list[int], s: list[int]
                    ) -> list[list[int]] | None:
    """Epilogue.guarded's 32-bit column entries {m', b' + 2^(s'-1) - o r' + H, r', s' |
    2^s' - 2H} (`guarded_form` of each column at the workload's accumulator bound and its
    narrow residual's range, o `residual_offset`: the kernel's residual bytes read unsigned,
    as the 64-bit redo reads them; words mod 2^32): the kernel's sum is z' + H, whose bits
    log2(2H) .. s' - 1 all zero (its remainder below 2H) mark z' within H of a step (the
    64-bit redo); elsewhere (z' + H) >> s' = z' >> s'. None where some column has no guarded
    form (the plan keeps sum64)."""
    forms = guarded_forms(wl, m, b, r, s)
    if forms is None:
        return None
    offset = residual_offset(wl)
    return [[m2 & MASK32, (b2 + (1 << (s2 - 1)) - offset * r2 + half) & MASK32, r2 & MASK32,
             s2 | ((1 << s2) - 2 * half)] for m2, b2, r2, s2, half in forms]


def guarded_forms(wl: Workload, m: list[int], b: list[int], r: list[int], s: list[int]
                  ) -> list[tuple[int, int, int, int, int]] | None:
    """`guarded_form` (m', b', r', s', H) of each column of the sum64 block end `wl` at its
    accumulator bound and its narrow residual's range; None where some column has none."""
    res = wl.epilogue.narrow_residual
    top_res = 0 if res is None else max(-res.qmin, res.qmax)
    top_acc = acc_bound(wl)
    forms = [guarded_form(mc, bc, rc if res is not None else 0, sc, top_acc, top_res)
             for mc, bc, rc, sc in zip(m, b, r, s, strict=True)]
    return None if any(f is None for f in forms) else forms


#: bit-plane derived outputs of 1 or 3 levels compare the mid value with threshold words (the
#: .cu's THR_CMP_LEVELS words each); the others read a byte table of the mid value
THR_CMP_LEVELS = 3


class BlockEndArgs(ctypes.Structure):
    """bitserial_kernel_args.cu's BlockEndArgs, passed by value."""

    _fields_ = [("derived", ctypes.c_void_p * MAX_DERIVED),
                ("lut", ctypes.c_void_p * MAX_DERIVED),
                ("thr", (ctypes.c_int * THR_CMP_LEVELS) * MAX_DERIVED)]


def compares_pairs(prec: Precision, layout: Layout) -> bool:
    """A derived output the block-end kernel compares two columns per add (bit planes of u1,
    u2 or s2: bitserial_block_end.cu's PAIR_CMP), not through a byte table."""
    levels = prec.qmax - prec.qmin
    return layout is Layout.BITPLANE and (levels == 1 or (levels == 3 and prec.qmin % 2 == 0))


def block_end_args(wl: Workload, params: EpilogueParams
                   ) -> tuple[BlockEndArgs | None, list[torch.Tensor]]:
    """The block-end kernel's BlockEndArgs (None without Epilogue.requant32) and the tensors
    it points into (keep them alive while the kernel may run): each derived output's buffer
    (params.derived_out, required), and its thresholds T as words (`compares_pairs`: per
    level 0x8000 - clamp(T - lo, 0, hi - lo + 1) in both 16-bit halves, [lo, hi] the mid
    value's range; the kernel adds it to two columns' q - lo and reads q >= T in the halves'
    top bits) or as a byte table (lut[i] = the low byte of P_j.qmin + #{t in T : t <= lo + i},
    i = 0 .. hi - lo; on the buffers' device)."""
    epi = wl.epilogue
    if not epi.requant32:
        return None, []
    if len(params.derived_out) != len(epi.derived):
        raise ValueError(f"params.derived_out must hold one buffer per derived output of "
                         f"{epi.key} (the kernel writes them), got {len(params.derived_out)}")
    args = BlockEndArgs()
    keep: list[torch.Tensor] = []
    lo, hi = epi.mid_range
    for j, ((prec, layout), thr, buf) in enumerate(zip(epi.derived, params.thresholds,
                                                       params.derived_out, strict=True)):
        t = thr.cpu().to(torch.int64)
        args.derived[j] = buf.data_ptr()
        keep.append(buf)
        if compares_pairs(prec, layout):
            for k, v in enumerate(t.tolist()):
                half = 0x8000 - min(max(v - lo, 0), hi - lo + 1)
                word = half * 0x10001
                args.thr[j][k] = word - (1 << 32) if word >= 1 << 31 else word
            continue
        values = prec.qmin + torch.searchsorted(t, torch.arange(lo, hi + 1), right=True)
        lut = (values & 0xFF).to(torch.uint8).to(buf.device)
        args.lut[j] = lut.data_ptr()
        keep.append(lut)
    return args, keep


def pair_channel(j: torch.Tensor, wn: int) -> torch.Tensor:
    """The output channel that accumulator column j of a THR_PAIRS warp tile of wn columns
    holds (bitserial_common.cu's pair_channel: lane t4 owns channels [wn/4 t4, wn/4 (t4 + 1)))."""
    ni, t4, e = j // 8, j % 8 // 2, j % 2
    return wn // 4 * t4 + 16 * (ni // 8) + 8 * e + ni % 8


def pair_table(wl: Workload, spec: Mapping, table: torch.Tensor) -> torch.Tensor:
    """THR_PAIRS without thresholds in shared memory: the int32 [rows / 2, PAIR_STRIDE] table of
    packed words from the [rows, threshold_stride] thresholds, per pair of accumulator columns
    (2p, 2p + 1; their channels by `pair_channel` within each WN-wide warp tile) and level:
    0x8000 + base - t in each 16-bit half, t clamped to [base, hi + 1] (`pair_range`)."""
    r, wn = pair_range(wl), spec["WN"]
    cols = torch.arange(table.shape[0])
    chans = cols // wn * wn + pair_channel(cols % wn, wn)
    levels = wl.epilogue.out.qmax - wl.epilogue.out.qmin
    t = table[chans, :levels].to(torch.int64).clamp(r.base, r.hi + 1)
    half = 0x8000 + r.base - t
    words = half[0::2] | (half[1::2] << 16)
    out = torch.zeros(table.shape[0] // 2, threshold_stride(wl), dtype=torch.int64)
    out[:, :levels] = words
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


def row_table(wl: Workload, spec: Mapping, device: torch.device | str) -> torch.Tensor | None:
    """ROW_TABLE=1: int32 [row tiles * BM, 2], for every row v the blocks tile (the output rows,
    or the tap-shift grid's virtual rows) its output row (M_ROWS where v lies in the margin or
    past the last image: dropped) and the id of its tap rectangle (the taps whose input lies
    inside the image; the kernel's `rect_id` of `tap_range` on both axes; with
    `threshold_slots` of binary activations its slot in `rect_slots`). ROW_TABLE=2: flat,
    followed by the input pixel of every virtual input position f >= -BASE a slab copy reads,
    at f + BASE (-1 in the margin, before the first image or past the last: copied as zeros).
    Depends on the geometry alone; None without ROW_TABLE."""
    if not spec["ROW_TABLE"]:
        return None
    sh = conv_shape(wl)
    if not tap_shift(spec):  # the output rows themselves
        return _row_entries(sh, sh.q, sh.p, sh.rows, spec["BM"], device)
    plan = shift_plan(sh, spec["BM"])
    rows = _row_entries(sh, plan.vq, plan.vp, plan.v_rows, spec["BM"], device)
    if threshold_slots(wl, spec) and needs_wtap(wl):  # rect ids -> slots (no pixel's: 0)
        slot = torch.zeros((sh.r + 1) ** 2 * (sh.s + 1) ** 2, dtype=torch.int32, device=device)
        ids = torch.tensor(rect_slots(sh), device=device)
        slot[ids] = torch.arange(len(ids), dtype=torch.int32, device=device)
        rows[:, 1] = slot[rows[:, 1].long()]
    if spec["ROW_TABLE"] < 2:
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


def halo_map_geometry(wl: Workload, spec: Mapping) -> tuple[list[int], list[int], list[int]]:
    """TMA_HALO's tensor map of x ([plane][image][row][column][channel words]): its dims and
    box (innermost first: bytes of a pixel's channels, columns, rows, plane x image) and its
    strides in bytes (dims 1..3). A box is one channel block (TMA_HALO bytes per pixel) of the
    pixel tile's HALO_H x HALO_W window."""
    sh = conv_shape(wl)
    pix = sh.words * 4
    dims = [pix, sh.w, sh.h, sh.nb * planes(wl)[0]]
    strides = [pix, pix * sh.w, pix * sh.w * sh.h]
    rows, cols = window_shape(wl, spec)
    box = [spec["TMA_HALO"], cols, rows, 1]
    return dims, strides, box


def halo_tensor_map(wl: Workload, spec: Mapping, x: torch.Tensor) -> ctypes.Array | None:
    """TMA_HALO: the tensor map of `x` (on the GPU) that the kernel's window copies read,
    swizzled TMA_HALO bytes, zeros out of bounds; None without TMA_HALO."""
    if not spec["TMA_HALO"]:
        return None
    dims, strides, box = halo_map_geometry(wl, spec)
    return tensor_map_tiled(x.data_ptr(), dims, strides, box, swizzle_bytes=spec["TMA_HALO"])


def weight_images(wl: Workload, spec: Mapping, device: torch.device | str
                  ) -> torch.Tensor | None:
    """BULK_WEIGHTS: the int32 buffer of the weights' stage images [column tiles][k tiles]
    [stage words] that bitserial_wimage fills (None otherwise)."""
    if not spec["BULK_WEIGHTS"]:
        return None
    cols = tile_grid(wl, spec)[0]
    words = stage_bytes(wl, spec) // 4
    return torch.empty(cols * k_tiles(wl, spec) * words, dtype=torch.int32, device=device)


def split_workspace(wl: Workload, spec: Mapping, device: torch.device | str
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """SPLIT_K > 1: the int32 partial sums [SPLIT_K, row tiles * BM, column tiles * BN] and the
    per-tile arrival counters (zeros; the last block of a tile resets its counter, so both are
    reused by every launch of one bound kernel); (None, None) otherwise."""
    splits = spec["SPLIT_K"]
    if splits == 1:
        return None, None
    cols, rows = tile_grid(wl, spec)
    ws = torch.empty(splits * rows * spec["BM"] * cols * spec["BN"], dtype=torch.int32,
                     device=device)
    return ws, torch.zeros(rows * cols, dtype=torch.int32, device=device)


def side_tables(wl: Workload, spec: Mapping, device: torch.device | str
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
        stride = threshold_stride(wl) if uses_thresholds(spec) else 0
        rects = tab * tab * wsum_columns(sh)
        pairs = rects // 2 * stride if pairs_in_memory(wl, spec) else 0
        wtap = torch.empty(wsum_start(sh) + rects * (1 + stride) + pairs, dtype=torch.int32,
                           device=device)
    if rowsum_table(spec):
        xpop = torch.empty(planes(wl)[0] * sh.nb * sh.h * sh.w, dtype=torch.int32,
                           device=device)
    return wtap, xpop
