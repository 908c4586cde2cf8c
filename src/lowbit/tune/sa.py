"""Simulated annealing on a cost model (AutoTVM's `SimulatedAnnealingOptimizer`).

`walkers` points walk the space in parallel, one knob changed per step; a move to a point of
lower predicted score is accepted with probability exp((new - old) / T). T starts at 1 and falls
by `cooling` per iteration (the convolution paper: T from 1, cooling 0.002, 128 walkers, 500
iterations, stop after 50 iterations without a change of the best-k set). Returns the k
highest-scored points seen that are not in `exclude` (the measured ones).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import Config, ConfigSpace

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
