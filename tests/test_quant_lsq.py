"""LSQ and PACT (lowbit.quant.learned): gradients against the papers' formulas, initial values,
the learned scales reaching the integer layers (fake-quant == converted integer forward),
mix / method combinations, calibration, state_dict round trips and argument errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit.core import Precision
from lowbit.models import get
from lowbit.quant import quant_layers
from lowbit.quant.learned import (
    LSQActQuantizer,
    LSQWeightQuantizer,
    PACTActQuantizer,
    check_quantize_method,
    lsq_fake_quantize,
    lsq_grad_scale,
    pact_fake_quantize,
    pact_penalty,
)
from lowbit.quant.observers import mse_fraction, relative_histogram
from lowbit.quant.quantize import round_half_up


class Net(nn.Module):
    """Unsigned (after ReLU) and signed (after LayerNorm / GELU) layer inputs."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.ln = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x))).mean((2, 3))
        return self.fc2(F.gelu(self.fc1(self.ln(x))))


def _x(n=8, seed=0, shape=(3, 6, 6)):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def _paper_lsq_grad_s(v, s, qn, qp):
    """Esser et al. Eq. 3, element by element (no gradient scale)."""
    r = v / s
    if r <= -qn:
        return -qn
    if r >= qp:
        return qp
    return math.floor(r + 0.5) - r


@pytest.mark.parametrize("bits,signed", [(2, False), (3, True), (4, False), (2, True)])
def test_lsq_step_gradient_matches_the_paper_per_tensor(bits, signed):
    prec = Precision(bits, "signed" if signed else "unsigned")
    x = torch.tensor([-3.1, -0.73, -0.26, 0.0, 0.12, 0.49, 0.77, 1.3, 2.2, 9.0])
    s = torch.tensor(0.37, requires_grad=True)
    xg = x.clone().requires_grad_(True)
    up = torch.linspace(0.5, 1.5, x.numel())  # a non-uniform upstream gradient
    g = 0.3
    (lsq_fake_quantize(xg, s, prec, g) * up).sum().backward()
    qn, qp = -prec.qmin, prec.qmax
    want_s = g * sum(float(u) * _paper_lsq_grad_s(float(v), 0.37, qn, qp)
                     for v, u in zip(x, up, strict=True))
    assert float(s.grad) == pytest.approx(want_s, rel=1e-5, abs=1e-6)
    inside = [(-qn < float(v) / 0.37 < qp) for v in x]
    assert sum(inside) not in (0, x.numel())  # both branches checked
    assert xg.grad.tolist() == pytest.approx([float(u) * i for u, i in zip(up, inside,
                                                                            strict=True)])


def test_lsq_step_gradient_per_channel_and_grad_scale():
    prec = Precision(2, "signed")  # Qn = 2, Qp = 1
    w = torch.tensor([[0.3, -0.05, 0.9], [-0.7, 0.2, 0.01]])
    s = torch.tensor([0.25, 0.4], requires_grad=True)
    g = lsq_grad_scale(3, prec.qmax)
    assert g == pytest.approx(1 / math.sqrt(3 * 1))
    lsq_fake_quantize(w, s, prec, g, axis=0).sum().backward()
    for k in range(2):
        want = g * sum(_paper_lsq_grad_s(float(v), float(s[k].detach()), 2, 1)
                       for v in w[k])
        assert float(s.grad[k]) == pytest.approx(want, rel=1e-6)
    out = lsq_fake_quantize(w, s.detach(), prec, g, axis=0)
    q = torch.clamp(round_half_up(w / s.detach()[:, None]), -2, 1)
    assert torch.equal(out, q * s.detach()[:, None])


def test_lsq_binary_gradient_is_the_sign():
    prec = Precision(1, "binary")
    x = torch.tensor([-0.9, -0.1, 0.0, 0.2, 1.7], requires_grad=True)
    s = torch.tensor(0.5, requires_grad=True)
    out = lsq_fake_quantize(x, s, prec, 1.0)
    assert out.tolist() == [-0.5, -0.5, 0.5, 0.5, 0.5]
    out.sum().backward()
    assert float(s.grad) == pytest.approx(-1 - 1 + 1 + 1 + 1)
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("bits,signed", [(2, False), (4, False), (3, True), (1, True)])
def test_pact_alpha_gradient(bits, signed):
    x = torch.tensor([-2.5, -1.2, -0.3, 0.0, 0.4, 0.9, 1.0, 1.6, 3.0], requires_grad=True)
    alpha = torch.tensor(1.0, requires_grad=True)
    up = torch.arange(1.0, 10.0)
    (pact_fake_quantize(x, alpha, bits, signed) * up).sum().backward()
    if signed and bits == 1:  # binary: alpha * sign(x)
        d = [1.0 if v >= 0 else -1.0 for v in x.tolist()]
    else:  # Choi et al.: 1 above the clip; the lower clip qmin * s moves as qmin / qmax
        qmin, qmax = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else \
            (0, (1 << bits) - 1)
        lo = qmin / qmax
        d = [1.0 if v >= 1.0 else (lo if v <= lo else 0.0) for v in x.tolist()]
    want = sum(u * dv for u, dv in zip(up.tolist(), d, strict=True))
    assert float(alpha.grad) == pytest.approx(want)
    assert float(alpha.grad) != 0.0


def test_pact_forward_is_clip_then_grid():
    x = torch.linspace(-1, 3, 41)
    out = pact_fake_quantize(x, torch.tensor(2.0), 2, False)
    s = 2.0 / 3
    assert torch.allclose(out, torch.round(x.clamp(0, 2) / s) * s, atol=1e-6)
    assert set(torch.round(out / s).tolist()) == {0.0, 1.0, 2.0, 3.0}


def test_initial_values_follow_the_papers():
    torch.manual_seed(0)
    w = torch.randn(4, 3, 3, 3)
    for bits in (1, 2, 4):
        wq = LSQWeightQuantizer(bits, 4)
        step = wq.scale(w)
        mean = w.abs().reshape(4, -1).mean(1)
        want = mean if bits == 1 else 2 * mean / math.sqrt((1 << (bits - 1)) - 1)
        assert torch.allclose(step, want)
    x = torch.relu(_x())
    aq = LSQActQuantizer(3).train()
    aq(x)
    assert aq.scale() == pytest.approx(2 * float(x.mean()) / math.sqrt(7), rel=1e-5)
    pq = PACTActQuantizer(3).train()
    pq(x)
    probs, top = relative_histogram(x.reshape(-1), pq.observer.bins)
    clip = top * mse_fraction(probs, 7, 0)
    assert 0 < clip < top
    assert pq.scale() == pytest.approx(clip / 7, rel=1e-5)


@pytest.mark.parametrize("method", ["lsq", "pact"])
def test_learned_scales_train_and_reach_the_integer_layers(method):
    torch.manual_seed(1)
    checked = 0
    for wb, ab in ((8, 8), (4, 4), (2, 2), (1, 2), (2, 1)):
        q = lowbit.quantize(Net(), weight_bits=wb, act_bits=ab, method=method,
                            skip_first=True)
        opt = torch.optim.Adam(q.parameters(), lr=1e-3)
        target = torch.randn(8, 4)
        inits = None
        for i in range(4):
            opt.zero_grad()
            # PACT's L2 penalty gives every clip a gradient, clipping or not
            (F.mse_loss(q(_x(seed=i)), target) + 1e-3 * pact_penalty(q)).backward()
            if inits is None:
                inits = {n: p.detach().clone() for n, p in q.named_parameters()
                         if n.endswith(("step_size", "alpha"))}
            opt.step()
        assert inits and all(not torch.equal(p, inits[n]) for n, p in q.named_parameters()
                             if n in inits)  # every learned scale moved
        q.eval()
        for name, layer in quant_layers(q):
            aq = layer.act_quant
            value = aq.step_size if method == "lsq" else aq.alpha
            value = value.detach()
            assert float(value) > 0, name
            want = float(value) if method == "lsq" or (aq.signed and ab == 1) else \
                float(value / aq.precision().qmax)
            assert aq.scale() == pytest.approx(want, rel=1e-6), name
            if method == "lsq":
                assert torch.equal(layer.weight_quant.scale(layer.weight),
                                   layer.weight_quant.step_size.detach())
        integer = lowbit.convert(q)
        x = _x(16, seed=9)
        with torch.no_grad():
            fake, real = q(x), integer(x)
        assert torch.allclose(fake, real, rtol=1e-4, atol=1e-5), (wb, ab, method)
        checked += 1
    assert checked == 5


def _trained_resnet(method, seed, steps):
    """The digits ResNet at w2a2 after a few QAT steps (eval mode)."""
    torch.manual_seed(seed)
    q = lowbit.quantize(get("digits_resnet", num_classes=10), 2, 2, method=method,
                        skip_first=True, skip_last=True)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    for i in range(steps):
        opt.zero_grad()
        F.cross_entropy(q(_x(16, i, (1, 8, 8))), torch.arange(16) % 10).backward()
        opt.step()
    return q.eval()


@pytest.mark.parametrize("method", ["lsq", "pact"])
def test_round_trip_on_the_digits_resnet(method):
    q = _trained_resnet(method, seed=2, steps=3)
    x = _x(32, 5, (1, 8, 8))
    with torch.no_grad():
        assert torch.allclose(q(x), lowbit.convert(q)(x), rtol=1e-4, atol=1e-5)


def test_pact_with_mix_trains_above_the_target_then_converts():
    torch.manual_seed(3)
    q = lowbit.quantize(Net(), 2, 2, method="pact", mix=True, train_steps=8, skip_first=True)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    for i in range(8):
        opt.zero_grad()
        q(_x(seed=i)).square().mean().backward()
        opt.step()
    sched = lowbit.quant.precision_schedule(q)
    assert all(h[0][1] > 2 and h[-1][1] == 2 for h in sched.values()), sched
    q.eval()
    x = _x(seed=11)
    with torch.no_grad():
        assert torch.allclose(q(x), lowbit.convert(q)(x), rtol=1e-4, atol=1e-5)


def test_calibration_initializes_the_learned_scales():
    torch.manual_seed(4)
    q = lowbit.quantize(Net(), 4, 4, method="lsq", skip_first=True)
    loader = [(_x(seed=i),) for i in range(3)]
    lowbit.calibrate(q, loader)
    aq = q.conv2.act_quant
    q.eval()  # calibration ran in eval mode (BN running statistics)
    with torch.no_grad():
        inputs = torch.cat([torch.relu(q.bn1(q.conv1(b[0]))) for b in loader])
    assert aq.scale() == pytest.approx(2 * float(inputs.mean()) / math.sqrt(15), rel=1e-4)


def test_state_dict_round_trip_restores_learned_scales():
    torch.manual_seed(5)
    q = lowbit.quantize(Net(), 2, 2, method="lsq", skip_first=True)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2)
    for i in range(3):
        opt.zero_grad()
        q(_x(seed=i)).square().mean().backward()
        opt.step()
    q.eval()
    torch.manual_seed(99)
    fresh = lowbit.quantize(Net(), 2, 2, method="lsq", skip_first=True)
    fresh.load_state_dict(q.state_dict())
    fresh.eval()
    x = _x(seed=7)
    with torch.no_grad():
        assert torch.equal(q(x), fresh(x))


def test_pact_penalty_sums_alpha_squared():
    q = lowbit.quantize(Net(), 4, 4, method="pact", skip_first=True)
    q(_x())
    alphas = [m.alpha for m in q.modules() if isinstance(m, PACTActQuantizer)]
    assert len(alphas) == 3
    assert float(pact_penalty(q).detach()) == pytest.approx(sum(float(a.detach()) ** 2
                                                            for a in alphas))
    assert float(pact_penalty(Net())) == 0.0


def test_methods_combinations_and_errors():
    assert check_quantize_method("lsq") == "lsq"
    with pytest.raises(ValueError, match="lsq, pact"):
        lowbit.quantize(Net(), 4, 4, method="learned")
    with pytest.raises(ValueError, match=r"lsq.*mix"):
        lowbit.quantize(Net(), 4, 4, method="lsq", mix=True, train_steps=10)
    q = lowbit.quantize(Net(), 4, 4, method="rand", layers={"fc*": {"method": "lsq"}})
    kinds = {n: type(m.act_quant).__name__ for n, m in quant_layers(q)}
    assert kinds == {"conv1": "ActQuantizer", "conv2": "ActQuantizer",
                     "fc1": "LSQActQuantizer", "fc2": "LSQActQuantizer"}
    aq = LSQActQuantizer(4).eval()
    with pytest.raises(RuntimeError, match="train it or run lowbit"):
        aq(_x())
    aq.train()(torch.relu(_x()))
    with pytest.raises(ValueError, match="learned for 4 bits"):
        aq.scale(3)
    wq = LSQWeightQuantizer(4, 3)
    with pytest.raises(ValueError, match="5 output channels"):
        wq(torch.randn(5, 2))


@pytest.mark.parametrize("method", ["lsq", "pact"])
def test_save_and_load_keep_the_learned_scales(tmp_path, method):
    from lowbit.serialize import load, save

    q = _trained_resnet(method, seed=6, steps=2)
    path = save(q, tmp_path / f"{method}.safetensors", arch="digits_resnet",
                arch_kwargs={"num_classes": 10})
    back = load(path).eval()
    kinds = {type(m.act_quant).__name__ for _, m in quant_layers(back)}
    assert kinds == {"LSQActQuantizer" if method == "lsq" else "PACTActQuantizer"}
    x = _x(8, 3, (1, 8, 8))
    with torch.no_grad():
        assert torch.equal(q(x), back(x))
