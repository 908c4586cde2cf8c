"""Every config in the space's order."""

from __future__ import annotations

from ...core import Config
from .base import Strategy


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
