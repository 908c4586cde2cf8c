"""Configs measured in a fixed order given up front (`OrderedSearch`): the network tuner's
pruned orders, computed in build processes while the GPUs measure (`pruned.pruned_order_job`)."""

from __future__ import annotations

from collections.abc import Sequence

from ...core import Config, ConfigSpace
from .base import Strategy


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
