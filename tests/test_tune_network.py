"""Tuning a network (`lowbit.tune.network`, `lowbit tune --model`) on the CPU with stand-ins:
the plan's distinct workloads, the budget split by share, the tuned records reaching the
network's plan, a Dask cluster of two workers, and the command's answers without a GPU."""

from __future__ import annotations

import io
import warnings
from concurrent.futures import Future

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from engine_cases import calibrated
from lowbit.cli import app, parse_budget
from lowbit.core import Config
from lowbit.graph.chooser import TUNED, _layout_twins
from lowbit.kernels import get_template
from lowbit.runtime.compiled import compile_model
from lowbit.tune import RecordsDB
from lowbit.tune.measure import MeasureResult
from lowbit.tune.network import (
    FLOOR_TRIALS,
    NetworkWorkload,
    network_tasks,
    network_workloads,
    split_budget,
    tune_tasks,
)
from lowbit.tune.pipeline import DEFAULT_TRIAL_S, TuneTask, _Task, reweight
from lowbit.tune.strategies import pruned_order_job
from lowbit.tune.workers import Builder, MeasurerSlot
from test_tune_cli import _error, _registered
from test_tune_fakes import TINY, FakeConvTemplate, SleepMeasurer

GPU = "NVIDIA H100 80GB HBM3"


# ------------------------------------------------------------------------------ budget
def test_split_budget_floors_then_shares():
    # weights 20, 5, 4 (10 us x 2 layers, 5 us x 1, 1 us x 4); 100 GPU-seconds, floor 1.2
    q = split_budget([20.0, 5.0, 4.0], 100.0, 1.2)
    left = 100.0 - 3 * 1.2
    assert q == pytest.approx([1.2 + left * 20 / 29, 1.2 + left * 5 / 29, 1.2 + left * 4 / 29])
    assert q == pytest.approx([67.682758, 17.820690, 14.496552])
    assert sum(q) == pytest.approx(100.0)
    # a budget below the floors: the largest shares get theirs first, the rest nothing
    assert split_budget([4.0, 20.0, 5.0], 2.0, 1.2) == pytest.approx([0.0, 1.2, 0.8])
    assert split_budget([0.0, 0.0], 3.0, 1.0) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="must be >= 0"):
        split_budget([1.0, -1.0], 10.0, 1.0)


def test_network_tasks_weigh_predicted_time_by_layer_count():
    fake = _registered(FakeConvTemplate(modes=("ok",), tiles=(1, 2, 3), name="fake.net"))
    cfg = Config(tile=3, mode="ok")
    items = [NetworkWorkload(TINY, ("layer.a", "layer.b"), ("fake.net",), ("fake.net", cfg)),
             NetworkWorkload(TINY, ("layer.c",), ("fake.net",), ("fake.net", cfg)),
             NetworkWorkload(TINY, tuple(f"layer.d{i}" for i in range(4)), ("fake.net",),
                             ("fake.net", cfg))]
    predicted = {"layer.a": 10.0, "layer.c": 5.0, "layer.d0": 1.0}
    tasks = network_tasks(items, 50.0, gpus=2, predict=lambda it: predicted[it.layers[0]])
    floor = FLOOR_TRIALS * DEFAULT_TRIAL_S
    assert [t.quota_s for t in tasks] == pytest.approx(split_budget([20, 5, 4], 100.0, floor))
    assert [t.name for t in tasks] == ["a x2", "c", "d0 x4"]
    assert [t.count for t in tasks] == [2, 1, 4]
    assert all(t.default == (fake, cfg) and t.templates == (fake,) for t in tasks)
    assert [t.weight_us for t in tasks] == [20.0, 5.0, 4.0]
    assert all(t.floor_s == pytest.approx(min(t.quota_s, floor)) for t in tasks)


def test_measured_defaults_reweight_the_quotas():
    """Each measured default re-weights the shares: measured time x layers where measured,
    else the prediction scaled by the median measured / predicted ratio; floors and the
    budget's total stay; nothing moves without predictions."""
    fake = _registered(FakeConvTemplate(modes=("ok",), tiles=(1, 2, 3), name="fake.rew"))
    cfg = Config(tile=3, mode="ok")
    specs = [TuneTask(n, TINY, (fake,), (fake, cfg), quota_s=q, count=c, weight_us=w,
                      floor_s=1.0)
             for n, q, c, w in [("a", 6.0, 1, 100.0), ("b", 3.0, 2, 40.0), ("c", 3.0, 1, 20.0)]]
    tasks = [_Task(t) for t in specs]
    assert [t.quota_s for t in tasks] == [6.0, 3.0, 3.0]
    reweight(tasks)  # no default measured yet: unchanged
    assert [t.quota_s for t in tasks] == [6.0, 3.0, 3.0]
    tasks[1].default_us = 60.0  # 2 layers x 60 us = 120: three times its prediction
    reweight(tasks)
    weights = [100.0 * 3, 120.0, 20.0 * 3]
    want = [1.0 + 9.0 * w / sum(weights) for w in weights]
    assert [t.quota_s for t in tasks] == pytest.approx(want)
    assert sum(t.quota_s for t in tasks) == pytest.approx(12.0)
    tasks[0].default_us, tasks[2].default_us = 10.0, 30.0  # ratios 0.1, 3, 1.5
    reweight(tasks)
    weights = [10.0, 120.0, 30.0]
    assert [t.quota_s for t in tasks] == pytest.approx([1.0 + 9.0 * w / 160.0 for w in weights])
    bare = [_Task(TuneTask("d", TINY, (fake,), (fake, cfg), quota_s=2.0))]
    bare[0].default_us = 5.0
    reweight(bare)
    assert bare[0].quota_s == 2.0


# ------------------------------------------------------------------------------ the plan
@pytest.fixture(scope="module")
def resnet():
    q, x = calibrated("resnet18", "w1a2", seed=3, width=0.125)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = compile_model(q, x, executor="reference", records=False).plan
    return q, x, plan


def test_network_workloads_are_the_plans_distinct_final_workloads(resnet):
    _, _, plan = resnet
    items, skipped = network_workloads(plan, _layout_twins)
    assert skipped == [("layer.conv1", "the fused Triton stem runs it: no template config")]
    assert sum(it.count for it in items) + len(skipped) == len(plan.layers)
    assert len({it.workload.key for it in items}) == len(items) >= 15
    for it in items:
        steps = [s for s in plan.layers if s.name in it.layers]
        assert all(s.workload == it.workload for s in steps)
        assert it.default == (steps[0].impl, steps[0].config)
        assert it.default[0] in it.templates
        assert list(it.templates) == _layout_twins(it.workload, it.default[0])
    shared = next(it for it in items if it.count > 1)  # two blocks' first convs
    assert shared.name.endswith(f"x{shared.count}")


class OrderBuilder(Builder):
    """Builds nothing (every build succeeds at once); the pruned order of a template is
    `orders[name]` (a stand-in for the performance model's order); records its jobs."""

    shared, workers = True, 4

    def __init__(self, orders):
        self.orders, self.jobs = orders, []

    @staticmethod
    def _done(value):
        fut = Future()
        fut.set_result(value)
        return fut

    def build(self, inp, slot):
        return self._done((None, 0.0))

    def run(self, fn, *args):
        assert fn is pruned_order_job
        template, wl_json, gpu = args
        self.jobs.append((template.name, gpu))
        order = self.orders(template, wl_json)
        return self._done(([c.to_json() for c in order], len(order), 0.0))


class TimesMeasurer(SleepMeasurer):
    """Time 5 us for the configs in `fast`, 10 us for the others."""

    def __init__(self, fast):
        super().__init__(0.0)
        self.fast = fast

    def env(self):
        return {"gpu": GPU}

    def measure(self, inputs, on_result=None):
        return [MeasureResult(i.template.name, i.workload.key, i.config,
                              5.0 if i.config in self.fast else 10.0, None, env=self.env())
                for i in inputs]


def test_a_tuned_network_plan_reads_the_new_records(resnet, tmp_path):
    """The pruned tune of two of the plan's workloads (orders from a stand-in model, times
    from a stand-in GPU) records their final workloads; the plan compiled with those records
    runs the faster config on every layer of those workloads, as 'tuned'."""
    q, x, plan = resnet
    items, _ = network_workloads(plan, _layout_twins)
    picked = [items[0], items[2]]
    other = {}
    for it in picked:
        name, cfg = it.default
        space = get_template(name).space(it.workload, arch="sm_90a")
        other[it.workload.key] = next(c for c in space.neighbors(cfg) if c != cfg)

    def orders(template, wl_json):  # the default's template: one other config, then the default
        for it in picked:
            if it.workload.to_json() == wl_json and template.name == it.default[0]:
                return [other[it.workload.key], it.default[1]]
        return []

    builder = OrderBuilder(orders)
    tasks = network_tasks(picked, 30.0, predict=lambda it: 1.0)
    db = tmp_path / "r.sqlite"
    out = io.StringIO()
    result = tune_tasks(tasks, 30.0, db, slots=[MeasurerSlot(TimesMeasurer(set(other.values())))],
                        builder=builder, console=Console(file=out, width=150))
    assert {g for _, g in builder.jobs} == {GPU}  # orders for this GPU
    assert len(builder.jobs) == sum(len(it.templates) for it in picked)
    for t in result.tasks:
        assert (t["trials"], t["default_us"], t["best_us"], t["speedup"]) == (2, 10.0, 5.0, 2.0)
    assert "layer1_0_conv1 x2" in out.getvalue() and "2.00x" in out.getvalue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuned = compile_model(q, x, executor="reference", records=db).plan
    keys = {it.workload.key for it in picked}
    hit = [s for s in tuned.layers if s.workload.key in keys]
    assert len(hit) == sum(it.count for it in picked) == 3
    for s in hit:
        assert (s.config, s.config_source) == (other[s.workload.key], TUNED), s.name
        assert GPU in s.config_reason
    assert all(s.config_source != TUNED for s in tuned.layers if s.workload.key not in keys)


# ------------------------------------------------------------------------------ Dask
def fake_factory(gpu_index):
    return SleepMeasurer(0.02)


def instant_compile(template, wl_json, cfg_json):
    return None, 0.0


def test_dask_cluster_of_two_workers_tunes_into_one_records_db(tmp_path):
    distributed = pytest.importorskip("distributed")
    fake = FakeConvTemplate(modes=("ok",), tiles=tuple(range(1, 41)), name="fake.dask")
    tasks = [TuneTask("a", TINY, (fake,), (fake, fake.default_config(TINY)), 1.0)]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        result = tune_tasks(tasks, 60.0, tmp_path / "r.sqlite", scheduler=client,
                            build_workers=0, strategy="exhaustive", progress=False,
                            factory=fake_factory, compile_fn=instant_compile)
    a, b = (g["measured"] for g in result.stats["gpus"])
    assert a + b == 40 and a >= 10 and b >= 10, (a, b)
    assert result.stats["build"]["jobs"] == 40
    with RecordsDB(tmp_path / "r.sqlite") as db:
        assert len(db.records(TINY)) == 40 and db.best(TINY).cfg["tile"] == 1


# ------------------------------------------------------------------------------ the command
def test_budget_text():
    assert [parse_budget(t) for t in ("10m", "90s", "90", "1.5h")] == [600.0, 90.0, 90.0, 5400.0]
    for bad in ("", "m", "-3m", "ten"):
        with pytest.raises(ValueError, match="--budget must be a time"):
            parse_budget(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_tune_model_without_a_gpu_exits_3_and_records_nothing(tmp_path):
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["tune", "--model", "resnet18", "--budget", "1m", "--db",
                                   str(db), "--out", str(tmp_path / "results")])
    assert "needs a CUDA GPU" in _error(res, 3)
    assert not db.exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("args,needle", [
    (["--model", "resnet18", "--budget", "soon"], "--budget must be a time"),
    (["--model", "nope"], "--model must be one of"),
    (["--model", "resnet18", "--template", "fake.net"], "--model tunes the network"),
    (["--model", "resnet18", "--strategy", "fastest"], "--strategy must be one of"),
    (["--model", "resnet18", "--gpus", "a,b"], "--gpus must be comma-separated"),
])
def test_tune_model_mistakes_are_one_line(args, needle):
    assert needle in _error(CliRunner().invoke(app, ["tune", *args]), 2)


def test_a_session_tunes_the_plans_workloads_and_writes_its_row(tmp_path):
    """`lowbit.tune_network.tune_network` with stand-in GPU and builds (no timing without a
    GPU): the zoo model planned as `lowbit bench` plans it, every distinct workload measured
    (default first), the tuning row and its file."""
    import json

    from lowbit.tune_network import tune_network, write_results

    faster = set()

    def orders(template, wl_json):  # a stand-in model: the first two configs of the space
        from lowbit.core import workload_from_json

        configs = template.space(workload_from_json(wl_json)).all_configs()[:2]
        faster.update(configs[:1])
        return configs

    session = tune_network("digits_resnet", 2, "w1a2", 20.0, db=tmp_path / "r.sqlite",
                           slots=[MeasurerSlot(TimesMeasurer(faster))],
                           builder=OrderBuilder(orders), progress=False)
    (tuning,) = session["rows"]  # no GPU: no network rows
    assert tuning["row"] == "tuning" and tuning["gpus"] == 1 and tuning["gpu_names"] == [GPU]
    assert tuning["workloads"] == len(session["tasks"]) >= 3
    assert tuning["trials"] >= tuning["workloads"] and tuning["failures"] == 0
    for t in session["tasks"]:
        assert t["default_us"] is not None, t  # every default measured
        assert t["best_us"] == min(t["default_us"], 5.0 if t["trials"] > 1 else 10.0)
    sums = tuning["kernel_sum_us"]
    assert sums["best"] <= sums["default"] == sum(t["count"] * t["default_us"]
                                                  for t in session["tasks"])
    split = tuning["time_split"]
    assert split["gpus"][0]["measured"] == tuning["trials"] and split["queue_s_mean"] >= 0
    path = write_results(session, tmp_path / "results")
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "tuning_network" and doc["rows"][0]["model"] == "digits_resnet"
    assert len(doc["workloads"]) == tuning["workloads"]


def test_benchmark_scaling_row_compares_time_to_the_same_kernel_sum(monkeypatch, tmp_path):
    """benchmarks/tune_network.py --scaling: seconds of each session to the one-GPU final sum;
    its command line runs the session on GPU 0, then every GPU, into fresh databases."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import tune_network as bench

    def session(gpus, trajectory):
        return {"rows": [{"row": "tuning", "model": "resnet18", "batch": 8, "precision": "w1a2",
                          "budget_s": 60.0, "gpus": gpus, "trials": 10 * gpus,
                          "trajectory": trajectory, "time_split": {"gpus": [], "build": {},
                                                                   "orders": {}}}],
                "tasks": [], "skipped": [], "env": {"gpu": GPU}}

    one = session(1, [[5.0, 900.0], [30.0, 700.0], [50.0, 650.0]])
    two = session(2, [[4.0, 880.0], [20.0, 660.0], [26.0, 640.0]])
    row = bench.scaling_row(one, two)
    assert row["seconds_to_target"] == [50.0, 26.0] and row["speedup"] == 50.0 / 26.0
    assert bench.time_to_reach(two["rows"][0]["trajectory"], 600.0) is None
    import json

    calls = []

    def fake_tune_network(*args, **kw):
        calls.append((kw["gpus"], kw["db"]))
        return one if len(calls) == 1 else two

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("lowbit.tune_network.tune_network", fake_tune_network)
    monkeypatch.setattr(bench, "versions", lambda: {})
    assert bench.main(["--scaling", "--budget", "1m", "--out", str(tmp_path)]) == 0
    assert [g for g, _ in calls] == [[0], None] and calls[0][1] != calls[1][1]
    (path,) = tmp_path.glob("tuning_network-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert rows[0]["row"] == "tuning_scaling" and len(rows) == 3


def test_a_torchvision_name_is_built_as_lowbit_bench_builds_it():
    from lowbit.bench import build_quantized
    from lowbit.quant import quant_layers
    from lowbit.runtime.model_source import torchvision_models
    from lowbit.tune_network import quantized_model

    torchvision_models()

    q, size, channels = quantized_model("tv:mobilenet_v2", "w8a8", image_size=32, device="cpu")
    assert (size, channels) == (32, 3)
    same, _ = build_quantized("tv:mobilenet_v2", "w8a8", image_size=32)
    layers = dict(quant_layers(q))
    assert len(layers) == 53 and layers.keys() == dict(quant_layers(same)).keys()
    assert sum(m.groups > 1 for m in layers.values() if hasattr(m, "groups")) == 17
    for name, m in quant_layers(same):  # the same weights and calibration: the same plan
        assert torch.equal(m.weight, layers[name].weight), name


def test_a_float_model_factory_is_quantized_by_the_recipe(tmp_path):
    from lowbit.quant import quant_layers
    from lowbit.tune_network import quantized_model

    path = tmp_path / "net.py"
    path.write_text("from torch import nn\n\ndef make():\n    return nn.Sequential("
                    "nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), "
                    "nn.Flatten(), nn.Linear(8 * 4 * 4, 10))\n")
    q, size, channels = quantized_model(f"{path}:make", "w1a2", image_size=8, device="cpu")
    assert (size, channels) == (8, 3)
    bits = {name: (m.weight_quant.prec.bits, m.act_quant.bits)
            for name, m in quant_layers(q)}
    assert bits == {"0": (8, 8), "2": (1, 2), "5": (8, 8)}  # first and last at w8a8
    with pytest.raises(ValueError, match="no Conv2d"):
        (tmp_path / "fc.py").write_text("from torch import nn\n\ndef make():\n"
                                         "    return nn.Linear(4, 2)\n")
        quantized_model(f"{tmp_path / 'fc.py'}:make", "w1a2")
