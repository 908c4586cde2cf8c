"""kill -9 during a tune loses nothing measured before it, and the rerun resumes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from lowbit.tune import RecordsDB, tune
from test_tune_fakes import TINY, FakeConvTemplate, SleepMeasurer

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_tune_fakes import TINY, FakeConvTemplate, SleepMeasurer
    from lowbit.tune import tune
    t = FakeConvTemplate(modes=("ok",), tiles=tuple(range(1, 41)))
    print("start", flush=True)
    tune(TINY, [t], trials=40, strategy="random", db={db!r}, measurer=SleepMeasurer(0.1),
         batch=4, progress=False)
    print("finished", flush=True)
""")


def _rows(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]


def test_sigkill_loses_nothing_and_rerun_resumes(tmp_path):
    db = tmp_path / "rec.sqlite"
    code = SCRIPT.format(tests=str(Path(__file__).parent), db=str(db))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline:
            if db.exists():
                try:
                    n = _rows(db)
                except sqlite3.OperationalError:
                    n = 0
                if n >= 6:
                    break
            time.sleep(0.05)
        assert n >= 6, "the tune never got going"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    after_kill = _rows(db)
    assert 6 <= after_kill < 40  # killed mid-way; every committed row is there
    with RecordsDB(db) as rdb:
        before = {r.config for r in rdb.records(TINY)}
    assert len(before) == after_kill
    m = SleepMeasurer(0.0)
    t = FakeConvTemplate(modes=("ok",), tiles=tuple(range(1, 41)))
    res = tune(TINY, [t], trials=40, strategy="random", db=db, measurer=m, batch=4,
               progress=False)
    assert len(m.measured) == 40 - after_kill  # the rerun measures only what is missing
    assert not {c.to_json() for c in m.measured} & before
    assert res.trials == 40 and res.config["tile"] == 1 and _rows(db) == 40
