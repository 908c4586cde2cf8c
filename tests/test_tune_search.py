"""Strategies (propose/update contract), simulated annealing, the XGBoost rank model, features."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from lowbit.core import Config, ConfigSpace, ConvWorkload, Knob
from lowbit.tune import STRATEGIES, Trial, make_strategy
from lowbit.tune.cost_model import RankCostModel, Sample, relevance
from lowbit.tune.strategies.sa import AnnealSettings, SpaceWalker, anneal

WL = ConvWorkload(N=4, H=14, W=14, C=64, K=64, R=3, S=3, stride=1, pad=1)
WL2 = ConvWorkload(N=8, H=28, W=28, C=32, K=128, R=3, S=3, stride=1, pad=1)


def space() -> ConfigSpace:
    knobs = [Knob("BLOCK_M", (32, 64, 128, 256)), Knob("BLOCK_N", (32, 64, 128)),
             Knob("BLOCK_K", (16, 32, 64)), Knob("num_warps", (2, 4, 8)),
             Knob("num_stages", (1, 2, 3)), Knob("order", ("a", "b"))]

    def smem(c: Config) -> str | None:
        big = c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] > 40000
        return "smem" if big else None

    return ConfigSpace(knobs, [smem])


def landscape(c: Config, wl: ConvWorkload = WL) -> float:
    """A smooth synthetic time with one optimum that depends on the workload."""
    lm = math.log2(c["BLOCK_M"]) - (6 if wl is WL else 7)
    ln = math.log2(c["BLOCK_N"]) - 6
    return (10 + 3 * lm * lm + 2 * ln * ln + abs(c["num_warps"] - 4) / 2
            + (3 - c["num_stages"]) * 0.7 + (c["order"] == "b") * 1.5
            + abs(math.log2(c["BLOCK_K"]) - 5))


def run(strategy, trials: int, wl=WL, batch: int = 16) -> list[float]:
    best, curve = math.inf, []
    while len(curve) < trials:
        got = strategy.propose(min(batch, trials - len(curve)))
        if not got:
            break
        assert len(set(got)) == len(got)
        assert all(strategy.space.is_valid(c) for c in got)
        res = [Trial(c, landscape(c, wl)) for c in got]
        strategy.update(res)
        for r in res:
            best = min(best, r.time_us)
            curve.append(best)
    return curve


FAST_SA = AnnealSettings(iterations=120, early_stop=20, walkers=32)


def small_space() -> ConfigSpace:
    knobs = [Knob("BLOCK_M", (32, 64, 128)), Knob("BLOCK_N", (32, 64)), Knob("BLOCK_K", (16, 32)),
             Knob("num_warps", (2, 4)), Knob("num_stages", (2, 3)), Knob("order", ("a", "b"))]
    return ConfigSpace(knobs, [lambda c: "big" if c["BLOCK_M"] * c["BLOCK_K"] > 2048 else None])


@pytest.mark.parametrize("name", STRATEGIES)
def test_contract_distinct_valid_unseen_until_exhausted(name):
    sp = small_space()
    s = make_strategy(name, sp, WL, seed=3, plan_size=16, settings=FAST_SA)
    seen: set[Config] = set()
    while True:
        got = s.propose(13)
        if not got:
            break
        assert not seen & set(got)
        seen |= set(got)
        s.update([Trial(c, None if i % 9 == 0 else landscape(c)) for i, c in enumerate(got)])
    assert seen == set(sp.all_configs()) and s.exhausted


def test_resumed_records_are_not_proposed_again():
    sp = space()
    prior = sp.all_configs()[:50]
    s = make_strategy("diversity", sp, WL, seed=0, plan_size=16, settings=FAST_SA)
    s.update([Trial(c, landscape(c)) for c in prior])
    assert not set(s.propose(32)) & set(prior)


def test_model_strategies_beat_random_on_a_smooth_landscape():
    sp = space()
    opt = min(landscape(c) for c in sp.all_configs())
    wins = 0
    for seed in range(3):
        rnd = run(make_strategy("random", sp, WL, seed=seed), 64)
        div = run(make_strategy("diversity", sp, WL, seed=seed, plan_size=16,
                                settings=FAST_SA), 64)
        sa = run(make_strategy("sa", sp, WL, seed=seed, plan_size=16, settings=FAST_SA), 64)
        assert div[-1] <= 1.1 * opt and sa[-1] <= 1.1 * opt
        wins += (div[-1] <= rnd[-1]) + (sa[-1] <= rnd[-1])
    assert wins >= 4


def test_anneal_finds_the_top_of_an_exact_score():
    sp = space()
    walker = SpaceWalker(sp)
    exclude = set(sp.all_configs()[:5])

    def score(cs):
        return np.asarray([-landscape(c) for c in cs])

    top = anneal(walker, score, 4, random.Random(0), exclude, settings=AnnealSettings())
    truth = sorted((c for c in sp.all_configs() if c not in exclude), key=landscape)[:4]
    assert top[0][1] == truth[0]
    assert len({c for _, c in top}) == 4 and not exclude & {c for _, c in top}
    assert [s for s, _ in top] == sorted([s for s, _ in top], reverse=True)


def test_rank_model_learns_order_and_transfers_across_workloads():
    sp = space()
    cfgs = sp.all_configs()
    rng = random.Random(1)
    train = rng.sample(cfgs, 60)
    test = [c for c in cfgs if c not in train]
    m = RankCostModel(None, sp, seed=0)
    assert not m.trained and not m.predict(WL, test).any()
    m.fit([Sample(WL, c, landscape(c)) for c in train] + [Sample(WL, train[0], None)])
    assert m.rows(WL, cfgs[:1]).shape == (1, len(m.featurizer.names))
    assert "generic:order" in m.featurizer.names  # the performance model's knob columns
    s = m.predict(WL, test)
    assert _spearman(-s, [landscape(c) for c in test]) > 0.7
    # transfer: trained on another workload (same template, similar landscape) only, it
    # still ranks this one
    t = RankCostModel(None, sp, seed=0)
    t.fit([Sample(WL2, c, landscape(c) * 1.7) for c in train])
    assert _spearman(-t.predict(WL, test), [landscape(c) for c in test]) > 0.3


def test_relevance_labels():
    assert relevance([2.0, 4.0, None]).tolist() == [1.0, 0.5, 0.0]


def _spearman(a, b) -> float:
    ra = np.argsort(np.argsort(np.asarray(a, float)))
    rb = np.argsort(np.argsort(np.asarray(b, float)))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_diversity_spreads_the_round_over_the_space():
    """The competition of `diversity`: with weight 0 the round is the model's top k (a tight
    cluster around the predicted optimum); with the default weight the k picks spread out
    (larger mutual distances) while the model's favourite still comes first."""
    from lowbit.tune.strategies import DiversitySearch

    sp = space()
    field = sp.all_configs()
    pred = np.array([-landscape(c) for c in field])

    def spread(weight: float) -> tuple[Config, float]:
        s = DiversitySearch(sp, WL, diversity_weight=weight)
        s.score = lambda cs: np.array([-landscape(c) for c in cs])
        picks = s._compete(field, 8)
        assert len(set(picks)) == 8
        mean = np.mean([sp.distance(a, b) for a in picks for b in picks if a != b])
        return picks[0], float(mean)

    top = field[int(np.argmax(pred))]
    first0, d0 = spread(0.0)
    first1, d1 = spread(DiversitySearch.DEFAULT_WEIGHT)
    assert first0 == first1 == top
    assert d1 > 1.3 * d0
