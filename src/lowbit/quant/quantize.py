"""Quantize / dequantize, scales from the maximum, fixed-point requantization, STE.

Conventions (Dao thesis, ch. 4, Eq. 4.3-4.5): real x ~ scale * (q - zero_point);
q = clamp(round_half_up(x / scale) + zero_point, qmin, qmax), round_half_up(v) = floor(v + 0.5).
Symmetric signed: scale = max|x| / qmax; unsigned (e.g. after ReLU): scale = max(x) / qmax;
binary (-1/+1): q = sign(x) (0 -> +1), scale = mean|x| (XNOR-Net's optimal scale).
Affine: scale = (max - min) / (2^b - 1), zero_point = round_half_up(-min / scale).
"""

from __future__ import annotations

import torch

from ..core import Encoding, Layout, Precision, WidePrecision
from ..core.validate import storage_dtype

_EPS = 1e-12


def round_half_up(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(x + 0.5)


def _reduce_dims(x: torch.Tensor, axis: int | None) -> list[int]:
    if axis is None:
        return list(range(x.dim()))
    axis = axis % x.dim()
    return [d for d in range(x.dim()) if d != axis]


def _broadcast(v: torch.Tensor, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """Per-channel vector along `axis` -> shape that broadcasts against x."""
    if axis is None or v.dim() == 0:
        return v
    shape = [1] * x.dim()
    shape[axis % x.dim()] = -1
    return v.reshape(shape)


def _check_float(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point torch.Tensor, got {got}")
    return x


def scale_from_max(x: torch.Tensor, prec: Precision, axis: int | None = None) -> torch.Tensor:
    """Scale mapping the observed range onto `prec` (per tensor, or per channel of `axis`)."""
    x = _check_float("x", x).detach()
    dims = _reduce_dims(x, axis)
    if prec.encoding is Encoding.BINARY:
        return x.abs().mean(dim=dims).clamp_min(_EPS)
    if prec.encoding is Encoding.UNSIGNED:
        m = x.clamp_min(0).amax(dim=dims)
    else:
        m = x.abs().amax(dim=dims)
    return (m / prec.qmax).clamp_min(_EPS)


def affine_params(x: torch.Tensor, prec: Precision,
                  axis: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero_point) of an unsigned affine quantizer covering [min(x, 0), max(x, 0)]."""
    if prec.encoding is not Encoding.UNSIGNED:
        raise ValueError(f"affine quantization needs an unsigned precision, got {prec}")
    x = _check_float("x", x).detach()
    dims = _reduce_dims(x, axis)
    lo, hi = x.amin(dim=dims).clamp_max(0), x.amax(dim=dims).clamp_min(0)
    scale = ((hi - lo) / prec.qmax).clamp_min(_EPS)
    zp = round_half_up(-lo / scale).clamp(0, prec.qmax)
    return scale, zp


def quantize(x: torch.Tensor, scale: torch.Tensor, prec: Precision | WidePrecision,
             zero_point: torch.Tensor | None = None, axis: int | None = None) -> torch.Tensor:
    """Real tensor -> integer values in prec's range, stored as int8 (uint8 if unsigned; a
    `WidePrecision`: its own int16 / int32 storage)."""
    x = _check_float("x", x)
    if prec.encoding is Encoding.BINARY:
        q = torch.where(x >= 0, 1, -1)
    else:
        s = _broadcast(torch.as_tensor(scale, dtype=x.dtype, device=x.device), x, axis)
        q = round_half_up(x / s)
        if zero_point is not None:
            q = q + _broadcast(torch.as_tensor(zero_point, device=x.device), x, axis)
        q = q.clamp(prec.qmin, prec.qmax)
    if isinstance(prec, WidePrecision):
        return q.to(prec.storage_dtype)
    return q.to(storage_dtype(prec, Layout.INT8))


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None,
               axis: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Integer values -> real tensor: scale * (q - zero_point)."""
    v = q.to(dtype)
    if zero_point is not None:
        v = v - _broadcast(torch.as_tensor(zero_point, dtype=dtype, device=q.device), v, axis)
    return v * _broadcast(torch.as_tensor(scale, dtype=dtype, device=q.device), v, axis)


def fixed_point(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive float scales -> (multiplier, shift) int32 with scale ~ multiplier * 2^-shift.

    multiplier in [2^30, 2^31) where the shift range allows (31 significant bits, relative error
    <= 2^-31), shift in [1, 62]: the exact requantization the epilogue applies.
    """
    s = torch.as_tensor(scale, dtype=torch.float64).reshape(-1)
    if not bool((s > 0).all()) or not bool(torch.isfinite(s).all()):
        raise ValueError("scale must be finite and > 0")
    if bool((s >= 2.0**30).any()):
        raise ValueError("scale must be < 2^30 for fixed-point requantization")
    e = torch.floor(torch.log2(s))
    shift = (30 - e).clamp(1, 62)
    mult = torch.round(s * torch.pow(2.0, shift))
    over = mult >= 2.0**31
    mult = torch.where(over, torch.round(mult / 2), mult)
    shift = torch.where(over, shift - 1, shift)
    if bool((mult < 1).any()):
        raise ValueError("scale is too small (< 2^-63) for fixed-point requantization")
    return mult.to(torch.int32), shift.to(torch.int32)


class _FakeQuantSTE(torch.autograd.Function):
    """Forward: dequantize(quantize(x)). Backward: straight-through inside the clip range."""

    @staticmethod
    def forward(ctx, x, scale, prec, zero_point, axis):  # type: ignore[override]
        q = quantize(x, scale, prec, zero_point, axis)
        s = _broadcast(torch.as_tensor(scale, dtype=x.dtype, device=x.device), x, axis)
        if prec.encoding is Encoding.BINARY:
            inside = (x.abs() <= s.abs() * 1.0 + _EPS) if s.dim() else x.abs() <= 1.0
            out = q.to(x.dtype) * s
        else:
            zp = 0 if zero_point is None else _broadcast(
                torch.as_tensor(zero_point, dtype=x.dtype, device=x.device), x, axis)
            lo, hi = (prec.qmin - zp) * s, (prec.qmax - zp) * s
            inside = (x >= lo - s / 2) & (x <= hi + s / 2)
            out = (q.to(x.dtype) - zp) * s
        ctx.save_for_backward(inside)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (inside,) = ctx.saved_tensors
        return grad * inside.to(grad.dtype), None, None, None, None


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, prec: Precision,
                  zero_point: torch.Tensor | None = None, axis: int | None = None) -> torch.Tensor:
    """Quantize-dequantize with the straight-through estimator (clipped) for the gradient."""
    return _FakeQuantSTE.apply(_check_float("x", x), scale, prec, zero_point, axis)
