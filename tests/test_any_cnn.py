"""Any CNN on the integer path: clamps (ReLU6, Hardtanh, torch.clamp) as integer clamps of a
realization, activation functions (hardswish, SiLU, sigmoid, hardsigmoid, GELU, tanh,
functional or modules) as tables of their model-quantized input (`activation_bits`),
squeeze-excite's channel product (TableMul), channel selections and shuffles (Gather), spatial
means; what is left runs in fp16 with its reason, and a layer whose requantization has no
fixed-point form falls back instead of failing. Each integer layer reads exactly what the
fake-quant model's own input quantizer gives."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from any_cnn_cases import compiled, fallback_reasons, layer_inputs_exact, quantized
from lowbit.graph import AvgPool, FloatFallback, Layer, Lookup
from lowbit.graph.fallbacks import FP16_RTOL, HalfPrecision, LayerFallback
from lowbit.graph.ir import Gather, TableMul
from lowbit.graph.summary import plan_table
from lowbit.quant.residual import activation_points, value_quantizers
from lowbit.runtime.engine import ReferenceExecutor


def _cbn(cin: int, cout: int, stride: int = 1, k: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False),
                         nn.BatchNorm2d(cout))


class Clamps(nn.Module):
    """ReLU6, Hardtanh, torch.clamp / clamp_min / clamp_max and F.relu6 between convs."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.c3, self.c4, self.c5 = (_cbn(3, 16), _cbn(16, 16), _cbn(16, 24),
                                                       _cbn(24, 24), _cbn(24, 16))
        self.act1, self.act2 = nn.ReLU6(), nn.Hardtanh(-0.5, 1.5)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.c1(x))
        x = self.act2(self.c2(x))
        x = torch.clamp(self.c3(x), min=-0.25, max=0.75)
        x = self.c4(x).clamp_min(0.1).clamp_max(2.0)
        x = F.relu6(self.c5(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Activations(nn.Module):
    """Every table activation, as a module or as a function of a Sequential's output."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([_cbn(3, 16)] + [_cbn(16, 16) for _ in range(7)])
        self.acts = nn.ModuleList([nn.Hardswish(), nn.SiLU(), nn.Sigmoid(), nn.Hardsigmoid(),
                                   nn.GELU(), nn.Tanh()])
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, act in zip(self.convs[:6], self.acts, strict=True):
            x = act(conv(x))
        x = F.silu(self.convs[6](x))  # functional: the Sequential's output quantized
        y = self.convs[7](x)
        x = y * torch.sigmoid(y)  # swish written out: one table over the quantizer
        return self.fc(x.mean((2, 3)))


class SqueezeExcite(nn.Module):
    """MobileNet-V3 / EfficientNet's block on dense convs: expand, activation, squeeze-excite
    (global pool, two 1x1 convs, SiLU, sigmoid, channel product), project."""

    def __init__(self, gate: type[nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.stem, self.expand = _cbn(3, 16, 2), _cbn(16, 32)
        self.act = nn.Hardswish()
        self.fc1, self.fc2 = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
        self.se_act, self.gate = nn.SiLU(), gate()
        self.project = _cbn(32, 16, k=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        y = self.act(self.expand(x))
        s = self.gate(self.fc2(self.se_act(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        x = self.project(s * y) + x
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Channels(nn.Module):
    """chunk, split, channel slices, concat, a ShuffleNet channel shuffle and x.mean."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.c3, self.c4 = _cbn(3, 16), _cbn(8, 8), _cbn(16, 16), _cbn(6, 16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.c1(x))
        a, b = x.chunk(2, dim=1)
        x = torch.cat([a, F.relu(self.c2(b))], 1)
        n, c, h, w = x.size()
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)
        x = F.relu(self.c3(x))
        p, _ = torch.split(x, [6, 10], dim=1)
        x = F.relu(self.c4(p) + x[:, 0:16])
        return self.fc(x.mean([2, 3], keepdim=True).flatten(1))


def _x(seed: int = 1, size: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _check_exact(make, recipe: str = "w8a8", exact: bool = True, **kw):
    torch.manual_seed(0)
    model = make()
    x = _x()
    q = quantized(model, x, recipe, **kw)
    plan = compiled(q, x).plan
    checked = layer_inputs_exact(q, plan, x)[0] if exact else 0
    with torch.no_grad():
        yf = q(x)
    y = ReferenceExecutor(plan)(x)
    return q, plan, checked, y, yf


@pytest.mark.parametrize("recipe", ["w8a8", "w2a2"])
def test_clamps_are_integer_clamps(recipe):
    """No fallback and no extra quantizer: every clamp is a derived realization (a clamp
    table) or the realization's own ReLU, exact against the fake-quant model."""
    q, plan, checked, y, yf = _check_exact(Clamps, recipe)
    assert not value_quantizers(q)
    assert not plan.fallbacks, fallback_reasons(plan)
    assert checked == len(plan.layers) == 6
    derived = [o for s in plan.layers for o in s.layer_outputs if o.derived]
    assert len(derived) >= 2  # clamps inside the precision's range (a wide read: none)
    assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


@pytest.mark.parametrize("recipe", ["w8a8", "w4a4"])
def test_activations_are_tables_of_their_quantized_input(recipe):
    q, plan, checked, y, yf = _check_exact(Activations, recipe)
    _, skipped = activation_points(q)
    assert not skipped
    names = sorted(value_quantizers(q))
    assert names == sorted([f"acts.{i}.input_quant" for i in range(6)]
                           + ["convs.6.residual_quant", "convs.7.residual_quant"])
    assert all(value_quantizers(q)[n].bits == 8 for n in names)
    assert not plan.fallbacks, fallback_reasons(plan)
    assert checked == len(plan.layers) == 9
    assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


def test_activation_bits_none_leaves_them_float_in_fp16():
    q, plan, _, y, yf = _check_exact(Activations, exact=False, activation_bits=None)
    assert not value_quantizers(q)
    reasons = fallback_reasons(plan)
    table_acts = [r for r in reasons.values() if "its input is not quantized in the model" in r]
    assert len(table_acts) == 8  # six modules, F.silu, sigmoid
    assert any(r.startswith("product of values not quantized in the model")
               for r in reasons.values())
    assert all(isinstance(plan.modules[s.module], HalfPrecision) for s in plan.fallbacks
               if "not quantized" in s.reason)
    assert float((y - yf).abs().max()) <= 0.05 * float(yf.abs().max())  # fp16 in between


def test_activation_bits_is_checked():
    with pytest.raises(ValueError, match=r"activation_bits must be None or an int in 2\.\.8"):
        lowbit.quantize(Activations(), activation_bits=16)


@pytest.mark.parametrize("gate", [nn.Sigmoid, nn.Hardsigmoid])
def test_squeeze_excite_product_is_a_table(gate):
    _, plan, checked, y, yf = _check_exact(lambda: SqueezeExcite(gate))
    assert not plan.fallbacks, fallback_reasons(plan)
    (mul,) = plan.steps_of(TableMul)
    a, b = plan.tensors[mul.a], plan.tensors[mul.b]
    assert a.shape == (2, 1, 1, 32) and b.shape == (2, 8, 8, 32)
    assert plan.params[mul.table].numel() == 256 * 256
    assert checked == len(plan.layers) == 6
    assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


def test_channel_selections_and_shuffles_are_gathers():
    _, plan, checked, y, yf = _check_exact(Channels)
    assert not plan.fallbacks, fallback_reasons(plan)
    gathers = plan.steps_of(Gather)
    assert len(gathers) >= 4  # chunk (2), shuffle, split, slice
    shuffle = [g for g in gathers if plan.params[g.index].tolist() == [
        i // 2 + 8 * (i % 2) for i in range(16)]]
    assert shuffle
    assert checked == len(plan.layers) == 5
    assert float((y - yf).abs().max()) <= 1e-4 * float(yf.abs().max())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_gpu_executor_equals_reference(device):
    """The GPU executor's Triton steps (table product, lookups, gathers; under the
    interpreter on the CPU), bit for bit against the reference on the same device."""
    from lowbit.runtime.gpu import GpuExecutor

    x = _x(size=8).to(device)
    checked = 0
    for make in (SqueezeExcite, Channels, Clamps):
        torch.manual_seed(0)
        q = quantized(make(), x.cpu()).to(device)
        plan = compiled(q, x).plan
        ex = GpuExecutor(plan, device)
        y, rec = ex(x, record=True)
        y_ref, rec_ref = ReferenceExecutor(plan, device)(x, record=True)
        assert torch.equal(y, y_ref)
        for name, t in rec_ref.items():
            assert torch.equal(rec[name], t), name
            checked += 1
        kinds = {type(b.step) for b in ex.steps}
        assert kinds & {TableMul, Gather, Lookup, Layer}
    assert checked > 30


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(_cbn(3, 16), nn.ReLU(), _cbn(16, 16), nn.ReLU())
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).mean((2, 3)))


def test_layer_without_fixed_point_requantization_falls_back():
    """Half the channels of a BatchNorm scaled by 2^-90: the layer's output scale is 2^-90
    times its reader's, no 62-bit shift reaches it; the layer runs in fp16 (its module path
    in the reason, the plan counts it) and the model still compiles and runs."""
    torch.manual_seed(0)
    model = _Tiny().eval()
    x = _x()
    q = quantized(model, x)
    bn = q.body[0][1]
    with torch.no_grad():
        bn.weight[:8] *= 2.0**-90
    lowbit.calibrate(q, [x])
    plan = compiled(q, x).plan
    (fb,) = plan.fallbacks
    assert fb.reason.startswith("layer body.0.0: output ") and \
        "has no fixed-point requantization" in fb.reason
    assert isinstance(plan.modules[fb.module], LayerFallback)
    assert "float fallbacks: 1" in plan_table(plan)
    assert len(plan.layers) == 2
    with torch.no_grad():
        yf = q(x)
    y = ReferenceExecutor(plan)(x)
    assert float((y - yf).abs().max()) <= 0.02 * float(yf.abs().max())


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = _cbn(3, 16), _cbn(16, 16)
        self.norm = nn.GroupNorm(4, 16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.relu(self.c1(x)))
        return self.fc(F.relu(self.c2(x)).mean((2, 3)))


def test_fp16_fallback_tolerance():
    """An op without an integer form (GroupNorm) runs in fp16: its output is within fp16's
    rounding of the float32 module on the same input (FP16_RTOL per op, times the norm's
    few ops), and the plan says why."""
    torch.manual_seed(0)
    x = _x()
    q = quantized(_Norm().eval(), x)
    plan = compiled(q, x).plan
    (fb,) = plan.fallbacks
    assert fb.reason == "GroupNorm has no integer form"
    assert isinstance(plan.modules[fb.module], HalfPrecision)
    _, rec = ReferenceExecutor(plan)(x, record=True)
    (arg,) = fb.args
    with torch.no_grad():
        want = q.norm(rec[arg])
    err = float((rec[fb.output] - want).abs().max() / want.abs().max())
    assert 0 < err <= 4 * FP16_RTOL  # fp16 (not float32: the error is there)
    assert FloatFallback in {type(s) for s in plan.steps}


def test_global_pool_of_a_large_map_reads_16_bits():
    """A global mean of a 48 x 48 map: 2304 values of a 24-bit realization could sum past
    int32, so the pool reads a 16-bit one (its kernels sum in int32)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    q = quantized(_Tiny(), x)
    plan = compiled(q, x).plan
    (pool,) = plan.steps_of(AvgPool)
    assert str(plan.tensors[pool.input].precision) == "s16"
    assert pool.counts == (48 * 48,)
    with torch.no_grad():
        yf = q(x)
    y = ReferenceExecutor(plan)(x)
    assert float((y - yf).abs().max()) <= 1e-2 * float(yf.abs().max())


def test_activation_quantizers_survive_save_and_load(tmp_path):
    """The activations' input quantizers (pre-hooks) and the functional ones (a module's
    output) are rebuilt by load, for the fake-quant model and the converted one."""
    torch.manual_seed(0)
    x = _x()
    q = quantized(Activations(), x)
    for model in (q, lowbit.convert(q)):
        path = tmp_path / "m.safetensors"
        lowbit.save(model, path, arch=f"{__file__}:Activations")
        loaded = lowbit.load(path).eval()
        assert {n: (r.bits, r.scale()) for n, r in value_quantizers(loaded).items()} == \
            {n: (r.bits, r.scale()) for n, r in value_quantizers(model).items()}
        assert len(value_quantizers(loaded)) == 8
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x))


class _Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.act = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.c1(x))
        return self.c2(x) if float(x.mean()) > -1e9 else x  # data-dependent: no fx trace


def test_untraceable_model_keeps_activations_float_with_a_warning():
    with pytest.warns(UserWarning, match="activation inputs stay float: activation_bits needs"):
        q = lowbit.quantize(_Untraceable())
    assert not value_quantizers(q)
