"""Observers: histogram estimates, percentile, MSE, the Rand stochastic scale, calibration
accumulation, per-channel weight clips."""

import math

import pytest
import torch

from lowbit.quant.observers import (
    MaxObserver,
    MSEObserver,
    PercentileObserver,
    RandObserver,
    channel_clip,
    check_method,
    make_observer,
    mse_fraction,
    quantile_from_histogram,
    rand_fraction,
    relative_histogram,
)
from lowbit.quant.quantize import round_half_up

BINS = 2048


def _data(n=50_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).abs() * 3.0


def test_relative_histogram_and_quantile_match_torch():
    m = _data()
    probs, top = relative_histogram(m, BINS)
    assert top == pytest.approx(float(m.max()))
    assert float(probs.sum()) == pytest.approx(1.0)
    for q in (0.5, 0.9, 0.999):
        est = quantile_from_histogram(probs, q) * top
        assert est == pytest.approx(float(torch.quantile(m, q)), abs=2 * top / BINS)


def test_relative_histogram_of_zeros_is_finite():
    probs, top = relative_histogram(torch.zeros(10), 64)
    assert top == 0.0 and float(probs[0]) == 1.0


def test_rand_fraction_keeps_tail_below_threshold():
    m = _data()
    probs, top = relative_histogram(m, BINS)
    for thr in (1e-3, 1e-2):
        p = rand_fraction(probs, thr)
        assert 0 < p < 1
        tail = float((m > top * (1 - p)).float().mean())
        # the histogram estimate is exact up to one bin of mass
        assert tail <= thr + float(probs.max())
    # far below one element: the whole range is kept
    assert rand_fraction(probs, 1e-9) == pytest.approx(0.0, abs=1 / BINS)


def test_rand_observer_stochastic_clip_range_and_mean():
    obs = RandObserver(bins=BINS, threshold=1e-2, tau=1)
    m = _data()
    obs.observe(m)
    top, p = float(obs.top), float(obs.p)
    assert p > 0
    draws = torch.tensor([obs.clip(255, 0, stochastic=True) for _ in range(400)])
    assert float(draws.min()) >= top * (1 - p) - 1e-9 and float(draws.max()) <= top + 1e-9
    assert float(draws.std()) > 0
    assert obs.clip(255) == pytest.approx(top * (1 - p / 2))


def test_percentile_observer():
    obs = PercentileObserver(bins=BINS, percentile=99.0)
    m = _data()
    obs.observe(m)
    assert obs.clip(255) == pytest.approx(float(torch.quantile(m, 0.99)), rel=0.01)


def test_mse_observer_beats_max_at_low_bits():
    m = _data()
    obs = MSEObserver(bins=BINS)
    obs.observe(m)

    def err(clip, qmax=3):
        s = clip / qmax
        return float(((torch.clamp(round_half_up(m / s), 0, qmax) * s - m) ** 2).mean())

    clip = obs.clip(3)
    assert clip < float(m.max())
    assert err(clip) < 0.5 * err(float(m.max()))
    # at 8 bits the best clip is close to the maximum
    assert mse_fraction(obs.rel, 255) > 0.5


def test_qat_observe_is_ema_and_refreshes_every_tau():
    obs = MaxObserver(bins=64, momentum=0.5, tau=3, eta=2)
    for v in (2.0, 4.0, 4.0):
        obs.observe(torch.tensor([0.0, v]))
    assert float(obs.top) == pytest.approx(0.5 * (0.5 * 2 + 0.5 * 4) + 0.5 * 4)
    assert int(obs.steps) == 3 and int(obs.refreshes) == 1
    obs.observe(torch.tensor([1.0, 1.0]))
    assert int(obs.refreshes) == 2 and int(obs.samples) == 4
    assert obs.clip(255) == pytest.approx(float(obs.top))


def test_calibration_accumulates_over_batches_of_different_range():
    obs = PercentileObserver(bins=BINS, percentile=90.0)
    parts = [_data(20_000, s) * f for s, f in ((1, 0.5), (2, 2.0), (3, 1.0))]
    for part in parts:
        obs.accumulate(part)
    obs.finish_calibration()
    allm = torch.cat(parts)
    assert float(obs.top) == pytest.approx(float(allm.max()))
    assert obs.clip(255) == pytest.approx(float(torch.quantile(allm, 0.9)), rel=0.01)


@pytest.mark.parametrize("method", ["max", "percentile", "mse", "rand"])
def test_channel_clip(method):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 4, 3, 3, generator=g) * torch.arange(1, 7).view(6, 1, 1, 1)
    top = w.abs().reshape(6, -1).amax(1)
    clip = channel_clip(w, method, 1, -2, threshold=0.05, percentile=90.0)
    assert clip.shape == (6,)
    assert bool((clip <= top + 1e-6).all()) and bool((clip > 0).all())
    if method == "max":
        assert torch.equal(clip, top)
    if method == "percentile":
        ref = torch.quantile(w.abs().reshape(6, -1), 0.9, dim=1)
        assert torch.allclose(clip, ref)
    if method == "mse":
        assert bool((clip < top).all())  # 2-bit weights: clipping the tail always pays
    if method == "rand":
        q = torch.quantile(w.abs().reshape(6, -1), 0.95, dim=1)
        assert bool((clip >= (q + top) / 2 - 1e-5).all())
        stoch = channel_clip(w, method, 1, -2, stochastic=True, threshold=0.05)
        assert bool((stoch >= q - 1e-5).all()) and bool((stoch <= top).all())


def test_bad_method():
    with pytest.raises(ValueError, match="method must be one of"):
        check_method("minmax")
    with pytest.raises(ValueError, match="method"):
        make_observer("kl")
    assert math.isfinite(MaxObserver().clip(255))


def test_observers_skip_and_count_nonfinite_values_and_empty_batches():
    obs = MaxObserver(bins=64, tau=1)
    obs.observe(torch.tensor([1.0, float("nan"), 3.0, float("inf")]))
    assert float(obs.top) == 3.0 and int(obs.nonfinite) == 2 and int(obs.steps) == 1
    obs.observe(torch.tensor([]))
    obs.observe(torch.tensor([float("nan")]))
    assert int(obs.steps) == 1 and int(obs.nonfinite) == 3 and float(obs.top) == 3.0
    obs.start_calibration()
    obs.accumulate(torch.tensor([float("-inf"), 2.0]))
    obs.accumulate(torch.tensor([]))
    obs.finish_calibration()
    assert float(obs.top) == 2.0 and int(obs.nonfinite) == 4 and int(obs.samples) == 1


def test_rand_p_is_capped_below_one():
    obs = RandObserver(bins=64, threshold=0.5, tau=1)
    obs.observe(torch.cat([torch.zeros(1000), torch.ones(1)]))  # nearly all mass at 0
    assert 0 < float(obs.p) <= 1 - 1 / 64
    assert obs.clip(255, stochastic=True) >= 1 / 64 - 1e-12


@pytest.mark.parametrize("bits,method", [(8, "max"), (4, "percentile"), (2, "max"), (1, "max")])
def test_weight_scales_are_float32_whatever_the_weights_dtype(bits, method):
    """A float64 copy of a model (`q.double()`) keeps the model's float32 weight scales:
    recomputed in float64 they round differently (clip / qmax), and its outputs would leave
    the model's arithmetic."""
    from lowbit.quant.modules import WeightQuantizer

    w = torch.randn(16, 8, 3, 3, generator=torch.Generator().manual_seed(bits)) / 7
    wq = WeightQuantizer(bits, method)
    s32, s64 = wq.scale(w), wq.scale(w.double())
    assert s32.dtype == s64.dtype == torch.float32
    assert torch.equal(s32, s64)
    ints, scales = wq.integer(w)
    exact = ints.double() * scales.double().view(-1, 1, 1, 1)  # q s, exact in float64
    assert torch.equal(wq(w.double()), exact)
    assert len(ints.unique()) >= min(3, 2**bits)
