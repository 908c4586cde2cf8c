"""lowbit.quantize: which layers are swapped, encodings, per-channel scales, STE gradients, mix,
calibration, and argument errors."""

import pytest
import torch
from torch import nn

import lowbit
from lowbit.core import Encoding
from lowbit.quant import ActQuantizer, QuantConv2d, QuantLinear, precision_schedule, quant_layers


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.ln = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 4)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x)).mean((2, 3))
        return self.gate(self.fc2(self.act(self.fc1(self.ln(x)))))


def _x(n=4, seed=0):
    return torch.randn(n, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


def test_swaps_conv_and_linear_only_and_keeps_original():
    model = Net()
    q = lowbit.quantize(model, weight_bits=4, act_bits=4)
    assert [n for n, _ in quant_layers(q)] == ["conv1", "conv2", "fc1", "fc2"]
    assert isinstance(q.conv1, QuantConv2d) and isinstance(q.fc2, QuantLinear)
    for name in ("bn1", "ln", "act", "gate"):
        assert type(getattr(q, name)) is type(getattr(model, name))
    assert type(model.conv1) is nn.Conv2d  # a copy unless inplace
    assert torch.equal(q.conv1.weight, model.conv1.weight)


def test_skip_first_last_and_names():
    q = lowbit.quantize(Net(), skip_first=True, skip_last=True)
    assert [n for n, _ in quant_layers(q)] == ["conv2", "fc1"]
    q = lowbit.quantize(Net(), skip=["fc1", "conv2"])
    assert [n for n, _ in quant_layers(q)] == ["conv1", "fc2"]
    model = Net()
    assert lowbit.quantize(model, inplace=True) is model


def test_encodings_and_per_channel_weight_scales():
    q = lowbit.quantize(Net(), weight_bits=2, act_bits=3)
    q.train()
    q(_x())
    assert q.conv1.act_quant.precision().encoding is Encoding.SIGNED  # raw input
    assert q.conv2.act_quant.precision().encoding is Encoding.UNSIGNED  # after ReLU
    assert q.fc1.act_quant.precision().encoding is Encoding.SIGNED  # after LayerNorm
    assert q.fc2.act_quant.precision().encoding is Encoding.SIGNED  # after GELU (can be < 0)
    assert q.conv2.weight_quant.prec.name == "s2"
    q.eval()
    w = q.conv2.weight
    wq = q.conv2.weight_quant(w)
    s = q.conv2.weight_quant.scale(w)
    levels = (wq / s.view(-1, 1, 1, 1)).round()
    assert torch.allclose(wq, levels * s.view(-1, 1, 1, 1), atol=1e-6)
    assert int(levels.min()) >= -2 and int(levels.max()) <= 1
    assert len(set(s.tolist())) == 8  # one scale per output channel


def test_binary_weights_at_one_bit():
    q = lowbit.quantize(Net(), weight_bits=1, act_bits=2).eval()
    w = q.conv2.weight
    wq = q.conv2.weight_quant(w)
    s = w.abs().reshape(8, -1).mean(1).view(-1, 1, 1, 1)
    assert q.conv2.weight_quant.prec.name == "b1"
    assert torch.allclose(wq.abs(), s.expand_as(wq))
    assert torch.equal(torch.sign(wq), torch.where(w >= 0, 1.0, -1.0))


def test_ste_gradients_reach_float_weights():
    q = lowbit.quantize(Net(), weight_bits=4, act_bits=4).train()
    q(_x()).sum().backward()
    for _, layer in quant_layers(q):
        assert layer.weight.grad is not None and float(layer.weight.grad.abs().sum()) > 0


def test_activations_are_quantized_to_the_grid():
    q = lowbit.quantize(Net(), weight_bits=8, act_bits=2).train()
    q(_x())
    aq = q.conv2.act_quant
    q.eval()
    x = torch.rand(100) * 3
    y = aq(x)
    assert len(torch.unique(y)) <= 4
    assert torch.allclose(y / aq.scale(), (y / aq.scale()).round(), atol=1e-5)


def test_mix_trains_at_a_schedule_and_evaluates_at_target():
    q = lowbit.quantize(Net(), weight_bits=4, act_bits=2, method="rand", mix=True, tau=1,
                        beta=8.0, threshold=1e-2, train_steps=100)
    q.train()
    for i in range(6):
        q(_x(seed=i))
    sched = precision_schedule(q)
    assert set(sched) == {"conv1", "conv2", "fc1", "fc2"}
    for hist in sched.values():
        assert hist[0] == (0, 32) and hist[-1][1] < 32
    assert q.conv2.act_quant.training_bits == q.conv2.act_quant.mix.bits
    q.eval()
    assert q.conv2.act_quant.training_bits == 2
    q.train()
    q.conv2.act_quant.frozen = True  # e.g. after calibrate: no statistics, no schedule
    assert q.conv2.act_quant.training_bits == 2


def test_calibrate_sets_ranges_and_freezes():
    model = Net().eval()
    q = lowbit.quantize(model, weight_bits=8, act_bits=8)
    batches = [(_x(8, s), torch.zeros(8)) for s in range(3)]
    lowbit.calibrate(q, batches)
    aq = q.conv1.act_quant
    assert aq.frozen
    top = max(float(b[0].abs().max()) for b in batches)
    assert float(aq.observer.top) == pytest.approx(top)
    with torch.no_grad():
        ref, out = model(_x(8, 9)), q.eval()(_x(8, 9))
    assert float((out - ref).norm() / ref.norm()) < 0.02
    before = float(aq.observer.top)
    q.train()(_x(seed=5) * 10)
    assert float(aq.observer.top) == before  # frozen: QAT does not move the range


@pytest.mark.parametrize("method", ["percentile", "mse", "rand"])
def test_calibrate_other_methods(method):
    q = lowbit.quantize(Net(), weight_bits=4, act_bits=4, method=method)
    lowbit.calibrate(q, [_x(8, s) for s in range(2)], num_batches=1)
    clip = q.conv1.act_quant.scale() * q.conv1.act_quant.precision().qmax
    assert 0 < clip <= float(_x(8, 0).abs().max()) + 1e-6


def test_calibrate_binary_activation_scale_is_mean_abs():
    q = lowbit.quantize(Net(), weight_bits=2, act_bits=1)
    q.train()(_x(seed=7) * 5)  # QAT statistics first: calibration must start afresh
    batches = [_x(8, s) * (s + 1) for s in range(3)]
    lowbit.calibrate(q, batches)
    aq = q.conv1.act_quant
    assert aq.precision().name == "b1"
    assert aq.scale() == pytest.approx(float(torch.cat(batches).abs().mean()), rel=1e-5)
    out = aq.eval()(batches[0])
    assert torch.allclose(out.abs(), torch.full_like(out, aq.scale()))


def test_eval_before_any_data_is_an_error():
    q = lowbit.quantize(Net()).eval()
    with pytest.raises(RuntimeError, match="calibrate"):
        q(_x())


def test_unsupported_conv_stays_float_with_warning():
    """Dilated convs stay float; grouped and depthwise convs are quantized."""
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2), nn.Conv2d(4, 4, 3, dilation=2),
                          nn.Conv2d(4, 4, 1, groups=4))
    with pytest.warns(UserWarning, match=r"stay float: 1 \(dilation"):
        q = lowbit.quantize(model)
    assert [n for n, _ in quant_layers(q)] == ["0", "2"]


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"weight_bits": 0}, ValueError, "weight_bits"),
    ({"weight_bits": 9}, ValueError, "weight_bits"),
    ({"act_bits": "4"}, TypeError, "act_bits"),
    ({"act_bits": True}, TypeError, "act_bits"),
    ({"method": "minmax"}, ValueError, "method"),
    ({"mix": 1}, TypeError, "mix"),
    ({"skip": "fc1"}, TypeError, "skip"),
    ({"skip": ["nope"]}, ValueError, "skip"),
    ({"skip": [3]}, TypeError, "skip"),
    ({"threshold": 2.0}, ValueError, "threshold"),
    ({"tau": 0}, ValueError, "tau"),
    ({"bins": 100}, ValueError, "bins"),
    ({"mix_until": -3}, ValueError, "mix_until"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        lowbit.quantize(Net(), **kwargs)


def test_bad_models_and_calibration_input():
    with pytest.raises(TypeError, match="model"):
        lowbit.quantize("resnet")
    q = lowbit.quantize(Net())
    with pytest.raises(ValueError, match="already quantized"):
        lowbit.quantize(q)
    with pytest.raises(ValueError, match=r"lowbit\.quantize first"):
        lowbit.calibrate(Net(), [_x()])
    with pytest.raises(ValueError, match="no batches"):
        lowbit.calibrate(q, [])
    with pytest.raises(TypeError, match="loader"):
        lowbit.calibrate(q, [["text"]])
    with pytest.raises(ValueError, match="num_batches"):
        lowbit.calibrate(q, [_x()], num_batches=0)
    assert isinstance(q.conv1.act_quant, ActQuantizer)
