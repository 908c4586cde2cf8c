"""AutoTVM's model-based tuner: an XGBoost rank model (`cost_model.RankCostModel`) and
simulated annealing on it; each round measures the model's top `plan_size - n_random`
unmeasured configs plus `n_random` random ones (the convolution paper: 31 + 1).

Simulated annealing (AutoTVM's `SimulatedAnnealingOptimizer`): `walkers` points walk the space
in parallel, one knob changed per step; a move to a point of lower predicted score is accepted
with probability exp((new - old) / T). T starts at 1 and falls by `cooling` per iteration (the
convolution paper: T from 1, cooling 0.002, 128 walkers, 500 iterations, stop after 50
iterations without a change of the best-k set). `anneal` returns the k highest-scored points
seen that are not in `exclude` (the measured ones).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from ...core import Config, ConfigSpace, Workload
from ..cost_model import RankCostModel, Sample
from .base import Strategy, Trial

ScoreFn = Callable[[Sequence[Config]], np.ndarray]


@dataclass(frozen=True)
class AnnealSettings:
    iterations: int = 500
    early_stop: int = 50
    walkers: int = 128
    temperature: float = 1.0
    cooling: float = 0.002


class SpaceWalker:
    """Fast validity lookups and one-knob random moves over a space of enumerable size."""

    def __init__(self, space: ConfigSpace) -> None:
        self.space = space
        self.configs = space.all_configs()
        self.valid = set(self.configs)

    def step(self, config: Config, rng: random.Random, tries: int = 8) -> Config:
        """A valid config differing from `config` in one knob (itself if none found)."""
        knobs = [k for k in self.space.knobs if len(k.values) > 1]
        for _ in range(tries if knobs else 0):
            k = rng.choice(knobs)
            v = rng.choice([x for x in k.values if x != config[k.name]])
            cand = config.replace(**{k.name: v})
            if cand in self.valid:
                return cand
        return config


def anneal(walker: SpaceWalker, score: ScoreFn, k: int, rng: random.Random,
           exclude: Collection[Config] = (), starts: Sequence[Config] = (),
           settings: AnnealSettings = AnnealSettings()) -> list[tuple[float, Config]]:
    """Top-k (score, config) pairs found by annealing, best first, none of them in `exclude`."""
    memo: dict[Config, float] = {}

    def scores(points: Sequence[Config]) -> list[float]:
        new = list({p for p in points if p not in memo})
        if new:
            for p, s in zip(new, score(new), strict=True):
                memo[p] = float(s)
        return [memo[p] for p in points]

    pool = walker.configs
    n = min(settings.walkers, len(pool))
    points = list(starts)[:n] + rng.sample(pool, n - min(n, len(starts)))
    current = scores(points)
    heap: list[tuple[float, int, Config]] = []  # min-heap of the best k (score, tiebreak, cfg)
    in_heap: set[Config] = set()
    tick = 0

    def offer(s: float, c: Config) -> bool:
        nonlocal tick
        if c in exclude or c in in_heap:
            return False
        if len(heap) < k:
            heapq.heappush(heap, (s, tick, c))
        elif s > heap[0][0]:
            _, _, old = heapq.heapreplace(heap, (s, tick, c))
            in_heap.discard(old)
        else:
            return False
        in_heap.add(c)
        tick += 1
        return True

    for s, c in zip(current, points, strict=True):
        offer(s, c)
    t, last_change = settings.temperature, 0
    for it in range(settings.iterations):
        moved = [walker.step(p, rng) for p in points]
        new = scores(moved)
        for i, (s_old, s_new) in enumerate(zip(current, new, strict=True)):
            if offer(s_new, moved[i]):
                last_change = it
            accept = s_new >= s_old or rng.random() < math.exp((s_new - s_old) / max(t, 1e-5))
            if accept:
                points[i], current[i] = moved[i], s_new
        t = max(0.0, t - settings.cooling)
        if it - last_change > settings.early_stop:
            break
    return [(s, c) for s, _, c in sorted(heap, key=lambda e: (-e[0], e[1]))]


#: the convolution paper's SA settings (also AutoTVM's defaults, with 128 walkers)
PAPER_SA = AnnealSettings()


class ModelSearch(Strategy):
    """AutoTVM's model-based tuner: rank model + simulated annealing (module doc).

    workload/template: what the features describe; transfer: `Sample`s of other workloads of
    the same template (seed the model before the first measurement of this one).
    """

    name = "sa"

    @classmethod
    def make(cls, space: ConfigSpace, workload: Workload, template: object = None,
             seed: int = 0, **options: object) -> Strategy:
        return cls(space, workload, template, seed, **options)

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
        self.model = RankCostModel(template, space, seed=seed, rounds=model_rounds)
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
