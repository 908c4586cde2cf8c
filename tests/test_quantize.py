"""Quantization primitives: scales from the maximum, round-half-up, affine, fixed point, STE."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import Precision, WidePrecision
from lowbit.quant.quantize import (
    affine_params,
    dequantize,
    fake_quantize,
    fixed_point,
    quantize,
    round_half_up,
    scale_from_max,
)


def test_round_half_up():
    x = torch.tensor([-1.5, -0.5, 0.5, 1.5, 2.4999])
    assert round_half_up(x).tolist() == [-1.0, 0.0, 1.0, 2.0, 2.0]


def test_symmetric_signed_per_tensor():
    x = torch.tensor([-2.0, -0.3, 0.5, 1.2])
    p = Precision(4, "signed")
    s = scale_from_max(x, p)
    assert s.item() == pytest.approx(2.0 / 7)
    q = quantize(x, s, p)
    assert q.dtype == torch.int8 and q.tolist() == [-7, -1, 2, 4]
    assert dequantize(q, s).tolist() == pytest.approx([v * 2 / 7 for v in (-7, -1, 2, 4)])


@pytest.mark.parametrize("bits,dtype", [(16, torch.int16), (24, torch.int32)])
def test_wide_precision_values_keep_their_range(bits, dtype):
    """A wide precision stores its own integers (int16 / int32), clamped to its range, never
    wrapped into a byte."""
    p = WidePrecision(bits)
    x = torch.randn(257, generator=torch.Generator().manual_seed(3)) * 4.0
    s = torch.tensor(3.0 / p.qmax)
    q = quantize(x, s, p)
    assert q.dtype is dtype
    want = round_half_up(x / s).clamp(p.qmin, p.qmax)
    assert torch.equal(q.to(torch.float32), want)
    assert int(q.max()) == p.qmax and int(q.min()) == p.qmin  # past +-3: clamped
    assert int(q.abs().max()) > 127


def test_unsigned_per_channel_clamps():
    x = torch.tensor([[0.0, 1.0, 3.0], [-1.0, 0.2, 0.4]])
    p = Precision(2)
    s = scale_from_max(x, p, axis=0)
    assert s.tolist() == pytest.approx([1.0, 0.4 / 3])
    q = quantize(x, s, p, axis=0)
    assert q.dtype == torch.uint8 and q.tolist() == [[0, 1, 3], [0, 2, 3]]


def test_binary_sign_and_mean_scale():
    x = torch.tensor([[-0.5, 0.0, 2.0]])
    p = Precision(1, "binary")
    assert quantize(x, scale_from_max(x, p), p).tolist() == [[-1, 1, 1]]
    assert scale_from_max(x, p).item() == pytest.approx(2.5 / 3)


def test_affine():
    x = torch.tensor([-1.0, 0.0, 3.0])
    p = Precision(4)
    s, zp = affine_params(x, p)
    assert s.item() == pytest.approx(4 / 15) and zp.item() == 4
    q = quantize(x, s, p, zero_point=zp)
    assert q.tolist() == [0, 4, 15]
    assert dequantize(q, s, zp).tolist() == pytest.approx([-16 / 15, 0.0, 44 / 15])
    with pytest.raises(ValueError, match="unsigned"):
        affine_params(x, Precision(4, "signed"))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2**31 - 1))
def test_quantization_error_is_at_most_half_a_step(bits, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 33, generator=g, dtype=torch.float64)
    p = Precision(bits, "signed")
    s = scale_from_max(x, p, axis=0)
    err = (dequantize(quantize(x, s, p, axis=0), s, axis=0, dtype=torch.float64) - x).abs()
    assert bool((err <= s.unsqueeze(1) / 2 + 1e-12).all())


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-9, 1e6))
def test_fixed_point_matches_float_scale(scale):
    m, s = fixed_point(torch.tensor([scale], dtype=torch.float64))
    assert 1 <= int(m) < 2**31 and 1 <= int(s) <= 62
    assert int(m) * 2.0 ** -int(s) == pytest.approx(scale, rel=2**-29)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), 2.0**31])
def test_fixed_point_rejects_bad_scales(bad):
    with pytest.raises(ValueError, match="scale"):
        fixed_point(torch.tensor([bad]))


def test_fake_quantize_forward_and_straight_through_gradient():
    p = Precision(2, "signed")  # values -2..1
    x = torch.tensor([-3.0, -0.6, 0.4, 5.0], requires_grad=True)
    y = fake_quantize(x, torch.tensor(1.0), p)
    assert y.tolist() == [-2.0, -1.0, 0.0, 1.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 0.0]  # clipped outside the range


def test_quantize_rejects_integer_input():
    with pytest.raises(TypeError, match="floating-point"):
        quantize(torch.ones(3, dtype=torch.int32), torch.tensor(1.0), Precision(4))
