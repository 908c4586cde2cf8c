"""lowbit.core: value types validate their fields, hash, and round-trip through JSON."""

import itertools
import random
import re

import pytest
import torch

from lowbit.core import (
    ConvWorkload,
    Encoding,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    parse_wa,
    workload_from_dict,
    workload_from_json,
)
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.space import Config, ConfigSpace, Knob
from lowbit.core.validate import check_inputs, out_storage, storage_shape
from lowbit.core.workloads import SUITES, load_workloads


@pytest.mark.parametrize("bits,enc,qmin,qmax,name", [
    (4, "unsigned", 0, 15, "u4"), (8, "signed", -128, 127, "s8"), (2, "signed", -2, 1, "s2"),
    (1, "binary", -1, 1, "b1"), (1, "unsigned", 0, 1, "u1"),
])
def test_precision_range_and_name(bits, enc, qmin, qmax, name):
    p = Precision(bits, enc)
    assert (p.qmin, p.qmax, p.name) == (qmin, qmax, name)
    assert Precision.parse(name) == p and hash(Precision.parse(name)) == hash(p)


@pytest.mark.parametrize("args,exc,words", [
    ((0,), ValueError, "bits"), ((9,), ValueError, "bits"), ((2.0,), TypeError, "bits"),
    ((True,), TypeError, "bits"), ((4, "ternary"), ValueError, "encoding"),
    ((2, "binary"), ValueError, "binary"), ((1, "signed"), ValueError, "signed"),
])
def test_precision_rejects_bad_fields(args, exc, words):
    with pytest.raises(exc, match=words):
        Precision(*args)


def test_parse_errors():
    with pytest.raises(ValueError, match="u4, s8 or b1"):
        Precision.parse("x4")
    with pytest.raises(ValueError, match="w1a2"):
        parse_wa("w9a1")
    assert parse_wa("w1a2") == (1, 2)


def test_epilogue_key_and_round_trip():
    e = Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane")
    assert e.out == Precision(2) and e.out_layout is Layout.BITPLANE
    assert e.key == "bias+relu->u2/bitplane"
    assert Epilogue.from_dict(e.to_dict()) == e
    assert Epilogue().key == "int32" and Epilogue(out="fp16").key == "fp16"


@pytest.mark.parametrize("kw,exc,field", [
    ({"out": "int64"}, ValueError, "precision"),
    ({"out": "int16", "bias": True}, ValueError, "bias=False"),
    ({"out": 3}, TypeError, "Epilogue.out"),
    ({"relu": 1}, TypeError, "Epilogue.relu"),
    ({"out": "u4", "out_layout": "nchw"}, ValueError, "out_layout"),
    ({"out": "u8", "out_layout": "packed"}, ValueError, "out_layout"),
    ({"out": "b1"}, ValueError, "binary"),
    ({"out": "fp16", "out_layout": "bitplane"}, ValueError, "out_layout"),
])
def test_epilogue_rejects_bad_fields(kw, exc, field):
    with pytest.raises(exc, match=field):
        Epilogue(**kw)


def _conv(**kw):
    base = dict(N=2, H=7, W=9, C=5, K=3, R=3, S=3, stride=2, pad=1)
    return ConvWorkload(**{**base, **kw})


def test_conv_workload_shape_and_key():
    wl = _conv(w="b1", a="u2", epilogue=Epilogue(relu=True, out="u2", out_layout="bitplane"),
               w_layout="bitplane", a_layout="bitplane")
    assert (wl.P, wl.Q) == (4, 5)
    assert wl.gemm_shape == (2 * 4 * 5, 3, 45) and wl.ops == 2 * 40 * 3 * 45
    assert wl.precision_name == "w1a2"
    assert wl.key.startswith("conv2d(N=2,H=7,W=9,C=5,K=3,R=3,S=3,stride=2,pad=1)|w=b1/bitplane")
    back = workload_from_json(wl.to_json())
    assert back == wl and hash(back) == hash(wl) and back.key == wl.key
    assert {wl: 1}[back] == 1
    assert wl.replace(N=4).N == 4 and wl.replace(N=4).w == wl.w


def test_gemm_workload_round_trip():
    wl = GemmWorkload(M=3, N=5, K=70, w="s4", a="u4", w_layout="packed")
    assert workload_from_dict(wl.to_dict()) == wl
    assert wl.gemm_shape == (3, 5, 70)


@pytest.mark.parametrize("kw,exc,field", [
    ({"C": 0}, ValueError, "ConvWorkload.C"), ({"stride": 1.5}, TypeError, "ConvWorkload.stride"),
    ({"pad": -1}, ValueError, "ConvWorkload.pad"),
    ({"H": 1, "R": 5, "pad": 0}, ValueError, "empty"),
    ({"w": "q3"}, ValueError, "precision"), ({"w": 3}, TypeError, "ConvWorkload.w"),
    ({"a_layout": "packed", "a": "u3"}, ValueError, "a_layout"),
    ({"w_layout": "csr"}, ValueError, "w_layout"),
])
def test_conv_workload_rejects_bad_fields(kw, exc, field):
    with pytest.raises(exc, match=field):
        _conv(**kw)


def test_workload_from_dict_rejects_unknown_op():
    with pytest.raises(ValueError, match="op must be one of"):
        workload_from_dict({"op": "pool"})


@pytest.mark.parametrize("suite", SUITES)
def test_shipped_workloads_load(suite):
    items = load_workloads(suite, w="u2", a="u2")
    assert items and all(wl.w == Precision(2) for _, wl in items)
    names = [n for n, _ in items]
    assert len(set(names)) == len(names)


def test_load_workloads_rejects_unknown_suite():
    with pytest.raises(ValueError, match="suite must be one of"):
        load_workloads("vgg")


def test_storage_shapes():
    assert storage_shape((2, 3, 70), Precision(3), Layout.BITPLANE) == (3, 2, 3, 3)
    assert storage_shape((2, 7), Precision(2), Layout.PACKED) == (2, 2)
    wl = GemmWorkload(M=4, N=6, K=8, epilogue=Epilogue(out="u4", out_layout="packed"))
    assert out_storage(wl) == ((4, 3), torch.uint8)


def _gemm_inputs(wl):
    from lowbit.reference import random_inputs
    return random_inputs(wl, seed=1)


def test_check_inputs_names_the_bad_argument():
    wl = GemmWorkload(M=4, N=6, K=40, w="s8", a="u8", epilogue=Epilogue(bias=True, out="u4"))
    x, w, params = _gemm_inputs(wl)
    check_inputs(wl, x, w, params)
    with pytest.raises(TypeError, match=re.escape("x must have dtype torch.uint8")):
        check_inputs(wl, x.to(torch.int8), w, params)
    with pytest.raises(ValueError, match=r"w must have shape \(6, 40\)"):
        check_inputs(wl, x, w[:5].contiguous(), params)
    with pytest.raises(ValueError, match="x must be contiguous"):
        check_inputs(wl, x.t().contiguous().t(), w, params)
    with pytest.raises(TypeError, match=re.escape("w must be a torch.Tensor")):
        check_inputs(wl, x, w.numpy(), params)
    with pytest.raises(TypeError, match=re.escape("params.bias")):
        check_inputs(wl, x, w, EpilogueParams(multiplier=params.multiplier, shift=params.shift))
    bad = EpilogueParams(bias=params.bias, multiplier=params.multiplier,
                         shift=torch.zeros_like(params.shift))
    with pytest.raises(ValueError, match=re.escape("shift in 1..62")):
        check_inputs(wl, x, w, bad)
    with pytest.raises(ValueError, match=re.escape("params.bias must be a contiguous")):
        check_inputs(wl, x, w, EpilogueParams(bias=params.bias[:3].clone(),
                                              multiplier=params.multiplier, shift=params.shift))


def _space():
    return ConfigSpace(
        [Knob("bm", (16, 32, 64)), Knob("bn", (16, 32)), Knob("order", ("ck", "kc"))],
        [lambda c: "tile too big" if c["bm"] * c["bn"] > 1024 else None])


def test_config_space_constraints_and_walks():
    sp = _space()
    assert len(sp) == 10 and Config(bm=64, bn=32, order="ck") not in sp
    assert sp.why_invalid(Config(bm=64, bn=32, order="ck")) == "tile too big"
    assert "not in" in sp.why_invalid(Config(bm=8, bn=16, order="ck"))
    assert "differ" in sp.why_invalid(Config(bm=16))
    rng = random.Random(0)
    c = Config(bm=32, bn=32, order="kc")
    assert all(n in sp and sp.distance(n, c) > 0 for n in sp.neighbors(c))
    assert sp.mutate(c, rng) in sp
    assert len(set(sp.sample(100, rng))) == 10
    assert sp.distance(c, c) == 0.0 and 0 < sp.distance(c, Config(bm=16, bn=16, order="ck")) <= 1


def _brute_force(space):
    pts = (Config(dict(zip(space.names, v, strict=True)))
           for v in itertools.product(*(k.values for k in space.knobs)))
    return [c for c in pts if space.is_valid(c)]


def test_enumeration_prunes_prefixes_without_changing_the_points():
    """all_configs decides a constraint as soon as it runs without reading an unset knob; the
    constraints here read knobs late, through .get and `in` (which must not see an unset knob
    as missing) and through several knobs at once."""
    calls = []

    def late(c):
        odd = (c["a"] + c["d"]) % 3 == 0
        calls.append(1)  # decided: both knobs were set
        return "odd" if odd else None

    space = ConfigSpace(
        [Knob("a", (1, 2, 3, 4)), Knob("b", ("x", "y")), Knob("c", (0, 1)), Knob("d", (1, 2, 5))],
        [lambda c: "big" if c["a"] * (2 if c["b"] == "y" else 1) > 6 else None,
         lambda c: "c needs d" if c.get("c", 0) and c["d"] == 1 else None,
         lambda c: "no b" if "b" not in c else None,
         late])
    found = space.all_configs()
    assert len(calls) < 4 * 2 * 2 * 3  # `late` ran on the surviving prefixes only
    assert found == _brute_force(space)


def test_a_space_without_knobs_has_one_point():
    assert ConfigSpace([]).all_configs() == [Config()]
    assert ConfigSpace([], [lambda c: "never"]).all_configs() == []


def test_enumeration_matches_brute_force_on_a_template_space():
    from lowbit.kernels.triton import CONV2D_INT8

    wl = ConvWorkload(N=2, H=9, W=7, C=45, K=37, R=3, S=3, pad=1, w="s8", a="s8")
    assert CONV2D_INT8.space(wl).all_configs() == _brute_force(CONV2D_INT8.space(wl))


def test_config_is_hashable_and_json_round_trips():
    c = Config(bm=32, order="kc", split=True)
    assert Config.from_json(c.to_json()) == c and hash(Config(dict(c))) == hash(c)
    assert c.replace(bm=64)["bm"] == 64 and c["bm"] == 32
    assert Encoding("binary") is Encoding.BINARY


def test_output_buffer_allocates_or_checks():
    from lowbit.core.validate import output_buffer

    wl = GemmWorkload(M=4, N=6, K=8, epilogue=Epilogue(out="u4", out_layout="packed"))
    out = output_buffer(wl, torch.device("cpu"))
    assert out.shape == (4, 3) and out.dtype == torch.uint8
    assert output_buffer(wl, torch.device("cpu"), out) is out
    with pytest.raises(ValueError, match=re.escape("out must be a contiguous torch.uint8")):
        output_buffer(wl, torch.device("cpu"), torch.empty(4, 3, dtype=torch.int8))


def test_knob_choices_presence_and_overrides():
    """A knob's values may depend on the workload (`choices`, a subset of its values, checked),
    a knob may be absent from a workload's space (`present`: configs do not name it, its
    requirement checks go with it), and a family overrides a shared knob (`but`)."""
    from lowbit.core.knobs import KnobDef, KnobTable

    split = KnobDef("SPLIT", (1, 2, 4), "splits", choices=lambda wl: (1, 2) if wl > 1 else (1,))
    table = KnobTable(
        KnobDef("TILE", (32, 64), "tile"),
        split,
        KnobDef("SUM", ("a", "b"), "how splits add up", present=lambda wl: wl > 1,
                requires={"SPLIT": (2, 4)}))
    one, two = table.space(1), table.space(2)
    assert one.names == ("TILE", "SPLIT") and one.knob("SPLIT").values == (1,)
    assert len(one) == 2 and all("SUM" not in c for c in one)
    assert two.names == ("TILE", "SPLIT", "SUM") and two.knob("SPLIT").values == (1, 2)
    assert {tuple(c[n] for n in two.names) for c in two} == {
        (t, s, "a") for t in (32, 64) for s in (1, 2)} | {(t, 2, "b") for t in (32, 64)}
    docs = "\n".join(table.describe())
    assert "present where" in docs and "values by" in docs
    wide = split.but(values=(1, 2, 4, 8), doc="more splits")
    assert (wide.name, wide.values, wide.doc, split.values) == ("SPLIT", (1, 2, 4, 8),
                                                                "more splits", (1, 2, 4))
    bad = KnobDef("X", (1, 2), "x", choices=lambda wl: (3,))
    with pytest.raises(ValueError, match="subset of its values"):
        KnobTable(bad).space(0)
