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
from test_save_load import make_resnet, one_thread  # noqa: F401  (autouse: one thread)


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


def test_warmup_ceiling_reaches_the_target_at_until_even_without_a_slope():
    """A degenerate tensor (zero slope) follows the warm-up ceiling: linear from the start
    precision to the target, which it holds from `until` on."""
    zeros = relative_histogram(torch.zeros(100), 2048)[0]
    sched = AdaptivePrecision(3, beta=4.0, until=10)
    bits = [sched.step(i, zeros, 1.0) for i in range(12)]
    assert bits[0] == 32 and bits[10:] == [3, 3]
    assert all(b1 <= b0 for b0, b1 in itertools.pairwise(bits))
    assert [sched.ceiling(i) for i in (0, 5, 10, 50)] == [32, 17.5, 3, 3]
    fresh = AdaptivePrecision(3, until=10)  # state at 32 bits: the cap decides
    assert fresh.bits_at(4) == 20 and fresh.bits_at(10) == 3 and fresh.bits_at(0) == 32


@pytest.mark.parametrize("kwargs,match", [
    ({"target_bits": 0}, "target_bits"), ({"target_bits": 9}, "target_bits"),
    ({"target_bits": 4, "start_bits": 2}, "start_bits"),
    ({"target_bits": 4, "beta": 0}, "beta"), ({"target_bits": 4, "until": -1}, "until"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptivePrecision(**kwargs)


# ----------------------------------------------------------------- quantize(mix=True) on digits

def _digits_resnet():
    return make_resnet(width=8)


def test_mix_needs_the_training_length():
    import lowbit

    with pytest.raises(ValueError, match=r"mix=True needs train_steps"):
        lowbit.quantize(_digits_resnet(), weight_bits=1, act_bits=2, method="rand", mix=True)
    with pytest.raises(ValueError, match="train_steps must be"):
        lowbit.quantize(_digits_resnet(), mix=True, train_steps=0)
    with pytest.raises(ValueError, match="mix_warmup must be in"):
        lowbit.quantize(_digits_resnet(), mix=True, train_steps=10, mix_warmup=1.5)


def test_readme_recipe_reaches_the_target_with_most_of_training_ahead():
    """Issue: 'With method="rand", mix=True and 100 QAT steps, w1a2 reached 0.15 accuracy
    against 0.88 with MAX; without mix 0.81-0.83. After 100 steps the layers were still at
    23-25 activation bits against a 2-bit target'. Sized from train_steps, every layer trains
    at its deployed precision from 25% of training on."""
    import lowbit
    from lowbit.demo import train
    from lowbit.quant import precision_schedule
    from lowbit.quant.data import digits_loaders

    loader, _ = digits_loaders(batch_size=64, seed=0)
    torch.manual_seed(0)
    fp32 = train(_digits_resnet(), loader, 100, 3e-3)
    torch.manual_seed(1)
    loader.generator.manual_seed(1)
    q = lowbit.quantize(fp32, weight_bits=1, act_bits=2, method="rand", mix=True,
                        train_steps=100)
    q = train(q, loader, 100, 1e-3)
    checked = 0
    for name, hist in precision_schedule(q).items():
        first = next(step for step, bits in hist if bits == 2)
        assert first <= 25 and hist[-1][1] == 2, (name, hist)
        aq = q.get_submodule(name).act_quant
        assert int(aq.target_steps) >= 75, name
        checked += 1
    assert checked == 7
    # the accuracies after 100 steps depend on float summation order (BLAS, thread count):
    # mix against no mix is compared over seeds by benchmarks/qat_schedule.py, not here
    lowbit.convert(q)  # trained at its deployed precision: converts without complaint


def test_convert_refuses_a_layer_never_trained_at_its_deployed_precision():
    """Issue: '... and `convert` deployed at 2 bits without a word'."""
    import lowbit

    q = lowbit.quantize(_digits_resnet(), weight_bits=2, act_bits=2, method="rand", mix=True,
                        train_steps=1000)
    q.train()
    for s in range(10):
        q(torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(s)))
    with pytest.raises(ValueError, match=r"stem\.0: 10 QAT steps, none at its deployed 2 "
                                         r"activation bits \(training precision now \d+ bits, "
                                         r"warm-up ends at step 250\)"):
        lowbit.convert(q)
    c = lowbit.convert(q, allow_untrained=True)
    assert c.stem[0].a_scale.item() > 0
