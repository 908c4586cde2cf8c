"""Triton network-op kernels (lowbit.kernels.triton.netops) bit for bit against
lowbit.reference.netops and lowbit.quant.packing.pack.

CPU: under TRITON_INTERPRET=1 on small odd shapes (C not a multiple of 32, odd H and W, batch
3), every output layout, with poisoned outputs and bound launchers replayed on new inputs.
GPU (`gpu` mark): ResNet-sized shapes.
"""

from __future__ import annotations

import pytest
import torch

from lowbit.core import Layout, PackedTensor, Precision, WidePrecision
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton import pools
from lowbit.kernels.triton import stored as K_stored
from lowbit.quant.packing import pack, unpack
from lowbit.reference import (
    FloatOutput,
    RequantizedOutput,
    avgpool2d_int,
    avgpool_multiplier,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
    quantize_float,
    random_values,
)
from lowbit.reference.netops import round_shift_sum
from triton_cases import DEVICE

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


def packed(values: torch.Tensor, prec: Precision | str, layout: Layout) -> PackedTensor:
    prec = Precision.parse(prec) if isinstance(prec, str) else prec
    return PackedTensor(pack(values, prec, layout).to(DEVICE), tuple(values.shape), prec, layout)


def poisoned(shape, prec, layout) -> PackedTensor:
    t = K.empty_packed(shape, prec, layout, DEVICE)
    t.data.fill_(0x5A if t.data.element_size() == 1 else -12345)
    return t


def assert_stored(out: PackedTensor, values: torch.Tensor) -> None:
    """out's storage equals pack(values) exactly (padding bits included)."""
    ref = pack(values, out.precision, out.layout)
    got = out.data.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got, ref), f"{(got != ref).sum().item()} of {got.numel()} differ"
    assert torch.equal(unpack(got, out.precision, out.layout, out.shape[-1]), values)


def rand(shape, prec, seed):
    return random_values(shape, Precision.parse(prec), torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------- layer epilogue
def epilogue_case(shape, seed, residual_prec=None):
    g = torch.Generator().manual_seed(seed)
    k = shape[-1]
    y = torch.randint(-60000, 60000, shape, generator=g, dtype=torch.int64)
    specs = []
    for prec, relu in (("u8", True), ("s8", False), ("u2", True), ("s3", False), ("u1", True)):
        sa = torch.rand(k, generator=g, dtype=torch.float64) * 3e-3 + 1e-4
        sb = torch.rand(k, generator=g, dtype=torch.float64) * 0.3 + 0.05
        m, r, s = fixed_point_pair(sa, sb)
        specs.append(RequantizedOutput(prec, m, s, r if residual_prec else None, relu))
    res = rand(shape, residual_prec, seed + 1) if residual_prec else None
    return y, specs, res


LAYOUT_MIXES = [(INT8, INT8, BITPLANE, BITPLANE, BITPLANE), (BITPLANE, INT8, INT8, INT8, INT8)]


@pytest.mark.parametrize("residual", [None, ("u8", INT8), ("s8", INT8), ("u4", BITPLANE)])
@pytest.mark.parametrize("layouts", LAYOUT_MIXES, ids=["int8_first", "bitplane_first"])
def test_layer_epilogue_outputs(residual, layouts):
    shape = (3, 5, 7, 45)
    y, specs, res = epilogue_case(shape, 7 + len(layouts), residual and residual[0])
    outs = [poisoned(shape, s.precision, lay) for s, lay in zip(specs, layouts, strict=True)]
    res_t = packed(res, residual[0], residual[1]) if residual else None
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs, res_t)
    assert len(launch.launches) == 2  # five outputs: two launches of up to four
    launch()
    ref = epilogue_outputs(y, None, specs, residual=res)
    for out, values in zip(outs, ref, strict=True):
        assert_stored(out, values)
    assert sum(int(v.unique().numel()) for v in ref) > 20


@pytest.mark.parametrize("tile_values,num_warps", [(2048, 4), (512, 2)])
def test_layer_epilogue_reads_an_int16_accumulator(tile_values, num_warps):
    """A kernel's int16 accumulator (Epilogue(out="int16")): the same outputs as its values
    in int32, over the whole int16 range, at two launch knobs."""
    shape = (4, 3, 5, 38)
    y, specs, res = epilogue_case(shape, 11, "s8")
    y = y.clamp(-(2**15), 2**15 - 1)
    y.view(-1)[:2] = torch.tensor([-(2**15), 2**15 - 1])
    outs = [poisoned(shape, s.precision, lay) for s, lay in zip(specs, LAYOUT_MIXES[0],
                                                                strict=True)]
    launch = K.bind_layer_epilogue(y.to(torch.int16).to(DEVICE), specs, outs,
                                   packed(res, "s8", INT8), y_bound=2**15,
                                   tile_values=tile_values, num_warps=num_warps)
    for bad in (dict(tile_values=3000), dict(num_warps=3)):
        with pytest.raises(ValueError, match="tile_values must be"):
            K.bind_layer_epilogue(y.to(torch.int16).to(DEVICE), specs, outs, **bad)
    launch()
    ref = epilogue_outputs(y, None, specs, residual=res)
    for out, values in zip(outs, ref, strict=True):
        assert_stored(out, values)
    assert len(outs) == 5 and sum(int(v.unique().numel()) for v in ref) > 20


def test_layer_epilogue_bound_launcher_replays_new_inputs():
    shape = (37, 70)
    y, specs, res = epilogue_case(shape, 3, "s8")
    y_dev = y.to(torch.int32).to(DEVICE)
    res_t = packed(res, "s8", INT8)
    outs = [poisoned(shape, s.precision, INT8) for s in specs[:2]]
    launch = K.bind_layer_epilogue(y_dev, specs[:2], outs, res_t)
    checked = 0
    for seed in (4, 5):
        y2, _, res2 = epilogue_case(shape, seed, "s8")
        y_dev.copy_(y2.to(torch.int32))
        res_t.data.copy_(pack(res2, Precision.parse("s8"), INT8))
        launch()
        for out, values in zip(outs, epilogue_outputs(y2, None, specs[:2], res2), strict=True):
            assert_stored(out, values)
            checked += 1
    assert checked == 4


def test_layer_epilogue_float_output_and_plain_call():
    shape = (3, 3, 5, 21)
    g = torch.Generator().manual_seed(9)
    y = torch.randint(-(2**31), 2**31, shape, generator=g, dtype=torch.int64)
    scale = torch.rand(21, generator=g, dtype=torch.float64) * 1e-5
    offset = torch.randn(21, generator=g, dtype=torch.float64)
    m, s = fixed_point_pair(torch.rand(21, generator=g, dtype=torch.float64) * 1e-7 + 1e-9, 0)[
        0::2]
    specs = [FloatOutput(scale, offset), RequantizedOutput("s8", m, s)]
    f, q = K.layer_epilogue(y.to(torch.int32).to(DEVICE), specs, layouts=[INT8, BITPLANE])
    ref_f, ref_q = epilogue_outputs(y, None, specs)
    assert f.dtype == torch.float32 and torch.equal(f.cpu(), ref_f)
    assert isinstance(q, PackedTensor) and q.layout is BITPLANE
    assert_stored(q, ref_q)
    assert int(ref_q.unique().numel()) > 50


def test_layer_epilogue_input_checks():
    y = torch.zeros(4, 40, dtype=torch.int32, device=DEVICE)
    spec = RequantizedOutput("u4", 2**30, 31)
    good = K.empty_packed((4, 40), "u4", BITPLANE, DEVICE)
    with pytest.raises(TypeError, match="y must be an int32"):
        K.bind_layer_epilogue(y.long(), [spec], [good])
    with pytest.raises(ValueError, match="holds u8"):
        K.bind_layer_epilogue(y, [spec], [K.empty_packed((4, 40), "u8", INT8, DEVICE)])
    with pytest.raises(ValueError, match="logical shape"):
        K.bind_layer_epilogue(y, [spec], [K.empty_packed((4, 41), "u4", INT8, DEVICE)])
    with pytest.raises(ValueError, match="no residual"):
        K.bind_layer_epilogue(y, [RequantizedOutput("u4", 5, 3, 1)], [good])
    with pytest.raises(ValueError, match="shift"):
        K.bind_layer_epilogue(y, [RequantizedOutput("u4", 5, 0)], [good])
    with pytest.raises(ValueError, match="same length"):
        K.bind_layer_epilogue(y, [spec, spec], [good])
    with pytest.raises(ValueError, match="data must be"):
        K.bind_layer_epilogue(y, [spec], [PackedTensor(good.data[:1], (4, 40), good.precision,
                                                       BITPLANE)])
    with pytest.raises(ValueError, match="'int8' or 'bitplane'"):
        K.bind_layer_epilogue(y, [spec], [K.empty_packed((4, 40), "u4", "packed", DEVICE)])
    with pytest.raises(ValueError, match="float32 tensor"):
        K.bind_layer_epilogue(y, [FloatOutput(1.0)], [good])


# ------------------------------------------------------------------------- pooling
POOL_CASES = [  # (prec, in layout, out layout, kernel, stride, pad)
    ("u8", INT8, INT8, 3, 2, 1),
    ("s8", INT8, BITPLANE, 3, 2, 1),
    ("u2", BITPLANE, BITPLANE, 2, 2, 0),
    ("s4", BITPLANE, INT8, 3, 1, 1),
    ("b1", BITPLANE, BITPLANE, 3, 2, 1),
    ("s2", BITPLANE, BITPLANE, 3, 2, 1),  # the bit-sliced max, every width and encoding
    ("s3", BITPLANE, BITPLANE, 2, 2, 0),
    ("s4", BITPLANE, BITPLANE, 3, 1, 1),
    ("u3", BITPLANE, BITPLANE, 3, 2, 1),
    ("u4", BITPLANE, BITPLANE, 3, 2, 0),
    ("u1", BITPLANE, BITPLANE, 2, 2, 0),
    ("s6", BITPLANE, BITPLANE, 3, 2, 1),  # > 4 planes: through values
]


@pytest.mark.parametrize("prec,lin,lout,kernel,stride,pad", POOL_CASES)
def test_maxpool(prec, lin, lout, kernel, stride, pad):
    x = rand((3, 9, 11, 45 if prec != "u3" else 70), prec, kernel + stride)
    ref = maxpool2d_int(x, kernel, stride, pad)
    out = poisoned(ref.shape, prec, lout)
    K.bind_maxpool2d(packed(x, prec, lin), out, kernel, stride, pad)()
    assert_stored(out, ref)


@pytest.mark.parametrize("prec,lin,lout", [("u8", INT8, INT8), ("s2", BITPLANE, BITPLANE)])
def test_maxpool_ceil_mode(prec, lin, lout):
    """ceil_mode (SqueezeNet's and GoogLeNet's pools): the last row and column of windows
    reach past the map, whose taps count as padding."""
    x = rand((3, 13, 12, 45), prec, 5)
    ref = maxpool2d_int(x, 3, 2, 0, ceil=True)
    assert ref.shape[1:3] == (6, 6) and maxpool2d_int(x, 3, 2, 0).shape[1:3] == (6, 5)
    out = poisoned(ref.shape, prec, lout)
    K.bind_maxpool2d(packed(x, prec, lin), out, 3, 2, 0, ceil=True)()
    assert_stored(out, ref)


@pytest.mark.parametrize("prec,lin,lout,kernel,stride,pad", POOL_CASES[:4])
def test_avgpool(prec, lin, lout, kernel, stride, pad):
    x = rand((3, 9, 11, 45), prec, kernel * stride)
    out_prec = "s8" if prec.startswith("s") else "u4"
    top_in, top_out = Precision.parse(prec).qmax, Precision.parse(out_prec).qmax
    m, s = avgpool_multiplier(kernel * kernel, 1.0, 0.6 * top_in / top_out)
    ref = avgpool2d_int(x, kernel, stride, pad, m, s, out_prec)
    out = poisoned(ref.shape, Precision.parse(out_prec), lout)
    K.bind_avgpool2d(packed(x, prec, lin), out, kernel, stride, pad, m, s)()
    assert_stored(out, ref)
    assert int(ref.unique().numel()) > 3


@pytest.mark.parametrize("programs", [1024, 0], ids=["reduction", "window_loop"])
@pytest.mark.parametrize("lin,lout", [(INT8, INT8), (BITPLANE, INT8), (INT8, BITPLANE)])
def test_global_avgpool(lin, lout, programs, monkeypatch):
    monkeypatch.setattr(pools, "GLOBAL_POOL_PROGRAMS", programs)  # each of the two kernels
    prec = "u8" if lin is INT8 else "u3"
    checked = 0
    for shape in ((3, 7, 5, 70), (2, 9, 11, 40)):  # one tile of the map, and two
        x = rand(shape, prec, 5 + shape[1])
        m, s = avgpool_multiplier(shape[1] * shape[2], 0.05, 0.04)
        ref = avgpool2d_int(x, None, None, 0, m, s, "s8")
        out = K.avgpool2d(packed(x, prec, lin), None, None, 0, m, s, "s8", lout)
        assert out.shape == (shape[0], 1, 1, shape[3])
        assert_stored(out, ref)
        checked += 1
    assert checked == 2


def test_pool_plain_call_and_checks():
    x = packed(rand((3, 7, 9, 33), "u2", 1), "u2", BITPLANE)
    out = K.maxpool2d(x, 3, 2, 1)
    assert out.layout is BITPLANE
    assert_stored(out, maxpool2d_int(unpack(x.data.cpu(), x.precision, BITPLANE, 33), 3, 2, 1))
    with pytest.raises(ValueError, match="x's precision"):
        K.bind_maxpool2d(x, K.empty_packed(out.shape, "u3", BITPLANE, DEVICE), 3, 2, 1)
    with pytest.raises(ValueError, match="logical shape"):
        K.bind_maxpool2d(x, K.empty_packed((3, 4, 4, 33), "u2", BITPLANE, DEVICE), 3, 2, 1)
    with pytest.raises(ValueError, match="pad"):
        K.maxpool2d(x, 3, 2, 2)
    with pytest.raises(ValueError, match="shift"):
        K.avgpool2d(x, 3, 2, 1, 5, 0, "u4")
    with pytest.raises(TypeError, match="PackedTensor"):
        K.maxpool2d(x.data, 3, 2, 1)


# ------------------------------------------------------------------------- float image
IMAGE_CASES = [(torch.float32, "s8", INT8), (torch.float16, "s8", BITPLANE),
               (torch.bfloat16, "u4", BITPLANE), (torch.float32, "b1", BITPLANE),
               (torch.float32, "u8", INT8)]


@pytest.mark.parametrize("dtype,prec,layout", IMAGE_CASES)
def test_quantize_image(dtype, prec, layout):
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(3, 37, 7, 9, generator=g) * 3).to(dtype)
    scale = 0.0473
    # values exactly on rounding boundaries: x / scale = k + 0.5 in float32
    x.view(-1)[:64] = ((torch.arange(64) - 32 + 0.5) * scale).to(dtype)
    out = poisoned((3, 7, 9, 37), Precision.parse(prec), layout)
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    K.bind_quantize_image(x.to(DEVICE), scale, out, status)()
    ref = quantize_float(x, scale, prec).permute(0, 2, 3, 1)
    assert_stored(out, ref)
    assert int(status[0]) == 0


def test_quantize_image_flags_nonfinite_and_checks():
    x = torch.randn(1, 3, 5, 5)
    x[0, 1, 2, 3] = float("nan")
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    K.bind_quantize_image(x.to(DEVICE), 0.1, K.empty_packed((1, 5, 5, 3), "s8", INT8, DEVICE),
                          status)()
    assert int(status[0]) == 1
    with pytest.raises(TypeError, match="float32, float16"):
        K.quantize_image(x.double(), 0.1, "s8")
    with pytest.raises(ValueError, match="scale"):
        K.quantize_image(x, 0.0, "s8")
    with pytest.raises(ValueError, match="NCHW"):
        K.quantize_image(x[0], 0.1, "s8")


# ------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("layout", [INT8, BITPLANE])
def test_gpu_resnet_shapes(layout):
    # ResNet-50 stage-4 block end: y [8, 7, 7, 2048] + u8 residual -> u8 wide, u2 bit planes
    shape = (8, 7, 7, 2048)
    y, specs, res = epilogue_case(shape, 21, "u8")
    outs = [K.empty_packed(shape, s.precision, layout, DEVICE) for s in specs]
    K.bind_layer_epilogue(y.to(torch.int32).cuda(), specs, outs, packed(res, "u8", INT8))()
    for out, values in zip(outs, epilogue_outputs(y, None, specs, res), strict=True):
        assert_stored(out, values)
    # stem max-pool 112 -> 56 and the global average pool before the classifier
    x = rand((8, 112, 112, 64), "u8" if layout is INT8 else "u2", 22)
    prec = "u8" if layout is INT8 else "u2"
    assert_stored(K.maxpool2d(packed(x, prec, layout), 3, 2, 1), maxpool2d_int(x, 3, 2, 1))
    m, s = avgpool_multiplier(49, 0.05, 0.04)
    x7 = rand((8, 7, 7, 2048), prec, 23)
    assert_stored(K.avgpool2d(packed(x7, prec, layout), None, None, 0, m, s, "s8", INT8),
                  avgpool2d_int(x7, None, None, 0, m, s, "s8"))
    img = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(24))
    assert_stored(K.quantize_image(img.cuda(), 0.02, "s8", layout),
                  quantize_float(img, 0.02, "s8").permute(0, 2, 3, 1))


# ------------------------------------------------------------------------- engine extensions
S16, S24 = WidePrecision(16), WidePrecision(24)


def wide_packed(values: torch.Tensor, prec) -> PackedTensor:
    data = values.to(K_stored.stored_dtype(prec, INT8)).to(DEVICE)
    return PackedTensor(data, tuple(values.shape), prec, INT8)


def stored_values(out: PackedTensor) -> torch.Tensor:
    if K_stored.is_wide(out.precision):
        return out.data.cpu().to(torch.int64)
    return unpack(out.data.cpu(), out.precision, out.layout, out.shape[-1])


def shifted_oracle(y, spec, res):
    """clamp(floor((y m + b + res r + 2^(s-1)) / 2^s)) exactly (reference round_shift_sum)."""
    k = y.shape[-1]
    m = torch.as_tensor(spec.multiplier).to(torch.int64).expand(k)
    b = torch.as_tensor(0 if spec.bias is None else spec.bias).to(torch.int64).expand(k)
    terms = [y * m, b.expand_as(y)]
    if spec.residual_multiplier is not None:
        terms.append(res * torch.as_tensor(spec.residual_multiplier).to(torch.int64).expand(k))
    s = torch.as_tensor(spec.shift).to(torch.int64).expand(k)
    return round_shift_sum(terms, s).clamp(spec.low, spec.precision.qmax)


MODE_CASES = {  # mode: (|y| <, whether two channels' b are near 2^62)
    K.FAST: (2**20, False),
    K.DIRECT: (2**31, False),
    K.SPLIT: (2**31, True),
}


@pytest.mark.parametrize("mode", sorted(MODE_CASES), ids=["direct", "split", "fast"])
def test_layer_epilogue_shifted_bias_exact_modes(mode):
    """Each output's bias at its shift (b), 8-bit, bit-plane and wide outputs, in each of the
    three exact ways of computing them (forced through the terms' magnitudes)."""
    y_top, huge_b = MODE_CASES[mode]
    g = torch.Generator().manual_seed(40 + mode)
    shape = (3, 5, 7, 45)
    k = shape[-1]
    y = torch.randint(-y_top + 1, y_top, shape, generator=g, dtype=torch.int64)
    y.view(-1)[:4] = torch.tensor([y_top - 1, -y_top + 1, 0, 1])
    specs, layouts = [], []
    for prec, relu, layout in (("u8", True, INT8), ("s8", False, BITPLANE), (S16, False, INT8),
                               ("u2", True, BITPLANE), (S24, True, INT8)):
        p = Precision.parse(prec) if isinstance(prec, str) else prec
        ratio = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * p.qmax / y_top
        m, _, s = fixed_point_pair(ratio, 0.0)
        # b within a few output steps (2^s each), both signs
        b = (torch.rand(k, generator=g, dtype=torch.float64) * 6 - 3) * torch.pow(2.0, s)
        b = b.clamp(-(2.0**61), 2.0**61).to(torch.int64)
        if huge_b:  # y m + b may pass 2^63
            b[:2] = torch.tensor([2**62 - 1, -(2**62) + 1])
            m[0] = 2**31 - 1
        specs.append(K.Requantized(p, m, s, b, relu=relu))
        layouts.append(layout)
    modes = [K.requant_mode(sp, k, y_top, 0) for sp in specs]
    assert modes.count(mode) >= 3, modes
    outs = [poisoned(shape, sp.precision, lay) if not K_stored.is_wide(sp.precision) else
            K.empty_packed(shape, sp.precision, INT8, DEVICE) for sp, lay in zip(
                specs, layouts, strict=True)]
    K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs, y_bound=y_top)()
    checked = 0
    for out, sp in zip(outs, specs, strict=True):
        want = shifted_oracle(y, sp, None)
        assert torch.equal(stored_values(out), want), sp.precision
        if not K_stored.is_wide(sp.precision):
            assert_stored(out, want)
        checked += int(want.unique().numel() > 2)
    assert checked >= 4


def test_layer_epilogue_float64_sum_with_a_residual():
    """FAST with a residual term: where |y| m + |res| |r| + |b| + 2^(s-1) < 2^53 the pass
    sums y (m 2^-s) + res (r 2^-s) + b 2^-s + 0.5 in float64, exactly: half-way sums (m = r =
    2^(s-1)), both signs, a 24-bit residual, int16 and int32 y; with r 2^10 times larger the
    sum passes 2^53 and comes from the int64 sum (DIRECT), still equal to the oracle."""
    g = torch.Generator().manual_seed(60)
    shape = (2, 4, 5, 40)
    k = shape[-1]
    y = torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int64)
    res = torch.randint(S24.qmin, S24.qmax + 1, shape, generator=g, dtype=torch.int64)
    y.view(-1)[:4] = torch.tensor([2**15 - 1, -(2**15), 3, -3])
    res.view(-1)[:4] = torch.tensor([S24.qmax, S24.qmin, -4, 4])
    half = K.Requantized(S24, 2**19, 20, None, 2**19, relu=False)  # (y + res) / 2, ties up
    m = torch.randint(2**28, 2**29, (k,), generator=g)
    r = torch.randint(2**27, 2**28, (k,), generator=g)  # 2^23 r < 2^51
    b = torch.randint(-(2**45), 2**45, (k,), generator=g)
    specs = [half, K.Requantized("u2", m, 48, b, r, relu=True), K.Requantized(S16, m, 34, b, r),
             K.Requantized("s8", m << 1, 1, None, r, relu=False)]  # floors far past int32
    narrow = [K.fits_int32(torch.as_tensor(sp.multiplier).expand(k), torch.as_tensor(
        sp.residual_multiplier).expand(k), torch.as_tensor(0 if sp.bias is None else sp.bias)
        .expand(k), torch.full((k,), sp.shift) if isinstance(sp.shift, int) else
        torch.as_tensor(sp.shift).expand(k), 2**15, 2**23) for sp in specs]
    assert narrow == [True, True, True, False], narrow  # FAST_NARROW, and FAST's float clamp
    checked = 0
    for y_dtype, r_extra in ((torch.int16, 1), (torch.int32, 1), (torch.int16, 2**10)):
        run = [K.Requantized(sp.precision, sp.multiplier, sp.shift, sp.bias,
                             sp.residual_multiplier * r_extra, relu=sp.relu) for sp in specs]
        modes = [K.requant_mode(sp, k, 2**15, 2**23) for sp in run]
        assert modes[:3] == [K.FAST] * 3 if r_extra == 1 else modes[1:3] == [K.DIRECT] * 2, \
            modes
        outs = [K.empty_packed(shape, S24, INT8, DEVICE), poisoned(shape, "u2", BITPLANE),
                K.empty_packed(shape, S16, INT8, DEVICE), poisoned(shape, "s8", INT8)]
        K.bind_layer_epilogue(y.to(y_dtype).to(DEVICE), run, outs, wide_packed(res, S24),
                              y_bound=2**15)()
        for out, sp in zip(outs, run, strict=True):
            want = shifted_oracle(y, sp, res)
            assert torch.equal(stored_values(out), want), (sp.precision, y_dtype, r_extra)
            checked += int(want.unique().numel() > 2)
    assert checked >= 7


@pytest.mark.parametrize("res_prec", [S16, S24, "u4"], ids=["s16", "s24", "u4_planes"])
def test_layer_epilogue_wide_residual_and_float_outputs(res_prec):
    """A 16 / 24-bit residual (or a bit-plane one) into requantized outputs with their own
    shifted bias, and float outputs with the residual term, ReLU, NCHW and NHWC."""
    g = torch.Generator().manual_seed(50)
    shape = (2, 3, 5, 37)
    k = shape[-1]
    y = torch.randint(-(2**24), 2**24, shape, generator=g, dtype=torch.int64)
    if isinstance(res_prec, str):
        rp = Precision.parse(res_prec)
        res = rand(shape, res_prec, 51)
        res_t = packed(res, rp, BITPLANE)
    else:
        rp = res_prec
        res = torch.randint(rp.qmin, rp.qmax + 1, shape, generator=g, dtype=torch.int64)
        res_t = wide_packed(res, rp)
    sa = torch.rand(k, generator=g, dtype=torch.float64) * 1e-6 + 1e-7
    sb = torch.rand(k, generator=g, dtype=torch.float64) * 8.0 / max(rp.qmax, 1)
    m, r, s = fixed_point_pair(sa, sb)
    b = torch.randint(-(2**40), 2**40, (k,), generator=g, dtype=torch.int64)
    specs = [K.Requantized("u8", m, s, b, r, relu=True), K.Requantized(S16, m, s, b, r),
             K.Requantized("s4", m, s, None, r)]
    scale = torch.rand(k, generator=g, dtype=torch.float64) * 1e-6
    offset = torch.randn(k, generator=g, dtype=torch.float64)
    fspecs = [K.Dequantized(scale, offset, 0.37, relu=True, channels_first=True),
              K.Dequantized(scale, offset, 0.37)]
    outs = [K.empty_packed(shape, "u8", INT8, DEVICE), K.empty_packed(shape, S16, INT8, DEVICE),
            poisoned(shape, "s4", BITPLANE),
            torch.full((2, k, 3, 5), float("nan"), device=DEVICE),
            torch.full(shape, float("nan"), device=DEVICE)]
    K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs + fspecs, outs, res_t,
                          y_bound=2**24)()
    for out, sp in zip(outs[:3], specs, strict=True):
        assert torch.equal(stored_values(out), shifted_oracle(y, sp, res))
    f = (y.double() * scale + offset + res.double() * 0.37).float()
    assert torch.equal(outs[3].cpu(), f.clamp_min(0).permute(0, 3, 1, 2))
    assert torch.equal(outs[4].cpu(), f)
    assert int((f < 0).sum()) > 10 and int((f > 0).sum()) > 10


def test_window_avgpool_adaptive_relu_wide():
    """Adaptive windows (uneven, several divisors) of a 16-bit wide input, requantized per
    divisor with ReLU into bit planes; and a padded window pool with ReLU into a wide s16."""
    from lowbit.graph.pools import ADAPTIVE, WINDOW, axis_windows, window_counts
    from lowbit.runtime.engine import window_sums

    g = torch.Generator().manual_seed(60)
    x = torch.randint(S16.qmin, S16.qmax + 1, (3, 7, 9, 40), generator=g, dtype=torch.int64)
    checked = 0
    for mode, args, out_prec, layout in (
            (ADAPTIVE, dict(output_hw=(4, 5)), Precision.parse("u4"), BITPLANE),
            (ADAPTIVE, dict(output_hw=(5, 6)), Precision.parse("s8"), INT8),
            (WINDOW, dict(kernel=3, stride=2, pad=1), S16, INT8)):
        hw = args.get("output_hw", (None, None))
        axis = {k: v for k, v in args.items() if k != "output_hw"}
        rows = axis_windows(7, mode, out=hw[0], **axis)
        cols = axis_windows(9, mode, out=hw[1], **axis)
        counts = sorted({r[2] * c[2] for r in rows for c in cols})
        pairs = [avgpool_multiplier(c, 1.0, 50.0 * c ** 0.5) for c in counts]
        mult = torch.stack([p[0] for p in pairs])
        shift = torch.stack([p[1] for p in pairs])
        out = K.empty_packed((3, len(rows), len(cols), 40), out_prec, layout, DEVICE)
        K.bind_avgpool_windows(wide_packed(x, S16), out, rows, cols, counts, mult, shift,
                               relu=True)()
        sums = window_sums(x, rows, cols)
        count = torch.tensor([r[2] for r in rows]).view(-1, 1) * torch.tensor(
            [c[2] for c in cols]).view(1, -1)
        want = torch.empty_like(sums)
        for i, c in enumerate(counts):
            sel = count == c
            want[:, sel] = round_shift_sum([sums[:, sel] * mult[i]], shift[i].expand(40)
                                           ).clamp(0, out_prec.qmax)
        assert torch.equal(stored_values(out), want)
        assert tuple(counts) == window_counts(7, 9, mode, **args)
        assert len(counts) > 1 or mode == WINDOW
        checked += int(want.unique().numel() > 3)
    assert checked == 3


@pytest.mark.parametrize("shape,prec,layout,relu", [
    ((5, 37), "u4", BITPLANE, True), ((2, 37, 3, 5), S16, INT8, False),
    ((2, 37, 3, 5), S24, INT8, True), ((5, 37), "b1", BITPLANE, False)])
def test_quantize_relu_2d_and_wide(shape, prec, layout, relu):
    g = torch.Generator().manual_seed(70)
    x = torch.randn(shape, generator=g) * 40
    scale = 0.0173
    x.view(-1)[:16] = (torch.arange(16) - 8 + 0.5) * scale  # rounding ties
    p = Precision.parse(prec) if isinstance(prec, str) else prec
    nhwc = tuple(x.permute(0, 2, 3, 1).shape) if x.dim() == 4 else shape
    out = K.empty_packed(nhwc, p, layout, DEVICE)
    K.bind_quantize(x.to(DEVICE), scale, out, relu=relu)()
    xr = (x.clamp_min(0) if relu else x)
    xr = xr.permute(0, 2, 3, 1) if x.dim() == 4 else xr
    if K_stored.is_wide(p):
        want = torch.floor(xr / torch.tensor(scale, dtype=torch.float32) + 0.5).clamp(
            p.qmin, p.qmax).to(torch.int64)
    else:
        want = quantize_float(xr, scale, p)
    assert torch.equal(stored_values(out), want)
    assert int(want.unique().numel()) >= min(3, p.qmax - p.qmin)


def test_int32_maxpool_and_wide_checks():
    """Max-pool of int32 accumulators (WidePrecision(32)): what a layer's fused pool runs
    before its epilogue."""
    i32 = WidePrecision(32)
    g = torch.Generator().manual_seed(80)
    x = torch.randint(-(2**31) + 1, 2**31 - 1, (2, 7, 9, 40), generator=g, dtype=torch.int64)
    out = K.empty_packed((2, 4, 5, 40), i32, INT8, DEVICE)
    K.bind_maxpool2d(wide_packed(x, i32), out, 3, 2, 1)()
    assert torch.equal(stored_values(out), maxpool2d_int(x, 3, 2, 1))
    with pytest.raises(ValueError, match="one value per element"):
        K.empty_packed((2, 40), S16, BITPLANE, DEVICE)
    with pytest.raises(ValueError, match="bits must be"):
        WidePrecision(40)
    with pytest.raises(ValueError, match="sum past int32"):
        K.bind_avgpool_windows(wide_packed(x, i32), out, [(0, 3, 3)] * 4, [(0, 3, 3)] * 5,
                               [9], [1], [1])
