"""The integer layer's steps as `torch.library` custom ops, so that `torch.export` and
`torch.compile` see one op per step (with a fake implementation for shapes) instead of tracing
into the reference, whose exactness checks branch on data.

    lowbit::quantize_activation(x, scale, precision, layer, nonfinite) -> int8 / uint8
    lowbit::conv2d_int(x NHWC, w KRSC, w_prec, a_prec, stride, pad, groups) -> int32 [N, P, Q, K]
    lowbit::gemm_int(x [M, C], w [K, C], w_prec, a_prec) -> int32 [M, K]

Precisions travel as their names ("u4", "s2", "b1"). The default implementation (every
device) is the exact reference (`lowbit.reference.run`); a backend may register a faster one
for a device with `torch.library.register_kernel("lowbit::conv2d_int", "cuda", fn)`, which
must return the same integers. Empty batches give empty outputs.
"""

from __future__ import annotations

import torch

from ..core import ConvWorkload, GemmWorkload, Layout, Precision
from ..core.epilogue import EpilogueParams
from ..core.validate import storage_dtype
from ..quant.guards import guard_input
from ..quant.quantize import quantize
from ..reference import run


def _conv_out(h: int, w: int, r: int, s: int, stride: int, pad: int) -> tuple[int, int]:
    return (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1


@torch.library.custom_op("lowbit::quantize_activation", mutates_args=())
def quantize_activation(x: torch.Tensor, scale: torch.Tensor, precision: str, layer: str,
                        nonfinite: str) -> torch.Tensor:
    """Float x -> integers of `precision` (round half up, clamped) at per-tensor `scale`, in
    float32 arithmetic, or float64 for a float64 x; non-finite x raises naming `layer`
    ("raise") or is replaced ("clamp")."""
    x = guard_input(x, layer, nonfinite)
    return quantize(x if x.dtype == torch.float64 else x.float(), scale,
                    Precision.parse(precision))


@quantize_activation.register_fake
def _(x, scale, precision, layer, nonfinite):
    return torch.empty_like(x, dtype=storage_dtype(Precision.parse(precision), Layout.INT8))


@torch.library.custom_op("lowbit::conv2d_int", mutates_args=())
def conv2d_int(x: torch.Tensor, w: torch.Tensor, w_prec: str, a_prec: str, stride: int,
               pad: int, groups: int = 1) -> torch.Tensor:
    """Exact int32 accumulators of conv2d(x, w) (zero padding), NHWC / KRSC (w [K, R, S,
    C / groups])."""
    n, h, wd, c = x.shape
    k, r, s, _ = w.shape
    p, q = _conv_out(h, wd, r, s, stride, pad)
    if n == 0:
        return torch.zeros(0, p, q, k, dtype=torch.int32, device=x.device)
    wl = ConvWorkload(N=n, H=h, W=wd, C=c, K=k, R=r, S=s, stride=stride, pad=pad,
                      groups=groups, w=w_prec, a=a_prec)
    return run(wl, x.contiguous(), w.contiguous(), EpilogueParams())


@conv2d_int.register_fake
def _(x, w, w_prec, a_prec, stride, pad, groups=1):
    n, h, wd, _ = x.shape
    k, r, s, _ = w.shape
    p, q = _conv_out(h, wd, r, s, stride, pad)
    return x.new_empty((n, p, q, k), dtype=torch.int32)


@torch.library.custom_op("lowbit::gemm_int", mutates_args=())
def gemm_int(x: torch.Tensor, w: torch.Tensor, w_prec: str, a_prec: str) -> torch.Tensor:
    """Exact int32 accumulators of x . w^T."""
    m, c = x.shape
    k = w.shape[0]
    if m == 0:
        return torch.zeros(0, k, dtype=torch.int32, device=x.device)
    wl = GemmWorkload(M=m, N=k, K=c, w=w_prec, a=a_prec)
    return run(wl, x.contiguous(), w.contiguous(), EpilogueParams())


@gemm_int.register_fake
def _(x, w, w_prec, a_prec):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.int32)
