"""Exact epilogue semantics (see `lowbit.core.epilogue` for the formulas)."""

from __future__ import annotations

import torch

from ..core import OUT_FP16, Epilogue
from ..core.epilogue import (
    ACCUMULATOR_OUTPUTS,
    REQUANT32_LIMIT,
    REQUANT32_MAX_SHIFT,
    SUM64_MAX_SHIFT,
    WIDE_MULTIPLIER_LIMIT,
    EpilogueParams,
    check_residual,
    check_shifted_bias,
)
from ..core.layout import Layout
from ..core.validate import block_end_sum_limit, check_block_end, storage_dtype
from ..quant.packing import pack
from .netops import round_shift_sum

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def requantize(y: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor,
               qmin: int, qmax: int) -> torch.Tensor:
    """clamp((y * m + 2^(s-1)) >> s, qmin, qmax), exact (round half up) for |y| < 2^32 (an
    int32 accumulator plus an int32 bias), m < 2^31, 1 <= s <= 62. The rounding term is added to
    the low s bits of y * m alone: y * m + 2^(s-1) itself can pass 2^63 there."""
    m, s = multiplier.to(torch.int64), shift.to(torch.int64)
    q = y * m
    low = q & ((1 << s) - 1)
    return ((q >> s) + ((low + (1 << (s - 1))) >> s)).clamp(qmin, qmax)


#: |accumulator| bound of the shifted-bias requantization (acc * multiplier stays in int64)
SHIFTED_ACC_LIMIT = 2**32
MULTIPLIER_LIMIT = 2**31


def _int_vector(name: str, t: object, k: int, lo: int, hi: int) -> torch.Tensor:
    """params.<name> as int64 [k], every entry in [lo, hi] (TypeError / ValueError else)."""
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"params.{name} must be an integer torch.Tensor, got {t!r}")
    if tuple(t.shape) != (k,):
        raise ValueError(f"params.{name} must have shape ({k},), got {tuple(t.shape)}")
    v = t.to(torch.int64)
    if v.numel() and (int(v.min()) < lo or int(v.max()) > hi):
        raise ValueError(f"params.{name} must lie in [{lo}, {hi}], got "
                         f"[{int(v.min())}, {int(v.max())}]")
    return v


def shifted_requantize(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams
                       ) -> torch.Tensor:
    """Epilogue.shifted_bias's requantization of int accumulators [..., K] (int64 values):
    clamp(floor((acc m + b [+ res r] + 2^(s-1)) / 2^s), lo, qmax), lo = max(qmin, 0) with relu,
    exact (`netops.round_shift_sum`: the sum may pass int64) for |acc| < 2^32, m in [0, 2^31),
    s in 1..62, |b| < 2^62; with Epilogue.residual (res: params.residual, the accumulators'
    shape) m in [0, 2^62), |r| < 2^62 and each product acc m, res r inside int64 (ValueError /
    TypeError outside)."""
    out = epilogue.out
    k = acc.shape[-1]
    check_shifted_bias(epilogue, params, k)
    check_residual(epilogue, params, tuple(acc.shape), values=True)
    wide = epilogue.residual is not None
    m = _int_vector("multiplier", params.multiplier, k, 0,
                    (WIDE_MULTIPLIER_LIMIT if wide else MULTIPLIER_LIMIT) - 1)
    s = _int_vector("shift", params.shift, k, 1, 62)
    y = acc.to(torch.int64)
    top = int(y.abs().max()) if y.numel() else 0
    if top >= SHIFTED_ACC_LIMIT:
        raise ValueError("the accumulator leaves the shifted-bias epilogue's range +-2^32")
    b = params.shifted_bias.to(torch.int64)
    terms = [_exact_product(y, m, top, "acc * multiplier"), b.expand_as(y)]
    if wide:
        res = params.residual.to(torch.int64)
        top_res = int(res.abs().max()) if res.numel() else 0
        terms.append(_exact_product(res, params.residual_multiplier, top_res,
                                    "residual * residual_multiplier"))
    q = round_shift_sum(terms, s.expand_as(y))
    lo = max(out.qmin, 0) if epilogue.relu else out.qmin
    return q.clamp(lo, out.qmax)


def _exact_product(v: torch.Tensor, mult: torch.Tensor, top: int, what: str) -> torch.Tensor:
    """v * mult (int64 [..., K] times [K]) after checking max|v| max|mult| < 2^63 (exact
    Python integers; ValueError naming `what` else)."""
    mult = mult.to(torch.int64)
    top_m = int(mult.abs().max()) if mult.numel() else 0
    if top * top_m >= 2**63:
        raise ValueError(f"{what} can leave int64 (max|v| {top}, max|multiplier| {top_m})")
    return v * mult


def shifted_bias_from(bias: torch.Tensor, multiplier: torch.Tensor, shift: torch.Tensor,
                      generator: torch.Generator) -> torch.Tensor:
    """Random int64 shifted biases for tests and timing: the accumulator-unit `bias` moved to
    the output's shift (bias * multiplier) plus a random fraction of an output step in
    (-1, 1), so outputs land on both sides of rounding boundaries (all vectors [K], CPU)."""
    m, s = multiplier.to(torch.int64), shift.to(torch.int64)
    frac = torch.randint(-(2**20), 2**20, m.shape, generator=generator)
    return bias.to(torch.int64) * m + ((frac << s) >> 20)


#: widest requantized output whose epilogue kernels may run as thresholds (2^bits - 1 compares)
THRESHOLD_MAX_BITS = 2


def requant_thresholds(epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor:
    """The requantizing epilogue as integer thresholds on the accumulator: bias, ReLU and
    requantization folded into L = qmax - qmin thresholds per channel (as XNOR-Net folds batch
    norm into the sign), int32 [K, L] on the CPU, such that for every accumulator y with
    |y| < 2^31 - 1

        requantize(relu(y + bias)) == qmin + #{k : y >= T[c, k]}.

    Exact: the multiplier is >= 1, so requantize is non-decreasing and
    requantize(y) >= v  <=>  y >= ceil((v * 2^s - 2^(s-1)) / m); ReLU makes a threshold <= 0
    always true. Thresholds past the int32 range clamp to it (always / never true).
    With Epilogue.shifted_bias the same for `shifted_requantize` (also non-decreasing in y):
    q >= v  <=>  (relu and v <= 0) or y >= ceil((v * 2^s - 2^(s-1) - b) / m), and with m = 0
    a constant: every threshold always or never true."""
    if not epilogue.requantizes:
        raise ValueError("requant_thresholds needs a requantizing epilogue")
    if epilogue.residual is not None:
        raise ValueError("requant_thresholds cannot fold a residual (a second variable): "
                         "residual epilogues run the multiply path")
    if epilogue.shifted_bias:
        return _shifted_thresholds(epilogue, params)
    out = epilogue.out
    mult, shift = params.multiplier.tolist(), params.shift.tolist()
    bias = params.bias.tolist() if epilogue.bias else [0] * len(mult)
    rows = []
    for m, sh, b in zip(mult, shift, bias, strict=True):
        row = []
        for v in range(out.qmin + 1, out.qmax + 1):
            t = -((-(v * 2**sh - 2 ** (sh - 1))) // m)  # ceil, in exact Python integers
            thr = INT32_MIN if epilogue.relu and t <= 0 else t - b
            row.append(min(max(thr, INT32_MIN), INT32_MAX))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32, device=params.multiplier.device).reshape(
        len(mult), out.qmax - out.qmin)


def _shifted_thresholds(epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor:
    out = epilogue.out
    k = params.multiplier.shape[0] if isinstance(params.multiplier, torch.Tensor) else 0
    check_shifted_bias(epilogue, params, k)
    mult = _int_vector("multiplier", params.multiplier, k, 0, MULTIPLIER_LIMIT - 1).tolist()
    shift = _int_vector("shift", params.shift, k, 1, 62).tolist()
    rows = []
    for m, sh, b in zip(mult, shift, params.shifted_bias.tolist(), strict=True):
        row = []
        for v in range(out.qmin + 1, out.qmax + 1):
            need = v * 2**sh - 2 ** (sh - 1) - b  # y m >= need
            if epilogue.relu and v <= 0:
                t = INT32_MIN
            elif m == 0:
                t = INT32_MIN if need <= 0 else INT32_MAX
            else:
                t = -(-need // m)  # ceil, in exact Python integers
            row.append(min(max(t, INT32_MIN), INT32_MAX))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int32, device=params.multiplier.device).reshape(
        k, out.qmax - out.qmin)


def requantize32(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams
                 ) -> torch.Tensor:
    """Epilogue.requant32's mid value of int accumulators [..., K] (int64 values):
    clamp((acc m + b + res r + 2^(s-1)) >> s, lo, qmax) (`core.epilogue`), exact in int64,
    after checking the params (`validate.check_block_end`, the residual's values included)
    and that every sum stays below 2^31 (with Epilogue.sum64: below 2^min(63, 31 + s),
    `validate.block_end_sum_limit`) for these accumulators and the residual precision's
    range (ValueError naming the first channel past it; the validator checks the workload's
    bound at bind)."""
    k = acc.shape[-1]
    check_shifted_bias(epilogue, params, k)
    check_residual(epilogue, params, tuple(acc.shape))
    check_block_end(epilogue, params, tuple(acc.shape), values=True)
    for name in ("multiplier", "shift"):
        t = getattr(params, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (k,):
            raise TypeError(f"params.{name} must be an int32 vector of length {k} (requant32), "
                            f"got {t!r}")
    m = _int_vector("multiplier", params.multiplier, k, 0, REQUANT32_LIMIT - 1)
    top_shift = SUM64_MAX_SHIFT if epilogue.sum64 else REQUANT32_MAX_SHIFT
    s = _int_vector("shift", params.shift, k, 1, top_shift)
    b = params.shifted_bias.to(torch.int64)
    y = acc.to(torch.int64)
    top = int(y.abs().max()) if y.numel() else 0
    res_prec = epilogue.narrow_residual
    r = (params.residual_multiplier.to(torch.int64) if res_prec is not None
         else torch.zeros(k, dtype=torch.int64, device=acc.device))
    top_res = max(-res_prec.qmin, res_prec.qmax) if res_prec is not None else 0
    cols = zip(m.tolist(), b.tolist(), r.tolist(), s.tolist(), strict=True)
    for c, (mc, bc, rc, sc) in enumerate(cols):  # exact Python integers: no int64 wrap
        limit = block_end_sum_limit(epilogue, sc)
        if top * mc + abs(bc) + top_res * abs(rc) + (1 << (sc - 1)) >= limit:
            raise ValueError(f"channel {c}: |acc| m + |b| + |res| |r| + 2^(s-1) reaches "
                             f"2^{limit.bit_length() - 1} (max|acc| {top}, m {mc}, b {bc}, "
                             f"r {rc}, s {sc}): outside the "
                             f"{'64' if epilogue.sum64 else '32'}-bit requantization")
    z = y * m + b + (1 << (s - 1))
    if res_prec is not None:
        z = z + params.residual.to(torch.int64) * r
    lo, hi = epilogue.mid_range
    return (z >> s).clamp(lo, hi)


def derived_values(q_mid: torch.Tensor, epilogue: Epilogue, params: EpilogueParams
                   ) -> list[torch.Tensor]:
    """Each derived output's values from the mid values (int64): P_j.qmin + #{i : q_mid >=
    T_j[i]}, T_j = params.thresholds[j] (non-decreasing: a sorted search counts them)."""
    out = []
    for (prec, _), thr in zip(epilogue.derived, params.thresholds, strict=True):
        t = thr.to(device=q_mid.device, dtype=torch.int64).contiguous()
        count = torch.searchsorted(t, q_mid.contiguous(), right=True)
        out.append(prec.qmin + count)
    return out


def apply_epilogue_outputs(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams
                           ) -> list[torch.Tensor]:
    """Every output of the epilogue on int64 accumulators [..., K], in storage: the mid
    output (unless Epilogue.store_out is False), then each derived output (Epilogue.derived)
    in its precision and layout."""
    if not epilogue.derived:
        return [apply_epilogue(acc, epilogue, params)]
    q = requantize32(acc, epilogue, params) if epilogue.requant32 else \
        shifted_requantize(acc, epilogue, params) if epilogue.shifted_bias else \
        _requantized(acc, epilogue, params)
    check_block_end(epilogue, params, tuple(acc.shape))
    outs = [pack(q, epilogue.out, epilogue.out_layout)] if epilogue.store_out else []
    outs += [pack(v, p, lay) for v, (p, lay) in
             zip(derived_values(q, epilogue, params), epilogue.derived, strict=True)]
    return outs


def _requantized(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams
                 ) -> torch.Tensor:
    """The accumulator-unit requantization's values (bias, ReLU, multiply, shift)."""
    y = acc.to(torch.int64)
    if epilogue.bias:
        y = y + params.bias.to(torch.int64)
    if epilogue.relu:
        y = y.clamp_min(0)
    return requantize(y, params.multiplier, params.shift, epilogue.out.qmin, epilogue.out.qmax)


def apply_epilogue(acc: torch.Tensor, epilogue: Epilogue, params: EpilogueParams) -> torch.Tensor:
    """int64 accumulators [..., K] -> the output in the epilogue's storage layout (an empty
    (0,) tensor with Epilogue.store_out=False); with derived outputs their values are
    written into params.derived_out where given (`apply_epilogue_outputs` returns them)."""
    if epilogue.derived:
        outs = apply_epilogue_outputs(acc, epilogue, params)
        derived = outs[1:] if epilogue.store_out else outs
        for buf, v in zip(params.derived_out, derived, strict=False):
            buf.copy_(v.to(buf.device))
        if epilogue.store_out:
            return outs[0]
        return torch.empty(0, dtype=storage_dtype(epilogue.out, Layout.INT8), device=acc.device)
    if epilogue.requant32:
        return pack(requantize32(acc, epilogue, params), epilogue.out, epilogue.out_layout)
    if epilogue.shifted_bias:
        q = shifted_requantize(acc, epilogue, params)
        return pack(q, epilogue.out, epilogue.out_layout)
    if epilogue.requantizes:
        return pack(_requantized(acc, epilogue, params), epilogue.out, epilogue.out_layout)
    y = acc.to(torch.int64)
    if epilogue.bias:
        y = y + params.bias.to(torch.int64)
    if epilogue.relu:
        y = y.clamp_min(0)
    if epilogue.out == OUT_FP16:
        return (y.to(torch.float32) * params.scale.to(torch.float32)).to(torch.float16)
    dtype = ACCUMULATOR_OUTPUTS[epilogue.out]
    lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    if y.numel() and (int(y.min()) < lo or int(y.max()) > hi):
        raise OverflowError(f"{epilogue.out} output overflows: the accumulator exceeds the "
                            f"{epilogue.out} range [{lo}, {hi}]")
    return y.to(dtype)
