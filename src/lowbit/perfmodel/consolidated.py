"""The consolidated measurement dataset: results files that left the tree, one gzipped JSON line
each with its provenance and what `dataset.load_results` reads from it
(`dataset.consolidate` builds the records; `benchmarks/consolidate.py` folds files in)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .measurement import Measurement, file_stamp

#: the consolidated dataset's file name under a results folder (`consolidate`)
CONSOLIDATED = "measurements.jsonl.gz"


@dataclass(frozen=True)
class ConsolidatedFile:
    """One results file folded into the consolidated dataset: `path` relative to the results
    folder, its provenance (`benchmark`, `gpu`, `date`, `versions`, `rows`: how many rows
    it had), and what `load_results` / `paired_graph_offsets` read from it: its raw
    measurements (before `migrate` and `complete_configs`, which apply at load time as to
    files), its (workload name, precision) -> workload key pairs and its graph offsets."""

    path: str
    benchmark: str
    gpu: str
    date: str
    versions: Mapping
    rows: int
    measurements: tuple[Measurement, ...]
    workload_keys: tuple[tuple[tuple[str, str], str], ...] = ()
    graph_offsets: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        source, stamp = Path(self.path).name, file_stamp(Path(self.path).name)
        ms = []
        for m in self.measurements:
            if (m.gpu, m.source, m.stamp) != (self.gpu, source, stamp):
                raise ValueError(f"{self.path}: a measurement of {m.source} on {m.gpu!r}")
            ms.append({k: v for k, v in m.to_dict().items()
                       if k not in ("gpu", "source", "stamp")})
        return {"path": self.path, "benchmark": self.benchmark, "gpu": self.gpu,
                "date": self.date, "versions": dict(self.versions), "rows": self.rows,
                "workload_keys": [[n, p, k] for (n, p), k in self.workload_keys],
                "graph_offsets": list(self.graph_offsets), "measurements": ms}

    @classmethod
    def from_dict(cls, d: dict) -> ConsolidatedFile:
        source = Path(d["path"]).name
        ctx = {"gpu": d["gpu"], "source": source, "stamp": file_stamp(source)}
        return cls(d["path"], d["benchmark"], d["gpu"], d["date"], d.get("versions", {}),
                   int(d["rows"]),
                   tuple(Measurement.from_dict({**m, **ctx}) for m in d["measurements"]),
                   tuple(((n, p), k) for n, p, k in d.get("workload_keys", ())),
                   tuple(d.get("graph_offsets", ())))


def write_consolidated(records: Iterable[ConsolidatedFile], path: str | Path) -> int:
    """Write `records` as gzipped JSON lines (one results file a line, in path order, no
    time stamp or name in the gzip header: the same records give the same bytes); returns the
    number of measurements."""
    records = sorted(records, key=lambda r: path_order(r.path))
    text = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in records)
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
        f.write(text.encode())
    return sum(len(r.measurements) for r in records)


def path_order(path: str) -> tuple[str, ...]:  # the sort key of a path: as `sorted(paths)` orders
    return Path(path).parts


def read_consolidated(path: str | Path) -> list[ConsolidatedFile]:
    """The records `write_consolidated` wrote (an empty list when the file is missing)."""
    p = Path(path)
    if not p.exists():
        return []
    with gzip.open(p, "rt") as f:
        return [ConsolidatedFile.from_dict(json.loads(line)) for line in f if line.strip()]
