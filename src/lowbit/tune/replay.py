"""Replays of measured spaces: a measurer that looks results up in a table (the tuning
benchmark compares strategies offline against exhaustively measured tables; tests), a
strategy run against a table (`replay`), and a table seen as a space (`table_space`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core import Config, ConfigSpace, Knob
from .measure import MeasureInput, Measurer, MeasureResult, ResultCallback
from .strategies import Strategy, Trial


class TableMeasurer(Measurer):
    """`table[(template_name, config)]` -> time in microseconds, or an error string.

    A config missing from the table is an error ("missing: ...") so a replay never invents
    a time. `gpu` names the device the table was measured on (goes into the records).
    """

    def __init__(self, table: Mapping[tuple[str, Config], float | str], gpu: str = "table"
                 ) -> None:
        self.table = dict(table)
        self.gpu = gpu
        self.calls = 0

    def env(self) -> dict[str, str]:
        return {"gpu": self.gpu, "driver": "", "cuda": "", "triton": "", "torch": ""}

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: ResultCallback | None = None) -> list[MeasureResult]:
        out = []
        for inp in inputs:
            self.calls += 1
            got = self.table.get((inp.template.name, inp.config), "missing: not in the table")
            t, err = (None, got) if isinstance(got, str) else (float(got), None)
            res = MeasureResult(inp.template.name, inp.workload.key, inp.config, t, err,
                                env=self.env())
            out.append(res)
            if on_result is not None:
                on_result(res)
        return out


def trials_to_reach(order: Sequence[Config], times: dict[Config, float | None],
                    target_us: float) -> int | None:
    """Measurements, in `order`, until one is at or under `target_us` (None: never)."""
    for i, c in enumerate(order, 1):
        t = times.get(c)
        if t is not None and t <= target_us:
            return i
    return None


def replay(strategy: Strategy, times: dict[Config, float | None], target_us: float,
           batch: int = 8, limit: int | None = None) -> int | None:
    """Run `strategy` against measured `times` (a table of the whole space) in rounds of
    `batch`, as the tuner would; the number of measurements until one reaches `target_us`."""
    done = 0
    limit = limit or len(times)
    while done < limit:
        props = strategy.propose(batch)
        if not props:
            return None
        results = [Trial(c, times.get(c)) for c in props]
        for j, r in enumerate(results, 1):
            if r.time_us is not None and r.time_us <= target_us:
                return done + j
        strategy.update(results)
        done += len(results)
    return None


def table_space(configs: Sequence[Config]) -> ConfigSpace:
    """The space of exactly these configs (a measured table replayed as a space): each knob
    takes the values the table has, and one constraint per knob depth keeps the prefixes of
    table points only, so enumerating it walks the table, not the knobs' cross product."""
    names = sorted({k for c in configs for k in c})
    values = {n: sorted({c[n] for c in configs}, key=lambda v: (str(type(v)), v))
              for n in names}
    prefixes = [{tuple(c[n] for n in names[:d]) for c in configs}
                for d in range(len(names) + 1)]

    def depth(d: int):
        def in_table(c: Config) -> str | None:
            # reads knobs 0..d-1: the walk decides it as soon as they are set
            return None if tuple(c[n] for n in names[:d]) in prefixes[d] else "not in table"
        return in_table

    return ConfigSpace([Knob(n, tuple(values[n])) for n in names],
                       [depth(d) for d in range(1, len(names) + 1)])


def expected_random_trials(n: int, good: int) -> float:
    """Expected measurements of uniform random search without replacement until the first of
    `good` target configs among `n`: (n + 1) / (good + 1)."""
    return (n + 1) / (good + 1)
