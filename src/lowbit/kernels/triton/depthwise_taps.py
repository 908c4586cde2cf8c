"""The filter taps of `triton.conv2d_depthwise` / `conv2d_grouped_cuda` on CUDA cores: one
tap's products (`tap_product`, over the channel tiles `channel_tile` / `channel_gather`
load), byte dot products (`dot4`: one dp4a, 4 byte products and their sum), and the
depthwise taps four at a time (MAC="dp4a", `tap_group_sum`).

A depthwise conv's products do not sum over channels, so a dp4a cannot take an activation
word (4 channels of a pixel) as it comes. With one-byte activations (INT8 layout, C a multiple
of 4) the words of channels 4u..4u+3 at 4 taps t0..t3 form a 4 x 4 byte matrix (tap x
channel); a byte transpose (8 prmt.b32, `TRANSPOSE_STEPS`) turns it into 4 words, word j
holding channel 4u + j's 4 tap bytes, and one dp4a with that channel's 4 tap weights (packed
in one word when the launch is planned: `tap_group_words`) adds 4 products: 12 instructions
for 16 multiply-accumulates, where the int32 path spends two a product (a byte extract and
an IMAD). The R*S mod 4 taps past the last group take one dp4a a channel: the tap's word
times a weight word holding channel 4u + j's weight in byte j and zeros elsewhere (4
instructions for 4 products, no byte extract). Four accumulators [BLOCK_PIX, BLOCK_C / 4]
(channel 4u + j in column u of accumulator j) are interleaved back into the
[BLOCK_PIX, BLOCK_C] int32 tile for the epilogue at the end.

Under TRITON_INTERPRET=1 no PTX runs: the transpose and dp4a are computed byte by byte
(`byte_transpose`, `dot4` with asm ""); `prmt_transpose` runs `TRANSPOSE_STEPS` in Python
with prmt's PTX semantics, so a CPU test checks the GPU path's byte order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core import ConvWorkload, Layout
from .epilogue import decode_values
from .templates import interpreting

#: the byte transpose: (destination, a, b, selector) per prmt.b32 d, a, b, c (bytes 0-3 of a,
#: 4-7 of b; nibble i of c picks d's byte i); inputs $4..$7 (the words of taps t0..t3),
#: outputs $0..$3 (channel j's tap bytes in $j)
TRANSPOSE_STEPS = (
    ("lo01", "$4", "$5", 0x5140),  # t0.b0 t1.b0 t0.b1 t1.b1
    ("hi01", "$4", "$5", 0x7362),  # t0.b2 t1.b2 t0.b3 t1.b3
    ("lo23", "$6", "$7", 0x5140),
    ("hi23", "$6", "$7", 0x7362),
    ("$0", "lo01", "lo23", 0x5410),  # t0.b0 t1.b0 t2.b0 t3.b0
    ("$1", "lo01", "lo23", 0x7632),
    ("$2", "hi01", "hi23", 0x5410),
    ("$3", "hi01", "hi23", 0x7632),
)


def transpose_asm() -> str:
    """The PTX of `byte_transpose` on the GPU; "" under the interpreter."""
    if interpreting():
        return ""
    body = " ".join(f"prmt.b32 {d}, {a}, {b}, {c:#06x};" for d, a, b, c in TRANSPOSE_STEPS)
    return "{ .reg .b32 lo01, hi01, lo23, hi23; " + body + " }"


def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode) on Python ints of 32 bits: byte i of the result is byte
    (selector >> 4i) & 7 of the pair {b, a}, replicated sign bit where bit 3 of that nibble
    is set."""
    pair = (b << 32) | a
    out = 0
    for i in range(4):
        nib = (selector >> (4 * i)) & 0xF
        byte = (pair >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def prmt_transpose(words: tuple[int, int, int, int]) -> tuple[int, ...]:
    """`TRANSPOSE_STEPS` run in Python on 4 unsigned 32-bit words (the GPU path's result)."""
    regs = {f"${4 + t}": w for t, w in enumerate(words)}
    for d, a, b, c in TRANSPOSE_STEPS:
        regs[d] = prmt(regs[a], regs[b], c)
    return tuple(regs[f"${j}"] for j in range(4))


@triton.jit
def byte_of(word, b: tl.constexpr, SIGNED: tl.constexpr):
    """Byte b of int32 words as an int32 value: two's complement (SIGNED) or unsigned."""
    if SIGNED:
        val = (word << (24 - 8 * b)) >> 24
    else:
        val = (word >> (8 * b)) & 0xFF
    return val


@triton.jit
def dot4(a_word, w_word, acc, A_SIGNED: tl.constexpr, W_SIGNED: tl.constexpr,
         DP4A: tl.constexpr):
    """acc + the dot product of the 4 bytes of a_word and w_word (int32 tensors, broadcast),
    each byte signed or unsigned as its flag says: the one dp4a instruction DP4A on the GPU
    (`dp4a_asm`), the same sum byte by byte where DP4A is "" (the interpreter)."""
    if DP4A != "":
        out = tl.inline_asm_elementwise(DP4A, "=r,r,r,r", [a_word, w_word, acc],
                                        dtype=tl.int32, is_pure=True, pack=1)
    else:
        out = acc
        for b in tl.static_range(4):
            out += byte_of(a_word, b, A_SIGNED) * byte_of(w_word, b, W_SIGNED)
    return out


def dp4a_asm(a_signed: bool, w_signed: bool) -> str:
    """The PTX of `dot4` on the GPU: dp4a with each operand's bytes signed or unsigned; ""
    under the interpreter, which runs no PTX."""
    if interpreting():
        return ""
    kinds = tuple("s32" if signed else "u32" for signed in (a_signed, w_signed))
    return f"dp4a.{kinds[0]}.{kinds[1]} $0, $1, $2, $3;"


@triton.jit
def byte_transpose(w0, w1, w2, w3, TRANSPOSE: tl.constexpr):
    """(o0, o1, o2, o3): byte t of o_j is byte j of w_t (int32 tensors of one shape): the 8
    prmt of TRANSPOSE on the GPU (`transpose_asm`), shifts and masks where it is ""."""
    if TRANSPOSE != "":
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            TRANSPOSE, "=r,=r,=r,=r,r,r,r,r", [w0, w1, w2, w3],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        o0 = (w0 & 0xFF) | ((w1 & 0xFF) << 8) | ((w2 & 0xFF) << 16) | (w3 << 24)
        o1 = ((w0 >> 8) & 0xFF) | (w1 & 0xFF00) | (((w2 >> 8) & 0xFF) << 16) \
            | (((w3 >> 8) & 0xFF) << 24)
        o2 = ((w0 >> 16) & 0xFF) | (((w1 >> 16) & 0xFF) << 8) | (w2 & 0xFF0000) \
            | (((w3 >> 16) & 0xFF) << 24)
        o3 = ((w0 >> 24) & 0xFF) | (((w1 >> 24) & 0xFF) << 8) | (((w2 >> 24) & 0xFF) << 16) \
            | (w3 & -16777216)
    return o0, o1, o2, o3


@triton.jit
def tap_words(words, tap, base, ih0, iw0, m_mask, u, H, W, x_words, C4,
              S: tl.constexpr, VEC: tl.constexpr):
    """int32 words [BLOCK_PIX, len(u)] of filter tap `tap` = r * S + s: word u (channels
    4u..4u+3) of each pixel's input at (ih0 + r, iw0 + s), at base + (r W + s) x_words (base:
    the words' pointers at (ih0, iw0), computed once; x_words: the row stride in words), 0 in
    the padding and at words >= C4 (VEC: a power of two dividing x_words and C4). One
    unsigned compare a coordinate: a negative one wraps past H or W."""
    r = tap // S
    s = tap % S
    ih = (ih0 + r).to(tl.uint32, bitcast=True)
    iw = (iw0 + s).to(tl.uint32, bitcast=True)
    pix = m_mask & (ih < H.to(tl.uint32, bitcast=True)) & (iw < W.to(tl.uint32, bitcast=True))
    in_row = u < C4
    if VEC > 1:
        in_row = tl.max_constancy(in_row, VEC)
    return tl.load(base + (r * W + s) * x_words, mask=pix[:, None] & in_row[None, :], other=0)


@triton.jit
def tap_group(words, w_words, g, acc0, acc1, acc2, acc3, base, ih0, iw0, m_mask, u, H, W,
              x_words, C4, W4, S: tl.constexpr, VEC: tl.constexpr, A_SIGNED: tl.constexpr,
              W_SIGNED: tl.constexpr, DP4A: tl.constexpr, TRANSPOSE: tl.constexpr):
    """The four accumulators plus taps 4g..4g+3: their words transposed to each channel's
    4 tap bytes, one dp4a a channel with its packed weights (rows 4g + j of
    `tap_group_words`)."""
    a0 = tap_words(words, 4 * g, base, ih0, iw0, m_mask, u, H, W, x_words, C4, S, VEC)
    a1 = tap_words(words, 4 * g + 1, base, ih0, iw0, m_mask, u, H, W, x_words, C4, S, VEC)
    a2 = tap_words(words, 4 * g + 2, base, ih0, iw0, m_mask, u, H, W, x_words, C4, S, VEC)
    a3 = tap_words(words, 4 * g + 3, base, ih0, iw0, m_mask, u, H, W, x_words, C4, S, VEC)
    o0, o1, o2, o3 = byte_transpose(a0, a1, a2, a3, TRANSPOSE)
    row = w_words + 4 * g * W4 + u
    acc0 = dot4(o0, tl.load(row)[None, :], acc0, A_SIGNED, W_SIGNED, DP4A)
    acc1 = dot4(o1, tl.load(row + W4)[None, :], acc1, A_SIGNED, W_SIGNED, DP4A)
    acc2 = dot4(o2, tl.load(row + 2 * W4)[None, :], acc2, A_SIGNED, W_SIGNED, DP4A)
    acc3 = dot4(o3, tl.load(row + 3 * W4)[None, :], acc3, A_SIGNED, W_SIGNED, DP4A)
    return acc0, acc1, acc2, acc3


@triton.jit
def tap_group_sum(x_ptr, w_ptr, n_img, ih0, iw0, m_mask, pid_c, H, W, C, x_row, w_row,
                  R: tl.constexpr, S: tl.constexpr, ALIGN_X: tl.constexpr,
                  PIPELINED: tl.constexpr, TAP_STAGES: tl.constexpr, A_SIGNED: tl.constexpr,
                  W_SIGNED: tl.constexpr, DP4A: tl.constexpr, TRANSPOSE: tl.constexpr,
                  BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr):
    """int32 [BLOCK_PIX, BLOCK_C]: the sum over the R*S taps of channels c0 + [0, BLOCK_C)
    (module doc): one-byte activations, C a multiple of 4, x_row a multiple of ALIGN_X >= 4,
    w_ptr the int32 `tap_group_words` (rows of w_row / 4 words). PIPELINED: the groups of 4
    taps in a loop software-pipelined TAP_STAGES deep, else unrolled."""
    BC4: tl.constexpr = BLOCK_C // 4
    GROUPS: tl.constexpr = R * S // 4
    VEC: tl.constexpr = ALIGN_X // 4
    words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    u = pid_c * BC4 + tl.arange(0, BC4)
    x_words = x_row // 4
    C4 = C // 4
    W4 = w_row // 4
    row = ((n_img * H + ih0) * W + iw0) * x_words
    if VEC > 1:
        row = tl.multiple_of(row, VEC)
    base = words + row[:, None] + u[None, :]
    acc0 = tl.zeros((BLOCK_PIX, BC4), dtype=tl.int32)
    acc1 = tl.zeros((BLOCK_PIX, BC4), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_PIX, BC4), dtype=tl.int32)
    acc3 = tl.zeros((BLOCK_PIX, BC4), dtype=tl.int32)
    if PIPELINED:
        for g in tl.range(0, GROUPS, num_stages=TAP_STAGES):
            acc0, acc1, acc2, acc3 = tap_group(
                words, w_ptr, g, acc0, acc1, acc2, acc3, base, ih0, iw0, m_mask, u, H, W,
                x_words, C4, W4, S, VEC, A_SIGNED, W_SIGNED, DP4A, TRANSPOSE)
    else:
        for g in tl.static_range(GROUPS):
            acc0, acc1, acc2, acc3 = tap_group(
                words, w_ptr, g, acc0, acc1, acc2, acc3, base, ih0, iw0, m_mask, u, H, W,
                x_words, C4, W4, S, VEC, A_SIGNED, W_SIGNED, DP4A, TRANSPOSE)
    for t in tl.static_range(R * S - 4 * GROUPS):  # one tap: its word, one weight byte a row
        a = tap_words(words, 4 * GROUPS + t, base, ih0, iw0, m_mask, u, H, W, x_words, C4, S,
                      VEC)
        row = w_ptr + 4 * (GROUPS + t) * W4 + u
        acc0 = dot4(a, tl.load(row)[None, :], acc0, A_SIGNED, W_SIGNED, DP4A)
        acc1 = dot4(a, tl.load(row + W4)[None, :], acc1, A_SIGNED, W_SIGNED, DP4A)
        acc2 = dot4(a, tl.load(row + 2 * W4)[None, :], acc2, A_SIGNED, W_SIGNED, DP4A)
        acc3 = dot4(a, tl.load(row + 3 * W4)[None, :], acc3, A_SIGNED, W_SIGNED, DP4A)
    # [p, u, i, k] = acc_{2i + k}: flattened, column 4u + j holds channel 4u + j
    return tl.reshape(tl.join(tl.join(acc0, acc2), tl.join(acc1, acc3)), (BLOCK_PIX, BLOCK_C))


@triton.jit
def channel_tile(ptr, row_off, c0, byte0, c_end, byte_end, pix_mask,
                 SRC: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr, VEC: tl.constexpr,
                 BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr):
    """int32 values [BLOCK_PIX, BLOCK_C] of channels c0 + [0, BLOCK_C) of the rows starting at
    row_off (storage elements), 0 where pix_mask is false and at channels >= c_end. PACKED rows
    (SRC_PACKED; c0 a multiple of 8 // BITS, byte0 = c0 * BITS / 8) are loaded as
    BLOCK_C * BITS / 8 bytes a row from byte0, those below byte_end (the bytes of channels
    < c_end), and split in registers: only the packed bytes cross DRAM, as wide vectors where
    the compiler knows byte0 and byte_end as multiples (pass products of constants, not
    quotients). VEC: a power of two dividing row_off and, in storage elements, both ends of
    the loaded run (c0 and c_end, or byte0 and byte_end): the in-row mask is constant over
    aligned runs of VEC, so loads stay VEC wide where the end is a run-time value."""
    chan = c0 + tl.arange(0, BLOCK_C)
    mask = pix_mask[:, None] & (chan < c_end)[None, :]
    if SRC == 1:
        PER: tl.constexpr = 8 // BITS
        NB: tl.constexpr = BLOCK_C // PER
        byte = byte0 + tl.arange(0, NB)
        in_row = byte < byte_end
        if VEC > 1:
            in_row = tl.max_constancy(in_row, VEC)
        raw = tl.load(ptr + row_off[:, None] + byte[None, :],
                      mask=pix_mask[:, None] & in_row[None, :], other=0)
        shift = tl.arange(0, PER) * BITS
        pat = (raw.to(tl.int32)[:, :, None] >> shift[None, None, :]) & ((1 << BITS) - 1)
        val = decode_values(tl.reshape(pat, (BLOCK_PIX, BLOCK_C)), BITS, ENC)
        val = tl.where(mask, val, 0)
    else:
        in_row = chan < c_end
        if VEC > 1:
            in_row = tl.max_constancy(in_row, VEC)
        val = tl.load(ptr + row_off[:, None] + chan[None, :],
                      mask=pix_mask[:, None] & in_row[None, :], other=0).to(tl.int32)
    return val


@triton.jit
def channel_gather(ptr, row_off, chan, mask, SRC: tl.constexpr, BITS: tl.constexpr,
                   ENC: tl.constexpr):
    """int32 values [rows, len(chan)] of channel chan[j] of the rows starting at row_off
    (storage elements), 0 where mask is false: lanes may repeat a channel (a group's input
    read by each of its filters; the repeats share the load's sectors). PACKED rows
    (SRC_PACKED): the byte holding the channel, split in registers."""
    if SRC == 1:
        PER: tl.constexpr = 8 // BITS
        raw = tl.load(ptr + row_off[:, None] + (chan // PER)[None, :], mask=mask, other=0)
        pat = (raw.to(tl.int32) >> ((chan % PER) * BITS)[None, :]) & ((1 << BITS) - 1)
        val = tl.where(mask, decode_values(pat, BITS, ENC), 0)
    else:
        val = tl.load(ptr + row_off[:, None] + chan[None, :], mask=mask, other=0).to(tl.int32)
    return val


@triton.jit
def tap_product(x_ptr, w_ptr, tap, n_img, ih0, iw0, m_mask, pid_c, H, W, C, x_row, w_row,
                S: tl.constexpr, A_SRC: tl.constexpr, A_BITS: tl.constexpr,
                A_ENC: tl.constexpr, ALIGN_X: tl.constexpr, MAC_FP32: tl.constexpr,
                GROUP_C: tl.constexpr, GROUP_K: tl.constexpr, GROUP_WORDS: tl.constexpr,
                W_SIGNED: tl.constexpr, DP4A: tl.constexpr,
                BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr):
    """[BLOCK_PIX, BLOCK_C]: filter tap `tap` = r * S + s of output channels c0 + [0, BLOCK_C)
    (C of them), int32, or float32 with MAC_FP32 (integers, exact while the layer's |sum| <
    2^24). Depthwise (GROUP_C = GROUP_K = 1): the input tile of those channels times the tap's
    weight of each (`tap_major_weights`: channel c's at tap * w_row + c). Grouped: output
    channel k reads the GROUP_C input channels (k // GROUP_K) GROUP_C + j of its group, one
    gathered tile per j, times its weight at (tap GROUP_C + j) w_row + k."""
    ih = ih0 + tap // S
    iw = iw0 + tap % S
    pix = m_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    row_off = ((n_img * H + ih) * W + iw) * x_row
    if ALIGN_X > 1:
        row_off = tl.multiple_of(row_off, ALIGN_X)
    c0 = pid_c * BLOCK_C
    if GROUP_C * GROUP_K == 1:
        a = channel_tile(x_ptr, row_off, c0, pid_c * (BLOCK_C * A_BITS // 8), C, x_row, pix,
                         A_SRC, A_BITS, A_ENC, ALIGN_X, BLOCK_PIX, BLOCK_C)
        wv = tl.load(w_ptr + tap * w_row + c0 + tl.arange(0, BLOCK_C))  # zeros past C
        if MAC_FP32:
            prod = a.to(tl.float32) * wv.to(tl.float32)[None, :]
        else:
            prod = a * wv.to(tl.int32)[None, :]
    else:
        k = c0 + tl.arange(0, BLOCK_C)
        mask = pix[:, None] & (k < C)[None, :]
        first = (k // GROUP_K) * GROUP_C
        if MAC_FP32:
            prod = tl.zeros((BLOCK_PIX, BLOCK_C), dtype=tl.float32)
        else:
            prod = tl.zeros((BLOCK_PIX, BLOCK_C), dtype=tl.int32)
        if GROUP_WORDS:
            # one-byte values, groups of 4n channels on 4-byte boundaries: a group's inputs
            # are n int32 words, and each filter's weights of a tap the same n words
            # (`tap_major_weights`): one 4-way dot product (dp4a) a word pair
            words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
            word_row = tl.multiple_of(row_off // 4, ALIGN_X // 4) if ALIGN_X >= 4 \
                else row_off // 4
            for u in tl.static_range(GROUP_C // 4):
                word = tl.load(words + word_row[:, None] + (first // 4 + u)[None, :],
                               mask=mask, other=0)
                w_word = tl.load(w_ptr + (tap * (GROUP_C // 4) + u) * w_row + k)
                prod = dot4(word, w_word[None, :], prod, A_ENC != 0, W_SIGNED, DP4A)
        else:
            for j in tl.static_range(GROUP_C):
                a = channel_gather(x_ptr, row_off, first + j, mask, A_SRC, A_BITS, A_ENC)
                wv = tl.load(w_ptr + (tap * GROUP_C + j) * w_row + k)  # zeros past C
                if MAC_FP32:
                    prod += a.to(tl.float32) * wv.to(tl.float32)[None, :]
                else:
                    prod += a * wv.to(tl.int32)[None, :]
    return prod


def tap_group_rows(taps: int) -> int:
    """Rows of `tap_group_words` for a filter of `taps` taps: 4 a group of 4 taps and 4 a tap
    past the last group."""
    return 4 * (taps // 4 + taps % 4)


def tap_group_words(values: torch.Tensor, w_row: int) -> torch.Tensor:
    """The depthwise weights `values` [C, taps] (one byte each: int8, uint8 for u8) as int32
    words [`tap_group_rows`(taps), w_row / 4] (zeros past C; w_row a multiple of 16 >= C):
    row 4g + j, column u holds channel 4u + j's weights of taps 4g..4g+3 in bytes 0..3; each
    tap 4G + t past the last full group G has rows 4(G + t) + j, word u holding channel
    4u + j's weight of that tap in byte j, zeros in the other bytes (`tap_group_sum`)."""
    c, taps = values.shape
    groups, rest = divmod(taps, 4)
    padded = torch.zeros((w_row, taps), dtype=values.dtype, device=values.device)
    padded[:c] = values
    chans = padded.reshape(w_row // 4, 4, taps)  # [u, j, tap]
    out = torch.zeros((groups + rest, 4, w_row // 4, 4), dtype=values.dtype,
                      device=values.device)  # [row group, j, u, byte]
    out[:groups] = chans[:, :, :4 * groups].reshape(w_row // 4, 4, groups, 4).permute(2, 1, 0, 3)
    for t in range(rest):
        for j in range(4):
            out[groups + t, j, :, j] = chans[:, j, 4 * groups + t]
    # little-endian: byte b of a word is bits 8b..8b+7
    return out.reshape(-1, 4).contiguous().view(torch.int32).reshape(-1, w_row // 4)


def tap_groups_reason(wl: ConvWorkload) -> str | None:
    """Why MAC="dp4a" (`tap_group_sum`) cannot run `wl` (None: it can)."""
    if not wl.depthwise:
        return ("MAC='dp4a' sums a depthwise filter's taps; grouped convs take MAC int32 (a "
                "group's 4n channels already go through dp4a)")
    if wl.a_layout is not Layout.INT8:
        return (f"MAC='dp4a' needs one activation a byte (INT8 layout), got "
                f"{wl.a_layout.value} activations: MAC int32 or fp32")
    if wl.C % 4:
        return f"MAC='dp4a' loads 4 channels an int32 word: C={wl.C} is not a multiple of 4"
    if wl.R * wl.S < 4:
        return f"MAC='dp4a' groups taps by 4: R*S={wl.R * wl.S} < 4"
    return None


__all__ = ["TRANSPOSE_STEPS", "byte_of", "byte_transpose", "channel_gather", "channel_tile",
           "dot4", "dp4a_asm", "prmt", "prmt_transpose", "tap_group_rows", "tap_group_sum",
           "tap_group_words", "tap_groups_reason", "tap_product", "transpose_asm"]
