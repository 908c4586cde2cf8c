"""Derived outputs of the fused first layer (`Requantized(..., mid=, table=)`: the formula's
value in mid looked up in a table, as a residual quantizer's readers get the stream) in every
stem kernel ("bands", "gemm", "ring"), bit for bit against the reference chain (the table
applied to each conv output, then the max-pool of the table values).

With the pool the kernels pool the int32 accumulators first, which equals pooling the table
values where the table rises over the formula's values (the composition is non-decreasing in
the accumulator); a falling table is refused with the pool and runs without one.
Outputs of 1-2 bits go by thresholds on the accumulator (the formula's thresholds in mid at
the table's steps), wider ones (or `thresholds=False`) by the formula and a table lookup.

CPU (TRITON_INTERPRET=1): the host thresholds against the exact composition; each kernel on
small odd images (float32 and uint8); a falling table without pool (VGG's 3x3/1, AlexNet's
11x11/4) and its refusal with the pool; the plan of a narrow-stream ResNet-18 fusing its first
layer (derived readings of the u8 stream) and the GPU executor on it. GPU (`gpu` mark): each
kernel at 224x224, batch 8.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import lowbit
import lowbit.models as zoo
from lowbit.core import Layout, Precision
from lowbit.graph.ir import Quantize
from lowbit.graph.launches import PlanOptions, stem_refusal, with_launches
from lowbit.kernels.triton import netops as N
from lowbit.kernels.triton import stem as S
from lowbit.kernels.triton.stem_gemm import (
    SLOT_CONSTEXPRS,
    THRESHOLD_STRIDE,
    derived_threshold_table,
    table_steps,
)
from lowbit.reference import (
    RequantizedOutput,
    epilogue_outputs,
    quantize_float,
    quantize_uint8_image,
    uint8_input_table,
)
from stem_cases import MEAN, RESNET, STD, check_outputs, derived_specs, make_case, reference
from triton_cases import DEVICE

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


# ------------------------------------------------------------------------- CPU: host side
def _staircase(mid: Precision, out: Precision, cuts: list[int]) -> torch.Tensor:
    """A non-decreasing table over mid's values: out.qmin + #{cut : value >= cut}."""
    v = torch.arange(mid.qmin, mid.qmax + 1)
    return out.qmin + (v[:, None] >= torch.tensor(cuts)[None, :]).sum(1)


@pytest.mark.parametrize("mid,out,relu,cuts", [
    ("u8", "u2", True, [0, 3, 200]),         # the first step at the formula's lowest value
    ("u8", "u2", True, [5, 5, 40]),          # two levels at one value: the middle one skipped
    ("s8", "s2", False, [-20, 0, 127]),      # signed both, the last step at mid.qmax
    ("s8", "u2", True, [-4, 2, 9]),          # ReLU on a signed mid: a step below its reach
    ("u8", "u1", False, [300]),              # no value reaches the level: always qmin
    ("u8", "u2", False, [7, 300, 300]),      # two levels never reached
], ids=["step_at_low", "skipped_level", "signed", "relu_signed_mid", "never", "unreached"])
def test_derived_thresholds_equal_the_composition(mid, out, relu, cuts):
    """qmin + #{i : y >= T[c, i]} == table[formula(y) - mid.qmin] for int32 y over the whole
    range and on the formula's own thresholds (+-1), channels with multiplier 0 included."""
    g = torch.Generator().manual_seed(len(cuts) * 7 + len(mid))
    mid_p, out_p = Precision.parse(mid), Precision.parse(out)
    k = 12
    m = torch.randint(1, 2**31, (k,), generator=g)
    m[0] = 0  # a constant output
    s = torch.randint(24, 40, (k,), generator=g)
    b = torch.randint(-(2**38), 2**38, (k,), generator=g)
    table = _staircase(mid_p, out_p, [min(c, mid_p.qmax + 1) for c in cuts])
    spec = N.Requantized(out_p, m, s, b, relu=relu, mid=mid_p, table=table)
    thr = derived_threshold_table(spec, k)
    assert thr.shape == (k, THRESHOLD_STRIDE) and thr.dtype == torch.int32
    y = torch.randint(-(2**31) + 1, 2**31 - 1, (3000, k), generator=g)
    near = torch.cat([thr[:, :3].T.to(torch.int64) + d for d in (-1, 0, 1)])
    y = torch.cat([y, near.clamp(-(2**31) + 1, 2**31 - 2)])
    levels = out_p.qmax - out_p.qmin
    got = out_p.qmin + (y[:, :, None] >= thr[None, :, :levels]).sum(-1)
    ref = RequantizedOutput(out_p, m, s, relu=relu, mid=mid_p, table=table, bias=b)
    (want,) = epilogue_outputs(y, None, [ref])
    assert torch.equal(got, want)
    assert int(want.unique().numel()) >= (1 if cuts == [300] else 2)


def test_table_steps_and_what_takes_no_thresholds():
    g = torch.Generator().manual_seed(3)
    u8, u2 = Precision.parse("u8"), Precision.parse("u2")
    rising = _staircase(u8, u2, [10, 20, 30])
    spec = N.Requantized("u2", 2**20, 30, relu=True, mid=u8, table=rising)
    assert table_steps(spec) == [10, 20, 30]
    bumpy = rising.clone()
    bumpy[25] = 0  # falls once inside the formula's values
    assert table_steps(N.Requantized("u2", 2**20, 30, relu=True, mid=u8, table=bumpy)) is None
    # a fall below the formula's lowest value (no ReLU: s8 from -128; with ReLU from 0)
    s8 = Precision.parse("s8")
    low_bump = _staircase(s8, u2, [0, 10, 20])
    low_bump[0] = 3
    for relu, steps in ((True, [0, 10, 20]), (False, None)):
        spec = N.Requantized("u2", 2**20, 30, relu=relu, mid=s8, table=low_bump)
        assert table_steps(spec) == steps
    wide = N.Requantized("u4", 2**20, 30, relu=True, mid=u8,
                         table=torch.randint(0, 16, (256,), generator=g).sort().values)
    assert derived_threshold_table(wide, 4) is None  # 4 bits: the table lookup
    big = N.Requantized("u2", 2**40, 50, relu=True, mid=u8, table=rising)
    assert derived_threshold_table(big, 4) is None  # thresholds take multipliers < 2^31


# ------------------------------------------------------------------------- CPU: kernels
KERNEL_CASES = [  # (id, config, uint8 image, mid: u8, or s8 under ReLU)
    ("bands", S.StemConfig(band_rows=3, whole_k=True), False, "u8"),
    ("bands_lookup_u8", S.StemConfig(band_rows=2, thresholds=False), True, "s8"),
    ("gemm", S.StemConfig(kernel="gemm", block_j=16, band_rows=2, whole_k=True), False, "s8"),
    ("ring", S.StemConfig(kernel="ring", block_j=16, band_rows=4, programs_per_sm=1), False,
     "u8"),
    ("ring_lookup_u8_early_loads", S.StemConfig(kernel="ring", block_j=16, band_rows=7,
                                                thresholds=False, late_loads=False), True,
     "s8"),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_resnet_stem_derived_outputs(case):
    """ResNet's 7x7/2 + pool: the stored mid value (u8, or s8 under ReLU: the table read from
    its entry 0 on), a u2 reading (thresholds, or the table with thresholds=False) and an s4
    reading (always the table), bit planes."""
    name, cfg, u8, mid = case
    image, weight, bias, g = make_case(2, 27, 23, 64, 7, 31 + len(name))
    kw = dict(scale=0.04)
    q = quantize_float(image, 0.04, "s8")
    if u8:
        image = torch.randint(0, 256, image.shape, generator=g, dtype=torch.uint8)
        kw = dict(table=uint8_input_table(0.02, "s8", MEAN, STD))
        q = quantize_uint8_image(image, kw["table"])
    specs = derived_specs(64, g, mid, (("u2", True), ("s4", True)))
    layouts = (INT8, BITPLANE, BITPLANE)
    launch_outs = [S.empty_packed(S.geometry_of(image, weight, 2, 3, 1).out_shape,
                                  s.precision, lay, DEVICE) for s, lay in zip(specs, layouts,
                                                                              strict=True)]
    launch = S.bind_stem(image.to(DEVICE), weight, bias, specs, launch_outs, config=cfg, **kw,
                         **RESNET)
    kinds = [slot[SLOT_CONSTEXPRS.index("KIND")] for slot in launch.launches[-1].kwargs["OUTS"]]
    assert kinds == ([1, 4, 5] if cfg.thresholds else [1, 5, 5]), kinds
    launch()
    ref = reference(q, weight, bias, specs, 2, 3, 1)
    assert check_outputs(launch_outs, ref, layouts, specs) == 3


@pytest.mark.parametrize("geometry", ["vgg_3x3", "alexnet_11x11"])
def test_falling_table_without_pool(geometry):
    """Without the pool any table works (the lookup): an s8 mid without ReLU, a u2 reading
    by a random table and an s4 one, in INT8 and bit planes; with the pool the same specs are
    refused, naming the output."""
    r, stride, pad = (3, 1, 1) if geometry == "vgg_3x3" else (11, 4, 2)
    image, weight, bias, g = make_case(2, 19, 17, 40, r, 41 + r)
    specs = derived_specs(40, g, "s8", (("u2", False), ("s4", False)), relu=False)
    layouts = (INT8, INT8, BITPLANE)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.04, stride=stride,
                 pad=pad, pool_pad=None)
    ref = reference(quantize_float(image, 0.04, "s8"), weight, bias, specs, stride, pad, None)
    assert check_outputs(got, ref, layouts, specs) == 3
    with pytest.raises(ValueError, match=r"outputs\[1\] is a derived output whose table falls"):
        S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.04, stride=stride,
               pad=pad, pool_pad=0)


# ------------------------------------------------------------------------- CPU: the plan
def _narrow_resnet18(size: int):
    """ResNet-18 (width 1/8) at w1a2 with an 8-bit residual stream, its first and last layers
    at 8 bits, compiled for the reference executor; (plan, image)."""
    from lowbit.runtime.compiled import compile_model

    torch.manual_seed(0)
    model = zoo.get("resnet18", num_classes=10, width=0.125).eval()
    convs = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Conv2d,
                                                                    torch.nn.Linear))]
    eight = {"weight_bits": 8, "act_bits": 8}
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = lowbit.quantize(model, weight_bits=1, act_bits=2, residual_bits=8,
                            layers={convs[0]: eight, convs[-1]: eight})
        lowbit.calibrate(q, [x])
        plan = compile_model(q.eval(), x, executor="reference", records=False).plan
    return plan, x


def test_narrow_stream_resnet18_fuses_its_first_layer():
    """The stem of a narrow-stream ResNet-18 writes the u8 stream and the readings derived
    from it (its refusal was "a derived output"); the GPU executor (interpreted) equals the
    reference executor at every tensor. A falling table on the pooled layer is still refused."""
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor

    plan, x = _narrow_resnet18(32)
    first = plan.layers[0]
    assert first.stem and first.pool is not None
    assert any(o.derived for o in first.layer_outputs)
    ex = GpuExecutor(plan, "cpu")
    assert first.name in ex.stems
    y, got = ex(x, record=True)
    y_ref, want = ReferenceExecutor(plan)(x, record=True)
    for t in first.outputs:
        assert torch.equal(got[t], want[t]), t
    assert all(torch.equal(got[t], want[t]) for t in want) and torch.equal(y, y_ref)
    quantize = next(s for s in plan.steps if isinstance(s, Quantize))
    derived = next(o for o in first.layer_outputs if o.derived)
    params = dict(plan.params)
    falling = params[derived.table].clone()
    params[derived.table] = falling.flip(0)
    assert "not monotone" in stem_refusal(plan.input, plan.tensors, params, quantize, first)
    off = with_launches(plan, PlanOptions(fuse_stem=False))
    assert not off.layers[0].stem


def test_plan_carries_the_stem_kernel():
    """The plan fixes the fused stem's kernel and knobs (`Layer.stem_config`): the shape's
    default, or `PlanOptions.stem_kernel` where that kernel runs the layer (its reason), the
    default with the kernel's refusal otherwise; it survives the plan's serialization and
    leaves with the stem."""
    from dataclasses import replace

    from lowbit.graph.ir import Plan
    from lowbit.graph.stem_choice import stem_config, stem_geometry, stem_text
    from lowbit.kernels.triton.stem_geometry import StemConfig

    plan, _ = _narrow_resnet18(32)
    first = plan.layers[0]
    geom = stem_geometry(first)
    assert (geom.N, geom.C, geom.H, geom.R, geom.stride, geom.pool_pad) == (2, 3, 32, 7, 2, 1)
    assert StemConfig(**dict(first.stem_config)) == S.ws_config(geom)  # preferred over bands
    assert "measured faster than the bands kernel" in first.stem_reason
    bands = with_launches(plan, PlanOptions(stem_kernel="bands")).layers[0]
    assert StemConfig(**dict(bands.stem_config)) == S.default_config(geom)
    assert bands.stem_config["kernel"] == "bands" and "default" in bands.stem_reason
    for kernel, want in (("ws", S.ws_config(geom)), ("ring", S.ring_config(geom))):
        chosen = with_launches(plan, PlanOptions(stem_kernel=kernel)).layers[0]
        assert StemConfig(**dict(chosen.stem_config)) == want
        assert "PlanOptions.stem_kernel" in chosen.stem_reason
        assert stem_text(chosen).startswith("cuda ws stem" if kernel == "ws"
                                            else "triton ring stem")
        back = Plan.from_dict(with_launches(plan, PlanOptions(stem_kernel=kernel)).to_dict(),
                              dict(plan.params))
        assert back.layers[0].stem_config == chosen.stem_config
    four = replace(first, workload=replace(first.workload, C=4))
    for asked in ("ws", None):  # refused: the shape's default, saying why
        config, why = stem_config(four, plan.tensors, plan.params, asked)
        assert config["kernel"] == "bands" and "ws kernel cannot run it (4 channels" in why
    off = with_launches(plan, PlanOptions(fuse_stem=False, stem_kernel="ws")).layers[0]
    assert not off.stem and off.stem_config is None and off.stem_reason == ""
    with pytest.raises(ValueError, match="stem_kernel must be one of"):
        PlanOptions(stem_kernel="cudnn")


@pytest.mark.gpu
def test_gpu_narrow_resnet18_on_the_ws_stem():
    """The plan's "ws" stem on the GPU executor equals the reference executor at every
    tensor (narrow-stream ResNet-18: the u8 stream and its derived u2 reading)."""
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor

    plan, x = _narrow_resnet18(64)
    plan = with_launches(plan, PlanOptions(stem_kernel="ws"))
    assert plan.layers[0].stem_config["kernel"] == "ws"
    y, got = GpuExecutor(plan, "cuda")(x.cuda(), record=True)
    y_ref, want = ReferenceExecutor(plan)(x, record=True)
    assert all(torch.equal(got[t].cpu(), want[t]) for t in want) and len(want) > 20
    assert torch.equal(y.cpu(), y_ref)


# ------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, S.StemConfig(kernel="gemm", block_j=32, band_rows=4,
                                                   whole_k=True, num_stages=3),
                                 S.StemConfig(kernel="ring", band_rows=4),
                                 S.StemConfig(kernel="ring", band_rows=4, thresholds=False)],
                         ids=["default_bands", "gemm", "ring", "ring_lookup"])
def test_gpu_resnet_stem_derived_224(cfg):
    image, weight, bias, g = make_case(8, 224, 224, 64, 7, 51)
    specs = derived_specs(64, g, "u8", (("u2", True), ("s4", True)))
    layouts = (INT8, BITPLANE, BITPLANE)
    got = S.stem(image.cuda(), weight, bias, specs, layouts, scale=0.03, config=cfg,
                 **RESNET)
    ref = reference(quantize_float(image, 0.03, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 3
