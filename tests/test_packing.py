"""Bit packing round trips (property-based) and the exact storage formats."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import PACKABLE_BITS, Layout, Precision
from lowbit.core.packed import PackedTensor
from lowbit.core.validate import storage_dtype, storage_shape
from lowbit.quant.packing import (
    from_bitplanes,
    pack,
    pack_dense,
    to_bitplanes,
    unpack,
    unpack_dense,
)
from lowbit.reference import random_values

ALL_PRECISIONS = [Precision(b, e) for b in range(1, 9) for e in ("unsigned", "signed")
                  if not (e == "signed" and b == 1)] + [Precision(1, "binary")]


@st.composite
def tensors(draw, precs):
    prec = draw(st.sampled_from(precs))
    outer = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    c = draw(st.integers(1, 97))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return prec, random_values((*outer, c), prec, g)


@settings(max_examples=150, deadline=None)
@given(tensors(ALL_PRECISIONS))
def test_bitplanes_round_trip(case):
    prec, v = case
    planes = to_bitplanes(v, prec)
    assert planes.dtype == torch.int32
    assert tuple(planes.shape) == storage_shape(tuple(v.shape), prec, Layout.BITPLANE)
    assert torch.equal(from_bitplanes(planes, prec, v.shape[-1]), v)


@settings(max_examples=150, deadline=None)
@given(tensors([p for p in ALL_PRECISIONS if p.bits in PACKABLE_BITS]))
def test_dense_round_trip(case):
    prec, v = case
    packed = pack_dense(v, prec)
    assert packed.dtype == torch.uint8
    assert tuple(packed.shape) == storage_shape(tuple(v.shape), prec, Layout.PACKED)
    assert torch.equal(unpack_dense(packed, prec, v.shape[-1]), v)


@settings(max_examples=100, deadline=None)
@given(tensors(ALL_PRECISIONS), st.sampled_from(list(Layout)))
def test_pack_unpack_every_layout(case, layout):
    prec, v = case
    if layout is Layout.PACKED and prec.bits not in PACKABLE_BITS:
        with pytest.raises(ValueError, match="bits in"):
            pack(v, prec, layout)
        return
    s = pack(v, prec, layout)
    assert s.dtype == storage_dtype(prec, layout)
    assert torch.equal(unpack(s, prec, layout, v.shape[-1]), v)


def test_bitplane_word_format_is_lsb_first_channel_major():
    # channel 0 = 3 (planes 0 and 1 set), channel 33 = 2 (plane 1 only), rest 0
    v = torch.zeros(1, 40, dtype=torch.int64)
    v[0, 0], v[0, 33] = 3, 2
    planes = to_bitplanes(v, Precision(2))
    assert planes.tolist() == [[[1, 0]], [[1, 2]]]
    # bit 31 of a word is the sign bit of the int32 storage
    v = torch.zeros(1, 32, dtype=torch.int64)
    v[0, 31] = 1
    assert to_bitplanes(v, Precision(1)).tolist() == [[[-(2**31)]]]


def test_dense_byte_format():
    v = torch.tensor([[1, 2, 3, 0, 1]])
    assert pack_dense(v, Precision(2)).tolist() == [[1 | 2 << 2 | 3 << 4, 1]]
    s = torch.tensor([[-1, 7, -8]])
    assert pack_dense(s, Precision(4, "signed")).tolist() == [[0xF | 7 << 4, 8]]
    b = torch.tensor([[1, -1, 1]])
    assert pack_dense(b, Precision(1, "binary")).tolist() == [[0b101]]


@pytest.mark.parametrize("values,prec,match", [
    (torch.tensor([[4]]), Precision(2), r"\[0, 3\]"),
    (torch.tensor([[-3]]), Precision(2, "signed"), r"\[-2, 1\]"),
    (torch.tensor([[0]]), Precision(1, "binary"), "-1 or \\+1"),
])
def test_out_of_range_values_rejected(values, prec, match):
    with pytest.raises(ValueError, match=match):
        to_bitplanes(values, prec)


def test_bad_types_rejected():
    with pytest.raises(TypeError, match="integer dtype"):
        to_bitplanes(torch.ones(3), Precision(2))
    with pytest.raises(ValueError, match="dense packing needs bits"):
        pack_dense(torch.ones(1, 3, dtype=torch.int64), Precision(3))
    with pytest.raises(TypeError, match="packed must be uint8"):
        unpack_dense(torch.ones(1, 3, dtype=torch.int32), Precision(2), 3)
    with pytest.raises(ValueError, match="planes must be int32 with 2 planes"):
        from_bitplanes(torch.zeros(3, 1, 1, dtype=torch.int32), Precision(2), 8)
    with pytest.raises(ValueError, match="channels"):
        from_bitplanes(torch.zeros(2, 1, 1, dtype=torch.int32), Precision(2), 33)


def test_packed_tensor_bytes():
    v = torch.randint(0, 4, (2, 64))
    pt = PackedTensor(pack(v, Precision(2), "bitplane"), (2, 64), Precision(2), "bitplane")
    assert pt.nbytes == 2 * 2 * 2 * 4 and pt.layout is Layout.BITPLANE
    with pytest.raises(TypeError, match=re.escape("PackedTensor.data")):
        PackedTensor([1], (1,), Precision(2), "int8")
