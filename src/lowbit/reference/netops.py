"""Exact integer network ops: the layer epilogue with a residual and several outputs, pooling,
requantization and the quantization of a float image. The oracle of the engine's GPU ops
(`lowbit.kernels.triton.netops`, `.stem`).

Tensors are logical integer values (any integer dtype in, int64 out), activations NHWC with
channels last ([..., C]); per-channel vectors have length C (or K). All ops are pure.

Formulas (s: shift in 1..62, round half up; `floor` is exact integer floor division):
  layer epilogue, output o, y = acc + bias[k]:
      z   = y * m_o[k] + b_o[k] + res[..., k] * r_o[k]   (b_o: the output's own bias in units
                                                          of 2^-s_o output steps, default 0;
                                                          residual term only where r_o is set)
      q_o = clamp(floor((z + 2^(s_o[k] - 1)) / 2^s_o[k]), lo, qmax),
      lo  = max(qmin, 0) if relu else qmin
    a derived output (a `mid` precision and a `table`): q_mid is the formula above clamped to
    mid's range (lo = max(mid.qmin, 0) with relu, mid.qmax), and the output is
    table[q_mid - mid.qmin]: any function of the mid value (a requantization to another
    scale, an activation), with values in the output's precision;
    int32 output: y (ReLU optional), OverflowError outside int32;
    float output: float32(scale[k] * y + offset[k]) with the product and the sum in float64.
  requantize_int:   the epilogue with acc = q, no bias and no residual.
  maxpool2d_int:    max over each window's valid (non-padding) elements.
  avgpool2d_int:    window sum with zero padding (count_include_pad=True; global = whole map),
                    then q = clamp(floor((sum * m + 2^(s-1)) / 2^s)) with m * 2^-s ~
                    s_in / (count * s_out) (`avgpool_multiplier`).
  table_mul_int:    out = table[(a - qmin_a) * n_b + (b - qmin_b)] (n_b = qmax_b - qmin_b + 1),
                    a of b's shape or [N, 1, 1, C] (broadcast over b's map): the product of
                    two quantized values as a table of every pair of them.
  quantize_float:   q = clamp(floor(x / scale + 0.5), qmin, qmax) in float32 (IEEE division;
                    binary: +1 for x >= 0 else -1), i.e. `lowbit.quant.quantize.quantize`.

Bounds (checked): |y| < 2^32, 0 <= m < 2^31, |r| < 2^31, |b| < 2^62, |res| <= 255. Then
|y * m| < 2^63 and |res * r| < 2^39, but their sum plus the rounding term can pass 2^63: each
term is split into its multiple of 2^s and its low s bits, and only the low parts are added
(after halving, so the sum stays below 2^62), which is exact for every s in 1..62.
32-bit requantization (`requant32_fits`): where |y|max m + |b| + |res|max |r| + 2^(s-1) < 2^31
on every channel, every partial sum of z + 2^(s-1) is an int32, so a kernel may compute the
formula with int32 multiply-adds and an arithmetic shift; `fixed_point_pair32` makes such
multipliers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core import Encoding, Precision
from ..quant.quantize import fixed_point
from ..quant.quantize import quantize as _quantize

#: bounds of the layer epilogue's inputs (module docstring)
Y_LIMIT = 2**32
MULT_LIMIT = 2**31
BIAS_LIMIT = 2**62
RESIDUAL_LIMIT = 255
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# ------------------------------------------------------------------------- input checks
def _int_tensor(name: str, t: object, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer values (an integer dtype), got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape "
                         f"{tuple(t.shape)}")
    return t.to(torch.int64)


def _vector(name: str, v: object, k: int, lo: int, hi: int) -> torch.Tensor:
    """A per-channel int64 vector of length k from an int or a 0-d / [k] integer tensor, with
    every value in [lo, hi]."""
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an int or an integer tensor, got a bool")
    if isinstance(v, int):
        v = torch.tensor(v, dtype=torch.int64)
    t = _int_tensor(name, v, min_dim=0).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,):
        raise ValueError(f"{name} must be a scalar or a vector of length {k}, got shape "
                         f"{tuple(t.shape)}")
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got [{int(t.min())}, {int(t.max())}]")
    return t.contiguous()


def _out_precision(name: str, p: object) -> Precision:
    if isinstance(p, str):
        p = Precision.parse(p)
    if not isinstance(p, Precision):
        raise TypeError(f"{name} must be a Precision (or a name like 'u4'), got {p!r}")
    if p.encoding is Encoding.BINARY:
        raise ValueError(f"{name} cannot be binary: requantize to unsigned or signed")
    return p


def _range_check(name: str, t: torch.Tensor, lo: int, hi: int) -> None:
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got [{int(t.min())}, "
                         f"{int(t.max())}]")


# ------------------------------------------------------------------------- fixed point
def fixed_point_pair(scale_a: torch.Tensor | float, scale_b: torch.Tensor | float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two per-channel scale vectors -> (m_a, m_b, shift), int64, with m_a * 2^-shift ~
    scale_a and m_b * 2^-shift ~ scale_b at one shared shift in 1..62 and both multipliers in
    [0, 2^31): the larger one as `lowbit.quant.quantize.fixed_point` makes it (in [2^30, 2^31)
    where the shift range allows, relative error <= 2^-31), the smaller one rounded half to
    even at the same shift (absolute error <= 2^-(shift+1)). Scalars broadcast.

    scale_a: float64-convertible, finite, > 0 (the accumulator's scale ratio).
    scale_b: finite, >= 0 (the residual's scale ratio; 0 drops the residual term).
    """
    a = torch.as_tensor(scale_a, dtype=torch.float64).reshape(-1)
    b = torch.as_tensor(scale_b, dtype=torch.float64).reshape(-1)
    if not bool(torch.isfinite(a).all()) or not bool((a > 0).all()):
        raise ValueError("scale_a must be finite and > 0")
    if not bool(torch.isfinite(b).all()) or not bool((b >= 0).all()):
        raise ValueError("scale_b must be finite and >= 0")
    try:
        a, b = torch.broadcast_tensors(a, b)
    except RuntimeError:
        raise ValueError(f"scale_a ({a.numel()}) and scale_b ({b.numel()}) must have the same "
                         "length or be scalars") from None
    top = torch.maximum(a, b)
    m_top, shift = fixed_point(top)
    m_top, shift = m_top.to(torch.int64), shift.to(torch.int64)
    scaled = torch.pow(2.0, shift.to(torch.float64))
    m_a = torch.where(a >= b, m_top, torch.round(a * scaled).to(torch.int64))
    m_b = torch.where(b > a, m_top, torch.round(b * scaled).to(torch.int64))
    return m_a, m_b, shift


def avgpool_multiplier(count: int, scale_in: float, scale_out: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """0-d int64 (m, s) with m * 2^-s ~ scale_in / (count * scale_out): the requantization of
    a sum of `count` values at scale_in to scale_out (`lowbit.quant.quantize.fixed_point`)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    for name, v in (("scale_in", scale_in), ("scale_out", scale_out)):
        if not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    m, s = fixed_point(torch.tensor([scale_in / (count * scale_out)], dtype=torch.float64))
    return m.to(torch.int64)[0], s.to(torch.int64)[0]


# ------------------------------------------------------------------------- layer epilogue
def derived_table(mid: object, table: object, precision: object
                  ) -> tuple[Precision | None, torch.Tensor | None]:
    """(mid, table) of a derived output, checked: both None, or mid a Precision (<= 8 bits,
    not binary; a name like 'u8' is parsed) and table an integer vector of length
    mid.qmax - mid.qmin + 1 (int64 on the CPU) with values in `precision`'s range
    [qmin, qmax]. ValueError / TypeError naming the argument otherwise."""
    if mid is None and table is None:
        return None, None
    if mid is None or table is None:
        raise ValueError("a derived output needs both mid (the precision of the value the "
                         "formula gives) and table (the output of each mid value)")
    mid = _out_precision("mid", mid)
    if isinstance(table, (list, tuple)):
        table = torch.tensor(table, dtype=torch.int64)
    t = _int_tensor("table", table).cpu()
    n = mid.qmax - mid.qmin + 1
    if tuple(t.shape) != (n,):
        raise ValueError(f"table must be a vector of length mid.qmax - mid.qmin + 1 = {n} (one "
                         f"entry per {mid} value), got shape {tuple(t.shape)}")
    _range_check("table", t, int(precision.qmin), int(precision.qmax))
    return mid, t.contiguous()


@dataclass(frozen=True, eq=False)
class RequantizedOutput:
    """One requantized realization of a layer's output (formula in the module docstring).

    multiplier, shift: [K] integer vectors (or ints), 0 <= multiplier < 2^31, shift in 1..62.
    residual_multiplier: [K] (or int), |r| < 2^31, sharing `shift`; None: no residual term.
    mid, table: a derived output (`derived_table`): the formula's value in `mid` looked up in
    `table` (length mid.qmax - mid.qmin + 1, values in `precision`); both None: the formula's
    value in `precision` itself.
    bias: [K] (or int) b, the output's own bias in units of 2^-shift output steps (|b| < 2^62);
    None: 0 (the layer's bias in accumulator units is `epilogue_outputs`' bias).
    """

    precision: Precision
    multiplier: torch.Tensor | int
    shift: torch.Tensor | int
    residual_multiplier: torch.Tensor | int | None = None
    relu: bool = False
    mid: Precision | None = None
    table: torch.Tensor | None = None
    bias: torch.Tensor | int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", _out_precision("precision", self.precision))
        if not isinstance(self.relu, bool):
            raise TypeError(f"relu must be a bool, got {self.relu!r}")
        mid, table = derived_table(self.mid, self.table, self.precision)
        object.__setattr__(self, "mid", mid)
        object.__setattr__(self, "table", table)

    @property
    def formula_precision(self) -> Precision:
        """The precision the formula clamps to: mid for a derived output, else precision."""
        return self.precision if self.mid is None else self.mid

    @property
    def low(self) -> int:
        """Lower clamp bound of the formula: max(qmin, 0) with ReLU (mid's for a derived
        output)."""
        p = self.formula_precision
        return max(p.qmin, 0) if self.relu else p.qmin

    @property
    def high(self) -> int:
        """Upper clamp bound of the formula: qmax (mid's for a derived output)."""
        return self.formula_precision.qmax


@dataclass(frozen=True, eq=False)
class Int32Output:
    """y = acc + bias as int32 (ReLU optional); OverflowError where it leaves int32."""

    relu: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.relu, bool):
            raise TypeError(f"relu must be a bool, got {self.relu!r}")


@dataclass(frozen=True, eq=False)
class FloatOutput:
    """float32(scale[k] * y + offset[k]), product and sum in float64 (y = acc + bias): the
    dequantized output (final logits; `lowbit.quant.convert.IntegerLayer`'s out_scale and
    out_bias with bias None)."""

    scale: torch.Tensor
    offset: torch.Tensor | None = None


LayerOutput = RequantizedOutput | Int32Output | FloatOutput


def _float_vector(name: str, v: object, k: int) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float64).cpu()
    if t.dim() == 0:
        t = t.expand(k)
    if tuple(t.shape) != (k,):
        raise ValueError(f"{name} must be a scalar or a vector of length {k}, got shape "
                         f"{tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite")
    return t


def round_shift_sum(terms: list[torch.Tensor], shift: torch.Tensor) -> torch.Tensor:
    """floor((sum(terms) + 2^(shift-1)) / 2^shift), exact for int64 terms and shift in 1..62
    even where the sum passes int64: high parts (t >> s) are summed as they are, the low s bits
    of each term halved first (module docstring). Sums of up to 4 terms."""
    s = shift.to(torch.int64)
    mask = (torch.ones_like(s) << s) - 1
    high = sum(t >> s for t in terms)
    lows = [t & mask for t in terms]
    half = sum(lo >> 1 for lo in lows) + (sum(lo & 1 for lo in lows) >> 1)  # floor(X / 2)
    odd = sum(lo & 1 for lo in lows) & 1
    wide = (half + (torch.ones_like(s) << (s - 2).clamp_min(0))) >> (s - 1)
    return high + torch.where(s >= 2, wide, half + odd)


def _requantized(y: torch.Tensor, res: torch.Tensor | None, out: RequantizedOutput
                 ) -> torch.Tensor:
    k = y.shape[-1]
    m = _vector("multiplier", out.multiplier, k, 0, MULT_LIMIT - 1).to(y.device)
    s = _vector("shift", out.shift, k, 1, 62).to(y.device)
    terms = [y * m]
    if out.bias is not None:
        terms.append(_vector("bias", out.bias, k, -(BIAS_LIMIT - 1), BIAS_LIMIT - 1)
                     .to(y.device).expand_as(y))
    if out.residual_multiplier is not None:
        if res is None:
            raise ValueError("an output has a residual_multiplier but no residual was given")
        r = _vector("residual_multiplier", out.residual_multiplier, k, -(MULT_LIMIT - 1),
                    MULT_LIMIT - 1).to(y.device)
        terms.append(res * r)
    q = round_shift_sum(terms, s).clamp(out.low, out.high)
    if out.table is not None:
        q = out.table.to(y.device)[q - out.mid.qmin]
    return q


def requant32_fits(multiplier: torch.Tensor | int, shift: torch.Tensor | int,
                   bias: torch.Tensor | int | None, residual_multiplier: torch.Tensor | int | None,
                   acc_bound: int, res_bound: int = 0) -> bool:
    """Whether the requantization floor((y m + b + res r + 2^(s-1)) / 2^s) runs in 32-bit
    arithmetic for |y| <= acc_bound and |res| <= res_bound: acc_bound |m| + |b| +
    res_bound |r| + 2^(s-1) < 2^31 on every channel (exact Python integers; None: the term
    is absent). Vectors [K] or ints (broadcast)."""
    vecs = [torch.as_tensor(0 if v is None else v).to(torch.int64).reshape(-1).cpu()
            for v in (multiplier, shift, bias, residual_multiplier)]
    try:
        m, s, b, r = (v.tolist() for v in torch.broadcast_tensors(*vecs))
    except RuntimeError:
        raise ValueError("multiplier, shift, bias and residual_multiplier must have one "
                         "length (or be scalars)") from None
    if min(s) < 1 or max(s) > 62:
        raise ValueError("shift must lie in 1..62")
    return all(acc_bound * abs(mi) + abs(bi) + res_bound * abs(ri) + (1 << (si - 1)) < 2**31
               for mi, si, bi, ri in zip(m, s, b, r, strict=True))


def fixed_point_pair32(scale_a: torch.Tensor | float, scale_b: torch.Tensor | float,
                       acc_bound: int, res_bound: int = 0,
                       bias_steps: torch.Tensor | float = 0.0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m_a, m_b, shift) int64 [K] for the 32-bit requantization: per channel the largest
    shift in 1..31 with m_a = round(scale_a 2^s), m_b = round(scale_b 2^s) (half to even) and
    acc_bound m_a + |bias_steps| 2^s + res_bound m_b + 2^(s-1) < 2^31 (`requant32_fits` for a
    bias b = round(bias_steps 2^s) of |bias_steps| output steps, rounded up). scale_a > 0,
    scale_b >= 0, bias_steps finite; scalars broadcast. ValueError naming the channel where
    even shift 1 does not fit (the output's range itself passes int32)."""
    for name, v, lo in (("acc_bound", acc_bound, 1), ("res_bound", res_bound, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    vals = [torch.as_tensor(v, dtype=torch.float64).reshape(-1).cpu()
            for v in (scale_a, scale_b, bias_steps)]
    if not bool(torch.isfinite(vals[0]).all()) or not bool((vals[0] > 0).all()):
        raise ValueError("scale_a must be finite and > 0")
    if not bool(torch.isfinite(vals[1]).all()) or not bool((vals[1] >= 0).all()):
        raise ValueError("scale_b must be finite and >= 0")
    if not bool(torch.isfinite(vals[2]).all()):
        raise ValueError("bias_steps must be finite")
    try:
        a, b, c = torch.broadcast_tensors(*vals)
    except RuntimeError:
        raise ValueError("scale_a, scale_b and bias_steps must have one length (or be "
                         "scalars)") from None
    out = []
    for ch, (ai, bi, ci) in enumerate(zip(a.tolist(), b.tolist(), c.abs().tolist(),
                                          strict=True)):
        for s in range(31, 0, -1):
            ma, mb = round(ai * 2.0**s), round(bi * 2.0**s)  # Python round: half to even
            if acc_bound * ma + math.ceil(ci * 2.0**s) + res_bound * mb + (1 << (s - 1)) < 2**31:
                out.append((ma, mb, s))
                break
        else:
            raise ValueError(f"channel {ch}: no shift in 1..31 keeps the requantization of "
                             f"|acc| <= {acc_bound} (scale {ai}) in int32")
    t = torch.tensor(out, dtype=torch.int64).reshape(-1, 3)
    return t[:, 0].contiguous(), t[:, 1].contiguous(), t[:, 2].contiguous()


def epilogue_outputs(acc: torch.Tensor, bias: torch.Tensor | None,
                     outputs: list[LayerOutput] | tuple[LayerOutput, ...],
                     residual: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The layer epilogue: int64 accumulators [..., K] (+ bias [K], + residual [..., K] values)
    -> one tensor per output spec, in order: int64 values (RequantizedOutput), int32
    (Int32Output) or float32 (FloatOutput). Formulas and bounds in the module docstring."""
    y = _int_tensor("acc", acc)
    k = y.shape[-1]
    if bias is not None:
        y = y + _vector("bias", bias, k, INT32_MIN, INT32_MAX).to(y.device)
    _range_check("acc + bias", y, -(Y_LIMIT - 1), Y_LIMIT - 1)
    res = None
    if residual is not None:
        res = _int_tensor("residual", residual)
        if res.shape != y.shape:
            raise ValueError(f"residual must have the accumulators' shape {tuple(y.shape)}, got "
                             f"{tuple(res.shape)}")
        res = res.to(y.device)
        _range_check("residual", res, -RESIDUAL_LIMIT, RESIDUAL_LIMIT)
    if not isinstance(outputs, (list, tuple)) or not outputs:
        raise ValueError("outputs must be a non-empty list of RequantizedOutput / Int32Output / "
                         "FloatOutput")
    results = []
    for i, out in enumerate(outputs):
        if isinstance(out, RequantizedOutput):
            results.append(_requantized(y, res, out))
        elif isinstance(out, Int32Output):
            v = y.clamp_min(0) if out.relu else y
            _range_check(f"outputs[{i}] (int32)", v, INT32_MIN, INT32_MAX)
            results.append(v.to(torch.int32))
        elif isinstance(out, FloatOutput):
            sc = _float_vector("scale", out.scale, k).to(y.device)
            off = torch.zeros_like(sc) if out.offset is None else \
                _float_vector("offset", out.offset, k).to(y.device)
            results.append((y.to(torch.float64) * sc + off).to(torch.float32))
        else:
            raise TypeError(f"outputs[{i}] must be a RequantizedOutput, Int32Output or "
                            f"FloatOutput, got {type(out).__name__}")
    return results


def requantize_int(q: torch.Tensor, multiplier: torch.Tensor | int, shift: torch.Tensor | int,
                   out: Precision | str, relu: bool = False) -> torch.Tensor:
    """Integer values [..., C] at one scale -> `out` at another (the epilogue with acc = q):
    clamp(floor((q * m + 2^(s-1)) / 2^s), lo, qmax); m, s scalars or [C] vectors."""
    spec = RequantizedOutput(out, multiplier, shift, relu=relu)
    return epilogue_outputs(q, None, [spec])[0]


# ------------------------------------------------------------------------- pooling
def pool_output_size(size: int, kernel: int, stride: int, pad: int, ceil: bool = False) -> int:
    """PyTorch's pooled size: floor((size + 2 pad - kernel) / stride) + 1, or with `ceil`
    (ceil_mode) the ceiling, less the last window where it would start past the input and its
    left padding (so every window holds an input element)."""
    span = size + 2 * pad - kernel
    n = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (n - 1) * stride >= size + pad:
        n -= 1
    return n


def pool_geometry(h: int, w: int, kernel: int, stride: int | None, pad: int,
                  ceil: bool = False) -> tuple[int, int, int]:
    """(stride, P, Q) of a kernel x kernel pool over an h x w map (`ceil`: ceil_mode) after
    checking the arguments (stride None: kernel; pad <= kernel // 2, as PyTorch requires; the
    window must fit); ValueError naming the argument otherwise."""
    stride = kernel if stride is None else stride
    for name, v, lo in (("kernel", kernel, 1), ("stride", stride, 1), ("pad", pad, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if pad > kernel // 2:
        raise ValueError(f"pad must be at most kernel // 2 = {kernel // 2}, got {pad}")
    if not isinstance(ceil, bool):
        raise TypeError(f"ceil must be a bool, got {type(ceil).__name__}")
    p = pool_output_size(h, kernel, stride, pad, ceil)
    q = pool_output_size(w, kernel, stride, pad, ceil)
    if p < 1 or q < 1:
        raise ValueError(f"kernel {kernel} (pad {pad}) does not fit the {h}x{w} map")
    return stride, p, q


def _pool_args(q: object, kernel: int, stride: int | None, pad: int, ceil: bool = False
               ) -> tuple[torch.Tensor, int, int, int, int, int]:
    x = _int_tensor("q", q, min_dim=0)
    if x.dim() != 4:
        raise ValueError(f"q must be NHWC [N, H, W, C], got shape {tuple(x.shape)}")
    stride, p, q_ = pool_geometry(x.shape[1], x.shape[2], kernel, stride, pad, ceil)
    return x, kernel, stride, pad, p, q_


def _windows(x: torch.Tensor, kernel: int, stride: int, pad: int, fill: int,
             out_hw: tuple[int, int] | None = None) -> torch.Tensor:
    """[N, H, W, C] -> [N, P, Q, C, kernel * kernel] windows, padding elements = fill
    (out_hw: P, Q past the floor size, ceil_mode's last windows padded on the far side)."""
    far = [0, 0] if out_hw is None else [
        max((o - 1) * stride + kernel - (size + 2 * pad), 0)
        for o, size in zip(out_hw, x.shape[1:3], strict=True)]
    xp = F.pad(x, (0, 0, pad, pad + far[1], pad, pad + far[0]), value=fill)
    win = xp.unfold(1, kernel, stride).unfold(2, kernel, stride)  # [N, P, Q, C, k, k]
    return win.reshape(*win.shape[:4], kernel * kernel)


def maxpool2d_int(q: torch.Tensor, kernel: int, stride: int | None = None,
                  pad: int = 0, ceil: bool = False) -> torch.Tensor:
    """Max over each kernel x kernel window's valid elements, NHWC [N, H, W, C] -> int64
    [N, P, Q, C] (PyTorch's output size, `ceil`: ceil_mode; stride defaults to kernel; pad <=
    kernel // 2)."""
    x, kernel, stride, pad, p, q_ = _pool_args(q, kernel, stride, pad, ceil)
    return _windows(x, kernel, stride, pad, torch.iinfo(torch.int64).min, (p, q_)).amax(-1)


def avgpool2d_int(q: torch.Tensor, kernel: int | None, stride: int | None, pad: int,
                  multiplier: torch.Tensor | int, shift: torch.Tensor | int,
                  out: Precision | str) -> torch.Tensor:
    """Average pool requantized to `out`: window sums (zero padding counted,
    count_include_pad=True), then clamp(floor((sum * m + 2^(s-1)) / 2^s), qmin, qmax) with
    m * 2^-s ~ s_in / (count * s_out) (`avgpool_multiplier`). kernel None: global pool over the
    whole H x W map (adaptive to 1x1). NHWC [N, H, W, C] -> int64 [N, P, Q, C]."""
    if kernel is None:
        x = _int_tensor("q", q, min_dim=0)
        if x.dim() != 4:
            raise ValueError(f"q must be NHWC [N, H, W, C], got shape {tuple(x.shape)}")
        sums = x.sum(dim=(1, 2), keepdim=True)
    else:
        x, kernel, stride, pad, _, _ = _pool_args(q, kernel, stride, pad)
        sums = _windows(x, kernel, stride, pad, 0).sum(-1)
    return requantize_int(sums, multiplier, shift, out)


# ------------------------------------------------------------------------- float input
def _float_scale(scale: object) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float64)
    if s.dim() != 0:
        raise ValueError(f"scale must be one number (a per-tensor scale), got shape "
                         f"{tuple(s.shape)}")
    s32 = s.to(torch.float32)
    if not bool(torch.isfinite(s32)) or not float(s32) > 0:
        raise ValueError(f"scale must be finite and > 0 in float32, got {float(s)!r}")
    return s32


def quantize_float(x: torch.Tensor, scale: float | torch.Tensor,
                   prec: Precision | str) -> torch.Tensor:
    """Float tensor (any shape) -> int64 values: clamp(floor(x / scale + 0.5), qmin, qmax)
    computed in float32 (x and scale rounded to float32 first; fp16/bf16 exactly), IEEE
    division, as `lowbit.quant.quantize.quantize`; binary: +1 for x >= 0 else -1.
    Non-finite x is a ValueError."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point torch.Tensor, got {got}")
    if isinstance(prec, str):
        prec = Precision.parse(prec)
    if not isinstance(prec, Precision):
        raise TypeError(f"prec must be a Precision, got {prec!r}")
    x32 = x.to(torch.float32)
    if not bool(torch.isfinite(x32).all()):
        raise ValueError("x has non-finite values (inf or nan in float32)")
    s = _float_scale(scale).to(x32.device)
    return _quantize(x32, s, prec).to(torch.int64)


def uint8_input_table(scale: float | torch.Tensor, prec: Precision | str,
                      mean: tuple[float, ...] | torch.Tensor,
                      std: tuple[float, ...] | torch.Tensor) -> torch.Tensor:
    """The quantized value of every uint8 pixel value per channel, int64 [C, 256]:
    quantize_float(((v / 255) - mean[c]) / std[c]) with every step in float32 (what
    torchvision's ToTensor then Normalize compute). A uint8 image quantizes exactly by lookup,
    q[n, c, h, w] = table[c, image[n, c, h, w]], whatever the normalization."""
    mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1)
    std_t = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1)
    if mean_t.shape != std_t.shape:
        raise ValueError(f"mean and std must have one value per channel, got {mean_t.numel()} "
                         f"and {std_t.numel()}")
    if not bool(torch.isfinite(mean_t).all()) or not bool((std_t > 0).all()):
        raise ValueError("mean must be finite and std finite and > 0")
    v = torch.arange(256, dtype=torch.float32).div(255).expand(mean_t.shape[0], 256)
    return quantize_float(v.sub(mean_t).div(std_t), scale, prec)


def table_mul_int(a: torch.Tensor, b: torch.Tensor, table: torch.Tensor, prec_a: object,
                  prec_b: object) -> torch.Tensor:
    """table[(a - qmin_a) * n_b + (b - qmin_b)] (module docstring), int64. a: b's shape or
    [N, 1, 1, C] with b [N, H, W, C]; table: int64 [n_a * n_b]."""
    pa, pb = _out_precision("prec_a", prec_a), _out_precision("prec_b", prec_b)
    a, b = _int_tensor("a", a), _int_tensor("b", b)
    t = _int_tensor("table", table)
    na, nb = pa.qmax - pa.qmin + 1, pb.qmax - pb.qmin + 1
    if tuple(t.shape) != (na * nb,):
        raise ValueError(f"table must be a vector of {na} x {nb} = {na * nb} entries (one per "
                         f"pair of {pa} and {pb} values), got shape {tuple(t.shape)}")
    if a.shape != b.shape and not (a.dim() == 4 and b.dim() == 4 and a.shape[1:3] == (1, 1)
                                   and (a.shape[0], a.shape[3]) == (b.shape[0], b.shape[3])):
        raise ValueError(f"a must have b's shape {tuple(b.shape)} or [N, 1, 1, C], got "
                         f"{tuple(a.shape)}")
    _range_check("a", a, pa.qmin, pa.qmax)
    _range_check("b", b, pb.qmin, pb.qmax)
    return t.to(a.device)[(a.to(torch.int64) - pa.qmin) * nb + (b.to(torch.int64) - pb.qmin)]
