"""Exact integer conv2d and GEMM: the semantics every kernel is checked against.

Accumulation is exact. When the worst-case |sum| is below 2^53 the products are summed in
float64 (every partial sum is an integer below 2^53, so float64 is exact and fast on any
device); otherwise an int64 im2col matmul on the CPU is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_EXACT_F64 = 2**53


def _bound(x: torch.Tensor, w: torch.Tensor, terms: int) -> int:
    return int(x.abs().max()) * int(w.abs().max()) * terms if x.numel() and w.numel() else 0


def _check_int(name: str, t: object, dims: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer values (an integer dtype), got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    return t


def im2col_nhwc(x: torch.Tensor, r: int, s: int, stride: int, pad: int,
                pad_value: int = 0) -> torch.Tensor:
    """[N, H, W, C] -> [N, P, Q, R, S, C] patches (zero padding unless pad_value is given)."""
    xp = F.pad(x, (0, 0, pad, pad, pad, pad), value=pad_value)
    n, hp, wp, c = xp.shape
    p, q = (hp - r) // stride + 1, (wp - s) // stride + 1
    st = xp.stride()
    return xp.as_strided((n, p, q, r, s, c),
                         (st[0], st[1] * stride, st[2] * stride, st[1], st[2], st[3]))


def conv2d_int(x: torch.Tensor, w: torch.Tensor, stride: int = 1, pad: int = 0,
               groups: int = 1) -> torch.Tensor:
    """x [N, H, W, C] and w [K, R, S, C / groups] integer values -> int64 [N, P, Q, K]; zero
    padding; filter k reads the input channels of its group k // (K / groups)."""
    x, w = _check_int("x", x, 4), _check_int("w", w, 4)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be an int >= 1, got {groups!r}")
    if x.shape[3] % groups or w.shape[0] % groups:
        raise ValueError(f"x's C={x.shape[3]} and w's K={w.shape[0]} must be multiples of "
                         f"groups={groups}")
    if x.shape[3] != w.shape[3] * groups:
        per = f"C={w.shape[3]}" if groups == 1 else f"C/groups={w.shape[3]} (groups={groups})"
        raise ValueError(f"x has C={x.shape[3]} channels but w has {per}")
    k, r, s, cg = w.shape
    terms = r * s * cg
    if _bound(x, w, terms) < _EXACT_F64:
        out = F.conv2d(x.permute(0, 3, 1, 2).to(torch.float64),
                       w.permute(0, 3, 1, 2).to(torch.float64), stride=stride, padding=pad,
                       groups=groups)
        return out.permute(0, 2, 3, 1).round().to(torch.int64).contiguous()
    cols = im2col_nhwc(x.cpu().to(torch.int64), r, s, stride, pad)
    n, p, q = cols.shape[:3]
    # per group: its pixels' [R, S, C/groups] patches times its filters, an int64 matmul
    cols = cols.reshape(n * p * q, r, s, groups, cg).permute(3, 0, 1, 2, 4)
    wg = w.cpu().to(torch.int64).reshape(groups, k // groups, terms)
    out = torch.stack([cols[g].reshape(n * p * q, terms) @ wg[g].T for g in range(groups)], 1)
    return out.reshape(n, p, q, k).to(x.device)


def gemm_int(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] and b [N, K] integer values -> int64 [M, N] = a . b^T."""
    a, b = _check_int("a", a, 2), _check_int("b", b, 2)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a has K={a.shape[1]} but b has K={b.shape[1]}")
    if _bound(a, b, a.shape[1]) < _EXACT_F64:
        return (a.to(torch.float64) @ b.to(torch.float64).T).round().to(torch.int64)
    return (a.cpu().to(torch.int64) @ b.cpu().to(torch.int64).T).to(a.device)
