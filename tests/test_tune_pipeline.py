"""The network tuner's pipeline on the CPU with stand-ins: builds overlap measurements, every
GPU slot gets work, the budget is spent by share, a rerun measures nothing twice, and a build
that crashes or hangs costs only its own candidate."""

from __future__ import annotations

import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowbit.core import Config
from lowbit.tune import RecordsDB
from lowbit.tune.buildpool import BuildPool
from lowbit.tune.pipeline import PipelineTuner, TuneTask
from lowbit.tune.workers import MeasurerSlot, PoolBuilder
from test_tune_fakes import TINY, FakeConvTemplate, SleepMeasurer


def template(n: int, name: str = "fake.pipe") -> FakeConvTemplate:
    """Configs tile=1..n (mode "ok"); the default is tile n."""
    return FakeConvTemplate(modes=("ok",), tiles=tuple(range(1, n + 1)), name=name)


def task(tmpl: FakeConvTemplate, quota_s: float = 1.0, name: str = "conv", wl=TINY
         ) -> TuneTask:
    return TuneTask(name, wl, (tmpl,), (tmpl, tmpl.default_config(wl)), quota_s)


def sleep_compile(delay_s: float):
    def compile_one(template, wl_json, cfg_json):
        time.sleep(delay_s)
        return None, delay_s
    return compile_one


def run(tasks, slots, db, budget_s=60.0, build_s=0.0, workers=2, builder=None, **kw):
    with ThreadPoolExecutor(workers) as pool:
        builder = builder or PoolBuilder(pool, workers, compile_fn=sleep_compile(build_s))
        tuner = PipelineTuner(tasks, slots, builder, db, budget_s, strategy="exhaustive", **kw)
        t0 = time.perf_counter()
        result = tuner.run()
        return result, time.perf_counter() - t0


def rows(path) -> list[tuple]:
    with sqlite3.connect(path) as c:
        return c.execute("SELECT config, time_us, error FROM measurements").fetchall()


def test_builds_overlap_measurements(tmp_path):
    """12 candidates, 0.1 s to build and 0.1 s to measure each: built two at a time ahead of
    the one measuring slot, the session takes about the measuring time, not the sum."""
    tmpl = template(12)
    with RecordsDB(tmp_path / "r.sqlite") as db:
        result, wall = run([task(tmpl)], [MeasurerSlot(SleepMeasurer(0.1))], db, build_s=0.1)
    serial = 12 * (0.1 + 0.1)
    assert wall < 0.75 * serial, (wall, result.stats)
    st = result.stats
    assert st["trials"] == 12 and st["build"]["jobs"] == 12 and st["gpus"][0]["measured"] == 12
    assert st["gpus"][0]["measure_s"] == pytest.approx(1.2, rel=0.5)
    (t,) = result.tasks
    assert t["default_us"] == 12.0 and t["best_us"] == 1.0 and t["speedup"] == 12.0
    assert len(rows(tmp_path / "r.sqlite")) == 12


def test_two_slots_share_the_work(tmp_path):
    """Two GPU slots behind one shared build: each measures about half, neither idles; a
    slot three times slower gets about a third of the candidates of the other."""
    with RecordsDB(tmp_path / "r.sqlite") as db:
        result, _ = run([task(template(400))], [MeasurerSlot(SleepMeasurer(0.02)),
                                                MeasurerSlot(SleepMeasurer(0.02))],
                        db, budget_s=2.0, workers=4)
    a, b = (g["measured"] for g in result.stats["gpus"])
    assert a > 15 and b > 15 and abs(a - b) <= max(3, 0.15 * (a + b)), (a, b)
    assert all(g["busy"] > 0.6 for g in result.stats["gpus"]), result.stats["gpus"]
    with RecordsDB(tmp_path / "s.sqlite") as db:
        result, _ = run([task(template(400))], [MeasurerSlot(SleepMeasurer(0.015)),
                                                MeasurerSlot(SleepMeasurer(0.045))],
                        db, budget_s=2.0, workers=4)
    fast, slow = (g["measured"] for g in result.stats["gpus"])
    assert 1.8 < fast / slow < 4.5, (fast, slow)


def test_budget_goes_by_share(tmp_path):
    """Two workloads with quotas 3:1 spend GPU-seconds about 3:1; each starts with its
    default."""
    big, small = template(400, "fake.big"), template(400, "fake.small")
    with RecordsDB(tmp_path / "r.sqlite") as db:
        result, _ = run([task(big, 3.0, "big"), task(small, 1.0, "small")],
                        [MeasurerSlot(SleepMeasurer(0.02))], db, budget_s=2.5, workers=4)
    tb, ts = result.tasks
    assert tb["trials"] > 30 and ts["trials"] > 10
    assert 2.0 < tb["spent_s"] / ts["spent_s"] < 4.5, (tb, ts)
    assert tb["default_us"] == ts["default_us"] == 400.0  # the default is measured first


def test_a_rerun_measures_nothing_twice(tmp_path):
    path = tmp_path / "r.sqlite"
    tmpl = template(30)
    with RecordsDB(path) as db:  # cut short by the budget
        first, _ = run([task(tmpl)], [MeasurerSlot(SleepMeasurer(0.05))], db, budget_s=0.6)
    n = first.stats["trials"]
    assert 3 <= n < 30
    with RecordsDB(path) as db:
        second, _ = run([task(tmpl)], [MeasurerSlot(SleepMeasurer(0.01))], db)
    assert second.stats["resumed"] == n and second.stats["trials"] == 30 - n
    configs = [c for c, _, _ in rows(path)]
    assert len(configs) == len(set(configs)) == 30
    (t,) = second.tasks
    assert t["default_us"] == 30.0 and t["best_us"] == 1.0  # the default from the first run
    with RecordsDB(path) as db:  # all measured: nothing to do
        third, _ = run([task(tmpl)], [MeasurerSlot(SleepMeasurer(0.01))], db)
    assert third.stats["trials"] == 0 and third.stats["resumed"] == 30


def crash_or_hang_compile(template, wl_json, cfg_json):
    """In a `BuildPool` process: tile 2's build kills its process, tile 3's never ends."""
    tile = Config.from_json(cfg_json)["tile"]
    if tile == 2:
        os._exit(3)
    if tile == 3:
        time.sleep(600)
    return None, 0.0


def test_a_crashing_or_hanging_build_costs_only_its_own_candidate(tmp_path):
    pool = BuildPool(2, timeout_s=4.0)
    try:
        builder = PoolBuilder(pool, compile_fn=crash_or_hang_compile)
        with RecordsDB(tmp_path / "r.sqlite") as db:
            result, _ = run([task(template(6))], [MeasurerSlot(SleepMeasurer(0.01))], db,
                            builder=builder, budget_s=600.0)  # ends when all 6 are done
    finally:
        pool.shutdown()
    got = {Config.from_json(c)["tile"]: (t, e) for c, t, e in rows(tmp_path / "r.sqlite")}
    assert set(got) == {1, 2, 3, 4, 5, 6}
    assert got[2][1].startswith("compile: crash: the build process died (exit code 3)")
    assert got[3][1].startswith("timeout: build over 4 s")
    assert all(got[t] == (float(t), None) for t in (1, 4, 5, 6))
    st = result.stats
    assert st["build"]["failed"] == 2 and st["trials"] == 6 and st["failures"] == 2


class DownMeasurer(SleepMeasurer):
    """A device that is lost after `after` candidates."""

    def __init__(self, after: int) -> None:
        super().__init__(0.01)
        self.after = after

    def measure(self, inputs, on_result=None):
        from lowbit.tune.measure import MeasureEnvironmentError

        if len(self.measured) >= self.after:
            raise MeasureEnvironmentError("fake device lost")
        return super().measure(inputs, on_result)


def test_a_lost_gpu_leaves_the_work_to_the_others(tmp_path):
    from lowbit.tune.measure import MeasureEnvironmentError

    with RecordsDB(tmp_path / "r.sqlite") as db:
        result, _ = run([task(template(20))], [MeasurerSlot(DownMeasurer(3)),
                                               MeasurerSlot(SleepMeasurer(0.01))], db)
    lost, kept = result.stats["gpus"]
    assert "fake device lost" in lost["error"] and lost["measured"] == 3
    assert lost["measured"] + kept["measured"] == 20 == len(rows(tmp_path / "r.sqlite"))
    with RecordsDB(tmp_path / "s.sqlite") as db, \
            pytest.raises(MeasureEnvironmentError, match="every measuring GPU failed"):
        run([task(template(20))], [MeasurerSlot(DownMeasurer(2))], db)
    assert len(rows(tmp_path / "s.sqlite")) == 2  # what was measured stays recorded
