"""Checks that kernel inputs match their workload, done before any launch.

Every public op and every kernel calls `check_inputs` first, so a wrong dtype, shape, layout,
device or a non-contiguous tensor is a ValueError/TypeError naming the argument, never a
crash or a silent wrong answer inside a kernel.
"""

from __future__ import annotations

import torch

from .epilogue import (
    ACCUMULATOR_OUTPUTS,
    OUT_FP16,
    REQUANT32_LIMIT,
    REQUANT32_MAX_SHIFT,
    SUM64_MAX_SHIFT,
    WIDE_MULTIPLIER_LIMIT,
    Epilogue,
    EpilogueParams,
    check_residual,
    check_shifted_bias,
)
from .layout import Layout
from .precision import Encoding, Precision, WidePrecision
from .workload import ConvWorkload, Workload


def storage_dtype(prec: Precision, layout: Layout) -> torch.dtype:
    """dtype of the storage tensor of an operand with this precision and layout."""
    if layout is Layout.BITPLANE:
        return torch.int32
    if layout is Layout.PACKED:
        return torch.uint8
    return torch.uint8 if prec.encoding is Encoding.UNSIGNED else torch.int8


def storage_shape(logical: tuple[int, ...], prec: Precision, layout: Layout) -> tuple[int, ...]:
    """Shape of the storage tensor for a logical integer tensor (innermost dim = channels)."""
    *outer, c = logical
    if layout is Layout.BITPLANE:
        return (prec.bits, *outer, -(-c // 32))
    if layout is Layout.PACKED:
        return (*outer, -(-c * prec.bits // 8))
    return tuple(logical)


def operand_shapes(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Logical shapes (x, w, out) of a workload's activation, weight and output."""
    if isinstance(wl, ConvWorkload):
        return ((wl.N, wl.H, wl.W, wl.C), (wl.K, wl.R, wl.S, wl.C // wl.groups),
                (wl.N, wl.P, wl.Q, wl.K))
    m, n, k = wl.gemm_shape
    return (m, k), (n, k), (m, n)


def out_storage(wl: Workload) -> tuple[tuple[int, ...], torch.dtype]:
    """Storage shape and dtype of the workload's output ((0,) with Epilogue.store_out=False:
    nothing is stored)."""
    out_shape = operand_shapes(wl)[2]
    epi = wl.epilogue
    if epi.requantizes:
        shape = storage_shape(out_shape, epi.out, epi.out_layout) if epi.store_out else (0,)
        return shape, storage_dtype(epi.out, epi.out_layout)
    return out_shape, (torch.float16 if epi.out == OUT_FP16 else ACCUMULATOR_OUTPUTS[epi.out])


def derived_storage(wl: Workload) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Storage shape and dtype of each derived output of the workload's epilogue."""
    out_shape = operand_shapes(wl)[2]
    return [(storage_shape(out_shape, p, lay), storage_dtype(p, lay))
            for p, lay in wl.epilogue.derived]


def residual_storage(wl: Workload) -> tuple[tuple[int, ...], torch.dtype] | None:
    """Storage shape and dtype of the epilogue's residual operand (None without one)."""
    res = wl.epilogue.residual
    if res is None:
        return None
    dtype = res.storage_dtype if isinstance(res, WidePrecision) else storage_dtype(res,
                                                                                  Layout.INT8)
    return operand_shapes(wl)[2], dtype


def output_buffer(wl: Workload, device: torch.device, out: object = None) -> torch.Tensor:
    """A new output tensor in the workload's storage (out=None), or `out` after checking that
    it is a contiguous tensor of that shape and dtype on `device`. With store_out=False
    nothing is stored: `out` may be None (an empty tensor is returned) or any tensor on
    `device` (returned, never written)."""
    shape, dtype = out_storage(wl)
    if not wl.epilogue.store_out and out is not None:
        if not isinstance(out, torch.Tensor) or out.device != device:
            raise ValueError(f"out must be None or a tensor on {device} (unused: "
                             f"{wl.epilogue.key} stores no mid output)")
        return out
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if (not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape)
            or out.dtype != dtype or not out.is_contiguous() or out.device != device):
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(shape)} "
                         f"on {device}")
    return out


def check_operand(name: str, t: object, logical: tuple[int, ...], prec: Precision,
                  layout: Layout, device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    want_dtype = storage_dtype(prec, layout)
    if t.dtype != want_dtype:
        raise TypeError(f"{name} must have dtype {want_dtype} for {prec} in layout "
                        f"'{layout.value}', got {t.dtype}")
    want = storage_shape(logical, prec, layout)
    if tuple(t.shape) != want:
        raise ValueError(f"{name} must have shape {want} ({prec}, layout '{layout.value}', "
                         f"logical {logical}), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def _check_vector(name: str, t: object, k: int, dtype: torch.dtype,
                  device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"params.{name} must be a torch.Tensor of {dtype}, got {t!r}")
    if t.dtype != dtype or tuple(t.shape) != (k,) or not t.is_contiguous():
        raise ValueError(f"params.{name} must be a contiguous {dtype} vector of length {k}, "
                         f"got {t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"params.{name} is on {t.device}, expected {device}")


def epilogue_vector_dtypes(epi: Epilogue) -> dict[str, torch.dtype | None]:
    """Dtype of each EpilogueParams vector the epilogue reads; None for those it does not."""
    req = torch.int32 if epi.requantizes else None
    wide = isinstance(epi.residual, WidePrecision)
    return {"bias": torch.int32 if epi.bias else None,
            "scale": torch.float32 if epi.out == OUT_FP16 else None,
            "multiplier": torch.int64 if wide else req, "shift": req}


def check_params(wl: Workload, params: EpilogueParams, device: torch.device) -> None:
    """The run-time epilogue vectors the workload's Epilogue needs, and only those. On CUDA the
    requantization range check reads the vectors: one device sync (kernels' `bind()` checks
    once for many launches)."""
    if not isinstance(params, EpilogueParams):
        raise TypeError(f"params must be an EpilogueParams, got {type(params).__name__}")
    k = operand_shapes(wl)[2][-1]
    for name, dtype in epilogue_vector_dtypes(wl.epilogue).items():
        if dtype is not None:
            _check_vector(name, getattr(params, name), k, dtype, device)
    epi = wl.epilogue
    if epi.requant32:
        m, s = params.multiplier, params.shift
        top = SUM64_MAX_SHIFT if epi.sum64 else REQUANT32_MAX_SHIFT
        if bool(((m < 0) | (s < 1) | (s > top)).any()):
            raise ValueError(f"params.multiplier must be >= 0 and params.shift in 1..{top} "
                             f"({'sum64' if epi.sum64 else 'requant32'})")
    elif epi.requantizes:
        m, s = params.multiplier, params.shift
        if bool(((m < 1) | (s < 1) | (s > 62)).any()):
            raise ValueError("params.multiplier must be >= 1 and params.shift in 1..62")
    check_shifted_bias(epi, params, k, device)
    check_residual(epi, params, operand_shapes(wl)[2], device)
    check_block_end(epi, params, operand_shapes(wl)[2], device)
    if isinstance(epi.residual, WidePrecision):
        check_residual_range(wl, params)
    if epi.requant32:
        check_requant32_range(wl, params)


def accumulator_limit(wl: Workload) -> int:
    """max |acc| of the workload's conv / GEMM: max|a| max|w| times the reduction length."""
    def top(p: Precision) -> int:
        return max(abs(p.qmin), abs(p.qmax))

    return top(wl.a) * top(wl.w) * wl.gemm_shape[2]


def check_residual_range(wl: Workload, params: EpilogueParams) -> None:
    """A residual epilogue's sum stays in int64 for every input the workload allows:
    |acc| m + |b| + |res| |r| + 2^(s-1) < 2^63 per channel with the accumulator's and the
    residual precision's bounds (exact Python integers; ValueError naming the first channel
    past it). Kernels add the terms in 64 bits, so this is their exactness condition."""
    top_acc, top_res = accumulator_limit(wl), -wl.epilogue.residual.qmin
    cols = zip(params.multiplier.tolist(), params.shifted_bias.tolist(),
               params.residual_multiplier.tolist(), params.shift.tolist(), strict=True)
    for c, (m, b, r, s) in enumerate(cols):
        if top_acc * m + abs(b) + top_res * abs(r) + (1 << (s - 1)) >= 2**63:
            raise ValueError(f"channel {c}: |acc| m + |b| + |res| |r| + 2^(s-1) can reach 2^63 "
                             f"(max|acc| {top_acc}, max|res| {top_res}, m {m}, b {b}, r {r}, "
                             f"s {s}): the residual epilogue's 64-bit sum could overflow")


def _check_tensor(name: str, t: object, dtype: torch.dtype, shape: tuple[int, ...],
                  device: torch.device | str | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"params.{name} must be a torch.Tensor of {dtype}, got {t!r}")
    if t.dtype != dtype or tuple(t.shape) != tuple(shape) or not t.is_contiguous():
        raise ValueError(f"params.{name} must be a contiguous {dtype} tensor of shape "
                         f"{tuple(shape)}, got {t.dtype} {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"params.{name} is on {t.device}, expected {device}")
    return t


def check_block_end(epi: Epilogue, params: EpilogueParams, out_shape: tuple[int, ...],
                    device: torch.device | str | None = None, values: bool = False) -> None:
    """The block-end params (Epilogue.requant32 / derived): a narrow residual (the output's logical
    shape `out_shape`, uint8 for unsigned, int8 for signed; with `values` every value in its
    precision's range) and its multiplier [K] (int32; int64 with sum64); one contiguous int32
    threshold vector [P_j.qmax - P_j.qmin] per derived output, non-decreasing; derived_out () or
    one buffer per derived output in its storage shape and dtype (`derived_storage`), all on
    `device` when given. Params of derived outputs given to an epilogue without them are an
    error. Reads the thresholds: a device sync on CUDA."""
    k = out_shape[-1]
    res = epi.narrow_residual
    if res is not None:
        t = _check_tensor("residual", params.residual, storage_dtype(res, Layout.INT8),
                          out_shape, device)
        if values and t.numel() and (int(t.min()) < res.qmin or int(t.max()) > res.qmax):
            raise ValueError(f"params.residual must lie in [{res.qmin}, {res.qmax}] ({res})")
        r = _check_tensor("residual_multiplier", params.residual_multiplier,
                          torch.int64 if epi.sum64 else torch.int32, (k,), device)
        if epi.sum64 and r.numel() and int(r.abs().max()) >= WIDE_MULTIPLIER_LIMIT:
            raise ValueError("params.residual_multiplier must lie in (-2^62, 2^62) (sum64)")
    for name in ("thresholds", "derived_out"):
        if not isinstance(getattr(params, name), tuple):
            raise TypeError(f"params.{name} must be a tuple of tensors, got "
                            f"{getattr(params, name)!r}")
    n = len(epi.derived)
    if len(params.thresholds) != n:
        raise ValueError(f"params.thresholds must hold {n} vectors (one per derived output of "
                         f"{epi.key}), got {len(params.thresholds)}")
    if params.derived_out and len(params.derived_out) != n:
        raise ValueError(f"params.derived_out must be () or hold {n} buffers (one per derived "
                         f"output of {epi.key}), got {len(params.derived_out)}")
    for j, (prec, lay) in enumerate(epi.derived):
        t = _check_tensor(f"thresholds[{j}]", params.thresholds[j], torch.int32,
                          (prec.qmax - prec.qmin,), device)
        if t.numel() > 1 and bool((t[1:] < t[:-1]).any()):
            raise ValueError(f"params.thresholds[{j}] must be non-decreasing")
        if params.derived_out:
            _check_tensor(f"derived_out[{j}]", params.derived_out[j], storage_dtype(prec, lay),
                          storage_shape(out_shape, prec, lay), device)


def block_end_sum_limit(epi: Epilogue, shift: int) -> int:
    """The bound of a block end's |acc| m + |b| + |res| |r| + 2^(s-1) at shift s: 2^31 (the
    32-bit sum), with Epilogue.sum64 2^min(63, 31 + s) (the int64 sum, z >> s an int32)."""
    return 2 ** min(63, 31 + shift) if epi.sum64 else REQUANT32_LIMIT


def check_requant32_range(wl: Workload, params: EpilogueParams) -> None:
    """A requant32 epilogue's sum stays in int32 for every input the workload allows:
    |acc| m + |b| + |res| |r| + 2^(s-1) < 2^31 per channel with the accumulator's and the
    narrow residual's bounds (with sum64: below `block_end_sum_limit`; exact Python integers;
    ValueError naming the first channel past it). Kernels add the terms with 32-bit (64-bit)
    multiply-adds, so this is their exactness condition."""
    res = wl.epilogue.narrow_residual
    top_acc = accumulator_limit(wl)
    top_res = max(-res.qmin, res.qmax) if res is not None else 0
    k = len(params.multiplier)
    r = params.residual_multiplier.tolist() if res is not None else [0] * k
    cols = zip(params.multiplier.tolist(), params.shifted_bias.tolist(), r,
               params.shift.tolist(), strict=True)
    for c, (m, b, rc, s) in enumerate(cols):
        limit = block_end_sum_limit(wl.epilogue, s)
        if top_acc * m + abs(b) + top_res * abs(rc) + (1 << (s - 1)) >= limit:
            raise ValueError(f"channel {c}: |acc| m + |b| + |res| |r| + 2^(s-1) can reach "
                             f"2^{limit.bit_length() - 1} (max|acc| {top_acc}, max|res| "
                             f"{top_res}, m {m}, b {b}, r {rc}, s {s}): the requant32 "
                             f"epilogue's {'64' if wl.epilogue.sum64 else '32'}-bit sum could "
                             f"overflow")


def check_inputs(wl: Workload, x: torch.Tensor, w: torch.Tensor,
                 params: EpilogueParams) -> None:
    """Validate (x, w, params) against the workload; x and w on the same device."""
    xs, ws, _ = operand_shapes(wl)
    check_operand("x", x, xs, wl.a, wl.a_layout)
    check_operand("w", w, ws, wl.w, wl.w_layout, device=x.device)
    check_params(wl, params, x.device)
