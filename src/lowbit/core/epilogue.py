"""What happens to the int32 accumulator of a conv/GEMM before it is stored.

Order (exact integer semantics, see `lowbit.reference.epilogue`):
  y = acc + bias[k]                      (bias: int32 in accumulator units, optional)
  y = max(y, 0)                          (relu, optional)
  out = int32:  y
  out = int16:  y (bias=False: the bare accumulator, ReLU optional, for a kernel whose
                worst-case |accumulator| is below 2^15; the reference raises OverflowError
                where a value leaves int16, a kernel stores its low 16 bits)
  out = fp16:   fp16(float32(y) * scale[k])
  out = Precision p: clamp((y * multiplier[k] + 2^(shift[k]-1)) >> shift[k], p.qmin, p.qmax)
        i.e. fixed-point requantization with round-half-up, multiplier in [1, 2^31), shift in
        [1, 62], the int64 product exact. `lowbit.quant.fixed_point` turns a float scale into it.

With shifted_bias (requantized outputs only, instead of `bias`) the bias is an int64 per
channel in units of 2^-shift output steps, added after the multiply:
  out = clamp(floor((acc * multiplier[k] + shifted_bias[k] + 2^(shift[k]-1)) / 2^shift[k]),
              lo, p.qmax),   lo = max(p.qmin, 0) with relu, else p.qmin
exact for |acc| < 2^32, multiplier in [0, 2^31), shift in [1, 62], |shifted_bias| < 2^62 (the
engine's exact-bias requantization: a bias finer than one accumulator unit stays exact).

With residual (a `WidePrecision`, shifted_bias required) the epilogue also reads a wide
residual tensor res [..., K] (the output's logical shape, storage int16/int32 per the wide
precision) and adds it times an int64 per-channel multiplier r before the shift:
  out = clamp(floor((acc * m[k] + b[k] + res * r[k] + 2^(s[k]-1)) / 2^s[k]), lo, p.qmax)
with int64 multipliers m in [0, 2^62) and |r| < 2^62 (a residual's shared shift makes them
wide); the reference is exact wherever each product fits int64, a kernel where
|acc| m + |b| + |res| |r| + 2^(s-1) < 2^63 for the workload's bounds (`validate.check_params`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import PACKABLE_BITS, Layout
from .precision import Encoding, Precision, WidePrecision

OUT_INT32 = "int32"
OUT_INT16 = "int16"
OUT_FP16 = "fp16"
#: outputs of the accumulator itself (no requantization), with their storage dtypes
ACCUMULATOR_OUTPUTS = {OUT_INT32: torch.int32, OUT_INT16: torch.int16}


@dataclass(frozen=True)
class Epilogue:
    """Structure of the fused epilogue; the per-channel vectors are run-time arguments."""

    bias: bool = False
    relu: bool = False
    out: str | Precision = OUT_INT32
    out_layout: Layout = Layout.INT8
    shifted_bias: bool = False
    residual: WidePrecision | None = None

    def __post_init__(self) -> None:
        for f in ("bias", "relu", "shifted_bias"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"Epilogue.{f} must be a bool, got {getattr(self, f)!r}")
        out = self.out
        if isinstance(out, str) and out not in (OUT_INT32, OUT_INT16, OUT_FP16):
            out = Precision.parse(out)
        if not isinstance(out, (str, Precision)):
            raise TypeError(f"Epilogue.out must be 'int32', 'int16', 'fp16' or a Precision, "
                            f"got {out!r}")
        if out == OUT_INT16 and self.bias:
            raise ValueError("Epilogue.out 'int16' is the bare accumulator (ReLU optional): "
                             "set bias=False and add the bias where the output is read")
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
        if self.shifted_bias and not isinstance(out, Precision):
            raise ValueError(f"Epilogue.shifted_bias needs a requantized output (a Precision), "
                             f"got out={out}")
        if self.shifted_bias and self.bias:
            raise ValueError("Epilogue.shifted_bias replaces the accumulator-unit bias: set "
                             "bias=False with shifted_bias=True")
        if self.residual is not None:
            if not isinstance(self.residual, WidePrecision):
                raise TypeError(f"Epilogue.residual must be a WidePrecision or None, got "
                                f"{self.residual!r}")
            if not self.shifted_bias:
                raise ValueError("Epilogue.residual needs shifted_bias=True (the residual "
                                 "term is added at the output's shift, like the bias)")

    @property
    def requantizes(self) -> bool:
        return isinstance(self.out, Precision)

    @property
    def key(self) -> str:
        """Canonical string, e.g. 'bias+relu->u2/bitplane', 'sbias+relu->u2/bitplane'
        (shifted bias), 'sbias+res24->u2/bitplane' (with a 24-bit residual) or 'int32'."""
        res = f"res{self.residual.bits}" if self.residual is not None else ""
        parts = [p for p, on in (("bias", self.bias), ("sbias", self.shifted_bias),
                                 (res, bool(res)), ("relu", self.relu)) if on]
        out = str(self.out)
        if self.requantizes:
            out += f"/{self.out_layout.value}"
        return "+".join(parts) + ("->" if parts else "") + out

    def to_dict(self) -> dict:
        """JSON-able fields; "shifted_bias" and "residual" (its bits) only when set, so the
        dicts (and workload keys) of every other epilogue stay what they were."""
        d = {"bias": self.bias, "relu": self.relu, "out": str(self.out),
             "out_layout": self.out_layout.value}
        if self.shifted_bias:
            d["shifted_bias"] = True
        if self.residual is not None:
            d["residual"] = self.residual.bits
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Epilogue:
        return cls(bias=d.get("bias", False), relu=d.get("relu", False),
                   out=d.get("out", OUT_INT32), out_layout=d.get("out_layout", "int8"),
                   shifted_bias=d.get("shifted_bias", False),
                   residual=None if d.get("residual") is None
                   else WidePrecision(int(d["residual"])))


@dataclass(frozen=True, eq=False)
class EpilogueParams:
    """Run-time per-output-channel vectors of an Epilogue (all length K, contiguous, on the
    kernel's device): bias int32; scale float32 (fp16 output); multiplier and shift int32
    (requantized output; the multiplier int64 with Epilogue.residual); shifted_bias int64
    (Epilogue.shifted_bias: units of 2^-shift output steps); with Epilogue.residual the
    residual tensor (the output's logical shape [..., K], contiguous, the wide precision's
    storage dtype) and its int64 multiplier [K]. Fields the epilogue does not use are None."""

    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    multiplier: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    shifted_bias: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    residual_multiplier: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> EpilogueParams:
        return EpilogueParams(*(None if t is None else t.to(device) for t in
                                (self.bias, self.scale, self.multiplier, self.shift,
                                 self.shifted_bias, self.residual,
                                 self.residual_multiplier)))


#: |shifted_bias| bound: with |acc * multiplier| < 2^62 their sum stays inside int64
SHIFTED_BIAS_LIMIT = 2**62
#: bound of the int64 multipliers (|m|, |r|) of Epilogue.residual
WIDE_MULTIPLIER_LIMIT = 2**62


def bias_vector(epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor | None:
    """The vector a kernel reads through its one bias argument: the int64 shifted bias with
    Epilogue.shifted_bias, the int32 accumulator-unit bias with Epilogue.bias, else None."""
    if epilogue.shifted_bias:
        return params.shifted_bias
    return params.bias if epilogue.bias else None


def check_shifted_bias(epilogue: Epilogue, params: EpilogueParams, k: int,
                       device: torch.device | str | None = None) -> None:
    """With Epilogue.shifted_bias: params.shifted_bias is a contiguous int64 vector of length
    k (on `device` when given) with |b| < 2^62, and params.bias is unset (TypeError /
    ValueError naming what is wrong). Reads the vector: a device sync on CUDA. No-op
    otherwise."""
    if not epilogue.shifted_bias:
        return
    b = params.shifted_bias
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"params.shifted_bias must be a torch.Tensor of torch.int64 for "
                        f"epilogue {epilogue.key}, got {b!r}")
    if b.dtype != torch.int64 or tuple(b.shape) != (k,) or not b.is_contiguous():
        raise ValueError(f"params.shifted_bias must be a contiguous torch.int64 vector of "
                         f"length {k}, got {b.dtype} {tuple(b.shape)}")
    if device is not None and b.device != torch.device(device):
        raise ValueError(f"params.shifted_bias is on {b.device}, expected {device}")
    if params.bias is not None:
        raise ValueError("params.bias must be None with a shifted bias (the epilogue adds "
                         "params.shifted_bias, in units of 2^-shift output steps)")
    if b.numel() and (int(b.min()) <= -SHIFTED_BIAS_LIMIT or int(b.max()) >= SHIFTED_BIAS_LIMIT):
        raise ValueError("params.shifted_bias must lie in (-2^62, 2^62)")


def check_residual(epilogue: Epilogue, params: EpilogueParams, out_shape: tuple[int, ...],
                   device: torch.device | str | None = None, values: bool = False) -> None:
    """With Epilogue.residual: params.residual is a contiguous tensor of `out_shape` (the
    output's logical shape [..., K]) in the wide precision's storage dtype (with `values`,
    every value in its range: the reference's check; a kernel bound to a buffer that a
    previous layer fills checks no values, as it checks none of x), params.residual_multiplier
    a contiguous int64 [K] with |r| < 2^62, params.multiplier int64 [K] in [0, 2^62) (on
    `device` when given; TypeError / ValueError naming what is wrong). Reads the vectors: a
    device sync on CUDA. Params of a residual given to an epilogue without one are an error
    too."""
    prec = epilogue.residual
    if prec is None:
        if params.residual is not None or params.residual_multiplier is not None:
            raise ValueError(f"params.residual / residual_multiplier given to epilogue "
                             f"{epilogue.key}, which has no residual")
        return
    k = out_shape[-1]
    res, r, m = params.residual, params.residual_multiplier, params.multiplier
    for name, t in (("residual", res), ("residual_multiplier", r), ("multiplier", m)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"params.{name} must be a torch.Tensor for epilogue "
                            f"{epilogue.key}, got {t!r}")
        if device is not None and t.device != torch.device(device):
            raise ValueError(f"params.{name} is on {t.device}, expected {device}")
    if res.dtype != prec.storage_dtype or tuple(res.shape) != tuple(out_shape) or \
            not res.is_contiguous():
        raise ValueError(f"params.residual must be a contiguous {prec.storage_dtype} tensor of "
                         f"shape {tuple(out_shape)} ({prec}), got {res.dtype} "
                         f"{tuple(res.shape)}")
    if values and res.numel() and (int(res.min()) < prec.qmin or int(res.max()) > prec.qmax):
        raise ValueError(f"params.residual must lie in [{prec.qmin}, {prec.qmax}] ({prec})")
    for name, t, lo in (("residual_multiplier", r, -WIDE_MULTIPLIER_LIMIT + 1),
                        ("multiplier", m, 0)):
        if t.dtype != torch.int64 or tuple(t.shape) != (k,) or not t.is_contiguous():
            raise ValueError(f"params.{name} must be a contiguous torch.int64 vector of length "
                             f"{k} with a residual, got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < lo or int(t.max()) >= WIDE_MULTIPLIER_LIMIT):
            raise ValueError(f"params.{name} must lie in [{lo}, 2^62)")
