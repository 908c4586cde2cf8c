"""The Triton kernel of the plan's ChannelAffine step (an eval BatchNorm between quantized
tensors), bit-exact against `lowbit.reference.affine.channel_affine_int` (the formula there):

  out[..., off_i + c] = clamp(floor((x_i[..., c] m[off_i + c] + b[off_i + c]
                                     + 2^(s-1)) / 2^s), lo, qmax)

for each part x_i of the channel concatenation (off_i: its first channel), in int64. One
launch per part; parts are INT8 (narrow or wide) or BITPLANE, the output any precision but
binary in INT8 or BITPLANE layout (bit planes: every part but the last fills whole 32-channel
words, so no two launches share a word). `bind_channel_affine` checks its arguments once
(ValueError / TypeError naming the argument) and returns a `Launcher`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...core import Layout, PackedTensor
from ...reference.affine import affine_out_precision, channel_vectors, check_affine_sum
from .igemm import Launch, cdiv
from .stored import (
    ENC,
    Launcher,
    channel_tile,
    check_packed,
    layout_code,
    load_values,
    requant_round,
    storage_strides,
    store_values,
    value_bound,
)


@triton.jit
def affine_kernel(
    x_ptr, m_ptr, b_ptr, s_ptr, out_ptr, NHW, C, C_OFF, x_row, x_plane, o_row, o_plane,
    X_LAYOUT: tl.constexpr, X_BITS: tl.constexpr, X_ENC: tl.constexpr,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    LO: tl.constexpr, HI: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """One part (C channels) of the concatenation into out's channels C_OFF .. C_OFF + C."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    chan = c0 + tl.arange(0, BLOCK_C)
    pix_mask = pix < NHW
    c_mask = chan < C
    x = load_values(x_ptr, pix, pix_mask, c0, C, x_row, x_plane, X_LAYOUT, X_BITS, X_ENC,
                    BLOCK_P, BLOCK_C)
    m = tl.load(m_ptr + C_OFF + chan, mask=c_mask, other=0)
    b = tl.load(b_ptr + C_OFF + chan, mask=c_mask, other=0)
    s = tl.load(s_ptr + C_OFF + chan, mask=c_mask, other=1)
    z = x.to(tl.int64) * m[None, :] + b[None, :]
    q = requant_round(z, tl.broadcast_to(s[None, :], (BLOCK_P, BLOCK_C)))
    q = tl.minimum(tl.maximum(q, LO), HI).to(tl.int32)
    store_values(out_ptr, q, pix, pix_mask, C_OFF + c0, C_OFF + C, o_row, o_plane, O_LAYOUT,
                 O_BITS, O_ENC, BLOCK_P, BLOCK_C)


def _codes(t: PackedTensor) -> tuple[int, int, int]:
    """(layout, bits as loaded / stored, encoding) constants of a stored tensor."""
    return layout_code(t), min(t.precision.bits, 8), ENC[t.precision.encoding]


def bind_channel_affine(parts: Sequence[PackedTensor], multiplier: torch.Tensor,
                        bias: torch.Tensor, shift: torch.Tensor, out: PackedTensor,
                        relu: bool = False) -> Launcher:
    """out = the affine requantization of the channel concatenation of `parts` (module
    docstring; a ChannelAffine step). parts: PackedTensors of out's shape but for their
    channels, INT8 (narrow or wide) or BITPLANE; multiplier / bias / shift: integer
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
    m, b, s = (t.contiguous().to(device) for t in (m, b, s))
    npix = math.prod(out.shape[:-1])
    o_layout, o_bits, o_enc = _codes(out)
    o_row, o_plane = storage_strides(out)
    lo = max(prec.qmin, 0) if relu else prec.qmin
    launches = []
    for p, width, off in zip(parts, widths, itertools.accumulate([0, *widths]), strict=False):
        if width == 0 or npix == 0:
            continue
        bc = channel_tile(width)
        bp = max(16, 2048 // bc)
        x_layout, x_bits, x_enc = _codes(p)
        x_row, x_plane = storage_strides(p)
        args = (p.data, m, b, s, out.data, npix, width, off, x_row, x_plane, o_row, o_plane)
        kwargs = dict(X_LAYOUT=x_layout, X_BITS=x_bits, X_ENC=x_enc, O_LAYOUT=o_layout,
                      O_BITS=o_bits, O_ENC=o_enc, LO=int(lo), HI=int(prec.qmax), BLOCK_P=bp,
                      BLOCK_C=bc, num_warps=4)
        launches.append(Launch(affine_kernel, (cdiv(npix, bp), cdiv(width, bc)), args, kwargs))
    return Launcher(tuple(launches), (out.data,))
