"""Per-layer precision (`layers=`) and `lowbit.summary` (issue 35, item 2): every Conv2d /
Linear layer is listed with its precision, method and scales, or kept float with the reason."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from rich.console import Console
from torch import nn

import lowbit
from lowbit.quant import quant_layers, summary


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
        self.head = nn.Linear(8, 4)
        self.aux = nn.Linear(8, 4)

    def forward(self, x):
        x = self.dw(self.body(torch.relu(self.stem(x))))
        x = x.mean((2, 3))
        return self.head(x) + self.aux(x)


def _x(n=4, seed=0):
    return torch.randn(n, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


def _quantize(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lowbit.quantize(Net(), **kw)


def test_per_layer_precision_by_name_and_glob():
    q = _quantize(weight_bits=4, act_bits=4, method="max",
                  layers={"body.*": dict(weight_bits=2, act_bits=3, method="mse"),
                          "body.2": dict(act_bits=2),  # later patterns win, key by key
                          "head": dict(weight_bits=8, act_bits=8)})
    got = {n: (m.weight_quant.prec.bits, m.act_quant.bits, m.act_quant.method)
           for n, m in quant_layers(q)}
    assert got == {"stem": (4, 4, "max"), "body.0": (2, 3, "mse"), "body.2": (2, 2, "mse"),
                   "head": (8, 8, "max"), "aux": (4, 4, "max")}
    q = _quantize(layers={"aux": dict(float=True)})
    assert "aux" not in dict(quant_layers(q))


@pytest.mark.parametrize("layers,exc,match", [
    ({"nothing*": dict(weight_bits=2)}, ValueError, "matches no Conv2d/Linear layer"),
    ({"head": dict(bits=2)}, ValueError, "unknown key 'bits'.*weight_bits, act_bits"),
    ({"head": dict(weight_bits=9)}, ValueError, "head.*weight_bits must be in 1..8"),
    ({"head": dict(method="minmax")}, ValueError, "method"),
    ({"head": 4}, TypeError, "dict"),
    (["head"], TypeError, "layers must be a dict"),
])
def test_bad_layer_overrides(layers, exc, match):
    with pytest.raises(exc, match=match):
        _quantize(layers=layers)


def test_summary_names_every_layer_and_why_it_stays_float():
    q = _quantize(weight_bits=4, act_bits=4, skip_first=True, skip=["aux"])
    lowbit.calibrate(q, [_x()])
    buf = io.StringIO()
    rows = summary(q, console=Console(file=buf, width=200))
    by = {r.name: r for r in rows}
    assert list(by) == ["stem", "body.0", "body.2", "dw", "head", "aux"]
    assert by["stem"].reason == "first layer (skip_first)"
    assert by["aux"].reason == "skipped by the user"
    assert by["dw"].reason == "dilation=(2, 2) (no integer conv)"
    for name in ("body.0", "body.2", "head"):
        r = by[name]
        assert r.state == "fake-quant" and not r.kept_float
        assert (r.weight, r.act, r.method) == ("s4", "s4" if name == "head" else "u4", "max")
        assert 0 < r.act_scale and 0 < r.weight_scale_min <= r.weight_scale_max
    text = buf.getvalue()
    for word in ("stem", "first layer (skip_first)", "dilation=(2, 2)", "s4", "fake-quant"):
        assert word in text
    assert "3 quantized, 3 kept float" in text


def test_summary_of_never_observed_and_converted_models():
    q = _quantize(weight_bits=2, act_bits=2)
    rows = {r.name: r for r in summary(q, show=False)}
    assert rows["stem"].state == "fake-quant" and rows["stem"].reason == "never observed"
    assert rows["stem"].act is None
    lowbit.calibrate(q, [_x()])
    c = lowbit.convert(q)
    rows = {r.name: r for r in summary(c, show=False)}
    assert rows["stem"].state == "integer" and rows["stem"].act == "s2"
    assert rows["stem"].act_scale == pytest.approx(c.stem.a_scale.item())
    assert rows["dw"].kept_float and rows["dw"].reason == "dilation=(2, 2) (no integer conv)"


def test_summary_of_a_float_model_and_bad_input():
    rows = summary(Net(), show=False)
    assert len(rows) == 6 and all(r.kept_float for r in rows)
    assert rows[0].reason == "not quantized (lowbit.quantize was not applied)"
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        summary("resnet")
