"""The oracle: `run(workload, x, w, params)` on storage-format tensors, and random inputs."""

from __future__ import annotations

import math

import torch

from ..core import OUT_FP16, ConvWorkload, Encoding, Layout, Precision, Workload
from ..core.epilogue import EpilogueParams
from ..core.validate import (
    accumulator_limit,
    check_inputs,
    derived_storage,
    operand_shapes,
    storage_dtype,
)
from ..quant.packing import pack, unpack
from ..quant.quantize import fixed_point
from .epilogue import apply_epilogue, apply_epilogue_outputs, shifted_bias_from
from .integer import conv2d_int, gemm_int


def accumulate(wl: Workload, x_values: torch.Tensor, w_values: torch.Tensor) -> torch.Tensor:
    """Exact int64 accumulators of the workload's conv or GEMM on integer values."""
    if isinstance(wl, ConvWorkload):
        return conv2d_int(x_values, w_values, wl.stride, wl.pad, wl.groups)
    return gemm_int(x_values, w_values)


def _accumulators(wl: Workload, x: torch.Tensor, w: torch.Tensor,
                  params: EpilogueParams) -> torch.Tensor:
    check_inputs(wl, x, w, params)
    xs, ws, _ = operand_shapes(wl)
    xv = unpack(x, wl.a, wl.a_layout, xs[-1])
    wv = unpack(w, wl.w, wl.w_layout, ws[-1])
    return accumulate(wl, xv, wv)


def run(wl: Workload, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams) -> torch.Tensor:
    """The exact output (in the epilogue's storage layout) every kernel must reproduce; with
    derived outputs (Epilogue.derived) their values also go into params.derived_out where
    given (`run_outputs` returns every output)."""
    return apply_epilogue(_accumulators(wl, x, w, params), wl.epilogue, params)


def run_outputs(wl: Workload, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams
                ) -> list[torch.Tensor]:
    """Every output of the workload in storage, exact: the mid output unless
    Epilogue.store_out is False, then each derived output (`apply_epilogue_outputs`)."""
    return apply_epilogue_outputs(_accumulators(wl, x, w, params), wl.epilogue, params)


def random_values(shape: tuple[int, ...], prec: Precision,
                  generator: torch.Generator) -> torch.Tensor:
    """Uniform integers over prec's whole range (binary: -1/+1), int64, on the CPU."""
    if prec.encoding is Encoding.BINARY:
        return torch.randint(0, 2, shape, generator=generator, dtype=torch.int64) * 2 - 1
    return torch.randint(prec.qmin, prec.qmax + 1, shape, generator=generator, dtype=torch.int64)


def _moments(prec: Precision) -> tuple[float, float]:
    """Mean and variance of `random_values` for this precision."""
    if prec.encoding is Encoding.BINARY:
        return 0.0, 1.0
    n = prec.qmax - prec.qmin + 1
    return (prec.qmin + prec.qmax) / 2, (n * n - 1) / 12


def accumulator_stats(wl: Workload) -> tuple[float, float]:
    """Mean and standard deviation of one accumulator under `random_values` inputs."""
    terms = operand_shapes(wl)[1][1:]
    t = math.prod(terms)
    (mx, vx), (mw, vw) = _moments(wl.a), _moments(wl.w)
    return t * mx * mw, math.sqrt(t * (vx * vw + vx * mw * mw + vw * mx * mx))


def random_params(wl: Workload, generator: torch.Generator) -> EpilogueParams:
    """Epilogue vectors whose outputs spread over the output range (few all-clamped channels)."""
    k = operand_shapes(wl)[2][-1]
    epi = wl.epilogue
    mean, std = accumulator_stats(wl)
    jitter = 0.5 + torch.rand(k, generator=generator, dtype=torch.float64)
    bias, center = None, mean
    if epi.bias or epi.shifted_bias:
        # shift the accumulators to straddle 0, so ReLU keeps about half of them
        shift_by = -mean + std * (torch.rand(k, generator=generator, dtype=torch.float64) - 0.25)
        bias = shift_by.round().to(torch.int32)
        center = std / 4
    spread = abs(center) + 2.0 * std + 1.0
    scale = mult = shift = None
    if epi.requantizes:
        top = epi.out.qmax + (1 if epi.relu or epi.out.encoding is Encoding.UNSIGNED else 0)
        mult, shift = fixed_point(top / spread * jitter)
    elif epi.out == OUT_FP16:
        scale = (jitter / (std + 1.0)).to(torch.float32)
    if epi.requant32:
        return block_end_params(wl, top / spread * jitter, bias, generator)
    shifted = res = res_mult = None
    if epi.residual is not None:
        mult, shift, res_mult = _wide_multipliers(wl, mult, shift, generator)
        res = random_values(operand_shapes(wl)[2], epi.residual, generator).to(
            epi.residual.storage_dtype)
    if epi.shifted_bias:  # the same bias at the output's shift, plus a fraction of a step
        shifted, bias = shifted_bias_from(bias, mult, shift, generator), None
    return EpilogueParams(bias=bias, scale=scale, multiplier=mult, shift=shift,
                          shifted_bias=shifted, residual=res, residual_multiplier=res_mult,
                          **derived_params(wl, generator))


def _wide_multipliers(wl: Workload, mult: torch.Tensor, shift: torch.Tensor,
                      generator: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, s, r) of a residual epilogue: the int32 pair (mult, shift) moved to a wider shift
    (up to 20 bits more while |z| stays below 2^61 for the workload's bounds, as the planner's
    shared shift does) and a residual multiplier of either sign worth up to about half the
    output range over the residual's full range, all int64 [K]."""
    epi = wl.epilogue
    top_out = epi.out.qmax - epi.out.qmin + 1
    frac = torch.rand(mult.shape, generator=generator, dtype=torch.float64) - 0.5
    sign = torch.where(torch.rand(mult.shape, generator=generator) < 0.25, -1.0, 1.0)
    ms, ss, rs = [], [], []
    for m, s, f, g in zip(mult.tolist(), shift.tolist(), frac.tolist(), sign.tolist(),
                          strict=True):
        # the residual's worth in output steps per unit, at shift s
        r_ratio = g * top_out * (0.25 + abs(f)) / -epi.residual.qmin
        steps = accumulator_limit(wl) * m / 2**s + top_out * 2
        extra = max(0, min(20, 62 - s, 60 - math.ceil(math.log2(steps + 1)) - s))
        ms.append(m << extra)
        ss.append(s + extra)
        rs.append(round(r_ratio * 2 ** (s + extra)))
    return (torch.tensor(ms, dtype=torch.int64), torch.tensor(ss, dtype=torch.int32),
            torch.tensor(rs, dtype=torch.int64))


def block_end_params(wl: Workload, ratio: torch.Tensor, bias: torch.Tensor,
                     generator: torch.Generator) -> EpilogueParams:
    """Random requant32 params (int32 [K] vectors): about `ratio` output steps per
    accumulator unit, the accumulator-unit `bias` at the output's shift plus a fraction of a
    step, a residual multiplier of either sign worth a quarter to three quarters of the output
    range over the residual's range, at the largest shift (<= 31) whose worst-case sum stays
    below 2^30 (`validate.check_requant32_range` holds); with Epilogue.sum64 multipliers of
    31 significant bits (one channel in four 23-30), with a residual the accumulator's ratio
    divided by 2^0..2^8 per channel (the residual term up to 2^8 times the accumulator's
    multiplier, as in networks, and shifts on both sides of 32), the int64 bias and residual
    multiplier at that shift. The narrow residual's values and
    the derived outputs' thresholds and buffers (`derived_params`)."""
    epi = wl.epilogue
    res = epi.narrow_residual
    span = epi.out.qmax - epi.out.qmin + 1
    top_acc = accumulator_limit(wl)
    top_res = max(-res.qmin, res.qmax) if res is not None else 0
    frac = torch.rand(ratio.shape, generator=generator, dtype=torch.float64) - 0.5
    sign = torch.where(torch.rand(ratio.shape, generator=generator) < 0.3, -1.0, 1.0)
    r_ratio = sign * span * (0.25 + frac.abs()) / max(top_res, 1)
    ms, ss, bs, rs = [], [], [], []
    fewer = finer = torch.zeros(ratio.shape, dtype=torch.int64)
    if epi.sum64:  # drawn for sum64 only: the 32-bit cases keep their streams
        fewer = torch.randint(1, 9, ratio.shape, generator=generator) * \
            (torch.rand(ratio.shape, generator=generator) < 0.25)
        finer = torch.randint(0, 9, ratio.shape, generator=generator) * int(res is not None)
    for q, rr, b, f, d, g in zip(ratio.tolist(), r_ratio.tolist(), bias.tolist(),
                                 frac.tolist(), fewer.tolist(), finer.tolist(), strict=True):
        if epi.sum64:  # m in [2^(30 - d), 2^(31 - d)): the largest shift keeping it there
            q = q / 2**g
            s = max(1, min(62, math.floor(31 - d - math.log2(q))))
            m = round(q * 2**s)
            if m >= 2**31:
                s, m = s - 1, round(q * 2 ** (s - 1))
            ms.append(m)
            ss.append(s)
            bs.append(round((b * q + f) * 2**s))
            rs.append(round(rr * 2**s) if res is not None else 0)
            continue
        for s in range(31, 0, -1):
            m = round(q * 2**s)
            bc = round((b * q + f) * 2**s)
            rc = round(rr * 2**s) if res is not None else 0
            if top_acc * m + abs(bc) + top_res * abs(rc) + 2 ** (s - 1) < 2**30:
                break
        ms.append(m)
        ss.append(s)
        bs.append(bc)
        rs.append(rc)
    vec = {"dtype": torch.int32}
    wide = {"dtype": torch.int64 if epi.sum64 else torch.int32}
    residual = res_mult = None
    if res is not None:
        residual = random_values(operand_shapes(wl)[2], res, generator).to(
            storage_dtype(res, Layout.INT8))
        res_mult = torch.tensor(rs, **wide)
    return EpilogueParams(multiplier=torch.tensor(ms, **vec), shift=torch.tensor(ss, **vec),
                          shifted_bias=torch.tensor(bs, **wide), residual=residual,
                          residual_multiplier=res_mult, **derived_params(wl, generator))


def derived_params(wl: Workload, generator: torch.Generator) -> dict:
    """Random thresholds (each derived output's L_j = P_j.qmax - P_j.qmin levels spread over
    the mid value's range, sorted, ties and out-of-range values included now and then) and
    zeroed buffers for the epilogue's derived outputs, as EpilogueParams fields."""
    epi = wl.epilogue
    if not epi.derived:
        return {}
    lo, hi = epi.mid_range
    thresholds, bufs = [], []
    for (prec, _), (shape, dtype) in zip(epi.derived, derived_storage(wl), strict=True):
        levels = prec.qmax - prec.qmin
        t = torch.randint(lo, hi + 2, (levels,), generator=generator)
        thresholds.append(t.sort().values.to(torch.int32))
        bufs.append(torch.zeros(shape, dtype=dtype))
    return {"thresholds": tuple(thresholds), "derived_out": tuple(bufs)}


def random_inputs(wl: Workload, seed: int, device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor, EpilogueParams]:
    """Fresh random (x, w, params) for the workload, in its storage layouts, on `device`."""
    g = torch.Generator().manual_seed(int(seed))
    xs, ws, _ = operand_shapes(wl)
    x = pack(random_values(xs, wl.a, g), wl.a, wl.a_layout)
    w = pack(random_values(ws, wl.w, g), wl.w, wl.w_layout)
    return x.to(device), w.to(device), random_params(wl, g).to(device)
