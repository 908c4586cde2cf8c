"""The one-launch first layer (`StemConfig(kernel="ring")`, kernels/triton/stem_ring.py) bit for
bit against the reference chain: the quantized image (`quantize_float`, or for a uint8 image
`quantize_uint8_image` of `uint8_input_table`) -> accumulate -> epilogue_outputs -> max-pool.

CPU (TRITON_INTERPRET=1): ResNet's 7x7/2 + 3x3/2 pool on odd and even images (33x33 at batch 3,
64x64, 35x29 with pool pad 0), float32 / bfloat16 / uint8 input in NCHW and channels_last
memory, u2 / s2 bit planes (integer thresholds), u8 / s8 int8 (float64 and int64
requantization) and float outputs; several tiles per program, several bands, column and
channel blocks; 1 and 4 channels, a 5x5/2 filter; the non-finite flag. Plus the host
pieces: the reduction order of the ring weights (a torch conv through it), the thresholds,
the kernel choice. GPU (`gpu` mark):
224x224 at batch 3, 8 and 256 (against the two-launch kernel), a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lowbit.core import ConvWorkload, Layout
from lowbit.kernels.triton import netops as N
from lowbit.kernels.triton import stem as S
from lowbit.kernels.triton import stem_ring as R
from lowbit.kernels.triton.stem_gemm import THRESHOLD_STRIDE, threshold_table
from lowbit.quant.packing import pack
from lowbit.reference import (
    FloatOutput,
    accumulate,
    normalize_uint8_image,
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


def uint8_case(n, h, w, k, seed, channels_last):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8)
    if channels_last:
        image = image.contiguous(memory_format=torch.channels_last)
    weight = torch.randint(-128, 128, (k, 7, 7, 3), generator=g)
    bias = torch.randint(-20000, 20000, (k,), generator=g)
    return image, weight, bias, g


def ring_geometry(image, weight, pool_pad=1):
    return S.geometry_of(image, weight, 2, 3, pool_pad)


# ------------------------------------------------------------------------- CPU: kernel
def test_float_image_odd_batch_three_outputs():
    """33x33 at batch 3: u2 bit planes (thresholds), u8 int8 (float64 requantization) and a
    float output; 3 tiles on the interpreter's 2 programs (one runs two, reusing its ring);
    image values on the input quantizer's rounding boundaries."""
    image, weight, bias, g = make_case(3, 33, 33, 64, 7, 31)
    scale = 0.031
    image.view(-1)[:300] = (torch.arange(300) - 150 + 0.5) * scale
    specs = [*specs_for(64, g, (("u2", True), ("u8", True))),
             FloatOutput(torch.rand(64, generator=g, dtype=torch.float64) * 1e-3,
                         torch.randn(64, generator=g, dtype=torch.float64))]
    layouts = (BITPLANE, INT8, INT8)
    geom = ring_geometry(image, weight)
    assert S.default_config(geom, sms=2).kernel == "bands"  # the ring kernel by config
    cfg = S.ring_config(geom, 2, programs_per_sm=1)
    assert (geom.PH, geom.PW, cfg.band_rows) == (9, 9, 9)
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=scale, config=cfg,
                 **RESNET)
    ref = reference(quantize_float(image, scale, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs(got, ref, layouts, specs) == 3


@pytest.mark.parametrize("case", [
    # (id, n, h, w, k, channels_last, pool_pad, config knobs)
    ("nchw_64_two_column_blocks_untransposed", 1, 64, 64, 64, False, 1,
     dict(block_j=16, transposed=False)),
    ("nhwc_35x29_pool0_bands_channel_blocks", 1, 35, 29, 40, True, 0,
     dict(block_j=16, block_n=32, band_rows=3, programs_per_sm=1, fast_requant=False)),
], ids=lambda c: c[0])
def test_uint8_image(case):
    """uint8 pixels through the table: NCHW 64x64 (two column blocks of 14 pooled columns, the
    dot as windows x weights), channels_last 35x29 with pool pad 0, 3 bands on 2 programs,
    40 channels in blocks of 32 and int64 requantization; s2 bit planes by thresholds
    without ReLU, s8 int8."""
    _, n, h, w, k, channels_last, pool_pad, knobs = case
    image, weight, bias, g = uint8_case(n, h, w, k, 41, channels_last)
    table = uint8_input_table(0.019, "s8", MEAN, STD)
    specs = specs_for(k, g, (("s2", False), ("s8", False)))
    layouts = (BITPLANE, INT8)
    geom = ring_geometry(image, weight, pool_pad)
    cfg = S.ring_config(geom, 2, **knobs)
    if case[0].startswith("nchw"):
        assert S.geometry_of(image, weight, 2, 3, 1).PW > cfg.block_j - 2  # two blocks
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, table=table, stride=2, pad=3,
                 pool_pad=pool_pad, config=cfg)
    q = quantize_uint8_image(image, table)
    ref = reference(q, weight, bias, specs, 2, 3, pool_pad)
    assert check_outputs(got, ref, layouts, specs) == 2


def test_bf16_channels_last_and_nonfinite_flag():
    """A bfloat16 channels_last image (even size) in one bound launcher, run twice: finite
    (status stays 0, outputs exact), then with an inf (status 1, tested once per program at
    its end)."""
    image, weight, bias, g = make_case(1, 18, 20, 64, 7, 51, torch.bfloat16)
    image = image.contiguous(memory_format=torch.channels_last)
    specs = specs_for(64, g, (("u2", True),))
    geom = ring_geometry(image, weight)
    out = S.empty_packed(geom.out_shape, "u2", BITPLANE, DEVICE)
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    img_dev = image.to(DEVICE)
    launch = S.bind_stem(img_dev, weight, bias, specs, [out], scale=0.05, status=status,
                         config=S.ring_config(geom, 2), **RESNET)
    assert launch.launches[0].fn is R.stem_ring_kernel and len(launch.launches) == 1
    launch()
    ref = reference(quantize_float(image, 0.05, "s8"), weight, bias, specs, 2, 3, 1)
    assert check_outputs([out], ref, (BITPLANE,), specs) == 1
    assert int(status[0]) == 0
    img_dev[0, 1, 17, 19] = float("inf")
    launch()
    assert int(status[0]) == 1


@pytest.mark.parametrize("c,r,pad,pool_pad,h,w", [(1, 7, 3, 1, 13, 11), (4, 5, 2, 0, 14, 13)],
                         ids=["gray_7x7", "rgba_5x5_pool0"])
def test_other_channels_and_filters(c, r, pad, pool_pad, h, w):
    """1 and 4 channels, a 5x5/2 filter (a 3x3 space-to-depth filter, zero-padded to 4x4)."""
    g = torch.Generator().manual_seed(100 * c + r)
    image = torch.randn(2, c, h, w, generator=g) * 1.5
    weight = torch.randint(-128, 128, (24, r, r, c), generator=g)
    bias = torch.randint(-2000, 2000, (24,), generator=g)
    specs = specs_for(24, g, (("u2", True), ("s8", False)))
    layouts = (BITPLANE, INT8)
    geom = S.geometry_of(image, weight, 2, pad, pool_pad)
    assert R.ring_refusal(geom) is None
    got = S.stem(image.to(DEVICE), weight, bias, specs, layouts, scale=0.04, stride=2, pad=pad,
                 pool_pad=pool_pad, config=S.ring_config(geom, 2))
    ref = reference(quantize_float(image, 0.04, "s8"), weight, bias, specs, 2, pad, pool_pad)
    assert check_outputs(got, ref, layouts, specs) == 2


# ------------------------------------------------------------------------- CPU: host side
def test_ring_weights_reduction_order():
    """The conv computed through the ring kernel's layout (image -> 16-byte space-to-depth
    pixels, windows of 4 x 4 pixels, `ring_weights`) equals `reference.accumulate`."""
    g = torch.Generator().manual_seed(61)
    n, c, h, w, k = 2, 3, 21, 18, 8
    x = torch.randint(-128, 128, (n, c, h, w), generator=g)
    weight = torch.randint(-128, 128, (k, 7, 7, c), generator=g)
    geom = S.StemGeometry(N=n, C=c, H=h, W=w, K=k, R=7, stride=2, pad=3, pool_pad=1)
    ps = -geom.a_min
    # pixel (Y, X) byte (d * 4 + c) * 2 + e = image (2 (Y - PS) + d, 2 (X - PS) + e), c < 4
    xp = F.pad(x, (2 * ps, 2 * ps + 8, 2 * ps, 2 * ps + 8))
    xp = F.pad(xp, (0, 0, 0, 0, 0, 4 - c))  # channels to 4
    hs, ws = geom.OH + 3, geom.OW + 3
    pix = xp[:, :, :2 * hs, :2 * ws].reshape(n, 4, hs, 2, ws, 2).permute(0, 2, 4, 3, 1, 5)
    pix = pix.reshape(n, hs, ws, 16)
    win = pix.unfold(1, 4, 1).unfold(2, 4, 1)  # [n, OH, OW, 16, a, b]
    win = win.permute(0, 1, 2, 4, 5, 3).reshape(n, geom.OH, geom.OW, 256)
    got = win @ R.ring_weights(weight, geom).to(torch.int64).T
    wl = ConvWorkload(N=n, H=h, W=w, C=c, K=k, R=7, S=7, stride=2, pad=3)
    want = accumulate(wl, x.permute(0, 2, 3, 1).contiguous(), weight)
    assert got.shape == want.shape and torch.equal(got, want)
    assert int((R.ring_weights(weight, geom) != 0).sum()) == int((weight != 0).sum())


@pytest.mark.parametrize("prec,relu", [("u2", True), ("s2", False), ("s2", True),
                                       ("u1", False)])
def test_threshold_table_equals_requantization(prec, relu):
    g = torch.Generator().manual_seed(71)
    k = 16
    m = torch.randint(1, 2**31, (k,), generator=g)
    m[0] = 0  # a constant output
    s = torch.randint(20, 40, (k,), generator=g)
    b = torch.randint(-(2**40), 2**40, (k,), generator=g)
    spec = N.Requantized(prec, m, s, b, relu=relu)
    table = threshold_table(spec, k)
    assert table.shape == (k, THRESHOLD_STRIDE) and table.dtype == torch.int32
    y = torch.randint(-(2**31) + 1, 2**31 - 1, (4000, k), generator=g)
    y[:8] = torch.tensor([-(2**31) + 1, 2**31 - 2, 0, -1, 1, 5, -5, 2**20]).view(-1, 1)
    levels = spec.precision.qmax - spec.precision.qmin
    q = spec.precision.qmin + (y[:, :, None] >= table[None, :, :levels]).sum(-1)
    # the netops semantics in exact int64: floor((y m + b + 2^(s-1)) / 2^s), clamped to
    # [max(qmin, 0) with ReLU, qmax]
    want = ((y * m + b + (1 << (s - 1))) >> s).clamp(spec.low, spec.precision.qmax)
    assert torch.equal(q, want)
    assert threshold_table(N.Requantized("u4", m, s, b), k) is None
    assert threshold_table(N.Requantized("u2", torch.full((k,), 2**40), s, b), k) is None


def test_kernel_choice_and_checks():
    resnet = S.StemGeometry(N=256, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3, pool_pad=1)
    assert S.default_config(resnet) == S.StemConfig(band_rows=8, whole_k=True)  # measured
    cfg = S.ring_config(resnet)
    assert cfg.kernel == "ring" and cfg.block_j == 32 and cfg.late_loads
    assert cfg.band_rows == 56  # whole images at batch 256: no row computed twice
    small = S.ring_config(S.StemGeometry(N=8, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3))
    assert small.kernel == "ring" and small.band_rows < 56  # more tiles than images
    for geom, why in [
        (S.StemGeometry(N=1, C=3, H=224, W=224, K=64, R=11, stride=4, pad=2, pool_pad=0),
         "stride 4"),
        (S.StemGeometry(N=1, C=3, H=224, W=224, K=64, R=7, stride=2, pad=3, pool_pad=None),
         "no max-pool"),
        (S.StemGeometry(N=1, C=8, H=32, W=32, K=64, R=7, stride=2, pad=3), "8 channels"),
        (S.StemGeometry(N=1, C=3, H=32, W=32, K=64, R=9, stride=2, pad=4), "more than 8x8"),
    ]:
        assert why in R.ring_refusal(geom)
        assert S.default_config(geom).kernel != "ring"
    image = torch.randn(1, 3, 16, 16, device=DEVICE)
    w = torch.randint(-128, 128, (64, 11, 11, 3))
    spec = specs_for(64, torch.Generator().manual_seed(8), (("u8", True),))
    with pytest.raises(ValueError, match="cannot run this layer: stride 4"):
        S.stem(image, w, None, spec, scale=0.1, stride=4, pad=2, pool_pad=0,
               config=S.StemConfig(kernel="ring"))
    with pytest.raises(ValueError, match="channels_last"):
        S.stem(image.permute(0, 1, 3, 2), w[:, :7, :7], None, spec, scale=0.1, **RESNET)
    with pytest.raises(TypeError, match="uint8, float32"):
        S.stem(image.to(torch.int32), w[:, :7, :7], None, spec, scale=0.1, **RESNET)
    with pytest.raises(ValueError, match="programs_per_sm"):
        S.StemConfig(kernel="ring", programs_per_sm=0)
    with pytest.raises(TypeError, match="config"):
        S.stem(image, w[:, :7, :7], None, spec, scale=0.1, config="ring", **RESNET)


# ------------------------------------------------------------------------- CPU: reference
def test_uint8_lookup_is_the_normalized_float_path():
    """quantize_uint8_image(image, uint8_input_table(...)) == quantize_float(normalize(...))
    for every pixel value of every channel, in NCHW and channels_last memory."""
    image = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 4, 1)  # [2, 3, 4, 256]
    image[1] = image[1].flip(-1)
    for x in (image, image.contiguous(memory_format=torch.channels_last)):
        for scale, prec in ((0.0213, "s8"), (0.05, "u7"), (0.3, "s4")):
            table = uint8_input_table(scale, prec, MEAN, STD)
            want = quantize_float(normalize_uint8_image(x, MEAN, STD), scale, prec)
            got = quantize_uint8_image(x, table)
            assert torch.equal(got, want) and got.is_contiguous()
            assert int(got.unique().numel()) > 8
    with pytest.raises(TypeError, match="uint8"):
        quantize_uint8_image(image.float(), table)
    with pytest.raises(ValueError, match=r"\[3, 256\]"):
        quantize_uint8_image(image, table[:2])
    with pytest.raises(ValueError, match="one value per channel"):
        normalize_uint8_image(image, MEAN[:2], STD)
    with pytest.raises(ValueError, match="std"):
        normalize_uint8_image(image, MEAN, (0.2, 0.0, 0.3))


# ------------------------------------------------------------------------- GPU
def gpu_case(batch, kind, seed):
    """A 224x224 first layer at `batch`: image of `kind` (float32 / float16 / uint8 NCHW /
    uint8 channels_last), the quantized image, the stem's input kwargs."""
    g = torch.Generator().manual_seed(seed)
    if kind.startswith("uint8"):
        image = torch.randint(0, 256, (batch, 3, 224, 224), generator=g, dtype=torch.uint8)
        if kind.endswith("nhwc"):
            image = image.contiguous(memory_format=torch.channels_last)
        table = uint8_input_table(0.02, "s8", MEAN, STD)
        return image, quantize_uint8_image(image, table), dict(table=table), g
    image = (torch.randn(batch, 3, 224, 224, generator=g) * 1.5).to(getattr(torch, kind))
    return image, quantize_float(image, 0.03, "s8"), dict(scale=0.03), g


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [3, 8])
@pytest.mark.parametrize("kind", ["float32", "float16", "uint8", "uint8_nhwc"])
def test_gpu_ring_224(kind, batch):
    image, q, kw, g = gpu_case(batch, kind, 101 + batch)
    weight = torch.randint(-128, 128, (64, 7, 7, 3), generator=g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = [*specs_for(64, g, (("u2", True), ("u8", True))),
             FloatOutput(torch.rand(64, generator=g, dtype=torch.float64) * 1e-3)]
    layouts = (BITPLANE, INT8, INT8)
    cfg = S.ring_config(ring_geometry(image, weight))
    got = S.stem(image.cuda(), weight, bias, specs, layouts, **kw, config=cfg, **RESNET)
    ref = reference(q.cuda(), weight.cuda(), bias.cuda(), specs, 2, 3, 1)
    assert check_outputs(got, [r.cpu() for r in ref], layouts, specs) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["float32", "uint8"])
def test_gpu_ring_batch_256_equals_two_launch_kernel(kind):
    """Batch 256 (whole images per tile, the persistent grid looping): the ring kernel and
    its config variants equal the two-launch "bands" kernel, itself exact at batch 8."""
    image, _, kw, g = gpu_case(256, kind, 111)
    weight = torch.randint(-128, 128, (64, 7, 7, 3), generator=g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = specs_for(64, g, (("u2", True), ("u8", True)))
    image = image.cuda()
    geom = ring_geometry(image, weight)

    def run(cfg):
        outs = [S.empty_packed(geom.out_shape, s.precision, lay, "cuda")
                for s, lay in zip(specs, (BITPLANE, INT8), strict=True)]
        S.bind_stem(image, weight, bias, specs, outs, config=cfg, **kw, **RESNET)()
        return [o.data for o in outs]

    want = run(S.StemConfig(band_rows=8, whole_k=True))
    for cfg in (S.ring_config(geom), S.ring_config(geom, late_loads=False),
                S.ring_config(geom, block_j=64, num_warps=8, transposed=False),
                S.ring_config(geom, band_rows=7, programs_per_sm=3, block_n=32)):
        got = run(cfg)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), cfg


@pytest.mark.gpu
def test_gpu_ring_cuda_graph_replay():
    image, _, _, g = gpu_case(8, "float32", 121)
    weight = torch.randint(-128, 128, (64, 7, 7, 3), generator=g)
    specs = specs_for(64, g, (("u2", True),))
    geom = ring_geometry(image, weight)
    out = S.empty_packed(geom.out_shape, "u2", BITPLANE, "cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    img = image.cuda()
    launch = S.bind_stem(img, weight, None, specs, [out], scale=0.03, status=status,
                         config=S.ring_config(geom), **RESNET)
    img2 = replay_with_new_image(launch, img, out, 122)
    ref = reference(quantize_float(img2, 0.03, "s8"), weight, None, specs, 2, 3, 1)
    assert torch.equal(out.data.cpu(), pack(ref[0], specs[0].precision, BITPLANE))
    assert int(status[0]) == 0
