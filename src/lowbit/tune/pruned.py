"""The pruned tuner (Dao's thesis, ch. 3): filter the space, then measure in predicted order.

Every config of the space goes through the thesis's filters (`perfmodel.prune.space_filters`:
launch, workload fit, coalescing, concurrency); the survivors are measured fastest-predicted
first (`perfmodel.predict`), so a tune with a trial budget of a few percent of the space
measures the configs the model ranks best. The order stays fixed, as in the thesis: moving
unmeasured configs by the measured error of their nearest measured neighbours was tried and
measured worse in the table replays (the median fraction of the space unchanged, the mean
0.058 -> 0.080 over 19 spaces). Filtered configs follow the survivors (fastest-predicted
first), so the strategy, like every other, only runs dry when the space is used up.

    strategy = PrunedSearch(space, workload, template)   # or make_strategy("pruned", ...)

Filtering and predicting a bit-serial space of 10^4 configs takes seconds of CPU: the network
tuner computes each order in a build process (`pruned_order_job`) and measures it through an
`OrderedSearch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core import Config, ConfigSpace, Workload
from ..perfmodel.hardware import GpuSpec, gpu_spec_for
from ..perfmodel.prune import space_filters
from .search import Strategy, Trial

Predict = Callable[[Sequence[Config]], np.ndarray]


def model_predict(template: object, workload: Workload, gpu: GpuSpec | str | None = None
                  ) -> Predict:
    """Predicted times of configs of `template` on `workload`: the default model's, or the
    analytic estimate alone without a template (nothing to look up in the data)."""
    from ..perfmodel.learned import LearnedModel
    from ..perfmodel.predict import predict_many

    model = None if template is not None else LearnedModel()
    name = template if template is not None else ""
    return lambda configs: predict_many(name, workload, configs, gpu, model)


class OrderedSearch(Strategy):
    """Measures configs in a fixed order given up front: `PrunedSearch`'s order computed
    elsewhere (`pruned_order`, e.g. in a build process while GPUs measure), with no space to
    enumerate here."""

    name = "pruned"

    def __init__(self, order: Sequence[Config], seed: int = 0,
                 space: ConfigSpace | None = None, survivors: int | None = None) -> None:
        super().__init__(space, seed, size=len(order))
        self._order = list(order)
        self._survivors = len(self._order) if survivors is None else survivors

    @property
    def survivors(self) -> int:
        """Configs that pass the filters."""
        return self._survivors

    def order(self) -> list[Config]:
        """Every config, the next one to measure first: survivors by prediction, then the
        filtered ones."""
        return list(self._order)

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        for c in self._order:
            if len(out) >= n:
                break
            if not self.seen(c):
                out.append(c)
        return out


class PrunedSearch(OrderedSearch):
    """Filters + predicted order (module doc).

    predict: configs -> predicted times (default: the default performance model); gpu: the
    GPU the filters reason about."""

    def __init__(self, space: ConfigSpace, workload: Workload, template: object = None,
                 seed: int = 0, predict: Predict | None = None,
                 gpu: GpuSpec | str | None = None) -> None:
        spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu)
        self.configs = space.all_configs()
        self.reasons = space_filters(template, workload, self.configs, spec)
        predict = predict or model_predict(template, workload, spec)
        self.predicted = np.asarray(predict(self.configs), float) if self.configs else \
            np.zeros(0)
        self.kept = np.array([r is None for r in self.reasons], bool)
        keys = np.lexsort((self.predicted, ~self.kept))
        super().__init__([self.configs[i] for i in keys], seed, space, int(self.kept.sum()))


def pruned_order_job(template: object, wl_json: str, gpu: str | None = None
                     ) -> tuple[list[str], int, float]:
    """`PrunedSearch`'s order of `template`'s space on a workload, as a picklable job for a
    build process: (config JSONs in measuring order, survivors, seconds taken)."""
    import time

    from ..core import workload_from_json

    t0 = time.perf_counter()
    wl = workload_from_json(wl_json)
    s = PrunedSearch(template.space(wl), wl, template, gpu=gpu)
    return [c.to_json() for c in s.order()], s.survivors, time.perf_counter() - t0


def trials_to_reach(order: Sequence[Config], times: dict[Config, float | None],
                    target_us: float) -> int | None:
    """Measurements, in `order`, until one is at or under `target_us` (None: never)."""
    for i, c in enumerate(order, 1):
        t = times.get(c)
        if t is not None and t <= target_us:
            return i
    return None


def replay(strategy: Strategy, times: dict[Config, float | None], target_us: float,
           batch: int = 8, limit: int | None = None) -> int | None:
    """Run `strategy` against measured `times` (a table of the whole space) in rounds of
    `batch`, as the tuner would; the number of measurements until one reaches `target_us`."""
    done = 0
    limit = limit or len(times)
    while done < limit:
        props = strategy.propose(batch)
        if not props:
            return None
        results = [Trial(c, times.get(c)) for c in props]
        for j, r in enumerate(results, 1):
            if r.time_us is not None and r.time_us <= target_us:
                return done + j
        strategy.update(results)
        done += len(results)
    return None


def table_space(configs: Sequence[Config]) -> ConfigSpace:
    """The space of exactly these configs (a measured table replayed as a space): each knob
    takes the values the table has, and one constraint per knob depth keeps the prefixes of
    table points only, so enumerating it walks the table, not the knobs' cross product."""
    from ..core import Knob

    names = sorted({k for c in configs for k in c})
    values = {n: sorted({c[n] for c in configs}, key=lambda v: (str(type(v)), v))
              for n in names}
    prefixes = [{tuple(c[n] for n in names[:d]) for c in configs}
                for d in range(len(names) + 1)]

    def depth(d: int):
        def in_table(c: Config) -> str | None:
            # reads knobs 0..d-1: the walk decides it as soon as they are set
            return None if tuple(c[n] for n in names[:d]) in prefixes[d] else "not in table"
        return in_table

    return ConfigSpace([Knob(n, tuple(values[n])) for n in names],
                       [depth(d) for d in range(1, len(names) + 1)])


def expected_random_trials(n: int, good: int) -> float:
    """Expected measurements of uniform random search without replacement until the first of
    `good` target configs among `n`: (n + 1) / (good + 1)."""
    return (n + 1) / (good + 1)
