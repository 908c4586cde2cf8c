"""Who measures and who builds for the network tuner (`lowbit.tune.pipeline`).

A `Slot` is one measuring GPU: `MeasurerSlot` over a crash-isolated `LocalMeasurer` pinned to
that GPU (`local_slots`), over any `Measurer` (tests), or a Dask worker
(`lowbit.tune.dask_backend.DaskSlot`). A `Builder` builds candidates on CPU workers:
`PoolBuilder` in a `BuildPool` of processes (one host: any GPU of it loads what they built
from the disk caches), or Dask tasks on the worker that measures them
(`lowbit.tune.dask_backend.DaskBuilder`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from .buildpool import BuildPool
from .measure import LocalMeasurer, MeasureInput, Measurer, MeasureResult, compile_job


# ------------------------------------------------------------------------------ slots
class Slot:
    """One measuring GPU. `start()` runs in the slot's thread and returns the environment
    (`gpu`, versions); `measure(inp)` verifies and times one candidate."""

    name = "slot"

    def start(self) -> dict[str, str]:
        raise NotImplementedError

    def measure(self, inp: MeasureInput) -> MeasureResult:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MeasurerSlot(Slot):
    """A slot over a `Measurer`, or a function that makes one (called in the slot's thread,
    so workers of several GPUs start side by side)."""

    def __init__(self, measurer: Measurer | Callable[[], Measurer], name: str = "slot") -> None:
        self._make = measurer if callable(measurer) and not isinstance(measurer, Measurer) \
            else (lambda: measurer)
        self.measurer: Measurer | None = None
        self.name = name

    def start(self) -> dict[str, str]:
        self.measurer = self._make()
        return dict(self.measurer.env())

    def measure(self, inp: MeasureInput) -> MeasureResult:
        return self.measurer.measure([inp])[0]

    def close(self) -> None:
        if self.measurer is not None:
            self.measurer.close()


def local_slots(gpus: Sequence[int], **measurer_kwargs: object) -> list[MeasurerSlot]:
    """One slot per local GPU index: a `LocalMeasurer` whose worker sees only that GPU and
    builds nothing itself (the builder's processes fill the kernel caches it loads from)."""
    def make(i: int) -> Callable[[], Measurer]:
        return lambda: LocalMeasurer(device="cuda", gpu_index=i, compile_workers=0,
                                     **measurer_kwargs)

    return [MeasurerSlot(make(i), f"cuda:{i}") for i in gpus]


# ------------------------------------------------------------------------------ builders
class Builder:
    """Builds candidates on CPU workers. `shared`: any slot can measure what it built (one
    host, one disk cache); otherwise a build is for the slot named at `build`."""

    shared = True
    workers = 1

    def build(self, inp: MeasureInput, slot: int):
        """A future of (error or None, seconds) for this candidate (`compile_job`)."""
        raise NotImplementedError

    def run(self, fn: Callable, *args: object):
        """A future of fn(*args), run on a CPU worker (the pruned orders)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class PoolBuilder(Builder):
    """Builds in an executor: by default a `BuildPool` of `workers` processes (a build that
    kills its process or runs past `timeout_s` fails alone). compile_fn: the job
    (template, workload JSON, config JSON) -> (error, seconds)."""

    def __init__(self, pool: Executor | None = None, workers: int | None = None,
                 timeout_s: float = 300.0, compile_fn: Callable = compile_job) -> None:
        import os

        self.workers = workers or getattr(pool, "workers", None) or getattr(
            pool, "_max_workers", None) or (os.cpu_count() or 1)
        self._own = pool is None
        self.pool = pool or BuildPool(self.workers, timeout_s)
        self.compile_fn = compile_fn

    def build(self, inp: MeasureInput, slot: int):
        return self.pool.submit(self.compile_fn, inp.template, inp.workload.to_json(),
                                inp.config.to_json())

    def run(self, fn: Callable, *args: object):
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        if self._own:
            self.pool.shutdown()
