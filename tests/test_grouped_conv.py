"""Grouped and depthwise convs through the stack below the kernels: `ConvWorkload.groups`
(validation, key, dict round trips), operand shapes, the exact reference conv (both of its
exact paths, against float64 PyTorch), `lowbit.quantize` / `convert` of a model with depthwise
and grouped convs (the integer layers equal the fake-quant layers), the converted model's
state and its save / load."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit.core import ConvWorkload, Epilogue, workload_from_dict, workload_from_json
from lowbit.core.validate import operand_shapes
from lowbit.perfmodel.dataset import workload_from_key
from lowbit.quant import quant_layers
from lowbit.reference import conv2d_int, random_inputs, random_values, run
from lowbit.runtime import IntegerConv2d, integer_layers
from lowbit.serialize import load, save

DENSE_KEY = "conv2d(N=2,H=9,W=7,C=32,K=64,R=3,S=3,stride=2,pad=1)|w=s8/int8|a=s8/int8|int32"


# ------------------------------------------------------------------------------ workload

def test_groups_in_the_key_only_where_they_are_not_one():
    dense = ConvWorkload(N=2, H=9, W=7, C=32, K=64, R=3, S=3, stride=2, pad=1)
    assert dense.key == DENSE_KEY and "groups" not in dense.to_dict()
    grouped = dense.replace(groups=8)
    assert grouped.key == DENSE_KEY.replace("pad=1)", "pad=1,groups=8)")
    assert grouped.to_dict()["groups"] == 8
    for wl in (dense, grouped):
        assert workload_from_dict(wl.to_dict()) == wl
        assert workload_from_json(wl.to_json()) == wl
        assert workload_from_key(wl.key) == wl


def test_grouped_shapes_and_work():
    wl = ConvWorkload(N=2, H=9, W=7, C=32, K=64, R=3, S=3, stride=2, pad=1, groups=8)
    assert operand_shapes(wl) == ((2, 9, 7, 32), (64, 3, 3, 4), (2, 5, 4, 64))
    assert wl.gemm_shape == (40, 64, 36) and wl.ops == 2 * 40 * 64 * 36
    assert not wl.depthwise
    dw = ConvWorkload(N=1, H=8, W=8, C=16, K=16, R=5, S=5, pad=2, groups=16)
    assert dw.depthwise and operand_shapes(dw)[1] == (16, 5, 5, 1) and dw.gemm_shape[2] == 25


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(C=32, K=64, groups=3), ValueError, "multiples of groups=3"),
    (dict(C=32, K=36, groups=8), ValueError, "K=36 must be multiples"),
    (dict(C=32, K=32, groups=0), ValueError, "groups must be >= 1"),
    (dict(C=32, K=32, groups="4"), TypeError, "groups must be an int"),
])
def test_bad_groups(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ConvWorkload(N=1, H=4, W=4, **kwargs)


# ----------------------------------------------------------------------------- reference

@pytest.mark.parametrize("scale", [1, 2**22], ids=["float64", "int64"])
def test_reference_grouped_conv_is_exact(scale):
    """Both exact paths (float64 below 2^53, int64 beyond) against PyTorch's grouped conv in
    float64 on values small enough for it, scaled back."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-90, 90, (3, 7, 9, 24), generator=g)
    w = torch.randint(-90, 90, (36, 3, 3, 4), generator=g)
    want = F.conv2d(x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(), stride=2,
                    padding=1, groups=6).permute(0, 2, 3, 1).to(torch.int64)
    got = conv2d_int(x * scale, w * scale, 2, 1, groups=6)
    assert torch.equal(got, want * scale * scale)


def test_reference_run_on_packed_grouped_operands():
    wl = ConvWorkload(N=3, H=5, W=6, C=12, K=12, R=3, S=3, pad=1, groups=3, a="u4", w="s4",
                      a_layout="packed", w_layout="packed",
                      epilogue=Epilogue(bias=True, relu=True, out="u4", out_layout="packed"))
    x, w, params = random_inputs(wl, 4)
    assert x.shape == (3, 5, 6, 6) and w.shape == (12, 3, 3, 2)
    out = run(wl, x, w, params)
    assert out.shape == (3, 5, 6, 6) and out.dtype == torch.uint8
    assert not torch.equal(out, torch.zeros_like(out))


def test_reference_rejects_mismatched_groups():
    x = random_values((1, 4, 4, 8), ConvWorkload().a, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"C/groups=4 \(groups=4\)"):
        conv2d_int(x, torch.ones(8, 3, 3, 4, dtype=torch.int64), groups=4)
    with pytest.raises(ValueError, match="multiples of groups=3"):
        conv2d_int(x, torch.ones(8, 3, 3, 2, dtype=torch.int64), groups=3)
    with pytest.raises(ValueError, match="groups must be an int"):
        conv2d_int(x, torch.ones(8, 3, 3, 8, dtype=torch.int64), groups=0)


# --------------------------------------------------------------------- quantize / convert

class Inverted(nn.Module):
    """MobileNet-V2's inverted residual (expand, depthwise 3x3, project) and a ResNeXt-style
    grouped 3x3 at stride 2."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 24, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(24)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24, bias=False)
        self.bn2 = nn.BatchNorm2d(24)
        self.project = nn.Conv2d(24, 16, 1)
        self.grouped = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.expand(x)))
        x = torch.relu(self.bn2(self.dw(x)))
        x = torch.relu(self.grouped(self.project(x)))
        return self.fc(x.mean((2, 3)))


def _x(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 9, 7, generator=torch.Generator().manual_seed(seed))


def _calibrated(wb: int, ab: int) -> nn.Module:
    torch.manual_seed(0)
    model = Inverted()
    for bn in (model.bn1, model.bn2):  # non-trivial folded statistics
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    q = lowbit.quantize(model.eval(), weight_bits=wb, act_bits=ab)
    lowbit.calibrate(q, [_x(seed=s) for s in range(3)])
    return q.eval()


@pytest.mark.parametrize("wb,ab", [(8, 8), (4, 4), (2, 2)])
def test_converted_depthwise_and_grouped_layers_equal_fake_quant(wb, ab):
    q = _calibrated(wb, ab)
    assert {n for n, _ in quant_layers(q)} == {"expand", "dw", "project", "grouped", "fc"}
    c = lowbit.convert(q)
    specs = integer_layers(c)
    assert specs["dw"].groups == 24 and specs["grouped"].groups == 4
    assert specs["dw"].weight.shape == (24, 3, 3, 1) and specs["expand"].groups == 1
    wl = specs["grouped"].workload((4, 9, 7, 16))
    assert wl.groups == 4 and wl.K == 32 and operand_shapes(wl)[1] == (32, 3, 3, 4)
    inputs: dict[str, torch.Tensor] = {}
    hooks = [getattr(q, n).register_forward_hook(
        lambda m, i, o, n=n: inputs.__setitem__(n, i[0])) for n in ("dw", "grouped")]
    with torch.no_grad():
        q(_x(seed=9))
        for h in hooks:
            h.remove()
        checked = 0
        for name, bn in (("dw", q.bn2), ("grouped", None)):
            ref = getattr(q, name)(inputs[name])
            ref = bn(ref) if bn is not None else ref
            out = getattr(c, name)(inputs[name])
            assert out.shape == ref.shape
            tol = 1e-5 * float(ref.abs().max()) + 1e-6
            assert float((out - ref).abs().max()) <= tol, name
            checked += 1
        assert checked == 2
        whole_ref, whole = q(_x(8, seed=10)), c(_x(8, seed=10))
    assert float((whole - whole_ref).abs().max()) <= 1e-3 * float(whole_ref.abs().max())


def test_integer_conv_is_the_exact_grouped_conv_of_the_quantized_input():
    """IntegerConv2d = dequantize(reference grouped conv of the quantized input): checked
    against PyTorch's grouped conv of the integers in float64."""
    c = lowbit.convert(_calibrated(4, 4))
    layer: IntegerConv2d = c.grouped
    x = torch.rand(2, 16, 5, 5)
    q = torch.ops.lowbit.quantize_activation(x, layer.a_scale, str(layer.a), "grouped", "raise")
    acc = F.conv2d(q.double(), layer.weight.permute(0, 3, 1, 2).double(), stride=2, padding=1,
                   groups=4)
    want = (acc.permute(0, 2, 3, 1) * layer.out_scale + layer.out_bias).float()
    assert torch.equal(layer(x), want.permute(0, 3, 1, 2).contiguous())
    with pytest.raises(ValueError, match=r"\[N, 16, H, W\]"):
        layer(torch.rand(2, 4, 5, 5))


def test_converted_state_of_other_groups_fails_loudly():
    c = lowbit.convert(_calibrated(4, 4))
    state = c.state_dict()
    assert state["grouped.qlayout"].tolist()[-1] == 4 and len(state["expand.qlayout"]) == 6
    state["grouped.qlayout"] = state["grouped.qlayout"].clone()
    state["grouped.qlayout"][-1] = 2
    with pytest.raises(ValueError, match=r"holds .*groups 2, but this layer is .*groups 4"):
        c.load_state_dict(state)


def test_converted_grouped_model_saves_and_loads(tmp_path):
    c = lowbit.convert(_calibrated(2, 2))
    path = tmp_path / "inverted.safetensors"
    save(c, path)
    loaded = load(path, model=Inverted())
    assert integer_layers(loaded)["dw"].groups == 24
    with torch.no_grad():
        assert torch.equal(loaded(_x(seed=3)), c(_x(seed=3)))


def test_torch_export_of_a_converted_grouped_model():
    """The grouped layers export as lowbit::conv2d_int with their groups."""
    c = lowbit.convert(_calibrated(4, 4))
    ep = torch.export.export(c, (_x(),))
    groups = sorted(int(n.args[6]) for n in ep.graph.nodes
                    if "conv2d_int" in str(n.target) and len(n.args) > 6)
    assert groups == [4, 24]
    assert torch.equal(ep.module()(_x(seed=2)), c(_x(seed=2)))
