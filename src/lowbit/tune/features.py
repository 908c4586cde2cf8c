"""Cost-model features of a (template, workload, config): knob values plus derived quantities.

Knob part: each knob's value when numeric (bools as 0/1), else its position in the knob's value
list. Derived part (`lowbit.perfmodel.analyze`): tile sizes, warps, estimated shared memory and
registers, occupancy, TLP and compute intensity (APNN-TC Eq. 3-4), waves over the SMs, and the
workload's GEMM shape (log2 M, N, K), so that records of other workloads of the same template can
train one model (transfer). Feature vectors of one template always have the same columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..core import Config, ConfigSpace, Workload
from ..perfmodel import analyze


def knob_features(space: ConfigSpace, config: Config) -> list[float]:
    """One number per knob: the value if numeric, else its index in the knob's values.

    Raises KeyError when `config` lacks a knob of `space` (a record of another space)."""
    out: list[float] = []
    for k in space.knobs:
        v = config[k.name]
        if isinstance(v, bool):
            out.append(float(v))
        elif isinstance(v, int | float):
            out.append(float(v))
        else:  # categorical: position in this space's list (-1: a value only another has)
            out.append(float(k.values.index(v)) if v in k.values else -1.0)
    return out


def derived_features(workload: Workload, config: Config, template: object = None) -> list[float]:
    """Workload shape plus `perfmodel.analyze` quantities (see module doc), fixed order."""
    m, n, k = workload.gemm_shape
    shape = [math.log2(m), math.log2(n), math.log2(k)]
    try:
        feats = analyze(workload, config, template).features()
    except Exception:  # a template whose knobs the model cannot read: shape features only
        feats = {}
    return shape + [float(feats.get(name, 0.0)) for name in DERIVED_NAMES]


DERIVED_NAMES = (
    "block_m", "block_n", "block_k", "warps", "stages", "split_k", "threads", "grid_blocks",
    "smem_kb", "regs_per_thread", "blocks_per_sm", "occupancy", "log2_tlp",
    "compute_intensity", "waves", "wave_efficiency", "padding_efficiency",
    "log2_global_bytes", "log2_est_us",
)


class Featurizer:
    """Cached feature rows for one template and space (one workload at a time, or several
    with the same knobs for transfer)."""

    def __init__(self, template: object, space: ConfigSpace) -> None:
        self.template = template
        self.space = space
        self._cache: dict[tuple[str, Config], np.ndarray] = {}

    @property
    def names(self) -> list[str]:
        return [f"knob:{n}" for n in self.space.names] + ["log2_M", "log2_N", "log2_K",
                                                          *DERIVED_NAMES]

    def row(self, workload: Workload, config: Config) -> np.ndarray:
        key = (workload.key, config)
        got = self._cache.get(key)
        if got is None:
            # a record older than a knob reads as that knob's old meaning
            complete = getattr(self.template, "with_added_knobs", None)
            full = complete(config, self.space.names) if complete else config
            got = np.asarray(knob_features(self.space, full)
                             + derived_features(workload, full, self.template), np.float32)
            self._cache[key] = got
        return got

    def matrix(self, workload: Workload, configs: Sequence[Config]) -> np.ndarray:
        if not configs:
            return np.zeros((0, len(self.names)), np.float32)
        return np.stack([self.row(workload, c) for c in configs])
