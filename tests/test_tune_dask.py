"""Dask backend: a LocalCluster of two workers, each with its own crash-isolated CPU stand-in
measurer; results come back to the tuner, which writes them to one records database."""

from __future__ import annotations

import pytest

from lowbit.core import Config
from lowbit.tune import RecordsDB, tune
from lowbit.tune import dask_backend as backend
from test_tune_fakes import TINY, FakeConvTemplate

distributed = pytest.importorskip("distributed")


def test_two_workers_measure_into_one_records_db(tmp_path):
    fake = FakeConvTemplate(modes=("ok", "crash", "wrong"))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        m = backend.DaskMeasurer(client, gpus=None, device="cpu", compile_workers=0,
                                 timeout_s=20, warmup_ms=1, rep_ms=5)
        try:
            res = tune(TINY, [fake], trials=6, strategy="exhaustive", db=tmp_path / "r.sqlite",
                       measurer=m, batch=6, progress=False)
            used = {k[0] for k in backend._MEASURERS if k[1] == m.tag}
        finally:
            m.close()
        assert len(used) == 2  # both workers measured
        assert not any(k[1] == m.tag for k in backend._MEASURERS)  # closed on every worker
    # tile 1 vs 2 differ by less than the noise of two workers sharing two CPU cores: the
    # pick itself is pinned by the tuner tests; here it must be a good, fast candidate
    assert res.trials == 6 and res.config in (Config(tile=1, mode="ok"), Config(tile=2, mode="ok"))
    with RecordsDB(tmp_path / "r.sqlite") as db:
        rows = db.records(TINY)
    errors = {r.cfg["mode"]: r.error for r in rows if not r.ok}
    assert errors["crash"].startswith("crash:") and errors["wrong"].startswith("wrong:")
    assert len(rows) == 6
