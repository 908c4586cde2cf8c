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
    Epilogue,
    EpilogueParams,
    check_residual,
    check_shifted_bias,
)
from .layout import Layout
from .precision import Encoding, Precision
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
    """Storage shape and dtype of the workload's output."""
    out_shape = operand_shapes(wl)[2]
    epi = wl.epilogue
    if epi.requantizes:
        return storage_shape(out_shape, epi.out, epi.out_layout), storage_dtype(epi.out,
                                                                                 epi.out_layout)
    return out_shape, (torch.float16 if epi.out == OUT_FP16 else ACCUMULATOR_OUTPUTS[epi.out])


def output_buffer(wl: Workload, device: torch.device, out: object = None) -> torch.Tensor:
    """A new output tensor in the workload's storage (out=None), or `out` after checking that
    it is a contiguous tensor of that shape and dtype on `device`."""
    shape, dtype = out_storage(wl)
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
    return {"bias": torch.int32 if epi.bias else None,
            "scale": torch.float32 if epi.out == OUT_FP16 else None,
            "multiplier": torch.int64 if epi.residual is not None else req, "shift": req}


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
    if wl.epilogue.requantizes:
        m, s = params.multiplier, params.shift
        if bool(((m < 1) | (s < 1) | (s > 62)).any()):
            raise ValueError("params.multiplier must be >= 1 and params.shift in 1..62")
    check_shifted_bias(wl.epilogue, params, k, device)
    check_residual(wl.epilogue, params, operand_shapes(wl)[2], device)
    if wl.epilogue.residual is not None:
        check_residual_range(wl, params)


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


def check_inputs(wl: Workload, x: torch.Tensor, w: torch.Tensor,
                 params: EpilogueParams) -> None:
    """Validate (x, w, params) against the workload; x and w on the same device."""
    xs, ws, _ = operand_shapes(wl)
    check_operand("x", x, xs, wl.a, wl.a_layout)
    check_operand("w", w, ws, wl.w, wl.w_layout, device=x.device)
    check_params(wl, params, x.device)
