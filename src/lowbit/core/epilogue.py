"""What happens to the int32 accumulator of a conv/GEMM before it is stored.

Order (exact integer semantics, see `lowbit.reference.epilogue`):
  y = acc + bias[k]                      (bias: int32 in accumulator units, optional)
  y = max(y, 0)                          (relu, optional)
  out = int32:  y
  out = fp16:   fp16(float32(y) * scale[k])
  out = Precision p: clamp((y * multiplier[k] + 2^(shift[k]-1)) >> shift[k], p.qmin, p.qmax)
        i.e. fixed-point requantization with round-half-up, multiplier in [1, 2^31), shift in
        [1, 62], the int64 product exact. `lowbit.quant.fixed_point` turns a float scale into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import PACKABLE_BITS, Layout
from .precision import Encoding, Precision

OUT_INT32 = "int32"
OUT_FP16 = "fp16"


@dataclass(frozen=True)
class Epilogue:
    """Structure of the fused epilogue; the per-channel vectors are run-time arguments."""

    bias: bool = False
    relu: bool = False
    out: str | Precision = OUT_INT32
    out_layout: Layout = Layout.INT8

    def __post_init__(self) -> None:
        for f in ("bias", "relu"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"Epilogue.{f} must be a bool, got {getattr(self, f)!r}")
        out = self.out
        if isinstance(out, str) and out not in (OUT_INT32, OUT_FP16):
            out = Precision.parse(out)
        if not isinstance(out, (str, Precision)):
            raise TypeError(f"Epilogue.out must be 'int32', 'fp16' or a Precision, got {out!r}")
        object.__setattr__(self, "out", out)
        try:
            layout = Layout(self.out_layout)
        except ValueError:
            allowed = ", ".join(x.value for x in Layout)
            raise ValueError(
                f"Epilogue.out_layout must be one of {allowed}, got {self.out_layout!r}"
            ) from None
        object.__setattr__(self, "out_layout", layout)
        if isinstance(out, Precision):
            if out.encoding is Encoding.BINARY:
                raise ValueError("Epilogue.out cannot be binary: requantize to unsigned or signed")
            if layout is Layout.PACKED and out.bits not in PACKABLE_BITS:
                raise ValueError(
                    f"Epilogue.out_layout 'packed' needs out bits in {PACKABLE_BITS}, "
                    f"got {out.bits}"
                )
        elif layout is not Layout.INT8:
            raise ValueError(
                f"Epilogue.out_layout must be 'int8' (plain) for {out} output, got {layout.value}"
            )

    @property
    def requantizes(self) -> bool:
        return isinstance(self.out, Precision)

    @property
    def key(self) -> str:
        """Canonical string, e.g. 'bias+relu->u2/bitplane' or 'int32'."""
        parts = [p for p, on in (("bias", self.bias), ("relu", self.relu)) if on]
        out = str(self.out)
        if self.requantizes:
            out += f"/{self.out_layout.value}"
        return "+".join(parts) + ("->" if parts else "") + out

    def to_dict(self) -> dict:
        return {"bias": self.bias, "relu": self.relu, "out": str(self.out),
                "out_layout": self.out_layout.value}

    @classmethod
    def from_dict(cls, d: dict) -> Epilogue:
        return cls(bias=d.get("bias", False), relu=d.get("relu", False),
                   out=d.get("out", OUT_INT32), out_layout=d.get("out_layout", "int8"))


@dataclass(frozen=True, eq=False)
class EpilogueParams:
    """Run-time per-output-channel vectors of an Epilogue (all length K, contiguous, on the
    kernel's device): bias int32; scale float32 (fp16 output); multiplier and shift int32
    (requantized output). Fields the epilogue does not use are None."""

    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    multiplier: torch.Tensor | None = None
    shift: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> EpilogueParams:
        return EpilogueParams(*(None if t is None else t.to(device) for t in
                                (self.bias, self.scale, self.multiplier, self.shift)))
