"""A measurer that looks results up in a table: replays of measured spaces (the tuning
benchmark compares strategies offline against exhaustively measured tables) and tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core import Config
from .measure import MeasureInput, Measurer, MeasureResult, ResultCallback


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
