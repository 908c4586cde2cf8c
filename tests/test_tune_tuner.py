"""End-to-end tune on the CPU with injected bad candidates; records, resume and dispatch."""

from __future__ import annotations

import numpy as np
import pytest

from lowbit.core import Config
from lowbit.kernels.base import get_template, register
from lowbit.reference import random_inputs, run
from lowbit.tune import LocalMeasurer, RecordsDB, TableMeasurer, kernel_for, tune
from test_tune_fakes import BAD_MODES, TINY, FakeConvTemplate


@pytest.fixture(scope="module")
def fake():
    try:
        return get_template("fake.conv")
    except ValueError:
        return register(FakeConvTemplate())


def test_tune_survives_bad_candidates_and_picks_the_true_best(fake, tmp_path):
    db = tmp_path / "rec.sqlite"
    with LocalMeasurer(device="cpu", compile_workers=0, timeout_s=4, warmup_ms=2,
                       rep_ms=10) as m:
        res = tune(TINY, [fake], trials=50, strategy="random", db=db, measurer=m,
                   batch=4, progress=False)
    assert res.template == "fake.conv"
    assert res.config == Config(tile=1, mode="ok")
    assert res.trials == 9 and res.failures == len(BAD_MODES)
    assert res.default_us["fake.conv"] is not None and res.speedup_over_default > 1
    with RecordsDB(db) as rdb:
        rows = rdb.records(TINY)
        assert len(rows) == 9
        errors = {r.cfg["mode"]: r.error for r in rows if not r.ok}
        assert set(errors) == set(BAD_MODES)
        assert all(r.gpu.startswith("cpu-") and r.torch and r.workload_json for r in rows)
        assert rdb.best(TINY).cfg == Config(tile=1, mode="ok")
    # dispatch from the records, no re-tuning: the kernel built is the recorded best
    k = kernel_for(TINY, db)
    assert k.config == Config(tile=1, mode="ok")
    x, w, p = random_inputs(TINY, seed=5)
    assert (k(x, w, p) == run(TINY, x, w, p)).all()


def _table(fake):
    return {(fake.name, c): float(c["tile"]) if c["mode"] == "ok" else "launch: boom"
            for c in fake.space(TINY)}


def test_rerun_measures_nothing_twice(fake, tmp_path):
    db = tmp_path / "rec.sqlite"
    m1 = TableMeasurer(_table(fake), gpu="g")
    r1 = tune(TINY, [fake], trials=5, strategy="random", db=db, measurer=m1, batch=2,
              progress=False, seed=1)
    assert r1.trials == 5 and m1.calls == 5
    m2 = TableMeasurer(_table(fake), gpu="g")
    r2 = tune(TINY, [fake], trials=9, strategy="random", db=db, measurer=m2, batch=2,
              progress=False, seed=2)
    assert m2.calls == 4 and r2.trials == 9  # only the 4 unmeasured ones
    with RecordsDB(db) as rdb:
        cfgs = [r.config for r in rdb.records(TINY)]
    assert len(cfgs) == len(set(cfgs)) == 9
    assert r2.config == Config(tile=1, mode="ok")
    m3 = TableMeasurer(_table(fake), gpu="other-gpu")  # another GPU: its own records
    tune(TINY, [fake], trials=3, strategy="random", db=db, measurer=m3, progress=False)
    assert m3.calls == 3


def test_template_choice_is_part_of_the_search(tmp_path):
    slow = FakeConvTemplate(modes=("ok",), tiles=(3, 4), name="fake.slow")
    quick = FakeConvTemplate(modes=("ok",), tiles=(1, 2), name="fake.quick")
    table = {(t.name, c): float(c["tile"]) for t in (slow, quick) for c in t.space(TINY)}
    res = tune(TINY, [slow, quick], trials=4, strategy="exhaustive", db=tmp_path / "r.sqlite",
               measurer=TableMeasurer(table), progress=False)
    assert res.template == "fake.quick" and res.config["tile"] == 1
    assert set(res.default_us) == {"fake.slow", "fake.quick"}


def test_round_shares_favour_a_clear_leader():
    from lowbit.tune.strategies import make_strategy
    from lowbit.tune.tuner import _Arm, _share

    def arm(best):
        t = FakeConvTemplate(modes=("ok",), tiles=(1, 2, 3))
        return _Arm(t, make_strategy("random", t.space(TINY), TINY, t), t.default_config(TINY),
                    best)

    assert _share([arm(None), arm(None)], 32) == [16, 16]          # no times yet: even
    assert _share([arm(10.0), arm(11.0)], 32) == [16, 16]          # a close lead: half
    assert _share([arm(13.0), arm(10.0)], 32) == [8, 24]           # 1.3x ahead: three quarters
    assert _share([arm(10.0), arm(None), arm(20.0)], 32) == [16, 8, 8]  # one untimed: half
    assert _share([arm(10.0), arm(12.0), arm(30.0)], 33) == [25, 4, 4]


def test_unsupported_and_bad_arguments(fake, tmp_path):
    from lowbit.core import GemmWorkload

    with pytest.raises(ValueError, match="no template supports"):
        tune(GemmWorkload(M=4, N=4, K=4), [fake], trials=2, db=tmp_path / "a.sqlite",
             measurer=TableMeasurer({}), progress=False)
    with pytest.raises(ValueError, match="strategy must be one of"):
        tune(TINY, [fake], trials=2, strategy="greedy", db=tmp_path / "b.sqlite",
             measurer=TableMeasurer({}), progress=False)
    with pytest.raises(ValueError, match="trials"):
        tune(TINY, [fake], trials=0, db=tmp_path / "c.sqlite", measurer=TableMeasurer({}),
             progress=False)


def test_dispatch_builds_a_record_older_than_a_knob(tmp_path):
    """A TMA config recorded before SPLIT_K existed still dispatches (as SPLIT_K = 1), and the
    cost model reads it for transfer."""
    from lowbit.core import load_workloads
    from lowbit.kernels.triton import CONV2D_INT8_TMA
    from lowbit.tune.cost_model import RankCostModel
    from lowbit.tune.records import Record

    wl = dict(load_workloads("resnet50_3x3_b16"))["resnet50_s5_3x3"]
    cfg = CONV2D_INT8_TMA.default_config(wl)
    old = Config({k: v for k, v in cfg.items() if k != "SPLIT_K"})
    with RecordsDB(tmp_path / "r.sqlite") as db:
        db.add(Record(wl.key, CONV2D_INT8_TMA.name, old.to_json(), 9.5, None, "gpu"))
        kernel = kernel_for(wl, db)
    assert kernel.config == cfg and kernel.config["SPLIT_K"] == 1
    model = RankCostModel(CONV2D_INT8_TMA, CONV2D_INT8_TMA.space(wl))
    assert model.complete(old) == cfg
    assert np.array_equal(model.rows(wl, [old]), model.rows(wl, [cfg]), equal_nan=True)


def test_time_budget_sizes_the_last_round(tmp_path):
    """With a budget, rounds after the first shrink to the trials that fit in what is left
    (at the measured seconds per trial): 10 trials of 0.1 s, then 5, not another 10."""
    from test_tune_fakes import SleepMeasurer

    fake = FakeConvTemplate(modes=("ok",), tiles=tuple(range(1, 101)))
    res = tune(TINY, [fake], trials=100, strategy="random", db=tmp_path / "r.sqlite",
               measurer=SleepMeasurer(0.1), batch=10, progress=False, time_budget_s=1.5)
    assert 10 <= res.trials <= 17  # a round of 10, then what fits in the ~0.5 s left
    assert res.wall_s < 1.5 + 0.45


class _EnvFailingMeasurer:
    """One good result, then an environment failure (the device went away)."""

    def env(self):
        return {"gpu": "fake-gpu"}

    def measure(self, inputs, on_result=None):
        from lowbit.tune.measure import MeasureResult

        out = []
        for i, inp in enumerate(inputs):
            err = "env: CUDA driver initialization failed" if i else None
            res = MeasureResult(inp.template.name, inp.workload.key, inp.config,
                                None if err else 1.0, err, env=self.env())
            if on_result:
                on_result(res)
            out.append(res)
        return out

    def close(self):
        pass


def test_environment_failures_are_not_stored_as_config_failures(fake, tmp_path):
    from lowbit.tune.measure import MeasureEnvironmentError

    db = tmp_path / "rec.sqlite"
    with pytest.raises(MeasureEnvironmentError, match="CUDA driver initialization failed"):
        tune(TINY, [fake], trials=8, strategy="random", db=db,
             measurer=_EnvFailingMeasurer(), batch=4, progress=False)
    with RecordsDB(db) as rdb:
        rows = rdb.records(TINY)
    assert len(rows) == 1 and rows[0].ok  # the good one only: a rerun retries the rest


def test_gpu_templates_on_a_cpu_measurer_are_refused_before_any_trial(tmp_path):
    from lowbit.tune.measure import MeasureEnvironmentError

    class GpuOnly(FakeConvTemplate):
        name = "fake.gpu-only"
        backend = "cuda"

    db = tmp_path / "rec.sqlite"
    with LocalMeasurer(device="cpu", compile_workers=0) as m, \
            pytest.raises(MeasureEnvironmentError, match=r"fake\.gpu-only.*CUDA GPU"):
        tune(TINY, [GpuOnly()], trials=4, db=db, measurer=m, progress=False)
    with RecordsDB(db) as rdb:
        assert len(rdb) == 0
