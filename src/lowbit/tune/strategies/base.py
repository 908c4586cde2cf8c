"""What every search strategy shares: `propose(n) -> [Config]`, `update(trials)`, and the
bookkeeping of what is measured and pending.

`propose` never returns a config already measured or proposed-and-pending, and returns fewer
than n only when the space is used up. `update` takes `Trial`s (time_us None = failed).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ...core import Config, ConfigSpace, Workload


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

    @classmethod
    def make(cls, space: ConfigSpace, workload: Workload, template: object = None,
             seed: int = 0, **options: object) -> Strategy:
        """The strategy for `template`'s `space` on `workload` (`make_strategy`'s entry;
        `options`: transfer, plan_size, settings, which only the model-based ones read)."""
        return cls(space, seed)

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
