"""Fixed-point requantization multipliers: the bounds that let a requantization sum run in
float64 or 32-bit arithmetic exactly, `shared_shift`, the per-channel multipliers of a
layer's accumulator (and residual) at one shift, `block_end_shift` (the accumulator's
multiplier an int32 for the block ends' 64-bit sum) and `reduced`, the same formula at the
smallest shift (the 32-bit sum where that makes it fit, with the same results).

Exactness: the plan realizes the model's arithmetic with multipliers of >= 31 significant
bits (`shared_shift` at the default sum_bits: the smaller multiplier 2^30 .. 2^31, fewer only
where the float64 bound needs it), which `lowbit.convert` (float64) equals on the zoo. A
32-bit sum leaves the multipliers 12-16 bits, and a value within ~2^-12 .. 2^-16 (relative)
of a rounding tie then rounds the other way: the 32-bit formula equals the 64-bit one for
every input only where it is the same formula, its multipliers and bias the 64-bit ones
divided by a common power of two (`reduced`: exact, cheap, and rare with float scales; scales
that are powers of two get it). `PlanOptions(requant32=True)` keeps the approximate 32-bit
requantizations as an explicit option. The block ends' exact 64-bit sums run as 32-bit ones
with a 64-bit redo near rounding steps where the kernel tables allow it (`Epilogue.guarded`,
kernels.cuda.bitserial_tables.guarded_form: the same multipliers here)."""

from __future__ import annotations

import torch

#: Every requantization sum |acc| m + |res| r + |b| + 2^(s-1) stays below 2^REQUANT_SUM_BITS,
#: so the separate epilogue pass (netops FAST) and the Triton kernels' own epilogue
#: (`float64_requant`) add it in float64, exactly: int64 multiply-adds were
#: instruction-bound (the pass: 707 us for a ResNet-50 block end at batch 256 on an H200,
#: 2.5 GB at 3.5 TB/s). The multipliers keep >= 20 significant bits for the widest
#: accumulators (a u2 output of a 24-bit residual: >= 26), finer than the float32 model
#: they stand for.
REQUANT_SUM_BITS = 53
#: the fewest significant bits a layer's multiplier gets for the float64 bound (below, it
#: keeps 31 and its kernels requantize in int64)
MIN_MULTIPLIER_BITS = 16
#: requantizations run in 32-bit arithmetic where they can: |acc| m + |b| + |res| |r| +
#: 2^(s-1) < 2^31 (the kernels' int32 epilogues: the block ends', the Triton INT32 mode), where
#: the multiplier keeps at least MIN_MULTIPLIER_BITS significant bits, or with a quantized
#: residual stream both multipliers at least NARROW_MULTIPLIER_BITS (else the wider sum)
REQUANT32_SUM_BITS = 31
NARROW_MULTIPLIER_BITS = 12


def shared_shift(ratio_a: torch.Tensor, ratio_b: float | None, z_steps: torch.Tensor,
                 sum_bits: int = REQUANT_SUM_BITS
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(m_a, m_b, shift) int64 per channel: m_a ~ ratio_a 2^s and (a residual epilogue)
    m_b ~ ratio_b 2^s at one shift, the smaller multiplier with >= 31 significant bits where
    |z| < 2^(REQUANT_SUM_BITS - 1) allows it (z_steps: the largest |z| in output steps, from
    the accumulator and residual bounds and the bias). Without a residual (ratio_b None,
    m_b None) m_a < 2^31, the kernels' int32 multiplier. `fixed_point_pair` keeps both below
    2^31 instead, which leaves the smaller one few bits when the residual's scale is much
    finer than the accumulator unit: its rounding then flips outputs near rounding
    boundaries."""
    a = ratio_a.double()
    if not bool((a > 0).all()) or not bool(torch.isfinite(a).all()) or bool((a >= 2.0**30).any()):
        raise ValueError("the requantization ratio must be finite, > 0 and < 2^30")
    b = None if ratio_b is None else torch.full_like(a, float(ratio_b))
    want = torch.ceil(30 - torch.log2(a if b is None else torch.minimum(a, b)))
    most = torch.floor(sum_bits - 1 - torch.log2(z_steps.double() + 1))
    s = torch.minimum(want, most)
    if b is None:  # no residual: never fewer than MIN_MULTIPLIER_BITS (the int64 path is exact)
        s = torch.where(most >= want - (31 - MIN_MULTIPLIER_BITS), s, want)
    s = s.clamp(1, 62)
    m_a = torch.round(a * torch.pow(2.0, s))
    if b is None:  # rounding up to 2^31: one bit less
        s = torch.where(m_a >= 2.0**31, s - 1, s)
        m_a = torch.round(a * torch.pow(2.0, s))
    m_b = None if b is None else torch.round(b * torch.pow(2.0, s))
    if bool((m_a < 1).any()) or (m_b is not None and bool((m_b < 1).any())):
        raise ValueError("no fixed-point multiplier: the accumulator and output (or residual) "
                         "scales are more than 2^61 apart")
    return (m_a.to(torch.int64), None if m_b is None else m_b.to(torch.int64),
            s.to(torch.int64))


def block_end_shift(ratio_a: torch.Tensor, ratio_b: float, z_steps: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`shared_shift`'s (m_a, m_b, shift) of a residual block end, its shift lowered where m_a
    would reach 2^31 (the residual's ratio the smaller one), so that m_a is an int32: the
    block-end epilogue's 64-bit sum multiplies the int32 accumulator by it with one wide
    multiply (`Epilogue.sum64`). m_a keeps >= 30 significant bits there, m_b >= 30 minus the
    bits that ratio_a / ratio_b spans."""
    m_a, m_b, s = shared_shift(ratio_a, ratio_b, z_steps)
    if not bool((m_a >= 2**31).any()):
        return m_a, m_b, s
    a = ratio_a.double()
    over = torch.tensor([max(0, int(v).bit_length() - 31) for v in m_a.tolist()],
                        dtype=torch.int64)
    s = (s - over).clamp(min=1)
    m_a = torch.round(a * torch.pow(2.0, s.double()))
    s = torch.where(m_a >= 2.0**31, s - 1, s)  # rounded up to 2^31: one bit less
    m_a = torch.round(a * torch.pow(2.0, s.double()))
    m_b = torch.round(float(ratio_b) * torch.pow(2.0, s.double()))
    if bool((s < 1).any()) or bool((m_a >= 2.0**31).any()) or bool((m_b < 1).any()):
        raise ValueError("no block-end multipliers: the accumulator and residual ratios are "
                         "more than 2^30 apart")
    return m_a.to(torch.int64), m_b.to(torch.int64), s


def reduced(m: torch.Tensor, r: torch.Tensor | None, b: torch.Tensor, s: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(m, r, b, s) per channel divided by the largest 2^d (d <= s - 1) that divides m, r and
    b: floor((acc m + res r + b + 2^(s-1)) / 2^s) is the same for every acc and res (its
    numerator and denominator share the factor exactly), at a shift d smaller, so the sum
    may fit 32 bits where the original does not (int64 vectors in, int64 out)."""
    d = torch.zeros_like(s)
    for i in range(1, 63):  # trailing zeros shared by every term, below the shift
        f = 1 << i
        ok = (s > i) & (m % f == 0) & (b % f == 0)
        if r is not None:
            ok &= r % f == 0
        if not bool(ok.any()):
            break
        d = torch.where(ok, torch.full_like(d, i), d)
    return (m >> d, None if r is None else r >> d, b >> d, s - d)
