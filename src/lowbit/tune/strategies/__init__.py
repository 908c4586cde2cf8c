"""Search strategies, one module each behind one interface (Kernel Tuner's layout):
`propose(n) -> [Config]`, `update(trials)` (`base.Strategy`), found by name in `STRATEGIES`.

  random      uniform without replacement
  exhaustive  every config in the space's order
  sa          AutoTVM: XGBoost rank model + simulated annealing; each round measures the model's
              top `plan_size - n_random` unmeasured configs plus `n_random` random ones (the
              convolution paper: 31 + 1)
  diversity   the convolution paper's diversity-aware exploration on top of `sa`
  tpe         Optuna's TPE sampler, an outside anchor
  pruned      the thesis's filters, then the performance model's predicted order; its order
              computed elsewhere is measured by `ordered.OrderedSearch` (the network tuner)

Adding a strategy: a module here with a `Strategy` subclass (its `make` classmethod builds it
from the tuner's arguments) and its name in `STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core import ConfigSpace, Workload
from ..cost_model import Sample
from .base import Strategy, Trial
from .diversity import DiversitySearch
from .exhaustive import ExhaustiveSearch
from .ordered import OrderedSearch
from .pruned import PrunedSearch, pruned_order_job
from .random import RandomSearch
from .sa import PAPER_SA, AnnealSettings, ModelSearch
from .tpe import TPESearch

#: strategy name -> its class (module doc)
STRATEGIES: dict[str, type[Strategy]] = {
    "random": RandomSearch, "exhaustive": ExhaustiveSearch, "sa": ModelSearch,
    "diversity": DiversitySearch, "tpe": TPESearch, "pruned": PrunedSearch,
}


def make_strategy(name: str, space: ConfigSpace, workload: Workload, template: object = None,
                  seed: int = 0, transfer: Sequence[Sample] = (), plan_size: int = 32,
                  settings: AnnealSettings = PAPER_SA) -> Strategy:
    """A strategy by name (one of STRATEGIES) for `template`'s `space` on `workload`;
    transfer / plan_size / settings reach the model-based ones (sa, diversity)."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name].make(space, workload, template, seed, transfer=transfer,
                                 plan_size=plan_size, settings=settings)


__all__ = ["PAPER_SA", "STRATEGIES", "AnnealSettings", "DiversitySearch", "ExhaustiveSearch",
           "ModelSearch", "OrderedSearch", "PrunedSearch", "RandomSearch", "Strategy",
           "TPESearch", "Trial", "make_strategy", "pruned_order_job"]
