"""Uniform random search without replacement."""

from __future__ import annotations

from ...core import Config
from .base import Strategy


class RandomSearch(Strategy):
    name = "random"

    def _propose(self, n: int) -> list[Config]:
        return self._random_unseen(n)
