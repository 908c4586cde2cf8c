"""Config spaces: named knobs with candidate values, and the constraints that rule points out.

A template's `space(workload)` returns a ConfigSpace; a search strategy walks it; a `Config`
is one point, hashable and JSON-serializable (the records database stores `Config.to_json()`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

Scalar = int | str | bool


class Config(Mapping[str, Scalar]):
    """One point of a ConfigSpace: an immutable, hashable mapping knob name -> value."""

    __slots__ = ("_items",)

    def __init__(self, values: Mapping[str, Scalar] | None = None, **kw: Scalar) -> None:
        merged = dict(values or {}, **kw)
        self._items = tuple(sorted(merged.items()))

    def __getitem__(self, name: str) -> Scalar:
        for k, v in self._items:
            if k == name:
                return v
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

    def replace(self, **changes: Scalar) -> Config:
        return Config(dict(self._items, **changes))

    def to_json(self) -> str:
        return json.dumps(dict(self._items), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls(json.loads(text))


@dataclass(frozen=True)
class Knob:
    """A named tuning parameter and its candidate values (in a meaningful order)."""

    name: str
    values: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise ValueError(f"Knob {self.name!r} needs at least one value")


Constraint = Callable[[Config], "str | None"]
"""Returns None when the config is fine, else a short reason it is invalid."""


class UnsetKnob(Exception):
    """A constraint read a knob that a partial config has not set yet (deliberately not a
    KeyError, so `Mapping.get` and `in` cannot swallow it)."""


class PartialConfig(Config):
    """The knobs set so far while `ConfigSpace.all_configs` walks the cross product; reading a
    knob of the space that is not set yet raises UnsetKnob."""

    __slots__ = ("_unset",)

    def __init__(self, values: Mapping[str, Scalar], unset: frozenset[str]) -> None:
        super().__init__(values)
        self._unset = unset

    def __getitem__(self, name: str) -> Scalar:
        if name in self._unset:
            raise UnsetKnob(name)
        return super().__getitem__(name)


class ConfigSpace:
    """The cross product of its knobs minus the points a constraint rejects."""

    def __init__(self, knobs: Sequence[Knob], constraints: Sequence[Constraint] = ()) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate knob names in {names}")
        self.knobs: tuple[Knob, ...] = tuple(knobs)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self._valid: list[Config] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(f"no knob {name!r}; knobs: {self.names}")

    def why_invalid(self, config: Mapping[str, Scalar]) -> str | None:
        """None if `config` is a point of this space, else the reason it is not."""
        if set(config) != set(self.names):
            return f"config knobs {sorted(config)} differ from space knobs {sorted(self.names)}"
        for k in self.knobs:
            if config[k.name] not in k.values:
                return f"{k.name}={config[k.name]!r} not in {k.values}"
        cfg = config if isinstance(config, Config) else Config(config)
        for c in self.constraints:
            reason = c(cfg)
            if reason:
                return reason
        return None

    def is_valid(self, config: Mapping[str, Scalar]) -> bool:
        return self.why_invalid(config) is None

    def all_configs(self) -> list[Config]:
        """Every valid point, in knob-value order (cached). Walks the cross product knob by knob
        and drops a prefix as soon as a constraint that reads only the knobs set so far rejects
        it (a constraint is decided once it runs without reading an unset knob), instead of
        checking every point of the product: the same points in the same order."""
        if self._valid is None:
            self._valid = []
            if self.knobs:
                self._walk(0, {}, self.constraints)
            elif self.is_valid(Config()):  # the product of no knobs: one empty point
                self._valid.append(Config())
        return self._valid

    def _walk(self, depth: int, prefix: dict[str, Scalar],
              pending: tuple[Constraint, ...]) -> None:
        knob = self.knobs[depth]
        last = depth == len(self.knobs) - 1
        unset = frozenset(self.names[depth + 1:])
        for value in knob.values:
            values = {**prefix, knob.name: value}
            cfg = PartialConfig(values, unset)
            left = []
            for constraint in pending:
                try:
                    reason = constraint(cfg)
                except UnsetKnob:
                    left.append(constraint)
                    continue
                if reason:
                    break
            else:
                if last:
                    self._valid.append(Config(values))
                else:
                    self._walk(depth + 1, values, tuple(left))

    def __iter__(self) -> Iterator[Config]:
        return iter(self.all_configs())

    def __len__(self) -> int:
        return len(self.all_configs())

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Mapping) and self.is_valid(config)

    def sample(self, n: int, rng: random.Random) -> list[Config]:
        """Up to n distinct valid configs drawn uniformly."""
        pts = self.all_configs()
        return rng.sample(pts, min(n, len(pts)))

    def neighbors(self, config: Config) -> list[Config]:
        """Valid configs that differ from `config` by one step of one knob."""
        out = []
        for k in self.knobs:
            i = k.values.index(config[k.name])
            for j in (i - 1, i + 1):
                if 0 <= j < len(k.values):
                    cand = config.replace(**{k.name: k.values[j]})
                    if self.is_valid(cand):
                        out.append(cand)
        return out

    def mutate(self, config: Config, rng: random.Random, tries: int = 32) -> Config:
        """A random valid config that differs from `config` in one knob (itself if none found)."""
        for _ in range(tries):
            k = rng.choice(self.knobs)
            if len(k.values) < 2:
                continue
            v = rng.choice([x for x in k.values if x != config[k.name]])
            cand = config.replace(**{k.name: v})
            if self.is_valid(cand):
                return cand
        return config

    def index_vector(self, config: Config) -> list[int]:
        """Position of each knob's value in its candidate list (features, distances)."""
        return [k.values.index(config[k.name]) for k in self.knobs]

    def distance(self, a: Config, b: Config) -> float:
        """Normalized L1 distance between two configs over knob positions, in [0, 1]."""
        total = 0.0
        for k, i, j in zip(self.knobs, self.index_vector(a), self.index_vector(b), strict=True):
            total += abs(i - j) / max(1, len(k.values) - 1)
        return total / max(1, len(self.knobs))
