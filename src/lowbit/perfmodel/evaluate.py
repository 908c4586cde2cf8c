"""Held-out accuracy of a performance model: leave one layer out.

For every layer (a shape: all precisions and epilogues of it together, `Measurement.layer`)
the model is trained on every measurement of the other layers, of every template, and predicts
the held-out layer's measurements. Per template: the median absolute percentage error over all
held-out predictions and Kendall's tau between predicted and measured times within each
held-out (layer, workload) of at least `min_tau_configs` configs, averaged over those layers.

Anchored (`anchor=True`): the thesis's idea of measuring a new layer a little before trusting
the model, at its cheapest: per held-out (template, GPU, workload) one config is measured, the
one the model predicts fastest (what the dispatch and the pruned tuner try first), and the
model's predictions of the others are scaled by that config's measured / predicted time. The
anchor row itself is left out of the metrics (its error is zero by construction), and so are
workloads with a single config. Most of the held-out error is one scale per layer (the
layer's time level), which the anchor removes; the scaling keeps the model's ranking (tau
differs only by the anchor left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..core.hardware import gpu_spec_for
from ..kernels.base import TORCH_FP16
from .dataset import Measurement


@dataclass(frozen=True)
class Accuracy:
    """Held-out accuracy of one template. median_ape in percent; kendall_tau None when no
    held-out layer had enough configs to rank."""

    template: str
    median_ape: float
    kendall_tau: float | None
    n_layers: int        # held-out layers with a prediction
    n_configs: int       # held-out predictions
    n_tau_layers: int    # layers that entered kendall_tau

    def row(self) -> dict:
        return {"template": self.template, "median_ape": round(self.median_ape, 2),
                "kendall_tau": None if self.kendall_tau is None else round(self.kendall_tau, 3),
                "n_layers": self.n_layers, "n_configs": self.n_configs,
                "n_tau_layers": self.n_tau_layers}


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Kendall's tau-b of two rankings (scipy)."""
    from scipy.stats import kendalltau

    tau = kendalltau(predicted, measured).statistic
    return float(tau) if tau is not None and math.isfinite(tau) else 0.0


def accuracy(template: str, pairs: Sequence[tuple[str, str, float, float]],
             min_tau_configs: int = 8) -> Accuracy:
    """Metrics of (layer, workload key, predicted, measured) pairs of one template."""
    pred = np.array([p for _, _, p, _ in pairs])
    meas = np.array([m for _, _, _, m in pairs])
    ape = float(np.median(np.abs(pred - meas) / meas) * 100) if len(pairs) else math.nan
    groups: dict[str, list[int]] = {}
    for i, (_, key, _, _) in enumerate(pairs):
        groups.setdefault(key, []).append(i)
    taus = [kendall_tau(pred[ix], meas[ix]) for ix in groups.values()
            if len(ix) >= min_tau_configs]
    return Accuracy(template, ape, float(np.mean(taus)) if taus else None,
                    len({layer for layer, _, _, _ in pairs}), len(pairs), len(taus))


#: fit(all measurements, train indices) -> predict(test indices) -> times in us
Fit = Callable[[Sequence[Measurement], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _identity(ms: Sequence[Measurement]) -> int:
    """Names a list of measurements by its objects (a filtered copy of a list keeps them)."""
    return hash(tuple(map(id, ms)))


def learned_fit(**kwargs: object) -> Fit:
    """A `Fit` for `leave_one_layer_out`: a `LearnedModel(**kwargs)` per fold, on feature rows
    computed once for all measurements (the knob vocabulary comes from configs, not times)."""
    from .learned import LearnedModel

    cache: dict[str, object] = {}

    def fit(ms: Sequence[Measurement], train: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        model = LearnedModel(**kwargs)
        key = _identity(ms)
        if cache.get("key") != key:
            points = [(m.template, m.workload, m.config) for m in ms]
            model.featurizer.fit(points)
            xe = model.featurizer.matrix(points, [gpu_spec_for(m.gpu) for m in ms])
            # ms is kept so that its objects' ids stay theirs while the key is in use
            cache.update(key=key, ms=ms, xe=xe, featurizer=model.featurizer)
        model.featurizer = cache["featurizer"]  # type: ignore[assignment]
        x, est = cache["xe"]  # type: ignore[misc]
        times = np.array([ms[i].events_us for i in train])
        model.fit_arrays(x[train], est[train], times)
        return lambda test: model.predict_arrays(x[test], est[test])

    return fit


def memoized(fit: Fit) -> Fit:
    """`fit` that trains once per training set (the same measurement objects and train rows):
    a second evaluation of the same folds (e.g. anchored after plain) reuses the trained
    models."""
    cache: dict[tuple[int, bytes], Callable[[np.ndarray], np.ndarray]] = {}
    keep: list[Sequence[Measurement]] = []  # the ids in the keys stay theirs

    def again(ms: Sequence[Measurement], train: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        key = (_identity(ms), np.asarray(train).tobytes())
        if key not in cache:
            cache[key] = fit(ms, train)
            keep.append(ms)
        return cache[key]

    return again


def anchored_predictions(ms: Sequence[Measurement], test: np.ndarray, pred: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(rows kept, their predictions scaled by their group's anchor) of held-out rows `test`
    with predictions `pred` (module doc: one anchor per (template, GPU, workload), the
    predicted-fastest config; the anchors and single-config groups are dropped)."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for j, i in enumerate(test):
        groups.setdefault((ms[i].template, ms[i].gpu, ms[i].workload.key), []).append(j)
    keep: list[int] = []
    scaled = np.array(pred, dtype=np.float64)
    for js in groups.values():
        if len(js) < 2:
            continue
        a = min(js, key=lambda j: (pred[j], j))
        scaled[js] *= ms[test[a]].events_us / pred[a]
        keep += [j for j in js if j != a]
    keep.sort()
    return test[keep], scaled[keep]


def leave_one_layer_out(ms: Sequence[Measurement], fit: Fit | None = None,
                        templates: Sequence[str] | None = None, min_tau_configs: int = 8,
                        layers: Sequence[str] | None = None,
                        groups: Mapping[str, Collection[str]] | None = None,
                        anchor: bool = False) -> list[Accuracy]:
    """Per-template held-out accuracy (module doc). `templates`: those to report (default:
    every template but the fp16 baseline); `layers`: hold out only these (default: every
    layer that has a measurement of a reported template); `groups`: name -> templates, each
    reported once more as one (their predictions together: Kendall's tau ranks the configs of
    all of them per workload, e.g. the bit-serial families as the one template they were);
    `anchor`: the anchored accuracy (module doc)."""
    fit = fit or learned_fit()
    ms = [m for m in ms if m.template != TORCH_FP16]
    wanted = set(templates) if templates else {m.template for m in ms}
    held = layers or sorted({m.layer for m in ms if m.template in wanted})
    pairs: dict[str, list[tuple[str, str, float, float]]] = {t: [] for t in sorted(wanted)}
    layer_of = np.array([m.layer for m in ms])
    is_wanted = np.array([m.template in wanted for m in ms])
    for layer in held:
        test = np.flatnonzero((layer_of == layer) & is_wanted)
        train = np.flatnonzero(layer_of != layer)
        if not len(test) or not len(train):
            continue
        pred = fit(ms, train)(test)
        if anchor:
            test, pred = anchored_predictions(ms, test, pred)
        for i, p in zip(test, pred, strict=True):
            m = ms[i]
            pairs[m.template].append((layer, m.gpu + m.workload.key, float(p), m.events_us))
    out = [accuracy(t, p, min_tau_configs) for t, p in pairs.items() if p]
    for name, members in (groups or {}).items():
        joined = [x for t in sorted(members) for x in pairs.get(t, ())]
        if joined:
            out.append(accuracy(name, joined, min_tau_configs))
    return out
