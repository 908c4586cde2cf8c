"""A quantized residual stream modeled in the fake-quant model (`lowbit.quant.residual`,
`lowbit.quantize(..., residual_bits=...)`) and realized exactly by the plan: narrow residual
operands, block ends writing the stream and every consumer's reading of it (derived outputs by
table), 32-bit requantization, no wide tensor."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import lowbit
import lowbit.models as zoo
from any_cnn_cases import layer_inputs_exact
from engine_cases import layer_names, randomize_batchnorms
from lowbit.core import Precision
from lowbit.core.validate import block_end_sum_limit
from lowbit.graph import Layer, Lookup
from lowbit.kernels.base import acc_bound
from lowbit.quant.residual import ResidualQuantizer, residual_points, residual_quantizers
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import ReferenceExecutor


def _quantized(name: str, residual_bits=8, seed: int = 0, width: float = 0.125,
               recipe=(1, 2), **kw) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = zoo.get(name, num_classes=10, width=width).eval()
    randomize_batchnorms(model, seed)
    names = layer_names(model)
    eight = {"weight_bits": 8, "act_bits": 8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model, weight_bits=recipe[0], act_bits=recipe[1],
                            residual_bits=residual_bits,
                            layers={names[0]: eight, names[-1]: eight}, **kw)
    channels = 1 if name.startswith("digits") else 3
    x = torch.randn(5, channels, 32, 32, generator=torch.Generator().manual_seed(seed + 1))
    lowbit.calibrate(q, [x])
    return q.eval(), x


def _compile(q, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return compile_model(q, x, executor="reference", records=False, **kw)


@pytest.mark.parametrize("name,points,shortcuts", [("resnet18", 12, 4), ("resnet50", 20, 4)])
def test_residual_points_of_resnets(name, points, shortcuts):
    """Every block's output (the stream) and every shortcut that changes the scale (the
    downsampling branches; ResNet-18's first block reads the stem's max-pool)."""
    found, skipped = residual_points(zoo.get(name, num_classes=10, width=0.125))
    assert not skipped and len(found) == points
    assert sum(p.role == "shortcut" for p in found) == shortcuts
    assert all(p.module.endswith("downsample") or p.module == "maxpool"
               for p in found if p.role == "shortcut")


def test_fake_quant_model_quantizes_the_stream():
    """The block outputs of the fake-quant model are multiples of their quantizer's scale in
    its range (what QAT trains with)."""
    q, x = _quantized("resnet50")
    rq = residual_quantizers(q)
    seen = {}
    hooks = [q.get_submodule(name).register_forward_hook(
        lambda m, i, o, name=name: seen.__setitem__(name, o)) for name in rq]
    with torch.no_grad():
        q(x)
    for h in hooks:
        h.remove()
    assert set(seen) == set(rq) and len(rq) == 20
    for name, out in seen.items():
        p, s = rq[name].precision(), rq[name].scale()
        levels = out.double() / s
        assert torch.allclose(levels, levels.round(), atol=1e-3), name
        assert int(levels.round().min()) >= p.qmin and int(levels.round().max()) <= p.qmax


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "digits_resnet"])
def test_plan_realizes_the_narrow_stream_exactly(name):
    """No wide tensor: block ends read an 8-bit residual and requantize in 64 bits; each
    conv reads exactly what the fake-quant model's own input quantizer gives (derived
    outputs: the consumer's quantizer applied to the dequantized stream), and the compiled
    predictions are the fake-quant model's."""
    q, x = _quantized(name)
    cm = _compile(q, x)
    plan = cm.plan
    assert not any(t.is_wide for t in plan.tensors.values())
    ends = [s for s in plan.layers if s.residual]
    assert ends and all(plan.tensors[s.residual].precision.bits == 8 for s in ends)
    derived = [o for s in plan.layers for o in s.layer_outputs if o.derived]
    assert derived and all(o.mid in ("u8", "s8") for o in derived)
    for s in ends:  # the kernels' 64-bit block end: every output's sum fits, m an int32
        epi = s.workload.epilogue
        assert epi.requant32 and epi.sum64, s.name
        for o in s.layer_outputs:
            m, b, r, sh = (plan.params[k].abs().tolist() for k in (o.multiplier, o.bias,
                                                                   o.residual_multiplier,
                                                                   o.shift))
            assert all(acc_bound(s.workload) * mc + bc + 128 * rc + (1 << (sc - 1))
                       < block_end_sum_limit(epi, sc) and mc < 2**31
                       for mc, bc, rc, sc in zip(m, b, r, sh, strict=True)), s.name
    # every conv's integer input equals the fake-quant model's own quantizer output
    checked, y, yf = layer_inputs_exact(q, plan, x)
    assert checked >= len(plan.layers) - 1  # all but the fused stem's
    assert torch.equal(y.argmax(1), yf.argmax(1))
    assert float((y - yf).abs().max()) < 1e-3 * float(yf.abs().max())


def test_derived_outputs_are_the_consumers_quantizer_on_the_stream():
    q, x = _quantized("resnet18")
    plan = _compile(q, x).plan
    _, rec = ReferenceExecutor(plan)(x, record=True)
    checked = 0
    for s in plan.layers:
        outs = {o.tensor: o for o in s.layer_outputs}
        stored = [o for o in s.layer_outputs if not o.derived]
        for o in s.layer_outputs:
            if not o.derived or not stored:
                continue
            own = stored[0]
            if (plan.params[own.multiplier] != plan.params[o.multiplier]).any():
                continue
            table = plan.params[o.table]
            mid = Precision.parse(o.mid)
            have = lowbit.quant.unpack(rec[o.tensor], plan.tensors[o.tensor].precision,
                                       plan.tensors[o.tensor].layout,
                                       plan.tensors[o.tensor].shape[-1])
            stream = lowbit.quant.unpack(rec[own.tensor], mid, plan.tensors[own.tensor].layout,
                                         plan.tensors[own.tensor].shape[-1])
            assert torch.equal(have.to(torch.int64), table[stream.to(torch.int64) - mid.qmin])
            checked += 1
        assert len(outs) == len(s.layer_outputs)
    assert checked >= 3


@pytest.mark.parametrize("bits", [4, 16])
def test_other_stream_widths(bits):
    q, x = _quantized("resnet18", residual_bits=bits)
    plan = _compile(q, x).plan
    res = {plan.tensors[s.residual].precision.bits for s in plan.layers if s.residual}
    assert res == {bits}
    if bits == 16:  # a 16-bit stream is read through lookups, not derived epilogue outputs
        assert plan.steps_of(Lookup)
    with torch.no_grad():
        yf = q(x)
    y = ReferenceExecutor(plan)(x)
    assert torch.equal(y.argmax(1), yf.argmax(1))


def test_per_block_overrides():
    q, x = _quantized("resnet18", residual_layers={"layer1.*": None, "maxpool": None,
                                                     "layer4.*": 16})
    rq = residual_quantizers(q)
    assert not any(n.startswith("layer1") or n == "maxpool" for n in rq)
    assert {rq[n].bits for n in rq if n.startswith("layer4")} == {16}
    plan = _compile(q, x).plan
    wide = [s for s in plan.layers if s.residual and plan.tensors[s.residual].is_wide]
    assert wide  # layer1's block ends keep the engine's wide realization


def test_residual_arguments_are_checked():
    m = zoo.get("resnet18", num_classes=10, width=0.125)
    with pytest.raises(ValueError, match="residual_bits must be None or one of"):
        lowbit.quantize(m, residual_bits=7)
    with pytest.raises(ValueError, match=r"residual_layers\['head'\] matches no module"):
        lowbit.quantize(m, residual_bits=8, residual_layers={"head": 4})
    with pytest.raises(TypeError, match="residual_layers must be a dict"):
        lowbit.quantize(m, residual_bits=8, residual_layers=["layer1"])


def test_residual_quantizers_survive_save_and_load(tmp_path):
    q, x = _quantized("resnet18")
    for model in (q, lowbit.convert(q)):
        path = tmp_path / "m.safetensors"
        lowbit.save(model, path)
        loaded = lowbit.load(path, model=lambda: zoo.get("resnet18", num_classes=10,
                                                         width=0.125))
        assert {n: (r.bits, r.scale()) for n, r in residual_quantizers(loaded).items()} == \
            {n: (r.bits, r.scale()) for n, r in residual_quantizers(model).items()}
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x), model(x))
    assert isinstance(next(iter(residual_quantizers(q).values())), ResidualQuantizer)


def test_converted_model_compiles_to_the_same_plan_integers():
    q, x = _quantized("resnet50")
    a = ReferenceExecutor(_compile(q, x).plan)(x)
    b = ReferenceExecutor(_compile(lowbit.convert(q), x).plan)(x)
    assert torch.equal(a, b)
    assert sum(isinstance(s, Layer) for s in _compile(q, x).plan.steps) > 20


@pytest.mark.parametrize("name", ["resnet18", "digits_resnet"])
def test_gpu_executor_equals_the_reference(name):
    """The GPU executor's bindings on the CPU (reference conv kernels, the Triton layer
    epilogue under the interpreter): narrow residuals, derived outputs, lookups and float
    readers of the stream give the reference executor's tensors bit for bit."""
    from lowbit.runtime.gpu import GpuExecutor

    q, x = _quantized(name)
    plan = _compile(q, x[:2]).plan
    ex = GpuExecutor(plan, "cpu")
    y, got = ex(x[:2], record=True)
    y_ref, want = ReferenceExecutor(plan)(x[:2], record=True)
    assert set(got) == set(want)
    for t, ref in want.items():
        assert torch.equal(got[t], ref), t
    assert torch.equal(y, y_ref)
    assert any(o.derived for s in plan.layers for o in s.layer_outputs)


def test_block_ends_run_the_block_end_epilogue():
    """Every ResNet-50 block end at w1a2 with an 8-bit stream runs in its bit-serial kernel's
    block-end epilogue (64-bit sum: Epilogue.sum64, narrow residual, the stream stored and
    the next conv's bit planes derived), except where the stream is not read (the stage ends:
    derived only)."""
    q, x = _quantized("resnet50")
    plan = _compile(q, x[:2]).plan
    ends = [s for s in plan.layers if s.residual]
    assert len(ends) == 16
    keys = [s.workload.epilogue.key for s in ends]
    assert all(s.workload.epilogue.requant32 and s.workload.epilogue.sum64 for s in ends), keys
    assert sum(k.endswith("->(u8)+u2/bitplane") for k in keys) == 3  # stage ends
    assert keys[-1].endswith("->u8/int8")  # the last block: the stream for the pool
    assert sum(k.endswith("->u8/int8+u2/bitplane") for k in keys) == 12


def test_derived_thresholds_reproduce_monotone_tables():
    from lowbit.graph.kernel_epilogues import derived_thresholds

    mid, u2 = Precision.parse("u8"), Precision.parse("u2")
    g = torch.Generator().manual_seed(0)
    checked = 0
    for lo in (0, 17):
        table = torch.sort(torch.randint(0, 4, (256,), generator=g)).values
        thr = derived_thresholds(table, mid, lo, u2)
        q = torch.arange(lo, 256)
        assert torch.equal(u2.qmin + (q.view(-1, 1) >= thr.view(1, -1)).sum(1), table[lo:])
        checked += 1
    bumpy = torch.sort(torch.randint(0, 4, (256,), generator=g)).values.flip(0)
    assert derived_thresholds(bumpy, mid, 0, u2) is None  # not monotone: no thresholds
    assert derived_thresholds(torch.full((256,), 5), mid, 0, u2) is None  # out of range
    assert checked == 2


# batch 32 at 224: grids past one tile per SM, where the large-grid defaults run (64 x 128
# block-end and shortcut tiles, fused-plane 1x1 tiles, deeper int8 stages)
GPU_NETWORKS = [("resnet50", (1, 2), 3, 64), ("resnet50", (2, 2), 2, 96),
                ("resnet50", (8, 8), 2, 64), ("resnet18", (1, 2), 8, 224),
                ("resnet50", (1, 2), 32, 224), ("resnet50", (8, 8), 32, 224)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,recipe,batch,size", GPU_NETWORKS,
                         ids=[f"{n}-w{r[0]}a{r[1]}-b{b}-{s}" for n, r, b, s in GPU_NETWORKS])
def test_gpu_narrow_stream_networks_bit_exact(name, recipe, batch, size):
    """The GPU executor (block ends in the bit-serial / int8 kernels' block-end epilogue,
    chained launches, one CUDA graph) equals the reference executor at every tensor,
    replayed on a second batch."""
    from lowbit.runtime.gpu import GpuExecutor

    q, _ = _quantized(name, recipe=recipe, width=1.0)
    q = q.cuda()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(batch, 3, size, size, generator=g).cuda()
    plan = _compile(q, x).plan
    ends = [s for s in plan.layers if s.residual]
    assert ends and all(s.workload.epilogue.requant32 or s.outputs_in_kernel for s in ends)
    ex = GpuExecutor(plan, "cuda")
    ex(torch.randn(batch, 3, size, size, generator=g).cuda())  # capture on another batch
    y = ex(x)
    y_ref, want = ReferenceExecutor(plan, "cuda")(x, record=True)
    _, got = ex(x, record=True)
    for t, ref in want.items():
        assert torch.equal(got[t], ref), f"{t}: {(got[t] != ref).sum().item()} differ"
    assert torch.equal(y, y_ref)


GPU_EXACT = [("resnet50", (1, 2), 4, 64), ("resnet50", (4, 4), 3, 64),
             ("resnet50", (1, 2), 32, 224)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,recipe,batch,size", GPU_EXACT,
                         ids=[f"{n}-w{r[0]}a{r[1]}-b{b}-{s}" for n, r, b, s in GPU_EXACT])
def test_gpu_64_bit_block_ends_equal_the_reference_and_convert(name, recipe, batch, size):
    """The default plan's block ends in the kernels' 64-bit epilogue (Epilogue.sum64) on the
    GPU executor equal the reference executor at every tensor and `convert` (float64) at the
    output; the approximate option (PlanOptions(requant32=True): the 32-bit block ends) is
    still bit-exact against its own reference."""
    from lowbit.graph import PlanOptions
    from lowbit.runtime.gpu import GpuExecutor

    q, _ = _quantized(name, recipe=recipe, width=1.0)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(batch, 3, size, size, generator=g)
    with torch.no_grad():
        want = lowbit.convert(q).double()(x.double())
    q, x = q.cuda(), x.cuda()
    checked = 0
    for options in (PlanOptions(), PlanOptions(requant32=True)):
        plan = _compile(q, x, options=options).plan
        ends = [s.workload.epilogue for s in plan.layers if s.workload.epilogue.requant32]
        wide = sum(e.sum64 for e in ends)
        assert ends and (wide < len(ends) if options.requant32 else wide == len(ends))
        ex = GpuExecutor(plan, "cuda")
        y, got = ex(x, record=True)
        y_ref, ref = ReferenceExecutor(plan, "cuda")(x, record=True)
        for t, v in ref.items():
            assert torch.equal(got[t], v), f"{t}: {(got[t] != v).sum().item()} differ"
        assert torch.equal(y, y_ref)
        if not options.requant32:
            top = float(want.abs().max())
            assert float((y.double().cpu() - want).abs().max()) <= 2**-20 * top
        checked += 1
    assert checked == 2


@pytest.mark.slow
def test_block_ends_past_32_bit_multipliers_equal_convert():
    """A w8a8 ResNet-18 with default-initialised BatchNorms (zero biases: the plan keeps
    accumulator-unit biases) whose block ends need 64-bit residual multipliers: the
    reference executor takes the exact 64-bit sum (the 32-bit fast path refused them), and
    agrees with `convert` to its float32 rounding between layers (at 8 bits that rounding
    flips a level now and then, so not bit for bit)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(zoo.get("resnet18").eval(), weight_bits=8, act_bits=8,
                            residual_bits=8)
    lowbit.calibrate(q, [torch.randn(4, 3, 32, 32)])
    q.eval()
    x = torch.randn(2, 3, 32, 32)
    plan = compile_model(q, x, records=False).plan
    wide = [s.name for s in plan.layers for o in s.layer_outputs
            if o.residual_multiplier and s.bias is not None
            and int(plan.params[o.residual_multiplier].abs().max()) >= 2**31]
    assert len(wide) >= 4, wide
    with torch.no_grad():
        got, want = ReferenceExecutor(plan)(x), lowbit.convert(q)(x)
    assert float((got - want).abs().max()) < 0.1 * float(want.abs().max())
    assert torch.equal(got.argmax(1), want.argmax(1))


@pytest.mark.parametrize("precision", ["w8a8", "w2a2"])
def test_convert_in_float64_equals_the_plan(precision):
    """One integer semantics: the converted model run in float64 carries its exact values
    between the integer layers, and its logits are the plan's (reference executor) bit for
    bit at 8 and 2 bits (in float32 it rounds each layer's output to float32 first, which
    moves a value within float32's rounding of a level boundary to the other level)."""
    torch.manual_seed(0)
    w, a = int(precision[1]), int(precision[3])
    m = zoo.get("resnet18").eval()
    randomize_batchnorms(m, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(m, weight_bits=w, act_bits=a, residual_bits=8)
    lowbit.calibrate(q, [torch.randn(4, 3, 32, 32)])
    q.eval()
    x = torch.randn(2, 3, 32, 32)
    converted = lowbit.convert(q).double()
    with torch.no_grad():
        y64 = converted(x.double())
        planned = compile_model(q, x, records=False)(x)
        y32 = lowbit.convert(q)(x)
    assert y64.dtype == torch.float64 and y32.dtype == torch.float32
    assert torch.equal(y64.float(), planned)
