"""Pooling windows: the output size and the (start, end, count) of every window along one axis,
for max-pools, average pools with kernel / stride / padding, global and adaptive pools
(PyTorch's semantics, ceil_mode False)."""

from __future__ import annotations

from ..reference import pool_output_size

#: average pool modes
WINDOW, GLOBAL, ADAPTIVE = "window", "global", "adaptive"


def axis_windows(size: int, mode: str, kernel: int | None = None, stride: int | None = None,
                 pad: int = 0, out: int | None = None) -> list[tuple[int, int, int]]:
    """Windows along an axis of `size` elements: (start, end, count) with [start, end) the
    valid elements and `count` the divisor's factor along the axis (kernel for a window pool,
    zero padding counted; end - start for global and adaptive pools)."""
    if mode == GLOBAL:
        return [(0, size, size)]
    if mode == ADAPTIVE:
        return [((i * size) // out, -(-((i + 1) * size) // out),
                 -(-((i + 1) * size) // out) - (i * size) // out) for i in range(out)]
    n = pool_output_size(size, kernel, stride, pad)
    return [(max(i * stride - pad, 0), min(i * stride - pad + kernel, size), kernel)
            for i in range(n)]


def pooled_hw(h: int, w: int, mode: str, kernel: int | None = None, stride: int | None = None,
              pad: int = 0, output_hw: tuple[int, int] | None = None) -> tuple[int, int]:
    """Output (H, W) of a pool on an h x w map."""
    oh, ow = output_hw or (None, None)
    return (len(axis_windows(h, mode, kernel, stride, pad, oh)),
            len(axis_windows(w, mode, kernel, stride, pad, ow)))


def window_counts(h: int, w: int, mode: str, kernel: int | None = None,
                  stride: int | None = None, pad: int = 0,
                  output_hw: tuple[int, int] | None = None) -> tuple[int, ...]:
    """The distinct divisors (elements per window, padding counted for window pools)."""
    oh, ow = output_hw or (None, None)
    rows = {c for _, _, c in axis_windows(h, mode, kernel, stride, pad, oh)}
    cols = {c for _, _, c in axis_windows(w, mode, kernel, stride, pad, ow)}
    return tuple(sorted({r * c for r in rows for c in cols}))


def single_element_windows(h: int, w: int, mode: str, kernel: int | None = None,
                           stride: int | None = None, pad: int = 0,
                           output_hw: tuple[int, int] | None = None) -> bool:
    """True when every window holds exactly one element and divides by one (the pool only
    copies elements: identity, or the replication of an adaptive pool to a larger map)."""
    oh, ow = output_hw or (None, None)
    return all(e - s == 1 and c == 1
               for size, o in ((h, oh), (w, ow))
               for s, e, c in axis_windows(size, mode, kernel, stride, pad, o))
