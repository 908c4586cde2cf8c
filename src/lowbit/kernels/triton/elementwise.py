"""Triton kernels of the plan's elementwise integer steps, bit-exact against
`lowbit.reference.netops` (formulas there) and `lowbit.graph.ir`:

- `bind_table_mul`: the product of two quantized tensors as a table of their values,
  out = table[(a - qmin_a) * n_b + (b - qmin_b)], `a` of b's shape or [N, 1, 1, C] (a
  channel scale broadcast over b's map: squeeze-excite); any layout in and out;
- `bind_lookup`: out = table[x - qmin] (another quantizer's reading of a value, a clamp, an
  activation of a quantized value);
- `bind_gather`: channels selected by index (a chunk, a split, a channel shuffle).

Tables sit on the device in the narrowest integer type holding the output's range
(`table_dtype`); each `bind_*` checks its arguments once (ValueError / TypeError naming the
argument) and returns a `Launcher`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor
from .igemm import Launch, cdiv
from .stored import (
    ENC,
    Launcher,
    channel_tile,
    check_packed,
    layout_code,
    load_values,
    storage_strides,
    store_values,
)

#: values of a table a kernel reads: 256 x 256 (two 8-bit operands)
MAX_TABLE = 1 << 16


def table_dtype(p: object) -> torch.dtype:
    """The device type of a table of values in precision p's range: one byte a value where
    it fits (a 256 x 256 table in 64 KB can stay in an SM's L1 through a kernel's random
    gathers; as int32 it took 256 KB, more than the L1), else int16, else int32."""
    lo, hi = int(p.qmin), int(p.qmax)
    for dtype in (torch.int8, torch.uint8, torch.int16):
        info = torch.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return dtype
    return torch.int32


@triton.jit
def table_kernel(
    a_ptr, b_ptr, t_ptr, idx_ptr, out_ptr, NHW, HW, C, a_row, a_plane, b_row, b_plane,
    o_row, o_plane,
    A_LAYOUT: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr, AMIN: tl.constexpr,
    B_LAYOUT: tl.constexpr, B_BITS: tl.constexpr, B_ENC: tl.constexpr, BMIN: tl.constexpr,
    NB: tl.constexpr, A_BCAST: tl.constexpr, HAS_B: tl.constexpr, GATHER: tl.constexpr,
    O_LAYOUT: tl.constexpr, O_BITS: tl.constexpr, O_ENC: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """out[p, c] = t[(a[p', c] - AMIN) * NB + (b[p, c] - BMIN)] (p' = p // HW with A_BCAST),
    t[a - AMIN] without b, a[p, idx[c]] with GATHER (a INT8 or wide)."""
    pix = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c0 = tl.program_id(1) * BLOCK_C
    chan = c0 + tl.arange(0, BLOCK_C)
    pix_mask = pix < NHW
    mask = pix_mask[:, None] & (chan < C)[None, :]
    if GATHER:
        src = tl.load(idx_ptr + chan, mask=chan < C, other=0)
        v = tl.load(a_ptr + pix[:, None] * a_row + src[None, :], mask=mask, other=0)
        v = v.to(tl.int32)
    else:
        a_pix = pix // HW if A_BCAST else pix
        a = load_values(a_ptr, a_pix, pix_mask, c0, C, a_row, a_plane, A_LAYOUT, A_BITS,
                        A_ENC, BLOCK_P, BLOCK_C)
        i = a - AMIN
        if HAS_B:
            b = load_values(b_ptr, pix, pix_mask, c0, C, b_row, b_plane, B_LAYOUT, B_BITS,
                            B_ENC, BLOCK_P, BLOCK_C)
            i = i * NB + (b - BMIN)
        v = tl.load(t_ptr + i, mask=mask, other=0).to(tl.int32)
    store_values(out_ptr, v, pix, pix_mask, c0, C, o_row, o_plane, O_LAYOUT, O_BITS, O_ENC,
                 BLOCK_P, BLOCK_C)


def _table(name: str, table: object, n: int, out: PackedTensor) -> torch.Tensor:
    if not isinstance(table, torch.Tensor) or table.dtype.is_floating_point or \
            table.dim() != 1:
        raise TypeError(f"{name} must be an integer vector, got {table!r:.80}")
    if table.numel() != n or n > MAX_TABLE:
        raise ValueError(f"{name} must have {n} entries (<= {MAX_TABLE}), got {table.numel()}")
    t = table.to(torch.int64).cpu()
    p = out.precision
    if int(t.min()) < p.qmin or int(t.max()) > p.qmax:
        raise ValueError(f"{name} values must lie in out's range [{p.qmin}, {p.qmax}]")
    return t.to(table_dtype(p)).contiguous().to(out.data.device)


def _operand(t: PackedTensor) -> dict:
    p = t.precision
    return {"LAYOUT": layout_code(t), "BITS": min(p.bits, 8),
            "ENC": ENC[p.encoding], "MIN": int(p.qmin)}


def _check_enc(name: str, t: PackedTensor) -> None:
    if t.precision.encoding is Encoding.BINARY:
        raise ValueError(f"{name} cannot be binary (-1/+1)")


def _launch(a: PackedTensor, b: PackedTensor | None, table: torch.Tensor | None,
            index: torch.Tensor | None, out: PackedTensor, bcast: bool) -> Launcher:
    c = out.shape[-1]
    npix = math.prod(out.shape[:-1])
    hw = npix // out.shape[0] if len(out.shape) == 4 else 1
    bc = channel_tile(c)
    bp = max(16, 2048 // bc)
    ka, kb, ko = _operand(a), _operand(b if b is not None else a), _operand(out)
    a_row, a_plane = storage_strides(a)
    b_row, b_plane = storage_strides(b) if b is not None else (0, 0)
    o_row, o_plane = storage_strides(out)
    placeholder = out.data
    args = (a.data, placeholder if b is None else b.data,
            placeholder if table is None else table, placeholder if index is None else index,
            out.data, npix, hw, c, a_row, a_plane, b_row, b_plane, o_row, o_plane)
    nb = 0 if b is None else b.precision.qmax - b.precision.qmin + 1
    kwargs = dict(A_LAYOUT=ka["LAYOUT"], A_BITS=ka["BITS"], A_ENC=ka["ENC"], AMIN=ka["MIN"],
                  B_LAYOUT=kb["LAYOUT"], B_BITS=kb["BITS"], B_ENC=kb["ENC"], BMIN=kb["MIN"],
                  NB=nb, A_BCAST=bool(bcast), HAS_B=b is not None, GATHER=index is not None,
                  O_LAYOUT=ko["LAYOUT"], O_BITS=ko["BITS"], O_ENC=ko["ENC"], BLOCK_P=bp,
                  BLOCK_C=bc, num_warps=4)
    grid = (cdiv(npix, bp), cdiv(c, bc))
    return Launcher((Launch(table_kernel, grid, args, kwargs),), (out.data,))


def bind_table_mul(a: PackedTensor, b: PackedTensor, table: torch.Tensor,
                   out: PackedTensor) -> Launcher:
    """out = table[(a - qmin_a) * n_b + (b - qmin_b)] (`reference.netops.table_mul_int`): a of
    b's logical shape or [N, 1, 1, C] with b [N, H, W, C]; a, b of <= 8 bits (not binary),
    any layout; out of b's shape in any layout, table values in its range."""
    b = check_packed("b", b)
    a = check_packed("a", a, device=b.data.device)
    out = check_packed("out", out, tuple(b.shape), b.data.device)
    for name, t in (("a", a), ("b", b)):
        _check_enc(name, t)
        if t.precision.bits > 8:
            raise ValueError(f"{name} must have at most 8 bits, got {t.precision}")
    bcast = tuple(a.shape) != tuple(b.shape)
    if bcast and not (len(b.shape) == 4 and tuple(a.shape) == (b.shape[0], 1, 1, b.shape[3])):
        raise ValueError(f"a must have b's shape {tuple(b.shape)} or [N, 1, 1, C], got "
                         f"{tuple(a.shape)}")
    n = (a.precision.qmax - a.precision.qmin + 1) * (b.precision.qmax - b.precision.qmin + 1)
    return _launch(a, b, _table("table", table, n, out), None, out, bcast)


def bind_lookup(x: PackedTensor, table: torch.Tensor, out: PackedTensor) -> Launcher:
    """out = table[x - qmin] (a Lookup step): x of <= 8 bits (not binary), any layout; out of
    x's shape in any layout."""
    x = check_packed("x", x)
    _check_enc("x", x)
    if x.precision.bits > 8:
        raise ValueError(f"x must have at most 8 bits, got {x.precision}")
    out = check_packed("out", out, tuple(x.shape), x.data.device)
    n = x.precision.qmax - x.precision.qmin + 1
    return _launch(x, None, _table("table", table, n, out), None, out, False)


def bind_gather(x: PackedTensor, index: torch.Tensor, out: PackedTensor) -> Launcher:
    """out[..., c] = x[..., index[c]] (a Gather step): x and out of one precision in layout
    INT8 (or wide)."""
    x = check_packed("x", x)
    out = check_packed("out", out, device=x.data.device)
    if str(out.precision) != str(x.precision) or x.layout is not Layout.INT8 or \
            out.layout is not Layout.INT8:
        raise ValueError("x and out must have one precision, in layout 'int8'")
    if tuple(out.shape[:-1]) != tuple(x.shape[:-1]):
        raise ValueError(f"out must have x's shape but for its channels, got {out.shape}")
    if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point or \
            tuple(index.shape) != (out.shape[-1],):
        raise ValueError(f"index must be an integer vector of {out.shape[-1]} channels")
    idx = index.to(torch.int64).cpu()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= x.shape[-1]):
        raise ValueError(f"index values must lie in [0, {x.shape[-1]})")
    return _launch(x, None, None, idx.to(torch.int32).to(x.data.device), out, False)
