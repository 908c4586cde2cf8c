"""lowbit.runtime.autoprecision: the exact Pareto front against brute force, plans within the
budget that are never worse than a uniform plan that fits, workloads per layer, errors."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import lowbit
from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.models import get
from lowbit.quant import quant_layers
from lowbit.runtime.autoprecision import autoprecision, pareto_front


def test_pareto_front_matches_brute_force():
    rng = random.Random(0)
    checked = 0
    for _ in range(30):
        groups = [[(rng.uniform(0, 5), rng.uniform(0, 5), f"g{i}p{j}")
                   for j in range(rng.randint(1, 4))] for i in range(rng.randint(1, 4))]
        front = pareto_front(groups)
        plans = [(sum(c for c, _, _ in pick), sum(s for _, s, _ in pick))
                 for pick in itertools.product(*groups)]
        want = [p for p in plans if not any((q[0] <= p[0] and q[1] < p[1]) or
                                            (q[0] < p[0] and q[1] <= p[1]) for q in plans)]
        assert sorted({round(c, 9) for c, _ in want}) == sorted({round(c, 9)
                                                                 for c, _, _ in front})
        assert all(a[0] <= b[0] and a[1] > b[1] for a, b in itertools.pairwise(front))
        checked += 1
    assert checked == 30


def _fake_time_us(wl):
    """A stand-in latency: bit operations at a fixed rate (what the perf model will replace)."""
    bits = wl.w.bits * wl.a.bits
    return wl.ops * bits / 1e6 + 1.0


def _data(n=3):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(n)]


def test_chosen_plan_fits_and_beats_every_uniform_plan_that_fits():
    torch.manual_seed(0)
    model = get("digits_cnn", num_classes=10)
    w2a2 = autoprecision(model, _data(), layer_time_us=_fake_time_us, precisions=("w2a2",),
                         batches=2).uniform["w2a2"]
    seen = []
    res = autoprecision(model, _data(), layer_time_us=_fake_time_us, budget_us=w2a2.cost,
                        batches=2, evaluate=lambda plan: seen.append(plan) or 50.0)
    assert res.layers == ("3", "6", "9")
    assert len(res.sensitivity) == 3 * 4 and all(v >= 0 for v in res.sensitivity.values())
    chosen = res.chosen
    assert chosen is not None and chosen.cost <= w2a2.cost + 1e-9
    assert res.uniform["w2a2"].cost == pytest.approx(w2a2.cost)
    fitting = [u for u in res.uniform.values() if u.cost <= w2a2.cost + 1e-9]
    assert fitting and all(chosen.sensitivity <= u.sensitivity + 1e-12 for u in fitting)
    assert chosen.latency_us == pytest.approx(chosen.cost) and chosen.accuracy == 50.0
    assert len(seen) == 5  # the chosen plan and the four uniform plans were evaluated
    q = lowbit.quantize(model, skip_first=True, skip_last=True, layers=res.layers_option())
    got = {n: (m.weight_quant.prec.bits, m.act_quant.bits) for n, m in quant_layers(q)}
    assert got == chosen.plan


def test_bits_budget_without_a_time_model():
    torch.manual_seed(1)
    model = get("digits_cnn", num_classes=10)
    res = autoprecision(model, _data(2), budget_bits=3.0, precisions=("w8a8", "w2a2"),
                        batches=2)
    assert res.cost_unit == "avg weight bits" and res.latency_us == {}
    assert res.chosen is not None and res.chosen.avg_bits <= 3.0
    assert res.front[0].avg_bits == pytest.approx(2.0)
    assert res.front[-1].avg_bits == pytest.approx(8.0)


def test_bits_budget_with_a_time_model_keeps_latencies():
    """budget_bits with layer_time_us: the front and the budget are over average bits (the
    budget is never compared with microseconds), each point's latency still predicted."""
    torch.manual_seed(1)
    model = get("digits_cnn", num_classes=10)
    res = autoprecision(model, _data(2), budget_bits=3.0, layer_time_us=_fake_time_us,
                        precisions=("w8a8", "w2a2"), batches=2)
    assert res.cost_unit == "avg weight bits" and len(res.latency_us) == 3 * 2
    assert res.chosen is not None and res.chosen.cost == res.chosen.avg_bits <= 3.0
    assert all(pt.latency_us is not None and pt.latency_us > 0 for pt in res.front)
    assert res.front[-1].avg_bits == pytest.approx(8.0)


def test_layer_workloads_have_the_layer_shapes():
    model = get("digits_resnet", num_classes=10)
    seen = []
    res = autoprecision(model, _data(1), layer_time_us=lambda wl: seen.append(wl) or 1.0,
                        precisions=("w1a2",), batches=1, batch=64, skip_last=False)
    assert res.layers == ("blocks.0.conv1", "blocks.0.conv2", "blocks.1.conv1",
                          "blocks.1.conv2", "blocks.1.downsample.0", "fc")
    convs = [wl for wl in seen if isinstance(wl, ConvWorkload)]
    gemms = [wl for wl in seen if isinstance(wl, GemmWorkload)]
    assert len(convs) == 5 and len(gemms) == 1
    down = convs[4]
    assert (down.N, down.H, down.C, down.K, down.R, down.stride) == (64, 8, 16, 32, 1, 2)
    assert (gemms[0].M, gemms[0].N, gemms[0].K) == (64, 10, 32)
    assert all(wl.w.bits == 1 and wl.a.bits == 2 for wl in seen)
    assert str(convs[0].a.encoding).lower().endswith("unsigned")  # after a ReLU


def test_latency_budget_defaults_to_the_performance_model(monkeypatch):
    from lowbit.runtime import autoprecision as mod

    asked = []
    monkeypatch.setattr(mod, "predicted_time_us",
                        lambda gpu=None: lambda wl: asked.append(wl) or _fake_time_us(wl))
    res = autoprecision(get("digits_cnn", num_classes=10), _data(1), budget_us=1e9,
                        precisions=("w2a2", "w1a2"), batches=1)
    assert res.cost_unit == "us" and len(asked) == 3 * 2 and res.chosen is not None


def test_predicted_time_takes_the_faster_layout(monkeypatch):
    """predicted_time_us: the dispatch's pick over both input layouts, per workload once."""
    from lowbit.core import Layout
    from lowbit.runtime.autoprecision import predicted_time_us
    from lowbit.tune import dispatch

    calls = []

    class Pick:
        def __init__(self, us):
            self.predicted_us = us

    def choose(wl, gpu=None):
        calls.append(wl.a_layout)
        return Pick(3.0 if wl.a_layout is Layout.BITPLANE else 5.0)

    monkeypatch.setattr(dispatch, "choose", choose)
    time_us = predicted_time_us("NVIDIA H100 80GB HBM3")
    wl = ConvWorkload(N=8, H=8, W=8, C=32, K=32, R=3, S=3, pad=1, w="b1", a="u2")
    assert time_us(wl) == 3.0 and time_us(wl) == 3.0
    assert sorted(calls, key=str) == sorted([Layout.INT8, Layout.BITPLANE], key=str)
    assert time_us(wl.replace(w="s8", a="s8")) == 5.0 and len(calls) == 3


@pytest.mark.parametrize("kwargs,match", [
    ({"layer_time_us": 3}, "layer_time_us"), ({"budget_us": 1.0, "budget_bits": 2.0,
                                             "layer_time_us": _fake_time_us}, "one budget"),
    ({"precisions": ()}, "precisions"), ({"batches": 0}, "batches")])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        autoprecision(get("digits_cnn", num_classes=10), _data(1), **kwargs)
