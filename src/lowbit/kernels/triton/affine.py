"""The Triton kernel of the plan's ChannelAffine step (an eval BatchNorm between quantized
tensors), bit-exact against `lowbit.reference.affine.channel_affine_int` (the formula there):

  out[..., off_i + c] = clamp(floor((x_i[..., c] m[off_i + c] + b[off_i + c]
                                     + 2^(s-1)) / 2^s), lo, qmax)

for each part x_i of the channel concatenation (off_i: its first channel), in int64. One
launch for the whole step, however many parts (no concatenation is copied): the parts'
channels are cut into tiles of BLOCK_C channels, none spanning two parts, and a table on
the device holds per tile its part's base address (int64, cast in the kernel to a pointer
of the part's storage type), storage strides, channels and offset in out, the tile's first
channel and the part's kind; the grid is (pixel blocks, tiles). A kind is a part's storage
(layout, bits, encoding, element type): parts are INT8 (narrow, uint8 / int8, or wide,
int16 / int32) or BITPLANE, the step's distinct kinds a compile-time tuple the kernel
branches over per tile (one kind: no branch). Where every part's storage is 16-byte aligned
and a power of two divides every part's channels, offset and row (DenseNet's: 16), the
kernel is told so (ALIGN) and loads and stores vectors. The output is any precision but binary, in
INT8 or BITPLANE layout (bit planes: every part but the last fills whole 32-channel words,
and BLOCK_C divides them, so no two tiles write one word). `bind_channel_affine` checks its
arguments (ValueError / TypeError naming the argument) and returns a `Launcher` holding the
parts' storage (the table points into it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core import Layout, PackedTensor
from ...reference.affine import affine_out_precision, channel_vectors, check_affine_sum
from .igemm import Launch, cdiv
from .stored import (
    ENC,
    Launcher,
    check_packed,
    layout_code,
    load_values,
    requant_round,
    storage_strides,
    store_values,
    value_bound,
)

#: the kernel's element type code of each part storage dtype (`part_pointer`)
ELEMENT_CODE = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3}
#: int64 fields per tile of the table: address, row, plane, channels, offset in out, first
#: channel, kind, and one unused (rows 64 bytes apart)
TILE_FIELDS: tl.constexpr = tl.constexpr(8)
#: channel tiles the kernel may take (powers of two >= 32: whole words of bit planes)
CHANNEL_TILES = (32, 64, 128)
#: the most tiles one launch takes (the grid's second dimension)
MAX_TILES = 65535


@triton.jit
def part_pointer(addr, ELEMENT: tl.constexpr, ALIGNED: tl.constexpr):
    """The int64 address `addr` as a pointer to the part's elements (ELEMENT_CODE); ALIGNED:
    the address is a multiple of 16."""
    if ELEMENT == 0:
        p = addr.to(tl.pointer_type(tl.uint8))
    elif ELEMENT == 1:
        p = addr.to(tl.pointer_type(tl.int8))
    elif ELEMENT == 2:
        p = addr.to(tl.pointer_type(tl.int16))
    else:
        p = addr.to(tl.pointer_type(tl.int32))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def load_part(addr, pix, pix_mask, c0, C, row, plane, KINDS: tl.constexpr, J: tl.constexpr,
              ALIGNED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """`load_values` of a part of kind KINDS[J] (layout, bits, encoding, element) at address
    addr (the whole tuple and an index: Triton 3.6 cannot pass a tuple's element on)."""
    LAYOUT: tl.constexpr = KINDS[J][0]
    BITS: tl.constexpr = KINDS[J][1]
    ENC: tl.constexpr = KINDS[J][2]
    ELEMENT: tl.constexpr = KINDS[J][3]
    return load_values(part_pointer(addr, ELEMENT, ALIGNED), pix, pix_mask, c0, C, row, plane,
                       LAYOUT, BITS, ENC, BLOCK_P, BLOCK_C)


@triton.jit
def affine_kernel(
    table_ptr, m_ptr, b_ptr, s_ptr, out_ptr, NHW, o_row, o_plane,
    KINDS: tl.constexpr, ALIGN: tl.constexpr, O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr,
    O_ENC: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Tile program_id(1) of the table (module docstring) at pixel block program_id(0).
    KINDS: ((layout, bits, encoding, element), ...) of the parts; ALIGN: a power of two
    dividing every part's channels, offset and row (> 1: their addresses are 16-byte
    aligned too), so loads and stores may be vectors."""
    tile = table_ptr + tl.program_id(1) * TILE_FIELDS
    addr = tl.load(tile)
    x_row = tl.load(tile + 1)
    x_plane = tl.load(tile + 2)
    C = tl.load(tile + 3)
    C_OFF = tl.load(tile + 4)
    c0 = tl.load(tile + 5)
    kind = tl.load(tile + 6)
    if ALIGN > 1:
        x_row = tl.multiple_of(x_row, ALIGN)
        C = tl.multiple_of(C, ALIGN)
        C_OFF = tl.multiple_of(C_OFF, ALIGN)
        c0 = tl.multiple_of(c0, BLOCK_C)
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    chan = c0 + tl.arange(0, BLOCK_C)
    pix_mask = pix < NHW
    c_mask = chan < C
    x = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
    for j in tl.static_range(len(KINDS)):
        if len(KINDS) == 1:
            x = load_part(addr, pix, pix_mask, c0, C, x_row, x_plane, KINDS, j, ALIGN > 1,
                          BLOCK_P, BLOCK_C)
        elif kind == j:
            x = load_part(addr, pix, pix_mask, c0, C, x_row, x_plane, KINDS, j, ALIGN > 1,
                          BLOCK_P, BLOCK_C)
    m = tl.load(m_ptr + C_OFF + chan, mask=c_mask, other=0)
    b = tl.load(b_ptr + C_OFF + chan, mask=c_mask, other=0)
    s = tl.load(s_ptr + C_OFF + chan, mask=c_mask, other=1)
    z = x.to(tl.int64) * m[None, :] + b[None, :]
    q = requant_round(z, tl.broadcast_to(s[None, :], (BLOCK_P, BLOCK_C)))
    q = tl.minimum(tl.maximum(q, LO), HI).to(tl.int32)
    store_values(out_ptr, q, pix, pix_mask, C_OFF + c0, C_OFF + C, o_row, o_plane, O_LAYOUT,
                 O_BITS, O_ENC, BLOCK_P, BLOCK_C)


@dataclass(frozen=True, eq=False)
class TableLauncher(Launcher):
    """A Launcher whose launches read tensors through addresses in a table: `sources` keeps
    those tensors alive as long as the launcher."""

    sources: tuple[torch.Tensor, ...] = ()


def _kind(t: PackedTensor) -> tuple[int, int, int, int]:
    """(layout, bits as loaded, encoding, element type) of a stored part (module docstring)."""
    return (layout_code(t), min(t.precision.bits, 8), ENC[t.precision.encoding],
            ELEMENT_CODE[t.data.dtype])


def channel_block(widths: Sequence[int]) -> int:
    """The channel tile: of CHANNEL_TILES, the one padding the parts' channels least (the
    larger on a tie). Parts of whole 32-channel words (a bit-plane out's but the last) are
    then multiples of it: a larger tile pads none of them only if it divides them all, so no
    tile writes a word of the next part."""
    return min(CHANNEL_TILES, key=lambda t: (sum(cdiv(w, t) * t for w in widths), -t))


def _alignment(parts: Sequence[PackedTensor], widths: Sequence[int]) -> int:
    """The kernel's ALIGN: the largest power of two up to 16 dividing every part's channels,
    first channel in out and storage row, where every part's storage is 16-byte aligned;
    else 1."""
    if any(p.data.data_ptr() % 16 for p in parts):
        return 1
    rows = [storage_strides(p)[0] for p in parts]
    g = math.gcd(16, *widths, *itertools.accumulate(widths), *rows)
    return 1 << (g.bit_length() - 1)


def bind_channel_affine(parts: Sequence[PackedTensor], multiplier: torch.Tensor,
                        bias: torch.Tensor, shift: torch.Tensor, out: PackedTensor,
                        relu: bool = False) -> Launcher:
    """out = the affine requantization of the channel concatenation of `parts` (module
    docstring; a ChannelAffine step), one launch. parts: PackedTensors of out's shape but for
    their channels, INT8 (narrow or wide) or BITPLANE; multiplier / bias / shift: integer
    [sum of the parts' channels]; out: any precision but binary, INT8 or BITPLANE."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise TypeError("parts must be a non-empty list of PackedTensors")
    out = check_packed("out", out)
    prec = affine_out_precision("out.precision", out.precision)
    if not isinstance(relu, bool):
        raise TypeError(f"relu must be a bool, got {type(relu).__name__}")
    device = out.data.device
    parts = [check_packed(f"parts[{i}]", p, device=device) for i, p in enumerate(parts)]
    widths = [p.shape[-1] for p in parts]
    for i, p in enumerate(parts):
        if tuple(p.shape[:-1]) != tuple(out.shape[:-1]):
            raise ValueError(f"parts[{i}] must have out's shape but for its channels "
                             f"{tuple(out.shape[:-1])}, got {tuple(p.shape)}")
    if sum(widths) != out.shape[-1]:
        raise ValueError(f"the parts' channels {widths} must add up to out's {out.shape[-1]}")
    if out.layout is Layout.BITPLANE and any(w % 32 for w in widths[:-1]):
        raise ValueError(f"a bit-plane out needs every part but the last to fill whole "
                         f"32-channel words, got channels {widths}")
    m, b, s = channel_vectors(multiplier, bias, shift, out.shape[-1])
    check_affine_sum([value_bound(p.precision) for p, w in zip(parts, widths, strict=True)
                      for _ in range(w)], m, b, s)
    npix = math.prod(out.shape[:-1])
    block_c = channel_block(widths)
    kinds = sorted({_kind(p) for p, w in zip(parts, widths, strict=True) if w})
    rows = []
    for p, width, off in zip(parts, widths, itertools.accumulate([0, *widths]), strict=False):
        x_row, x_plane = storage_strides(p)
        rows += [[p.data.data_ptr(), x_row, x_plane, width, off, c0, kinds.index(_kind(p)),
                  0] for c0 in range(0, width, block_c)]
    if len(rows) > MAX_TILES:
        raise ValueError(f"the parts' channels {sum(widths)} make {len(rows)} tiles of "
                         f"{block_c}; one launch takes at most {MAX_TILES}")
    sources = tuple(p.data for p in parts)
    if not rows or npix == 0:
        return TableLauncher((), (out.data,), sources)
    table = torch.tensor(rows, dtype=torch.int64).to(device)
    m, b, s = (t.contiguous().to(device) for t in (m, b, s))
    o_row, o_plane = storage_strides(out)
    lo = max(prec.qmin, 0) if relu else prec.qmin
    block_p = max(16, 2048 // block_c)
    kwargs = dict(KINDS=tuple(kinds), ALIGN=_alignment(parts, widths),
                  O_LAYOUT=layout_code(out), O_BITS=min(prec.bits, 8), O_ENC=ENC[prec.encoding],
                  LO=int(lo), HI=int(prec.qmax), BLOCK_P=block_p, BLOCK_C=block_c,
                  num_warps=4)
    launch = Launch(affine_kernel, (cdiv(npix, block_p), len(rows)),
                    (table, m, b, s, out.data, npix, o_row, o_plane), kwargs)
    return TableLauncher((launch,), (out.data,), sources)
