"""The fused first layer (lowbit.kernels.triton.stem) bit for bit against the reference chain
quantize_float (or the uint8 table) -> accumulate -> epilogue_outputs -> maxpool2d_int.

CPU: under TRITON_INTERPRET=1 on small odd images (2x3x37x45), ResNet's 7x7/2 + 3x3/2 pool
(the default "bands" kernel; the "ring" kernel in tests/test_stem_ring.py, derived outputs in
tests/test_stem_derived.py), AlexNet's 11x11/4 with and without its pool, fp32 / fp16 / uint8
input, INT8 and BITPLANE outputs; the two-launch conv kernels ("bands" and "gemm"). GPU (`gpu`
mark): 224x224 at batch 8 and a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import Layout, Precision
from lowbit.kernels.triton import netops as N
from lowbit.kernels.triton import stem as S
from lowbit.quant.packing import pack
from lowbit.reference import (
    FloatOutput,
    RequantizedOutput,
    quantize_float,
    quantize_uint8_image,
    uint8_input_table,
)
from stem_cases import (
    MEAN,
    RESNET,
    STD,
    check_outputs,
    make_case,
    reference,
    replay_with_new_image,
    specs_for,
)
from triton_cases import DEVICE

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


@pytest.mark.parametrize("dtype,layouts", [
    (torch.float32, (INT8, BITPLANE, INT8)),
    (torch.float16, (BITPLANE, INT8, BITPLANE)),
], ids=["fp32", "fp16"])
def test_resnet_stem_float_image(dtype, layouts):
    image, weight, bias, g = make_case(2, 37, 45, 64, 7, 1, dtype)
    specs = specs_for(64, g)
    scale = 0.031
    # values exactly on rounding boundaries of the input quantizer
    image.view(-1)[:200] = ((torch.arange(200) - 100 + 0.5) * scale).to(dtype)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=scale, **RESNET)
    q = quantize_float(image, scale, "s8")
    ref = reference(q, weight, bias, specs, 2, 3, 1)
    assert ref[0].shape == (2, 10, 12, 64)
    assert check_outputs(got, ref, layouts, specs) == 3


@pytest.mark.parametrize("cfg", [None, S.StemConfig(kernel="gemm", block_j=32, band_rows=5)],
                         ids=["default", "gemm"])
def test_resnet_stem_uint8_image_and_float_output(cfg):
    _, weight, _, g = make_case(2, 37, 45, 40, 7, 2)
    image = torch.randint(0, 256, (2, 3, 37, 45), generator=g, dtype=torch.uint8)
    table = uint8_input_table(0.019, "s8", MEAN, STD)
    specs = [specs_for(40, g, (("u4", True),))[0],
             FloatOutput(torch.rand(40, generator=g, dtype=torch.float64) * 1e-3)]
    layouts = (BITPLANE, INT8)
    got = S.stem(image.to(DEVICE), weight, None, specs, layouts, table=table, config=cfg,
                 **RESNET)
    ref = reference(quantize_uint8_image(image, table), weight, None, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 2


@pytest.mark.parametrize("pool_pad", [0, None], ids=["pool", "no_pool"])
def test_alexnet_stem(pool_pad):
    image, weight, bias, g = make_case(3, 41, 39, 64, 11, 3)
    specs = specs_for(64, g, (("s8", False), ("u2", True)))
    layouts = (INT8, BITPLANE)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.05, stride=4, pad=2,
                 pool_pad=pool_pad)
    ref = reference(quantize_float(image, 0.05, "s8"), weight, bias, specs, 4, 2, pool_pad)
    assert check_outputs(got, ref, layouts, specs) == 2


CONFIGS = [S.StemConfig(band_rows=3, images=2, whole_k=True),
           S.StemConfig(band_rows=2, images=2, block_n=32, fast_requant=False),
           S.StemConfig(band_rows=5, images=1, whole_k=True, block_n=32, fast_requant=False)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["img2_wholek_fast", "img2_n32_int64",
                                              "img1_wholek_n32_int64"])
def test_stem_configs(cfg):
    # batch 3: the second program of two-image configs has one image slot empty
    image, weight, bias, g = make_case(3, 33, 29, 64, 7, 9)
    specs = specs_for(64, g, (("u8", True), ("s4", False)))
    layouts = (INT8, BITPLANE)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.04, config=cfg,
                 **RESNET)
    ref = reference(quantize_float(image, 0.04, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 2


GEMM_CASES = [  # (name, image n x h x w, filter, stride, pad, pool_pad, config, dtype)
    ("resnet_pool_wholek", (2, 20, 18), 7, 2, 3, 1,
     S.StemConfig(kernel="gemm", block_j=16, band_rows=2, whole_k=True), torch.float32),
    ("resnet_pool_2colblocks_chunked", (1, 21, 67), 7, 2, 3, 1,
     S.StemConfig(kernel="gemm", block_j=16, band_rows=4, block_n=32), torch.float16),
    ("resnet_no_pool", (2, 20, 18), 7, 2, 3, None,
     S.StemConfig(kernel="gemm", block_j=16, whole_k=True, fast_requant=False),
     torch.float32),
    ("alexnet_pool0", (2, 41, 39), 11, 4, 2, 0,
     S.StemConfig(kernel="gemm", block_j=16, band_rows=3), torch.float32),
]


@pytest.mark.parametrize("case", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gemm_kernel_matches_reference(case):
    _, (n, h, w), r, stride, pad, pool_pad, cfg, dtype = case
    image, weight, bias, g = make_case(n, h, w, 64, r, 21, dtype)
    specs = specs_for(64, g, (("u8", True), ("u2", True), ("s8", False)))
    layouts = (INT8, BITPLANE, BITPLANE)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.04, stride=stride,
                 pad=pad, pool_pad=pool_pad, config=cfg)
    ref = reference(quantize_float(image, 0.04, "s8"), weight, bias, specs, stride, pad,
                    pool_pad)
    if case[0] == "resnet_pool_2colblocks_chunked":
        assert ref[0].shape[2] > cfg.block_j - 1  # two column blocks
    assert check_outputs(got, ref, layouts, specs) == 3


@pytest.mark.parametrize("cfg", [None, S.StemConfig(band_rows=2, whole_k=True)],
                         ids=["default_gemm", "bands"])
def test_mobilenet_3x3_stride2_stem(cfg):
    """MobileNet-V2's first layer: 3x3/2 pad 1, no pool, 32 filters (half the kernels' 64-wide
    column tile), one ReLU6 output (u8 clamped at 6 / scale: here a u8 with ReLU) on an odd
    image; the default is the "gemm" kernel."""
    image, weight, bias, g = make_case(3, 23, 19, 32, 3, 31)
    specs = specs_for(32, g, (("u8", True), ("s8", False)))
    layouts = (INT8, INT8)
    geom = S.StemGeometry(N=3, C=3, H=23, W=19, K=32, R=3, stride=2, pad=1, pool_pad=None)
    assert (S.default_config(geom).kernel, S.default_config(geom).block_n) == ("gemm", 32)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.05, stride=2, pad=1,
                 pool_pad=None, config=cfg)
    ref = reference(quantize_float(image, 0.05, "s8"), weight, bias, specs, 2, 1, None)
    assert ref[0].shape == (3, 12, 10, 32)
    assert check_outputs(got, ref, layouts, specs) == 2


@settings(max_examples=400, deadline=None)
@given(y=st.integers(-(2**21), 2**21), m=st.integers(0, 2**31 - 1),
       b=st.integers(-(2**50), 2**50), s=st.integers(1, 62),
       prec=st.sampled_from(["s8", "u8", "u2", "s4"]), relu=st.booleans())
def test_fast_requant_float64_is_exact(y, m, b, s, prec, relu):
    """The float64 requantization floor(y (m 2^-s) + b 2^-s + 0.5), clamped, equals the
    integer one wherever `netops.requant_mode` picks it (same IEEE arithmetic on CPU and GPU;
    kernels compile without FMA); it is picked wherever |y m| + |b| + 2^(s-1) < 2^53."""
    spec = N.Requantized(prec, m, s, b, relu=relu)
    mode = N.requant_mode(spec, 1, 2**21, 0)
    assert mode == (N.FAST if 2**21 * m + abs(b) + 2 ** (s - 1) < 2**53 else N.DIRECT)
    lo, hi = spec.low, spec.precision.qmax
    exact = min(max((y * m + b + (1 << (s - 1))) >> s, lo), hi)
    if mode == N.FAST:
        scaled = 2.0 ** -s
        ms = torch.tensor([m], dtype=torch.float64) * scaled
        bs = torch.tensor([b], dtype=torch.float64) * scaled
        fast = torch.floor(torch.tensor([y], dtype=torch.float64) * ms + bs + 0.5).clamp(lo, hi)
        assert int(fast) == exact


def test_bound_launcher_replays_and_flags_nonfinite():
    image, weight, bias, g = make_case(1, 29, 31, 64, 7, 4)
    specs = specs_for(64, g, (("u8", True),))
    geom = S.geometry_of(image, weight, 2, 3, 1)
    out = S.empty_packed(geom.out_shape, "u8", INT8, DEVICE)
    img_dev = image.to(DEVICE)
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    launch = S.bind_stem(img_dev, weight, bias, specs, [out], scale=0.04, status=status,
                         config=S.StemConfig(band_rows=3), **RESNET)
    for seed in (5, 6):
        img2 = torch.randn(image.shape, generator=torch.Generator().manual_seed(seed))
        img_dev.copy_(img2)
        launch()
        ref = reference(quantize_float(img2, 0.04, "s8"), weight, bias, specs, 2, 3, 1)
        assert torch.equal(out.data.cpu(), pack(ref[0], Precision(8), INT8))
    assert int(status[0]) == 0
    img_dev.view(-1)[7] = float("inf")
    launch()
    assert int(status[0]) == 1


def test_geometry_and_checks():
    geom = S.StemGeometry(N=8, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3, pool_pad=1)
    assert (geom.OH, geom.PH, geom.RS, geom.CSP, geom.KB, geom.chunks) == (112, 56, 4, 16, 256,
                                                                           4)
    alex = S.StemGeometry(N=8, C=3, H=224, W=224, K=64, R=11, stride=4, pad=2, pool_pad=0)
    assert (alex.OH, alex.PH, alex.RS, alex.CSP, alex.chunks) == (55, 27, 4, 48, 12)
    # every tap of the filter lands once in the space-to-depth filter
    w = torch.randint(-128, 128, (64, 7, 7, 3), generator=torch.Generator().manual_seed(7))
    w2 = S.s2d_weights(w, geom)
    assert w2.shape == (64, 256)
    assert torch.equal(w2.to(torch.int64).sum(1), w.sum((1, 2, 3)))
    assert int((w2 != 0).sum()) == int((w != 0).sum())
    image = torch.randn(1, 3, 16, 16, device=DEVICE)
    spec = specs_for(64, torch.Generator().manual_seed(8), (("u8", True),))
    with pytest.raises(ValueError, match="scale"):
        S.stem(image, w, None, spec, **RESNET)
    with pytest.raises(ValueError, match="weight values"):
        S.stem(image, w * 2, None, spec, scale=0.1, **RESNET)
    with pytest.raises(ValueError, match="precision"):
        S.stem(image, w, None, spec, scale=0.1, precision="u8", **RESNET)
    with pytest.raises(ValueError, match="table"):
        S.stem(image.to(torch.uint8), w, None, spec, **RESNET)
    with pytest.raises(ValueError, match="pool_pad"):
        S.stem(image, w, None, spec, scale=0.1, stride=2, pad=3, pool_pad=2)
    with pytest.raises(ValueError, match="residual"):
        S.stem(image, w, None, [RequantizedOutput("u8", 5, 3, 1)], scale=0.1, **RESNET)
    with pytest.raises(ValueError, match="kernel"):
        S.StemConfig(kernel="im2col")
    with pytest.raises(ValueError, match="images"):
        S.StemConfig(kernel="gemm", images=2)
    with pytest.raises(ValueError, match="block_j"):
        S.StemConfig(block_j=48)
    with pytest.raises(ValueError, match="2\\^31"):
        S.stem(image, w, torch.full((64,), 2**31 - 1), spec, scale=0.1, **RESNET)


# ------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_resnet_stem_224(dtype):
    image, weight, bias, g = make_case(8, 224, 224, 64, 7, 11, dtype)
    specs = specs_for(64, g)
    layouts = (INT8, BITPLANE, INT8)
    got = S.stem(image.cuda(), weight, bias, specs, layouts, scale=0.03, **RESNET)
    ref = reference(quantize_float(image, 0.03, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [
    S.StemConfig(kernel="gemm", block_j=64, band_rows=8, whole_k=True, num_warps=8,
                 num_stages=2),
    S.StemConfig(kernel="gemm", block_j=32, band_rows=2, whole_k=False, num_warps=4,
                 num_stages=3)], ids=["j64_wholek_s2", "j32_chunked_s3"])
def test_gpu_gemm_kernel_224(cfg):
    image, weight, bias, g = make_case(8, 224, 224, 64, 7, 14)
    specs = specs_for(64, g, (("u8", True), ("u2", True)))
    layouts = (INT8, BITPLANE)
    got = S.stem(image.cuda(), weight, bias, specs, layouts, scale=0.03, config=cfg, **RESNET)
    ref = reference(quantize_float(image, 0.03, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 2


@pytest.mark.gpu
def test_gpu_stem_cuda_graph_and_alexnet():
    image, weight, bias, g = make_case(4, 224, 224, 64, 11, 12)
    specs = specs_for(64, g, (("u2", True),))
    geom = S.geometry_of(image, weight, 4, 2, 0)
    out = S.empty_packed(geom.out_shape, "u2", BITPLANE, "cuda")
    img = image.cuda()
    launch = S.bind_stem(img, weight, bias, specs, [out], scale=0.05, stride=4, pad=2,
                         pool_pad=0)
    img2 = replay_with_new_image(launch, img, out, 13)
    ref = reference(quantize_float(img2, 0.05, "s8"), weight, bias, specs, 4, 2, 0)
    assert torch.equal(out.data.cpu(), pack(ref[0], Precision(2), BITPLANE))
