"""Records database: WAL, one row per measurement, best, skip-what-is-measured, JSON lines."""

from __future__ import annotations

import sqlite3

from lowbit.core import Config
from lowbit.tune import Record, RecordsDB, default_db_path
from test_tune_fakes import TINY


def _rec(tile: int, t: float | None, gpu: str = "H100", wl: str = TINY.key) -> Record:
    return Record(workload=wl, template="fake.conv", config=Config(tile=tile).to_json(),
                  time_us=t, error=None if t is not None else "launch: boom", gpu=gpu,
                  driver="580", cuda="13.0", triton="3.6.0", torch="2.11.0",
                  workload_json=TINY.to_json())


def test_wal_rows_best_measured(tmp_path):
    path = tmp_path / "r.sqlite"
    with RecordsDB(path) as db:
        db.add(_rec(1, 5.0))
        db.add_many([_rec(2, 3.0), _rec(3, None), _rec(4, 1.0, gpu="A100")])
        assert len(db) == 4
        assert db.best(TINY, "H100").cfg == Config(tile=2)
        assert db.best(TINY).cfg == Config(tile=4)  # any GPU
        assert db.best("conv2d(other)") is None
        assert set(db.measured(TINY, "fake.conv", "H100")) == {
            Config(tile=n).to_json() for n in (1, 2, 3)}
        assert sorted(db.gpus()) == ["A100", "H100"]
        failed = [r for r in db.records(TINY, "H100") if not r.ok]
        assert failed[0].error == "launch: boom" and failed[0].time_us is None
    with sqlite3.connect(path) as c:  # committed and in WAL mode
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        row = c.execute("SELECT gpu, driver, cuda, triton, torch, timestamp FROM measurements"
                        " WHERE id = 1").fetchone()
        assert row[:5] == ("H100", "580", "13.0", "3.6.0", "2.11.0") and row[5] > 0


def test_jsonl_export_import_round_trip(tmp_path):
    with RecordsDB(tmp_path / "a.sqlite") as a:
        a.add_many([_rec(1, 5.0), _rec(2, None)])
        assert a.export_jsonl(tmp_path / "r.jsonl") == 2
    with RecordsDB(tmp_path / "b.sqlite") as b:
        assert b.import_jsonl(tmp_path / "r.jsonl") == 2
        assert b.import_jsonl(tmp_path / "r.jsonl") == 0  # duplicates skipped
        assert [r.to_json() for r in b] == [r.to_json() for r in
                                             RecordsDB(tmp_path / "a.sqlite")]


def test_default_path_user_cache_and_override(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv("LOWBIT_RECORDS", raising=False)
    assert default_db_path().parent == platformdirs.user_cache_path("lowbit")
    monkeypatch.setenv("LOWBIT_RECORDS", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    with RecordsDB() as db:
        assert db.path == tmp_path / "x.sqlite" and len(db) == 0
