"""The warp-specialized CUDA first layer (`StemConfig(kernel="ws")`, kernels/cuda/stem_ws*.cu)
bit for bit against the reference chain: quantized image -> accumulate -> epilogue_outputs ->
max-pool.

CPU: the kernel's own CUDA text through the host emulation (`stem_ws_emu`: producer and
consumer warps as threads, mbarriers as phase counters). The fast tier compiles two
emulations: one float32 build shared by every float test (same outputs' kinds: `float_specs`)
and one uint8 build. Float: u8 + derived u2 bit planes (ResNet-50 w1a2's pair) + an int32
formula s8 at 67x45; the quantizer seen directly (identity filters) at every step, the float
below it, rounding ties, huge / tiny / denormal values, two scales; the non-finite flag (inf,
-inf, nan). uint8 (channels_last, batch 3, 37x70, several persistent tiles per CTA, bands):
thresholds, the split-bias formula and the int32 formula after the power-of-two reduction,
40 channels (a partial channel block). Host: the quantizer's steps against the reference,
the formula kinds, the refusals, the weights' reduction order, NVRTC builds for sm_80 and
sm_90a without spills. Slow: 224x224, a scale quantized by division. GPU (`gpu` mark): equal
to the reference and to the default "bands" kernel at batch 2 and 8, float32 and uint8.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowbit.core import Layout, Precision
from lowbit.kernels.cuda import nvrtc
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.kernels.cuda.stem_ws import (
    KIND_FORMULA,
    KIND_FORMULA32,
    KIND_FORMULA_SPLIT,
    KIND_THRESHOLDS,
    WsOutput,
    WsShape,
    _acc_bound,
    _formula_kind,
    float_thresholds,
    render,
    ws_band_rows,
    ws_epilogue,
    ws_n_tiles,
    ws_output_refusal,
    ws_refusal,
    ws_weights,
)
from lowbit.kernels.triton import stem as S
from lowbit.kernels.triton.stem_geometry import StemGeometry
from lowbit.quant.packing import pack
from lowbit.reference import (
    FloatOutput,
    RequantizedOutput,
    quantize_float,
    quantize_uint8_image,
    uint8_input_table,
)
from stem_cases import MEAN, RESNET, STD, check_outputs, derived_specs, reference, specs_for

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
SCALE = 0.03
FLT_MAX = torch.finfo(torch.float32).max
needs_cxx = pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
gpu = pytest.mark.gpu


def nonzero_weights(k: int, g: torch.Generator, r: int = 7, c: int = 3) -> torch.Tensor:
    w = torch.randint(-128, 128, (k, r, r, c), generator=g)
    return torch.where(w == 0, torch.ones_like(w), w)


def float_image(n, h, w, g):
    return torch.randn(n, 3, h, w, generator=g) * 1.5


def uint8_image(n, h, w, g):
    return torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)


def run_emulated(image, weight, bias, specs, layouts, status=None, ctas=2, band_rows=None,
                 with_reference=True, scale=SCALE):
    from lowbit.kernels.cuda.stem_ws_emu import emulate_ws

    geom = S.geometry_of(image, weight, **RESNET)
    outs = [S.empty_packed(geom.out_shape, s.precision, lay, "cpu")
            for s, lay in zip(specs, layouts, strict=True)]
    for o in outs:
        o.data.view(torch.uint8).fill_(0x5A)
    is_u8 = image.dtype == torch.uint8
    table = uint8_input_table(scale, "s8", MEAN, STD).to(torch.int8) if is_u8 else None
    emulate_ws(image, table, weight, bias.to(torch.int32), specs, outs, geom,
               S._input_precision("s8"), scale, status, ctas, band_rows)
    if not with_reference:
        return outs, None
    q = (quantize_uint8_image(image, uint8_input_table(scale, "s8", MEAN, STD)) if is_u8
         else quantize_float(image, scale, "s8"))
    return outs, reference(q, weight, bias, specs, **RESNET)


def kinds_of(specs, layouts, k, weight, bias) -> tuple[int, ...]:
    outs = [S.empty_packed((1, 1, 1, k), s.precision, lay, "cpu")
            for s, lay in zip(specs, layouts, strict=True)]
    kinds, _ = ws_epilogue(specs, outs, k, _acc_bound(weight, bias, Precision.parse("s8")))
    return tuple(o.kind for o in kinds)


def float_specs(k: int, g: torch.Generator, identity: bool = False):
    """The float tests' outputs, one compiled emulation for all of them (kinds and ranges are
    compile-time): u8 (the formula as one int64 sum), a derived u2 (thresholds, bit planes),
    s8 without ReLU (the int32 formula; `identity`: y itself, m = 2, s = 1)."""
    u8, u2 = derived_specs(k, g, outs=(("u2", True),))
    m = torch.full((k,), 2) if identity else torch.randint(90, 120, (k,), generator=g)
    s8 = RequantizedOutput(Precision.parse("s8"), m, 1 if identity else 14)
    return [u8, u2, s8], [INT8, BITPLANE, INT8]


FLOAT_KINDS = (KIND_FORMULA, KIND_THRESHOLDS, KIND_FORMULA32)


# ---------------------------------------------------------------- host emulation (CPU)
@needs_cxx
def test_emulated_float_outputs_bit_exact() -> None:
    """ResNet-50 w1a2's pair (u8 + derived u2) and an int32-formula s8 at 67x45 (12 pooled
    columns: one n-tile a warp, odd rows), the status flag left 0."""
    g = torch.Generator().manual_seed(1)
    image, weight = float_image(1, 67, 45, g), nonzero_weights(64, g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs, layouts = float_specs(64, g)
    assert kinds_of(specs, layouts, 64, weight, bias) == FLOAT_KINDS
    status = torch.zeros(1, dtype=torch.int32)
    outs, ref = run_emulated(image, weight, bias, specs, layouts, status=status)
    assert check_outputs(outs, ref, layouts, specs) == 3
    assert int(status[0]) == 0


def special_values(scale: float) -> torch.Tensor:
    """float32 image values where the quantizer is hardest: every step T(l) and the float
    below it, x = (k + 1/2) scale (rounding ties of x / scale), huge, tiny and denormal
    values of both signs, zeros."""
    steps = float_thresholds(scale, Precision.parse("s8"))[:, 1].clone().view(torch.float32)
    steps = steps[~steps.isnan()]
    below = torch.nextafter(steps, torch.tensor(-float("inf")))
    ties = (torch.arange(-130, 130, dtype=torch.float32) + 0.5) * scale
    extremes = torch.tensor([FLT_MAX, 1e30, 1e-30, 1e-40, 1.4e-45, 0.0])
    return torch.cat([steps, below, ties, extremes, -extremes])


@needs_cxx
@pytest.mark.parametrize("scale", [SCALE, 1.7])
def test_emulated_float_quantizer_exact_at_steps_ties_and_extremes(scale: float) -> None:
    """The image's quantized values seen directly: channel k's filter is 1 at the centre tap
    of image channel k % 3, the s8 output is y itself and every image value but those at
    rows and columns 4i, 4j (the special values, `special_values`, and random ones) is
    -FLT_MAX, so pooled output (i, j) is the quantized value at (4i, 4j) (conv (2i, 2j))."""
    g = torch.Generator().manual_seed(8)
    values = special_values(scale)
    n = -(-values.numel() // (3 * 17 * 12))
    image = torch.full((n, 3, 67, 45), -FLT_MAX)
    slots = image[:, :, ::4, ::4]  # [n, 3, 17, 12]
    fill = torch.randn(slots.numel(), generator=g) * 2
    fill[torch.randperm(slots.numel(), generator=g)[:values.numel()]] = values
    image[:, :, ::4, ::4] = fill.view(slots.shape)
    weight = torch.zeros(64, 7, 7, 3, dtype=torch.int64)
    weight[torch.arange(64), 3, 3, torch.arange(64) % 3] = 1
    bias = torch.zeros(64, dtype=torch.int64)
    specs, layouts = float_specs(64, g, identity=True)
    assert kinds_of(specs, layouts, 64, weight, bias) == FLOAT_KINDS
    status = torch.zeros(1, dtype=torch.int32)
    outs, ref = run_emulated(image, weight, bias, specs, layouts, status=status, scale=scale)
    for out, want, spec, layout in zip(outs, ref, specs, layouts, strict=True):
        assert torch.equal(out.data, pack(want, spec.precision, layout))
    q = quantize_float(fill.view(slots.shape), scale, "s8")  # [n, c, i, j]
    seen = outs[2].data.view(torch.int8)[..., :3].permute(0, 3, 1, 2)
    assert torch.equal(seen.to(torch.int64), q)
    assert int(q.unique().numel()) == 256  # every level, both ends included
    assert int(status[0]) == 0


@needs_cxx
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_emulated_status_flags_a_non_finite_image(bad: float) -> None:
    g = torch.Generator().manual_seed(3)
    image, weight = float_image(1, 29, 31, g), nonzero_weights(64, g)
    image[0, 1, 20, 7] = bad
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs, layouts = float_specs(64, g)
    status = torch.zeros(1, dtype=torch.int32)
    run_emulated(image, weight, bias, specs, layouts, status=status, ctas=1,
                 with_reference=False)
    assert int(status[0]) == 1


@needs_cxx
def test_emulated_uint8_thresholds_and_formulas_bit_exact() -> None:
    """uint8 channels_last image, batch 3, 37x70 (two n-tiles a warp), 40 channels, bands of
    4 rows over 2 CTAs (several tiles each): u2 bit planes (thresholds), s8 bytes of scale
    2049 / 2048 without ReLU (the formula with the bias split: 2^31 m passes 2^(s + 31)), u4
    bytes whose m and b share 2^12 with 2^s (the int32 formula after the reduction)."""
    g = torch.Generator().manual_seed(2)
    image, weight = uint8_image(3, 37, 70, g), nonzero_weights(40, g)
    bias = torch.randint(-2000, 2000, (40,), generator=g)
    u2 = specs_for(40, g, (("u2", True),))[0]
    s8 = RequantizedOutput(Precision.parse("s8"), 2049, 11)
    m = torch.randint(90, 120, (40,), generator=g) << 12
    u4 = RequantizedOutput(Precision.parse("u4"), m, 32, relu=True,
                           bias=torch.randint(-2**12, 2**12, (40,), generator=g) << 12)
    specs, layouts = [u2, s8, u4], [BITPLANE, INT8, INT8]
    assert kinds_of(specs, layouts, 40, weight, bias) == (KIND_THRESHOLDS, KIND_FORMULA_SPLIT,
                                                          KIND_FORMULA32)
    outs, ref = run_emulated(image, weight, bias, specs, layouts, band_rows=4)
    assert check_outputs(outs, ref, layouts, specs) == 3


@pytest.mark.slow
@needs_cxx
def test_emulated_float_by_division_for_a_tiny_scale() -> None:
    """A scale whose reciprocal is not a normal float: the image quantized by IEEE division."""
    g = torch.Generator().manual_seed(9)
    scale = 2.0**-110
    image, weight = float_image(1, 29, 31, g) * scale * 30, nonzero_weights(64, g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs, layouts = float_specs(64, g)
    outs, ref = run_emulated(image, weight, bias, specs, layouts, scale=scale)
    assert check_outputs(outs, ref, layouts, specs) == 3


@pytest.mark.slow
@needs_cxx
def test_emulated_224_bit_exact() -> None:
    """ResNet's 224x224 (four n-tiles a warp, one tile of 56 pooled columns)."""
    g = torch.Generator().manual_seed(4)
    image, weight = float_image(1, 224, 224, g), nonzero_weights(64, g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = derived_specs(64, g, outs=(("u2", True),))
    outs, ref = run_emulated(image, weight, bias, specs, [INT8, BITPLANE], band_rows=28)
    assert check_outputs(outs, ref, [INT8, BITPLANE], specs) == 2


# ---------------------------------------------------------------- host pieces (CPU)
def test_weights_reduction_order_is_the_strided_conv() -> None:
    """A conv of the space-to-depth image (4C-byte pixels) with `ws_weights` as a 4x4 filter
    equals the 7x7/2 conv of the image."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-5, 6, (1, 3, 23, 19), generator=g).to(torch.float64)
    weight = nonzero_weights(8, g)
    geom = StemGeometry(N=1, C=3, H=23, W=19, K=8, R=7, stride=2, pad=3)
    ps = -geom.a_min
    pad = F.pad(x, (2 * ps, 2 * ps + 9, 2 * ps, 2 * ps + 9))  # 23 + 13 + 4: even
    # pixel (Y, X), byte (d C + c) 2 + e = image (2 (Y - PS) + d, 2 (X - PS) + e), channel c
    s2d = pad.reshape(1, 3, pad.shape[2] // 2, 2, pad.shape[3] // 2, 2).permute(
        0, 3, 1, 5, 2, 4).reshape(1, 12, pad.shape[2] // 2, pad.shape[3] // 2)
    w = ws_weights(weight, geom)[:8].to(torch.float64).reshape(8, 4, 4, 12).permute(0, 3, 1, 2)
    got = F.conv2d(s2d, w)[:, :, :geom.OH, :geom.OW]
    want = F.conv2d(x, weight.permute(0, 3, 1, 2).to(torch.float64), stride=2, padding=3)
    assert torch.equal(got, want)
    assert int(want.abs().sum()) > 0


def test_refusals_name_their_reason() -> None:
    geom = StemGeometry(N=1, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3)
    assert ws_refusal(geom) is None
    reasons = [ws_refusal(StemGeometry(N=1, C=3, H=64, W=64, K=64, R=11, stride=4, pad=2,
                                       pool_pad=0)),
               ws_refusal(StemGeometry(N=1, C=4, H=64, W=64, K=64, R=7, stride=2, pad=3)),
               ws_refusal(StemGeometry(N=1, C=3, H=64, W=64, K=64, R=7, stride=2, pad=3,
                                       pool_pad=None))]
    assert ["stride 4" in reasons[0], "4 channels" in reasons[1], "max-pool" in reasons[2]] == \
        [True] * 3
    g = torch.Generator().manual_seed(6)
    u4 = derived_specs(64, g, outs=(("u4", True),))[1]
    out = S.empty_packed((1, 2, 2, 64), "u4", INT8, "cpu")
    assert "derived output of more than 2 bits" in ws_output_refusal(1, u4, out.layout, 64)
    assert "float output" in ws_output_refusal(0, FloatOutput(0.5), None, 64)


def test_bind_stem_refuses_ws_before_any_launch() -> None:
    g = torch.Generator().manual_seed(7)
    image, weight = float_image(1, 40, 40, g), nonzero_weights(64, g)
    specs = specs_for(64, g, (("u2", True),))
    out = S.empty_packed((1, 20, 20, 64), "u2", BITPLANE, "cpu")
    with pytest.raises(ValueError, match="stride 1"):
        S.bind_stem(image, weight, None, specs, [out], stride=1, pad=3, pool_pad=1,
                    scale=SCALE, config=S.StemConfig(kernel="ws"))


def test_band_and_tiles() -> None:
    geom = StemGeometry(N=256, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3)
    assert ws_n_tiles(geom) == 4
    assert ws_band_rows(geom, 4, 132) == 56  # whole images: 2 rounds of 57 steps
    small = StemGeometry(N=8, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3)
    rows = ws_band_rows(small, 4, 132)
    assert 8 * -(-56 // rows) <= 132  # one round of tiles at batch 8
    assert ws_n_tiles(StemGeometry(N=1, C=3, H=67, W=45, K=64, R=7, stride=2, pad=3)) == 1


@pytest.mark.parametrize("prec", ["s8", "s4", "u7"])
@pytest.mark.parametrize("scale", [0.03, 1.7, 3e-30, 2.5e20])
def test_float_thresholds_are_the_reference_steps(prec: str, scale: float) -> None:
    """Step l's threshold quantizes to qmin + l and the float below it to qmin + l - 1; the
    bases run qmin .. qmax, then stay at qmax with no thresholds."""
    p = Precision.parse(prec)
    steps = float_thresholds(scale, p)
    lo, hi = steps[:, 0].clone().view(torch.float32), steps[:, 1].clone().view(torch.float32)
    levels = p.qmax - p.qmin + 1
    t = hi[:levels - 1]
    assert torch.equal(lo[1:levels], t) and bool(lo[0].isnan())
    assert bool(hi[levels - 1:].isnan().all())
    below = torch.nextafter(t, torch.tensor(-float("inf")))
    want = torch.arange(p.qmin + 1, p.qmax + 1)
    assert torch.equal(quantize_float(t, scale, p), want)
    assert torch.equal(quantize_float(below, scale, p), want - 1)
    assert torch.equal(steps[:, 2], (p.qmin + torch.arange(256)).clamp(max=p.qmax).to(torch.int32))


def test_formula_kinds() -> None:
    """The cheapest exact form per output: int32 where every partial sum fits (after dividing
    m, b + 2^(s-1) and 2^s by a shared power of two), one int64 sum where its quotient is an
    int32 for every int32 y, else the split bias."""
    def kind(m: int, s: int, b: int = 0, acc: int = 2**21) -> int:
        t = torch.tensor([m]), torch.tensor([b + (1 << (s - 1))]), torch.tensor([s])
        return _formula_kind(*t, acc)[0]

    assert [kind(105, 20), kind(105 << 12, 32, 3 << 20), kind(105 << 12, 32, 3),
            kind(2**30 + 1, 43), kind(2049, 11), kind(1, 1, 2**61)] == [
        KIND_FORMULA32, KIND_FORMULA32, KIND_FORMULA, KIND_FORMULA, KIND_FORMULA_SPLIT,
        KIND_FORMULA_SPLIT]
    _, words = _formula_kind(torch.tensor([105 << 12]), torch.tensor([(3 << 20) + 2**31]),
                             torch.tensor([32]), 2**21)
    assert words.tolist() == [[105, 20, (3 << 8) + 2**19, 0]]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("u8", [False, True])
def test_nvrtc_builds_without_spills(arch: str, u8: bool) -> None:
    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # pragma: no cover - no NVRTC library
        pytest.skip(f"NVRTC unavailable: {e}")
    shape = WsShape(C=3, PS=2, PP=1, NT_W=4, U8_INPUT=u8, HAS_STATUS=not u8, QMIN=-128,
                    QMAX=127, outputs=(WsOutput(2, 0, 8, 0, 255), WsOutput(1, 1, 2, 0, 3)))
    report = nvrtc.ptxas_report(render(shape), arch, "stem_ws")
    assert 0 < report["registers"] <= 168 and report["spill_bytes"] == 0, report


# ---------------------------------------------------------------- GPU
def gpu_case(n: int, u8: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    image = uint8_image(n, 224, 224, g) if u8 else float_image(n, 224, 224, g)
    weight = nonzero_weights(64, g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = derived_specs(64, g, outs=(("u2", True),))
    kw = dict(table=uint8_input_table(SCALE, "s8", MEAN, STD)) if u8 else dict(scale=SCALE)
    return image, weight, bias, specs, kw


@gpu
@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("u8", [False, True])
def test_gpu_equals_reference_and_bands(n: int, u8: bool) -> None:
    image, weight, bias, specs, kw = gpu_case(n, u8, seed=10 + n)
    image = image.cuda()
    geom = S.geometry_of(image, weight, **RESNET)
    layouts = [INT8, BITPLANE]
    results = {}
    for name, cfg in (("ws", S.ws_config(geom, S._sm_count(image.device))),
                      ("bands", S.default_config(geom))):
        outs = [S.empty_packed(geom.out_shape, s.precision, lay, "cuda")
                for s, lay in zip(specs, layouts, strict=True)]
        for o in outs:
            o.data.view(torch.uint8).fill_(0x5A)
        status = None if u8 else torch.zeros(1, dtype=torch.int32, device="cuda")
        S.bind_stem(image, weight, bias, specs, outs, config=cfg, status=status, **RESNET,
                    **kw)()
        torch.cuda.synchronize()
        results[name] = outs
        if status is not None:
            assert int(status[0]) == 0
    q = (quantize_uint8_image(image.cpu(), kw["table"]) if u8
         else quantize_float(image.cpu(), SCALE, "s8"))
    ref = reference(q, weight, bias, specs, **RESNET)
    assert check_outputs(results["ws"], ref, layouts, specs) == 2
    for a, b in zip(results["ws"], results["bands"], strict=True):
        assert torch.equal(a.data, b.data)
