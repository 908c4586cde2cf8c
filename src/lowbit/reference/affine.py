"""Per-channel affine requantization: an eval BatchNorm (y = a[c] x + b[c]) between quantized
tensors as integers, the oracle of `lowbit.kernels.triton.affine` and of the plan's
ChannelAffine step (`lowbit.graph.ir`).

The input is the channel concatenation of integer parts [..., C_i] (each at its own scale in
the plan: the scale ratio is in each channel's multiplier); per channel c of the
concatenation, with m[c] of either sign (a BatchNorm's negative scale), b[c] the bias in units
of 2^-s[c] output steps and s[c] in 1..62 (round half up; floor is exact integer floor
division):

    q[..., c] = clamp(floor((x[..., c] m[c] + b[c] + 2^(s[c]-1)) / 2^s[c]), lo, qmax),
    lo = max(qmin, 0) with relu, else qmin,

the layer epilogue's formula (`lowbit.reference.netops`) with the input in place of the
accumulator. Bound (checked): |x|max |m| + |b| + 2^(s-1) < 2^63 on every channel, so the sum
is an int64 as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core import Encoding, Precision, WidePrecision

#: |x m| + |b| + 2^(s-1) stays below this on every channel (module docstring)
AFFINE_SUM_LIMIT = 2**63


def affine_out_precision(name: str, p: object) -> Precision | WidePrecision:
    """`p` as an output precision of the affine requantization: a Precision (or its name)
    that is not binary, or a WidePrecision."""
    if isinstance(p, str):
        p = Precision.parse(p)
    if not isinstance(p, (Precision, WidePrecision)):
        raise TypeError(f"{name} must be a Precision, a WidePrecision or a name like 'u8', "
                        f"got {p!r}")
    if p.encoding is Encoding.BINARY:
        raise ValueError(f"{name} cannot be binary (-1/+1): the affine output is a clamp of a "
                         "requantized value")
    return p


def channel_vectors(multiplier: object, bias: object, shift: object, channels: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, b, s) as int64 [channels] on the CPU: integer tensors of that length, s in 1..62,
    |m| < 2^62, |b| < 2^62; TypeError / ValueError naming the argument otherwise."""
    out = []
    for name, v, lo, hi in (("multiplier", multiplier, -(2**62) + 1, 2**62 - 1),
                            ("bias", bias, -(2**62) + 1, 2**62 - 1), ("shift", shift, 1, 62)):
        if not isinstance(v, torch.Tensor) or v.dtype.is_floating_point or \
                v.dtype.is_complex or v.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer torch.Tensor, got "
                            f"{v.dtype if isinstance(v, torch.Tensor) else type(v).__name__}")
        if tuple(v.shape) != (channels,):
            raise ValueError(f"{name} must have shape ({channels},) (one value per channel of "
                             f"the concatenated parts), got {tuple(v.shape)}")
        t = v.to(torch.int64).cpu()
        if channels and (int(t.min()) < lo or int(t.max()) > hi):
            raise ValueError(f"{name} must lie in [{lo}, {hi}], got [{int(t.min())}, "
                             f"{int(t.max())}]")
        out.append(t)
    return out[0], out[1], out[2]


def check_affine_sum(top: Sequence[int], m: torch.Tensor, b: torch.Tensor,
                     s: torch.Tensor) -> None:
    """ValueError unless top[c] |m[c]| + |b[c]| + 2^(s[c]-1) < 2^63 for every channel c
    (top[c]: the largest |x| channel c may hold), in exact Python integers."""
    for c, (t, mi, bi, si) in enumerate(zip(top, m.tolist(), b.tolist(), s.tolist(),
                                            strict=True)):
        if int(t) * abs(mi) + abs(bi) + (1 << (si - 1)) >= AFFINE_SUM_LIMIT:
            raise ValueError(f"channel {c}: |x| m + |b| + 2^(s-1) reaches 2^63 (|x| <= {t}, "
                             f"m = {mi}, b = {bi}, s = {si})")


def channel_affine_int(parts: Sequence[torch.Tensor], multiplier: torch.Tensor,
                       bias: torch.Tensor, shift: torch.Tensor,
                       out: Precision | WidePrecision | str, relu: bool = False
                       ) -> torch.Tensor:
    """The affine requantization of the channel concatenation of `parts` (module docstring),
    int64 [..., sum C_i]. parts: integer tensors of one shape but for their last dim;
    multiplier / bias / shift: integer [sum C_i]; out: the output's precision."""
    prec = affine_out_precision("out", out)
    if not isinstance(parts, (list, tuple)) or not parts:
        raise TypeError("parts must be a non-empty list of integer tensors")
    for i, p in enumerate(parts):
        if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point or \
                p.dtype.is_complex or p.dtype == torch.bool:
            raise TypeError(f"parts[{i}] must be an integer torch.Tensor, got "
                            f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
        if p.dim() < 1 or tuple(p.shape[:-1]) != tuple(parts[0].shape[:-1]):
            raise ValueError(f"parts[{i}] must have parts[0]'s shape but for its channels "
                             f"{tuple(parts[0].shape[:-1])}, got {tuple(p.shape)}")
    x = torch.cat([p.to(torch.int64) for p in parts], dim=-1)
    m, b, s = channel_vectors(multiplier, bias, shift, x.shape[-1])
    top = x.abs().reshape(-1, x.shape[-1]).amax(0).tolist() if x.numel() else \
        [0] * x.shape[-1]
    check_affine_sum(top, m, b, s)
    m, b, s = (t.to(x.device) for t in (m, b, s))
    q = (x * m + b + (torch.ones_like(s) << (s - 1))) >> s
    return q.clamp(max(prec.qmin, 0) if relu else prec.qmin, prec.qmax)
