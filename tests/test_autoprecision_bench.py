"""benchmarks/autoprecision.py: the per-plan summary and the target verdict on made-up seeds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import autoprecision as bench


def _seed_rows(seed: int, auto_bits: float, w2a2: float) -> list[dict]:
    point = {"predicted_latency_us": 50.0, "avg_weight_bits": 2.0, "sensitivity": 0.1}
    return [{"seed": seed, "plan": "fp32", "accuracy": 90.0},
            {"seed": seed, "plan": bench.BITS, "accuracy": auto_bits, **point},
            {"seed": seed, "plan": bench.LATENCY, "accuracy": w2a2, **point},
            {"seed": seed, "plan": "uniform w2a2", "accuracy": w2a2, **point},
            {"seed": seed, "plan": "front", "front": [], "budget_us": 50.0}]


def test_summary_pairs_each_chosen_plan_with_each_uniform_plan():
    per_seed = [r for s, (a, b) in enumerate([(80.0, 77.0), (81.0, 77.5), (79.0, 76.5)])
                for r in _seed_rows(s, a, b)]
    rows, verdict = bench.summarize(per_seed)
    by = {r["plan"]: r for r in rows}
    assert set(by) == {"fp32", bench.BITS, bench.LATENCY, "uniform w2a2"}
    base = by["uniform w2a2"]
    assert base["seeds"] == [0, 1, 2] and base["accuracy_mean"] == pytest.approx(77.0)
    assert base[f"{bench.BITS} minus_mean"] == pytest.approx(3.0)
    assert base[f"{bench.BITS} minus_se"] == pytest.approx(0.289, abs=1e-3)
    assert base[f"{bench.LATENCY} minus_mean"] == 0.0
    assert f"{bench.BITS} minus_mean" not in by[bench.LATENCY]  # chosen plans not paired
    assert verdict["more_accurate_than_uniform_w2a2_at_its_bits_by_2se"] is True
    assert verdict["more_accurate_than_uniform_w2a2_at_its_latency_by_2se"] is False


def test_one_seed_never_meets_the_target():
    rows, verdict = bench.summarize(_seed_rows(0, 90.0, 70.0))
    assert verdict["more_accurate_than_uniform_w2a2_at_its_bits_by_2se"] is False
    assert all(r["accuracy_std"] == 0.0 for r in rows)
    assert rows[-1][f"{bench.BITS} minus_mean"] == 20.0
    assert rows[-1][f"{bench.BITS} minus_se"] is None  # no standard error from one seed
