"""The first layer in one launch (`StemConfig(kernel="ring")`): image -> quantized ->
space-to-depth -> a stride-2 conv of at most 8x8 taps on C <= 4 channels (ResNet's 7x7/2) as a
dense implicit GEMM on the int8 tensor cores -> bias, ReLU, requantization -> 3x3/2 max-pool
(pool_pad 0 or 1) -> the layer's outputs. Semantics as `stem` (module docstring there).

Space-to-depth by the stride: the image pixels (2Y + d, 2X + e), d, e in {0, 1}, become one
pixel (Y, X) of 16 bytes, byte (d * 4 + c) * 2 + e for channel c < C (the rest 0). The filter,
padded to 8x8 where it is smaller (zero weights), is a 4x4 filter on those pixels: each conv
output's window is 4 rows of 4 pixels, row a 64 contiguous bytes, the reduction 256 bytes
(`ring_weights` lays the weights out in that order).

No quantized image is ever written to DRAM. Each program owns a ring of 8 space-to-depth rows
(2 * block_j + 4 pixels of 16 bytes; each row stored twice, at ring row Y mod 8 and 8 rows on,
so any 4 consecutive rows are 4 consecutive ring rows: 17 KB at block_j 32) in a private slot
of a small scratch tensor, which stays in L1 / L2; the grid is persistent (`programs_per_sm`
per SM), each program looping over tiles (one image, a band of pooled rows, block_j - 2 pooled
columns; grid axis 1: blocks of block_n output channels). Per tile, a prologue fills the ring
with its first three row pairs; then per pooled row t (a step):

1. the step's two new space-to-depth rows (four image rows, loaded during the previous step)
   are quantized, each image value once (float: `stored.quantize_f32`, exact; uint8: the
   int8 table [C, 256]), moved to pixel order in registers and stored into the ring;
   a barrier (the only one the ring needs: it holds 8 rows, a step reads 5 and writes 2,
   so a warp that runs one step ahead never overwrites a row another warp still reads);
   a float image with the status flag: the values times 0 summed in registers (NaN from
   the first inf or nan on), tested once at the program's end;
2. the next step's four image rows are loaded into registers, after the dot of 3
   (`StemConfig.late_loads`, the default: the dot's operand fence may wait for outstanding
   loads) or before it; their latency hides behind 4 (or 3 and 4);
3. the conv rows 2t - pool_pad + 1 and 2t - pool_pad + 2 at the pool windows' two column
   parities as ONE int8 dot, weights [block_n, 256] x windows^T [256, 4 block_j] (wgmma
   m64 n128 at block_j 32; `StemConfig.transposed=False`: windows x weights), each window
   4 runs of 64 contiguous ring bytes (16-byte vector loads, L1 hits after the first), the
   weights loaded once per program;
4. the max-pool (carried conv row, neighbour column) and `stem_gemm.stem_outputs` on the
   pooled int32 values only. Transposed, a channel's conv values (columns rs, par, jm) lie
   in one warp of the wgmma accumulator, rs and par in one thread: the pool's row and
   parity maxima move no data, the neighbour column takes one small layout change.

What bounds it (NOTES.md, "Stem": 797 us at batch 256 on an H100, the two-launch "bands"
kernel ~500): each step is a serial chain of 16 block barriers (layout changes, the ring, the
dot's fence), an L1 / L2 round trip of the ring rows just stored and 8 wgmma closed by a wait,
at 2 programs per SM; its time is latency, and a step does half a "bands" step's work.

The kernel runs without software pipelining (num_stages 1): a pipelined load of the ring
would run ahead of the barrier that orders it after the ring write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core import Precision
from .igemm import Launch, cdiv
from .stem_gemm import INT32_MIN, pool_step, stem_outputs
from .stem_geometry import StemConfig, StemGeometry, column_blocks, quant_constexprs
from .stored import quantize_f32

__all__ = ["RING_ROWS", "ring_band_rows", "ring_launch", "ring_refusal", "ring_weights"]

#: space-to-depth rows a program's ring holds (each stored twice: 16 ring rows), and bytes
#: per space-to-depth pixel
RING_ROWS = 8
PIXEL_BYTES = 16
#: the space-to-depth filter size the kernel runs (8x8 image taps at stride 2)
RING_TAPS = 4
#: a tile's prologue (its first three row pairs loaded and stored into the ring), in steps
PROLOGUE_STEPS = 2


# =========================================================================== kernel
@triton.jit
def _pair_lines(y0, x0, h_lim, W, QUANT: tl.constexpr, XW: tl.constexpr):
    """Where the lines [16, 2 XW] of space-to-depth rows y0, y0 + 1 and columns
    x0 .. x0 + XW - 1 read the image: per line (r, d, c) its channel c and image row
    iy = 2 (y0 + r - PS) + d, per column i its image column ix = 2 (x0 - PS) + i, and the
    mask of the values inside the image (rows below h_lim) of a channel c < C."""
    line = tl.arange(0, 16)
    c = line % 4
    iy = 2 * (y0 + line // 8 - QUANT.PS) + (line // 4) % 2
    ix = 2 * (x0 - QUANT.PS) + tl.arange(0, 2 * XW)
    row_ok = (c < QUANT.C) & (iy >= 0) & (iy < h_lim)
    mask = row_ok[:, None] & ((ix >= 0) & (ix < W))[None, :]
    return c, iy, ix, mask


@triton.jit
def _load_pair(x_ptr, n, y0, x0, strides, h_lim, W, QUANT: tl.constexpr, XW: tl.constexpr):
    """The image values of space-to-depth rows y0, y0 + 1 and columns x0 .. x0 + XW - 1 as
    lines [16, 2 XW] (`_pair_lines`); 0 outside the image (rows >= h_lim: H, or 0 to load
    nothing) and for c >= C. Any strides (NCHW or channels_last memory). strides and QUANT
    (`stem_geometry.QuantConstexprs`) as `ring_launch` makes them."""
    sn, sc, sh, sw = strides
    c, iy, ix, mask = _pair_lines(y0, x0, h_lim, W, QUANT, XW)
    off = (n * sn + c * sc + iy * sh)[:, None] + (ix * sw)[None, :]
    return tl.load(x_ptr + off, mask=mask, other=0)


@triton.jit
def _store_pair(ring, v, table_ptr, chk, y0, x0, H, W, scale, QUANT: tl.constexpr,
                XW: tl.constexpr):
    """Quantize the lines of `_load_pair(y0, x0)` and store them into the ring as pixels:
    ring[(y0 + r) mod 8, x, (d * 4 + c) * 2 + e] and its mirror 8 rows on (16-byte pixels,
    0 outside the image). Returns chk + v * 0 (HAS_STATUS, a float image: NaN from the first
    inf or nan on; the kernel tests it once per program), else chk."""
    c, _, _, mask = _pair_lines(y0, x0, H, W, QUANT, XW)
    if QUANT.U8:
        q = tl.load(table_ptr + c[:, None] * 256 + v.to(tl.int32), mask=mask, other=0)
    else:
        xf = v.to(tl.float32)
        q = quantize_f32(xf, scale, QUANT.ENC, QUANT.QMIN, QUANT.QMAX)
        if QUANT.HAS_STATUS:  # masked values were loaded as 0
            chk = chk + xf * 0.0
    q = tl.where(mask, q, 0).to(tl.int8)
    # lines (r, d, c) x columns (x, e) -> pixels (r, x) x bytes (d, c, e)
    pix = tl.reshape(tl.permute(tl.reshape(q, (2, 2, 4, XW, 2)), (0, 3, 1, 2, 4)),
                     (2 * XW, 16))
    p = tl.arange(0, 2 * XW)
    b = tl.arange(0, 16)
    slot = ((y0 + p // XW) & 7) * (XW + 4) + p % XW
    tl.store(ring + slot[:, None] * 16 + b[None, :], pix)
    tl.store(ring + (slot + 8 * (XW + 4))[:, None] * 16 + b[None, :], pix)  # the mirror
    return chk


@triton.jit
def _ring_windows(ring, row, xm, XW: tl.constexpr):
    """int8 [BM, 256]: the conv window of every M row (conv row `row`, ring column xm);
    window row a is ring row (row mod 8) + a (the mirror copy where that passes 8), so a
    window is 4 runs of 64 contiguous bytes at one offset per M row (16-byte vector
    loads)."""
    k = tl.arange(0, 256)
    k_off = tl.max_contiguous(tl.multiple_of((k // 64) * ((XW + 4) * 16) + k % 64, 16), 16)
    m_off = tl.multiple_of(((row & 7) * (XW + 4) + xm) * 16, 16)
    return tl.load(ring + m_off[:, None] + k_off[None, :])


@triton.jit
def _pool_step_t(acc_t, carry_a, carry_b, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr):
    """`stem_gemm.pool_step` on the transposed accumulator [BLOCK_N, 4 BLOCK_J] (columns
    (rs, par, jm)); carries [BLOCK_N, BLOCK_J]; returns the pooled values [BLOCK_J,
    BLOCK_N]. Every M column of a channel row sits in one warp of the wgmma accumulator,
    rs and par in one thread: the row pairs, parities and the neighbour gather need no
    shared memory."""
    parts = tl.permute(tl.reshape(acc_t, (BLOCK_N, 2, 2, BLOCK_J)), (0, 3, 2, 1))
    lo, hi = tl.split(parts)
    lo_a, lo_b = tl.split(lo)
    hi_a, hi_b = tl.split(hi)
    rows_a = tl.maximum(carry_a, tl.maximum(lo_a, hi_a))
    rows_b = tl.maximum(carry_b, tl.maximum(lo_b, hi_b))
    jj = tl.arange(0, BLOCK_J)
    nxt = tl.minimum(jj + 1, BLOCK_J - 1)[None, :] + tl.zeros((BLOCK_N, BLOCK_J), tl.int32)
    pooled = tl.maximum(tl.maximum(rows_a, rows_b), tl.gather(rows_a, nxt, 1))
    return tl.trans(pooled), hi_a, hi_b


@triton.jit
def stem_ring_kernel(x_ptr, table_ptr, w_ptr, bias_ptr, ring_ptr, status_ptr, strides, dims,
                     outs, QUANT: tl.constexpr, PP: tl.constexpr, HAS_BIAS: tl.constexpr,
                     TRANS: tl.constexpr, LATE_LOADS: tl.constexpr, OUTS: tl.constexpr,
                     BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr):
    """See the module docstring; the arguments as `ring_launch` makes them. Grid (programs,
    channel blocks); tile = (image, band, column block), program p runs tiles p,
    p + programs, ..."""
    H, W, scale, OH, OW, PH, PW, K, tiles, bands, col_blocks, band_rows = dims
    XW: tl.constexpr = 2 * BLOCK_J
    BM: tl.constexpr = 4 * BLOCK_J
    pid = tl.program_id(0)
    ring = ring_ptr + (pid * tl.num_programs(1) + tl.program_id(1)) * (16 * (XW + 4) * 16)
    n_idx = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_idx < K
    k = tl.arange(0, 256)
    if TRANS:  # the weights as the dot's A operand [BLOCK_N, 256]
        w = tl.load(w_ptr + n_idx[:, None] * 256 + k[None, :], mask=n_mask[:, None], other=0)
    else:
        w = tl.load(w_ptr + n_idx[None, :] * 256 + k[:, None], mask=n_mask[None, :], other=0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + n_idx, mask=n_mask, other=0)
    else:
        bias = tl.zeros((BLOCK_N,), dtype=tl.int32)
    # M row m: conv row pair member rs, column parity par, pooled column jm of the block
    mm = tl.arange(0, BM)
    rs = mm // (2 * BLOCK_J)
    xm = 2 * (mm % BLOCK_J) + (mm // BLOCK_J) % 2
    jj = tl.arange(0, BLOCK_J)
    chk = tl.zeros((16, 2 * XW), tl.float32)
    for tile in range(pid, tiles, tl.num_programs(0)):
        cb = tile % col_blocks
        band = (tile // col_blocks) % bands
        n = tile // (col_blocks * bands)
        j0 = cb * (BLOCK_J - 2)
        x0 = 2 * j0 - PP  # the block's first conv column, its first space-to-depth column
        t0 = band * band_rows
        t_end = tl.minimum(t0 + band_rows, PH)
        # prologue: the space-to-depth rows of step t0 - 1 but its own new pair, and that
        # pair (three loads in flight at once)
        y0 = 2 * t0 - PP - 2
        v0 = _load_pair(x_ptr, n, y0, x0, strides, H, W, QUANT, XW)
        v1 = _load_pair(x_ptr, n, y0 + 2, x0, strides, H, W, QUANT, XW)
        v = _load_pair(x_ptr, n, y0 + 4, x0, strides, H, W, QUANT, XW)
        chk = _store_pair(ring, v0, table_ptr, chk, y0, x0, H, W, scale, QUANT, XW)
        chk = _store_pair(ring, v1, table_ptr, chk, y0 + 2, x0, H, W, scale, QUANT, XW)
        if TRANS:
            carry_a = tl.full((BLOCK_N, BLOCK_J), INT32_MIN, tl.int32)
            carry_b = tl.full((BLOCK_N, BLOCK_J), INT32_MIN, tl.int32)
        else:
            carry_a = tl.full((BLOCK_J, BLOCK_N), INT32_MIN, tl.int32)
            carry_b = tl.full((BLOCK_J, BLOCK_N), INT32_MIN, tl.int32)
        # t0 - 1 first: its second conv row is the first window row of pooled row t0
        for t in range(t0 - 1, t_end):
            yt = 2 * t + 4 - PP  # the step's new pair of space-to-depth rows
            chk = _store_pair(ring, v, table_ptr, chk, yt, x0, H, W, scale, QUANT, XW)
            tl.debug_barrier()
            h_lim = tl.where(t + 1 < t_end, H, 0)  # nothing past the tile's last step
            if not LATE_LOADS:
                v = _load_pair(x_ptr, n, yt + 2, x0, strides, h_lim, W, QUANT, XW)
            oh = 2 * t - PP + 1 + rs
            x = _ring_windows(ring, oh, xm, XW)
            ow = x0 + xm
            ok = (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
            if TRANS:  # conv^T [BLOCK_N, BM] = weights [BLOCK_N, 256] x windows^T
                acc = tl.dot(w, tl.trans(x), out_dtype=tl.int32)
                acc = tl.where(ok[None, :], acc, INT32_MIN)
                pooled, carry_a, carry_b = _pool_step_t(acc, carry_a, carry_b, BLOCK_J,
                                                        BLOCK_N)
            else:
                acc = tl.where(ok[:, None], tl.dot(x, w, out_dtype=tl.int32), INT32_MIN)
                nxt = tl.minimum(jj + 1, BLOCK_J - 1)[:, None] + tl.zeros(
                    (BLOCK_J, BLOCK_N), tl.int32)
                pooled, carry_a, carry_b = pool_step(acc, carry_a, carry_b, nxt, BLOCK_J,
                                                     BLOCK_N)
            if LATE_LOADS:  # issued after the dot: its operand fence does not wait for them
                v = _load_pair(x_ptr, n, yt + 2, x0, strides, h_lim, W, QUANT, XW)
            jo = j0 + jj
            pix_mask = (jj < BLOCK_J - 2) & (jo < PW) & (jj * 0 + t >= t0)
            stem_outputs(pooled, bias, (n * PH + t) * PW + jo, pix_mask, n_idx, K, outs,
                         OUTS, BLOCK_J, BLOCK_N)
        tl.debug_barrier()  # the next tile's prologue overwrites rows this tile still reads
    if QUANT.HAS_STATUS:  # one test per program: chk is NaN where the image held inf or nan
        if tl.max((chk != chk).to(tl.int32)) > 0:
            tl.atomic_max(status_ptr, 1)


# =========================================================================== host side
def ring_refusal(geom: StemGeometry) -> str | None:
    """Why the ring kernel cannot run the first layer `geom` (None: it can)."""
    if geom.stride != 2:
        return f"stride {geom.stride} (the ring kernel runs stride 2)"
    if geom.C > 4:
        return f"{geom.C} channels (at most 4: 16-byte space-to-depth pixels)"
    if geom.RS > RING_TAPS or geom.a_min < -2:
        return f"a {geom.R}x{geom.R} filter with pad {geom.pad} spans more than 8x8 taps"
    if geom.pool_pad is None:
        return "no max-pool (the ring kernel fuses the 3x3/2 pool)"
    return None


def ring_weights(weight: torch.Tensor, geom: StemGeometry) -> torch.Tensor:
    """KRSC integer weights -> int8 [K, 256] in the ring kernel's reduction order: window row
    a, column b, byte (d * 4 + c) * 2 + e, i.e. filter tap (2 (a - PS) + d + pad,
    2 (b - PS) + e + pad) of channel c, PS = -geom.a_min; zero where that tap is outside the
    filter or c >= C."""
    out = torch.zeros(geom.K, RING_TAPS, RING_TAPS, 2, 4, 2, dtype=torch.int8)
    w = weight.to(torch.int8).cpu()
    for a in range(RING_TAPS):
        for d in range(2):
            r = 2 * (a + geom.a_min) + d + geom.pad
            if not 0 <= r < geom.R:
                continue
            for b in range(RING_TAPS):
                for e in range(2):
                    s = 2 * (b + geom.a_min) + e + geom.pad
                    if 0 <= s < geom.R:
                        out[:, a, b, d, :geom.C, e] = w[:, r, s, :]
    return out.reshape(geom.K, -1)


def ring_band_rows(geom: StemGeometry, block_j: int, block_n: int, sms: int, per_sm: int
                   ) -> int:
    """The band (pooled rows per tile) of least predicted time: tiles run in rounds of
    sms * per_sm programs, a tile of `rows` pooled rows costs rows + 1 steps (the first
    recomputes the previous band's last conv row) plus its prologue; the longest band on ties
    (fewest rows read twice)."""
    col_blocks = column_blocks(geom, block_j, "ring")
    chans = cdiv(geom.K, block_n)

    def cost(rows: int) -> int:
        programs = geom.N * col_blocks * cdiv(geom.PH, rows) * chans
        return cdiv(programs, sms * per_sm) * (rows + 1 + PROLOGUE_STEPS)

    options = sorted({geom.PH, *(r for r in (32, 16, 8, 4, 2, 1) if r < geom.PH)},
                     reverse=True)
    return min(options, key=cost)


def ring_launch(image: torch.Tensor, table: torch.Tensor | None, weight: torch.Tensor,
                bias: torch.Tensor | None, outputs: tuple[tuple, tuple], geom: StemGeometry,
                cfg: StemConfig, prec: Precision, scale: float, status: torch.Tensor | None,
                sms: int) -> Launch:
    """The ring kernel's launch for checked inputs (`stem.bind_stem`): image NCHW-shaped
    (any strides), table int8 [C, 256] on the device for a uint8 image, weight KRSC, bias
    int32 [K] on the device or None, the outputs' `outs` and OUTS
    (`stem_gemm.output_group`), the input precision `prec` and float32 `scale`; dims
    (runtime sizes, in the order the kernel unpacks them) and QUANT
    (`stem_geometry.quant_constexprs`). Allocates the program's ring scratch."""
    device = image.device
    block_j, block_n = cfg.block_j, cfg.block_n
    col_blocks = column_blocks(geom, block_j, "ring")
    bands = cdiv(geom.PH, cfg.band_rows)
    tiles = geom.N * bands * col_blocks
    chans = cdiv(geom.K, block_n)
    programs = max(1, min(tiles, sms * cfg.programs_per_sm))
    ring = torch.zeros(programs * chans * 2 * RING_ROWS * (2 * block_j + 4) * PIXEL_BYTES,
                       dtype=torch.int8, device=device)
    w = ring_weights(weight, geom).to(device)
    is_u8 = image.dtype == torch.uint8
    dims = dict(H=geom.H, W=geom.W, scale=scale, OH=geom.OH, OW=geom.OW, PH=geom.PH,
                PW=geom.PW, K=geom.K, tiles=tiles, bands=bands, col_blocks=col_blocks,
                band_rows=cfg.band_rows)
    outs, out_consts = outputs
    args = (image, table if is_u8 else w, w, bias if bias is not None else w, ring,
            status if status is not None else ring, tuple(image.stride()),
            tuple(dims.values()), outs)
    constexprs = dict(QUANT=quant_constexprs(geom, prec, is_u8, status is not None),
                      PP=geom.pool_pad, HAS_BIAS=bias is not None, TRANS=cfg.transposed,
                      LATE_LOADS=cfg.late_loads, OUTS=out_consts, BLOCK_J=block_j,
                      BLOCK_N=block_n, **cfg.launch_options(num_stages=1))
    return Launch(stem_ring_kernel, (programs, chans), args, constexprs)
