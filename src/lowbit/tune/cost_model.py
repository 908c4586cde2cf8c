"""XGBoost ranking cost model (AutoTVM's): predicts which configs are faster, not how fast.

Trained with objective `rank:pairwise` on groups of measurements, one group per workload (a
ranking only compares configs of the same workload). Relevance label = best time in the group /
time (1 for the group's fastest, toward 0 for slow ones); failed candidates get label 0.
Records of other workloads of the same template join as extra groups (transfer), so the first
rounds of a new workload start from a model that already knows the template.
Higher `predict` score = predicted faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core import Config, Workload
from .features import Featurizer


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
    """XGBoost `rank:pairwise` model over `Featurizer` rows.

    `fit(samples)` retrains from scratch (the sets are small: hundreds to a few thousand rows);
    `predict(workload, configs)` returns scores, higher = faster. Untrained: all zeros.
    """

    def __init__(self, featurizer: Featurizer, seed: int = 0, rounds: int = 80,
                 params: dict | None = None) -> None:
        self.featurizer = featurizer
        self.seed = seed
        self.rounds = rounds
        self.params = {"objective": "rank:pairwise", "eta": 0.2, "max_depth": 6,
                       "min_child_weight": 1, "subsample": 1.0, "gamma": 0.0001,
                       "lambda": 1.0, "nthread": 1, "seed": seed,
                       "verbosity": 0, **(params or {})}
        self._booster = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def fit(self, samples: Sequence[Sample]) -> None:
        """Train on `samples` (grouped by workload key); needs two distinct labels somewhere."""
        import xgboost as xgb

        groups: dict[str, list[Sample]] = {}
        for s in samples:
            groups.setdefault(s.workload.key, []).append(s)
        rows, labels, qids = [], [], []
        for qid, members in enumerate(groups.values()):
            feats = []
            kept = []
            for s in members:
                try:
                    feats.append(self.featurizer.row(s.workload, s.config))
                    kept.append(s)
                except KeyError:  # a record of another space's knobs: not comparable
                    continue
            if len(kept) < 2:
                continue
            rows.extend(feats)
            labels.append(relevance([s.time_us for s in kept]))
            qids.extend([qid] * len(kept))
        if not rows:
            return
        y = np.concatenate(labels)
        if float(y.max()) == float(y.min()):
            return  # nothing to rank yet
        dm = xgb.DMatrix(np.stack(rows), label=y, qid=np.asarray(qids))
        self._booster = xgb.train(self.params, dm, num_boost_round=self.rounds)

    def predict(self, workload: Workload, configs: Sequence[Config]) -> np.ndarray:
        """Score per config, higher = predicted faster (zeros before the first fit)."""
        if self._booster is None or not configs:
            return np.zeros(len(configs), np.float64)
        import xgboost as xgb

        x = self.featurizer.matrix(workload, configs)
        return self._booster.predict(xgb.DMatrix(x)).astype(np.float64)
