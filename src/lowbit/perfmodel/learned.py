"""The learned model: XGBoost regression of log time over `features.Featurizer` rows.

Target: log(measured events-scale time / analytic estimate) — the model learns what the
analytic model (`analytic.estimate`) gets wrong, so that where it has seen nothing like a point
it falls back toward the analytic estimate instead of toward the average of its data. Every
verified measurement of every template trains one model (the features say which family and
instruction class a row is), so templates with few rows borrow from the others.

Objective: absolute error of the log ratio (`reg:absoluteerror`): the trees fit the median
ratio, which is what the median absolute percentage error scores, and a few slow outliers
(a layer 10x off its kind) pull the fit less than under squared error. Held out one layer at
a time on the recorded data (`benchmarks/perfmodel.py`), on each of two seeds, it lowered the
median APE of triton.conv2d_int8 (12.9 -> 11.1 %), triton.gemm_int8 (31.3 -> 28.3 %) and the
bit-serial families together (16.4 -> 15.6 %); it raised cuda.int8_wgmma's (9.3 -> 11.1 %).

Members: MEMBERS boosters on seeds seed, seed + 1, ... averaged in log space. Held out one
layer at a time on 10,129 records, three boosters lowered the median APE of 8 of 11 templates
(by 0.3-4.9 points) against one. The trees' row and column subsampling still reorders a
held-out layer's near-equal configs: the pruned tuner on the exhaustive 1,352- and
1,776-config spaces measured 0.013-0.087 and 0.057-0.159 of the space over five seeds of
three boosters (one booster: 0.03-0.13 and 0.04-0.19).

    model = LearnedModel().fit(measurements)          # lowbit.perfmodel.dataset rows
    us = model.predict([(template, workload, config)], gpu=H100)

`save` / `load` keep a trained model in one JSON file (featurizer + boosters).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..core import Workload
from ..core.hardware import GpuSpec, gpu_spec_for
from .dataset import Measurement
from .features import Featurizer

Point = tuple[str, Workload, Mapping]
#: boosters of a model (module doc)
MEMBERS = 3


class LearnedModel:
    """XGBoost regressor on log(time / analytic estimate) (module doc).

    rounds / depth / eta: boosting settings; min_child_weight and subsampling keep the trees
    from memorizing single layers (the evaluation holds whole layers out); threads: one by
    default (training on the snapshot takes ~5 s a member on one core; two threads on a
    busy two-core host took five times as long); members: boosters averaged (module doc)."""

    def __init__(self, rounds: int = 300, depth: int = 6, eta: float = 0.05, seed: int = 0,
                 threads: int = 1, residual: bool = True, members: int = MEMBERS,
                 **params: object) -> None:
        if members < 1:
            raise ValueError(f"members must be >= 1 boosters, got {members}")
        self.params = {"objective": "reg:absoluteerror", "eta": eta, "max_depth": depth,
                       "min_child_weight": 3, "subsample": 0.8, "colsample_bytree": 0.8,
                       "lambda": 1.0, "nthread": threads, "seed": seed, "verbosity": 0,
                       **params}
        self.rounds = rounds
        self.residual = residual
        self.members = members
        self.featurizer = Featurizer()
        self._boosters: list = []

    @property
    def trained(self) -> bool:
        return bool(self._boosters)

    def fit(self, ms: Sequence[Measurement]) -> LearnedModel:
        """Train on measurements (events-scale times); ValueError when there are none."""

        if not ms:
            raise ValueError("LearnedModel.fit needs at least one measurement")
        points = [(m.template, m.workload, m.config) for m in ms]
        self.featurizer.fit(points)
        x, est = self.featurizer.matrix(points, [gpu_spec_for(m.gpu) for m in ms])
        return self.fit_arrays(x, est, np.array([m.events_us for m in ms]))

    def fit_arrays(self, x: np.ndarray, est: np.ndarray, times_us: np.ndarray) -> LearnedModel:
        """Train on rows of this model's featurizer (set up by the caller), their analytic
        estimates and measured events-scale times."""
        import xgboost as xgb

        y = np.log(times_us) - (np.log(est) if self.residual else 0.0)
        dm = xgb.DMatrix(x, label=y, missing=np.nan)
        seed = int(self.params.get("seed", 0))
        self._boosters = [xgb.train({**self.params, "seed": seed + i}, dm,
                                    num_boost_round=self.rounds)
                          for i in range(self.members)]
        return self

    def predict(self, points: Sequence[Point], gpu: GpuSpec | str | None = None) -> np.ndarray:
        """Predicted events-scale times in microseconds (the analytic estimate where the
        model is untrained)."""
        spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu or "H100")
        if not points:
            return np.zeros(0)
        x, est = self.featurizer.matrix(points, spec)
        return self.predict_arrays(x, est)

    def predict_arrays(self, x: np.ndarray, est: np.ndarray) -> np.ndarray:
        """Predicted times of featurizer rows with their analytic estimates."""
        if not self._boosters:
            return est
        # in place: no DMatrix (its construction cost more than the trees on small batches)
        corr = np.mean([b.inplace_predict(x, missing=np.nan).astype(np.float64)
                        for b in self._boosters], axis=0)
        return (est if self.residual else 1.0) * np.exp(corr)

    def save(self, path: str | Path) -> None:
        doc = {"params": self.params, "rounds": self.rounds, "residual": self.residual,
               "members": self.members, "featurizer": self.featurizer.to_dict(),
               "boosters": [base64.b64encode(bytes(b.save_raw("ubj"))).decode()
                            for b in self._boosters]}
        Path(path).write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path) -> LearnedModel:
        import xgboost as xgb

        doc = json.loads(Path(path).read_text())
        model = cls(members=doc.get("members", 1))
        model.params, model.rounds = doc["params"], doc["rounds"]
        model.residual = doc.get("residual", True)
        model.featurizer = Featurizer.from_dict(doc["featurizer"])
        encoded = doc.get("boosters", [doc.get("booster", "")])  # one booster before members
        model._boosters = [xgb.Booster(model_file=bytearray(base64.b64decode(e)))
                           for e in encoded if e]
        return model
