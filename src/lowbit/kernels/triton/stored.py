"""Plumbing shared by the Triton kernels that read and write quantized tensors as stored
(`lowbit.core.PackedTensor`, INT8 or BITPLANE layout; `lowbit.core.layout`): device helpers
that load / store value tiles in either layout, the exact float32 quantizer, and the host side
of bound launches (`Launcher`, checks, strides).

Besides `lowbit.core.Precision` (<= 8 bits), a PackedTensor here may hold signed integers of
9 to 32 bits one per element in the INT8 layout ("wide": int16 storage up to 16 bits, else
int32): the engine's 16 / 24-bit residual realizations (`lowbit.core.WidePrecision`) and
int32 accumulators (`WidePrecision(32)`). Any object with `bits`, `encoding` (signed), `qmin`
and `qmax` serves as such a precision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor, Precision
from ...core.validate import storage_dtype, storage_shape
from .epilogue import LAYOUT_BITPLANE, LAYOUT_INT8, pack_store
from .igemm import Launch, cdiv, launch_or_compile
from .templates import interpreting

ENC = {Encoding.UNSIGNED: 0, Encoding.SIGNED: 1, Encoding.BINARY: 2}
LAYOUTS = (Layout.INT8, Layout.BITPLANE)


# =========================================================================== device helpers
@triton.jit
def load_values(ptr, pix, pix_mask, c0, C, row, plane,
                LAYOUT: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """int32 values [BLOCK_P, BLOCK_C] of pixels `pix` (storage rows) and channels
    c0 .. c0 + BLOCK_C of a stored tensor; masked elements read 0. INT8: `row` elements per
    pixel; BITPLANE: `row` words per pixel and plane, planes `plane` words apart, c0 a
    multiple of 32 (each word is loaded once and split into its 32 channels)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    mask = pix_mask[:, None] & (chan < C)[None, :]
    if LAYOUT == 0:
        v = tl.load(ptr + pix[:, None] * row + chan[None, :], mask=mask, other=0).to(tl.int32)
    else:
        NW: tl.constexpr = BLOCK_C // 32
        word = c0 // 32 + tl.arange(0, NW)
        wmask = pix_mask[:, None] & (word < row)[None, :]
        lane = tl.arange(0, 32)
        pat = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
        for i in tl.static_range(BITS):
            w = tl.load(ptr + i * plane + pix[:, None] * row + word[None, :], mask=wmask,
                        other=0)
            b = (w[:, :, None] >> lane[None, None, :]) & 1
            pat = pat | (tl.reshape(b, (BLOCK_P, BLOCK_C)) << i)
        if ENC == 2:
            v = 2 * pat - 1
        elif ENC == 1:
            v = pat - ((pat >> (BITS - 1)) & 1) * (1 << BITS)
        else:
            v = pat
        v = tl.where(mask, v, 0)
    return v


@triton.jit
def store_values(ptr, q, pix, pix_mask, c0, C, row, plane,
                 LAYOUT: tl.constexpr, BITS: tl.constexpr, ENC: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Store int32 values q [BLOCK_P, BLOCK_C] (in the precision's range) at pixels `pix`,
    channels c0 .. in the layout (BITPLANE: c0 a multiple of 32, padding channels' bits 0)."""
    chan = c0 + tl.arange(0, BLOCK_C)
    c_mask = chan < C
    if LAYOUT == 0:
        tl.store(ptr + pix[:, None] * row + chan[None, :], q.to(ptr.dtype.element_ty),
                 mask=pix_mask[:, None] & c_mask[None, :])
    else:
        if ENC == 2:
            pat = (q > 0).to(tl.int32)
        else:
            pat = q & ((1 << BITS) - 1)
        pat = tl.where(c_mask[None, :], pat, 0)
        pack_store(pat, pix, pix_mask, c0, ptr, row, plane, 2, BITS, BLOCK_P, BLOCK_C)


@triton.jit
def requant_round(z, sh):
    """clamp-free floor((z + 2^(sh-1)) / 2^sh) of int64 z (|z| + 2^61 < 2^63)."""
    return (z + (tl.full(sh.shape, 1, tl.int64) << (sh - 1))) >> sh


@triton.jit
def round_shift_terms(t0, t1, t2, sh):
    """floor((t0 + t1 + t2 + 2^(sh-1)) / 2^sh) of int64 terms, exact for any int64 terms and
    sh in 1..62 even where their sum leaves int64 (`lowbit.reference.netops.round_shift_sum`:
    the terms' multiples of 2^sh summed as they are, their low sh bits halved first)."""
    one = tl.full(sh.shape, 1, tl.int64)
    mask = (one << sh) - 1
    high = (t0 >> sh) + (t1 >> sh) + (t2 >> sh)
    l0 = t0 & mask
    l1 = t1 & mask
    l2 = t2 & mask
    odd_sum = (l0 & 1) + (l1 & 1) + (l2 & 1)
    half = (l0 >> 1) + (l1 >> 1) + (l2 >> 1) + (odd_sum >> 1)
    wide = (half + (one << tl.maximum(sh - 2, 0))) >> tl.maximum(sh - 1, 0)
    return high + tl.where(sh >= 2, wide, half + (odd_sum & 1))


@triton.jit
def quantize_f32(x, scale, ENC: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr):
    """int32 clamp(floor(x / scale + 0.5), QMIN, QMAX) of float32 x, IEEE-rounded division and
    add (as `lowbit.quant.quantize.quantize` on the CPU); binary: sign with 0 -> +1."""
    if ENC == 2:
        q = tl.where(x >= 0, 1, -1)
    else:
        v = tl.math.floor(tl.math.div_rn(x, scale) + 0.5)
        q = tl.minimum(tl.maximum(v, QMIN), QMAX).to(tl.int32)
    return q


@triton.jit
def flag_nonfinite(x, mask, status_ptr):
    """status[0] = 1 if any x (float32) under mask is inf or nan."""
    bad = mask & ((x != x) | (tl.abs(x) == float("inf")))
    if tl.max(bad.to(tl.int32)) > 0:
        tl.atomic_max(status_ptr, 1)


# =========================================================================== host side
def is_wide(prec: object) -> bool:
    """A precision wider than 8 bits (module docstring)."""
    return int(prec.bits) > 8


def stored_dtype(prec: object, layout: Layout) -> torch.dtype:
    """Storage dtype of a tensor of `prec` in `layout` (wide ones: int16 / int32)."""
    if is_wide(prec):
        return torch.int16 if prec.bits <= 16 else torch.int32
    return storage_dtype(prec, layout)


def stored_shape(shape: tuple[int, ...], prec: object, layout: Layout) -> tuple[int, ...]:
    """Storage shape of a tensor of logical `shape` (wide ones: the shape itself)."""
    if is_wide(prec):
        return tuple(shape)
    return storage_shape(tuple(shape), prec, layout)


def value_bound(prec: object) -> int:
    """max |value| of a precision."""
    return max(abs(int(prec.qmin)), abs(int(prec.qmax)))


@dataclass(frozen=True, eq=False)
class Launcher:
    """A bound op: `launcher()` replays its launches with every argument fixed and returns
    `outputs` (a tuple of the output storage tensors)."""

    launches: tuple[Launch, ...]
    outputs: tuple[torch.Tensor, ...]

    def __call__(self) -> tuple[torch.Tensor, ...]:
        for s in self.launches:
            launch_or_compile(s.fn, s.grid, s.args, s.kwargs, False)
        return self.outputs


def empty_packed(shape: Sequence[int], precision: Precision | str, layout: Layout | str,
                 device: torch.device | str) -> PackedTensor:
    """A new (uninitialized) PackedTensor of logical `shape` in `layout` (a wide precision:
    INT8 layout, module docstring)."""
    prec = Precision.parse(precision) if isinstance(precision, str) else precision
    layout = Layout(layout)
    shape = tuple(int(s) for s in shape)
    if is_wide(prec) and layout is not Layout.INT8:
        raise ValueError(f"a {prec} tensor is stored one value per element (layout 'int8'), "
                         f"got '{layout.value}'")
    data = torch.empty(stored_shape(shape, prec, layout), dtype=stored_dtype(prec, layout),
                       device=device)
    return PackedTensor(data, shape, prec, layout)


def check_device(name: str, t: torch.Tensor, device: torch.device | None = None) -> None:
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(f"{name} must be on a CUDA device for Triton kernels, got {t.device} "
                         "(set TRITON_INTERPRET=1 to run them on the CPU)")


def check_packed(name: str, t: object, shape: tuple[int, ...] | None = None,
                 device: torch.device | None = None) -> PackedTensor:
    """A PackedTensor in INT8 or BITPLANE layout whose data matches its shape, precision and
    layout (and `shape` / `device` where given)."""
    if not isinstance(t, PackedTensor):
        raise TypeError(f"{name} must be a lowbit.core.PackedTensor, got {type(t).__name__}")
    if t.layout not in LAYOUTS:
        raise ValueError(f"{name}.layout must be 'int8' or 'bitplane', got '{t.layout.value}'")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have logical shape {tuple(shape)}, got {t.shape}")
    if is_wide(t.precision) and (t.layout is not Layout.INT8 or
                                 t.precision.encoding is not Encoding.SIGNED):
        raise ValueError(f"{name}: a {t.precision} tensor must be signed in layout 'int8'")
    want_shape = stored_shape(t.shape, t.precision, t.layout)
    want_dtype = stored_dtype(t.precision, t.layout)
    d = t.data
    if d.dtype != want_dtype or tuple(d.shape) != want_shape or not d.is_contiguous():
        raise ValueError(f"{name}.data must be a contiguous {want_dtype} tensor of shape "
                         f"{want_shape} ({t.precision}, layout '{t.layout.value}', logical "
                         f"{t.shape}), got {d.dtype} {tuple(d.shape)}")
    check_device(f"{name}.data", d, device)
    return t


def storage_strides(t: PackedTensor) -> tuple[int, int]:
    """(row, plane): storage elements per pixel (INT8: C; BITPLANE: words), words per plane."""
    c = t.shape[-1]
    if t.layout is Layout.BITPLANE:
        words = cdiv(c, 32)
        return words, (t.data.numel() // t.precision.bits)
    return c, 0


def layout_code(t: PackedTensor) -> int:
    return LAYOUT_BITPLANE if t.layout is Layout.BITPLANE else LAYOUT_INT8


def int_channel_vector(name: str, v: object, k: int, lo: int, hi: int,
                    device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(v)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or an integer tensor, got {t.dtype}")
    t = t.to(torch.int64).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,):
        raise ValueError(f"{name} must be a scalar or a vector of length {k}, got shape "
                         f"{tuple(t.shape)}")
    if int(t.min()) < lo or int(t.max()) > hi:
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got [{int(t.min())}, "
                         f"{int(t.max())}]")
    return t.to(torch.int32).contiguous().to(device)


def float_channel_vector(name: str, v: object, k: int, device: torch.device) -> torch.Tensor:
    # a Python number straight to float64 (as_tensor would round it to float32 first)
    t = torch.as_tensor(0.0 if v is None else v,
                        dtype=None if isinstance(v, torch.Tensor) else torch.float64)
    t = t.to(torch.float64).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,) or not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be a finite scalar or vector of length {k}")
    return t.contiguous().to(device)


def channel_tile(k: int) -> int:
    """Channel tile: a power of two >= 32 (whole words for bit planes), at most 128."""
    return max(32, min(128, 1 << max(0, (k - 1).bit_length())))
