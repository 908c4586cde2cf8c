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

    model = LearnedModel().fit(measurements)          # lowbit.perfmodel.dataset rows
    us = model.predict([(template, workload, config)], gpu=H100)

`save` / `load` keep a trained model in one JSON file (featurizer + booster).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..core import Workload
from .dataset import Measurement
from .features import Featurizer
from .hardware import GpuSpec, gpu_spec_for

Point = tuple[str, Workload, Mapping]


class LearnedModel:
    """XGBoost regressor on log(time / analytic estimate) (module doc).

    rounds / depth / eta: boosting settings; min_child_weight and subsampling keep the trees
    from memorizing single layers (the evaluation holds whole layers out); threads: one by
    default (training on the snapshot takes ~5 s on one core; two threads on a busy
    two-core host took five times as long)."""

    def __init__(self, rounds: int = 300, depth: int = 6, eta: float = 0.05, seed: int = 0,
                 threads: int = 1, residual: bool = True, **params: object) -> None:
        self.params = {"objective": "reg:absoluteerror", "eta": eta, "max_depth": depth,
                       "min_child_weight": 3, "subsample": 0.8, "colsample_bytree": 0.8,
                       "lambda": 1.0, "nthread": threads, "seed": seed, "verbosity": 0,
                       **params}
        self.rounds = rounds
        self.residual = residual
        self.featurizer = Featurizer()
        self._booster = None

    @property
    def trained(self) -> bool:
        return self._booster is not None

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
        self._booster = xgb.train(self.params, dm, num_boost_round=self.rounds)
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
        if self._booster is None:
            return est
        # in place: no DMatrix (its construction cost more than the trees on small batches)
        corr = self._booster.inplace_predict(x, missing=np.nan).astype(np.float64)
        return (est if self.residual else 1.0) * np.exp(corr)

    def save(self, path: str | Path) -> None:
        raw = bytes(self._booster.save_raw("ubj")) if self._booster is not None else b""
        doc = {"params": self.params, "rounds": self.rounds, "residual": self.residual,
               "featurizer": self.featurizer.to_dict(),
               "booster": base64.b64encode(raw).decode()}
        Path(path).write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path) -> LearnedModel:
        import xgboost as xgb

        doc = json.loads(Path(path).read_text())
        model = cls()
        model.params, model.rounds = doc["params"], doc["rounds"]
        model.residual = doc.get("residual", True)
        model.featurizer = Featurizer.from_dict(doc["featurizer"])
        raw = base64.b64decode(doc["booster"])
        if raw:
            model._booster = xgb.Booster(model_file=bytearray(raw))
        return model
