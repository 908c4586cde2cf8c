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
