"""The pruned tuner: the thesis's filters, predicted order, table replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lowbit.core import Config, ConfigSpace, ConvWorkload, GemmWorkload, Knob
from lowbit.perfmodel import H100, space_filters
from lowbit.tune import Trial, make_strategy
from lowbit.tune.replay import expected_random_trials, replay, table_space, trials_to_reach
from lowbit.tune.strategies import PrunedSearch

WL = ConvWorkload(N=8, H=28, W=28, C=128, K=128, R=3, S=3, pad=1, w="s8", a="s8")


def space() -> ConfigSpace:
    return ConfigSpace([Knob("BLOCK_M", (64, 128, 256)), Knob("BLOCK_N", (32, 64, 128)),
                        Knob("BLOCK_K", (8, 32, 64)), Knob("num_warps", (4, 8)),
                        Knob("num_stages", (2, 3))])


def truth(c: Config) -> float:
    return (10 + abs(math.log2(c["BLOCK_M"]) - 7) * 3 + abs(math.log2(c["BLOCK_N"]) - 6) * 2
            + (c["num_stages"] == 2) + (c["num_warps"] == 8) * 0.5)


def test_filters_name_each_thesis_rule():
    tiny = GemmWorkload(M=16, N=16, K=4096, w="s8", a="s8")
    cfgs = [{"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
            {"BLOCK_M": 256, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
            {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 8, "num_warps": 4, "num_stages": 2},
            {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 1024, "num_warps": 4, "num_stages": 4}]
    reasons = space_filters("triton.gemm_int8", tiny, cfgs, H100)
    assert reasons[0] is None
    assert reasons[1].startswith("fit") and reasons[2].startswith("coalescing")
    assert reasons[3].startswith("launch")
    wide = GemmWorkload(M=8192, N=8192, K=256, w="s8", a="s8")
    few = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 2,
           "SPLIT_K": 1}
    reasons = space_filters("triton.gemm_int8", GemmWorkload(M=1024, N=1024, K=256),
                            [few, {**few, "BLOCK_M": 64, "BLOCK_N": 32}], H100)
    assert reasons[0].startswith("concurrency") and reasons[1] is None
    assert space_filters("triton.gemm_int8", wide, [few], H100) == [None]


def test_proposes_in_predicted_order_survivors_first_and_exhausts():
    sp = space()
    s = PrunedSearch(sp, WL, "triton.conv2d_int8", predict=lambda cs: [truth(c) for c in cs],
                     gpu=H100)
    order = s.order()
    kept = [c for c in order[: s.survivors]]
    assert 0 < s.survivors < len(sp)
    assert [truth(c) for c in kept] == sorted(truth(c) for c in kept)
    assert all(c["BLOCK_K"] >= 16 for c in kept)  # 8-byte K steps are filtered (coalescing)
    seen = []
    while (got := s.propose(7)):
        assert not set(seen) & set(got)
        seen += got
        s.update([Trial(c, truth(c)) for c in got])
    assert seen[: s.survivors] == kept[: len(seen[: s.survivors])]
    assert set(seen) == set(sp.all_configs()) and s.exhausted


def test_table_replay_and_random_expectation():
    sp = space()
    table = sp.all_configs()[::3]
    times = {c: truth(c) for c in table}
    ts = table_space(table)
    assert set(ts.all_configs()) == set(table)
    best = min(times.values())
    oracle = PrunedSearch(ts, WL, "triton.conv2d_int8",
                          predict=lambda cs: [times[c] for c in cs], gpu=H100)
    assert replay(oracle, times, best) == 1
    assert trials_to_reach(list(times), times, best) == list(times).index(
        min(times, key=times.get)) + 1
    assert trials_to_reach(list(times), times, best / 2) is None
    assert expected_random_trials(99, 0) == 100 and expected_random_trials(99, 9) == 10


def test_registered_as_a_strategy():
    sp = space()
    s = make_strategy("pruned", sp, WL)  # no template: the analytic estimate orders it
    got = s.propose(5)
    assert len(got) == 5 and isinstance(s, PrunedSearch)
    assert np.all(np.isfinite(s.predicted))
    with pytest.raises(ValueError, match="pruned"):
        make_strategy("nope", sp, WL)


def test_benchmark_replays_an_exhaustive_1000_plus_table(tmp_path, monkeypatch):
    """benchmarks/perfmodel.py pruned_rows on a synthetic exhaustive tables file of a whole
    1,776-config TMA space (tuning.py measure's format) beside a cut one and an old-format
    one: rows of >= min_space verified configs only, marked exhaustive from the tables; the
    fraction to 0.97x follows the predictions (a perfect model: 1 measurement; a reversed
    one: most of the space); without a fit, one replay per model seed and their median."""
    import json
    import sys
    import zlib
    from pathlib import Path

    from lowbit.core import Epilogue, load_workloads
    from lowbit.kernels import get_template, load_backends
    from lowbit.perfmodel.dataset import deduplicate, load_results, table_spaces

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from perfmodel import pruned_rows

    load_backends()
    layers = dict(load_workloads("resnet18_b8", epilogue=Epilogue(bias=True, relu=True,
                                                                   out="s8")))
    tma = get_template("triton.conv2d_int8_tma")

    def us(c: Config) -> float:
        return (20 + abs(math.log2(c["BLOCK_N"]) - 6) * 3 + (c["num_stages"] == 2) * 2
                + zlib.crc32(c.to_json().encode()) % 100 / 10)

    def layer(name: str, n: int | None, **extra: object) -> dict:
        space = list(tma.space(layers[name]))
        table = [[dict(c), None, "wrong: 1 of 9 elements differ"] if i % 50 == 0
                 else [dict(c), us(c), None] for i, c in enumerate(space[:n])]
        return {"workload": name, "wl": layers[name].to_dict(), "table": table, **extra}

    big = layer("resnet18_56x56_64to64_s1", None, template=tma.name, space_size=1776,
                exhaustive=True)
    cut = layer("resnet18_28x28_128to128_s1", 150, template=tma.name, space_size=9780,
                exhaustive=False)
    old = layer("resnet18_7x7_512to512_s1", 120)  # before the fields: whole layers only
    for i, (lay, gpu) in enumerate([(big, "G"), (cut, "G"), (old, "H")]):
        doc = {"benchmark": "tuning_tables", "gpu": gpu, "template": tma.name,
               "layers": [lay]}
        (tmp_path / f"tables-2026112{i}-100000.json").write_text(json.dumps(doc))
    ms = deduplicate(load_results(tmp_path))
    spaces = table_spaces(tmp_path)
    assert len(ms) == 1776 - 36 + 150 - 3 + 120 - 3

    def oracle(ms, train):
        return lambda ix: np.array([ms[i].events_us for i in ix])

    def reversed_(ms, train):
        return lambda ix: -np.array([ms[i].events_us for i in ix])

    (row,) = pruned_rows(ms, 1000, spaces=spaces, fit=oracle)
    assert (row["template"], row["workload"], row["gpu"]) == (
        tma.name, layers["resnet18_56x56_64to64_s1"].key, "G")
    assert row["space_size"] == 1740 and row["template_space_size"] == 1776
    assert row["exhaustive"] and row["space_failed"] == 36
    assert row["layer"] == "resnet18_56x56_64to64_s1"
    assert row["trials_to_097"] == 1 and row["fraction_measured_to_097"] == round(1 / 1740, 4)
    times = sorted(us(Config(c)) for c, _, e in big["table"] if e is None)
    good = sum(t <= times[0] / 0.97 for t in times)
    assert row["random_fraction_to_097"] == round(1741 / (good + 1) / 1740, 4)
    (bad,) = pruned_rows(ms, 1000, spaces=spaces, fit=reversed_)
    assert bad["fraction_measured_to_097"] > 0.5 > 10 * row["random_fraction_to_097"]
    rows = {r["space_size"]: r for r in pruned_rows(ms, 100, spaces=spaces, fit=oracle)}
    assert sorted(rows) == [117, 147, 1740]
    assert not rows[147]["exhaustive"] and rows[117]["exhaustive"]  # cut / old format
    import perfmodel

    by_seed = {0: oracle, 1: reversed_, 2: oracle}
    monkeypatch.setattr(perfmodel, "learned_fit", lambda seed, **kw: by_seed[seed])
    (med,) = pruned_rows(ms, 1000, spaces=spaces, seeds=(0, 1, 2))
    assert med["model_seeds"] == 3 and med["trials_to_097"] == 1
    assert med["fraction_by_seed"] == [row["fraction_measured_to_097"],
                                       bad["fraction_measured_to_097"],
                                       row["fraction_measured_to_097"]]
