"""Table products and lookups (`kernels.triton.elementwise`) bit for bit against
`lowbit.reference.netops`, their tables stored in the narrowest type holding the output's
range (`table_dtype`). CPU: under TRITON_INTERPRET=1 on odd shapes (batch 3, C = 37, odd maps)
with poisoned outputs; a squeeze-excite gate broadcast over the map and a full-shape product."""

from __future__ import annotations

import pytest
import torch

from lowbit.core import Layout, Precision, WidePrecision
from lowbit.kernels.triton import elementwise as E
from lowbit.reference import random_values
from lowbit.reference.netops import table_mul_int
from test_triton_netops import packed, poisoned, stored_values

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


def _values(shape, prec, seed):
    return random_values(shape, Precision.parse(prec), torch.Generator().manual_seed(seed))


def _table(n, out_prec, seed):
    p = out_prec
    g = torch.Generator().manual_seed(seed)
    return torch.randint(int(p.qmin), int(p.qmax) + 1, (n,), generator=g, dtype=torch.int64)


@pytest.mark.parametrize("out_prec,layout,dtype", [
    ("s8", INT8, torch.int8), ("u8", INT8, torch.uint8), ("u4", BITPLANE, torch.int8),
    ("s16", INT8, torch.int16)], ids=["s8", "u8", "u4-planes", "s16"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate", "full"])
def test_table_product_equals_the_reference(out_prec, layout, dtype, gate):
    out_p = WidePrecision(16) if out_prec == "s16" else Precision.parse(out_prec)
    shape = (3, 5, 7, 37)
    a_shape = (3, 1, 1, 37) if gate else shape
    a_vals, b_vals = _values(a_shape, "u8", 1), _values(shape, "s8", 2)
    table = _table(256 * 256, out_p, 3)
    assert E.table_dtype(out_p) == dtype
    out = poisoned(shape, out_p, layout)
    E.bind_table_mul(packed(a_vals, "u8", INT8), packed(b_vals, "s8", INT8), table, out)()
    want = table_mul_int(a_vals, b_vals, table, "u8", "s8")
    assert torch.equal(stored_values(out), want)
    assert int(want.unique().numel()) == 16 if out_prec == "u4" else \
        int(want.unique().numel()) > 100


def test_lookup_equals_its_table():
    x = _values((3, 9, 11, 37), "s8", 4)
    table = _table(256, Precision.parse("u8"), 5)
    out = poisoned(tuple(x.shape), "u8", INT8)
    E.bind_lookup(packed(x, "s8", INT8), table, out)()
    assert torch.equal(stored_values(out), table[x + 128])


def test_table_types_by_range():
    want = {"s8": torch.int8, "u8": torch.uint8, "u2": torch.int8, "u7": torch.int8,
            "s16": torch.int16, "s24": torch.int32}
    for name, dtype in want.items():
        p = WidePrecision(int(name[1:])) if int(name[1:]) > 8 else Precision.parse(name)
        assert E.table_dtype(p) == dtype, name
