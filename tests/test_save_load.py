"""lowbit.save / lowbit.load (issue 35, item 1): fresh-process round trips for fake-quant and
converted models at every demo precision, state_dict round trips that restore scales or fail
loudly, torch.load(weights_only=True), and torch.export of a converted CNN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import lowbit
from lowbit.quant import quant_layers, summary
from lowbit.serialize import load, save

PRECISIONS = ((8, 8), (4, 4), (2, 2), (1, 2))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train faster on one thread, and far faster on a loaded machine (OpenMP
    spin-waits on busy cores). Modules that import this fixture run on one thread too."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
TESTS_DIR = Path(__file__).resolve().parent


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.short = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class DigitsResNet(nn.Module):
    """The issue's model: residual adds, stride-2 blocks and a Linear head (8x8 inputs)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = Block(width, width, 1)
        self.layer2 = Block(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(x.mean((2, 3)))


def make_resnet(width: int = 8) -> DigitsResNet:
    torch.manual_seed(0)
    return DigitsResNet(width)


FACTORY = "test_save_load:make_resnet"


def _x(n=8, seed=0):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _trained(wb, ab, method="rand", mix=True, steps=6, scale=1.0, **kw):
    torch.manual_seed(1)
    q = lowbit.quantize(make_resnet(), weight_bits=wb, act_bits=ab, method=method, mix=mix,
                        tau=2, eta=2, threshold=1e-2, train_steps=steps, **kw)
    opt = torch.optim.SGD(q.parameters(), lr=0.01)
    q.train()
    for s in range(steps):
        opt.zero_grad()
        q(_x(seed=s) * scale).square().mean().backward()
        opt.step()
    return q.eval()


def _calibrated(wb=4, ab=4, scale=1.0):
    q = lowbit.quantize(make_resnet(), weight_bits=wb, act_bits=ab)
    return lowbit.calibrate(q, [_x(seed=s) * scale for s in range(2)])


# --------------------------------------------------------------- state_dict: restore or refuse

def test_converted_state_dict_restores_the_activation_scales():
    """Issue: 'Loading it into another converted model reports "All keys matched
    successfully" and the outputs differ (activation scale 0.86 kept instead of 0.16)'."""
    small, large = lowbit.convert(_calibrated(scale=1.0)), lowbit.convert(_calibrated(scale=5.0))
    a_small = small.layer1.conv1.a_scale.item()
    assert large.layer1.conv1.a_scale.item() > 2 * a_small
    large.load_state_dict(small.state_dict())
    assert large.layer1.conv1.a_scale.item() == a_small
    x = _x(seed=7)
    assert torch.equal(large(x), small(x))
    assert large.layer1.conv1.spec.a_scale == a_small


def test_converted_state_dict_of_another_precision_fails_loudly():
    w4 = lowbit.convert(_calibrated(4, 4))
    w2 = lowbit.convert(_calibrated(2, 2))
    with pytest.raises(ValueError, match=r"stem\.0: the state holds w=s2 a=s2.*this layer is "
                                         r"w=s4 a=s4"):
        w4.load_state_dict(w2.state_dict())


def test_torch_load_weights_only_round_trip(tmp_path):
    """Issue: '`torch.save` of the whole model fails to load under the default
    weights_only=True': the state of a converted model loads with weights_only=True."""
    src = lowbit.convert(_trained(2, 2))
    torch.save(src.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    dst = lowbit.convert(_calibrated(2, 2, scale=3.0))
    dst.load_state_dict(state)
    x = _x(seed=3)
    assert torch.equal(dst(x), src(x))


def test_fake_quant_state_holds_rand_p_frozen_and_the_schedule():
    """Issue: '`RandObserver.p` and the calibration `frozen` flag are not in the fake-quant
    state either'."""
    q = _trained(2, 2)
    lowbit.calibrate(q, [_x(seed=s) for s in range(2)])
    state = q.state_dict()
    aq = q.layer1.conv1.act_quant
    assert aq.observer.p > 0
    assert float(state["layer1.conv1.act_quant.observer.p"]) == aq.observer.p
    assert bool(state["layer1.conv1.act_quant.frozen_flag"])
    fresh = lowbit.quantize(make_resnet(), weight_bits=2, act_bits=2, method="rand", mix=True,
                            tau=2, eta=2, threshold=1e-2, train_steps=6)
    fresh.load_state_dict(state)
    got = fresh.layer1.conv1.act_quant
    assert got.frozen and got.observer.p == aq.observer.p
    assert got.mix.value == aq.mix.value
    fresh.eval()
    assert torch.equal(fresh(_x(seed=4)), q(_x(seed=4)))


# --------------------------------------------------------------- lowbit.save / lowbit.load

def _cases():
    out = []
    for wb, ab in PRECISIONS:
        for kind in ("fakequant", "converted"):
            out.append((kind, wb, ab))
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every (kind, precision) saved, with inputs and this process's outputs."""
    root = tmp_path_factory.mktemp("saved")
    cases = []
    for kind, wb, ab in _cases():
        q = _trained(wb, ab)
        model = lowbit.convert(q) if kind == "converted" else q
        path = root / f"{kind}-w{wb}a{ab}.safetensors"
        save(model, path, arch=FACTORY)
        x = _x(seed=wb * 10 + ab)
        with torch.no_grad():
            y = model(x)
        torch.save({"x": x, "y": y}, root / f"{path.stem}.io.pt")
        cases.append((kind, wb, ab, path))
    return cases


_CHILD = """
import sys, torch
from lowbit.serialize import load
for path in sys.argv[1:]:
    io = torch.load(path[:-len('.safetensors')] + '.io.pt', weights_only=True)
    model = load(path)
    with torch.no_grad():
        torch.save(model(io['x']), path + '.out.pt')
    print(path, type(model).__name__)
"""


def test_fresh_process_round_trip_is_bit_identical(saved):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    paths = [str(p) for *_, p in saved]
    done = subprocess.run([sys.executable, "-c", _CHILD, *paths], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    checked = 0
    for kind, wb, ab, path in saved:
        want = torch.load(path.with_name(f"{path.stem}.io.pt"), weights_only=True)["y"]
        got = torch.load(f"{path}.out.pt", weights_only=True)
        assert torch.equal(got, want), (kind, wb, ab)
        checked += 1
    assert checked == 2 * len(PRECISIONS)


def test_in_process_load_with_a_fresh_float_model(saved):
    checked = 0
    for kind, _wb, _ab, path in saved:
        io = torch.load(path.with_name(f"{path.stem}.io.pt"), weights_only=True)
        for base in (make_resnet(), make_resnet):  # a module or a zero-argument factory
            model = load(path, model=base)
            with torch.no_grad():
                assert torch.equal(model(io["x"]), io["y"]), (kind, path.name)
            checked += 1
    assert checked == 4 * len(PRECISIONS)


def test_manifest_says_what_is_inside(saved):
    from lowbit.serialize import read_manifest

    kind, wb, ab, path = saved[1]
    m = read_manifest(path)
    assert m["kind"] == kind == "converted" and m["arch"] == {"factory": FACTORY, "kwargs": {}}
    layers = {row["name"]: row for row in m["layers"]}
    assert layers["layer1.conv1"]["w"] == f"s{wb}" and layers["layer1.conv1"]["a"] == f"u{ab}"
    assert layers["layer1.conv1"]["folded_bn"] == "layer1.bn1"
    json.dumps(m)  # plain JSON


def test_loaded_fake_quant_model_resumes_training_identically(tmp_path):
    """Mid-QAT save: observer windows, Rand p, the mix state and step counts come back, so
    training on from the loaded model gives the same model as training on from the original."""
    q = _trained(2, 2, steps=5)
    save(q, tmp_path / "mid.safetensors", arch=FACTORY)
    back = load(tmp_path / "mid.safetensors")

    def more(model):
        torch.manual_seed(9)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model.train()
        for s in range(5, 9):
            opt.zero_grad()
            model(_x(seed=s)).square().mean().backward()
            opt.step()
        return model.eval()

    a, b = more(q), more(back)
    assert torch.equal(a(_x(seed=11)), b(_x(seed=11)))
    assert a.layer2.conv1.act_quant.mix.history == b.layer2.conv1.act_quant.mix.history


def test_summary_reasons_survive_save_and_load(tmp_path):
    q = lowbit.quantize(make_resnet(), weight_bits=4, act_bits=4, skip=["fc"], skip_first=True)
    lowbit.calibrate(q, [_x()])
    save(q, tmp_path / "m.safetensors", arch=FACTORY)
    back = load(tmp_path / "m.safetensors")
    rows = {r.name: r.reason for r in summary(back, show=False)}
    assert rows["fc"] == "skipped by the user" and rows["stem.0"] == "first layer (skip_first)"


def test_save_and_load_errors(tmp_path):
    q = _calibrated()
    with pytest.raises(ValueError, match="no lowbit layers"):
        save(make_resnet(), tmp_path / "f.safetensors")
    save(q, tmp_path / "noarch.safetensors")
    with pytest.raises(ValueError, match="pass model="):
        load(tmp_path / "noarch.safetensors")
    with pytest.raises(FileNotFoundError, match=r"nope\.safetensors"):
        load(tmp_path / "nope.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a lowbit model file"):
        load(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match=r"architecture does not match.*no Conv2d layer stem\.0"):
        load(tmp_path / "noarch.safetensors", model=nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="arch"):
        save(q, tmp_path / "x.safetensors", arch="no_colon_and_no_zoo")


def test_registry_hook_for_other_model_kinds(tmp_path):
    from lowbit.serialize import ModelKind, register_kind, unregister_kind

    class Plan(nn.Module):
        def __init__(self, k: float = 0.0):
            super().__init__()
            self.register_buffer("k", torch.tensor(k))

        def forward(self, x):
            return x * self.k

    kind = ModelKind(
        "test-plan", detect=lambda m: isinstance(m, Plan),
        to_manifest=lambda m: ({"note": "plan"}, {"k": m.k}),
        from_manifest=lambda manifest, tensors, base: Plan(float(tensors["k"])))
    register_kind(kind)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_kind(kind)
        save(Plan(2.5), tmp_path / "p.safetensors")
        back = load(tmp_path / "p.safetensors")
        assert isinstance(back, Plan) and float(back.k) == 2.5
    finally:
        unregister_kind("test-plan")


# --------------------------------------------------------------- torch.export

def test_torch_export_of_a_converted_cnn():
    """Issue: '`torch.export` ... fail ("ConvWorkload.N must be an int, got tensor(2)")'."""
    c = lowbit.convert(_trained(2, 2))
    x = _x(seed=5)
    ep = torch.export.export(c, (x,))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("lowbit.conv2d_int" in t for t in targets), targets
    assert any("lowbit.gemm_int" in t for t in targets), targets
    assert torch.equal(ep.module()(x), c(x))
    assert torch.equal(ep.module()(_x(seed=6)), c(_x(seed=6)))
    compiled = torch.compile(c, backend="aot_eager", fullgraph=True)  # no graph break
    assert torch.equal(compiled(_x(seed=7)), c(_x(seed=7)))


def test_converted_model_quant_layers_and_names():
    c = lowbit.convert(_calibrated())
    assert not quant_layers(c)
    assert c.layer1.conv1.layer_name == "layer1.conv1"


def test_a_zoo_model_loads_by_name(tmp_path):
    from lowbit.models import get

    q = lowbit.quantize(get("digits_resnet", width=0.5), weight_bits=2, act_bits=2)
    lowbit.calibrate(q, [_x()])
    c = lowbit.convert(q)
    save(c, tmp_path / "z.safetensors", arch="digits_resnet", arch_kwargs={"width": 0.5})
    back = load(tmp_path / "z.safetensors")
    assert torch.equal(back(_x(seed=2)), c(_x(seed=2)))
    c.lowbit_arch = {"zoo": "digits_resnet", "kwargs": {"width": 0.5}}  # as the zoo may set
    save(c, tmp_path / "z2.safetensors")
    assert torch.equal(load(tmp_path / "z2.safetensors")(_x(seed=2)), c(_x(seed=2)))


def test_fake_quant_state_of_another_precision_fails_loudly():
    w4, w2 = _calibrated(4, 4), _calibrated(2, 2)
    with pytest.raises(ValueError, match=r"stem\.0: the state holds w2a2, but this layer is "
                                         r"w4a4"):
        w4.load_state_dict(w2.state_dict())


def test_compiled_model_round_trip_is_bit_identical(tmp_path):
    """issue 35: save / load of a compiled network (its plans and their integer parameters):
    the loaded model runs the same plan, with the same outputs; a plan with float fallback
    steps refuses to save, naming them."""
    import warnings

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    q = lowbit.quantize(lowbit.models.get("digits_resnet", num_classes=10), weight_bits=2,
                        act_bits=2)
    lowbit.calibrate(q, [torch.randn(8, 1, 8, 8)])
    x = torch.randn(3, 1, 8, 8)
    cm = lowbit.compile(q, x)
    y = cm(x)
    path = lowbit.save(cm, tmp_path / "c.safetensors")
    assert lowbit.serialize.read_manifest(path)["kind"] == "compiled"
    loaded = lowbit.load(path)
    assert type(loaded).__name__ == "CompiledModel"
    assert loaded.plan.to_dict() == cm.plan.to_dict()
    assert torch.equal(loaded(x), y) and torch.equal(loaded(x * 0.5), cm(x * 0.5))
    with pytest.raises(ValueError, match="compile the model again"):
        loaded(torch.randn(2, 1, 8, 8))

    class Dilated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, padding=1)
            self.dw = nn.Conv2d(8, 8, 3, padding=2, dilation=2)
            self.fc = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc(self.dw(self.conv(x)).mean((2, 3)))

    q2 = lowbit.quantize(Dilated(), weight_bits=4, act_bits=4)
    lowbit.calibrate(q2, [torch.randn(4, 4, 6, 6)])
    cm2 = lowbit.compile(q2, torch.randn(2, 4, 6, 6))
    assert cm2.plan.fallbacks
    with pytest.raises(ValueError, match="float fallback steps"):
        lowbit.save(cm2, tmp_path / "d.safetensors")
