"""Measure on a Dask cluster: one measuring worker per GPU, results into the caller's records.

`DaskMeasurer(client)` spreads each batch over the cluster's workers, one candidate per task,
each pinned round-robin to a worker. Every Dask worker keeps one `Measurer` of its own (made
by `factory(gpu_index)`: a crash-isolated `LocalMeasurer` by default), created on first use and
reused, so a crash or hang costs only that measurer's child process. Results come back to the
tuner process, which is the only writer of the records database.

Clusters: `distributed.LocalCluster` (CI: CPU stand-in measurer), dask-cuda's
`LocalCUDACluster` (one worker per GPU, CUDA_VISIBLE_DEVICES set per worker: pass
`gpus=None`), a plain LocalCluster on a multi-GPU host (`gpus=n`: worker i measures on GPU
i % n), or any scheduler address (e.g. from dask-jobqueue).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

from ..core import Config, workload_from_json
from ..kernels.base import KernelTemplate
from .measure import LocalMeasurer, MeasureInput, Measurer, MeasureResult, ResultCallback

MeasurerFactory = Callable[[int | None], Measurer]

_MEASURERS: dict[tuple[str, str], Measurer] = {}
_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_GUARD = threading.Lock()


def local_factory(gpu_index: int | None, **kwargs: object) -> Measurer:
    """Default factory: a LocalMeasurer on GPU `gpu_index` (kwargs passed through)."""
    return LocalMeasurer(gpu_index=gpu_index, **kwargs)


def _worker_measurer(tag: str, factory: MeasurerFactory, gpu_index: int | None
                     ) -> tuple[Measurer, threading.Lock]:
    from distributed import get_worker

    key = (get_worker().address, tag)
    with _GUARD:
        if key not in _MEASURERS:
            _MEASURERS[key] = factory(gpu_index)
            _LOCKS[key] = threading.Lock()
        return _MEASURERS[key], _LOCKS[key]


def _precompile_task(tag: str, factory: MeasurerFactory, gpu_index: int | None,
                     jobs: list[tuple[KernelTemplate, str, str]]) -> int:
    """Runs on a Dask worker: build this worker's share of a batch in parallel (its
    measurer's compile pool) before the one-candidate measure tasks arrive."""
    measurer, lock = _worker_measurer(tag, factory, gpu_index)
    inputs = [MeasureInput(t, workload_from_json(w), Config.from_json(c)) for t, w, c in jobs]
    with lock:
        measurer.precompile(inputs)
    return len(inputs)


def _measure_task(tag: str, factory: MeasurerFactory, gpu_index: int | None,
                  template: KernelTemplate, wl_json: str, cfg_json: str,
                  after: object = None) -> MeasureResult:
    """Runs on a Dask worker: measure one candidate with this worker's measurer (`after`:
    the worker's precompile future, so Dask runs that first)."""
    measurer, lock = _worker_measurer(tag, factory, gpu_index)
    inp = MeasureInput(template, workload_from_json(wl_json), Config.from_json(cfg_json))
    with lock:  # one candidate at a time per measurer (its worker process is serial)
        return measurer.measure([inp])[0]


def _close_measurers(tag: str) -> int:
    """Runs on every worker: close this tag's measurers."""
    closed = 0
    with _GUARD:
        for key in [k for k in _MEASURERS if k[1] == tag]:
            _MEASURERS.pop(key).close()
            _LOCKS.pop(key, None)
            closed += 1
    return closed


def _env_task(tag: str, factory: MeasurerFactory, gpu_index: int | None) -> dict[str, str]:
    measurer, lock = _worker_measurer(tag, factory, gpu_index)
    with lock:
        return measurer.env()


class DaskMeasurer(Measurer):
    """Measurer over a `distributed.Client` (or a scheduler address).

    factory: `gpu_index -> Measurer` run on each worker (default `local_factory` with
    `measurer_kwargs`); gpus: GPUs per host to spread workers over (None: leave
    CUDA_VISIBLE_DEVICES alone, as LocalCUDACluster sets it).
    """

    def __init__(self, client: object, factory: MeasurerFactory | None = None,
                 gpus: int | None = None, **measurer_kwargs: object) -> None:
        from distributed import Client

        self.client = client if isinstance(client, Client) else Client(client)
        self._own_client = not isinstance(client, Client)
        self.factory = factory or functools.partial(local_factory, **measurer_kwargs)
        self.gpus = gpus
        self.tag = f"lowbit-{id(self):x}"
        self.workers = sorted(self.client.scheduler_info()["workers"])
        if not self.workers:
            raise ValueError("the Dask cluster has no workers")

    def _gpu(self, i: int) -> int | None:
        return None if self.gpus is None else i % self.gpus

    def env(self) -> dict[str, str]:
        fut = self.client.submit(_env_task, self.tag, self.factory, self._gpu(0),
                                 workers=[self.workers[0]], pure=False)
        return fut.result()

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: ResultCallback | None = None) -> list[MeasureResult]:
        from distributed import as_completed

        share = [[(i, inp) for i, inp in enumerate(inputs) if i % len(self.workers) == w]
                 for w in range(len(self.workers))]
        futures = {}
        for w, items in enumerate(share):
            if not items:
                continue
            jobs = [(inp.template, inp.workload.to_json(), inp.config.to_json())
                    for _, inp in items]
            pin = dict(workers=[self.workers[w]], allow_other_workers=False, pure=False)
            built = self.client.submit(_precompile_task, self.tag, self.factory, self._gpu(w),
                                       jobs, **pin)
            for (i, _), job in zip(items, jobs, strict=True):
                fut = self.client.submit(_measure_task, self.tag, self.factory, self._gpu(w),
                                         *job, after=built, **pin)
                futures[fut] = i
        out: list[MeasureResult | None] = [None] * len(inputs)
        for fut in as_completed(list(futures)):
            res = fut.result()
            out[futures[fut]] = res
            if on_result is not None:
                on_result(res)
        return [r for r in out if r is not None]

    def close(self) -> None:
        try:
            self.client.run(_close_measurers, self.tag)
        finally:
            if self._own_client:
                self.client.close()
