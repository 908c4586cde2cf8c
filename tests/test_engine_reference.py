"""Compiled plans through the exact reference executor against `lowbit.convert`'s integer model.

Bound (lowbit.graph.planner): each requantized realization is the exact rounding of the
converted model's value, except where that value lies within eps of a rounding boundary:
eps = |value| 2^-31 (fixed-point multipliers; the biases are exact to 2^-shift) plus, after a
residual add, the 24-bit wide realization's rounding, WIDE_HEADROOM max|v| / 2^24 (about
2^-23 of the residual's range), and its multiplier's, < 2^-30 relative. `convert` itself
rounds in float32 (2^-24 relative), the same order, so the two agree except at rare near-ties;
a flipped 1-2 bit activation can move the logits of a small random network by percents, and
the tests require relative L2 error < 1% on the chosen cases (measured: 0 on all of them).
"""

import warnings

import pytest
import torch

import lowbit
from engine_cases import PRECISIONS, SIZES, calibrated, rel_err
from lowbit.core import ConvWorkload, WidePrecision
from lowbit.graph import FloatFallback, Layer
from lowbit.graph.impl import is_bitserial
from lowbit.quant.packing import unpack
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import run_plan

TOLERANCE = 0.01


def _compiled(q, calib, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return compile_model(q, calib, **options)


def _run(cm, x, record=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return cm.run(x, record=record)


def _converted(q, *xs):
    ref = lowbit.convert(q)
    with torch.no_grad():
        outs = [ref(x) for x in xs]
    return outs[0] if len(xs) == 1 else outs


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", sorted(SIZES))
def test_zoo_plan_matches_convert(name, precision):
    q, calib = calibrated(name, precision, seed=1)
    cm = _compiled(q, calib)
    plan = cm.plan
    assert not plan.fallbacks, [f.reason for f in plan.fallbacks]  # compiles whole
    x = torch.randn(3, *calib.shape[1:], generator=torch.Generator().manual_seed(7))
    y = _run(cm, x)
    err = rel_err(y, _converted(q, x))
    assert err < TOLERANCE, f"{name} {precision}: relative L2 error {err:.2e}"
    layers = plan.layers
    assert len(layers) == len([n for n, _ in lowbit.quant.quant_layers(q)])
    low = [s for s in layers if s.workload.w.bits <= 4 and s.workload.a.bits <= 4]
    assert all(is_bitserial(s.impl) and s.workload.a_layout.value == "bitplane"
               for s in low), [(s.name, s.impl, s.impl_reason) for s in low]


def test_fake_quant_convert_and_plan_agree_on_resnet50_w8a8():
    """One integer semantics at w8a8 on a deep network (ResNet-50, 8-bit residual stream,
    random BatchNorms, 32 x 32): the fake-quant model and `convert`, both run in float64 (exact
    values between the integer layers), agree to float64 rounding (their weights are the same
    integers: the fake-quant forward of a float64 copy quantizes them as float32 does), and
    the plan's reference executor equals `convert` to its float32 output."""
    from lowbit.bench import build_quantized

    q, _ = build_quantized("resnet50", "w8a8", image_size=32, residual_bits=8, seed=0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    plan_y = _run(_compiled(q, x), x)
    converted = lowbit.convert(q).double()
    with torch.no_grad():
        want = converted(x.double())
        fake = q.double().eval()(x.double())
    top = float(want.abs().max())
    assert float((fake - want).abs().max()) <= 1e-12 * top
    assert float((plan_y.double() - want).abs().max()) <= 2**-20 * top


@pytest.mark.parametrize("precision,seed", [("w2a2", 1), ("w1a2", 2)])
def test_plan_equals_convert_on_resnet18_with_the_8_bit_stream(precision, seed):
    """The fast tier's ResNet-18 (32 x 32, 8-bit stream) of the test below: the plan equals
    `convert` (float64) to its float32 output, its block ends in the 64-bit epilogue. With
    `PlanOptions(requant32=True)` these cases parted from convert (0.11 of 8.1 at w2a2, 0.80 of
    1.4 at w1a2, 2 threads)."""
    from lowbit.bench import build_quantized

    q, _ = build_quantized("resnet18", precision, image_size=32, residual_bits=8, seed=seed)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = lowbit.convert(q).double()(x.double())
    exact = _compiled(q, x)
    ends = [s.workload.epilogue for s in exact.plan.layers if s.workload.epilogue.requant32]
    assert any(e.residual is not None for e in ends) and all(e.sum64 for e in ends)
    if precision == "w1a2":  # some on the 32-bit chain (Epilogue.guarded: the downsamples)
        assert any(e.guarded for e in ends)
    assert float((_run(exact, x).double() - want).abs().max()) <= 2**-20 * float(
        want.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["w4a4", "w1a2"])
def test_plan_equals_convert_on_resnet50_with_the_8_bit_stream(precision):
    """The plan realizes the model's own arithmetic: ResNet-50 (random weights and
    BatchNorms, 8-bit residual stream, 32 x 32) at w4a4 and w1a2, its reference executor equals
    `convert` (float64) to its float32 output. Its block ends run in the kernels' 64-bit
    epilogue (`Epilogue.sum64`, 31-bit multipliers); `PlanOptions(requant32=True)`, the 32-bit
    sums of 12-16-bit multipliers, parted from convert here (64 of 237 at w4a4, 2.3 of 6.1
    at w1a2 with 2 threads: whether a value lands near a tie depends on the calibration's
    float sums, so its difference is not asserted)."""
    from lowbit.bench import build_quantized
    from lowbit.graph import PlanOptions

    q, _ = build_quantized("resnet50", precision, image_size=32, residual_bits=8, seed=0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = lowbit.convert(q).double()(x.double())
    top = float(want.abs().max())
    exact = _compiled(q, x)
    ends = [s.workload.epilogue for s in exact.plan.layers if s.workload.epilogue.requant32]
    assert any(e.residual is not None for e in ends) and all(e.sum64 for e in ends)
    assert float((_run(exact, x).double() - want).abs().max()) <= 2**-20 * top
    if precision != "w1a2":
        return
    approx = _compiled(q, x, options=PlanOptions(requant32=True))
    assert not any(s.workload.epilogue.sum64 and s.workload.epilogue.residual is not None
                   for s in approx.plan.layers if s.workload.epilogue.requant32)
    with pytest.raises(TypeError, match="requant32 must be a bool"):
        PlanOptions(requant32=1)


@pytest.mark.parametrize("name", ["resnet18", "vgg16", "alexnet", "apnn_vgg_variant"])
def test_non_224_input_and_odd_batch(name):
    """96x128 images, batch 5: adaptive pools with uneven windows (VGG 3x4 -> 7x7), copying
    ones (AlexNet 2x3 -> 6x6), global pools of 12 elements, a 12x16 flatten permutation."""
    options = {"image_size": (96, 128)} if name == "apnn_vgg_variant" else {}
    q, calib = calibrated(name, "mixed", seed=2, size=(96, 128), width=0.125, **options)
    cm = _compiled(q, calib)
    x = torch.randn(5, 3, 96, 128, generator=torch.Generator().manual_seed(3))
    err = rel_err(_run(cm, x), _converted(q, x))
    assert err < TOLERANCE, f"{name}: relative L2 error {err:.2e}"


def test_other_shapes_are_planned_on_first_use():
    q, calib = calibrated("resnet18", "w2a2", seed=4, width=0.125)
    cm = _compiled(q, calib)
    shapes = ((1, 3, 32, 32), (3, 3, 40, 56))
    xs = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    checked = 0
    for x, expect in zip(xs, _converted(q, *xs), strict=True):
        assert rel_err(_run(cm, x), expect) < TOLERANCE
        assert cm.plan_for(tuple(x.shape)).input_spec.shape == tuple(x.shape)
        checked += 1
    assert checked == 2 and cm.plan.input_spec.shape == tuple(calib.shape)


def test_recorded_tensors_are_storage_of_the_plan():
    q, calib = calibrated("resnet18", "mixed", seed=5, width=0.125)
    cm = _compiled(q, calib)
    x = torch.randn(3, 3, 32, 32)
    y, rec = _run(cm, x, record=True)
    plan = cm.plan_for(tuple(x.shape))
    assert torch.equal(y, run_plan(plan, x))
    kinds = set()
    for name, spec in plan.tensors.items():
        if name == plan.input:
            continue
        t = rec[name]
        assert t.dtype == spec.storage_dtype and tuple(t.shape) == spec.storage_shape, name
        if not spec.is_float and not spec.is_wide:
            v = unpack(t, spec.precision, spec.layout, spec.shape[-1])
            assert int(v.min()) >= spec.precision.qmin and int(v.max()) <= spec.precision.qmax
        kinds.add(spec.kind)
    assert {"u2/bitplane", "s8/int8", "s24/int8", "f32"} <= kinds, kinds


def test_implementation_choice_does_not_change_results():
    """The plan's semantics are its integers: all-int8 layouts (a chooser that never picks
    bit-serial) give the same logits as bit planes, bit for bit."""
    q, calib = calibrated("resnet18", "w2a2", seed=6, width=0.125)
    cm = _compiled(q, calib)
    calls = []

    def int8_only(wl):
        calls.append(wl)
        return ("triton.conv2d_int8" if isinstance(wl, ConvWorkload) else "triton.gemm_int8",
                "test: int8 everywhere")

    cm8 = _compiled(q, calib, choose_impl=int8_only)
    assert all(s.impl in ("triton.conv2d_int8", "triton.gemm_int8")
               and s.workload.a_layout.value == "int8" for s in cm8.plan.layers)
    assert len(calls) == len(cm8.plan.layers)
    x = torch.randn(3, 3, 32, 32)
    assert torch.equal(_run(cm, x), _run(cm8, x))


@pytest.mark.parametrize("wide_bits", [8, 16])
def test_narrower_wide_realizations(wide_bits):
    """wide_bits 8 (the planner's u8 / s8 residuals, `graph/planner.py`) and 16 compile and
    run; they are approximations of the float residual stream (errors measured, not bounded
    here)."""
    q, calib = calibrated("digits_resnet", "w4a4", seed=7, calib_batch=16)
    cm = _compiled(q, calib, wide_bits=wide_bits)
    wide = [cm.plan.tensors[s.residual] for s in cm.plan.layers if s.residual]
    assert len(wide) == 2  # one per BasicBlock
    if wide_bits == 8:
        assert all(not isinstance(t.precision, WidePrecision) and t.precision.bits == 8
                   for t in wide)
    else:
        assert all(isinstance(t.precision, WidePrecision) and t.precision.bits == 16
                   for t in wide)
    x = torch.randn(5, 1, 8, 8)
    y = _run(cm, x)
    assert bool(torch.isfinite(y).all()) and rel_err(y, _converted(q, x)) < 1.0


def test_warning_once_and_input_checks():
    q, calib = calibrated("resnet18", "w2a2", seed=8, width=0.125)
    cm = _compiled(q, calib)
    x = torch.randn(1, 3, 32, 32)
    with pytest.warns(RuntimeWarning, match="reference"):
        cm(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cm(x)  # warned once
    bad = x.clone()
    bad[0, 1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="x has non-finite"):
        cm(bad)
    with pytest.raises(TypeError, match="x must have a floating-point dtype"):
        cm(x.to(torch.int32))
    with pytest.raises(ValueError, match="x must have 3 channels"):
        cm(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match=r"x must be a non-empty NCHW"):
        cm(torch.randn(3, 32, 32))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        cm([1.0])
    with pytest.raises(ValueError, match="x is on meta"):
        cm(torch.empty(1, 3, 32, 32, device="meta"))


def test_compile_checks_before_anything_runs():
    import lowbit.models as zoo

    model = zoo.get("resnet18", num_classes=10, width=0.125).eval()
    x = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="no lowbit quantized layers"):
        compile_model(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model, weight_bits=2, act_bits=2)
    with pytest.raises(ValueError, match="never calibrated"):
        compile_model(q, x)
    lowbit.calibrate(q, [x])
    with pytest.raises(ValueError, match="example_input has non-finite"):
        compile_model(q, torch.full_like(x, float("inf")))
    with pytest.raises(TypeError, match=r"example_input must be a torch\.Tensor"):
        compile_model(q, x.numpy())
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        compile_model("resnet18", x)
    with pytest.raises(ValueError, match="wide_bits"):
        compile_model(q, x, wide_bits=12)
    with pytest.raises(ValueError, match="executor"):
        compile_model(q, x, executor="tpu")


def test_converted_model_compiles_to_the_same_plan_results():
    q, calib = calibrated("resnet18", "w1a2", seed=9, width=0.125)
    from_fq = _compiled(q, calib)
    from_int = _compiled(lowbit.convert(q), calib)
    assert [s.name for s in from_fq.plan.steps] == [s.name for s in from_int.plan.steps]
    assert sum("bn" in s.fused for s in from_int.plan.layers) == 20
    x = torch.randn(3, 3, 32, 32)
    assert torch.equal(_run(from_fq, x), _run(from_int, x))


def test_qat_digits_model_keeps_its_predictions():
    """A QAT-trained digits CNN: the compiled plan (reference executor) predicts the same
    class as the fake-quant model on >= 99.5% of the test images."""
    import torch.nn.functional as F

    import lowbit.models as zoo
    from lowbit.quant.data import digits_loaders

    torch.manual_seed(0)
    train, test = digits_loaders(batch_size=128, seed=0)

    def fit(model, epochs, lr):
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        for _ in range(epochs):
            for xb, yb in train:
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
        model.eval()

    model = zoo.get("digits_cnn", num_classes=10, width=0.5)
    fit(model, 3, 1e-2)
    q = lowbit.quantize(model, weight_bits=4, act_bits=4)
    fit(q, 1, 2e-3)
    xs = torch.cat([xb for xb, _ in test])
    ys = torch.cat([yb for _, yb in test])
    with torch.no_grad():
        fq = q(xs).argmax(1)
    cm = _compiled(q, xs[:128])
    assert not cm.plan.fallbacks
    assert any(isinstance(s, Layer) and "relu" in s.fused for s in cm.plan.steps)
    got = _run(cm, xs).argmax(1)
    assert float((fq == ys).float().mean()) > 0.8  # it did learn
    agree = float((got == fq).float().mean())
    assert len(xs) == 450 and agree >= 0.995, agree
    assert not any(isinstance(s, FloatFallback) for s in cm.plan.steps)


def test_compiled_model_from_a_restored_plan():
    import json

    from lowbit.graph import Plan
    from lowbit.runtime.compiled import CompiledModel

    q, calib = calibrated("alexnet", "w2a2", seed=10, width=0.125)
    cm = _compiled(q, calib)
    restored = Plan.from_dict(json.loads(json.dumps(cm.plan.to_dict())), cm.plan.params,
                              cm.plan.modules)
    loaded = CompiledModel.from_plan(restored)
    x = torch.randn(*calib.shape)
    assert torch.equal(_run(loaded, x), _run(cm, x))
    with pytest.raises(ValueError, match="compile the model again"):
        _run(loaded, torch.randn(1, 3, 64, 64))
    with pytest.raises(TypeError, match="plan must be"):
        CompiledModel.from_plan(cm.plan.to_dict())
