"""u8 activations on the int8 tensor cores, exactly, by a zero point.

ReLU and average-pool outputs at 8 bits are u8 (0..255), outside the s8 range the int8 dot
multiplies. The int8 templates (`triton.gemm_int8`, `triton.gemv_int8`, `triton.conv2d_int8`,
`triton.conv2d_int8_tma`) take them as a' = a - ACT_ZERO_POINT, which is the stored byte with
its top bit flipped read as s8 (one XOR in registers), and add the zero-point term once per
output:

    sum_k a w = sum_k (a - 128) w + 128 sum_k w[n, k]

The identity holds term by term for every a, so it holds for the zeros a kernel reads in place
of a conv's padding and of channels past C (a zero byte flips to -128 and the term restores
it), provided the weights it meets there are the layer's own weights or zeros: where a TMA box
reads past channel C into the next tap's weights (`triton.conv2d_int8_tma` with C not a
multiple of BLOCK_K), the restored term would be the wrong tap's, so that template takes u8
activations only where BLOCK_K divides C. Every partial sum of a' w lies within 128 max|w| K,
the true sum within 255 max|w| K, which the templates check against int32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core import Layout, Workload
from ...core.precision import Encoding, Precision
from ...quant.packing import unpack

#: subtracted from u8 activations so that they fit the int8 dot (module doc)
ACT_ZERO_POINT = 128
#: what the dot multiplies in place of u8 activations
SHIFTED_ACT = Precision(8, Encoding.SIGNED)


def act_zero_point(a: Precision) -> int:
    """What the kernel subtracts from activations of precision `a`: ACT_ZERO_POINT for u8
    (values beyond int8), else 0."""
    return ACT_ZERO_POINT if a.encoding is Encoding.UNSIGNED and a.bits == 8 else 0


def zero_point_terms(wl: Workload, w: torch.Tensor) -> torch.Tensor:
    """act_zero_point(wl.a) * sum over the reduction of w[n, ...] as int32 [N], from the
    weights' storage `w` (validated: [N, K] or [K, R, S, C] one value per byte, or densely
    packed rows); exact in int32 under the templates' bound (|term| <= 128 max|w| K < 2^31)."""
    _, n, _ = wl.gemm_shape
    if wl.w_layout is Layout.INT8:
        sums = w.reshape(n, -1).sum(dim=1)  # int64 accumulation, no int64 copy of the weights
    else:
        sums = unpack(w, wl.w, wl.w_layout, getattr(wl, "C", None) or wl.gemm_shape[2]
                      ).reshape(n, -1).sum(dim=1)
    return (sums * act_zero_point(wl.a)).to(torch.int32).reshape(n)


def bound_terms(wl: Workload, w: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """The launch's zero-point vector: `zero_point_terms` for a real weight tensor; for an
    ahead-of-time compile's 1-d placeholder, any int32 vector (it only types the argument)."""
    if w.dim() == 1:
        return torch.empty(16, dtype=torch.int32, device=device)
    return zero_point_terms(wl, w).to(device)


@triton.jit
def shifted_act(a, A_ZERO: tl.constexpr):
    """The dot operand of a u8 activation tile read as raw bytes: a - A_ZERO (= 128) as s8,
    the top bit flipped."""
    return (a.to(tl.uint8, bitcast=True) ^ A_ZERO).to(tl.int8, bitcast=True)


@triton.jit
def with_zero_point(acc, zp_ptr, offs_n, n_mask, split, A_ZERO: tl.constexpr):
    """acc + the zero-point term of each column (zp_ptr: int32 [NOUT]) where A_ZERO != 0, in
    reduction split 0's partial only (`split`: the program's split; 0 for a full sum), so the
    sum of the splits holds it once."""
    if A_ZERO != 0:
        first = (tl.zeros_like(offs_n) + split) == 0
        acc = acc + tl.load(zp_ptr + offs_n, mask=n_mask & first, other=0)[None, :]
    return acc


__all__ = ["ACT_ZERO_POINT", "SHIFTED_ACT", "act_zero_point", "bound_terms", "shifted_act",
           "with_zero_point", "zero_point_terms"]
