"""The stem's conv as one implicit GEMM per step (`StemConfig(kernel="gemm")`), and what the
stem conv kernels share: the pool step and the epilogue (`stem_outputs`; outputs of 1-2 bits
by integer thresholds, `threshold_table`).

Same input as `stem.stem_conv_kernel` (the quantized space-to-depth image, the space-to-depth
weights) and the same outputs bit for bit; the difference is the shape of the work:

- with the pool, one program owns an image, a band of pooled rows, BLOCK_J pooled columns
  (BLOCK_J - 1 of them written) and BLOCK_N channels. Each step (one pooled row) is ONE int8
  dot of M = 4 * BLOCK_J rows (the two new conv rows x the pool windows' first and second
  columns x BLOCK_J) by BLOCK_N channels over the whole space-to-depth reduction (or a
  pipelined loop over 64-byte chunks), instead of four dots of 64 rows; the weights are
  loaded once per program (whole_k), so each step's only loads are the A rows, which the
  software pipeliner (num_stages >= 2) prefetches during the previous step's epilogue;
- the accumulator is split into its four [BLOCK_J, BLOCK_N] parts (reshape, permute, split),
  rows are pooled with the carried conv row, columns with the neighbour window's first
  column (a gather along BLOCK_J), then the epilogue runs on the pooled values only;
- without the pool, a program is a tile of 4 * BLOCK_J consecutive output pixels (image, row,
  column flattened): a plain implicit GEMM.

Exactness: as `stem` (int32 accumulation, int32 bias add checked at bind, each output in the
exact mode of `netops.requant_mode`); pooling the int32 values first is the same as pooling
the outputs (bias, ReLU, requantization monotone per channel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...core import Epilogue, Precision
from ...core.epilogue import EpilogueParams
from ...reference.epilogue import requant_thresholds
from .layer_outputs import (
    Requantized,
    _requant_slot,
    _unused_slot,
    as_output_spec,
    emit_output,
    output_slot,
    requant_tile,
)
from .stored import store_values

INT32_MIN = tl.constexpr(-(2**31))
#: outputs one stem launch writes
STEM_MAX_OUTPUTS = 3
#: the order of an output slot's constexprs in the kernels' OUTS (`output_group`)
SLOT_CONSTEXPRS = ("KIND", "LAYOUT", "BITS", "QLO", "QMAX", "MODE")
#: output kinds of `stem_outputs` beside netops' KIND_*: a 1-2 bit output by integer
#: thresholds, and a derived output by its table
KIND_THRESHOLDS = tl.constexpr(4)
KIND_TABLE = tl.constexpr(5)


@triton.jit
def _stem_output(y, pix, pix_mask, c0, K, slot, OUTS: tl.constexpr, J: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Output J of y [BLOCK_M, BLOCK_N] (int32): its runtime values `slot` (out, v1, v2, v3,
    v4, row, plane) and constexprs OUTS[J] (`SLOT_CONSTEXPRS` order; `output_group`).
    THRESHOLDS (QLO the output's qmin, v1 the int32 table [K, 4] of `threshold_table` /
    `derived_threshold_table`) q = QLO + #{i : y >= T[c, i]}; TABLE (a derived output) the
    formula clamped to [QLO, QMAX] (the mid precision's range) as `netops.requant_tile`, then
    v2[q - QLO] (the int32 table from the formula's lowest value on); any other kind as
    `netops.emit_output`."""
    out_ptr, v1_ptr, v2_ptr, v3_ptr, v4_ptr, row, plane = slot
    KIND: tl.constexpr = OUTS[J][0]
    LAYOUT: tl.constexpr = OUTS[J][1]
    BITS: tl.constexpr = OUTS[J][2]
    QLO: tl.constexpr = OUTS[J][3]
    QMAX: tl.constexpr = OUTS[J][4]
    MODE: tl.constexpr = OUTS[J][5]
    if KIND == KIND_TABLE:
        q = requant_tile(y, y, c0, K, v1_ptr, v2_ptr, v3_ptr, v4_ptr, QLO, QMAX, False, MODE,
                         BLOCK_N)
        chan = c0 + tl.arange(0, BLOCK_N)
        v = tl.load(v2_ptr + (q - QLO), mask=pix_mask[:, None] & (chan < K)[None, :], other=0)
        store_values(out_ptr, v, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0, BLOCK_M,
                     BLOCK_N)
    elif KIND == KIND_THRESHOLDS:
        chan = c0 + tl.arange(0, BLOCK_N)
        c_mask = chan < K
        q = tl.full((BLOCK_M, BLOCK_N), QLO, tl.int32)
        for i in tl.static_range(QMAX - QLO):
            thr = tl.load(v1_ptr + chan * 4 + i, mask=c_mask, other=0)
            q += (y >= thr[None, :]).to(tl.int32)
        store_values(out_ptr, q, pix, pix_mask, c0, K, row, plane, LAYOUT, BITS, 0, BLOCK_M,
                     BLOCK_N)
    else:
        emit_output(y, y, pix, pix_mask, c0, K, out_ptr, v1_ptr, v2_ptr, v3_ptr, v4_ptr, row,
                    plane, KIND, LAYOUT, BITS, QLO, QMAX, False, MODE, BLOCK_M, BLOCK_N)


@triton.jit
def stem_outputs(acc, bias, pix, pix_mask, n_idx, K, outs, OUTS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = acc + bias (int32 where the bind checked |acc| + |bias| < 2^31 - 1), then the
    epilogue outputs (`_stem_output`: thresholds, or `netops.emit_output` in its exact
    mode): `outs` and OUTS as `output_group` makes them, an unused slot of kind 0."""
    y = acc + bias[None, :]
    c0 = tl.program_id(1) * BLOCK_N
    _stem_output(y, pix, pix_mask, c0, K, outs[0], OUTS, 0, BLOCK_M, BLOCK_N)
    if OUTS[1][0] != 0:
        _stem_output(y, pix, pix_mask, c0, K, outs[1], OUTS, 1, BLOCK_M, BLOCK_N)
    if OUTS[2][0] != 0:
        _stem_output(y, pix, pix_mask, c0, K, outs[2], OUTS, 2, BLOCK_M, BLOCK_N)


@triton.jit
def pool_step(acc, carry_a, carry_b, nxt, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr):
    """One pooled row of the 3x3/2 max-pool from a step's conv values acc [4 BLOCK_J, BLOCK_N]
    (rows (rs, par, jm): conv row pair member rs, column parity par, pooled column jm; invalid
    positions INT32_MIN) and the carried second rows of the previous step: returns the pooled
    [BLOCK_J, BLOCK_N] int32 values (rows: max of the carried row and both new rows; columns:
    parities 0 and 1 and the neighbour's parity 0, gathered at `nxt`) and the new carries."""
    # [rs, par, jm, n] -> [jm, n, par, rs]; split off rs, then par
    parts = tl.permute(tl.reshape(acc, (2, 2, BLOCK_J, BLOCK_N)), (2, 3, 1, 0))
    lo, hi = tl.split(parts)
    lo_a, lo_b = tl.split(lo)
    hi_a, hi_b = tl.split(hi)
    rows_a = tl.maximum(carry_a, tl.maximum(lo_a, hi_a))
    rows_b = tl.maximum(carry_b, tl.maximum(lo_b, hi_b))
    pooled = tl.maximum(tl.maximum(rows_a, rows_b), tl.gather(rows_a, nxt, 0))
    return pooled, hi_a, hi_b


@triton.jit
def window_offsets(k, WS, CONV: tl.constexpr):
    """The byte offsets of reduction bytes k in a space-to-depth window from its corner:
    filter row a = k // (RS * CSP) at + a * WS * CSP, each RS * CSP contiguous bytes (16-byte
    vectors). CONV: `stem_geometry.ConvConstexprs`."""
    off = (k // (CONV.RS * CONV.CSP)) * (WS * CONV.CSP) + k % (CONV.RS * CONV.CSP)
    return tl.max_contiguous(tl.multiple_of(off, 16), 16)


@triton.jit
def _window_dot(s2d_ptr, w_ptr, b_whole, base, n_idx, n_mask, WS, KWB, CONV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """int32 [BLOCK_M, BLOCK_N]: each row's space-to-depth window (its corner at byte `base`,
    16-byte aligned; `window_offsets`) times the weights: one dot with b_whole
    ([CHUNKS * 64, BLOCK_N], loaded by the caller) or a loop of 64-byte chunks (pipelined by
    num_stages). CONV: `stem_geometry.ConvConstexprs`."""
    if CONV.WHOLE_K:
        k = tl.arange(0, CONV.CHUNKS * 64)
        off = window_offsets(k, WS, CONV)
        if CONV.KB % (CONV.CHUNKS * 64) == 0:
            a = tl.load(s2d_ptr + base[:, None] + off[None, :])
        else:
            a = tl.load(s2d_ptr + base[:, None] + off[None, :], mask=(k < CONV.KB)[None, :],
                        other=0)
        acc = tl.dot(a, b_whole, out_dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for ci in range(CONV.CHUNKS):
            k = ci * 64 + tl.arange(0, 64)
            off = window_offsets(k, WS, CONV)
            a = tl.load(s2d_ptr + base[:, None] + off[None, :], mask=(k < CONV.KB)[None, :],
                        other=0)
            b = tl.load(w_ptr + n_idx[None, :] * KWB + k[:, None], mask=n_mask[None, :],
                        other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    return acc


@triton.jit
def stem_gemm_kernel(s2d_ptr, w_ptr, bias_ptr, dims, outs, CONV: tl.constexpr,
                     OUTS: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr):
    """See the module docstring; the arguments as `stem.conv_launch` makes them. Grid: pool:
    (N * bands * col_blocks, channel blocks); no pool: (cdiv(N * OH * OW, 4 * BLOCK_J),
    channel blocks)."""
    N, OH, OW, PH, PW, HS, WS, K, KWB, bands, col_blocks, band_rows = dims
    BM: tl.constexpr = 4 * BLOCK_J
    pid = tl.program_id(0)
    n_idx = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_idx < K
    if CONV.HAS_BIAS:
        bias = tl.load(bias_ptr + n_idx, mask=n_mask, other=0)
    else:
        bias = tl.zeros((BLOCK_N,), dtype=tl.int32)
    b_whole = tl.zeros((64, BLOCK_N), dtype=tl.int8)
    if CONV.WHOLE_K:
        kw = tl.arange(0, CONV.CHUNKS * 64)
        b_whole = tl.load(w_ptr + n_idx[None, :] * KWB + kw[:, None], mask=n_mask[None, :],
                          other=0)
    mm = tl.arange(0, BM)
    if CONV.POOL:
        # row m: conv row pair member rs, column parity par, pooled column jm of the block
        rs = mm // (2 * BLOCK_J)
        par = (mm // BLOCK_J) % 2
        jm = mm % BLOCK_J
        cb = pid % col_blocks
        band = (pid // col_blocks) % bands
        n = pid // (col_blocks * bands)
        col = 2 * (cb * (BLOCK_J - 1) + jm) - CONV.PP + par
        col_ok = (col >= 0) & (col < OW)
        colc = tl.minimum(tl.maximum(col, 0), OW - 1)
        jj = tl.arange(0, BLOCK_J)
        jo = cb * (BLOCK_J - 1) + jj
        j_mask = (jj < BLOCK_J - 1) & (jo < PW)
        nxt = tl.minimum(jj + 1, BLOCK_J - 1)[:, None] + tl.zeros((BLOCK_J, BLOCK_N),
                                                                   tl.int32)
        carry_a = tl.full((BLOCK_J, BLOCK_N), INT32_MIN, tl.int32)
        carry_b = tl.full((BLOCK_J, BLOCK_N), INT32_MIN, tl.int32)
        t0 = band * band_rows
        t_end = tl.minimum(t0 + band_rows, PH)
        # t0 - 1 first: its second conv row is the first window row of pooled row t0
        for t in range(t0 - 1, t_end):
            oh = 2 * t - CONV.PP + 1 + rs
            ohc = tl.minimum(tl.maximum(oh, 0), OH - 1)
            base = ((n * HS + ohc) * WS + colc) * CONV.CSP
            acc = _window_dot(s2d_ptr, w_ptr, b_whole, base, n_idx, n_mask, WS, KWB, CONV, BM,
                              BLOCK_N)
            ok = col_ok & (oh >= 0) & (oh < OH)
            acc = tl.where(ok[:, None], acc, INT32_MIN)
            pooled, carry_a, carry_b = pool_step(acc, carry_a, carry_b, nxt, BLOCK_J, BLOCK_N)
            pix = (n * PH + t) * PW + jo
            stem_outputs(pooled, bias, pix, j_mask & (jj * 0 + t >= t0), n_idx, K, outs, OUTS,
                         BLOCK_J, BLOCK_N)
    else:
        pix = pid * BM + mm
        pix_mask = pix < N * OH * OW
        p = tl.minimum(pix, N * OH * OW - 1)
        ow = p % OW
        oh = (p // OW) % OH
        n = p // (OW * OH)
        base = ((n * HS + oh) * WS + ow) * CONV.CSP
        acc = _window_dot(s2d_ptr, w_ptr, b_whole, base, n_idx, n_mask, WS, KWB, CONV, BM,
                          BLOCK_N)
        stem_outputs(acc, bias, pix, pix_mask, n_idx, K, outs, OUTS, BM, BLOCK_N)


# =========================================================================== host side
#: THRESHOLDS and TABLE as ints (host side), and the thresholds a table row holds
THRESHOLDS = 4
TABLE = 5
THRESHOLD_STRIDE = 4
INT32_LIMITS = (-(2**31), 2**31 - 1)


def _formula_thresholds(spec: Requantized, prec: Precision, k: int) -> torch.Tensor | None:
    """int32 [k, prec.qmax - prec.qmin] (`reference.requant_thresholds`): the formula of
    `spec` clamped to `prec` is >= v iff y >= T[c, v - prec.qmin - 1]; None where the
    thresholds do not take the multiplier (>= 2^31)."""
    def vector(v: object) -> torch.Tensor:
        return torch.as_tensor(0 if v is None else v).to(torch.int64).cpu().expand(
            k).contiguous()

    params = EpilogueParams(multiplier=vector(spec.multiplier), shift=vector(spec.shift),
                            shifted_bias=vector(spec.bias))
    try:
        return requant_thresholds(Epilogue(relu=spec.relu, out=prec, shifted_bias=True), params)
    except ValueError:
        return None


def threshold_table(spec: Requantized, k: int) -> torch.Tensor | None:
    """int32 [k, 4] on the CPU: the thresholds on y = acc + bias (int32) of a requantized
    output of at most 2 bits (`reference.requant_thresholds` with the spec's bias at its
    shift), past its levels INT32_MAX; None for a wider output, a derived one, a residual
    term or a multiplier the thresholds do not take (>= 2^31)."""
    p = spec.precision
    if not isinstance(spec, Requantized) or not isinstance(p, Precision) or p.bits > 2 or \
            spec.residual_multiplier is not None or spec.table is not None:
        return None
    thr = _formula_thresholds(spec, p, k)
    if thr is None:
        return None
    table = torch.full((k, THRESHOLD_STRIDE), INT32_LIMITS[1], dtype=torch.int32)
    table[:, :thr.shape[1]] = thr
    return table


def table_steps(spec: Requantized) -> list[int | None] | None:
    """A derived output's table as a staircase over the values its formula gives
    ([spec.low, spec.high] of mid): per output level v above precision.qmin, the least
    formula value whose table entry is >= v (None: none reaches it), so that the output is
    qmin + #{v : q >= step(v)}; None where the table falls somewhere on that range (then
    max-pooling the formula's values does not pool the table's)."""
    mid, out = spec.mid, spec.precision
    vals = spec.table.to(torch.int64)[spec.low - mid.qmin:spec.high - mid.qmin + 1]
    if bool((vals[1:] < vals[:-1]).any()):
        return None
    q = torch.arange(spec.low, spec.high + 1)
    steps: list[int | None] = []
    for v in range(int(out.qmin) + 1, int(out.qmax) + 1):
        reached = q[vals >= v]
        steps.append(int(reached[0]) if reached.numel() else None)
    return steps


def derived_threshold_table(spec: Requantized, k: int) -> torch.Tensor | None:
    """int32 [k, 4] on the CPU: the thresholds on y of a derived output of at most 2 bits
    whose table rises over its formula's values (`table_steps`): the composition of the
    formula (non-decreasing in y) and the table is a staircase of y whose steps are the
    formula's thresholds in mid (`reference.requant_thresholds`) at the table's steps; past
    the output's levels INT32_MAX. None where that does not apply."""
    out = spec.precision
    if not isinstance(spec, Requantized) or spec.table is None or \
            not isinstance(out, Precision) or out.bits > 2 or \
            spec.residual_multiplier is not None:
        return None
    steps = table_steps(spec)
    thr = None if steps is None else _formula_thresholds(spec, spec.mid, k)
    if thr is None:
        return None
    table = torch.full((k, THRESHOLD_STRIDE), INT32_LIMITS[1], dtype=torch.int32)
    for i, v in enumerate(steps):
        if v is not None and v <= spec.low:  # every value the formula gives reaches it
            table[:, i] = INT32_LIMITS[0]
        elif v is not None:
            table[:, i] = thr[:, v - spec.mid.qmin - 1]
    return table


def output_group(slots: list[tuple[tuple, dict]], placeholder: torch.Tensor
                 ) -> tuple[tuple, tuple]:
    """The stem kernels' `outs` and OUTS of up to STEM_MAX_OUTPUTS slots (`stem_slot`):
    per slot its runtime values (out, v1, v2, v3, v4, row, plane) and its constexprs in
    `SLOT_CONSTEXPRS` order; the unused ones of kind 0 (`netops._unused_slot`)."""
    full = [*slots, *(_unused_slot(placeholder) for _ in range(STEM_MAX_OUTPUTS - len(slots)))]
    return (tuple(tuple(args) for args, _ in full),
            tuple(tuple(consts[name] for name in SLOT_CONSTEXPRS) for _, consts in full))


def threshold_slot(spec: object, slot: tuple[tuple, dict], k: int, device: torch.device
                   ) -> tuple[tuple, dict]:
    """An output slot (`netops.output_slot`) turned to the THRESHOLDS kind where
    `threshold_table` takes the spec (else the slot as it is)."""
    table = threshold_table(spec, k) if isinstance(spec, Requantized) else None
    if table is None:
        return slot
    args, consts = slot
    consts = {**consts, "KIND": THRESHOLDS, "QLO": int(spec.precision.qmin), "MODE": 0}
    return (args[0], table.to(device), *args[2:]), consts


def stem_slot(i: int, spec: object, out: object, shape: tuple[int, ...],
              device: torch.device, y_bound: int, fast: bool, thresholds: bool,
              pooled: bool) -> tuple[tuple, dict]:
    """(args, constexprs) of output i of a stem kernel (`stem_outputs`): a requantized or
    float output as `netops.output_slot` (1-2 bit ones by thresholds with `thresholds`), a
    derived one (mid and table) by thresholds where `derived_threshold_table` takes it and
    `thresholds`, else by its table (TABLE). With the pool (`pooled`: the kernels pool the
    int32 accumulators, then write the outputs), a derived output's table must rise over
    its formula's values: ValueError otherwise."""
    spec = as_output_spec(i, spec)
    k = shape[-1]
    if not isinstance(spec, Requantized) or spec.table is None:
        slot = output_slot(i, spec, out, shape, device, False, y_bound, fast=fast)
        return threshold_slot(spec, slot, k, device) if thresholds else slot
    if pooled and table_steps(spec) is None:
        raise ValueError(
            f"outputs[{i}] is a derived output whose table falls on the values its formula "
            f"gives ({spec.low}..{spec.high} in {spec.mid}): the max-pool after it takes the "
            "largest table value of each window, and the stem pools before the lookup "
            "(exact for a non-decreasing table only)")
    args, consts, _ = _requant_slot(i, spec, out, shape, device, False, y_bound, 0, fast,
                                    False)
    thr = derived_threshold_table(spec, k) if thresholds else None
    if thr is not None:
        consts = {**consts, "KIND": THRESHOLDS, "QLO": int(spec.precision.qmin),
                  "QMAX": int(spec.precision.qmax), "MODE": 0}
        return (args[0], thr.to(device), *args[2:]), consts
    table = spec.table[spec.low - spec.mid.qmin:].to(torch.int32).contiguous().to(device)
    return (args[0], args[1], table, *args[3:]), {**consts, "KIND": TABLE}
