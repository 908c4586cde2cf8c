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

from ...core import Config, ConfigSpace, Workload
from ...core.hardware import GpuSpec, gpu_spec_for
from ...perfmodel.prune import space_filters
from .base import Strategy
from .ordered import OrderedSearch

Predict = Callable[[Sequence[Config]], np.ndarray]


def model_predict(template: object, workload: Workload, gpu: GpuSpec | str | None = None
                  ) -> Predict:
    """Predicted times of configs of `template` on `workload`: the default model's, or the
    analytic estimate alone without a template (nothing to look up in the data)."""
    from ...perfmodel.learned import LearnedModel
    from ...perfmodel.predict import predict_many

    model = None if template is not None else LearnedModel()
    name = template if template is not None else ""
    return lambda configs: predict_many(name, workload, configs, gpu, model)


class PrunedSearch(OrderedSearch):
    """Filters + predicted order (module doc).

    predict: configs -> predicted times (default: the default performance model); gpu: the
    GPU the filters reason about."""

    @classmethod
    def make(cls, space: ConfigSpace, workload: Workload, template: object = None,
             seed: int = 0, **options: object) -> Strategy:
        return cls(space, workload, template, seed)

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

    from ...core import workload_from_json

    t0 = time.perf_counter()
    wl = workload_from_json(wl_json)
    s = PrunedSearch(template.space(wl), wl, template, gpu=gpu)
    return [c.to_json() for c in s.order()], s.survivors, time.perf_counter() - t0
