"""The warp-specialized CUDA first layer (`StemConfig(kernel="ws")`, kernels/cuda/stem_ws*.cu)
bit for bit against the reference chain: quantized image -> accumulate -> epilogue_outputs ->
max-pool.

CPU: the kernel's own CUDA text through the host emulation (`stem_ws_emu`: producer and
consumer warps as threads, mbarriers as phase counters) on odd images (67x45 at batch 1,
37x70 at batch 3 with several persistent tiles per CTA and bands; 224x224 is `slow`), float32
and uint8 (channels_last) images, u8 + derived u2 bit planes (ResNet-50 w1a2's pair), u2 / s2
bit planes and s8 bytes from thresholds and the 64-bit formula, 40 channels (a partial
channel block), the non-finite flag; the refusals; the weights' reduction order; NVRTC builds
for sm_80 and sm_90a without spills. GPU (`gpu` mark): equal to the reference and to the
default "bands" kernel at batch 2 and 8, float32 and uint8.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowbit.core import Layout
from lowbit.kernels.cuda import nvrtc
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.kernels.cuda.stem_ws import (
    WsOutput,
    WsShape,
    render,
    ws_band_rows,
    ws_n_tiles,
    ws_output_refusal,
    ws_refusal,
    ws_weights,
)
from lowbit.kernels.triton import stem as S
from lowbit.kernels.triton.stem_geometry import StemGeometry
from lowbit.reference import (
    FloatOutput,
    quantize_float,
    quantize_uint8_image,
    uint8_input_table,
)
from stem_cases import MEAN, RESNET, STD, check_outputs, derived_specs, reference, specs_for

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
SCALE = 0.03
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
                 with_reference=True):
    from lowbit.kernels.cuda.stem_ws_emu import emulate_ws

    geom = S.geometry_of(image, weight, **RESNET)
    outs = [S.empty_packed(geom.out_shape, s.precision, lay, "cpu")
            for s, lay in zip(specs, layouts, strict=True)]
    for o in outs:
        o.data.view(torch.uint8).fill_(0x5A)
    is_u8 = image.dtype == torch.uint8
    table = uint8_input_table(SCALE, "s8", MEAN, STD).to(torch.int8) if is_u8 else None
    emulate_ws(image, table, weight, bias.to(torch.int32), specs, outs, geom,
               S._input_precision("s8"), SCALE, status, ctas, band_rows)
    if not with_reference:
        return outs, None
    q = (quantize_uint8_image(image, uint8_input_table(SCALE, "s8", MEAN, STD)) if is_u8
         else quantize_float(image, SCALE, "s8"))
    return outs, reference(q, weight, bias, specs, **RESNET)


# ---------------------------------------------------------------- host emulation (CPU)
@needs_cxx
def test_emulated_float_u8_and_derived_u2_bit_exact() -> None:
    """ResNet-50 w1a2's pair at 67x45 (12 pooled columns: one n-tile a warp, odd rows)."""
    g = torch.Generator().manual_seed(1)
    image, weight = float_image(1, 67, 45, g), nonzero_weights(64, g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = derived_specs(64, g, outs=(("u2", True),))
    outs, ref = run_emulated(image, weight, bias, specs, [INT8, BITPLANE])
    assert check_outputs(outs, ref, [INT8, BITPLANE], specs) == 2


@needs_cxx
def test_emulated_uint8_thresholds_and_formula_bit_exact() -> None:
    """uint8 channels_last image, batch 3, 37x70 (two n-tiles a warp), 40 channels, bands of
    4 rows over 2 CTAs (several tiles each): u2 / s2 bit planes (thresholds), s8 bytes without
    ReLU (the 64-bit formula)."""
    g = torch.Generator().manual_seed(2)
    image, weight = uint8_image(3, 37, 70, g), nonzero_weights(40, g)
    bias = torch.randint(-20000, 20000, (40,), generator=g)
    specs = specs_for(40, g, (("u2", True), ("s8", False), ("s2", False)))
    layouts = [BITPLANE, INT8, BITPLANE]
    outs, ref = run_emulated(image, weight, bias, specs, layouts, band_rows=4)
    assert check_outputs(outs, ref, layouts, specs) == 3


@needs_cxx
def test_emulated_status_flags_a_non_finite_image() -> None:
    g = torch.Generator().manual_seed(3)
    image, weight = float_image(1, 29, 31, g), nonzero_weights(64, g)
    image[0, 1, 20, 7] = float("inf")
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = specs_for(64, g, (("u2", True),))
    status = torch.zeros(1, dtype=torch.int32)
    run_emulated(image, weight, bias, specs, [BITPLANE], status=status, ctas=1,
                 with_reference=False)
    assert int(status[0]) == 1


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
