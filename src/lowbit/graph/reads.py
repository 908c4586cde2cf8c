"""What a consumer of a value reads (`Req`): float, or a precision, scale and layout,
possibly derived `Via` another quantized value. The planner realizes each value once per
distinct read (its realizations), and a producer's epilogue writes exactly those."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import Layout, Precision, WidePrecision


@dataclass(frozen=True)
class Via:
    """A derived realization: the value realized at its own quantizer's `precision` and
    `scale` (a residual quantizer of the model), then mapped by the params' `table` (another
    quantizer's reading of it)."""

    precision: Precision | WidePrecision
    scale: float
    table: str


@dataclass(frozen=True)
class Req:
    """What a consumer reads: float (precision None) or precision / scale / layout, possibly
    `via` a quantized value (`Via`)."""

    precision: Precision | None = None
    scale: float | None = None
    layout: Layout | None = None
    via: Via | None = None

    @property
    def is_float(self) -> bool:
        return self.precision is None

    @property
    def tag(self) -> str:
        if self.is_float:
            return "f32"
        return f"{self.precision}.{self.layout.value}" + (".via" if self.via else "")

    def mid(self) -> Req:
        """The realization a derived one is looked up from (itself when not derived)."""
        return self if self.via is None else Req(self.via.precision, self.via.scale,
                                                 Layout.INT8)


FLOAT_REQ = Req()
