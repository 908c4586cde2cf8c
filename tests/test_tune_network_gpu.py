"""On a GPU: a 60-second tune of ResNet-18 b8 w1a2 (`lowbit tune --model`'s session) records
its workloads' measurements and reaches the network's plan; the network is timed before and
after in the same process, with the same logits."""

from __future__ import annotations

import pytest
import torch

from lowbit.tune import RecordsDB


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_60_second_resnet18_tune_records_and_reaches_the_plan(tmp_path):
    from lowbit.tune_network import tune_network, write_results

    db = tmp_path / "r.sqlite"
    session = tune_network("resnet18", 8, "w1a2", 60.0, db=db, progress=False)
    tuning, *network = session["rows"]
    assert tuning["row"] == "tuning" and tuning["gpus"] == torch.cuda.device_count()
    # every workload's default, and candidates of the model's order beyond them
    assert tuning["trials"] > tuning["workloads"] and tuning["failures"] < tuning["trials"]
    assert tuning["tune_wall_s"] < 60.0 + 30.0  # the budget, a measurement in flight
    measured = [t for t in session["tasks"] if t["best_us"] is not None]
    assert len(measured) == tuning["workloads"]  # every workload got its default at least
    assert all(t["default_us"] is not None and t["best_us"] <= t["default_us"]
               for t in measured)
    # every layer of a measured workload reads its record ('tuned'); same integers out
    assert tuning["layers_tuned"] == sum(t["count"] for t in measured)
    assert tuning["tuned_logits_equal"]
    assert {r["chooser"] for r in network} == {"default", "tuned", "model"}
    assert all(r["time_ms"] > 0 for r in network)
    assert tuning["network_ms_before"] / tuning["network_ms_after"] == tuning["speedup"]
    split = tuning["time_split"]
    assert split["build"]["jobs"] > 0 and all(g["measured"] > 0 for g in split["gpus"])
    with RecordsDB(db) as rdb:
        rows = rdb.records()
    assert len(rows) == tuning["trials"]
    assert {r.gpu for r in rows} == {torch.cuda.get_device_name()}
    assert {r.workload for r in rows} == {t["workload"] for t in session["tasks"]}
    path = write_results(session, tmp_path / "results")
    assert path.name.startswith("tuning_network-") and path.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_reference_runs_every_network_workload_on_the_gpu_as_on_the_cpu():
    """The tuner checks each candidate against `lowbit.reference.run` on the measuring GPU:
    every workload form a narrow-stream network tunes (block ends, 32-bit requantization,
    derived outputs) runs there with the CPU's integers."""
    from lowbit.graph.chooser import _layout_twins
    from lowbit.reference import random_inputs, run
    from lowbit.tune.network import network_workloads
    from lowbit.tune_network import _plan, quantized_model

    q, size, channels = quantized_model("resnet18", "w1a2", residual_bits=8, device="cpu")
    plan = _plan(q, torch.randn(2, channels, size // 4, size // 4), False)
    items, _ = network_workloads(plan, _layout_twins)
    checked = 0
    for item in items:
        wl = item.workload
        x, w, params = random_inputs(wl, 5)
        want = [run(wl, x, w, params), *params.derived_out]
        x, w, params = random_inputs(wl, 5, device="cuda")
        got = [run(wl, x, w, params), *params.derived_out]
        assert all(t.device.type == "cuda" for t in got)
        assert all(torch.equal(g.cpu(), t) for g, t in zip(got, want, strict=True)), wl.key
        checked += 1
    assert checked == len(items) >= 8
