"""The exact integer network ops (lowbit.reference.netops) against float PyTorch ops and a
straightforward Python-int implementation."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import Precision
from lowbit.quant.quantize import fixed_point, quantize
from lowbit.reference import (
    FloatOutput,
    Int32Output,
    RequantizedOutput,
    avgpool2d_int,
    avgpool_multiplier,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
    pool_output_size,
    quantize_float,
    requantize,
    requantize_int,
    uint8_input_table,
)
from lowbit.reference.netops import fixed_point_pair32, requant32_fits, round_shift_sum


def _rand(shape, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64)


def _py_requant(z: int, s: int, lo: int, hi: int) -> int:
    """floor((z + 2^(s-1)) / 2^s) clamped, in Python integers (unbounded)."""
    return min(max((z + (1 << (s - 1))) >> s, lo), hi)


# ------------------------------------------------------------------------ fixed point
def test_fixed_point_pair_bounds_and_accuracy():
    g = torch.Generator().manual_seed(1)
    a = torch.exp(torch.randn(64, generator=g, dtype=torch.float64) * 8)
    b = torch.exp(torch.randn(64, generator=g, dtype=torch.float64) * 8)
    b[::7] = 0.0
    m_a, m_b, s = fixed_point_pair(a, b)
    assert m_a.dtype == m_b.dtype == s.dtype == torch.int64
    assert bool(((m_a >= 0) & (m_a < 2**31) & (m_b >= 0) & (m_b < 2**31)).all())
    assert bool(((s >= 1) & (s <= 62)).all())
    step = torch.pow(2.0, -s.double())
    for scale, m in ((a, m_a), (b, m_b)):
        # the larger of the pair: relative error <= 2^-31; the smaller: half a step
        err = (m.double() * step - scale).abs()
        assert bool((err <= torch.maximum(scale * 2.0**-30, step / 2)).all())
    top = torch.maximum(a, b)
    m_top, s_top = fixed_point(top)
    assert torch.equal(torch.maximum(m_a, m_b), m_top.to(torch.int64))
    assert torch.equal(s, s_top.to(torch.int64))
    assert bool((m_b[::7] == 0).all())


def test_fixed_point_pair_scalar_b_and_errors():
    m_a, m_b, s = fixed_point_pair(torch.tensor([0.01, 0.02, 3.0]), 0.5)
    assert m_a.shape == m_b.shape == s.shape == (3,)
    with pytest.raises(ValueError, match="scale_a"):
        fixed_point_pair(torch.tensor([0.0, 1.0]), 0.5)
    with pytest.raises(ValueError, match="scale_b"):
        fixed_point_pair(1.0, float("nan"))
    with pytest.raises(ValueError, match="same length"):
        fixed_point_pair(torch.ones(3), torch.ones(2))


# ------------------------------------------------------------------------ epilogue
@settings(max_examples=300, deadline=None)
@given(y=st.integers(-(2**32) + 1, 2**32 - 1), m=st.integers(0, 2**31 - 1),
       res=st.integers(-255, 255), r=st.integers(-(2**31) + 1, 2**31 - 1),
       s=st.integers(1, 62))
def test_round_shift_sum_exact_at_the_bounds(y, m, res, r, s):
    got = round_shift_sum([torch.tensor([y * m]), torch.tensor([res * r])], torch.tensor([s]))
    assert int(got) == (y * m + res * r + (1 << (s - 1))) >> s


def _py_epilogue(acc, bias, res, out: RequantizedOutput):
    k = acc.shape[-1]
    mult = out.multiplier.tolist()
    shift = out.shift.tolist()
    rmul = out.residual_multiplier.tolist() if out.residual_multiplier is not None else [0] * k
    flat = acc.reshape(-1, k).tolist()
    rflat = res.reshape(-1, k).tolist() if res is not None else [[0] * k] * len(flat)
    rows = []
    for row, rrow in zip(flat, rflat, strict=True):
        rows.append([_py_requant((row[c] + bias[c]) * mult[c] + rrow[c] * rmul[c], shift[c],
                                 out.low, out.precision.qmax) for c in range(k)])
    return torch.tensor(rows, dtype=torch.int64).reshape(acc.shape)


def _outputs(k, seed, with_residual):
    g = torch.Generator().manual_seed(seed)
    specs = []
    for prec, relu in (("u8", True), ("s8", False), ("u2", True), ("s3", False), ("u4", False)):
        scale_a = torch.rand(k, generator=g, dtype=torch.float64) * 2e-3 + 1e-4
        scale_b = torch.rand(k, generator=g, dtype=torch.float64) * 0.2 + 0.05
        m, r, s = fixed_point_pair(scale_a, scale_b)
        specs.append(RequantizedOutput(Precision.parse(prec), m, s,
                                       r if with_residual else None, relu))
    return specs


@pytest.mark.parametrize("shape", [(3, 5, 7, 37), (2, 1, 1, 5), (11, 33)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_epilogue_outputs_equal_python_ints(shape, with_residual):
    seed = sum(shape) + with_residual
    k = shape[-1]
    acc = _rand(shape, -40000, 40000, seed)
    bias = _rand((k,), -5000, 5000, seed + 1)
    res = _rand(shape, -128, 255, seed + 2) if with_residual else None
    specs = _outputs(k, seed + 3, with_residual)
    got = epilogue_outputs(acc, bias, specs, residual=res)
    assert len(got) == len(specs) == 5
    spread = 0
    for q, spec in zip(got, specs, strict=True):
        assert q.dtype == torch.int64 and q.shape == acc.shape
        assert torch.equal(q, _py_epilogue(acc, bias.tolist(), res, spec))
        spread += int(q.unique().numel())
    assert spread > 20  # outputs not all clamped


def test_epilogue_outputs_within_half_a_step_of_float_math():
    shape, k = (4, 9, 7, 19), 19
    acc = _rand(shape, -30000, 30000, 5)
    bias = _rand((k,), -3000, 3000, 6)
    res = _rand(shape, 0, 255, 7)
    g = torch.Generator().manual_seed(8)
    scale_a = torch.rand(k, generator=g, dtype=torch.float64) * 4e-3 + 1e-4
    scale_b = torch.rand(k, generator=g, dtype=torch.float64) * 0.5 + 0.1
    m, r, s = fixed_point_pair(scale_a, scale_b)
    (q,) = epilogue_outputs(acc, bias, [RequantizedOutput("s8", m, s, r, relu=True)], res)
    exact = (acc + bias).double() * scale_a + res.double() * scale_b
    inside = (exact > 0) & (exact < 127)
    assert int(inside.sum()) > acc.numel() // 4
    assert float((q.double() - exact)[inside].abs().max()) <= 0.5 + 1e-6
    assert bool((q[exact <= 0] == 0).all()) and bool((q[exact >= 127.5] == 127).all())


@pytest.mark.parametrize("prec,relu", [("u8", True), ("s8", True), ("s4", False), ("u1", True)])
def test_single_output_equals_requantize_of_relu(prec, relu):
    k = 23
    acc = _rand((5, 6, 7, k), -(2**31), 2**31 - 1, 11)  # the whole int32 accumulator range
    bias = _rand((k,), -(2**31), 2**31 - 1, 12)
    g = torch.Generator().manual_seed(13)
    m, s = fixed_point(torch.rand(k, generator=g, dtype=torch.float64) * 1e-8 + 1e-10)
    p = Precision.parse(prec)
    (q,) = epilogue_outputs(acc, bias, [RequantizedOutput(p, m, s, relu=relu)])
    y = acc + bias
    expect = requantize(y.clamp_min(0) if relu else y, m, s, p.qmin, p.qmax)
    assert torch.equal(q, expect)
    assert int(q.unique().numel()) > 1


def test_int32_and_float_outputs():
    k = 13
    acc = _rand((6, 5, k), -(2**20), 2**20, 21)
    bias = _rand((k,), -1000, 1000, 22)
    scale = torch.rand(k, dtype=torch.float64) * 1e-3
    offset = torch.randn(k, dtype=torch.float64)
    i32, i32r, f = epilogue_outputs(acc, bias, [Int32Output(), Int32Output(relu=True),
                                                FloatOutput(scale, offset)])
    y = acc + bias
    assert i32.dtype == torch.int32 and torch.equal(i32.to(torch.int64), y)
    assert torch.equal(i32r.to(torch.int64), y.clamp_min(0))
    assert f.dtype == torch.float32
    assert torch.equal(f, (y.double() * scale + offset).float())
    (f0,) = epilogue_outputs(acc, None, [FloatOutput(scale)])
    assert torch.equal(f0, (acc.double() * scale).float())
    with pytest.raises(ValueError, match="int32"):
        epilogue_outputs(torch.tensor([[2**31 - 1]]), torch.tensor([5]), [Int32Output()])


def test_epilogue_input_checks():
    acc = torch.zeros(2, 3, dtype=torch.int64) + 5
    ok = RequantizedOutput("u8", 2**30, 31)
    with pytest.raises(TypeError, match="acc"):
        epilogue_outputs(acc.float(), None, [ok])
    with pytest.raises(ValueError, match="acc \\+ bias"):
        epilogue_outputs(acc + 2**32, None, [ok])
    with pytest.raises(ValueError, match="bias"):
        epilogue_outputs(acc, torch.ones(4, dtype=torch.int64), [ok])
    with pytest.raises(ValueError, match="multiplier"):
        epilogue_outputs(acc, None, [RequantizedOutput("u8", 2**31, 31)])
    with pytest.raises(ValueError, match="shift"):
        epilogue_outputs(acc, None, [RequantizedOutput("u8", 5, 63)])
    with pytest.raises(ValueError, match="no residual"):
        epilogue_outputs(acc, None, [RequantizedOutput("u8", 5, 3, residual_multiplier=1)])
    with pytest.raises(ValueError, match="residual must lie"):
        epilogue_outputs(acc, None, [ok], residual=acc + 300)
    with pytest.raises(ValueError, match="residual must have"):
        epilogue_outputs(acc, None, [ok], residual=acc[:1])
    with pytest.raises(ValueError, match="binary"):
        RequantizedOutput("b1", 1, 1)
    with pytest.raises(TypeError, match="outputs\\[0\\]"):
        epilogue_outputs(acc, None, ["u8"])
    with pytest.raises(ValueError, match="non-empty"):
        epilogue_outputs(acc, None, [])
    with pytest.raises(ValueError, match="finite"):
        epilogue_outputs(acc, None, [FloatOutput(torch.full((3,), float("inf")))])


# ------------------------------------------------------------------------ block ends
def _py_derived(acc, bias, res, out: RequantizedOutput):
    """A (derived) output's values from Python integers: the mid value clamped to the formula's
    precision, then its table entry."""
    k = acc.shape[-1]
    vec = [torch.as_tensor(0 if v is None else v).expand(k).tolist()
           for v in (out.multiplier, out.shift, out.bias, out.residual_multiplier)]
    mult, shift, b, rmul = vec
    flat = acc.reshape(-1, k).tolist()
    rflat = res.reshape(-1, k).tolist()
    table = out.table.tolist() if out.table is not None else None
    base = out.mid.qmin if out.mid is not None else 0
    rows = []
    for row, rrow in zip(flat, rflat, strict=True):
        q = [_py_requant((row[c] + bias[c]) * mult[c] + b[c] + rrow[c] * rmul[c], shift[c],
                         out.low, out.high) for c in range(k)]
        rows.append([table[v - base] for v in q] if table is not None else q)
    return torch.tensor(rows, dtype=torch.int64).reshape(acc.shape)


def _block_end_outputs(k, seed, res_top, acc_top, int32):
    """A stored mid (u8, ReLU), a u2 derived from it (a monotone table), an s8 derived at
    another scale through a non-monotone table, and an s8 mid (no ReLU) with a u4 derived
    through a random table: every output with its own shifted bias b."""
    g = torch.Generator().manual_seed(seed)
    ra = torch.rand(k, generator=g, dtype=torch.float64) * 255 / acc_top + 1e-6
    rb = torch.rand(k, generator=g, dtype=torch.float64) * 0.8 + 0.2
    if int32:
        m, r, s = fixed_point_pair32(ra, rb, acc_top, res_top, bias_steps=3.0)
    else:
        m, r, s = fixed_point_pair(ra, rb)
    b = (torch.rand(k, generator=g, dtype=torch.float64) * 6 - 3) * torch.pow(2.0, s)
    b = b.to(torch.int64)
    u8 = Precision.parse("u8")
    levels = torch.arange(256)
    wave = ((levels - 128).abs() * 3 - 100).clamp(-128, 127)  # not monotone
    u4_table = torch.randint(0, 16, (256,), generator=g)
    return [RequantizedOutput(u8, m, s, r, True, bias=b),
            RequantizedOutput("u2", m, s, r, True, mid=u8, table=(levels // 50).clamp(0, 3),
                              bias=b),
            RequantizedOutput("s8", m, s, r, True, mid="u8", table=wave, bias=b),
            RequantizedOutput("u4", m, s, r, False, mid="s8", table=u4_table, bias=b)]


@pytest.mark.parametrize("res_prec", ["u8", "s8"])
@pytest.mark.parametrize("int32", [True, False], ids=["requant32", "wide"])
def test_derived_outputs_equal_python_ints(res_prec, int32):
    """Derived outputs (tables over a mid value), the outputs' own shifted bias and an 8-bit
    residual, in 32-bit and 31-bit-multiplier fixed point, against Python integers."""
    shape, k = (3, 5, 4, 21), 21
    acc_top = 2**15
    acc = _rand(shape, -acc_top, acc_top, 40)
    acc.view(-1)[:2] = torch.tensor([acc_top, -acc_top])
    p = Precision.parse(res_prec)
    res = _rand(shape, p.qmin, p.qmax, 41)
    specs = _block_end_outputs(k, 42, max(-p.qmin, p.qmax), acc_top, int32)
    zero = [0] * k
    got = epilogue_outputs(acc, None, specs, residual=res)
    spread = 0
    for q, spec in zip(got, specs, strict=True):
        assert torch.equal(q, _py_derived(acc, zero, res, spec))
        assert int(q.min()) >= spec.precision.qmin and int(q.max()) <= spec.precision.qmax
        spread += int(q.unique().numel() > 2)
        fits = requant32_fits(spec.multiplier, spec.shift, spec.bias, spec.residual_multiplier,
                              acc_top, max(-p.qmin, p.qmax))
        assert fits == int32
    assert spread == len(specs)
    # a derived output is its table over the stored mid value of the same formula
    assert torch.equal(got[1], specs[1].table[got[0]])
    assert torch.equal(got[2], specs[2].table[got[0]])


def test_fixed_point_pair32_is_the_largest_int32_shift():
    g = torch.Generator().manual_seed(50)
    k = 40
    a = torch.exp(torch.randn(k, generator=g, dtype=torch.float64) * 2) * 1e-3
    b = torch.rand(k, generator=g, dtype=torch.float64)
    b[::5] = 0.0
    c = torch.rand(k, generator=g, dtype=torch.float64) * 4
    for acc_top, res_top in ((2**15, 255), (2**20, 128), (300, 0)):
        m_a, m_b, s = fixed_point_pair32(a, b, acc_top, res_top, c)
        assert m_a.dtype == s.dtype == torch.int64 and bool(((s >= 1) & (s <= 31)).all())
        scaled = torch.pow(2.0, s.double())
        assert torch.equal(m_a, torch.round(a * scaled).long())
        assert torch.equal(m_b, torch.round(b * scaled).long())
        total = acc_top * m_a + torch.ceil(c * scaled).long() + res_top * m_b + (1 << (s - 1))
        assert bool((total < 2**31).all())
        assert requant32_fits(m_a, s, torch.ceil(c * scaled).long(), m_b, acc_top, res_top)
        # one more bit of shift would not fit (or the shift is already 31)
        up = torch.pow(2.0, (s + 1).double())
        over = acc_top * torch.round(a * up) + torch.ceil(c * up) + res_top * torch.round(
            b * up) + torch.pow(2.0, s.double())
        assert bool(((over >= 2**31) | (s == 31)).all())
    assert requant32_fits(2**16 - 1, 15, 0, None, 2**15)  # 2^31 - 2^14
    assert not requant32_fits(2**16 - 1, 16, 0, None, 2**15)  # 2^31 exactly
    assert not requant32_fits(2**16 - 1, 15, -(2**14), None, 2**15)  # |b| counts
    assert not requant32_fits(1, 1, 0, 2**20, 1, 2**11)


def test_block_end_bounds_raise():
    u8 = Precision.parse("u8")
    with pytest.raises(ValueError, match="both mid"):
        RequantizedOutput("u2", 5, 3, mid=u8)
    with pytest.raises(ValueError, match="both mid"):
        RequantizedOutput("u2", 5, 3, table=torch.zeros(256, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"length mid\.qmax - mid\.qmin \+ 1 = 256"):
        RequantizedOutput("u2", 5, 3, mid=u8, table=torch.zeros(255, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"table must lie in \[0, 3\]"):
        RequantizedOutput("u2", 5, 3, mid=u8, table=torch.arange(256))
    with pytest.raises(ValueError, match=r"table must lie in \[-8, 7\]"):
        RequantizedOutput("s4", 5, 3, mid="s2", table=[0, 1, 2, 8])
    with pytest.raises(TypeError, match="table must hold integer"):
        RequantizedOutput("u2", 5, 3, mid="u1", table=torch.zeros(2))
    with pytest.raises(ValueError, match="mid cannot be binary"):
        RequantizedOutput("u2", 5, 3, mid="b1", table=[0, 1])
    with pytest.raises(TypeError, match="mid must be a Precision"):
        RequantizedOutput("u2", 5, 3, mid=3, table=[0, 1])
    acc = torch.full((2, 3), 7, dtype=torch.int64)
    with pytest.raises(ValueError, match="bias must lie"):
        epilogue_outputs(acc, None, [RequantizedOutput("u8", 5, 3, bias=2**62)])
    with pytest.raises(ValueError, match="acc_bound must be an int >= 1"):
        fixed_point_pair32(0.1, 0.0, 0)
    with pytest.raises(ValueError, match="res_bound"):
        fixed_point_pair32(0.1, 0.0, 10, -1)
    with pytest.raises(ValueError, match="scale_a"):
        fixed_point_pair32(torch.tensor([0.1, 0.0]), 0.0, 10)
    with pytest.raises(ValueError, match="scale_b"):
        fixed_point_pair32(0.1, -1.0, 10)
    with pytest.raises(ValueError, match="bias_steps"):
        fixed_point_pair32(0.1, 0.0, 10, 0, float("nan"))
    with pytest.raises(ValueError, match="channel 1: no shift"):
        fixed_point_pair32(torch.tensor([1e-3, 2.0**20]), 0.0, 2**12)
    with pytest.raises(ValueError, match="one length"):
        fixed_point_pair32(torch.ones(3) * 1e-3, torch.ones(2), 10)
    with pytest.raises(ValueError, match="shift must lie"):
        requant32_fits(1, 0, 0, None, 10)
    with pytest.raises(ValueError, match="one length"):
        requant32_fits(torch.ones(3, dtype=torch.int64), torch.ones(2, dtype=torch.int64), 0,
                       None, 10)


def test_requantize_int_scalar_and_vector():
    q = _rand((3, 4, 5, 6), -128, 127, 31)
    m, s = fixed_point(torch.tensor([0.3]))
    got = requantize_int(q, int(m), int(s), "s4")
    assert torch.equal(got, requantize(q, m.expand(6), s.expand(6), -8, 7))
    got_relu = requantize_int(q, m.expand(6), s.expand(6), Precision(4), relu=True)
    assert torch.equal(got_relu, requantize(q.clamp_min(0), m.expand(6), s.expand(6), 0, 15))


# ------------------------------------------------------------------------ pooling
POOLS = [(3, 2, 1), (2, 2, 0), (3, 1, 1), (3, 3, 0), (5, 2, 2), (1, 1, 0)]


@pytest.mark.parametrize("hw", [(9, 11), (7, 7), (2, 3), (12, 13)])
def test_maxpool_equals_torch_max_pool2d(hw):
    checked = 0
    for kernel, stride, pad in POOLS:
        if pool_output_size(min(hw), kernel, stride, pad) < 1:
            continue
        q = _rand((3, *hw, 37), -128, 127, kernel * 10 + stride + pad)
        got = maxpool2d_int(q, kernel, stride, pad)
        ref = F.max_pool2d(q.permute(0, 3, 1, 2).double(), kernel, stride, pad)
        assert got.dtype == torch.int64
        assert torch.equal(got, ref.permute(0, 2, 3, 1).to(torch.int64))
        checked += 1
    assert checked >= 4


def test_maxpool_ceil_mode_equals_torch():
    """ceil_mode: one more window where the floor size leaves input elements uncovered, none
    that would start past the input and its left padding (PyTorch's rule), on every map size
    that differs from the floor size and every one that does not."""
    checked = longer = 0
    for (kernel, stride, pad), h, w in itertools.product(POOLS, (5, 6, 7, 12, 13), (7, 8, 9)):
        if pool_output_size(min(h, w), kernel, stride, pad) < 1:
            continue
        q = _rand((2, h, w, 5), -128, 127, h * 31 + w)
        got = maxpool2d_int(q, kernel, stride, pad, ceil=True)
        ref = F.max_pool2d(q.permute(0, 3, 1, 2).double(), kernel, stride, pad, ceil_mode=True)
        assert torch.equal(got, ref.permute(0, 2, 3, 1).to(torch.int64)), (kernel, stride, pad)
        assert got.shape[1] == pool_output_size(h, kernel, stride, pad, ceil=True)
        longer += got.shape[1:3] != maxpool2d_int(q, kernel, stride, pad).shape[1:3]
        checked += 1
    assert checked >= 80 and longer >= 30
    with pytest.raises(TypeError, match="ceil"):
        maxpool2d_int(q, 3, 2, 1, ceil=1)


def _py_avgpool(q, kernel, stride, pad, m, s, prec):
    n, h, w, c = q.shape
    p, qq = pool_output_size(h, kernel, stride, pad), pool_output_size(w, kernel, stride, pad)
    vals = q.tolist()
    out = torch.empty(n, p, qq, c, dtype=torch.int64)
    for b, i, j, ch in itertools.product(range(n), range(p), range(qq), range(c)):
        total = 0
        for di, dj in itertools.product(range(kernel), range(kernel)):
            y, x = i * stride - pad + di, j * stride - pad + dj
            if 0 <= y < h and 0 <= x < w:
                total += vals[b][y][x][ch]
        out[b, i, j, ch] = _py_requant(total * m, s, prec.qmin, prec.qmax)
    return out


@pytest.mark.parametrize("kernel,stride,pad", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_avgpool_equals_python_ints_and_float_math(kernel, stride, pad):
    q = _rand((3, 7, 9, 5), 0, 255, kernel + stride)
    s_in, s_out = 0.02, 0.03
    m, s = avgpool_multiplier(kernel * kernel, s_in, s_out)
    got = avgpool2d_int(q, kernel, stride, pad, m, s, "u8")
    assert torch.equal(got, _py_avgpool(q, kernel, stride, pad, int(m), int(s), Precision(8)))
    ref = F.avg_pool2d(q.permute(0, 3, 1, 2).double(), kernel, stride, pad,
                       count_include_pad=True).permute(0, 2, 3, 1) * (s_in / s_out)
    assert float((got.double() - ref).abs().max()) <= 0.5 + 1e-6
    assert int(got.unique().numel()) > 10


def test_global_avgpool():
    q = _rand((3, 7, 7, 70), -128, 127, 41)
    s_in, s_out = 0.05, 0.01
    m, s = avgpool_multiplier(49, s_in, s_out)
    got = avgpool2d_int(q, None, None, 0, m, s, "s8")
    assert got.shape == (3, 1, 1, 70)
    ref = F.adaptive_avg_pool2d(q.permute(0, 3, 1, 2).double(), 1).permute(0, 2, 3, 1)
    ref = ref * (s_in / s_out)
    inside = ref.abs() < 127
    assert int(inside.sum()) > 100
    assert float((got.double() - ref)[inside].abs().max()) <= 0.5 + 1e-6
    assert torch.equal(got, _py_avgpool(q, 7, 7, 0, int(m), int(s), Precision(8, "signed")))


def test_pool_input_checks():
    q = _rand((1, 5, 5, 3), 0, 9, 1)
    with pytest.raises(ValueError, match="pad"):
        maxpool2d_int(q, 3, 2, 2)
    with pytest.raises(ValueError, match="NHWC"):
        maxpool2d_int(q[0], 3, 2, 1)
    with pytest.raises(ValueError, match="does not fit"):
        maxpool2d_int(q, 7, 1, 0)
    with pytest.raises(TypeError, match="q must hold integer"):
        maxpool2d_int(q.float(), 3, 2, 1)
    with pytest.raises(ValueError, match="stride"):
        avgpool2d_int(q, 3, 0, 1, 1, 1, "u8")
    with pytest.raises(ValueError, match="count"):
        avgpool_multiplier(0, 1.0, 1.0)


# ------------------------------------------------------------------------ float input
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("prec", ["s8", "u4", "b1", "s2"])
def test_quantize_float_equals_quantize(dtype, prec):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, 17, 19, generator=g) * 2).to(dtype)
    p = Precision.parse(prec)
    scale = 0.0371
    got = quantize_float(x, scale, p)
    assert got.dtype == torch.int64 and got.shape == x.shape
    ref = quantize(x.float(), torch.tensor(scale, dtype=torch.float32), p)
    assert torch.equal(got, ref.to(torch.int64))
    # exact halves round up, in float32
    half = torch.tensor([0.5, 1.5, -0.5, -1.5], dtype=dtype) * 0.25
    if p.bits > 2:
        assert quantize_float(half, 0.25, p).tolist() == ([1, 2, 0, -1] if p.qmin < 0
                                                          else [1, 2, 0, 0])


def test_quantize_float_checks():
    with pytest.raises(ValueError, match="non-finite"):
        quantize_float(torch.tensor([1.0, float("nan")]), 0.1, "s8")
    with pytest.raises(ValueError, match="non-finite"):
        quantize_float(torch.tensor([1e39], dtype=torch.float64), 0.1, "s8")
    with pytest.raises(TypeError, match="floating-point"):
        quantize_float(torch.tensor([1]), 0.1, "s8")
    with pytest.raises(ValueError, match="scale"):
        quantize_float(torch.tensor([1.0]), 0.0, "s8")
    with pytest.raises(ValueError, match="scale"):
        quantize_float(torch.tensor([1.0]), torch.ones(2), "s8")


def test_uint8_table_equals_normalized_quantization():
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    table = uint8_input_table(0.021, "s8", mean, std)
    assert table.shape == (3, 256) and table.dtype == torch.int64
    g = torch.Generator().manual_seed(4)
    img = torch.randint(0, 256, (2, 3, 9, 11), generator=g, dtype=torch.uint8)
    x = (img.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1)
    ref = quantize_float(x, 0.021, "s8")
    got = table[torch.arange(3).view(1, 3, 1, 1), img.long()]
    assert torch.equal(got, ref)
    assert int(table.min()) < -90 and int(table.max()) > 120
    with pytest.raises(ValueError, match="std"):
        uint8_input_table(0.02, "s8", (0.5,), (0.0,))
