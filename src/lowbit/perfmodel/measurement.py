"""One verified timing (`Measurement`) and the sortable date of a results file (`file_stamp`):
the rows `lowbit.perfmodel.dataset` reads and the consolidated dataset stores.

Timing: "events" (CUDA events around one launch, what `lowbit.tune` measures) or "graph"
(CUDA-graph replay), which leaves out about 4 us of launch overhead (`GRAPH_OFFSET_US`: the
median difference of 240 same-config pairs, `dataset.paired_graph_offsets`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core import Config, Workload, workload_from_dict

GRAPH_OFFSET_US = 3.96
TIMINGS = ("events", "graph")


@dataclass(frozen=True)
class Measurement:
    """One verified timing. `time_us` as measured with `timing` ("events" or "graph");
    `source`: the file (or records database) it came from, `stamp` its date for ordering."""

    gpu: str
    template: str
    workload: Workload
    config: Config
    time_us: float
    timing: str = "events"
    source: str = ""
    stamp: str = ""

    @property
    def events_us(self) -> float:
        """The time on the events scale (what `lowbit.tune` measures)."""
        return self.time_us + (GRAPH_OFFSET_US if self.timing == "graph" else 0.0)

    @property
    def layer(self) -> str:
        """The layer's shape, without precisions or epilogue: the unit held out together."""
        return self.workload.key.split("|", 1)[0]

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "template": self.template, "workload": self.workload.to_dict(),
                "config": dict(self.config), "time_us": self.time_us, "timing": self.timing,
                "source": self.source, "stamp": self.stamp}

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        return cls(d["gpu"], d["template"], workload_from_dict(d["workload"]),
                   Config(d["config"]), float(d["time_us"]), d.get("timing", "events"),
                   d.get("source", ""), d.get("stamp", ""))


_STAMP = re.compile(r"(\d{8})(?:-(\d{6}|s\d+))?")


def file_stamp(name: str) -> str:
    """Sortable date of a results file from its name ('20261126-044801', '20261125-s18')."""
    m = _STAMP.search(name)
    if not m:
        return ""
    return m.group(1) + "-" + (m.group(2) or "")
