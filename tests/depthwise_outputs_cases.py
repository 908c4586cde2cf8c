"""Layer-epilogue outputs of the depthwise tests (test_depthwise_outputs.py and its offline
compile test): EfficientNet's SiLU, a table over the requantized s8 mid value into a wide
(s16) or 8-bit output, the mid value itself stored beside it (one formula, as the network's
plans have it) or a requantized output of its own formula; and their exact values."""

from __future__ import annotations

import torch

from lowbit.core import Precision, WidePrecision
from lowbit.kernels.triton.layer_outputs import Requantized
from lowbit.reference import fixed_point_pair
from lowbit.reference.netops import round_shift_sum

#: the float value of a mid step and of an output step of the SiLU table
MID_STEP, OUT_STEP = 0.06, 0.035
MID = Precision.parse("s8")


def precision(name: str) -> Precision | WidePrecision:
    """'s16' / 's24': a wide precision; else `Precision.parse`."""
    return WidePrecision(int(name[1:])) if int(name[1:]) > 8 else Precision.parse(name)


def silu_table(out: Precision | WidePrecision, step: float = OUT_STEP) -> torch.Tensor:
    """SiLU(q MID_STEP) in `step` output steps, rounded and clamped to `out`, for each mid
    value q (index q - MID.qmin)."""
    q = torch.arange(MID.qmin, MID.qmax + 1, dtype=torch.float64) * MID_STEP
    return torch.round(torch.nn.functional.silu(q) / step).long().clamp(out.qmin, out.qmax)


def formula(prec: Precision, k: int, y_typical: int, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, s, b): 31-bit multipliers mapping |y| <= y_typical onto about prec's range, and a
    shifted bias of a few output steps."""
    g = torch.Generator().manual_seed(seed)
    ratio = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * prec.qmax / y_typical
    m, _, s = fixed_point_pair(ratio, 0.0)
    b = ((torch.rand(k, generator=g, dtype=torch.float64) * 6 - 3) * torch.pow(2.0, s)
         ).to(torch.int64)
    return m, s, b


def layer_specs(kinds: tuple[str, ...], k: int, y_typical: int, seed: int = 0
                ) -> list[Requantized]:
    """One output per kind: "silu_s16" / "silu_s8" / "silu_u8" (the SiLU table over the s8
    mid value into that precision), "mid" (that formula's s8 value, stored), "s8" / "u8" /
    "u4" / "u2" (a requantized output of its own formula; unsigned ones with ReLU)."""
    m, s, b = formula(MID, k, y_typical, seed)
    specs = []
    for i, kind in enumerate(kinds):
        if kind.startswith("silu_"):
            out = precision(kind[5:])
            step = OUT_STEP / 2 ** (out.bits - 8) if out.bits > 8 else OUT_STEP
            specs.append(Requantized(out, m, s, b, mid=MID, table=silu_table(out, step)))
        elif kind == "mid":
            specs.append(Requantized(MID, m, s, b))
        else:
            p = Precision.parse(kind)
            mi, si, bi = formula(p, k, y_typical, seed + 10 + i)
            specs.append(Requantized(p, mi, si, bi, relu=p.qmin == 0))
    return specs


def expected(acc: torch.Tensor, spec: Requantized) -> torch.Tensor:
    """The output's exact values (int64) from the int64 accumulator `acc` [..., K]:
    clamp(floor((y m + b + 2^(s-1)) / 2^s)) to the formula's range, through the table for a
    derived output."""
    k = acc.shape[-1]
    m, s, b = (torch.as_tensor(v).to(torch.int64).expand(k)
               for v in (spec.multiplier, spec.shift, spec.bias))
    q = round_shift_sum([acc * m, b.expand_as(acc)], s).clamp(spec.low, spec.high)
    if spec.table is None:
        return q
    return torch.as_tensor(spec.table).to(torch.int64)[q - int(spec.mid.qmin)]
