"""Tune a network, not a list of layers: its distinct workloads, each by its share of the time.

A network's plan (`lowbit.graph`) lists Layer steps, each with its final workload (the kernel's
own fused epilogue included: the form the engine runs and the key the plan's chooser looks up
in the records), its template and default config. `network_workloads(plan, twins)` groups
them by workload (the layers sharing one are tuned once) with the templates the chooser may
move each to (`twins`: `lowbit.graph.chooser._layout_twins`, passed in because graph comes
after tune). Left out, with the reason: PyTorch fp16 layers and the fused stem (no template
config runs them). Measured as the engine runs them, with two approximations the engine's
launch modes make: a chained layer (programmatic dependent launch, a bind-time mode) is
measured unchained, alone (what PDL overlaps is the launch gap between kernels, which the
whole-network timing after the tune shows); a layer whose kernel writes its layer epilogue's
outputs itself (`outputs_in_kernel`) is measured as its int32 workload, the kernel the
engine's fused epilogue runs on (its tile config is the one tuned).

The budget: each workload's share is its default kernel's predicted time (the performance
model, `lowbit.perfmodel.predict`) times the number of layers running it; `split_budget`
gives every workload a floor (its default and a few candidates: `floor_trials` trials at
`DEFAULT_TRIAL_S`), the largest shares first while the budget lasts, and the rest in
proportion to the shares. Budgets are GPU-seconds: wall seconds times the measuring GPUs.
Each measured default re-weights the shares (`pipeline.reweight`): measured times replace
predicted ones, and the unmeasured predictions are scaled by the model's median error so far
(on ResNet-50 b256's block ends the model was 2-3x off, and the largest layers got one trial
of a 100 s budget).

    items, skipped = network_workloads(plan, _layout_twins)
    tasks = network_tasks(items, budget_s=600, gpus=1)
    result = tune_tasks(tasks, 600)          # every local GPU; records in the user database
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core import Config, Workload
from ..kernels import get_template, load_backends
from ..kernels.base import TORCH_FP16
from .pipeline import DEFAULT_TRIAL_S, PipelineResult, PipelineTuner, TuneTask
from .records import RecordsDB
from .workers import Builder, PoolBuilder, Slot, local_slots

#: trials every workload's floor pays for (its default and a few candidates)
FLOOR_TRIALS = 4


@dataclass(frozen=True)
class NetworkWorkload:
    """One distinct final workload of a plan: the layers running it, the templates a tuned
    record may move it to, and the plan's default (template name, config)."""

    workload: Workload
    layers: tuple[str, ...]
    templates: tuple[str, ...]
    default: tuple[str, Config]

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def name(self) -> str:
        first = self.layers[0].removeprefix("layer.")
        return first if self.count == 1 else f"{first} x{self.count}"


def network_workloads(plan: object, twins: Callable[[Workload, str], list[str]]
                      ) -> tuple[list[NetworkWorkload], list[tuple[str, str]]]:
    """(distinct workloads in execution order, [(layer, why it is not tuned)]) of a plan's
    Layer steps (module docstring). `plan`: a `lowbit.graph.Plan` planned without records
    (so each default is the template's own); twins: (workload, impl) -> template names."""
    groups: dict[str, list] = {}
    skipped: list[tuple[str, str]] = []
    for step in plan.layers:
        if step.impl == TORCH_FP16 or step.config is None:
            skipped.append((step.name, "PyTorch fp16 layer: no kernel config"))
        elif step.stem:
            skipped.append((step.name, "the fused Triton stem runs it: no template config"))
        else:
            groups.setdefault(step.workload.key, []).append(step)
    items = []
    for steps in groups.values():
        first = steps[0]
        names = list(twins(first.workload, first.impl))
        if first.impl not in names:
            names.insert(0, first.impl)
        items.append(NetworkWorkload(first.workload, tuple(s.name for s in steps),
                                     tuple(names), (first.impl, first.config)))
    return items, skipped


def split_budget(weights: Sequence[float], total_s: float, floor_s: float) -> list[float]:
    """Seconds per workload: `floor_s` each, the largest weights first while `total_s`
    lasts, then what is left in proportion to the weights."""
    if total_s < 0 or floor_s < 0 or any(w < 0 for w in weights):
        raise ValueError(f"budget, floor and weights must be >= 0, got {total_s}, {floor_s}, "
                         f"{list(weights)}")
    quotas = [0.0] * len(weights)
    left = float(total_s)
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        quotas[i] = min(floor_s, left)
        left -= quotas[i]
    total_w = float(sum(weights))
    if left > 0 and total_w > 0:
        quotas = [q + left * w / total_w for q, w in zip(quotas, weights, strict=True)]
    return quotas


def predicted_us(item: NetworkWorkload, gpu: str | None = None) -> float:
    """The performance model's time of the item's default kernel (microseconds); without a
    prediction, its multiply-adds at 100 dense TOPS."""
    from ..perfmodel.predict import predict_us

    name, cfg = item.default
    try:
        t = float(predict_us(name, cfg, item.workload, gpu))
        if t > 0:
            return t
    except Exception:  # a template the model cannot featurize: the op count stands in
        pass
    m, n, k = item.workload.gemm_shape
    return 2.0 * m * n * k / 1e14 * 1e6


def network_tasks(items: Sequence[NetworkWorkload], budget_s: float, gpus: int = 1,
                  predict: Callable[[NetworkWorkload], float] | None = None,
                  floor_trials: int = FLOOR_TRIALS, trial_s: float = DEFAULT_TRIAL_S
                  ) -> list[TuneTask]:
    """The pipeline's tasks of `items`, each with its share of `budget_s` x `gpus`
    GPU-seconds (module docstring); predict: item -> microseconds (default `predicted_us`)."""
    load_backends()
    predict = predict or predicted_us
    weights = [predict(it) * it.count for it in items]
    floor_s = floor_trials * trial_s
    quotas = split_budget(weights, budget_s * gpus, floor_s)
    return [TuneTask(it.name, it.workload, tuple(get_template(n) for n in it.templates),
                     (get_template(it.default[0]), it.default[1]), q, it.count,
                     weight_us=w, floor_s=min(q, floor_s))
            for it, q, w in zip(items, quotas, weights, strict=True)]


def tune_tasks(tasks: Sequence[TuneTask], budget_s: float,
               db: RecordsDB | str | Path | None = None, *, gpus: Sequence[int] | None = None,
               scheduler: str | object | None = None, build_workers: int | None = None,
               slots: Sequence[Slot] | None = None, builder: Builder | None = None,
               strategy: str = "pruned", gpu: str | None = None, progress: bool = True,
               console: object = None, **measurer_kwargs: object) -> PipelineResult:
    """Tune `tasks` within `budget_s` wall seconds (`lowbit.tune.pipeline`), every result into
    the records `db` (default: the user's database). Where: `slots` and `builder` as given;
    else a Dask cluster (`scheduler`: an address or a `distributed.Client`; one slot per
    worker, builds on the worker that measures); else the local GPUs `gpus` (default all), one
    slot each, built in a `BuildPool` of `build_workers` processes (default one per core).
    measurer_kwargs go to each GPU's `LocalMeasurer` (timeout_s, warmup_ms, rep_ms, ...)."""
    from .progress import NetworkProgress

    own_db = not isinstance(db, RecordsDB)
    records = db if isinstance(db, RecordsDB) else RecordsDB(db)
    closers = []
    try:
        if slots is None and scheduler is not None:
            from .dask_backend import dask_pipeline

            slots, dask_builder, close = dask_pipeline(scheduler, build_workers,
                                                       **measurer_kwargs)
            builder = builder or dask_builder
            closers.append(close)
        elif slots is None:
            import torch

            indices = list(range(torch.cuda.device_count())) if gpus is None else list(gpus)
            if not indices:
                from .measure import MeasureEnvironmentError

                raise MeasureEnvironmentError("no CUDA GPU to tune on (torch.cuda."
                                              "device_count() is 0)")
            slots = local_slots(indices, **measurer_kwargs)
            gpu = gpu or torch.cuda.get_device_name(indices[0])  # no wait for a worker
        if builder is None:
            builder = PoolBuilder(workers=build_workers or os.cpu_count() or 1)
            closers.append(builder.close)
        with NetworkProgress(tasks, budget_s, len(slots), enabled=progress,
                             console=console) as bar:
            tuner = PipelineTuner(tasks, slots, builder, records, budget_s, gpu=gpu,
                                  strategy=strategy, on_update=bar.update)
            return tuner.run()
    finally:
        for close in reversed(closers):
            close()
        if own_db:
            records.close()
