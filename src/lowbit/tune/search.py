"""Search strategies behind one interface: `propose(n) -> [Config]`, `update(trials)`.

  random      uniform without replacement
  exhaustive  every config in the space's order
  sa          AutoTVM: XGBoost rank model + simulated annealing; each round measures the model's
              top `plan_size - n_random` unmeasured configs plus `n_random` random ones (the
              convolution paper: 31 + 1)
  diversity   the convolution paper's diversity-aware exploration on top of `sa` (see
              `DiversitySearch`)
  tpe         Optuna's TPE sampler, an outside anchor
  pruned      the thesis's filters, then the performance model's predicted order
              (`lowbit.tune.pruned`)

`propose` never returns a config already measured or proposed-and-pending, and returns fewer
than n only when the space is used up. `update` takes `Trial`s (time_us None = failed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core import Config, ConfigSpace, Workload
from .cost_model import RankCostModel, Sample
from .features import Featurizer
from .sa import AnnealSettings, SpaceWalker, anneal

STRATEGIES = ("random", "exhaustive", "sa", "diversity", "tpe", "pruned")
#: the convolution paper's SA settings (also AutoTVM's defaults, with 128 walkers)
PAPER_SA = AnnealSettings()


@dataclass(frozen=True)
class Trial:
    """A measured config: median time in microseconds, or None if the candidate failed."""

    config: Config
    time_us: float | None


class Strategy:
    """Base: bookkeeping of what is measured and pending."""

    name = "abstract"

    def __init__(self, space: ConfigSpace | None, seed: int = 0, size: int | None = None
                 ) -> None:
        """size: the number of configs when known without enumerating `space` (a strategy
        over a precomputed order may have no space object at all)."""
        self.space = space
        self.rng = random.Random(seed)
        self.measured: dict[Config, float | None] = {}
        self.pending: set[Config] = set()
        self._size = len(space) if size is None else size

    @property
    def exhausted(self) -> bool:
        return len(self.measured) + len(self.pending) >= self._size

    def seen(self, config: Config) -> bool:
        return config in self.measured or config in self.pending

    def propose(self, n: int) -> list[Config]:
        """Up to n new distinct configs to measure next."""
        out = self._propose(max(0, n))
        self.pending.update(out)
        return out

    def update(self, trials: Sequence[Trial]) -> None:
        """Feed back measurements (of proposed configs, or earlier records to resume)."""
        for t in trials:
            self.pending.discard(t.config)
            self.measured[t.config] = t.time_us
        self._learn(trials)

    def _propose(self, n: int) -> list[Config]:
        raise NotImplementedError

    def _learn(self, trials: Sequence[Trial]) -> None:
        """Hook for strategies that learn from results."""

    def _random_unseen(self, n: int, exclude: set[Config] | None = None) -> list[Config]:
        pool = [c for c in self.space.all_configs()
                if not self.seen(c) and (exclude is None or c not in exclude)]
        return self.rng.sample(pool, min(n, len(pool)))


class RandomSearch(Strategy):
    name = "random"

    def _propose(self, n: int) -> list[Config]:
        return self._random_unseen(n)


class ExhaustiveSearch(Strategy):
    name = "exhaustive"

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        for c in self.space.all_configs():
            if len(out) >= n:
                break
            if not self.seen(c):
                out.append(c)
        return out


class ModelSearch(Strategy):
    """AutoTVM's model-based tuner: rank model + simulated annealing (module doc).

    workload/template: what the features describe; transfer: `Sample`s of other workloads of
    the same template (seed the model before the first measurement of this one).
    """

    name = "sa"

    def __init__(self, space: ConfigSpace, workload: Workload, template: object = None,
                 seed: int = 0, plan_size: int = 32, n_random: int = 1,
                 settings: AnnealSettings = PAPER_SA,
                 transfer: Sequence[Sample] = (), model_rounds: int = 80) -> None:
        super().__init__(space, seed)
        self.workload = workload
        self.plan_size = plan_size
        self.n_random = n_random
        self.settings = settings
        self.walker = SpaceWalker(space)
        self.model = RankCostModel(Featurizer(template, space), seed=seed, rounds=model_rounds)
        self.transfer = list(transfer)
        self._queue: list[Config] = []
        self._stale = True
        if self.transfer:
            self.model.fit(self.transfer)

    def _learn(self, trials: Sequence[Trial]) -> None:
        if trials:
            self._stale = True

    def _fit(self) -> None:
        own = [Sample(self.workload, c, t) for c, t in self.measured.items()]
        self.model.fit(self.transfer + own)
        self._stale = False

    def score(self, configs: Sequence[Config]) -> np.ndarray:
        return self.model.predict(self.workload, configs)

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        while len(out) < n and not self.exhausted_with(out):
            if not self._queue:
                self._refill()
                if not self._queue:
                    break
            c = self._queue.pop(0)
            if not self.seen(c):
                out.append(c)
                self.pending.add(c)  # so a refill inside this call never offers it again
        return out

    def exhausted_with(self, extra: list[Config]) -> bool:
        return len(self.measured) + len(self.pending) + len(extra) >= self._size

    def _refill(self) -> None:
        """Next plan: model's top picks + random ones (all random until the model can rank)."""
        if self._stale and self.measured:
            self._fit()
        if not self.model.trained:
            self._queue = self._random_unseen(self.plan_size)
            return
        picks = self.candidates(self.plan_size - self.n_random)
        self._queue = picks + self._random_unseen(self.n_random, exclude=set(picks))

    def _starts(self) -> list[Config]:
        """SA starting points: the fastest measured configs."""
        ok = sorted((c for c, t in self.measured.items() if t is not None),
                    key=lambda c: self.measured[c])
        return ok[: self.settings.walkers // 2]

    def _anneal(self, k: int) -> list[tuple[float, Config]]:
        exclude = set(self.measured) | self.pending
        return anneal(self.walker, self.score, k, self.rng, exclude, self._starts(),
                      self.settings)

    def candidates(self, k: int) -> list[Config]:
        """The k unmeasured configs to measure next."""
        return [c for _, c in self._anneal(k)]


class DiversitySearch(ModelSearch):
    """The convolution paper's diversity-aware exploration on top of `ModelSearch`.

    Per round: SA gives the model's top 2k candidates; each candidate spawns two mutants (one
    knob changed); of the mutants, the more diverse half (largest config distance to everything
    measured and to the candidates) is kept; kept mutants and candidates then compete for the
    k places, greedily: each place goes to the config with the highest
    rank score + weight * d / (d + d_half), rank score in [0, 1] from the model's order, d its
    distance to the configs already placed this round, d_half the distance of one whole knob.
    Measuring distinctive configs trains the rank model on the whole space instead of one
    basin; weight 0 is plain `sa` on the larger field.
    """

    name = "diversity"
    DEFAULT_WEIGHT = 0.5

    def __init__(self, *args: object, diversity_weight: float | None = None,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.diversity_weight = (self.DEFAULT_WEIGHT if diversity_weight is None
                                 else diversity_weight)

    def candidates(self, k: int) -> list[Config]:
        pool = [c for _, c in self._anneal(2 * k)]
        taken = set(self.measured) | self.pending | set(pool)
        mutants: list[Config] = []
        for c in pool:
            for _ in range(2):
                m = self.walker.step(c, self.rng)
                if m not in taken:
                    taken.add(m)
                    mutants.append(m)
        ref = list(self.measured) + pool
        div = [self._min_distance(m, ref) for m in mutants]
        order = sorted(range(len(mutants)), key=lambda i: -div[i])
        kept = [mutants[i] for i in order[: max(1, len(mutants) // 2)]] if mutants else []
        return self._compete(pool + kept, k)

    def _compete(self, field: list[Config], k: int) -> list[Config]:
        if not field:
            return []
        order = np.argsort(-self.score(field), kind="stable")
        rank = np.empty(len(field))
        rank[order] = 1.0 - np.arange(len(field)) / max(1, len(field) - 1)
        d_half = 1.0 / max(1, len(self.space.knobs))
        nearest = np.full(len(field), np.inf)
        free = np.ones(len(field), dtype=bool)
        chosen: list[Config] = []
        for _ in range(min(k, len(field))):
            d = np.where(np.isinf(nearest), 0.0, nearest)  # nothing placed yet: no spread
            spread = d / (d + d_half)
            value = np.where(free, rank + self.diversity_weight * spread, -np.inf)
            i = int(np.argmax(value))
            free[i] = False
            chosen.append(field[i])
            nearest = np.minimum(nearest, [self.space.distance(field[i], c) for c in field])
        return chosen

    def _min_distance(self, c: Config, others: Sequence[Config]) -> float:
        return min((self.space.distance(c, o) for o in others), default=1.0)


class TPESearch(Strategy):
    """Optuna TPE over the knobs (categorical). Configs the space rejects are told a penalty
    value (TPE learns to avoid them; they cost no measurement); failures are told a penalty
    too. Re-proposals of known configs are answered from memory."""

    name = "tpe"
    PENALTY = 1e12

    def __init__(self, space: ConfigSpace, seed: int = 0, max_asks: int = 8) -> None:
        super().__init__(space, seed)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                             n_startup_trials=10)
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.dists = {k.name: optuna.distributions.CategoricalDistribution(list(k.values))
                      for k in space.knobs}
        self.max_asks = max_asks
        self._trials: dict[Config, object] = {}

    def _value(self, t: float | None) -> float:
        return self.PENALTY if t is None else float(t)

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        asks = 0
        while len(out) < n and not self.exhausted_with(out) and asks < self.max_asks * n:
            asks += 1
            trial = self.study.ask(self.dists)
            cfg = Config(trial.params)
            if not self.space.is_valid(cfg):
                self.study.tell(trial, self.PENALTY)
            elif cfg in self.measured:
                self.study.tell(trial, self._value(self.measured[cfg]))
            elif cfg in self.pending or cfg in out:
                self.study.tell(trial, state=_fail_state())
            else:
                self._trials[cfg] = trial
                out.append(cfg)
        if len(out) < n:  # TPE keeps re-asking known points: fill with random unseen ones
            out += self._random_unseen(n - len(out), exclude=set(out))
        return out

    def exhausted_with(self, extra: list[Config]) -> bool:
        return len(self.measured) + len(self.pending) + len(extra) >= self._size

    def _learn(self, trials: Sequence[Trial]) -> None:
        for t in trials:
            trial = self._trials.pop(t.config, None)
            if trial is not None:
                self.study.tell(trial, self._value(t.time_us))


def _fail_state():
    import optuna

    return optuna.trial.TrialState.FAIL


def make_strategy(name: str, space: ConfigSpace, workload: Workload, template: object = None,
                  seed: int = 0, transfer: Sequence[Sample] = (), plan_size: int = 32,
                  settings: AnnealSettings = PAPER_SA) -> Strategy:
    """A strategy by name (one of STRATEGIES)."""
    if name == "random":
        return RandomSearch(space, seed)
    if name == "exhaustive":
        return ExhaustiveSearch(space, seed)
    if name == "sa":
        return ModelSearch(space, workload, template, seed, plan_size=plan_size,
                           settings=settings, transfer=transfer)
    if name == "diversity":
        return DiversitySearch(space, workload, template, seed, plan_size=plan_size,
                               settings=settings, transfer=transfer)
    if name == "tpe":
        return TPESearch(space, seed)
    if name == "pruned":
        from .pruned import PrunedSearch  # it builds on this module

        return PrunedSearch(space, workload, template, seed)
    raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
