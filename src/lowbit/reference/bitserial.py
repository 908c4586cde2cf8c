"""The bit-serial product (APNN-TC) on bit planes, with every encoding rewritten onto AND.

Each operand value is x = alpha * sum_i c_i x_i + beta over its bit planes x_i (in {0,1}):
  unsigned: alpha=1, beta=0, c_i = 2^i
  signed:   alpha=1, beta=0, c_i = 2^i, except the top plane c_{b-1} = -2^(b-1)
  binary:   alpha=2, beta=-1, c_0 = 1            (x = 2a - 1)
so over the valid positions m (not padding) a dot product expands into AND-popcounts only:
  sum x.y = aa*ab * sum_ij c_i d_j popc(a_i & b_j & m) + aa*bb * sum_i c_i popc(a_i & m)
          + ba*ab * sum_j d_j popc(m & b_j)         + ba*bb * popc(m)
For binary x binary this is 4 popc(a&b) - 2 popc(a) - 2 popc(b) + K (APNN-TC; AND because XOR
runs 6x slower than AND on Hopper's b1 tensor cores). Padding positions contribute 0 for every
encoding: the mask m is APNN-TC's input-aware padding.
"""

from __future__ import annotations

import torch

from ..core import Encoding, Precision
from ..quant.packing import WORD_BITS, to_bitplanes, to_pattern
from .integer import im2col_nhwc


def plane_coefficients(prec: Precision) -> tuple[int, int, list[int]]:
    """(alpha, beta, [c_i]) of the encoding, as in the module docstring."""
    if prec.encoding is Encoding.BINARY:
        return 2, -1, [1]
    c = [1 << i for i in range(prec.bits)]
    if prec.encoding is Encoding.SIGNED:
        c[-1] = -c[-1]
    return 1, 0, c


def popcount(words: torch.Tensor) -> torch.Tensor:
    """Bits set in each 32-bit word (int32 bit patterns or int64) -> int64."""
    v = words.to(torch.int64) & 0xFFFFFFFF
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return (v * 0x01010101 >> 24) & 0xFF


def _popc_and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, Wd], b [N, Wd] words -> [M, N] sum over words of popc(a & b)."""
    return popcount(a.unsqueeze(1) & b.unsqueeze(0)).sum(-1)


def valid_mask(rows: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[rows, ceil(k/32)] int32 words with the first k bits of each row set."""
    ones = torch.ones(rows, k, dtype=torch.int64, device=device)
    return to_bitplanes(ones, Precision(1))[0]


def bitserial_gemm(a_planes: torch.Tensor, b_planes: torch.Tensor, a_prec: Precision,
                   b_prec: Precision, mask: torch.Tensor) -> torch.Tensor:
    """a_planes [p, M, Wd], b_planes [q, N, Wd] (int32 words), mask [M, Wd] of valid bits
    -> int64 [M, N] sum over valid positions of a-value * b-value."""
    aa, ba, c = plane_coefficients(a_prec)
    ab, bb, d = plane_coefficients(b_prec)
    a_planes = a_planes & mask.unsqueeze(0)
    out = torch.zeros(a_planes.shape[1], b_planes.shape[1], dtype=torch.int64,
                      device=a_planes.device)
    for i, ci in enumerate(c):
        for j, dj in enumerate(d):
            out += aa * ab * ci * dj * _popc_and(a_planes[i], b_planes[j])
    if bb:
        col = sum(ci * popcount(a_planes[i]).sum(-1) for i, ci in enumerate(c))
        out += aa * bb * col.unsqueeze(1)
    if ba:
        out += ba * ab * sum(dj * _popc_and(mask, b_planes[j]) for j, dj in enumerate(d))
    if ba and bb:
        out += ba * bb * popcount(mask).sum(-1).unsqueeze(1)
    return out


def bitserial_gemm_values(a: torch.Tensor, b: torch.Tensor, a_prec: Precision,
                          b_prec: Precision) -> torch.Tensor:
    """a [M, K], b [N, K] integer values -> int64 [M, N] through the bit-serial formula."""
    mask = valid_mask(a.shape[0], a.shape[1], a.device)
    return bitserial_gemm(to_bitplanes(a, a_prec), to_bitplanes(b, b_prec), a_prec, b_prec, mask)


def bitserial_conv2d(x: torch.Tensor, w: torch.Tensor, x_prec: Precision, w_prec: Precision,
                     stride: int = 1, pad: int = 0) -> torch.Tensor:
    """x [N, H, W, C], w [K, R, S, C] values -> int64 [N, P, Q, K] through the bit-serial
    formula over im2col bit planes (32 channels per word for each (r, s)), padding masked."""
    k, r, s, c = w.shape
    fill = 1 if x_prec.encoding is Encoding.BINARY else 0  # any valid value: masked below
    cols = im2col_nhwc(to_pattern(x, x_prec), r, s, stride, pad)
    valid = im2col_nhwc(torch.ones_like(x[..., :1], dtype=torch.int64).expand_as(x),
                        r, s, stride, pad)
    n, p, q = cols.shape[:3]
    u = Precision(x_prec.bits) if x_prec.encoding is not Encoding.BINARY else Precision(1)
    pat = torch.where(valid.bool(), cols, torch.full_like(cols, fill if fill else 0))
    planes = to_bitplanes(pat.reshape(n * p * q, r * s, c), u)  # raw bit patterns
    mask = to_bitplanes(valid.reshape(n * p * q, r * s, c), Precision(1))[0]
    wplanes = to_bitplanes(w.reshape(k, r * s, c), w_prec)
    words = -(-c // WORD_BITS)
    out = bitserial_gemm(planes.reshape(planes.shape[0], n * p * q, r * s * words),
                         wplanes.reshape(wplanes.shape[0], k, r * s * words), x_prec, w_prec,
                         mask.reshape(n * p * q, r * s * words))
    return out.reshape(n, p, q, k)
