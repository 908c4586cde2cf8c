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


# ------------------------------------------------------------------------------ the pipeline
_POOLS: dict[tuple[str, str], object] = {}


def _build_task(tag: str, compile_fn: Callable, pool_workers: int, template: KernelTemplate,
                wl_json: str, cfg_json: str) -> tuple[str | None, float | None]:
    """Runs on a Dask worker: build one candidate in this worker's `BuildPool` (its host's
    disk caches are the ones its measurer loads from), seceded from the worker's threads
    while it waits so the worker keeps measuring; pool_workers 0: build in this thread."""
    from distributed import get_worker, secede

    from .buildpool import BuildPool, build_outcome

    if pool_workers <= 0:
        return compile_fn(template, wl_json, cfg_json)
    key = (get_worker().address, tag)
    with _GUARD:
        if key not in _POOLS:
            _POOLS[key] = BuildPool(pool_workers)
        pool = _POOLS[key]
    fut = pool.submit(compile_fn, template, wl_json, cfg_json)
    secede()
    return build_outcome(fut)


def _close_pools(tag: str) -> int:
    """Runs on every worker: end this tag's build pools."""
    with _GUARD:
        keys = [k for k in _POOLS if k[1] == tag]
        for k in keys:
            _POOLS.pop(k).shutdown()
    return len(keys)


class DaskSlot:
    """A pipeline slot (`lowbit.tune.pipeline.Slot`) on one Dask worker: its measurer is
    made there by `factory` and measures one candidate per task."""

    def __init__(self, client: object, address: str, factory: MeasurerFactory, tag: str,
                 gpu_index: int | None = None) -> None:
        self.client, self.address, self.factory, self.tag = client, address, factory, tag
        self.gpu_index = gpu_index
        self.name = address

    def _on_worker(self, fn: Callable, *args: object):
        return self.client.submit(fn, self.tag, self.factory, self.gpu_index, *args,
                                  workers=[self.address], allow_other_workers=False,
                                  pure=False).result()

    def start(self) -> dict[str, str]:
        return self._on_worker(_env_task)

    def measure(self, inp: MeasureInput) -> MeasureResult:
        return self._on_worker(_measure_task, inp.template, inp.workload.to_json(),
                               inp.config.to_json())

    def close(self) -> None:
        pass


class DaskBuilder:
    """A pipeline builder (`lowbit.tune.pipeline.Builder`) on a Dask cluster: a candidate is
    built on the worker of the slot that will measure it (`_build_task`); other CPU jobs run
    anywhere."""

    shared = False

    def __init__(self, client: object, addresses: Sequence[str], tag: str,
                 pool_workers: int, compile_fn: Callable | None = None) -> None:
        from .measure import compile_job

        self.client, self.addresses, self.tag = client, list(addresses), tag
        self.pool_workers = pool_workers
        self.workers = max(1, pool_workers) * len(self.addresses)
        self.compile_fn = compile_fn or compile_job

    def build(self, inp: MeasureInput, slot: int):
        return self.client.submit(_build_task, self.tag, self.compile_fn, self.pool_workers,
                                  inp.template, inp.workload.to_json(), inp.config.to_json(),
                                  workers=[self.addresses[slot]], allow_other_workers=False,
                                  pure=False)

    def run(self, fn: Callable, *args: object):
        return self.client.submit(fn, *args, pure=False)

    def close(self) -> None:
        self.client.run(_close_pools, self.tag)


def dask_pipeline(scheduler: object, build_workers: int | None = None,
                  factory: MeasurerFactory | None = None, gpus: int | None = None,
                  compile_fn: Callable | None = None, **measurer_kwargs: object
                  ) -> tuple[list[DaskSlot], DaskBuilder, Callable[[], None]]:
    """(slots, builder, close) of the network tuner on a Dask cluster (`scheduler`: an
    address or a `distributed.Client`): one slot per worker (a GPU each: dask-cuda's
    LocalCUDACluster sets each worker's CUDA_VISIBLE_DEVICES; `gpus`: spread the workers over
    this many GPUs per host instead), builds on each worker in a `BuildPool` of
    `build_workers` processes (default: its host's cores over its workers; 0 builds in the
    task's thread). factory: gpu_index -> Measurer run on each worker (default a
    `LocalMeasurer` that builds nothing itself, with `measurer_kwargs`)."""
    import os

    from distributed import Client

    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    workers = sorted(client.scheduler_info()["workers"])
    if not workers:
        raise ValueError("the Dask cluster has no workers")
    tag = f"lowbit-net-{os.getpid():x}-{id(client):x}"
    factory = factory or functools.partial(local_factory, compile_workers=0,
                                           **measurer_kwargs)
    hosts = {w.rsplit(":", 1)[0] for w in workers}
    if build_workers is None:
        build_workers = max(1, (os.cpu_count() or 1) * len(hosts) // len(workers))
    slots = [DaskSlot(client, w, factory, tag, None if gpus is None else i % gpus)
             for i, w in enumerate(workers)]
    builder = DaskBuilder(client, workers, tag, build_workers, compile_fn)

    def close() -> None:
        try:
            client.run(_close_measurers, tag)
            builder.close()
        finally:
            if client is not scheduler:
                client.close()

    return slots, builder, close
