"""The thesis's sampling model: a config's time is linear in the waves it runs.

Dao (ch. 2): once a launch saturates the GPU, each further wave of blocks costs the same, so
time(w) = intercept + slope x w over the number of waves w. Measure the config at two chosen
parallelism levels — the problem scaled (batch: conv N, GEMM M) to fill 2 and 3 waves of the
resident blocks, its "2x and 3x saturation points" — fit the line, and read off the time of
any size of the same layer from its wave count. Two measurements of small problems replace a
measurement of the large one, and the line predicts every batch size.

    pred = sampling_predict(measure, "triton.conv2d_int8", wl, cfg)   # measure(wl) -> us
    pred.predicted_us, pred.line, pred.samples
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import ConvWorkload, GemmWorkload, Workload
from ..core.hardware import H100, GpuSpec
from .analytic import estimate
from .geometry import geometry

SATURATION_MULTIPLES = (2, 3)


@dataclass(frozen=True)
class WaveLine:
    """time(waves) = intercept_us + slope_us x waves."""

    intercept_us: float
    slope_us: float

    def predict(self, waves: float) -> float:
        return self.intercept_us + self.slope_us * waves

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> WaveLine:
        """Least-squares line through (waves, time) points; ValueError unless at least two
        distinct wave counts."""
        w = np.array([p[0] for p in points], float)
        t = np.array([p[1] for p in points], float)
        if len(set(w.tolist())) < 2:
            raise ValueError(f"WaveLine.fit needs two distinct wave counts, got {sorted(w)}")
        slope, intercept = np.polyfit(w, t, 1)
        return cls(float(intercept), float(slope))


def slots(template: object, workload: Workload, config: Mapping, gpu: GpuSpec = H100) -> int:
    """Blocks resident on the whole GPU at once (SMs x blocks per SM) for this config."""
    e = estimate(geometry(template, workload, config), workload, gpu)
    return gpu.sms * max(1, e.occ.blocks_per_sm)


def waves(template: object, workload: Workload, config: Mapping, gpu: GpuSpec = H100) -> int:
    """Full waves of blocks the launch runs: ceil(blocks / resident slots)."""
    g = geometry(template, workload, config)
    return math.ceil(g.blocks / slots(template, workload, config, gpu))


def with_batch(workload: Workload, batch: int) -> Workload:
    """`workload` with its batch dimension (conv N, GEMM M) set to `batch`."""
    if isinstance(workload, ConvWorkload):
        return workload.replace(N=batch)
    if isinstance(workload, GemmWorkload):
        return workload.replace(M=batch)
    raise TypeError(f"workload must be a ConvWorkload or GemmWorkload, got {type(workload)}")


def _rows_per_batch(workload: Workload) -> int:
    return workload.P * workload.Q if isinstance(workload, ConvWorkload) else 1


def saturation_batch(template: object, workload: Workload, config: Mapping, multiple: int,
                     gpu: GpuSpec = H100) -> int:
    """The largest batch whose launch fits in `multiple` waves of resident blocks (so its last
    wave is as full as the batch granularity allows; 1 when one image is already more)."""
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    g = geometry(template, workload, config)
    per_wave = slots(template, workload, config, gpu)
    col_blocks = math.ceil(g.N / g.block_n) * g.split
    row_tiles = multiple * per_wave // col_blocks
    return max(1, row_tiles * g.block_m // _rows_per_batch(workload))


def saturation_workloads(template: object, workload: Workload, config: Mapping,
                         gpu: GpuSpec = H100,
                         multiples: Sequence[int] = SATURATION_MULTIPLES
                         ) -> list[tuple[Workload, int]]:
    """(workload at each saturation point, its full waves), in the order of `multiples`."""
    out = []
    for k in multiples:
        wl = with_batch(workload, saturation_batch(template, workload, config, k, gpu))
        out.append((wl, waves(template, wl, config, gpu)))
    return out


@dataclass(frozen=True)
class SamplingPrediction:
    predicted_us: float
    target_waves: int
    line: WaveLine
    samples: tuple[tuple[int, int, float], ...]  # (batch, waves, measured us)


def sampling_predict(measure: Callable[[Workload], float], template: object,
                     workload: Workload, config: Mapping, gpu: GpuSpec = H100,
                     multiples: Sequence[int] = SATURATION_MULTIPLES) -> SamplingPrediction:
    """Measure `config` at the saturation points (`measure(workload) -> us`) and predict its
    time on `workload` from the line in waves. ValueError when the points do not give two
    distinct wave counts (one image already fills more waves than the largest multiple)."""
    points = saturation_workloads(template, workload, config, gpu, multiples)
    samples = []
    for wl, w in points:
        batch = wl.N if isinstance(wl, ConvWorkload) else wl.gemm_shape[0]
        samples.append((batch, w, float(measure(wl))))
    line = WaveLine.fit([(w, t) for _, w, t in samples])
    target = waves(template, workload, config, gpu)
    return SamplingPrediction(line.predict(target), target, line, tuple(samples))
