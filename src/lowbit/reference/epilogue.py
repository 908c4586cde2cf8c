"""Exact epilogue semantics (see `lowbit.core.epilogue` for the formulas)."""

from __future__ import annotations

import torch

from ..core import OUT_FP16, Epilogue
from ..core.epilogue import EpilogueParams
from ..quant.packing import pack

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def requantize(y: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor,
               qmin: int, qmax: int) -> torch.Tensor:
    """clamp((y * m + 2^(s-1)) >> s, qmin, qmax), exact (round half up) for |y| < 2^32 (an
    int32 accumulator plus an int32 bias), m < 2^31, 1 <= s <= 62. The rounding term is added to
    the low s bits of y * m alone: y * m + 2^(s-1) itself can pass 2^63 there."""
    m, s = multiplier.to(torch.int64), shift.to(torch.int64)
    q = y * m
    low = q & ((1 << s) - 1)
    return ((q >> s) + ((low + (1 << (s - 1))) >> s)).clamp(qmin, qmax)


#: widest requantized output whose epilogue kernels may run as thresholds (2^bits - 1 compares)
THRESHOLD_MAX_BITS = 2


def requant_thresholds(epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor:
    """The requantizing epilogue as integer thresholds on the accumulator: bias, ReLU and
    requantization folded into L = qmax - qmin thresholds per channel (as XNOR-Net folds batch
    norm into the sign), int32 [K, L] on the CPU, such that for every accumulator y with
    |y| < 2^31 - 1

        requantize(relu(y + bias)) == qmin + #{k : y >= T[c, k]}.

    Exact: the multiplier is >= 1, so requantize is non-decreasing and
    requantize(y) >= v  <=>  y >= ceil((v * 2^s - 2^(s-1)) / m); ReLU makes a threshold <= 0
    always true. Thresholds past the int32 range clamp to it (always / never true)."""
    if not epilogue.requantizes:
        raise ValueError("requant_thresholds needs a requantizing epilogue")
    out = epilogue.out
    mult, shift = params.multiplier.tolist(), params.shift.tolist()
    bias = params.bias.tolist() if epilogue.bias else [0] * len(mult)
    rows = []
    for m, sh, b in zip(mult, shift, bias, strict=True):
        row = []
        for v in range(out.qmin + 1, out.qmax + 1):
            t = -((-(v * 2**sh - 2 ** (sh - 1))) // m)  # ceil, in exact Python integers
            thr = INT32_MIN if epilogue.relu and t <= 0 else t - b
            row.append(min(max(thr, INT32_MIN), INT32_MAX))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32).reshape(len(mult), out.qmax - out.qmin)


def apply_epilogue(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor:
    """int64 accumulators [..., K] -> the output in the epilogue's storage layout."""
    y = acc.to(torch.int64)
    if epilogue.bias:
        y = y + params.bias.to(torch.int64)
    if epilogue.relu:
        y = y.clamp_min(0)
    if epilogue.requantizes:
        q = requantize(y, params.multiplier, params.shift, epilogue.out.qmin, epilogue.out.qmax)
        return pack(q, epilogue.out, epilogue.out_layout)
    if epilogue.out == OUT_FP16:
        return (y.to(torch.float32) * params.scale.to(torch.float32)).to(torch.float16)
    if y.numel() and (int(y.min()) < INT32_MIN or int(y.max()) > INT32_MAX):
        raise OverflowError("int32 output overflows: the accumulator exceeds the int32 range")
    return y.to(torch.int32)
