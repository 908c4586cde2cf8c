"""Fit the analytic model's constants to measurements, and the cuDNN / cuBLAS fp16 estimate.

`fit_params` fits `AnalyticParams` (launch overhead, per-step latency, L2 bandwidth and the
compute efficiency of the instruction classes present) by least squares on log time
(scipy), so the analytic model alone is as close as its form allows; the learned model then
corrects what the form cannot express.

The fp16 baseline (PyTorch fp16 conv on cuDNN, channels_last, benchmark mode; fp16 matmul on
cuBLAS) is the analytic model on `geometry.fp16_geometry` with its own constants
(`FP16_PARAMS`), fitted on the recorded `cudnn_fp16` / `fp16_matmul` baselines
(`benchmarks/perfmodel.py --calibrate` prints the fit: 34 layers of H100 and H200 rows,
2026-11-22..27, median error 7.3% in sample).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..core import Workload
from ..core.hardware import GpuSpec, gpu_spec_for
from ..kernels.base import TORCH_FP16
from .analytic import DEFAULT_PARAMS, AnalyticParams, estimate
from .dataset import Measurement
from .geometry import fp16_geometry, geometry

#: fitted on the H100 fp16 baselines of the results files (module doc)
FP16_PARAMS = AnalyticParams(overhead_us=8.7, step_us=0.048, l2_bytes_per_s=10.7e12,
                             efficiency=(("fp16", 1.0),))


FP16_TILINGS = ((128, 128, 1), (128, 64, 1), (64, 64, 1), (64, 64, 4), (128, 128, 4))


def fp16_estimate_us(workload: Workload, gpu: GpuSpec | str | None = None,
                     params: AnalyticParams = FP16_PARAMS) -> float:
    """Estimated events-scale time of the PyTorch fp16 conv / matmul of `workload`'s shape:
    the fastest of the library tilings `FP16_TILINGS` under the analytic model."""
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu or "H100")
    return min(estimate(fp16_geometry(workload, bm, bn, sk), workload, spec, params).total_us
               for bm, bn, sk in FP16_TILINGS)


def _estimate_us(m: Measurement, params: AnalyticParams) -> float:
    if m.template == TORCH_FP16:
        return fp16_estimate_us(m.workload, m.gpu, params)
    g = geometry(m.template, m.workload, m.config)
    return estimate(g, m.workload, gpu_spec_for(m.gpu), params).total_us


def _pack(p: AnalyticParams, rates: list[str]) -> np.ndarray:
    return np.log([p.overhead_us, p.step_us, p.l2_bytes_per_s / 1e12]
                  + [p.eff(r) for r in rates])


def _unpack(v: np.ndarray, base: AnalyticParams, rates: list[str]) -> AnalyticParams:
    e = np.exp(v)
    eff = dict(base.efficiency)
    eff.update({r: float(min(x, 1.0)) for r, x in zip(rates, e[3:], strict=True)})
    return replace(base, overhead_us=float(e[0]), step_us=float(e[1]),
                   l2_bytes_per_s=float(e[2] * 1e12), efficiency=tuple(sorted(eff.items())))


def fit_params(ms: Sequence[Measurement], base: AnalyticParams = DEFAULT_PARAMS
              ) -> AnalyticParams:
    """`base` with its constants fitted to `ms` (module doc); ValueError without data."""
    from scipy.optimize import least_squares

    if not ms:
        raise ValueError("fit_params needs measurements")
    y = np.log([m.events_us for m in ms])
    rates = sorted({"fp16" if m.template == TORCH_FP16
                    else geometry(m.template, m.workload, m.config).rate for m in ms})

    def residual(v: np.ndarray) -> np.ndarray:
        p = _unpack(v, base, rates)
        t = np.array([_estimate_us(m, p) for m in ms])
        t = np.where(np.isfinite(t), t, 1e6)
        return np.log(t) - y

    fit = least_squares(residual, _pack(base, rates), loss="soft_l1", f_scale=0.2,
                        max_nfev=200)
    return _unpack(fit.x, base, rates)


def median_ape(ms: Sequence[Measurement], params: AnalyticParams = DEFAULT_PARAMS) -> float:
    """Median absolute percentage error of the analytic model alone on `ms`."""
    errs = []
    for m in ms:
        t = _estimate_us(m, params)
        if math.isfinite(t):
            errs.append(abs(t - m.events_us) / m.events_us)
    return float(np.median(errs) * 100) if errs else math.nan
