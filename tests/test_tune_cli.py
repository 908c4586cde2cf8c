"""`lowbit tune` on the CPU with fake templates: records, and what it says (and stores) when
the machine, the workload file or the arguments are wrong (issue 35, item 5)."""

from __future__ import annotations

import json
import sqlite3
import sys
import types

import pytest
from typer.testing import CliRunner

from lowbit.cli import app
from lowbit.kernels.base import get_template, register
from lowbit.tune import RecordsDB
from test_tune_fakes import TINY, FakeConvTemplate


class FakeGpuTemplate(FakeConvTemplate):
    """Claims the CUDA backend: it can only be measured on a GPU."""

    name = "fake.gpu"
    backend = "cuda"


def _registered(template):
    try:
        return get_template(template.name)
    except ValueError:
        return register(template)


@pytest.fixture(scope="module", autouse=True)
def templates():
    _registered(FakeConvTemplate(modes=("ok", "wrong"), tiles=(1, 2), name="fake.cli"))
    _registered(FakeGpuTemplate(modes=("ok",), tiles=(1, 2)))


def _layers(tmp_path, entries=None):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(entries if entries is not None
                               else [{"name": "tiny", **TINY.to_dict()}]))
    return path


def _tune(*args):
    return CliRunner().invoke(app, ["tune", *map(str, args)])


def _rows(db) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as c:
        return c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]


def _error(result, code):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


def test_tune_command_writes_records_and_prints_table(tmp_path):
    db = tmp_path / "r.sqlite"
    out = _tune(_layers(tmp_path), "--trials", 3, "--strategy", "random", "--db", db,
                "--template", "fake.cli", "--device", "cpu", "--round-size", 3)
    assert out.exit_code == 0, out.output
    assert "tiny" in out.output and "fake.cli" in out.output
    with RecordsDB(db) as rdb:
        assert len(rdb.records(TINY)) == 3
        assert rdb.best(TINY).cfg["mode"] == "ok"


def test_no_gpu_for_a_gpu_template_is_an_error_before_any_trial(tmp_path):
    """Issue: '`lowbit tune` without a GPU fails every trial, exits 0, stores those failures
    in the records, counts them against `--trials` and never retries them'."""
    db = tmp_path / "r.sqlite"
    line = _error(_tune(_layers(tmp_path), "--trials", 3, "--db", db, "--template",
                        "fake.gpu", "--device", "cpu"), 3)
    assert "fake.gpu" in line and "CUDA GPU" in line
    assert _rows(db) == 0 and not db.exists()


@pytest.mark.parametrize("extra", [("--top", "3"), ("--trials", "100")])
def test_tune_without_a_gpu_exits_3_and_records_nothing(tmp_path, monkeypatch, extra):
    """Issue: '`lowbit tune --model resnet18 --precision w8a8 --top 3` exits 0 on a CPU
    machine and writes 57 failure rows into the user's records database'. No network is
    planned either: the refusal comes before any work."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    user_db = tmp_path / "user" / "records.sqlite"
    monkeypatch.setenv("LOWBIT_RECORDS", str(user_db))

    def no_planning(*args):
        raise AssertionError("planned a network before refusing")

    monkeypatch.setitem(sys.modules, "lowbit.bench",
                        types.SimpleNamespace(network_workloads=no_planning))
    line = _error(_tune("--model", "resnet18", "--precision", "w8a8", *extra), 3)
    assert "needs a CUDA GPU" in line and "nothing was run or recorded" in line
    assert not user_db.exists() and not user_db.parent.exists()
    # --device cpu with the shipped templates: still exit 3, naming the GPU-only ones
    line = _error(_tune("--model", "resnet18", "--device", "cpu", *extra), 3)
    assert "cuda.bitserial_wgmma" in line and "only on a CUDA GPU" in line
    assert not user_db.exists()


def test_device_cuda_without_a_gpu_is_an_error_not_worker_deaths(tmp_path):
    """Issue: '`--device cuda` on a CPU machine records 8 "worker died" rows'."""
    db = tmp_path / "r.sqlite"
    line = _error(_tune(_layers(tmp_path), "--trials", 3, "--db", db, "--template",
                        "fake.cli", "--device", "cuda"), 3)
    assert "no CUDA device" in line
    assert _rows(db) == 0


@pytest.mark.parametrize("entries,needle", [
    ([{"name": "tiny", "op": "conv2d", "N": 1, "H": 5}], "missing W, C, K, R, S"),
    ([{"op": "gemm", "M": 4, "K": 8}], "entry 0: missing N"),
    ([{"name": "x", "op": "conv3d"}], "op must be one of conv2d, gemm"),
    ([{"name": "x", "op": "gemm", "M": 4, "N": 4, "K": 4, "KK": 2}], "unknown field 'KK'"),
    ([{"name": "x", "op": "gemm", "M": 4, "N": 0, "K": 4}], "N must be >= 1"),
    ({"not": "a list"}, "op must be one of"),
    ([], "holds no layers"),
    (["gemm"], "must be a JSON object"),
])
def test_workload_files_are_validated(tmp_path, entries, needle):
    """Issue: 'A workload file missing W/C/K/R/S is filled with 1s'."""
    line = _error(_tune(_layers(tmp_path, entries), "--device", "cpu",
                        "--template", "fake.cli"), 2)
    assert needle in line and "layers.json" in line


@pytest.mark.parametrize("args,needle", [
    (("no_such_suite_or_file",), "no_such_suite_or_file"),
    (("{layers}", "--strategy", "bogus"), "strategy"),
    (("{layers}", "--template", "nope"), "nope"),
    (("{layers}", "--trials", "0"), "trials"),
    (("{layers}", "--w", "q9"), "q9"),
    ((), "a workload file, a suite name or --model"),
    (("{layers}", "--model", "resnet18"), "not both"),
])
def test_user_mistakes_are_one_line(tmp_path, args, needle):
    """Issue: 'user mistakes end in 40-line tracebacks'."""
    layers = str(_layers(tmp_path))
    args = [a.replace("{layers}", layers) for a in args]
    line = _error(_tune(*args, "--db", tmp_path / "r.sqlite", "--device", "cpu"), 2)
    assert needle in line


def test_bad_json_is_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[{")
    assert "bad.json" in _error(_tune(path, "--device", "cpu"), 2)


def test_model_option_names_the_zoo_networks(tmp_path):
    line = _error(_tune("--model", "alexnet9", "--device", "cpu"), 2)
    assert "--model must be one of" in line and "resnet18" in line


def test_model_option_tunes_the_network_layers(tmp_path, monkeypatch):
    calls = []

    def network_workloads(model_name, batch, precision):
        calls.append((model_name, batch, precision))
        return [("layer1", TINY)]

    # the engine's planner (`lowbit.bench.network_workloads`) stands in: no planning
    monkeypatch.setitem(sys.modules, "lowbit.bench",
                        types.SimpleNamespace(network_workloads=network_workloads))
    db = tmp_path / "r.sqlite"
    out = _tune("--model", "resnet18", "--batch", 8, "--precision", "w1a2", "--device", "cpu",
                "--template", "fake.cli", "--trials", 2, "--strategy", "random", "--db", db)
    assert out.exit_code == 0, out.output
    assert calls == [("resnet18", 8, "w1a2")] and "layer1" in out.output
    assert _rows(db) == 2


def test_top_times_the_models_top_candidates_and_records_them(tmp_path, monkeypatch):
    """`lowbit tune --top N`: N candidates in the model's order, each measured and recorded
    (the wrong-result one, ranked first, as a failure); the fastest correct one is the
    layer's best."""
    import numpy as np

    from lowbit.tune import dispatch

    def predict(template, workload, configs, gpu=None, model=None, cuda_graph=False):
        # the model's order: the wrong-result mode first, then by tile
        return np.array([(0.0 if c["mode"] == "wrong" else 10.0) + c["tile"] for c in configs])

    monkeypatch.setattr(dispatch, "_predicted",
                        lambda t, wl, cfgs, spec, model: list(predict(t, wl, cfgs)))
    monkeypatch.setattr(dispatch, "default_model", lambda: None)
    db = tmp_path / "r.sqlite"
    out = _tune(_layers(tmp_path), "--top", 3, "--template", "fake.cli", "--device", "cpu",
                "--db", db)
    assert out.exit_code == 0, out.output
    assert "top 3" in out.output and "fake.cli" in out.output
    with RecordsDB(db) as rdb:
        recs = rdb.records(TINY)
        assert len(recs) == 3
        # the space: (tile 1, wrong), (tile 1, ok), (tile 2, ok), all three in the top 3
        assert sorted((r.cfg["tile"], r.cfg["mode"], r.ok) for r in recs) == \
            [(1, "ok", True), (1, "wrong", False), (2, "ok", True)]
        assert dict(rdb.best(TINY).cfg) == {"tile": 1, "mode": "ok"}
    assert "--top must be >= 0" in _error(_tune(_layers(tmp_path), "--top", -1, "--device",
                                                 "cpu"), 2)
