"""Feature rows of (template, workload, config, gpu): the one feature builder of both
learned models (the performance model's regression, `learned.LearnedModel`, and the tuner's
rank model, `lowbit.tune.cost_model.RankCostModel`).

Features that transfer across layers and templates: the workload's GEMM shape and bit widths,
the launch geometry the template reports (`geometry.py`: tiles, blocks, waves over the SMs, k
steps, warps, stages, estimated shared memory and registers, occupancy), APNN-TC's compute
intensity, the padding and wave efficiency, and the analytic model's terms
(`analytic.estimate`: compute, DRAM, L2, latency, total). Then the config's own knobs, one
column per (geometry family, knob), so that two families' knobs of the same name never share
a column and renamed templates keep theirs; a config is read as its full kernel parameters
(`geometry.spec_of`), so the bit-serial families and the records of the single template
they replaced share their columns; numeric knobs as numbers, the others as codes of a
vocabulary learned at fit time (NaN for a value or a knob the model never saw: XGBoost treats
it as missing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..core import ConvWorkload, Workload
from ..core.hardware import H100, GpuSpec
from ..kernels.geometry import FAMILIES, RATES, Geometry
from .analytic import DEFAULT_PARAMS, AnalyticParams, estimate
from .geometry import geometry, spec_of

GENERIC = (
    "log2_M", "log2_N", "log2_K", "is_conv", "taps", "stride", "log2_C", "log2_batch",
    "w_bits", "a_bits", "planes", "family", "rate",
    "block_m", "block_n", "log2_k_step", "k_steps", "log2_k_steps", "split", "warps", "stages",
    "smem_kb", "regs", "persistent", "blocks_per_sm", "occ_warps",
    "log2_tiles", "log2_blocks", "waves", "full_waves", "wave_eff", "log2_busiest",
    "pad_eff_m", "pad_eff_n", "compute_intensity",
    "log2_compute_us", "log2_dram_us", "log2_l2_us", "log2_latency_us", "log2_est_us",
    "bandwidth_tb_s",
)


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else -20.0


def generic_row(template: str, workload: Workload, config: Mapping, gpu: GpuSpec = H100,
                params: AnalyticParams = DEFAULT_PARAMS) -> tuple[list[float], float]:
    """(GENERIC features, analytic estimate in us) of one point."""
    return geometry_row(geometry(template, workload, config), workload, gpu, params)


def geometry_row(g: Geometry, workload: Workload, gpu: GpuSpec = H100,
                 params: AnalyticParams = DEFAULT_PARAMS) -> tuple[list[float], float]:
    """(GENERIC features, analytic estimate in us) of a point's geometry."""
    e = estimate(g, workload, gpu, params)
    conv = isinstance(workload, ConvWorkload)
    chans = workload.C if conv else g.K
    batch = workload.N if conv else g.M
    est = e.total_us if math.isfinite(e.total_us) else 1e6
    row = [
        _log2(g.M), _log2(g.N), _log2(g.K), float(conv),
        float(workload.R * workload.S) if conv else 1.0,
        float(workload.stride) if conv else 1.0, _log2(chans), _log2(batch),
        float(workload.w.bits), float(workload.a.bits), float(g.planes),
        float(FAMILIES.index(g.family)), float(RATES.index(g.rate)),
        float(g.block_m), float(g.block_n), _log2(g.k_step), float(g.k_steps),
        _log2(g.k_steps), float(g.split), g.threads / 32, float(g.stages),
        g.smem_bytes / 1024, float(g.regs_per_thread), float(g.persistent),
        float(e.occ.blocks_per_sm), float(e.occ.warps_per_sm),
        _log2(g.tiles), _log2(g.blocks), e.waves, float(e.full_waves),
        e.waves / max(e.full_waves, 1), _log2(e.blocks_per_sm),
        g.M / g.padded_m, g.N / g.padded_n, 2 * g.block_m * g.block_n / (g.block_m + g.block_n),
        _log2(e.compute_us), _log2(e.dram_us), _log2(e.l2_us), _log2(e.latency_us), _log2(est),
        gpu.bandwidth / 1e12,
    ]
    return row, est


class Featurizer:
    """Maps points to fixed columns: GENERIC, then one per (family, knob) seen at `fit`."""

    def __init__(self) -> None:
        self.knob_columns: list[str] = []
        self.vocab: dict[str, dict[str, int]] = {}

    @property
    def names(self) -> list[str]:
        return list(GENERIC) + self.knob_columns

    def fit(self, points: Sequence[tuple[object, Workload, Mapping]]) -> Featurizer:
        """Learn the knob columns and the vocabularies of `points` (template or its name,
        workload, config)."""
        cols: dict[str, None] = {}
        vocab: dict[str, dict[str, int]] = {}
        for tmpl, wl, config in points:
            cfg = spec_of(tmpl, config)
            fam = geometry(tmpl, wl, config).family
            for k, v in cfg.items():
                col = f"{fam}:{k}"
                cols.setdefault(col)
                if not isinstance(v, bool | int | float):
                    vocab.setdefault(col, {}).setdefault(str(v), len(vocab.get(col, {})))
        self.knob_columns = sorted(cols)
        self.vocab = vocab
        return self

    def knob_row(self, config: Mapping, template: object, family: str) -> list[float]:
        """The knob columns of `template`'s `config`, whose geometry is of `family` (NaN
        where it has no value)."""
        config = spec_of(template, config)
        fam = family
        out = [math.nan] * len(self.knob_columns)
        index = {c: i for i, c in enumerate(self.knob_columns)}
        for k, v in config.items():
            i = index.get(f"{fam}:{k}")
            if i is None:
                continue
            if isinstance(v, bool | int | float):
                out[i] = float(v)
            else:
                code = self.vocab.get(f"{fam}:{k}", {}).get(str(v))
                out[i] = math.nan if code is None else float(code)
        return out

    def matrix(self, points: Sequence[tuple[str, Workload, Mapping]],
               gpu: GpuSpec | Sequence[GpuSpec] = H100,
               params: AnalyticParams = DEFAULT_PARAMS) -> tuple[np.ndarray, np.ndarray]:
        """(features [n, columns], analytic estimates [n] in us); `gpu`: one for all points
        or one per point."""
        gpus = [gpu] * len(points) if isinstance(gpu, GpuSpec) else list(gpu)
        rows, ests = [], []
        for (tmpl, wl, cfg), spec in zip(points, gpus, strict=True):
            g = geometry(tmpl, wl, cfg)
            generic, est = geometry_row(g, wl, spec, params)
            rows.append(generic + self.knob_row(cfg, tmpl, g.family))
            ests.append(est)
        if not rows:
            return np.zeros((0, len(self.names)), np.float32), np.zeros(0)
        return np.asarray(rows, np.float32), np.asarray(ests, np.float64)

    def to_dict(self) -> dict:
        return {"knob_columns": self.knob_columns, "vocab": self.vocab}

    @classmethod
    def from_dict(cls, d: dict) -> Featurizer:
        f = cls()
        f.knob_columns = list(d["knob_columns"])
        f.vocab = {k: dict(v) for k, v in d["vocab"].items()}
        return f
