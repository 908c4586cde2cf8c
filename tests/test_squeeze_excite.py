"""Squeeze-excite over a ReLU map on the integer path: MobileNet-V3's ReLU blocks (hardsigmoid
gate) and RegNet-Y's (sigmoid gate, a residual add after the projection). `lowbit.quantize`
quantizes the gate's input (`activation_bits`) and the map the gate scales (the output of the
module writing it, `lowbit.quant.residual.activation_points`), so the channel product is a
table of two quantized values (`TableMul`) and the plan computes the model's own arithmetic:
no float fallback, every layer reads exactly its fake-quant input, the reference executor's
logits equal the fake-quant model's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from any_cnn_cases import compiled, fallback_reasons, layer_inputs_exact, quantized
from lowbit.graph.ir import TableMul
from lowbit.quant.residual import activation_points, value_quantizers
from lowbit.runtime.engine import ReferenceExecutor


def _cbn(cin: int, cout: int, stride: int = 1, k: int = 3) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]


class SqueezeExcitation(nn.Module):
    """torchvision's squeeze-excite module: global pool, 1x1 conv, ReLU, 1x1 conv, the gate;
    the gate scales the module's input."""

    def __init__(self, channels: int, squeeze: int, gate: type[nn.Module]) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = nn.ReLU(), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


class ReluBlock(nn.Module):
    """stem, then conv-BN-ReLU, squeeze-excite, a 1x1 projection added to the block's input
    and a ReLU (RegNet-Y's block; MobileNet-V3's with a hardsigmoid gate); `functional`: the
    map's ReLU is F.relu in this forward (no module writes the map: its BatchNorm's output is
    quantized and the ReLU is a table of it)."""

    def __init__(self, gate: type[nn.Module] = nn.Sigmoid, functional: bool = False) -> None:
        super().__init__()
        self.functional = functional
        self.stem = nn.Sequential(*_cbn(3, 16, 2), nn.ReLU())
        self.expand = nn.Sequential(*_cbn(16, 32), *([] if functional else [nn.ReLU()]))
        self.se = SqueezeExcitation(32, 8, gate)
        self.project = nn.Sequential(*_cbn(32, 16, k=1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = F.relu(self.expand(x)) if self.functional else self.expand(x)
        x = F.relu(self.project(self.se(y)) + x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _x(size: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def _quantized(model: nn.Module, recipe: str = "w8a8", **kw) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    x = _x()
    return quantized(model, x, recipe, **kw), x


def _points(model: nn.Module) -> tuple[list[tuple[str, str]], list[str]]:
    """`activation_points` of `model` with its layers quantized (where quantize looks)."""
    return activation_points(lowbit.quantize(model, activation_bits=None))


CASES = {"mobilenet_v3": dict(gate=nn.Hardsigmoid), "regnet_y": dict(gate=nn.Sigmoid),
         "functional_relu": dict(gate=nn.Sigmoid, functional=True)}


@pytest.mark.parametrize("recipe", ["w8a8", "w2a2"])
@pytest.mark.parametrize("case", list(CASES))
def test_relu_squeeze_excite_is_a_table_product(case, recipe):
    """The gate's input and the ReLU map are quantized in the model (8 bits: the tables'
    width, also at w2a2), the product is one TableMul of both, no fallback; every layer reads
    exactly its fake-quant input and the logits equal the fake-quant model's."""
    functional = CASES[case].get("functional", False)
    torch.manual_seed(0)
    model = ReluBlock(**CASES[case])
    # the map's owner: the Sequential ending in its ReLU (functional: in its BatchNorm)
    assert _points(model) == ([("se.scale_activation", "input"), ("expand", "output")], [])
    x = _x()
    q = quantized(model, x, recipe)
    quantizers = value_quantizers(q)
    assert sorted(quantizers) == ["expand.residual_quant", "se.scale_activation.input_quant"]
    assert all(v.bits == 8 for v in quantizers.values())
    plan = compiled(q, x).plan
    assert not plan.fallbacks, fallback_reasons(plan)
    (mul,) = plan.steps_of(TableMul)
    gate, fmap = plan.tensors[mul.a], plan.tensors[mul.b]
    assert gate.shape == (2, 1, 1, 32) and fmap.shape == (2, 8, 8, 32)
    assert str(fmap.precision) == ("s8" if functional else "u8")  # the map's own quantizer
    assert fmap.scale == pytest.approx(float(quantizers["expand.residual_quant"].scale()))
    assert plan.params[mul.table].numel() == 256 * 256
    checked, y, yf = layer_inputs_exact(q, plan, x)
    assert checked == len(plan.layers) == 6  # stem, expand, fc1, fc2, project, fc
    assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


def test_map_quantizer_needs_a_gate_and_a_quantized_layer():
    """Only a product of a gate (a table activation of a quantized layer) and a quantized
    layer's map gets the map quantizer: a product of two layer outputs, a gate times the
    float image and, without activation_bits, the squeeze-excite block get none (the
    product then runs in float, with its reason)."""

    class Products(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
            self.c = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1))
            self.fc = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.a(x)) * self.b(x)  # no gate
            z = torch.sigmoid(self.c(x)) * x  # the gate scales the float image
            return self.fc(y.mean((2, 3)) + z.mean((1, 2, 3))[:, None])

    assert _points(Products()) == ([("c", "output")], [])  # the sigmoid's input
    q, x = _quantized(ReluBlock(), activation_bits=None)
    assert not value_quantizers(q)
    reasons = fallback_reasons(compiled(q, x).plan)
    assert any(r.startswith("product of values not quantized in the model")
               for r in reasons.values())


def test_map_quantizer_survives_save_and_load(tmp_path):
    """The map's output quantizer is rebuilt by load (fake-quant and converted model)."""
    q, x = _quantized(ReluBlock())  # what arch= builds
    checked = 0
    for model in (q, lowbit.convert(q)):
        path = tmp_path / "m.safetensors"
        lowbit.save(model, path, arch=f"{__file__}:ReluBlock")
        loaded = lowbit.load(path).eval()
        want = {n: (r.bits, r.scale()) for n, r in value_quantizers(model).items()}
        assert {n: (r.bits, r.scale()) for n, r in value_quantizers(loaded).items()} == want
        checked += len(want)
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))
    assert checked == 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gpu_executor_equals_reference(device):
    """The GPU executor (Triton under the interpreter on the CPU) on the RegNet-Y and
    MobileNet-V3 blocks: every tensor equals the reference's on the same device."""
    from lowbit.runtime.gpu import GpuExecutor

    x = _x(size=8).to(device)
    checked = 0
    for gate in (nn.Sigmoid, nn.Hardsigmoid):
        torch.manual_seed(0)
        q = quantized(ReluBlock(gate), x.cpu()).to(device)
        plan = compiled(q, x).plan
        assert plan.steps_of(TableMul) and not plan.fallbacks
        y, rec = GpuExecutor(plan, device)(x, record=True)
        y_ref, rec_ref = ReferenceExecutor(plan, device)(x, record=True)
        assert torch.equal(y, y_ref)
        for name, t in rec_ref.items():
            assert torch.equal(rec[name], t), name
            checked += 1
    assert checked > 20
