"""The oracle: `run(workload, x, w, params)` on storage-format tensors, and random inputs."""

from __future__ import annotations

import math

import torch

from ..core import OUT_FP16, ConvWorkload, Encoding, Precision, Workload
from ..core.epilogue import EpilogueParams
from ..core.validate import check_inputs, operand_shapes
from ..quant.packing import pack, unpack
from ..quant.quantize import fixed_point
from .epilogue import apply_epilogue, shifted_bias_from
from .integer import conv2d_int, gemm_int


def accumulate(wl: Workload, x_values: torch.Tensor, w_values: torch.Tensor) -> torch.Tensor:
    """Exact int64 accumulators of the workload's conv or GEMM on integer values."""
    if isinstance(wl, ConvWorkload):
        return conv2d_int(x_values, w_values, wl.stride, wl.pad)
    return gemm_int(x_values, w_values)


def run(wl: Workload, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams) -> torch.Tensor:
    """The exact output (in the epilogue's storage layout) every kernel must reproduce."""
    check_inputs(wl, x, w, params)
    xs, ws, _ = operand_shapes(wl)
    xv = unpack(x, wl.a, wl.a_layout, xs[-1])
    wv = unpack(w, wl.w, wl.w_layout, ws[-1])
    return apply_epilogue(accumulate(wl, xv, wv), wl.epilogue, params)


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
    shifted = None
    if epi.shifted_bias:  # the same bias at the output's shift, plus a fraction of a step
        shifted, bias = shifted_bias_from(bias, mult, shift, generator), None
    return EpilogueParams(bias=bias, scale=scale, multiplier=mult, shift=shift,
                          shifted_bias=shifted)


def random_inputs(wl: Workload, seed: int, device: torch.device | str = "cpu"
                  ) -> tuple[torch.Tensor, torch.Tensor, EpilogueParams]:
    """Fresh random (x, w, params) for the workload, in its storage layouts, on `device`."""
    g = torch.Generator().manual_seed(int(seed))
    xs, ws, _ = operand_shapes(wl)
    x = pack(random_values(xs, wl.a, g), wl.a, wl.a_layout)
    w = pack(random_values(ws, wl.w, g), wl.w, wl.w_layout)
    return x.to(device), w.to(device), random_params(wl, g).to(device)
