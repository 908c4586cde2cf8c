"""Exact epilogue semantics (see `lowbit.core.epilogue` for the formulas)."""

from __future__ import annotations

import torch

from ..core import OUT_FP16, Epilogue
from ..core.epilogue import EpilogueParams
from ..quant.packing import pack

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def requantize(y: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor,
               qmin: int, qmax: int) -> torch.Tensor:
    """clamp((y * m + 2^(s-1)) >> s, qmin, qmax) in exact int64 (round half up)."""
    m, s = multiplier.to(torch.int64), shift.to(torch.int64)
    return ((y * m + (1 << (s - 1))) >> s).clamp(qmin, qmax)


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
