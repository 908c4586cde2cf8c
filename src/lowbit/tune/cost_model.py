"""XGBoost ranking cost model (AutoTVM's): predicts which configs are faster, not how fast.

Trained with objective `rank:pairwise` on groups of measurements, one group per workload (a
ranking only compares configs of the same workload). Relevance label = best time in the group /
time (1 for the group's fastest, toward 0 for slow ones); failed candidates get label 0.
Records of other workloads of the same template join as extra groups (transfer), so the first
rounds of a new workload start from a model that already knows the template.
Higher `predict` score = predicted faster.

Its rows are the performance model's (`lowbit.perfmodel.features.Featurizer`: the geometry the
template reports, the analytic model's terms, the knobs), fitted on each training set; a config
recorded before one of the template's knobs existed reads as that knob's old meaning
(`KernelTemplate.added_knobs`). Why the tuner keeps its own model beside the performance
model's regression: docs/history/tuning-and-accuracy.md, "Two learned models".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core import Config, ConfigSpace, Workload
from ..core.hardware import H100
from ..perfmodel.features import Featurizer


@dataclass(frozen=True)
class Sample:
    """One measurement for training: time_us None = failed candidate."""

    workload: Workload
    config: Config
    time_us: float | None


def relevance(times: Sequence[float | None]) -> np.ndarray:
    """best / time per sample of one group (0 for failures)."""
    ok = [t for t in times if t is not None and t > 0]
    best = min(ok) if ok else 1.0
    return np.asarray([best / t if t is not None and t > 0 else 0.0 for t in times], np.float32)


class RankCostModel:
    """XGBoost `rank:pairwise` model over `Featurizer` rows of one template's space.

    `fit(samples)` retrains from scratch (the sets are small: hundreds to a few thousand rows);
    `predict(workload, configs)` returns scores, higher = faster. Untrained: all zeros.
    """

    def __init__(self, template: object, space: ConfigSpace, seed: int = 0, rounds: int = 80,
                 params: dict | None = None) -> None:
        self.template = template
        self.space = space
        self.featurizer = Featurizer()
        self.seed = seed
        self.rounds = rounds
        self.params = {"objective": "rank:pairwise", "eta": 0.2, "max_depth": 6,
                       "min_child_weight": 1, "subsample": 1.0, "gamma": 0.0001,
                       "lambda": 1.0, "nthread": 1, "seed": seed,
                       "verbosity": 0, **(params or {})}
        self._booster = None
        self._rows: dict[tuple[str, Config], np.ndarray] = {}

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def complete(self, config: Config) -> Config:
        """`config` as the template's space knows it (knobs added since it was recorded, at
        their old meaning); KeyError when it lacks a knob of the space with no old meaning
        (a record of another space: not comparable)."""
        complete = getattr(self.template, "with_added_knobs", None)
        full = complete(config, self.space.names) if complete else config
        missing = [n for n in self.space.names if n not in full]
        if missing:
            raise KeyError(missing[0])
        return full

    def rows(self, workload: Workload, configs: Sequence[Config]) -> np.ndarray:
        """Feature rows of `configs` on `workload` (remembered until the next fit)."""
        new = [c for c in dict.fromkeys(configs) if (workload.key, c) not in self._rows]
        if new:
            points = [(self.template, workload, self.complete(c)) for c in new]
            x, _ = self.featurizer.matrix(points, H100)
            for c, row in zip(new, x, strict=True):
                self._rows[workload.key, c] = row
        if not configs:
            return np.zeros((0, len(self.featurizer.names)), np.float32)
        return np.stack([self._rows[workload.key, c] for c in configs])

    def fit(self, samples: Sequence[Sample]) -> None:
        """Train on `samples` (grouped by workload key); needs two distinct labels somewhere."""
        import xgboost as xgb

        groups: dict[str, list[Sample]] = {}
        for s in samples:
            try:
                groups.setdefault(s.workload.key, []).append(
                    Sample(s.workload, self.complete(s.config), s.time_us))
            except KeyError:  # a record of another space's knobs: not comparable
                continue
        kept = {key: members for key, members in groups.items() if len(members) >= 2}
        labels = [relevance([s.time_us for s in members]) for members in kept.values()]
        if not labels:
            return
        y = np.concatenate(labels)
        if float(y.max()) == float(y.min()):
            return  # nothing to rank yet
        self.featurizer = Featurizer().fit(
            [(self.template, s.workload, s.config) for members in kept.values()
             for s in members])
        self._rows = {}
        x = np.concatenate([self.rows(members[0].workload, [s.config for s in members])
                            for members in kept.values()])
        qids = np.concatenate([[qid] * len(members)
                               for qid, members in enumerate(kept.values())])
        dm = xgb.DMatrix(x, label=y, qid=qids, missing=np.nan)
        self._booster = xgb.train(self.params, dm, num_boost_round=self.rounds)

    def predict(self, workload: Workload, configs: Sequence[Config]) -> np.ndarray:
        """Score per config, higher = predicted faster (zeros before the first fit)."""
        if self._booster is None or not configs:
            return np.zeros(len(configs), np.float64)
        x = self.rows(workload, configs)
        return self._booster.inplace_predict(x, missing=np.nan).astype(np.float64)
