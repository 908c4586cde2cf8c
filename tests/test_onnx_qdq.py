"""lowbit.from_onnx / lowbit.to_onnx: Brevitas QCDQ exports (both of its exporters) and a
ModelOpt-style int8 QDQ model become lowbit fake-quant models with the file's integers, scales
and bit widths, equal to Brevitas's own forward and to ONNX's reference evaluator, and compile;
lowbit models written by to_onnx come back with the same integers and predictions; what lowbit
cannot hold is refused naming the node."""

import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import lowbit
from lowbit.core import Precision
from lowbit.quant.modules import QUANT_MODULES
from lowbit.quant.onnx_ops import identifier
from lowbit.quant.qdq_modules import StandaloneQuant
from lowbit.runtime.integer_model import integer_layers

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _quant_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QUANT_MODULES)}


def _compiled_top1(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = lowbit.compile(model, x, executor="reference")
        return cm(x).argmax(1), cm


def _reference_evaluator(proto: object, x: torch.Tensor) -> np.ndarray:
    """The file's own semantics (onnx.reference implements Q/DQ from opset 19)."""
    if proto.opset_import[0].version < 19:
        proto = onnx.version_converter.convert_version(proto, 19)
    inp = next(i.name for i in proto.graph.input
               if i.name not in {t.name for t in proto.graph.initializer})
    return ReferenceEvaluator(proto).run(None, {inp: x.numpy()})[0]


# ------------------------------------------------------------------------------ Brevitas
def _brevitas_net(seed: int) -> nn.Module:
    """s4 input, w8 stem with BN and u2 ReLU, a residual block of w2 convs (the add reads the
    stem's quantized output), max-pool, flatten and a w8 per-tensor linear head."""
    import brevitas.nn as qnn
    from brevitas.quant import Int8WeightPerChannelFloat

    per_channel = {"weight_quant": Int8WeightPerChannelFloat, "bias": False}

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = qnn.QuantIdentity(bit_width=4)
            self.stem = qnn.QuantConv2d(1, 16, 3, padding=1, weight_bit_width=8, **per_channel)
            self.bn0 = nn.BatchNorm2d(16)
            self.relu0 = qnn.QuantReLU(bit_width=2)
            self.conv1 = qnn.QuantConv2d(16, 16, 3, padding=1, weight_bit_width=2,
                                         **per_channel)
            self.bn1 = nn.BatchNorm2d(16)
            self.relu1 = qnn.QuantReLU(bit_width=2)
            self.conv2 = qnn.QuantConv2d(16, 16, 3, padding=1, weight_bit_width=2,
                                         **per_channel)
            self.bn2 = nn.BatchNorm2d(16)
            self.relu2 = qnn.QuantReLU(bit_width=2)
            self.pool = nn.MaxPool2d(2)
            self.fc = qnn.QuantLinear(16 * 4 * 4, 10, bias=True, weight_bit_width=8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.relu0(self.bn0(self.stem(self.inp(x))))
            y = self.relu1(self.bn1(self.conv1(x)))
            x = self.relu2(self.bn2(self.conv2(y)) + x)
            return self.fc(torch.flatten(self.pool(x), 1))

    torch.manual_seed(seed)
    net = Net().train()
    with torch.no_grad():  # BN statistics and Brevitas's activation ranges from data
        for i in range(2):
            net(_images(64, 100 + i))
    return net.eval()


@pytest.fixture(scope="module")
def brevitas_net() -> nn.Module:
    pytest.importorskip("brevitas")
    return _brevitas_net(0)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_brevitas_qcdq_imports_exactly(brevitas_net, tmp_path, dynamo):
    from brevitas.export import export_onnx_qcdq

    x = _images(64, 1)
    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx_qcdq(brevitas_net, args=x[:2], export_path=str(path), dynamo=dynamo)
    model = lowbit.from_onnx(path)
    layers = _quant_layers(model)
    # names from the exporting modules; bits and encodings from the Clip ranges / types
    assert {n: (str(m.weight_quant.prec), str(m.act_quant.precision()))
            for n, m in layers.items()} == {
        "stem": ("s8", "s4"), "conv1": ("s2", "u2"), "conv2": ("s2", "u2"), "fc": ("s8", "u2")}
    # the residual add reads the stem's quantized output through a standalone quantizer
    assert [str(m.prec) for m in model.modules() if isinstance(m, StandaloneQuant)] == ["u2"]
    with torch.no_grad():
        ours, theirs = model(x), brevitas_net(x)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    # the file's integers exactly (Brevitas's narrow 2-bit weights: -1, 0, 1)
    for name, spec in integer_layers(lowbit.convert(model)).items():
        theirs_int = getattr(brevitas_net, name).quant_weight().int().to(torch.int8)
        if theirs_int.dim() == 4:
            theirs_int = theirs_int.permute(0, 2, 3, 1)
        assert torch.equal(spec.weight, theirs_int), name
    assert set(integer_layers(lowbit.convert(model))["conv1"].weight.unique().tolist()) <= \
        {-1, 0, 1}
    if not dynamo:  # the same model either way: compiled once
        top1, cm = _compiled_top1(model, x)
        agree = float((top1 == theirs.argmax(1)).float().mean())
        assert agree >= 0.95, agree
        assert len(cm.plan.fallbacks) == 1  # the residual's standalone quantizer


def test_brevitas_file_means_what_lowbit_reads(brevitas_net, tmp_path):
    """ONNX's reference evaluator of the exported file against the imported model."""
    from brevitas.export import export_onnx_qcdq

    x = _images(16, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx_qcdq(brevitas_net, args=x[:2], export_path=str(tmp_path / "n.onnx"),
                         dynamo=False)
    proto = onnx.load(str(tmp_path / "n.onnx"))
    ref = _reference_evaluator(proto, x)
    with torch.no_grad():
        ours = lowbit.from_onnx(proto)(x).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-5)


# ------------------------------------------------------------------------------ ModelOpt style
def _qdq(nodes: list, inits: list, x: str, scale: float, name: str, dtype=TensorProto.INT8,
         zero: int = 0) -> str:
    """x -> QuantizeLinear -> DequantizeLinear (one scale, zero point of `dtype`)."""
    inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
              helper.make_tensor(f"{name}_z", dtype, [], [zero])]
    nodes += [helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                               name=f"{name}_Q"),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                               [f"{name}_dq"], name=f"{name}_DQ")]
    return f"{name}_dq"


def _int8_weight(nodes: list, inits: list, w: np.ndarray, name: str, float_weights: bool
                 ) -> tuple[str, np.ndarray]:
    """Per-output-channel int8 weights: an int8 constant -> DQ, or (ModelOpt's float export)
    the float weights -> Q -> DQ. Returns (DQ output, the integers)."""
    k = w.shape[0]
    scale = (np.abs(w).reshape(k, -1).max(1) / 127).astype(np.float32)
    view = scale.reshape(-1, *([1] * (w.ndim - 1)))
    ints = np.clip(np.rint(w / view), -127, 127).astype(np.int8)
    inits += [numpy_helper.from_array(scale, f"{name}_ws"),
              numpy_helper.from_array(np.zeros(k, np.int8), f"{name}_wz")]
    src = f"{name}_wq"
    if float_weights:
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"{name}_w"))
        nodes.append(helper.make_node("QuantizeLinear", [f"{name}_w", f"{name}_ws",
                                                         f"{name}_wz"], [src], axis=0))
    else:
        inits.append(numpy_helper.from_array(ints, src))
    nodes.append(helper.make_node("DequantizeLinear", [src, f"{name}_ws", f"{name}_wz"],
                                  [f"{name}_wdq"], axis=0))
    return f"{name}_wdq", ints


def _modelopt_style(seed: int) -> tuple[object, dict[str, np.ndarray]]:
    """int8 QDQ (TensorRT placement, signed int8 activations also after ReLU): conv, ReLU,
    Q/DQ on both sides of a max-pool (same scale), conv with float weights + QuantizeLinear,
    a residual add reading a quantized tensor, flatten, Gemm."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = _qdq(nodes, inits, "input", 0.03, "in")
    w1, ints1 = _int8_weight(nodes, inits, rng.normal(0, 0.3, (8, 1, 3, 3)), "conv1", False)
    inits.append(numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b1"))
    nodes += [helper.make_node("Conv", [x, w1, "b1"], ["c1"], name="conv1", pads=[1] * 4,
                               kernel_shape=[3, 3]),
              helper.make_node("Relu", ["c1"], ["r1"], name="relu1")]
    r1 = _qdq(nodes, inits, "r1", 0.02, "act1")
    nodes.append(helper.make_node("MaxPool", [r1], ["p1"], name="pool", kernel_shape=[2, 2],
                                  strides=[2, 2]))
    p1 = _qdq(nodes, inits, "p1", 0.02, "act2")
    w2, ints2 = _int8_weight(nodes, inits, rng.normal(0, 0.2, (8, 8, 3, 3)), "conv2", True)
    nodes += [helper.make_node("Conv", [p1, w2], ["c2"], name="conv2", pads=[1] * 4,
                               kernel_shape=[3, 3]),
              helper.make_node("Add", ["c2", p1], ["res"], name="add"),
              helper.make_node("Relu", ["res"], ["r2"], name="relu2")]
    r2 = _qdq(nodes, inits, "r2", 0.04, "act3")
    nodes.append(helper.make_node("Flatten", [r2], ["flat"], name="flatten", axis=1))
    w3, ints3 = _int8_weight(nodes, inits, rng.normal(0, 0.1, (10, 128)), "fc", False)
    inits.append(numpy_helper.from_array(np.zeros(10, np.float32), "b3"))
    nodes.append(helper.make_node("Gemm", ["flat", w3, "b3"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "modelopt_style",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(proto)
    return proto, {"conv1": ints1, "conv2": ints2, "fc": ints3}


def test_modelopt_style_int8_qdq(tmp_path):
    proto, ints = _modelopt_style(3)
    onnx.save(proto, str(tmp_path / "mo.onnx"))
    model = lowbit.from_onnx(tmp_path / "mo.onnx")
    layers = _quant_layers(model)
    assert {n: (str(m.weight_quant.prec), str(m.act_quant.precision()))
            for n, m in layers.items()} == {n: ("s8", "s8") for n in ints}
    # the pool's two Q/DQ of one scale are one quantizer; the residual reads a standalone one
    assert len([m for m in model.modules() if isinstance(m, StandaloneQuant)]) == 1
    x = _images(32, 4)
    with torch.no_grad():
        ours = model(x).numpy()
    ref = _reference_evaluator(proto, x)
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    assert (ours.argmax(1) == ref.argmax(1)).all()
    for name, spec in integer_layers(lowbit.convert(model)).items():
        expect = torch.from_numpy(ints[name])
        assert torch.equal(spec.weight, expect.permute(0, 2, 3, 1) if expect.dim() == 4
                           else expect), name
    top1, _ = _compiled_top1(model, x)
    assert float((top1 == torch.from_numpy(ref.argmax(1))).float().mean()) >= 0.95


def test_imported_model_fine_tunes_with_lsq():
    """The file's scales are LSQ steps: one QAT step moves them and the weights."""
    proto, _ = _modelopt_style(5)
    model = lowbit.from_onnx(proto).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.nn.functional.cross_entropy(model(_images(16, 6)), torch.arange(16) % 10).backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {"conv1.act_quant.step_size", "conv2.weight_quant.step_size", "fc.weight"} <= moved
    lowbit.convert(model.eval())  # still converts


# ------------------------------------------------------------------------------ round trip
@pytest.mark.parametrize("name,bits", [("digits_cnn", (2, 2)), ("digits_resnet", (1, 2)),
                                       ("digits_resnet", (8, 8))])
def test_round_trip_keeps_integers_and_predictions(tmp_path, name, bits):
    torch.manual_seed(5)
    q = lowbit.quantize(lowbit.models.get(name, num_classes=10), weight_bits=bits[0],
                        act_bits=bits[1])
    lowbit.calibrate(q, [_images(32, s) for s in range(3)])
    q.eval()
    x = _images(64, 9)
    proto = lowbit.to_onnx(q, x[:2], tmp_path / "m.onnx")
    back = lowbit.from_onnx(tmp_path / "m.onnx")
    with torch.no_grad():
        assert torch.equal(back(x), q(x))
    ours, theirs = integer_layers(lowbit.convert(q)), integer_layers(lowbit.convert(back))
    assert sorted(identifier(n) for n in ours) == sorted(theirs)
    for n, a in ours.items():
        b = theirs[identifier(n)]
        assert (a.w, a.a) == (b.w, b.a), n
        assert torch.equal(a.weight, b.weight) and torch.equal(a.w_scale, b.w_scale), n
        assert b.a_scale == float(np.float32(a.a_scale)), n  # ONNX scales are float32
    if bits == (1, 2):  # binary weights come back binary (the model's metadata)
        assert {str(m.weight_quant.prec) for m in _quant_layers(back).values()} == {"b1"}
        ref = _reference_evaluator(proto, x)
        with torch.no_grad():
            np.testing.assert_allclose(ref, q(x).numpy(), atol=1e-5)
    if bits == (2, 2):
        top1, cm = _compiled_top1(back, x)
        assert not cm.plan.fallbacks
        with torch.no_grad():
            assert float((top1 == q(x).argmax(1)).float().mean()) >= 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["modelopt_style", "brevitas"])
def test_imported_model_gpu_executor_equals_reference(source, tmp_path):
    """On the GPU: every tensor of the imported model's plan (the residual's float step
    included) equals the reference executor's."""
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor

    if source == "brevitas":
        pytest.importorskip("brevitas")
        from brevitas.export import export_onnx_qcdq

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_onnx_qcdq(_brevitas_net(0), args=_images(2, 0), export_path=str(
                tmp_path / "b.onnx"), dynamo=False)
        model = lowbit.from_onnx(tmp_path / "b.onnx")
    else:
        model = lowbit.from_onnx(_modelopt_style(3)[0])
    x = _images(8, 11).cuda()
    cm = lowbit.compile(model, x)
    assert cm.executor == "gpu"
    y, got = GpuExecutor(cm.plan, "cuda")(x, record=True)
    y_ref, want = ReferenceExecutor(cm.plan, "cuda")(x, record=True)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert torch.equal(got[name], ref), name
    assert torch.equal(y, y_ref)


# ------------------------------------------------------------------------------ rounding
def test_activation_ties_round_half_up():
    """The documented rule: lowbit's activations round half up where ONNX rounds half to even
    (x / scale = k + 0.5); everywhere else the two agree."""
    nodes, inits = [], []
    out = _qdq(nodes, inits, "input", 0.5, "a", TensorProto.UINT8)
    nodes.append(helper.make_node("Relu", [out], ["y"]))
    graph = helper.make_graph(
        nodes, "ties", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model = lowbit.from_onnx(proto)
    x = torch.tensor([[0.25, 0.75, 1.25, 0.6]])  # x / scale: 0.5, 1.5, 2.5, 1.2
    ref = _reference_evaluator(proto, x)
    with torch.no_grad():
        ours = model(x).numpy()
    assert ref.tolist() == [[0.0, 1.0, 1.0, 0.5]]  # half to even
    assert ours.tolist() == [[0.5, 1.0, 1.5, 0.5]]  # half up


# ------------------------------------------------------------------------------ refusals
def _one_qdq_model(**change: object) -> object:
    """input -> Q/DQ -> Conv(int8 weights) with the given node or tensor replaced."""
    nodes, inits = [], []
    x = _qdq(nodes, inits, "input", 0.1, "a", change.get("act_type", TensorProto.INT8),
             change.get("zero", 0))
    if "act_clip" in change:
        lo, hi = change["act_clip"]
        inits += [helper.make_tensor("lo", TensorProto.INT8, [], [lo]),
                  helper.make_tensor("hi", TensorProto.INT8, [], [hi])]
        nodes.insert(1, helper.make_node("Clip", ["a_q", "lo", "hi"], ["a_c"], name="a_Clip"))
        nodes[2].input[0] = "a_c"
    if "act_scale" in change:
        inits[0] = numpy_helper.from_array(np.array(change["act_scale"], np.float32), "a_s")
    w, _ = _int8_weight(nodes, inits, np.ones((4, 1, 3, 3)), "conv", False)
    nodes.append(helper.make_node("Conv", [x, w], ["c"], name="conv", kernel_shape=[3, 3]))
    nodes.append(helper.make_node(change.get("last_op", "Relu"), ["c"], ["y"], name="last"))
    graph = helper.make_graph(
        nodes, "one", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("change,match", [
    ({"zero": 3}, r"node 'a_Q' \(QuantizeLinear\): zero point \[3\] is not 0"),
    ({"act_scale": [0.1, 0.2]}, r"node 'a_DQ' \(DequantizeLinear\): per-channel activation"),
    ({"act_clip": (-1, 1)}, r"node 'a_Q' \(QuantizeLinear\): activation range \[-1, 1\]"),
    ({"act_type": TensorProto.INT16}, r"activation range \[-32768, 32767\]"),
    ({"last_op": "Sigmoid"}, r"node 'last' \(Sigmoid\): op Sigmoid is not supported"),
])
def test_refusals_name_the_node(change, match):
    proto = _one_qdq_model(**change)
    if "act_scale" in change:  # a per-channel scale needs its own axis attribute to be valid
        proto.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
        proto.graph.node[1].attribute.append(helper.make_attribute("axis", 1))
    with pytest.raises(ValueError, match=match):
        lowbit.from_onnx(proto)


def test_bad_arguments(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        lowbit.from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(TypeError, match="path must be"):
        lowbit.from_onnx(3)
    (tmp_path / "junk.onnx").write_bytes(b"\x01\x02junk")
    with pytest.raises(ValueError, match=r"junk\.onnx"):
        lowbit.from_onnx(tmp_path / "junk.onnx")
    q = lowbit.quantize(lowbit.models.get("digits_cnn", num_classes=10), weight_bits=2,
                        act_bits=1)
    lowbit.calibrate(q, [_images(16, 0)])
    with pytest.raises(ValueError, match="binary activations"):
        lowbit.to_onnx(q.eval(), _images(2, 0), tmp_path / "b.onnx")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        lowbit.to_onnx(q, _images(2, 0), tmp_path / "no" / "m.onnx")
    with pytest.raises(ValueError, match="no lowbit fake-quant layers"):
        lowbit.to_onnx(nn.Sequential(nn.Conv2d(1, 2, 3)), _images(2, 0), tmp_path / "f.onnx")
    with pytest.raises(TypeError, match="example_input"):
        lowbit.to_onnx(q, np.zeros((2, 1, 8, 8)), tmp_path / "f.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match="pip install onnx"):
        lowbit.from_onnx(tmp_path / "m.onnx")


def test_precision_rules():
    from lowbit.quant.qdq_modules import act_precision, weight_bits

    assert act_precision(0, 3, "x") == Precision(2, "unsigned")
    assert act_precision(0, 1, "x") == Precision(1, "unsigned")
    assert act_precision(-8, 7, "x") == Precision(4, "signed")
    assert act_precision(-128, 127, "x") == Precision(8, "signed")
    assert [weight_bits(lo, hi, "w") for lo, hi in ((-1, 1), (-2, 1), (-7, 7), (-127, 127))] \
        == [2, 2, 4, 8]
    with pytest.raises(ValueError, match="more than 8"):
        weight_bits(0, 255, "w")


def test_ceil_mode_max_pool_round_trips_onto_the_integer_pool(tmp_path):
    """A MaxPool with ceil_mode (SqueezeNet's, GoogLeNet's) survives to_onnx / from_onnx and
    compiles to an integer max-pool whose window keeps ceil_mode (12 x 12 -> 6 x 6, not 5)."""
    from lowbit.graph import MaxPool

    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
                        nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    q = lowbit.quantize(net, weight_bits=8, act_bits=8)
    g = torch.Generator().manual_seed(4)
    lowbit.calibrate(q, [torch.rand(16, 1, 14, 14, generator=g) for _ in range(2)])
    q.eval()
    x = torch.rand(8, 1, 14, 14, generator=g)
    lowbit.to_onnx(q, x[:2], tmp_path / "ceil.onnx")
    back = lowbit.from_onnx(tmp_path / "ceil.onnx")
    with torch.no_grad():
        assert torch.equal(back(x), q(x))
    compiled = lowbit.compile(back, x, executor="reference", records=False)
    plan = compiled.plan
    assert not plan.fallbacks
    with torch.no_grad():
        y, want = compiled(x), q(x)
    assert float((y - want).abs().max()) <= 2e-2 * float(want.abs().max())
    windows = [s.window for s in plan.steps if isinstance(s, MaxPool)] + [
        s.pool for s in plan.layers if s.pool is not None]
    assert len(windows) == 1 and windows[0].ceil
