"""convert(): integer weights and scales, BatchNorm folding, and the integer forward through
lowbit.reference against the fake-quant forward.

Tolerance: the integer path computes exact int64 accumulators and dequantizes in float64, the
fake-quant path is float32 throughout, so one layer fed the same input agrees to
|diff| <= 1e-5 * max|out| (float32 rounding). End to end, an activation that falls within that
rounding of a half step may quantize one level apart in the next layer, so whole models are
compared at |diff| <= 1e-3 * max|out| with equal predictions.
"""

import pytest
import torch
from torch import nn

import lowbit
from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.quant import quant_layers
from lowbit.runtime import IntegerConv2d, IntegerLinear, integer_layers

LAYER_RTOL = 1e-5
MODEL_RTOL = 1e-3


class Residual(nn.Module):
    """Not a Sequential: BN pairs must come from the fx graph; conv3's output has two users."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, (3, 1), stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 1)
        self.bn3 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.bnf = nn.BatchNorm1d(5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        y = self.conv3(x)
        x = torch.relu(self.bn3(y) + y)
        return self.bnf(self.fc(x.mean((2, 3))))


def _x(n=6, seed=0):
    return torch.randn(n, 3, 7, 7, generator=torch.Generator().manual_seed(seed))


def _trained(model, wb, ab, method="max", steps=3, **kw):
    torch.manual_seed(0)
    q = lowbit.quantize(model, weight_bits=wb, act_bits=ab, method=method, **kw)
    opt = torch.optim.SGD(q.parameters(), lr=0.05)
    q.train()
    for s in range(steps):
        opt.zero_grad()
        q(_x(seed=s)).square().mean().backward()
        opt.step()
    return q.eval()


def _close(a, b, rtol):
    return float((a - b).abs().max()) <= rtol * float(b.abs().max()) + 1e-7


@pytest.mark.parametrize("wb,ab,method", [(8, 8, "max"), (4, 4, "mse"), (2, 2, "rand"),
                                          (1, 2, "percentile"), (3, 1, "max")])
def test_each_layer_matches_fake_quant(wb, ab, method):
    q = _trained(Residual(), wb, ab, method)
    c = lowbit.convert(q)
    pairs = {"conv1": "bn1", "conv2": "bn2", "fc": "bnf"}  # conv3 has two users: not folded
    specs = integer_layers(c)
    assert set(specs) == {"conv1", "conv2", "conv3", "fc"}
    for name, spec in specs.items():
        assert spec.folded_bn == (name in pairs)
    assert isinstance(c.bn1, nn.Identity) and isinstance(c.bn3, nn.BatchNorm2d)
    inputs = {}
    hooks = [getattr(q, n).register_forward_hook(
        lambda m, i, o, n=n: inputs.__setitem__(n, i[0])) for n in specs]
    with torch.no_grad():
        q(_x(seed=7))
        for h in hooks:
            h.remove()
        for name, x in inputs.items():
            ref = getattr(q, name)(x)
            if name in pairs:
                ref = getattr(q, pairs[name])(ref)
            out = getattr(c, name)(x)
            assert out.dtype == torch.float32 and out.shape == ref.shape
            assert _close(out, ref, LAYER_RTOL), name


@pytest.mark.parametrize("wb,ab", [(8, 8), (2, 2)])
def test_whole_model_matches_fake_quant(wb, ab):
    q = _trained(Residual(), wb, ab, "rand", threshold=1e-2)
    c = lowbit.convert(q)
    with torch.no_grad():
        ref, out = q(_x(32, seed=11)), c(_x(32, seed=11))
    assert _close(out, ref, MODEL_RTOL)
    assert torch.equal(out.argmax(1), ref.argmax(1))


def test_integer_weights_scales_and_workloads():
    q = _trained(Residual(), 2, 3)
    c = lowbit.convert(q)
    spec = integer_layers(c)["conv2"]
    assert spec.weight.dtype == torch.int8 and spec.weight.shape == (8, 3, 1, 8)  # KRSC
    assert int(spec.weight.min()) >= -2 and int(spec.weight.max()) <= 1
    assert spec.w.name == "s2" and spec.a.name == "u3"  # input after ReLU: unsigned
    w_fq = q.conv2.weight_quant(q.conv2.weight)
    deq = spec.weight.permute(0, 3, 1, 2).float() * spec.w_scale.view(-1, 1, 1, 1)
    assert torch.allclose(deq, w_fq, atol=1e-6)
    wl = spec.workload((6, 4, 4, 8))
    assert isinstance(wl, ConvWorkload)
    assert (wl.N, wl.H, wl.W, wl.C, wl.K, wl.R, wl.S, wl.stride, wl.pad) == (6, 4, 4, 8, 8, 3, 1,
                                                                             2, 1)
    assert wl.precision_name == "w2a3"
    fc = integer_layers(c)["fc"]
    wl = fc.workload((6, 8))
    assert isinstance(wl, GemmWorkload) and (wl.M, wl.N, wl.K) == (6, 5, 8)
    assert integer_layers(c)["conv1"].a.name == "s3"  # raw input: signed


def test_calibrated_sequential_converts_and_keeps_float_layers():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(100, 6), nn.GELU(), nn.Linear(6, 2)).eval()
    q = lowbit.quantize(model, 8, 8, skip_last=True)
    lowbit.calibrate(q, [_x(8, s) for s in range(3)])
    c = lowbit.convert(q)
    assert isinstance(c[0], IntegerConv2d) and isinstance(c[4], IntegerLinear)
    assert isinstance(c[1], nn.Identity) and type(c[6]) is nn.Linear
    assert not c.training
    with torch.no_grad():
        assert _close(c(_x(4, 9)), q.eval()(_x(4, 9)), MODEL_RTOL)
        assert float((c(_x(4, 9)) - model(_x(4, 9))).norm() / model(_x(4, 9)).norm()) < 0.05


def test_convert_errors():
    with pytest.raises(TypeError, match="model"):
        lowbit.convert(42)
    with pytest.raises(ValueError, match=r"lowbit\.quantize first"):
        lowbit.convert(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="no activation range"):
        lowbit.convert(lowbit.quantize(nn.Sequential(nn.Linear(2, 2))))
    with pytest.raises(TypeError, match="fold_bn"):
        lowbit.convert(lowbit.quantize(nn.Sequential(nn.Linear(2, 2))), fold_bn="yes")
    c = lowbit.convert(_trained(Residual(), 8, 8, steps=1))
    with pytest.raises(ValueError, match=r"x must be \[N, 3, H, W\]"):
        c.conv1(torch.zeros(1, 4, 5, 5))
    with pytest.raises(TypeError, match="floating-point"):
        c.conv1(torch.zeros(1, 3, 5, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 8\]"):
        c.fc(torch.zeros(2, 7))


def test_convert_leaves_the_fake_quant_model_alone():
    q = _trained(Residual(), 4, 4, steps=1)
    lowbit.convert(q)
    assert len(quant_layers(q)) == 4 and isinstance(q.bn1, nn.BatchNorm2d)


def test_fused_requantize_epilogue_matches_next_quantizer():
    """conv + BN + ReLU + the next layer's input quantizer as one integer epilogue."""
    from lowbit.quant import fused_epilogue
    from lowbit.quant.quantize import quantize
    from lowbit.reference import run

    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    q = _trained(model, 4, 4)
    c = lowbit.convert(q)
    spec, nxt = c[0].spec, q[3].act_quant
    epi, params = fused_epilogue(spec, nxt.precision(), nxt.scale(), relu=True)
    assert epi.key == "bias+relu->u4/int8"
    x = _x(4, seed=3)
    qx = quantize(x, torch.tensor(spec.a_scale), spec.a).permute(0, 2, 3, 1).contiguous()
    wl = spec.workload(tuple(qx.shape)).replace(epilogue=epi)
    fused = run(wl, qx, spec.weight, params).to(torch.int64)
    with torch.no_grad():
        y = torch.relu(c[0](x)).permute(0, 2, 3, 1)
    ref = quantize(y.contiguous(), torch.tensor(nxt.scale()), nxt.precision()).to(torch.int64)
    diff = (fused - ref).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.01
    assert float(ref.float().std()) > 0  # a non-trivial output spread
    with pytest.raises(ValueError, match="out_scale"):
        fused_epilogue(spec, nxt.precision(), 0.0)
    with pytest.raises(ValueError, match="out must be"):
        fused_epilogue(spec, lowbit.Precision(1, "binary"), 1.0)
