"""Adaptive training precision ("mix", Dao thesis ch. 4, Eq. 4.8-4.13), our reading.

Every quantized activation tensor carries a training precision b that starts at 32 bits and is
moved toward the deployed (target) precision T by gradient descent on a divergence:

    D(b) = KL(P_T || P_b)                                  (Eq. 4.8-4.9)
    b   <- b - beta * dD/db                                (Eq. 4.10)
    dD/db ~ D(b) - D(b - 1)                                (Eq. 4.11-4.13: finite difference)

P_b is the distribution of the tensor after quantization to b bits, P_T the one at the target
precision, both estimated from the same magnitude histogram (bins over [0, max]) without
re-quantizing the tensor: the mass of every bin moves to the bin of the level its centre rounds
to (round half up, clamped at the clip). The b-bit grid is taken as the refinement of the target
grid (step s_T / 2^(b - T)), so P_T is a coarsening of P_b, every target level carries mass under
both and D stays finite: D is 0 at b = T and grows by about ln 2 per bit of smooth mass (a spike,
e.g. the zeros after a ReLU, adds nothing). The descent therefore lowers b toward T at a rate set
by how much of the tensor's mass a bit actually resolves. A histogram of 2^h bins over n elements
resolves about min(h, log2 n) - 1 bits, so above that the slope measured there is used. The
real-valued b is the state; the quantizer uses b rounded half up to an integer (never below
T). `until` (our addition) ends a warm-up: b is capped by a ceiling that falls linearly from
the start precision at step 0 to T at step `until`, so the schedule reaches T by then whatever
the divergence says, and the deployed precision is trained for the rest. `lowbit.quantize` sizes
`until` from the training length (`train_steps`, 25% warm-up by default).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .quantize import round_half_up

_KL_EPS = 1e-10
MAX_BITS = 32


def level_max(bits: int, signed: bool) -> int:
    """Largest positive level of a b-bit quantizer (magnitude side for signed tensors)."""
    bits = min(bits, 52)
    return (1 << (bits - 1)) - 1 if signed and bits > 1 else (1 << bits) - 1


def quantized_histogram(probs: torch.Tensor, clip_fraction: float, bits: int,
                        target_bits: int, signed: bool) -> torch.Tensor:
    """Histogram (same bins over [0, 1]) of the tensor quantized on the b-bit grid that refines
    the target grid: step s_T / 2^(b - T) with s_T = clip / qmax_T, so every target level is a
    b-bit level and adding a bit halves the step. Each bin's mass moves to the bin of its level
    (round half up, clamped at the clip)."""
    probs = probs.detach().double().cpu()
    bins = probs.numel()
    refine = 2.0 ** (min(bits, 52) - target_bits)
    top_level = level_max(target_bits, signed) * refine
    s = max(clip_fraction, 1e-12) / max(level_max(target_bits, signed), 1) / refine
    centers = (torch.arange(bins, dtype=torch.float64) + 0.5) / bins
    levels = torch.clamp(round_half_up(centers / s), 0, top_level) * s
    idx = (levels * bins).floor().long().clamp(0, bins - 1)
    return torch.zeros_like(probs).index_add_(0, idx, probs)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) of two histograms (normalized here; eps-smoothed so empty bins stay finite)."""
    p = p.double() + _KL_EPS
    q = q.double() + _KL_EPS
    p, q = p / p.sum(), q / q.sum()
    return float((p * (p / q).log()).sum())


def divergence(probs: torch.Tensor, clip_fraction: float, bits: int, target_bits: int,
               signed: bool) -> float:
    """D(b) = KL(P_T || P_b) (Eq. 4.8-4.9)."""
    p_t = quantized_histogram(probs, clip_fraction, target_bits, target_bits, signed)
    p_b = quantized_histogram(probs, clip_fraction, bits, target_bits, signed)
    return kl_divergence(p_t, p_b)


def resolution_bits(bins: int, samples: int | None = None) -> int:
    """Most bits a histogram of `bins` bins over `samples` elements resolves: one bit below
    log2(bins) (at the last bit the refined grid aliases with the bins) and below log2(samples)
    (a grid finer than the number of elements only separates single elements)."""
    bits = int(math.log2(bins)) - 1
    if samples is not None and samples > 1:
        bits = min(bits, int(math.log2(samples)) - 1)
    return bits


class AdaptivePrecision(nn.Module):
    """Training-precision schedule of one activation tensor; `history` logs (step, bits).

    The real-valued state b is a buffer (`value_buf`: saved with the model); `history` is a log
    (the lowbit.save manifest keeps it)."""

    def __init__(self, target_bits: int, start_bits: int = MAX_BITS, beta: float = 4.0,
                 signed: bool = False, until: int | None = None) -> None:
        super().__init__()
        if not isinstance(target_bits, int) or not 1 <= target_bits <= 8:
            raise ValueError(f"target_bits must be an int in 1..8, got {target_bits!r}")
        if not isinstance(start_bits, int) or not target_bits <= start_bits <= MAX_BITS:
            raise ValueError(f"start_bits must be an int in {target_bits}..{MAX_BITS}, "
                             f"got {start_bits!r}")
        if not isinstance(beta, (int, float)) or not beta > 0:
            raise ValueError(f"beta must be a positive number, got {beta!r}")
        if until is not None and (not isinstance(until, int) or until < 0):
            raise ValueError(f"until must be None or an int >= 0, got {until!r}")
        self.target, self.beta, self.signed, self.until = target_bits, float(beta), signed, until
        self.start = start_bits
        self.register_buffer("value_buf", torch.tensor(float(start_bits), dtype=torch.float64))
        self.history: list[tuple[int, int]] = [(0, start_bits)]

    @property
    def value(self) -> float:
        return float(self.value_buf)

    @value.setter
    def value(self, v: float) -> None:
        self.value_buf.fill_(float(v))

    def ceiling(self, step: int) -> float:
        """Warm-up cap at training step `step`: start bits at 0, linear down to the target at
        `until`, the target after (no cap without `until`)."""
        if self.until is None:
            return float(self.start)
        if step >= self.until:
            return float(self.target)
        return self.target + (self.start - self.target) * (1.0 - step / self.until)

    def bits_at(self, step: int) -> int:
        """Integer training precision at `step`: the state's bits, under the warm-up cap."""
        cap = math.floor(self.ceiling(step) + 0.5)
        return max(self.target, min(self.bits, cap))

    def note(self, step: int, bits: int) -> None:
        """Log `bits` at `step` if they differ from the last logged precision."""
        if self.history[-1][1] != bits:
            self.history.append((step, bits))

    def extra_repr(self) -> str:
        return f"target={self.target}, bits={self.bits}, beta={self.beta}, until={self.until}"

    @property
    def bits(self) -> int:
        """Integer training precision (round half up of the state, at least the target)."""
        return max(self.target, min(MAX_BITS, math.floor(self.value + 0.5)))

    def slope(self, probs: torch.Tensor, clip_fraction: float,
              samples: int | None = None) -> float:
        """dD/db by the backward difference D(b) - D(b - 1) at b capped by the resolution."""
        b = max(min(self.bits, resolution_bits(probs.numel(), samples)), self.target + 1)
        if b - 1 < self.target:
            return 0.0
        d = [divergence(probs, clip_fraction, bb, self.target, self.signed) for bb in (b, b - 1)]
        return max(0.0, d[0] - d[1])

    def step(self, iteration: int, probs: torch.Tensor, clip_fraction: float,
             samples: int | None = None) -> int:
        """One update of b from the tensor's current histogram (of `samples` elements, if
        known); returns the new integer bits."""
        if self.bits > self.target:
            self.value = max(float(self.target),
                             self.value - self.beta * self.slope(probs, clip_fraction, samples))
        self.value = min(self.value, self.ceiling(iteration))
        self.history.append((iteration, self.bits))
        return self.bits

    def changes(self) -> list[tuple[int, int]]:
        """The history reduced to the steps where the integer precision changed."""
        out = self.history[:1]
        for prev, h in zip(self.history, self.history[1:], strict=False):
            if h[1] != prev[1]:
                out.append(h)
        return out
