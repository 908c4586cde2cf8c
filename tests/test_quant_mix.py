"""Adaptive training precision: the KL divergence to the target, its finite-difference slope and
the schedule it drives."""

import itertools
import math

import pytest
import torch

from lowbit.quant.observers import relative_histogram
from lowbit.quant.precision_mix import (
    AdaptivePrecision,
    divergence,
    kl_divergence,
    quantized_histogram,
)


def _probs(kind="uniform", n=100_000, bins=2048):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g) if kind == "uniform" else torch.randn(n, generator=g).relu()
    return relative_histogram(x, bins)[0]


def test_quantized_histogram_keeps_mass_on_levels():
    p = _probs()
    q = quantized_histogram(p, 1.0, 2, 2, signed=False)
    assert float(q.sum()) == pytest.approx(1.0)
    assert int((q > 0).sum()) == 4  # levels 0, 1/3, 2/3, 1
    assert torch.allclose(q[q > 0], torch.tensor([1 / 6, 1 / 3, 1 / 3, 1 / 6],
                                                 dtype=q.dtype), atol=0.01)


def test_kl_divergence_basics():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-9)
    assert kl_divergence(p, torch.tensor([0.25, 0.25, 0.5])) == pytest.approx(math.log(2), rel=1e-6)


@pytest.mark.parametrize("target", [1, 2, 4, 8])
def test_divergence_is_zero_at_target_and_grows_about_ln2_per_bit(target):
    p = _probs()
    d = [divergence(p, 1.0, b, target, signed=False) for b in range(target, 11)]
    assert d[0] == pytest.approx(0.0, abs=1e-6)
    steps = [b - a for a, b in itertools.pairwise(d)]
    assert all(s > 0 for s in steps)
    assert all(abs(s - math.log(2)) < 0.1 for s in steps)


def test_schedule_descends_to_target_and_logs():
    p = _probs("relu")
    sched = AdaptivePrecision(2, beta=4.0)
    bits = [sched.step(i, p, 1.0) for i in range(200)]
    assert bits[0] <= 32 and bits[50] < 32 and bits[-1] == 2
    assert all(b1 <= b0 for b0, b1 in itertools.pairwise(bits))
    assert min(bits) == 2
    assert sched.history[0] == (0, 32) and len(sched.history) == 201
    changes = sched.changes()
    assert changes[0] == (0, 32) and changes[-1][1] == 2
    assert all(a[1] != b[1] for a, b in itertools.pairwise(changes))


def test_schedule_rate_follows_the_distribution():
    """A ReLU tensor (half its mass in the zero spike) loses bits about half as fast."""
    smooth, spiky = AdaptivePrecision(4, beta=1.0), AdaptivePrecision(4, beta=1.0)
    for i in range(10):
        smooth.step(i, _probs("uniform"), 1.0)
        spiky.step(i, _probs("relu"), 1.0)
    assert 32 - smooth.value == pytest.approx(10 * math.log(2), rel=0.15)
    assert 32 - spiky.value < 0.7 * (32 - smooth.value)


def test_until_forces_target_and_degenerate_tensor_does_not_move():
    zeros = relative_histogram(torch.zeros(100), 2048)[0]
    sched = AdaptivePrecision(3, beta=4.0, until=5)
    assert [sched.step(i, zeros, 1.0) for i in range(5)] == [32] * 5
    assert sched.step(5, zeros, 1.0) == 3


@pytest.mark.parametrize("kwargs,match", [
    ({"target_bits": 0}, "target_bits"), ({"target_bits": 9}, "target_bits"),
    ({"target_bits": 4, "start_bits": 2}, "start_bits"),
    ({"target_bits": 4, "beta": 0}, "beta"), ({"target_bits": 4, "until": -1}, "until"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptivePrecision(**kwargs)
