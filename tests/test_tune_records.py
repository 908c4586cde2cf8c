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


def test_old_bitserial_and_int8_rows_read_as_todays_templates(tmp_path):
    """Rows of the single "cuda.bitserial" template (every kernel parameter in the config, or
    fewer where recorded before a knob existed) and old cuda.int8_wgmma configs come back as
    their family's template and config; a legacy kernel no family has keeps its name and is
    never the best."""
    from lowbit.core import ConvWorkload, Epilogue
    from lowbit.kernels.cuda import INT8_WGMMA, LEGACY, TAP_SHIFT, WGMMA, WGMMA_PERSISTENT

    bits = ConvWorkload(N=2, H=8, W=8, C=64, K=64, R=3, S=3, pad=1, w="b1", a="u2",
                        w_layout="bitplane", a_layout="bitplane",
                        epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"))
    int8 = bits.replace(w="s8", a="s8", w_layout="int8", a_layout="int8",
                        epilogue=Epilogue(bias=True, relu=True, out="s8"))
    cases = []  # (workload, old template, old config, want template, want config, time)
    for family, t in ((WGMMA, 4.0), (WGMMA_PERSISTENT, 3.0), (TAP_SHIFT, 5.0)):
        cfg = family.default_config(bits, "sm_90a")
        spec = dict(family.spec(cfg))
        cases.append((bits, LEGACY, spec, family.name, cfg, t))
    old = dict(WGMMA.spec(WGMMA.default_config(bits, "sm_90a", plain=True)))
    lean = {k: v for k, v in old.items() if k not in ("THR_PAIRS", "PLANE_ROWS", "TMA_HALO")}
    cases.append((bits, LEGACY, lean, WGMMA.name, WGMMA.config_of(old), 6.0))
    cfg8 = INT8_WGMMA.default_config(int8, "sm_90a")
    old8 = {**cfg8, "MMA": "wgmma", "WM": 64, "ROWSUM": "mma", "SPLIT_K": 1}
    cases.append((int8, INT8_WGMMA.name, old8, INT8_WGMMA.name, cfg8, 7.0))
    gone = [{**old, "SPLIT_K": 2},  # split-K wgmma kernels left with the split
            {**old, "PREFETCH": 1}]  # a probe's variant of the kernel
    with RecordsDB(tmp_path / "r.sqlite") as db:
        for wl, name, config, _, _, t in cases:
            db.add(Record(wl.key, name, Config(config).to_json(), t, None, "H100"))
        for cfg in gone:
            db.add(Record(bits.key, LEGACY, Config(cfg).to_json(), 1.0, None, "H100"))
        got = [r for r in db.records(bits) if r.template != LEGACY] + db.records(int8)
        checked = 0
        for (wl, _, _, name, cfg, t), rec in zip(cases, got, strict=True):
            assert (rec.workload, rec.template, rec.cfg, rec.time_us) == (wl.key, name, cfg, t)
            assert rec.config in db.measured(wl, name, "H100")
            checked += 1
        assert checked == len(cases) == 5
        assert [r.cfg for r in db.records(bits, template=LEGACY)] == [Config(c) for c in gone]
        best = db.best(bits, "H100")
        assert (best.template, best.time_us) == (WGMMA_PERSISTENT.name, 3.0)
        assert [r.time_us for r in db.records(template=WGMMA.name)] == [4.0, 6.0]
        assert db.export_jsonl(tmp_path / "r.jsonl") == 7
    with RecordsDB(tmp_path / "b.sqlite") as b:
        assert b.import_jsonl(tmp_path / "r.jsonl") == 7
        assert b.import_jsonl(tmp_path / "r.jsonl") == 0
        assert {r.template for r in b} == {c[3] for c in cases} | {LEGACY}
