"""benchmarks/accuracy.py: paired statistics, rows and targets on made-up results, the Brevitas
peer model (same layers quantized, same float layers), and a tiny end-to-end run that writes the
results JSON (with and without Brevitas installed)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import accuracy as bench
from lowbit.models import get


def _result(dataset, model, seed, accs):
    acc = {("fp32", "fp32"): accs.pop("fp32")}
    acc.update({("w2a2", m): v for m, v in accs.items()})
    return {"dataset": dataset, "model": model, "seed": seed, "acc": acc,
            "iacc": {k: v for k, v in acc.items() if k[1] in bench.LOWBIT},
            "seconds": dict.fromkeys(acc, 1.0), "schedules": {}, "errors": {},
            "qat_steps": 10, "task_s": 5.0, "task_cpu_s": 4.0}


def test_paired_mean_and_standard_error():
    m, se = bench.paired([3.0, 5.0, 4.0], [1.0, 2.0, 4.0])
    assert m == pytest.approx(5 / 3)
    d = [2.0, 3.0, 0.0]
    sd = math.sqrt(sum((x - 5 / 3) ** 2 for x in d) / 2)
    assert se == pytest.approx(sd / math.sqrt(3))
    assert math.isnan(bench.paired([1.0], [0.0])[1])


def test_rows_and_targets_from_results():
    results = [_result("digits_hard", "digits_cnn", s, {"fp32": 90.0 + s, "max": 80.0 + s,
                                                         "lsq": 88.0 + 2 * s,
                                                         "brevitas": 85.0 + s})
               for s in range(3)]
    rows = bench.make_rows(results)
    by = {r["method"]: r for r in rows}
    assert len(rows) == 4 and by["fp32"]["w_bits"] == 32
    lsq = by["lsq"]
    assert (lsq["w_bits"], lsq["a_bits"], lsq["seeds"]) == (2, 2, [0, 1, 2])
    assert lsq["accuracies"] == [88.0, 90.0, 92.0] and lsq["accuracy_mean"] == 90.0
    assert lsq["paired_minus_brevitas_best_mean"] == pytest.approx(4.0)
    assert lsq["paired_minus_brevitas_best_se"] == pytest.approx(1 / math.sqrt(3), abs=1e-3)
    assert lsq["paired_minus_fp32_mean"] == pytest.approx(-1.0)
    assert lsq["paired_minus_max_mean"] == pytest.approx(9.0)
    assert by["brevitas"]["brevitas_best"] == "brevitas"
    assert "paired_minus_brevitas_best_mean" not in by["brevitas"]
    assert lsq["integer_accuracy_mean"] == 90.0 and "integer_accuracy_mean" not in by["brevitas"]
    verdicts, details = bench.targets(rows)
    assert verdicts == {"lowbit_best>=brevitas_best@digits_hard/digits_cnn/w2a2": True,
                        "w2a2_within_3_of_fp32@digits_hard/digits_cnn": True}
    assert details["w2a2_within_3_of_fp32@digits_hard/digits_cnn"]["lowbit_best"] == "lsq"
    worse = [_result("digits", "digits_cnn", s, {"fp32": 90.0, "max": 80.0, "brevitas": 81.0})
             for s in range(2)]
    verdicts, _ = bench.targets(bench.make_rows(worse))
    assert verdicts == {"lowbit_best>=brevitas_best@digits/digits_cnn/w2a2": False}


def test_brevitas_peer_quantizes_the_same_layers():
    pytest.importorskip("brevitas")
    import brevitas.nn as qnn

    torch.manual_seed(0)
    fp32 = get("digits_resnet", num_classes=10)
    x = torch.randn(4, 1, 8, 8)
    checked = 0
    for precision in ("w4a4", "w1a2"):
        q = bench.brevitas_model(fp32, precision, x)
        names = [n for n, m in q.named_modules() if isinstance(m, (qnn.QuantConv2d,
                                                                     qnn.QuantLinear))]
        assert names == ["blocks.0.conv1", "blocks.0.conv2", "blocks.1.conv1",
                         "blocks.1.conv2", "blocks.1.downsample.0"]
        assert type(q.stem[0]) is torch.nn.Conv2d and type(q.fc) is torch.nn.Linear
        layer = q.get_submodule("blocks.0.conv1")
        w = layer.quant_weight().value.detach()
        levels = {len(torch.unique(w[k])) for k in range(w.shape[0])}
        assert max(levels) <= (2 if precision == "w1a2" else 15)  # narrow-range 4-bit: 15
        scale = layer.quant_weight().scale.detach().flatten()
        assert scale.numel() == w.shape[0]  # per output channel, like lowbit
        q.eval()
        with torch.no_grad():
            assert q(x).shape == (4, 10)
        checked += 1
    assert checked == 2


def _tiny_run(tmp_path, capsys, methods):
    bench.main(["--seeds", "1", "--jobs", "1", "--quick", "--fp32-epochs", "1",
                "--datasets", "digits", "--models", "digits_cnn", "--precisions", "w4a4",
                "--methods", *methods, "--out", str(tmp_path)])
    files = sorted(tmp_path.glob("accuracy-*.json"))
    assert len(files) == 1 and files[0].with_suffix(".png").is_file()
    return json.loads(files[0].read_text()), capsys.readouterr().out


def test_tiny_run_writes_the_results_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "brevitas_available", lambda: "ModuleNotFoundError: brevitas")
    doc, out = _tiny_run(tmp_path, capsys, ["max", "lsq", "brevitas"])
    assert "skipping the brevitas rows" in out
    assert doc["benchmark"] == "accuracy"
    methods = [(r["precision"], r["method"]) for r in doc["rows"]]
    assert methods == [("fp32", "fp32"), ("w4a4", "max"), ("w4a4", "lsq")]
    for r in doc["rows"]:
        assert {"dataset", "model", "method", "w_bits", "a_bits", "seeds", "accuracies",
                "accuracy_mean", "accuracy_std"} <= set(r)
        assert 10.0 < r["accuracy_mean"] <= 100.0
    assert doc["setup"]["methods"] == ["max", "lsq"] and doc["setup"]["brevitas"] is None


def test_journal_resume_and_results_from_journal(tmp_path, capsys, monkeypatch):
    """Every finished task is journaled at once; --resume runs only the missing ones; a line cut
    short by a kill and tasks of other settings are ignored; --from-journal runs nothing."""
    monkeypatch.setattr(bench, "brevitas_available", lambda: "ModuleNotFoundError: brevitas")
    _tiny_run(tmp_path, capsys, ["max"])
    journal = tmp_path / "accuracy-journal.jsonl"
    lines = journal.read_text().splitlines()
    assert len(lines) == 1
    first = json.loads(lines[0])
    other = dict(first, settings="another-run")
    journal.write_text("\n".join([lines[0], json.dumps(other), lines[0][:40]]) + "\n")
    ran = []
    real = bench.run_task
    monkeypatch.setattr(bench, "run_task", lambda *a: ran.append(a[:3]) or real(*a))
    args = ["--jobs", "1", "--quick", "--fp32-epochs", "1", "--datasets", "digits",
            "--models", "digits_cnn", "--precisions", "w4a4", "--methods", "max",
            "--out", str(tmp_path)]
    bench.main(["--seeds", "2", "--resume", *args])
    assert ran == [("digits", "digits_cnn", 1)]
    assert len(journal.read_text().splitlines()) == 4
    # a second process takes the seeds from --first-seed on (here: all done already)
    bench.main(["--seeds", "2", "--first-seed", "1", "--resume", *args])
    assert len(ran) == 1
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "2", "--first-seed", "2", *args])
    for f in tmp_path.glob("accuracy-2*.json"):
        f.unlink()
    # keys are per dataset: a later run over more datasets finds the same tasks
    cut = args.index("--datasets") + 1
    wider = [*args[:cut], "digits", "digits_hard", *args[args.index("--models"):]]
    bench.main(["--seeds", "2", "--from-journal", *wider])
    assert len(ran) == 1
    (path,) = tmp_path.glob("accuracy-2*.json")
    doc = json.loads(path.read_text())
    assert doc["setup"]["seeds_finished"] == {"digits/digits_cnn": [0, 1],
                                              "digits_hard/digits_cnn": []}
    assert [r["seeds"] for r in doc["rows"]] == [[0, 1], [0, 1]]
    assert doc["rows"][1]["accuracies"][0] == round(first["result"]["acc"]["w4a4/max"], 3)


def test_fp32_cache_gives_the_same_task(tmp_path, monkeypatch):
    """A task whose FP32 model comes from the cache has the numbers of one that trains it: the
    checkpoint carries the random states (QAT data order, Brevitas's calibration batches)."""
    trained = []
    real = bench.train
    monkeypatch.setattr(bench, "train", lambda m, *a, **k: trained.append(a[2]) or real(m, *a, **k))
    sched = bench.Schedule(fp32_epochs=1, qat_epochs=1)
    args = ("digits", "digits_cnn", 0, sched, ("w2a2",), ("max", "lsq"))
    plain = bench.run_task(*args)
    first = bench.run_task(*args, tmp_path)
    assert len(list(tmp_path.glob("digits-digits_cnn-0-*.pt"))) == 1
    cached = bench.run_task(*args, tmp_path)
    # learning rate of each train call: FP32 (3e-3), then the two QAT runs (1e-3); the cached
    # task trains no FP32
    fp32, qat = sched.fp32_lr, sched.qat_lr
    assert trained == [fp32, qat, qat, fp32, qat, qat, qat, qat]
    assert plain["acc"] == first["acc"] == cached["acc"]
    assert len(plain["acc"]) == 3


def _linear_digits():
    from lowbit.quant.data import digits_loaders

    train_loader, _ = digits_loaders(64, 0)
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)), train_loader


def test_distillation_learns_the_teacher_without_labels():
    """distill=1 with every label replaced by 0: the student follows the teacher's predictions,
    where cross-entropy alone learns the constant label."""
    model, loader = _linear_digits()
    bench.train(model, loader, 3, 1e-2)
    teacher = model.eval()
    x = torch.cat([xb for xb, _ in loader])
    ones = [(xb, torch.zeros_like(yb)) for xb, yb in loader]
    agree = {}
    for distill in (0.0, 1.0):
        student, _ = _linear_digits()
        torch.nn.init.zeros_(student[1].weight)
        bench.train(student, ones, 3, 1e-2, teacher=teacher, distill=distill)
        with torch.no_grad():
            agree[distill] = (student(x).argmax(1) == teacher(x).argmax(1)).float().mean()
    assert agree[1.0] > 0.9 > 0.2 > agree[0.0]


@pytest.mark.parametrize("option", [["--distill", "1.5"], ["--qat-lr", "0"],
                                    ["--qat-epochs", "0"]])
def test_bad_schedule_options_are_refused(option, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1", *option])
    assert option[0] in capsys.readouterr().err
