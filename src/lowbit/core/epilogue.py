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

The block-end form (`requant32`, shifted_bias required): every vector int32 and the residual,
if any, narrow (a `Precision` of <= 8 bits, not binary, stored one value per byte: uint8 for
unsigned, int8 for signed, the output's logical shape [..., K]):
  z     = acc * m[k] + b[k] + res * r[k] + 2^(s[k]-1)          (int32 arithmetic)
  q_mid = clamp(z >> s[k], lo, qmax)           (m in [0, 2^31), s in 1..31, lo as above)
where |acc|max m + |b| + |res|max |r| + 2^(s-1) < 2^31 per channel for the workload's bounds
(`validate.check_params`; kernels then use plain 32-bit multiply-adds). With `sum64` the same
formula in 64-bit arithmetic, for multipliers of 31 significant bits (the model's own
arithmetic; the 32-bit sum leaves them 12-16 and rounds values near a tie differently): m in
[0, 2^31) int32, s in 1..62 int32, b and r int64 with |b|, |r| < 2^62, and
|acc|max m + |b| + |res|max |r| + 2^(s-1) < 2^min(63, 31 + s) (every z >> s an int32: the
kernels form z with wide multiply-adds and take its bits s .. s + 31 by a funnel shift).
`guarded` (with `sum64`: the same params and q_mid) lets a kernel form a 32-bit approximation
of z and redo in 64 bits only the sums near a rounding step. q_mid is the stored
output (unless `store_out=False`) and feeds up to MAX_DERIVED derived outputs, each a
(precision P_j, layout L_j) pair with one int32 threshold vector T_j of P_j.qmax - P_j.qmin
non-decreasing entries (EpilogueParams.thresholds, per tensor, not per channel):
  q_j = P_j.qmin + #{i : q_mid >= T_j[i]}
stored in L_j (EpilogueParams.derived_out). Kernels run the thresholds of <= 3 levels as
compares and wider ones through a byte table of q_mid built from them at bind (the same
values). With store_out=False the mid value is not stored: the workload's output storage is
empty (shape (0,)), a kernel's `out` argument is None or any tensor, never written, and
out_layout stays 'int8' (keys stay unique). requant32 takes a narrow residual only (a
WidePrecision keeps the 64-bit path); derived outputs need a requantized `out` (the reference
runs them after any requantization; the kernels after requant32 only, in the int8 or bitplane
layout). Kernels without the block-end epilogue refuse it (`kernels.base.block_end_refusal`).
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
#: most derived outputs one epilogue writes
MAX_DERIVED = 2
#: the 32-bit requantization's bounds: every partial sum below 2^31, shifts 1..31
REQUANT32_LIMIT = 2**31
REQUANT32_MAX_SHIFT = 31
#: the 64-bit block end's shifts (Epilogue.sum64): 1..62
SUM64_MAX_SHIFT = 62

DerivedOutput = tuple[Precision, Layout]


def _bool_fields(obj: object, names: tuple[str, ...]) -> None:
    for f in names:
        if not isinstance(getattr(obj, f), bool):
            raise TypeError(f"Epilogue.{f} must be a bool, got {getattr(obj, f)!r}")


def _layout(value: object, what: str) -> Layout:
    try:
        return Layout(value)
    except ValueError:
        allowed = ", ".join(x.value for x in Layout)
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}") from None


def _stored_precision(prec: Precision, layout: Layout, what: str, layout_what: str) -> None:
    """A requantized output's precision in a layout: not binary, PACKED widths only."""
    if prec.encoding is Encoding.BINARY:
        raise ValueError(f"{what} cannot be binary: requantize to unsigned or signed")
    if layout is Layout.PACKED and prec.bits not in PACKABLE_BITS:
        raise ValueError(f"{layout_what} 'packed' needs bits in {PACKABLE_BITS}, got "
                         f"{prec.bits}")


def _derived_outputs(value: object) -> tuple[DerivedOutput, ...]:
    """Epilogue.derived as a tuple of (Precision, Layout) pairs (names accepted)."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"Epilogue.derived must be a tuple of (precision, layout) pairs, got "
                        f"{value!r}")
    if len(value) > MAX_DERIVED:
        raise ValueError(f"Epilogue.derived holds at most {MAX_DERIVED} outputs, got "
                         f"{len(value)}")
    out = []
    for j, pair in enumerate(value):
        what = f"Epilogue.derived[{j}]"
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"{what} must be a (precision, layout) pair, got {pair!r}")
        prec, layout = pair
        if isinstance(prec, str):
            prec = Precision.parse(prec)
        if not isinstance(prec, Precision):
            raise TypeError(f"{what}'s precision must be a Precision (<= 8 bits) or its "
                            f"name, got {prec!r}")
        layout = _layout(layout, f"{what}'s layout")
        _stored_precision(prec, layout, what, f"{what}'s layout")
        out.append((prec, layout))
    return tuple(out)


@dataclass(frozen=True)
class Epilogue:
    """Structure of the fused epilogue; the per-channel vectors are run-time arguments.
    The block-end fields (module docstring): `residual` a narrow Precision with `requant32`,
    `derived` outputs computed from the requantized value by thresholds, `store_out=False`
    to write the derived outputs only, `sum64` (with `requant32`) the block end's sum in
    64-bit arithmetic, `guarded` (with `sum64`) the same exact result by a 32-bit sum whose
    outputs near a rounding step are redone in 64 bits (the kernel's column tables,
    `bitserial_tables.guarded_columns`; the params stay sum64's). Defaults leave every
    earlier epilogue's key and dict unchanged."""

    bias: bool = False
    relu: bool = False
    out: str | Precision = OUT_INT32
    out_layout: Layout = Layout.INT8
    shifted_bias: bool = False
    residual: WidePrecision | Precision | None = None
    requant32: bool = False
    derived: tuple[DerivedOutput, ...] = ()
    store_out: bool = True
    sum64: bool = False
    guarded: bool = False

    def __post_init__(self) -> None:
        _bool_fields(self, ("bias", "relu", "shifted_bias", "requant32", "store_out", "sum64",
                            "guarded"))
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
        layout = _layout(self.out_layout, "Epilogue.out_layout")
        object.__setattr__(self, "out_layout", layout)
        if isinstance(out, Precision):
            _stored_precision(out, layout, "Epilogue.out", "Epilogue.out_layout")
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
        self._check_residual()
        if self.requant32 and not self.shifted_bias:
            raise ValueError("Epilogue.requant32 needs shifted_bias=True (its bias is at the "
                             "output's shift) and a requantized output")
        if self.sum64 and not self.requant32:
            raise ValueError("Epilogue.sum64 is the block-end form's 64-bit sum: set "
                             "requant32=True with it")
        if self.guarded and not self.sum64:
            raise ValueError("Epilogue.guarded is the exact 64-bit block end (sum64) run as "
                             "a 32-bit sum with a guarded 64-bit redo: set sum64=True with it")
        derived = _derived_outputs(self.derived)
        object.__setattr__(self, "derived", derived)
        if derived and not isinstance(out, Precision):
            raise ValueError(f"Epilogue.derived needs a requantized output (a Precision, the "
                             f"value the thresholds read), got out={out}")
        if not self.store_out:
            if not derived:
                raise ValueError("Epilogue.store_out=False needs derived outputs (otherwise "
                                 "the epilogue writes nothing)")
            if layout is not Layout.INT8:
                raise ValueError("Epilogue.out_layout is unused with store_out=False: leave "
                                 "it 'int8'")

    def _check_residual(self) -> None:
        res = self.residual
        if res is None:
            return
        if isinstance(res, WidePrecision):
            if self.requant32:
                raise ValueError(f"Epilogue.requant32 takes a narrow residual (a Precision of "
                                 f"<= 8 bits), got the wide {res}: use requant32=False (the "
                                 f"64-bit path)")
        elif isinstance(res, Precision):
            if res.encoding is Encoding.BINARY:
                raise ValueError("Epilogue.residual cannot be binary: a residual stream is "
                                 "unsigned or signed")
            if not self.requant32:
                raise ValueError(f"Epilogue.residual {res} (narrow, <= 8 bits) needs "
                                 f"requant32=True: the 32-bit path adds it")
        else:
            raise TypeError(f"Epilogue.residual must be a WidePrecision, a Precision (narrow, "
                            f"with requant32) or None, got {res!r}")
        if not self.shifted_bias:
            raise ValueError("Epilogue.residual needs shifted_bias=True (the residual "
                             "term is added at the output's shift, like the bias)")

    @property
    def requantizes(self) -> bool:
        return isinstance(self.out, Precision)

    @property
    def narrow_residual(self) -> Precision | None:
        """The residual when it is narrow (a Precision, one byte per value), else None."""
        return self.residual if isinstance(self.residual, Precision) else None

    @property
    def mid_range(self) -> tuple[int, int]:
        """(lo, hi) of the requantized value (what derived outputs' thresholds read):
        (max(qmin, 0) with relu, else qmin; qmax)."""
        if not self.requantizes:
            raise ValueError(f"Epilogue.mid_range needs a requantized output, got {self.out}")
        return (max(self.out.qmin, 0) if self.relu else self.out.qmin), self.out.qmax

    @property
    def key(self) -> str:
        """Canonical string, e.g. 'bias+relu->u2/bitplane', 'sbias+relu->u2/bitplane'
        (shifted bias), 'sbias+res24->u2/bitplane' (with a 24-bit residual), 'int32', or the
        block-end forms 'sbias+res8+relu->u8/int8+u2/bitplane' (a narrow s8 residual: 'res8',
        u8: 'resu8'; the 32-bit path implied, 'r32' spelled where no narrow residual says it;
        's64' for the 64-bit sum, 'g' after it for the guarded form; derived outputs after the
        mid one, which reads '(u8)' when it is not stored)."""
        res = self.residual
        if res is None:
            res_part = ""
        elif isinstance(res, Precision):
            res_part = f"res{res.bits}" if res.encoding is Encoding.SIGNED else f"res{res}"
        else:
            res_part = f"res{res.bits}"
        r32 = self.requant32 and not isinstance(res, Precision)
        parts = [p for p, on in (("bias", self.bias), ("sbias", self.shifted_bias),
                                 ("r32", r32), (res_part, bool(res_part)),
                                 ("s64", self.sum64), ("g", self.guarded),
                                 ("relu", self.relu)) if on]
        out = str(self.out)
        if not self.store_out:
            out = f"({out})"
        elif self.requantizes:
            out += f"/{self.out_layout.value}"
        out += "".join(f"+{p}/{lay.value}" for p, lay in self.derived)
        return "+".join(parts) + ("->" if parts else "") + out

    def to_dict(self) -> dict:
        """JSON-able fields; "shifted_bias", "residual" (a wide one's bits, a narrow one's
        name), "requant32", "sum64", "guarded", "derived" and "store_out" only when set, so
        the dicts (and workload keys) of every other epilogue stay what they were."""
        d = {"bias": self.bias, "relu": self.relu, "out": str(self.out),
             "out_layout": self.out_layout.value}
        if self.shifted_bias:
            d["shifted_bias"] = True
        if isinstance(self.residual, WidePrecision):
            d["residual"] = self.residual.bits
        elif self.residual is not None:
            d["residual"] = str(self.residual)
        if self.requant32:
            d["requant32"] = True
        if self.sum64:
            d["sum64"] = True
        if self.guarded:
            d["guarded"] = True
        if self.derived:
            d["derived"] = [[str(p), lay.value] for p, lay in self.derived]
        if not self.store_out:
            d["store_out"] = False
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Epilogue:
        res = d.get("residual")
        if isinstance(res, str):
            res = Precision.parse(res)
        elif res is not None:
            res = WidePrecision(int(res))
        return cls(bias=d.get("bias", False), relu=d.get("relu", False),
                   out=d.get("out", OUT_INT32), out_layout=d.get("out_layout", "int8"),
                   shifted_bias=d.get("shifted_bias", False), residual=res,
                   requant32=d.get("requant32", False),
                   derived=tuple(tuple(p) for p in d.get("derived", ())),
                   store_out=d.get("store_out", True), sum64=d.get("sum64", False),
                   guarded=d.get("guarded", False))


@dataclass(frozen=True, eq=False)
class EpilogueParams:
    """Run-time per-output-channel vectors of an Epilogue (all length K, contiguous, on the
    kernel's device): bias int32; scale float32 (fp16 output); multiplier and shift int32
    (requantized output; the multiplier int64 with a wide Epilogue.residual); shifted_bias int64
    (Epilogue.shifted_bias: units of 2^-shift output steps; int32 with requant32, int64 again
    with sum64); with Epilogue.residual the residual tensor (the output's logical shape [...,
    K], contiguous, the residual precision's storage dtype: int16 / int32 wide, uint8 / int8
    narrow) and its multiplier [K] (int64; int32 with requant32, int64 with sum64). With
    Epilogue.derived: thresholds, one int32 vector [P_j.qmax - P_j.qmin] per derived output
    (non-decreasing), and derived_out, their storage buffers (each the derived output's storage
    shape and dtype; kernels need them, the reference fills them when given). Fields the
    epilogue does not use are None / ()."""

    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    multiplier: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    shifted_bias: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    residual_multiplier: torch.Tensor | None = None
    thresholds: tuple[torch.Tensor, ...] = ()
    derived_out: tuple[torch.Tensor, ...] = ()

    def to(self, device: torch.device | str) -> EpilogueParams:
        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return EpilogueParams(
            *(moved(t) for t in (self.bias, self.scale, self.multiplier, self.shift,
                                 self.shifted_bias, self.residual, self.residual_multiplier)),
            thresholds=tuple(moved(t) for t in self.thresholds),
            derived_out=tuple(moved(t) for t in self.derived_out))


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
    k (int32 with Epilogue.requant32 but not sum64; on `device` when given) with |b| < 2^62, and
    params.bias is unset (TypeError / ValueError naming what is wrong). Reads the vector: a
    device sync on CUDA. No-op otherwise."""
    if not epilogue.shifted_bias:
        return
    b = params.shifted_bias
    dtype = torch.int32 if epilogue.requant32 and not epilogue.sum64 else torch.int64
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"params.shifted_bias must be a torch.Tensor of {dtype} for "
                        f"epilogue {epilogue.key}, got {b!r}")
    if b.dtype != dtype or tuple(b.shape) != (k,) or not b.is_contiguous():
        raise ValueError(f"params.shifted_bias must be a contiguous {dtype} vector of "
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
    too. A narrow residual (requant32) is `validate.check_block_end`'s."""
    prec = epilogue.residual
    if prec is None:
        if params.residual is not None or params.residual_multiplier is not None:
            raise ValueError(f"params.residual / residual_multiplier given to epilogue "
                             f"{epilogue.key}, which has no residual")
        return
    if not isinstance(prec, WidePrecision):
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
