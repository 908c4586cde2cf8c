"""Guarded values (issue 35, item 4): non-finite inputs, NaN/inf/zero calibration, empty
batches, and layers lowbit leaves float, each one a failure quoted in the issue."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import lowbit
from lowbit.quant import quant_layers, summary


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _batches(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 1, 8, 8, generator=g) for _ in range(n)]


def _calibrated(**kw):
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4, **kw)
    return lowbit.calibrate(q, _batches())


def _poisoned(value: float) -> torch.Tensor:
    x = _batches(1, seed=5)[0]
    x[1, 0, 2, 3] = value
    return x


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_input_raises_naming_the_layer(value):
    """Issue: 'NaN inputs quantize to 0 and give plausible logits'."""
    q = _calibrated().eval()
    with pytest.raises(ValueError, match=r"layer 0: input holds 1 non-finite"):
        q(_poisoned(value))
    c = lowbit.convert(q)
    with pytest.raises(ValueError, match=r"layer 0: input holds 1 non-finite"):
        c(_poisoned(value))


def test_clamp_mode_replaces_nonfinite_values():
    q = _calibrated(nonfinite="clamp").eval()
    x = _poisoned(float("nan"))
    out = q(x)
    assert torch.isfinite(out).all()
    clean = x.clone()
    clean[1, 0, 2, 3] = 0.0  # NaN counts as 0 in clamp mode
    assert torch.equal(out, q(clean))
    c = lowbit.convert(q)
    assert torch.equal(c(x), c(clean))
    big = _poisoned(float("inf"))
    top = big.clone()
    top[1, 0, 2, 3] = 1e30  # +inf counts as the largest value: the clip
    assert torch.equal(q(big), q(top))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_calibration_batch_raises(value):
    """Issue: 'one NaN or inf batch during calibration ... makes an activation scale NaN/inf,
    convert succeeds and every output is NaN'."""
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4)
    batches = _batches()
    batches[1][0, 0, 0, 0] = value
    with pytest.raises(ValueError, match="layer 0: input holds 1 non-finite"):
        lowbit.calibrate(q, batches)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_observers_skip_and_count_nonfinite_values_in_clamp_mode(value):
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4, nonfinite="clamp")
    batches = _batches()
    batches[1][0, 0, 0, 0] = value
    lowbit.calibrate(q, batches)
    obs = q[0].act_quant.observer
    assert int(obs.nonfinite) == 1
    assert float(obs.top) == pytest.approx(max(float(b[torch.isfinite(b)].abs().max())
                                               for b in batches))
    c = lowbit.convert(q)
    assert torch.isfinite(c(_batches(1, 9)[0])).all()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_qat_batch(value):
    """Issue: 'one NaN or inf batch during ... QAT makes an activation scale NaN/inf'."""
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4, method="rand")
    q.train()
    q(_batches(1)[0])
    x = _poisoned(value)
    with pytest.raises(ValueError, match="layer 0: input holds 1 non-finite"):
        q(x)
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4, method="rand", nonfinite="clamp")
    q.train()
    for b in (*_batches(2), x):
        q(b)
    aq = q[0].act_quant
    assert int(aq.observer.nonfinite) == 1
    assert torch.isfinite(aq.observer.top) and 0 < aq.scale() < 10


def test_nonfinite_weights_raise_naming_the_layer():
    q = _calibrated().eval()
    with torch.no_grad():
        q[3].weight[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="layer 3: weights hold 1 non-finite"):
        q(_batches(1)[0])
    with pytest.raises(ValueError, match="layer 3: weights hold 1 non-finite"):
        lowbit.convert(q)


def test_all_zero_calibration_raises_with_the_numbers():
    """Issue: 'all-zero calibration gives a scale of 6.7e-14 without a warning'."""
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4)
    zeros = [torch.zeros(8, 1, 8, 8) for _ in range(2)]
    with pytest.raises(ValueError, match=r"layer 0: all 1024 calibration values were 0"):
        lowbit.calibrate(q, zeros)


def test_no_scale_is_tiny_or_nonfinite():
    q = _calibrated()
    checked = 0
    for _, layer in quant_layers(q):
        s = layer.act_quant.scale()
        assert s == s and 1e-30 < s < 1e30
        ws = layer.weight_quant.scale(layer.weight)
        assert torch.isfinite(ws).all() and bool((ws > 1e-30).all())
        checked += 1
    assert checked == 3
    obs = q[0].act_quant.observer
    obs.top.fill_(float("nan"))
    with pytest.raises(ValueError, match="layer 0: activation scale is nan"):
        q[0].act_quant.scale()


def test_qat_on_zeros_keeps_zeros_but_eval_needs_a_range():
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4)
    q.train()
    out = q[0](torch.zeros(2, 1, 8, 8))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"layer 0: .*only zeros"):
        q[0].act_quant.scale()


def test_empty_batches_work_end_to_end():
    """Issue: 'an empty batch works in the fake-quant model but raises an internal message in
    the integer model'."""
    q = _calibrated()
    empty = torch.zeros(0, 1, 8, 8)
    q.train()
    assert q(empty).shape == (0, 10)  # QAT step on an empty batch: no statistics change
    before = float(q[0].act_quant.observer.top)
    assert float(q[0].act_quant.observer.top) == before
    q.eval()
    assert q(empty).shape == (0, 10)
    c = lowbit.convert(q)
    out = c(empty)
    assert out.shape == (0, 10) and out.dtype == torch.float32
    lin = c[7]
    assert lin(torch.zeros(0, 8)).shape == (0, 10)
    lowbit.calibrate(lowbit.quantize(_cnn()), [empty, *_batches(1)])


def test_qat_empty_batch_does_not_decay_the_range():
    q = lowbit.quantize(_cnn(), weight_bits=4, act_bits=4)
    q.train()
    q(_batches(1)[0])
    top = float(q[0].act_quant.observer.top)
    steps = int(q[0].act_quant.observer.steps)
    q(torch.zeros(0, 1, 8, 8))
    assert float(q[0].act_quant.observer.top) == top
    assert int(q[0].act_quant.observer.steps) == steps


class MyConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


def test_conv_subclass_is_named_not_skipped_silently():
    """Issue: 'a Conv2d subclass is skipped silently'."""
    model = nn.Sequential(MyConv(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(36, 2))
    with pytest.warns(UserWarning, match=r"0 \(Conv2d subclass MyConv"):
        q = lowbit.quantize(model)
    assert [n for n, _ in quant_layers(q)] == ["3"]
    rows = {r.name: r for r in summary(q, show=False)}
    assert rows["0"].kept_float and "Conv2d subclass MyConv" in rows["0"].reason


def test_model_with_nothing_to_quantize_raises():
    """Issue: 'a model with nothing to quantize raises nothing'."""
    with pytest.raises(ValueError, match="nothing to quantize"):
        lowbit.quantize(nn.Sequential(nn.ReLU(), nn.BatchNorm2d(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"nothing to quantize.*0: dilation=\(2, 2\)"):
            lowbit.quantize(nn.Sequential(nn.Conv2d(4, 4, 3, dilation=2)))
    with pytest.raises(ValueError, match=r"nothing to quantize.*0: skipped by the user"):
        lowbit.quantize(nn.Sequential(nn.Linear(3, 3)), skip=["0"])


def test_bad_nonfinite_argument():
    with pytest.raises(ValueError, match="nonfinite must be one of raise, clamp"):
        lowbit.quantize(_cnn(), nonfinite="ignore")
