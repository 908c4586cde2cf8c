"""Static storage of a plan's tensors: one byte arena per executor, each tensor a view at a
fixed offset, tensors whose lifetimes do not overlap sharing bytes.

A tensor lives from the step that writes it (the input: before the first step) to the last
step that reads it; a tensor read and written by the same step never shares bytes with it.
Views (a Flatten output) are aliases: they extend their base's lifetime and take no bytes.
Offsets are multiples of `ALIGN` bytes (kernels want 16-byte aligned operands, TMA 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..graph.ir import Flatten, Plan, TensorSpec

ALIGN = 256


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Arena:
    """Byte offsets of the plan's tensors (aliases: their base's) and the arena's size."""

    offsets: dict[str, int]
    aliases: dict[str, str]
    nbytes: int

    def base(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name


def lifetimes(plan: Plan, reads: dict[str, int] | None = None
              ) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """{tensor: (first step, last step)} of the plan's non-alias tensors (the input from -1)
    and {Flatten output: its input} (module docstring). `reads` adds reads the plan does not
    show: {tensor: index of a later step that reads it} (a fused first layer reads the image
    that the plan's Quantize step reads)."""
    aliases = {s.output: s.input for s in plan.steps if isinstance(s, Flatten)}

    def root(t: str) -> str:
        while t in aliases:
            t = aliases[t]
        return t

    life: dict[str, list[int]] = {plan.input: [-1, -1]}
    for i, step in enumerate(plan.steps):
        for t in step.outputs:
            if t not in aliases:
                life.setdefault(t, [i, i])
        for t in (*step.inputs, *step.outputs):
            r = root(t)
            life[r][1] = max(life[r][1], i)
    for t, i in (reads or {}).items():
        r = root(t)
        life[r][1] = max(life[r][1], i)
    return {t: (a, b) for t, (a, b) in life.items()}, aliases


def plan_arena(plan: Plan, reuse: bool = True, reads: dict[str, int] | None = None) -> Arena:
    """Offsets for every tensor of `plan` (first fit by order of first write); reuse=False
    gives every tensor its own bytes (all of them readable after a forward); `reads` as in
    `lifetimes`."""
    life, aliases = lifetimes(plan, reads)
    order = sorted(life, key=lambda t: (life[t][0], t))
    placed: list[tuple[int, int, str]] = []  # (offset, end, tensor)
    offsets: dict[str, int] = {}
    top = 0
    for t in order:
        size = _aligned(max(tensor_bytes(plan.tensors[t]), 1))
        start = life[t][0]
        busy = sorted((o, e) for o, e, u in placed
                      if not reuse or life[u][1] >= start)
        off = 0
        for o, e in busy:
            if off + size <= o:
                break
            off = max(off, e)
        placed.append((off, off + size, t))
        offsets[t] = off
        top = max(top, off + size)
    return Arena(offsets, aliases, top)


def tensor_bytes(spec: TensorSpec) -> int:
    return math.prod(spec.storage_shape) * torch.empty((), dtype=spec.storage_dtype
                                                       ).element_size()


def view_of(arena_bytes: torch.Tensor, offset: int, shape: tuple[int, ...],
            dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor of `shape` / `dtype` at byte `offset` of a uint8 arena."""
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return arena_bytes[offset:offset + n].view(dtype).view(shape)


def temporaries_bytes(temps: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes `Scratch.take` hands out for these temporaries of one step."""
    return sum(_aligned(math.prod(shape) * torch.empty((), dtype=dtype).element_size())
               for shape, dtype in temps)


class Scratch:
    """Step-local temporaries (an accumulator, a pooled copy): one region of `nbytes` reused
    by every step, since steps run one after another on one stream. `take` hands out aligned
    views from the start of the region; `reset` before binding the next step."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.region = torch.empty(max(nbytes, ALIGN), dtype=torch.uint8, device=device)
        self.cursor = 0

    def reset(self) -> None:
        self.cursor = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = view_of(self.region, self.cursor, tuple(shape), dtype)
        self.cursor += temporaries_bytes([(tuple(shape), dtype)])
        if self.cursor > self.region.numel():
            raise AssertionError("scratch region too small for the step's temporaries")
        return t
