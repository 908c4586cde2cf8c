"""Plans: what fuses, what falls back and why, layouts and implementations, serialization."""

import dataclasses
import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from engine_cases import calibrated, randomize_batchnorms, rel_err
from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.graph import (
    AvgPool,
    Concat,
    Flatten,
    FloatFallback,
    Layer,
    MaxPool,
    Plan,
    Quantize,
    choose_impl,
    trace_model,
)
from lowbit.graph.impl import TORCH_FP16, is_bitserial
from lowbit.graph.summary import plan_table
from lowbit.kernels.cuda import FAMILIES
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import run_plan


def _compile(q, x, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return compile_model(q, x, **options)


def _quantized(model, x, wb=2, ab=2, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model.eval(), weight_bits=wb, act_bits=ab, **options)
    lowbit.calibrate(q, [x])
    return q


def _check_against_convert(q, plan, x, tol=1e-6):
    with torch.no_grad():
        expect = lowbit.convert(q)(x)
    got = run_plan(plan, x)
    err = rel_err(got, expect)
    assert err < tol, err
    return err


def test_resnet18_fusions_counted():
    q, calib = calibrated("resnet18", "w1a2", seed=0, size=(64, 64), width=0.125)
    plan = _compile(q, calib).plan
    layers = plan.layers
    assert len(layers) == 21
    count = {f: sum(f in s.fused for s in layers) for f in ("bn", "relu", "residual", "maxpool")}
    assert count == {"bn": 20, "relu": 17, "residual": 8, "maxpool": 1}
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds.count("Quantize") == 1 and kinds.count("MaxPool") == 0
    assert kinds.count("AvgPool") == 1 and kinds.count("Flatten") == 1
    assert kinds.count("FloatFallback") == 0 and kinds[-1] == "Output"
    stem = layers[0]
    assert stem.pool is not None and (stem.pool.kernel, stem.pool.stride) == (3, 2)
    # the stem writes what layer1.0 reads: conv1's input (bit planes) and the residual
    assert len(stem.layer_outputs) == 2
    kinds_out = sorted(plan.tensors[o.tensor].kind for o in stem.layer_outputs)
    assert kinds_out == ["s24/int8", "u2/bitplane"]
    # a block output read by the next conv1 and the next residual: two realizations; one read
    # by conv1 and the downsample conv (one activation range, one scale): one
    by_source = {s.source[0]: s for s in layers}
    assert len(by_source["layer1.0.conv2"].layer_outputs) == 2
    assert len(by_source["layer1.1.conv2"].layer_outputs) == 1
    assert by_source["layer2.0.conv1"].input == by_source["layer2.0.downsample.0"].input
    pool = plan.steps_of(AvgPool)[0]
    assert pool.mode == "adaptive" or pool.mode == "global"
    assert plan.tensors[pool.input].is_wide and plan.tensors[pool.output].kind == "u2/bitplane"
    # what the kernels run: bit-serial everywhere at <= 4 bits
    assert all(is_bitserial(s.impl) for s in layers)
    assert plan.weight_bytes() < sum(plan.params[s.weight].numel() for s in layers) * 2 / 8
    _check_against_convert(q, plan, torch.randn(3, 3, 64, 64), tol=0.01)


class _Dilated(nn.Module):
    """A dilated conv (no integer conv: a float fallback) between two integer layers."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.pw = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = F.relu(self.pw(self.dw(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_dilated_conv_is_a_named_float_fallback(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16, 16)
    q = _quantized(_Dilated(), x, 4, 4)
    # by default the fallback runs in fp16, within fp16's rounding of convert's model
    half = _compile(q, x).plan
    (fb,) = half.fallbacks
    assert isinstance(half.modules[fb.module], lowbit.graph.fallbacks.HalfPrecision)
    x2 = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert rel_err(run_plan(half, x2), lowbit.convert(q)(x2)) < 0.05
    # in float32 the plan equals convert's model
    monkeypatch.setattr(lowbit.graph.fallbacks, "FALLBACK_HALF", False)
    plan = _compile(q, x).plan
    (fb,) = plan.fallbacks
    assert fb.op.startswith("dw: Conv2d") and "dilation=(2, 2)" in fb.reason
    assert "dilation=(2, 2)" in plan_table(plan)
    assert len(plan.layers) == 3
    # the conv before it writes float for it; the pointwise conv reads its quantized output
    conv = plan.layers[0]
    assert [plan.tensors[o.tensor].is_float for o in conv.layer_outputs] == [True]
    assert any(isinstance(s, Quantize) and s.input == fb.output for s in plan.steps)
    _check_against_convert(q, plan, x2)


@pytest.mark.parametrize("name,size", [("vgg16", (64, 64)), ("alexnet", (64, 64)),
                                       ("apnn_vgg_variant", (32, 32))])
def test_flatten_permutes_the_first_linear(name, size):
    q, calib = calibrated(name, "w4a4", seed=3, size=size, width=0.125)
    plan = _compile(q, calib).plan
    fc = plan.layers[[s.op for s in plan.layers].index("linear")]
    assert "flatten-permute" in fc.fused
    spec = lowbit.convert(q).get_submodule(fc.source[0]).spec
    flat = plan.steps_of(Flatten)[0]
    _, h, w, c = plan.tensors[flat.input].shape
    assert h * w > 1
    expect = spec.weight.reshape(-1, c, h, w).permute(0, 2, 3, 1).reshape(spec.weight.shape[0], -1)
    assert torch.equal(plan.params[fc.weight], expect.to(torch.int8))
    _check_against_convert(q, plan, torch.randn(3, 3, *size), tol=0.01)


def test_negative_batchnorm_scales_negate_channels():
    model = lowbit.models.get("digits_resnet", num_classes=10).eval()
    randomize_batchnorms(model, 5, negative=0.5)
    x = torch.randn(16, 1, 8, 8)
    q = _quantized(model, x)
    plan = _compile(q, x).plan
    negated = [s for s in plan.layers if any(f.startswith("negated-channels") for f in s.fused)]
    assert len(negated) >= 4
    for s in negated:
        spec = lowbit.convert(q).get_submodule(s.source[0]).spec
        neg = spec.out_scale < 0
        assert bool(neg.any())
        w = plan.params[s.weight].to(torch.int64)
        assert torch.equal(w[neg], -spec.weight[neg].to(torch.int64))
        assert torch.equal(w[~neg], spec.weight[~neg].to(torch.int64))
    _check_against_convert(q, plan, torch.randn(5, 1, 8, 8))


def test_negated_weights_at_the_signed_minimum_widen_the_precision():
    model = lowbit.models.get("digits_cnn", num_classes=10).eval()
    randomize_batchnorms(model, 6, negative=0.5)
    x = torch.randn(16, 1, 8, 8)
    q = _quantized(model, x, 2, 2, method="mse")  # clips: weights reach -2
    plan = _compile(q, x).plan
    widened = [s for s in plan.layers if s.workload.w.bits == 3]
    assert widened, [(s.name, s.workload.w) for s in plan.layers]
    assert all(int(plan.params[s.weight].min()) >= -4 for s in widened)
    _check_against_convert(q, plan, torch.randn(5, 1, 8, 8))


def test_zero_batchnorm_scale_falls_back():
    model = lowbit.models.get("digits_cnn", num_classes=10).eval()
    with torch.no_grad():
        model[1].weight[3] = 0.0
    x = torch.randn(16, 1, 8, 8)
    q = _quantized(model, x)
    plan = _compile(q, x).plan
    (fb,) = plan.fallbacks
    assert "scale is 0" in fb.reason and fb.op.startswith("0, 1: QuantConv2d")
    _check_against_convert(q, plan, torch.randn(5, 1, 8, 8))


class _Mixed(nn.Module):
    """Concat, functional ops, unknown functions, a broadcasting add, pools, view."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.b1 = nn.Conv2d(8, 8, 3, padding=1)
        self.b2 = nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(16, 16, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.d = nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.a(x)))
        y = torch.cat([self.b1(x), F.relu(self.b2(x))], 1)
        y = torch.sigmoid(y) * 3
        y = self.c(y)
        y = torch.add(y, y.mean())
        y = F.max_pool2d(F.relu(y), 2)
        y = F.relu(self.pool(self.d(y)))
        y = F.adaptive_avg_pool2d(y, (2, 2))
        return self.fc(F.dropout(y.view(y.size(0), -1), 0.5, self.training))


def test_unsupported_functions_fall_back_and_the_rest_fuses(monkeypatch):
    # the float fallbacks in float32 (fp16 by default): the plan equals convert's model
    monkeypatch.setattr(lowbit.graph.fallbacks, "FALLBACK_HALF", False)
    torch.manual_seed(0)
    model = _Mixed()
    randomize_batchnorms(model, 1)
    x = torch.randn(4, 3, 16, 16)
    q = _quantized(model, x, 2, 3)
    plan = _compile(q, x).plan
    ops = sorted(f.op.split(":")[0] for f in plan.fallbacks)
    assert ops == ["add", "function mul", "function sigmoid", "method mean"], ops
    reasons = {f.op: f.reason for f in plan.fallbacks}
    assert "no conv/linear output" in reasons["add"]
    assert len(plan.steps_of(Concat)) == 1 and len(plan.steps_of(Flatten)) == 1
    pools = plan.steps_of(AvgPool)
    assert {p.mode for p in pools} == {"window", "adaptive"}
    assert any(p.relu for p in pools)  # relu(avgpool(conv)) clamps in the pool's output
    assert "maxpool" in plan.layers[[s.source[0] for s in plan.layers].index("c")].fused or \
        plan.steps_of(MaxPool)
    _check_against_convert(q, plan, torch.randn(3, 3, 16, 16))


class _SignedInput(nn.Module):
    """A conv reading a signed (pre-ReLU) value at 1 bit: binary activations."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.b(self.a(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(y), 1), 1))


def test_binary_consumer_reads_a_quantized_float_output():
    x = torch.randn(6, 3, 8, 8)
    q = _quantized(_SignedInput(), x, 1, 1)
    plan = _compile(q, x).plan
    b = plan.layers[1]
    assert plan.tensors[b.input].precision.name == "b1"
    (quant,) = [s for s in plan.steps if isinstance(s, Quantize) and s.output == b.input]
    assert plan.tensors[quant.input].is_float
    _check_against_convert(q, plan, torch.randn(3, 3, 8, 8))


def test_plan_manifest_round_trips_through_json():
    q, calib = calibrated("resnet18", "mixed", seed=2, width=0.125)
    plan = _compile(q, calib).plan
    text = json.dumps(plan.to_dict())
    again = Plan.from_dict(json.loads(text), plan.params, plan.modules)
    assert [s.to_dict() for s in again.steps] == [s.to_dict() for s in plan.steps]
    assert again.tensors == plan.tensors
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(run_plan(again, x), run_plan(plan, x))
    params = dict(plan.params)
    params.pop(plan.layers[3].weight)
    with pytest.raises(ValueError, match="params"):
        Plan.from_dict(json.loads(text), params, plan.modules)
    bad = json.loads(text)
    bad["steps"] = bad["steps"][1:]
    with pytest.raises(ValueError, match="before it is written"):
        Plan.from_dict(bad, plan.params, plan.modules)


def test_summary_shows_steps_implementations_and_totals():
    q, calib = calibrated("resnet18", "mixed", seed=2, width=0.125)
    text = _compile(q, calib).summary()
    for needle in ("layer.conv1", "cuda.bitserial", "bn, relu, maxpool", "residual",
                   "s8/int8 -> ", "u2/bitplane", "weights:", "peak activations:",
                   "float fallbacks: 0"):
        assert needle in text, needle


def test_choose_impl_policy_and_reasons():
    bit = ConvWorkload(N=2, H=8, W=8, C=64, K=64, R=3, S=3, pad=1, w="b1", a="u2")
    impl, why = choose_impl(bit)
    assert impl in {f.name for f in FAMILIES} and "bit-serial" in why
    int8 = ConvWorkload(N=2, H=8, W=8, C=64, K=64, R=3, S=3, pad=1, w="s8", a="s8")
    impl, why = choose_impl(int8)
    assert impl in ("cuda.int8_wgmma", "triton.conv2d_int8_tma", "triton.conv2d_int8")
    assert "int8 tensor cores" in why
    stem = ConvWorkload(N=2, H=32, W=32, C=3, K=64, R=7, S=7, stride=2, pad=3, w="s8",
                        a="s8")
    impl, why = choose_impl(stem)
    assert impl != "cuda.int8_wgmma" and "C=3" in why  # wgmma needs C % 4 == 0
    huge = GemmWorkload(M=4, N=8, K=2**20, w="s8", a="s8")
    impl, why = choose_impl(huge)
    assert impl == TORCH_FP16 and "accumulator" in why


def test_small_spatial_convs_default_to_the_weight_streaming_gemv():
    """<= 64 output pixels with a spatial filter: the GEMV first; 1x1s and larger maps keep
    the conv templates' order."""
    b1_3x3 = ConvWorkload(N=1, H=7, W=7, C=64, K=64, R=3, S=3, pad=1, w="s8", a="s8")
    s2_3x3 = ConvWorkload(N=1, H=16, W=14, C=32, K=48, R=3, S=3, stride=2, pad=1, w="s8",
                          a="s8")  # 8 x 7 = 56 output pixels
    assert [choose_impl(wl)[0] for wl in (b1_3x3, s2_3x3)] == ["triton.gemv_int8"] * 2
    b1_1x1 = b1_3x3.replace(R=1, S=1, pad=0)
    b2_3x3 = b1_3x3.replace(N=2)  # 98 output pixels
    assert "triton.gemv_int8" not in {choose_impl(wl)[0] for wl in (b1_1x1, b2_3x3)}


def test_accumulator_unit_biases_use_the_kernel_epilogue():
    """exact_bias=False: the planner's biases in accumulator units (`graph/planner.py`);
    single-output layers get the kernel's fused requantizing epilogue, and the executor's two
    epilogue paths (netops, and the shifted-bias sum) agree bit for bit."""
    q, calib = calibrated("vgg16", "w2a2", seed=4, width=0.125)
    dataflow = trace_model(q.eval(), calib)
    from lowbit.graph import build_plan

    plan = build_plan(dataflow, tuple(calib.shape), exact_bias=False)
    fused = [s for s in plan.layers if s.workload.epilogue.requantizes]
    assert len(fused) >= 10 and all(s.bias is not None for s in fused)
    no_bias = Plan(plan.input, plan.tensors,
                   tuple(dataclasses.replace(s, bias=None) if isinstance(s, Layer) else s
                         for s in plan.steps), plan.params, plan.modules)
    x = torch.randn(3, 3, 32, 32)
    a, rec_a = run_plan(plan, x, record=True)
    b, rec_b = run_plan(no_bias, x, record=True)
    assert torch.equal(a, b)
    assert rec_a.keys() == rec_b.keys() and all(torch.equal(rec_a[k], rec_b[k]) for k in rec_a)
    exact = build_plan(dataflow, tuple(calib.shape))
    # exact biases: a kernel epilogue adds the layer's bias in accumulator units where it is
    # exact, else the output's own bias at its shift (tests/test_shifted_bias.py)
    assert all(s.workload.epilogue.shifted_bias == (s.bias is None)
               for s in exact.layers if s.workload.epilogue.requantizes)


def test_input_too_small_for_the_model():
    q, calib = calibrated("vgg16", "w2a2", seed=5, width=0.125)
    cm = _compile(q, calib)
    with pytest.raises(ValueError, match="too small"):
        cm.plan_for((1, 3, 16, 16))


def test_untraceable_model_is_a_clear_error():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            y = self.conv(x)
            return y if float(y.sum()) > 0 else -y

    x = torch.randn(2, 3, 8, 8)
    q = _quantized(Branchy(), x)
    with pytest.raises(ValueError, match="cannot be traced"):
        _compile(q, x)


def test_float_fallback_steps_report_their_module():
    x = torch.randn(4, 3, 16, 16)
    q = _quantized(_Dilated(), x, 4, 4)
    plan = _compile(q, x).plan
    for step in plan.steps:
        if isinstance(step, FloatFallback):
            assert isinstance(plan.modules[step.module], nn.Module) and step.reason
        if isinstance(step, Layer):
            assert step.impl and step.impl_reason and step.workload is not None


class _TwoFlattens(nn.Module):
    """Two maps of different sizes flattened, concatenated, then a linear layer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 12, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4 + 12 * 2 * 2, 6)

    def forward(self, x):
        a = F.relu(self.a(x))
        b = F.relu(self.b(a))
        return self.fc(torch.cat([torch.flatten(a, 1), b.flatten(1)], dim=1))


def test_concatenated_flattens_permute_each_segment():
    x = torch.randn(8, 3, 4, 4)
    q = _quantized(_TwoFlattens(), x, 2, 2)
    plan = _compile(q, x).plan
    fc = plan.layers[-1]
    assert "flatten-permute" in fc.fused and len(plan.steps_of(Concat)) == 1
    assert not is_bitserial(fc.impl) and "not a multiple of 32" in fc.impl_reason
    _check_against_convert(q, plan, torch.randn(3, 3, 4, 4))


def test_separate_passes_read_the_narrowest_accumulator():
    """Layers finished by a separate epilogue pass store int16 accumulators where a bit-serial
    kernel writes them and |acc| < 2^15, int32 where the layer pools or is int8 / fp16; the
    two bit widths of one network (w1a2 body, w8a8 stem and classifier) take both, and the
    engine's integers do not depend on it (the reference executor ignores the storage)."""
    from lowbit.graph import build_plan
    from lowbit.graph.kernel_epilogues import accumulator_workload
    from lowbit.kernels.base import acc_bound

    q, calib = calibrated("resnet18", "w1a2", seed=4, width=0.125)
    plan = build_plan(trace_model(q.eval(), calib), tuple(calib.shape))
    passes = [s for s in plan.layers if not s.workload.epilogue.requantizes
              and s.workload.epilogue.out != "fp16"]
    narrow = [s for s in passes if s.workload.epilogue.out == "int16"]
    wide = [s for s in passes if s.workload.epilogue.out == "int32"]
    assert len(narrow) >= 6 and len(wide) >= 1 and len(narrow) + len(wide) == len(passes)
    for s in narrow:
        assert is_bitserial(s.impl) and s.pool is None and acc_bound(s.workload) < 2**15
    for s in wide:
        assert not is_bitserial(s.impl) or s.pool is not None or acc_bound(s.workload) >= 2**15
    # a bit-serial layer whose accumulator could leave int16 keeps int32
    step = narrow[0]
    big = dataclasses.replace(step, workload=step.workload.replace(w="s4", a="u4", C=512))
    assert acc_bound(big.workload) >= 2**15
    assert accumulator_workload(big).epilogue.out == "int32"
    assert accumulator_workload(step).epilogue.out == "int16"


def test_templates_without_an_int16_store_refuse_it():
    """Every registered template that runs a layer with an int32 accumulator output either
    writes Epilogue(out="int16") (the bit-serial families, where |acc| < 2^15) or names int16
    in its unsupported reason: none writes int32 into an int16 buffer."""
    from lowbit.core import Epilogue
    from lowbit.kernels import load_backends
    from lowbit.kernels.base import acc_bound, templates

    load_backends()
    checked = refused = 0
    for a, lay in (("s8", "int8"), ("u2", "bitplane")):
        for plain in (ConvWorkload(w="s8" if a == "s8" else "b1", a=a, a_layout=lay, w_layout=lay,
                                   N=2, H=6, W=6, C=64, K=40, R=3, S=3, stride=1, pad=1),
                      GemmWorkload(M=8, N=40, K=64, w="s8" if a == "s8" else "b1", a=a,
                                   a_layout=lay, w_layout=lay)):
            narrow = plain.replace(epilogue=Epilogue(out="int16"))
            for t in templates():
                if not type(t).__module__.startswith("lowbit.kernels"):
                    continue  # test doubles other test modules registered (tests/test_tune_*)
                if t.unsupported_reason(plain) is not None:
                    continue
                reason = t.unsupported_reason(narrow)
                if is_bitserial(t.name) and acc_bound(plain) < 2**15:
                    assert reason is None, (t.name, reason)
                else:
                    assert reason and "int16" in reason, (t.name, reason)
                    refused += 1
                checked += 1
    assert checked >= 8 and refused >= 4


def test_int8_layers_with_a_separate_pass_move_to_the_template_that_writes_it():
    """At w8a8 the block ends (two outputs, a residual) leave `cuda.int8_wgmma` for the
    Triton implicit GEMM whose kernel writes the layer epilogue
    (`graph.kernel_epilogues.layer_outputs_impl`); single-output layers keep their kernel's
    own epilogue and template, the batch-8 classifier its weight-streaming GEMV; the logits
    do not change. At batch 2 the 4x4 stage's 3x3s (32 output pixels) run the GEMV, block
    end included (weight-streaming layers keep the separate pass)."""
    from lowbit.graph.kernel_epilogues import LAYER_OUTPUTS_IMPLS

    q, calib = calibrated("digits_resnet", "w8a8", seed=3, calib_batch=8)
    small = [s for s in _compile(q, calib[:2]).plan.layers
             if s.op == "conv2d" and s.workload.gemm_shape[0] <= 64 and s.workload.R > 1]
    assert small and any(s.residual for s in small)
    assert all(s.impl == "triton.gemv_int8" for s in small)
    cm = _compile(q, calib[:8])
    plan = cm.plan
    moved = [s for s in plan.layers if "layer epilogue written by" in s.impl_reason]
    own = [s for s in plan.layers if s.workload.epilogue.requantizes]
    assert moved and own
    assert all(s.impl == LAYER_OUTPUTS_IMPLS[s.op] and not s.workload.epilogue.requantizes
               and len(s.layer_outputs) <= 2 for s in moved)
    assert any(s.residual for s in moved)
    fc = [s for s in plan.layers if s.op == "linear"]
    assert fc and all(s.impl == "triton.gemv_int8" for s in fc)
    assert not any("layer epilogue written by" in s.impl_reason for s in own)
    wgmma = _compile(q, calib[:8], choose_impl=lambda wl: ("cuda.int8_wgmma", "test"))
    assert 0 < sum(s.impl == "cuda.int8_wgmma" for s in wgmma.plan.layers) < len(plan.layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(cm(calib[:3]), wgmma(calib[:3]))
