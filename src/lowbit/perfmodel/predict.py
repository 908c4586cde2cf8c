"""Predicted kernel times without a GPU: the default trained model and `predict_us`.

The default model is a `LearnedModel` trained on the packaged measurement snapshot
(`dataset.SNAPSHOT`, every verified H100 / H200 measurement of the results files), plus the
records of a tuning database when one is given; trained once and kept in the user cache
directory under a name that hashes its training data, so later processes load it in
milliseconds. The cuDNN / cuBLAS fp16 baseline is predicted by `fit.fp16_estimate_us`.

    predict_us("triton.conv2d_int8", config, workload)          # microseconds, events timing
    predict_many("cuda.bitserial_wgmma", workload, configs, gpu="NVIDIA H200")
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..core import Workload
from ..core.cache import cache_dir
from ..core.hardware import GpuSpec, gpu_spec_for
from ..kernels.base import TORCH_FP16
from .dataset import (
    GRAPH_OFFSET_US,
    SNAPSHOT,
    Measurement,
    deduplicate,
    load_records,
    load_snapshot,
)
from .features import GENERIC
from .fit import fp16_estimate_us
from .learned import LearnedModel

MODEL_VERSION = "5"  # bump when features or training change: old cached models retrain
_MODELS: dict[str, LearnedModel] = {}


def _digest(snapshot: Path, extra: Sequence[Measurement]) -> str:
    """Names a model by what trains it: the snapshot file's bytes and the extra rows."""
    h = hashlib.sha256(f"{MODEL_VERSION}|{','.join(GENERIC)}".encode())
    h.update(snapshot.read_bytes() if snapshot.exists() else b"")
    for m in extra:
        h.update(f"{m.gpu}|{m.template}|{m.workload.key}|{m.config.to_json()}|"
                 f"{m.time_us:.4f}|{m.timing}\n".encode())
    return h.hexdigest()[:16]


def default_model(records: Iterable | None = None, snapshot: str | Path = SNAPSHOT
                  ) -> LearnedModel:
    """The model trained on the snapshot's measurements plus those of `records` (tuning
    records' rows, e.g. a `lowbit.tune.records.RecordsDB`), deduplicated: from memory, else
    the disk cache, else trained now (seconds to a minute on a busy CPU). An untrained model
    (analytic estimates only) when there is no data."""
    extra = load_records(records) if records is not None else []
    key = _digest(Path(snapshot), extra)
    if key in _MODELS:
        return _MODELS[key]
    path = cache_dir("perfmodel") / f"model-{key}.json"
    model: LearnedModel
    if path.exists():
        try:
            model = LearnedModel.load(path)
        except (OSError, ValueError, KeyError):
            model = None  # type: ignore[assignment]
        else:
            _MODELS[key] = model
            return model
    ms = deduplicate(load_snapshot(snapshot) + extra)
    model = LearnedModel()
    if ms:
        model.fit(ms)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            model.save(tmp)
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache: keep the model in memory only
    _MODELS[key] = model
    return model


def _spec(gpu: GpuSpec | str | None) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu or "NVIDIA H100 80GB HBM3")


def predict_many(template: object, workload: Workload, configs: Sequence[Mapping],
                 gpu: GpuSpec | str | None = None, model: LearnedModel | None = None,
                 cuda_graph: bool = False) -> np.ndarray:
    """Predicted times (microseconds) of `configs` of `template` (a template or its name;
    "torch.fp16": the library fp16 baseline, configs ignored) on `workload`. Events timing
    (what `lowbit tune` measures); `cuda_graph`: the time under CUDA-graph replay instead
    (`dataset.GRAPH_OFFSET_US` less, at least a fifth of the events time)."""
    name = template if isinstance(template, str) else template.name
    spec = _spec(gpu)
    if name == TORCH_FP16:
        out = np.full(len(configs), fp16_estimate_us(workload, spec))
    else:
        model = model or default_model()
        out = model.predict([(name, workload, c) for c in configs], spec)
    if cuda_graph:
        out = np.maximum(out - GRAPH_OFFSET_US, out / 5)
    return out


def predict_us(template: object, config: Mapping, workload: Workload,
               gpu: GpuSpec | str | None = None, model: LearnedModel | None = None,
               cuda_graph: bool = False) -> float:
    """Predicted time of one (template, config, workload) in microseconds (`predict_many`)."""
    return float(predict_many(template, workload, [config], gpu, model, cuda_graph)[0])


def predict_results(workload: Workload, results: Sequence[object],
                    gpu: GpuSpec | str | None = None, model: LearnedModel | None = None
                    ) -> list[float]:
    """The predicted time beside each measurement of `workload` (objects with `.template`
    and `.config`, e.g. `lowbit.tune.MeasureResult`s of a tune's history), one batched
    prediction per template: what `lowbit tune --predict` prints."""
    out = [0.0] * len(results)
    by_template: dict[str, list[int]] = {}
    for i, r in enumerate(results):
        by_template.setdefault(r.template, []).append(i)
    for name, ix in by_template.items():
        pred = predict_many(name, workload, [results[i].config for i in ix], gpu, model)
        for i, p in zip(ix, pred, strict=True):
            out[i] = float(p)
    return out
