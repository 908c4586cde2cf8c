"""On a GPU: a short real tune of the Triton int8 conv template (verified, timed, recorded)."""

from __future__ import annotations

import pytest
import torch

from lowbit.core import ConvWorkload
from lowbit.tune import LocalMeasurer, RecordsDB, tune


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_short_triton_tune_on_gpu(tmp_path):
    from lowbit.kernels.triton import CONV2D_INT8

    wl = ConvWorkload(N=2, H=9, W=9, C=32, K=48, R=3, S=3, stride=1, pad=1)
    with LocalMeasurer(device="cuda", compile_workers=4, warmup_ms=2, rep_ms=10) as m:
        res = tune(wl, [CONV2D_INT8], trials=8, strategy="random", db=tmp_path / "r.sqlite",
                   measurer=m, batch=8, progress=False)
    assert res.time_us is not None and res.trials == 8
    with RecordsDB(tmp_path / "r.sqlite") as db:
        rows = db.records(wl)
    assert len(rows) == 8 and all(r.gpu == torch.cuda.get_device_name() for r in rows)
