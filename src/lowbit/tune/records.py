"""The records database: one SQLite row per measurement, crash-safe and resumable.

WAL mode and one commit per measurement: a tuner killed with SIGKILL loses nothing it had
recorded, and a rerun skips what is there. The default file lives in lowbit's cache directory
(`lowbit.core.cache.cache_dir`); `LOWBIT_RECORDS` or an explicit path overrides it.

Rows are read as today's templates know them: a row of the single bit-serial template that the
bit-serial families replaced ("cuda.bitserial"), or an old `cuda.int8_wgmma` config, comes
back as its family's template and config (`lowbit.kernels.cuda.migrate_config`; the file
keeps what was written, `import_jsonl` adds the migrated rows). A row that names no kernel
of today keeps its old name and config, and `best` never returns it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..core import Config, Workload
from ..core.cache import cache_dir
from ..kernels.cuda import INT8_WGMMA, LEGACY, migrate_config

_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL,
    template TEXT NOT NULL,
    config TEXT NOT NULL,
    time_us REAL,
    error TEXT,
    gpu TEXT NOT NULL,
    driver TEXT, cuda TEXT, triton TEXT, torch TEXT,
    timestamp REAL NOT NULL,
    workload_json TEXT,
    compile_s REAL, run_s REAL
);
CREATE INDEX IF NOT EXISTS measurements_key ON measurements (workload, gpu, template);
"""
_COLUMNS = ("workload", "template", "config", "time_us", "error", "gpu", "driver", "cuda",
            "triton", "torch", "timestamp", "workload_json", "compile_s", "run_s")


def default_db_path() -> Path:
    """$LOWBIT_RECORDS, else records.sqlite in the cache directory (`core.cache.cache_dir`)."""
    env = os.environ.get("LOWBIT_RECORDS")
    return Path(env) if env else cache_dir("records.sqlite")


@dataclass(frozen=True)
class Record:
    """One measurement. `time_us` is the median kernel time in microseconds, or None with
    `error` saying why the candidate failed (compile, launch, crash, wrong result, timeout)."""

    workload: str
    template: str
    config: str  # Config.to_json()
    time_us: float | None
    error: str | None
    gpu: str
    driver: str = ""
    cuda: str = ""
    triton: str = ""
    torch: str = ""
    timestamp: float = field(default_factory=time.time)
    workload_json: str = ""
    compile_s: float | None = None
    run_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.time_us is not None

    @property
    def cfg(self) -> Config:
        return Config.from_json(self.config)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def of(cls, res: object, workload: Workload) -> Record:
        """The record of a `MeasureResult` of `workload` (its environment: GPU and versions)."""
        env = getattr(res, "env", None) or {}
        return cls(workload=res.workload, template=res.template, config=res.config.to_json(),
                   time_us=res.time_us, error=res.error, gpu=env.get("gpu", "unknown"),
                   driver=env.get("driver", ""), cuda=env.get("cuda", ""),
                   triton=env.get("triton", ""), torch=env.get("torch", ""),
                   workload_json=workload.to_json(), compile_s=res.compile_s,
                   run_s=res.run_s)


class RecordsDB:
    """SQLite-backed store of measurements (thread-confined: one connection per instance)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RecordsDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, rec: Record) -> None:
        """Insert and commit one measurement (autocommit: durable on return)."""
        self.add_many([rec])

    def add_many(self, recs: Iterable[Record]) -> None:
        rows = [tuple(getattr(r, c) for c in _COLUMNS) for r in recs]
        with self._conn:
            self._conn.executemany(
                f"INSERT INTO measurements ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})", rows)

    def _select(self, where: str = "", args: tuple = ()) -> list[Record]:
        cur = self._conn.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM measurements {where} ORDER BY id", args)
        return [migrated(Record(**dict(zip(_COLUMNS, row, strict=True)))) for row in cur]

    def _where(self, workload: Workload | str | None, gpu: str | None,
               template: str | None, ok: bool = False) -> list[Record]:
        """Rows matching the filters (a template's own rows and the legacy rows that may
        migrate to it, filtered after migration), oldest first; `ok`: successful only."""
        conds, args = ["time_us IS NOT NULL"] if ok else [], []
        for col, val in (("workload", _key(workload)), ("gpu", gpu)):
            if val is not None:
                conds.append(f"{col} = ?")
                args.append(val)
        if template is not None:
            conds.append("template IN (?, ?)")
            args += [template, LEGACY]
        rows = self._select("WHERE " + " AND ".join(conds) if conds else "", tuple(args))
        return rows if template is None else [r for r in rows if r.template == template]

    def records(self, workload: Workload | str | None = None, gpu: str | None = None,
                template: str | None = None) -> list[Record]:
        """All measurements matching the given filters, oldest first."""
        return self._where(workload, gpu, template)

    def measured(self, workload: Workload | str, template: str, gpu: str
                 ) -> dict[str, Record]:
        """config JSON -> latest record, for skipping what is already measured."""
        return {r.config: r for r in self.records(workload, gpu, template)}

    def best(self, workload: Workload | str, gpu: str | None = None,
             template: str | None = None) -> Record | None:
        """Fastest successful measurement of `workload` (on `gpu` when given) of a kernel
        that exists today (module doc)."""
        rows = [r for r in self._where(workload, gpu, template, ok=True) if _current(r)]
        return min(rows, key=lambda r: r.time_us) if rows else None

    def gpus(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT gpu FROM measurements")]

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]

    def __iter__(self) -> Iterator[Record]:
        return iter(self._select())

    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Write every record as one JSON object per line; returns the count."""
        recs = self._select()
        with open(path, "w") as f:
            for r in recs:
                f.write(r.to_json() + "\n")
        return len(recs)

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Add the records of a JSON-lines file (as today's templates know them, `migrated`),
        skipping exact duplicates; returns how many were added."""
        have = {(r.workload, r.template, r.config, r.gpu, r.timestamp) for r in self._select()}
        new = []
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = migrated(Record(**json.loads(line)))
                    if (r.workload, r.template, r.config, r.gpu, r.timestamp) not in have:
                        new.append(r)
        self.add_many(new)
        return len(new)


#: templates whose old rows `migrated` rewrites
_MIGRATED = (LEGACY, INT8_WGMMA.name)


def migrated(rec: Record) -> Record:
    """`rec` as today's templates know it: a legacy bit-serial row as its family's template
    and config, an old `cuda.int8_wgmma` config without the knobs that template lost
    (`migrate_config`); unchanged where nothing applies, or where the config names no
    kernel of today."""
    if rec.template not in _MIGRATED:
        return rec
    try:
        name, cfg = migrate_config(rec.template, rec.cfg)
    except ValueError:
        return rec
    text = cfg.to_json()
    if name == rec.template and text == rec.config:
        return rec
    return replace(rec, template=name, config=text)


def _current(rec: Record) -> bool:
    """Whether a `migrated` row names a kernel of today."""
    if rec.template not in _MIGRATED:
        return True
    try:
        return migrate_config(rec.template, rec.cfg) == (rec.template, rec.cfg)
    except ValueError:
        return False


def _key(workload: Workload | str | None) -> str | None:
    return workload.key if isinstance(workload, Workload) else workload
