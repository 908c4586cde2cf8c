"""The pruned tuner: the thesis's filters, predicted order, table replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lowbit.core import Config, ConfigSpace, ConvWorkload, GemmWorkload, Knob
from lowbit.perfmodel import H100, space_filters
from lowbit.tune import Trial, make_strategy
from lowbit.tune.pruned import (
    PrunedSearch,
    expected_random_trials,
    replay,
    table_space,
    trials_to_reach,
)

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
