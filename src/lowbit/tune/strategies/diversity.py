"""The convolution paper's diversity-aware exploration on top of `sa` (`DiversitySearch`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...core import Config
from .sa import ModelSearch


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
