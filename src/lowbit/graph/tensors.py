"""The plan's tensors (`TensorSpec`): float32, or quantized logical NHWC integer values at one
precision and per-tensor scale in a storage layout (`lowbit.graph.ir` describes the plan)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core import Layout, Precision, WidePrecision
from ..core.validate import storage_dtype, storage_shape

#: widths of the plans' wide realizations (`lowbit.core.WidePrecision`; 16-bit residuals track
#: low-bit networks, 24-bit ones 8-bit networks too: `lowbit.graph.planner`): |value| < 2^23
#: keeps the residual term |res * r| < 2^54, so a kernel with an int32 accumulator adds the
#: epilogue's terms in int64 directly
WIDE_BITS = (16, 24)


def parse_precision(text: str) -> Precision | WidePrecision:
    """'u4' -> Precision; 's16' / 's24' -> WidePrecision."""
    for bits in WIDE_BITS:
        if text == f"s{bits}":
            return WidePrecision(bits)
    return Precision.parse(text)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the plan (module docstring). precision/scale/layout are None for floats."""

    name: str
    shape: tuple[int, ...]
    precision: Precision | WidePrecision | None = None
    scale: float | None = None
    layout: Layout | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.precision is None:
            if self.scale is not None or self.layout is not None:
                raise ValueError(f"float tensor {self.name!r} takes no scale or layout")
            return
        if isinstance(self.precision, str):
            object.__setattr__(self, "precision", parse_precision(self.precision))
        object.__setattr__(self, "layout", Layout(self.layout))
        if self.scale is None or not math.isfinite(self.scale) or not self.scale > 0:
            raise ValueError(f"quantized tensor {self.name!r} needs a finite scale > 0, got "
                             f"{self.scale!r}")

    @property
    def is_float(self) -> bool:
        return self.precision is None

    @property
    def is_wide(self) -> bool:
        return isinstance(self.precision, WidePrecision)

    @property
    def storage_shape(self) -> tuple[int, ...]:
        if self.is_float or self.is_wide:
            return self.shape
        return storage_shape(self.shape, self.precision, self.layout)

    @property
    def storage_dtype(self) -> torch.dtype:
        if self.is_float:
            return torch.float32
        if self.is_wide:
            return self.precision.storage_dtype
        return storage_dtype(self.precision, self.layout)

    @property
    def nbytes(self) -> int:
        return math.prod(self.storage_shape) * torch.empty((), dtype=self.storage_dtype
                                                           ).element_size()

    @property
    def kind(self) -> str:
        """'f32' or e.g. 'u2/bitplane'."""
        return "f32" if self.is_float else f"{self.precision}/{self.layout.value}"

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape),
                "precision": None if self.is_float else str(self.precision),
                "scale": self.scale, "layout": None if self.is_float else self.layout.value}

    @classmethod
    def from_dict(cls, d: dict) -> TensorSpec:
        return cls(d["name"], tuple(d["shape"]), d.get("precision"), d.get("scale"),
                   d.get("layout"))
