"""The oracle: exact integer conv/GEMM, the bit-serial formula and the epilogue."""

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import ConvWorkload, Epilogue, GemmWorkload, Precision
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.validate import out_storage
from lowbit.quant.packing import unpack
from lowbit.reference import (
    apply_epilogue,
    bitserial_conv2d,
    bitserial_gemm_values,
    conv2d_int,
    gemm_int,
    random_inputs,
    random_values,
    requant_thresholds,
    requantize,
    run,
)


def _encodings(bits):
    return ["unsigned", "binary"] if bits == 1 else ["unsigned", "signed"]


def _naive_conv(x, w, stride, pad):
    """Direct int64 loop over kernel taps, independent of the reference's code paths."""
    xp = F.pad(x, (0, 0, pad, pad, pad, pad))
    n, hp, wp, _ = xp.shape
    k, r, s, _ = w.shape
    p, q = (hp - r) // stride + 1, (wp - s) // stride + 1
    out = torch.zeros(n, p, q, k, dtype=torch.int64)
    for i, j in itertools.product(range(r), range(s)):
        patch = xp[:, i:i + stride * (p - 1) + 1:stride, j:j + stride * (q - 1) + 1:stride, :]
        out += torch.einsum("npqc,kc->npqk", patch.to(torch.int64), w[:, i, j, :].to(torch.int64))
    return out


CASES = [(wb, ab, we, ae) for wb in range(1, 9) for ab in range(1, 9)
         for we in _encodings(wb) for ae in _encodings(ab)]


@pytest.mark.parametrize("wb,ab,we,ae", CASES)
def test_bitserial_gemm_equals_direct_product(wb, ab, we, ae):
    g = torch.Generator().manual_seed(wb * 100 + ab * 10 + len(we) + len(ae))
    wp, ap = Precision(wb, we), Precision(ab, ae)
    a, b = random_values((5, 71), ap, g), random_values((3, 71), wp, g)
    assert torch.equal(bitserial_gemm_values(a, b, ap, wp), a @ b.T)


@pytest.mark.parametrize("wp,ap", [(Precision(1, "binary"), Precision(1, "binary")),
                                   (Precision(1, "binary"), Precision(2)),
                                   (Precision(3, "signed"), Precision(2)),
                                   (Precision(2), Precision(3, "signed")),
                                   (Precision(1), Precision(4))])
@pytest.mark.parametrize("stride,pad,r", [(1, 1, 3), (2, 3, 3), (2, 0, 1), (1, 2, 5)])
def test_bitserial_conv_equals_direct_with_padding(wp, ap, stride, pad, r):
    g = torch.Generator().manual_seed(stride * 10 + pad + r)
    x, w = random_values((2, 6, 7, 37), ap, g), random_values((4, r, r, 37), wp, g)
    assert torch.equal(bitserial_conv2d(x, w, ap, wp, stride, pad), _naive_conv(x, w, stride, pad))


def _random_conv_shapes(count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        r = rng.randint(1, 7)
        pad = rng.randint(0, 3)
        stride = rng.randint(1, 2)
        h = rng.randint(max(1, r - 2 * pad), r + 6)
        yield (rng.randint(1, 3), h, rng.randint(max(1, r - 2 * pad), r + 6),
               rng.choice([1, 3, 5, 17, 33]), rng.randint(1, 9), r, stride, pad)


@pytest.mark.parametrize("n,h,w_,c,k,r,stride,pad", list(_random_conv_shapes(24, 7)))
def test_conv2d_int_equals_torch_float64_conv(n, h, w_, c, k, r, stride, pad):
    g = torch.Generator().manual_seed(h * 31 + c)
    x = torch.randint(-128, 128, (n, h, w_, c), generator=g)
    w = torch.randint(-128, 128, (k, r, r, c), generator=g)
    ref = F.conv2d(x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(),
                   stride=stride, padding=pad).permute(0, 2, 3, 1).to(torch.int64)
    out = conv2d_int(x, w, stride, pad)
    assert out.dtype == torch.int64 and torch.equal(out, ref)
    assert torch.equal(out, _naive_conv(x, w, stride, pad))


def test_int64_path_is_exact_beyond_float64():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-(2**30), 2**30, (1, 5, 5, 7), generator=g)
    w = torch.randint(-(2**30), 2**30, (2, 3, 3, 7), generator=g)
    assert torch.equal(conv2d_int(x, w, 1, 1), _naive_conv(x, w, 1, 1))
    a, b = x.reshape(5, 35), w.reshape(2, 63)[:, :35]
    assert torch.equal(gemm_int(a, b), a @ b.T)


def test_reference_rejects_bad_operands():
    with pytest.raises(TypeError, match="integer dtype"):
        conv2d_int(torch.ones(1, 3, 3, 2), torch.ones(1, 1, 1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="C=2 channels but w has C=3"):
        conv2d_int(torch.ones(1, 3, 3, 2, dtype=torch.int64),
                   torch.ones(1, 1, 1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="2 dimensions"):
        gemm_int(torch.ones(3, dtype=torch.int64), torch.ones(3, 3, dtype=torch.int64))


def test_requantize_rounds_half_up_and_clamps():
    y = torch.tensor([-3, -2, -1, 1, 2, 3, 100])
    one, s1 = torch.tensor(1), torch.tensor(1)
    # y / 2 rounded half up: -1.5 -> -1, -1 -> -1, -0.5 -> 0, 0.5 -> 1, 1 -> 1, 1.5 -> 2
    assert requantize(y, one, s1, -8, 7).tolist() == [-1, -1, 0, 1, 1, 2, 7]


@settings(max_examples=300, deadline=None)
@given(out=st.sampled_from(["u1", "u2", "s2"]), relu=st.booleans(), bias=st.booleans(),
       cols=st.lists(st.tuples(st.integers(1, 2**31 - 1), st.integers(1, 62),
                               st.integers(-(2**31), 2**31 - 1)), min_size=1, max_size=4),
       ys=st.lists(st.integers(-(2**31) + 2, 2**31 - 2), max_size=8))
def test_thresholds_equal_bias_relu_requantize(out, relu, bias, cols, ys):
    """qmin + #{k : y >= T_k} is the epilogue, for any multiplier, shift and bias, at the
    thresholds themselves, one below them and at random accumulators."""
    epi = Epilogue(bias=bias, relu=relu, out=out, out_layout="bitplane")
    mult, shift, b = (torch.tensor(c, dtype=torch.int32) for c in zip(*cols, strict=True))
    params = EpilogueParams(bias=b if bias else None, multiplier=mult, shift=shift)
    thr = requant_thresholds(epi, params)
    assert thr.shape == (len(cols), epi.out.qmax - epi.out.qmin) and thr.dtype == torch.int32
    lim = 2**31 - 2
    probes = {min(max(v + d, -lim), lim) for v in thr.flatten().tolist() for d in (-1, 0)}
    y = torch.tensor(sorted(probes | set(ys) | {0, -1, 1}), dtype=torch.int64)[:, None]
    yb = y + b.to(torch.int64) if bias else y
    want = requantize(yb.clamp_min(0) if relu else yb, mult, shift, epi.out.qmin, epi.out.qmax)
    got = epi.out.qmin + (y[:, :, None] >= thr.to(torch.int64)[None]).sum(-1)
    assert torch.equal(got, want)


def test_epilogue_order_bias_relu_requant():
    acc = torch.tensor([[10, -10, 3]])
    epi = Epilogue(bias=True, relu=True, out="u2")
    p = EpilogueParams(bias=torch.tensor([-4, 20, -5], dtype=torch.int32),
                       multiplier=torch.tensor([1, 1, 1], dtype=torch.int32),
                       shift=torch.tensor([1, 2, 1], dtype=torch.int32))
    # y = [6, 10, -2] -> relu [6, 10, 0] -> [3, 2.5 -> 3, 0] clamped to u2
    assert apply_epilogue(acc, epi, p).tolist() == [[3, 3, 0]]
    fp = apply_epilogue(acc, Epilogue(out="fp16"),
                        EpilogueParams(scale=torch.tensor([0.5, 0.25, 2.0])))
    assert fp.dtype == torch.float16 and fp.tolist() == [[5.0, -2.5, 6.0]]
    with pytest.raises(OverflowError, match="int32"):
        apply_epilogue(torch.tensor([2**31]), Epilogue(), EpilogueParams())


WORKLOADS = [
    ConvWorkload(N=2, H=7, W=6, C=19, K=5, R=3, S=3, stride=2, pad=1, w="s8", a="u8",
                 epilogue=Epilogue(bias=True, relu=True, out="u4", out_layout="packed")),
    ConvWorkload(N=1, H=5, W=5, C=40, K=3, R=1, S=1, w="b1", a="u2", w_layout="bitplane",
                 a_layout="bitplane", epilogue=Epilogue(relu=True, out="u2",
                                                        out_layout="bitplane")),
    GemmWorkload(M=9, N=7, K=65, w="s4", a="s4", w_layout="packed", a_layout="packed",
                 epilogue=Epilogue(out="fp16")),
    GemmWorkload(M=4, N=6, K=33, w="s8", a="s8", epilogue=Epilogue(bias=True, out="s8")),
]


@pytest.mark.parametrize("wl", WORKLOADS, ids=lambda w: w.key)
def test_run_on_random_inputs(wl):
    x, w, params = random_inputs(wl, seed=5)
    x2, _, _ = random_inputs(wl, seed=6)
    assert not torch.equal(x, x2) and bool(x.ne(0).any()) and bool(w.ne(0).any())
    assert torch.equal(random_inputs(wl, seed=5)[0], x)
    out = run(wl, x, w, params)
    shape, dtype = out_storage(wl)
    assert tuple(out.shape) == shape and out.dtype == dtype
    if wl.epilogue.requantizes:
        prec = wl.epilogue.out
        vals = unpack(out, prec, wl.epilogue.out_layout, wl.K if hasattr(wl, "R") else wl.N)
        # random params spread the outputs over the range rather than clamping them all
        assert len(vals.unique()) >= min(3, prec.qmax - prec.qmin + 1)
    with pytest.raises(TypeError, match="x must have dtype"):
        run(wl, x.to(torch.float32), w, params)
