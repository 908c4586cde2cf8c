"""Bit packing: bit planes (APNN-TC channel-major layout) and dense sub-byte packing.

Both pack along the innermost dimension (channels C for NHWC/KRSC tensors, K for GEMM operands).
Each element is first mapped to its b-bit pattern: unsigned values as they are, signed values as
two's complement, binary -1/+1 as bit 0/1. See `lowbit.core.layout` for the storage formats.
"""

from __future__ import annotations

import torch

from ..core import PACKABLE_BITS, Encoding, Layout, Precision
from ..core.validate import storage_dtype

WORD_BITS = 32


def _check_int_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension")
    return t


def to_pattern(values: torch.Tensor, prec: Precision) -> torch.Tensor:
    """int64 bit patterns in [0, 2^bits) of integer `values`; ValueError if out of range."""
    v = _check_int_tensor("values", values).to(torch.int64)
    if v.numel():
        lo, hi = int(v.min()), int(v.max())
        if prec.encoding is Encoding.BINARY:
            if not bool(((v == 1) | (v == -1)).all()):
                raise ValueError("values must be -1 or +1 for the binary encoding")
        elif lo < prec.qmin or hi > prec.qmax:
            raise ValueError(f"values must lie in [{prec.qmin}, {prec.qmax}] for {prec}, "
                             f"got [{lo}, {hi}]")
    if prec.encoding is Encoding.BINARY:
        return (v > 0).to(torch.int64)
    return v & ((1 << prec.bits) - 1)


def from_pattern(pattern: torch.Tensor, prec: Precision) -> torch.Tensor:
    """Inverse of `to_pattern`: int64 values."""
    p = pattern.to(torch.int64)
    if prec.encoding is Encoding.BINARY:
        return 2 * p - 1
    if prec.encoding is Encoding.SIGNED:
        return p - ((p >> (prec.bits - 1)) & 1) * (1 << prec.bits)
    return p


def _pad_last(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = (-t.shape[-1]) % multiple
    if extra == 0:
        return t
    return torch.nn.functional.pad(t, (0, extra))


def _as_int32_bits(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) -> int32 with the same bit pattern."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def to_bitplanes(values: torch.Tensor, prec: Precision) -> torch.Tensor:
    """[*outer, C] integers -> [bits, *outer, ceil(C/32)] int32 bit planes (padding bits 0)."""
    pat = _pad_last(to_pattern(values, prec), WORD_BITS)
    pat = pat.reshape(*pat.shape[:-1], -1, WORD_BITS)
    lane = torch.arange(WORD_BITS, device=pat.device, dtype=torch.int64)
    planes = [(((pat >> i) & 1) << lane).sum(-1) for i in range(prec.bits)]
    return _as_int32_bits(torch.stack(planes))


def bitplane_bits(planes: torch.Tensor, channels: int) -> torch.Tensor:
    """[bits, *outer, words] int32 -> [bits, *outer, channels] int64 in {0, 1}."""
    w = planes.to(torch.int64) & 0xFFFFFFFF
    lane = torch.arange(WORD_BITS, device=w.device, dtype=torch.int64)
    bits = (w.unsqueeze(-1) >> lane) & 1
    return bits.reshape(*bits.shape[:-2], -1)[..., :channels]


def from_bitplanes(planes: torch.Tensor, prec: Precision, channels: int) -> torch.Tensor:
    """Inverse of `to_bitplanes`: int64 values [*outer, channels]."""
    _check_int_tensor("planes", planes)
    if planes.dtype != torch.int32 or planes.shape[0] != prec.bits:
        raise ValueError(f"planes must be int32 with {prec.bits} planes in dim 0, "
                         f"got {planes.dtype} {tuple(planes.shape)}")
    if planes.shape[-1] * WORD_BITS < channels:
        raise ValueError(f"planes hold {planes.shape[-1] * WORD_BITS} channels < {channels}")
    bits = bitplane_bits(planes, channels)
    weights = (1 << torch.arange(prec.bits, device=bits.device, dtype=torch.int64))
    pat = (bits * weights.view(-1, *([1] * (bits.dim() - 1)))).sum(0)
    return from_pattern(pat, prec)


def pack_dense(values: torch.Tensor, prec: Precision) -> torch.Tensor:
    """[*outer, C] -> [*outer, ceil(C*bits/8)] uint8, 8//bits elements per byte, LSB first."""
    if prec.bits not in PACKABLE_BITS:
        raise ValueError(f"dense packing needs bits in {PACKABLE_BITS}, got {prec.bits}")
    per = 8 // prec.bits
    pat = _pad_last(to_pattern(values, prec), per)
    pat = pat.reshape(*pat.shape[:-1], -1, per)
    shift = torch.arange(per, device=pat.device, dtype=torch.int64) * prec.bits
    return (pat << shift).sum(-1).to(torch.uint8)


def unpack_dense(packed: torch.Tensor, prec: Precision, channels: int) -> torch.Tensor:
    """Inverse of `pack_dense`: int64 values [*outer, channels]."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    if prec.bits not in PACKABLE_BITS:
        raise ValueError(f"dense packing needs bits in {PACKABLE_BITS}, got {prec.bits}")
    per = 8 // prec.bits
    if packed.shape[-1] * per < channels:
        raise ValueError(f"packed holds {packed.shape[-1] * per} elements < {channels}")
    shift = torch.arange(per, device=packed.device, dtype=torch.int64) * prec.bits
    pat = (packed.to(torch.int64).unsqueeze(-1) >> shift) & ((1 << prec.bits) - 1)
    return from_pattern(pat.reshape(*pat.shape[:-2], -1)[..., :channels], prec)


def pack(values: torch.Tensor, prec: Precision, layout: Layout) -> torch.Tensor:
    """Integer values [*outer, C] -> storage tensor in `layout`."""
    layout = Layout(layout)
    if layout is Layout.BITPLANE:
        return to_bitplanes(values, prec)
    if layout is Layout.PACKED:
        return pack_dense(values, prec)
    to_pattern(values, prec)  # range check
    return values.to(storage_dtype(prec, Layout.INT8)).contiguous()


def unpack(storage: torch.Tensor, prec: Precision, layout: Layout,
           channels: int) -> torch.Tensor:
    """Storage tensor in `layout` -> int64 values [*outer, channels]."""
    layout = Layout(layout)
    if layout is Layout.BITPLANE:
        return from_bitplanes(storage, prec, channels)
    if layout is Layout.PACKED:
        return unpack_dense(storage, prec, channels)
    if storage.shape[-1] != channels:
        raise ValueError(f"storage has {storage.shape[-1]} channels, expected {channels}")
    return storage.to(torch.int64)
