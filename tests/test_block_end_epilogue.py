"""The block-end epilogue (core.Epilogue requant32 / narrow residual / derived outputs /
store_out): its fields, keys and dicts, the validator's checks at bind, and the reference
(`apply_epilogue_outputs`, `run_outputs`) against the formula in exact Python integers on
random inputs:

    z = acc m + b + res r + 2^(s-1) (int32),  q_mid = clamp(z >> s, lo, qmax),
    q_j = P_j.qmin + #{i : q_mid >= T_j[i]}.

The kernels' side is in test_cuda_block_end.py."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from lowbit.core import (
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    WidePrecision,
    workload_from_json,
)
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.validate import check_params, derived_storage, out_storage, output_buffer
from lowbit.quant.packing import pack, unpack
from lowbit.reference import apply_epilogue, apply_epilogue_outputs, random_inputs, run, run_outputs

BP, I8, PK = Layout.BITPLANE, Layout.INT8, Layout.PACKED
U2, U4, U8 = Precision(2), Precision(4), Precision(8)
S2, S4, S8 = Precision(2, "signed"), Precision(4, "signed"), Precision(8, "signed")
B1 = Precision(1, "binary")


def block_end(out: Precision = U8, residual: Precision | None = S8, relu: bool = True,
              derived: tuple = ((U2, BP),), store_out: bool = True,
              layout: Layout = I8) -> Epilogue:
    return Epilogue(shifted_bias=True, relu=relu, out=out, out_layout=layout, requant32=True,
                    residual=residual, derived=derived, store_out=store_out)


# ------------------------------------------------------------------------------ core
def test_keys_dicts_and_earlier_keys_unchanged():
    cases = {
        block_end(): "sbias+res8+relu->u8/int8+u2/bitplane",
        block_end(residual=U8, relu=False): "sbias+resu8->u8/int8+u2/bitplane",
        block_end(store_out=False, derived=((U2, BP), (U8, I8))):
            "sbias+res8+relu->(u8)+u2/bitplane+u8/int8",
        block_end(out=S8, residual=None, derived=()): "sbias+r32+relu->s8/int8",
        block_end(residual=S4, derived=((S4, PK),)): "sbias+res4+relu->u8/int8+s4/packed",
        # earlier epilogues: keys (the tuning records' keys) and dicts as they were
        Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"): "bias+relu->u2/bitplane",
        Epilogue(shifted_bias=True, residual=WidePrecision(24), out="u2", out_layout="bitplane"):
            "sbias+res24->u2/bitplane",
        Epilogue(out="int16"): "int16",
    }
    for epi, key in cases.items():
        assert epi.key == key
        again = Epilogue.from_dict(epi.to_dict())
        assert again == epi and again.key == key
    plain = Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane")
    assert set(plain.to_dict()) == {"bias", "relu", "out", "out_layout"}
    assert block_end().to_dict()["residual"] == "s8"
    # names accepted for the derived pairs, normalized
    assert block_end(derived=[("u2", "bitplane")]) == block_end()
    assert len(set(cases.values())) == len(cases) == 8
    wl = _wl(block_end(store_out=False, derived=((U2, BP), (U8, I8))))
    assert workload_from_json(wl.to_json()) == wl  # records and plans round-trip


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(shifted_bias=True, out="u8", residual=S8), ValueError, "needs requant32=True"),
    (dict(shifted_bias=True, out="u8", requant32=True, residual=WidePrecision(16)), ValueError,
     "narrow residual"),
    (dict(shifted_bias=True, out="u8", requant32=True, residual=B1), ValueError, "binary"),
    (dict(out="u8", requant32=True), ValueError, "requant32 needs shifted_bias"),
    (dict(shifted_bias=True, out="u8", requant32=True, derived=((U2, BP),) * 3), ValueError,
     "at most 2"),
    (dict(shifted_bias=True, out="u8", requant32=True, derived=((B1, BP),)), ValueError,
     "binary"),
    (dict(shifted_bias=True, out="u8", requant32=True, derived=((Precision(3), PK),)),
     ValueError, "packed"),
    (dict(shifted_bias=True, out="u8", requant32=True, derived=(U2,)), TypeError, "pair"),
    (dict(shifted_bias=True, out="u8", requant32=True, derived=((U2, "planes"),)), ValueError,
     "layout"),
    (dict(out="int32", derived=((U2, BP),)), ValueError, "derived needs a requantized"),
    (dict(shifted_bias=True, out="u8", requant32=True, store_out=False), ValueError,
     "needs derived outputs"),
    (dict(shifted_bias=True, out="u8", requant32=True, store_out=False, out_layout=BP,
          derived=((U2, BP),)), ValueError, "unused with store_out=False"),
    (dict(shifted_bias=True, out="u8", requant32=1), TypeError, "requant32 must be a bool"),
    (dict(shifted_bias=True, out="u8", requant32=True, residual="s8"), TypeError,
     "residual must be"),
    (dict(shifted_bias=True, out="u8", sum64=True), ValueError, "set requant32=True"),
    (dict(shifted_bias=True, out="u8", requant32=True, sum64=1), TypeError,
     "sum64 must be a bool"),
])
def test_epilogue_rejects_bad_fields(kwargs, err, match):
    with pytest.raises(err, match=match):
        Epilogue(**kwargs)


def _wl(epi: Epilogue, **dims) -> ConvWorkload:
    shape = dict(N=3, H=5, W=4, C=64, K=37, R=3, S=3, stride=1, pad=1)
    shape.update(dims)
    return ConvWorkload(w=B1, a=U2, w_layout=BP, a_layout=BP, epilogue=epi, **shape)


def test_storage_and_buffers():
    wl = _wl(block_end(store_out=False, derived=((U2, BP), (U8, I8))))
    assert out_storage(wl) == ((0,), torch.uint8)
    assert derived_storage(wl) == [((2, 3, 5, 4, 2), torch.int32), ((3, 5, 4, 37), torch.uint8)]
    cpu = torch.device("cpu")
    assert output_buffer(wl, cpu).shape == (0,)
    junk = torch.ones(3)
    assert output_buffer(wl, cpu, junk) is junk  # any buffer: never written
    stored = _wl(block_end())
    assert out_storage(stored) == ((3, 5, 4, 37), torch.uint8)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        output_buffer(stored, cpu, junk)


def test_check_params_at_bind():
    """The validator names each bad parameter, and proves the 32-bit sum fits for the
    workload's bounds (not only for the values at hand)."""
    wl = _wl(block_end(derived=((U2, BP), (S4, I8))))
    _, _, p = random_inputs(wl, 4)
    cpu = torch.device("cpu")
    check_params(wl, p, cpu)
    good = p.__dict__

    def bad(**changes) -> EpilogueParams:
        return EpilogueParams(**{**good, **changes})

    t0, t1 = p.thresholds
    cases = [
        (TypeError, "multiplier", bad(multiplier=None)),
        (ValueError, "shifted_bias must be a contiguous torch.int32",
         bad(shifted_bias=p.shifted_bias.to(torch.int64))),
        (ValueError, "residual must be a contiguous torch.int8",
         bad(residual=p.residual.to(torch.uint8))),
        (ValueError, "residual_multiplier", bad(residual_multiplier=p.residual_multiplier[:3])),
        (ValueError, "shift in 1..31", bad(shift=p.shift + 31)),
        (ValueError, "multiplier must be >= 0", bad(multiplier=-p.multiplier - 1)),
        (ValueError, "could overflow", bad(multiplier=p.multiplier * 64)),
        (ValueError, "could overflow", bad(residual_multiplier=p.residual_multiplier * 0 + 2**24)),
        (ValueError, "hold 2 vectors", bad(thresholds=(t0,))),
        (ValueError, r"thresholds\[1\] must be a contiguous torch.int32 tensor of shape \(15,\)",
         bad(thresholds=(t0, t1[:3]))),
        (ValueError, "non-decreasing", bad(thresholds=(t0.flip(0), t1))),
        (ValueError, r"derived_out\[0\]", bad(derived_out=(p.derived_out[1], p.derived_out[1]))),
        (ValueError, "hold 2 buffers", bad(derived_out=p.derived_out[:1])),
        (TypeError, "tuple", bad(thresholds=[t0, t1])),
    ]
    for err, match, params in cases:
        with pytest.raises(err, match=match):
            check_params(wl, params, cpu)
    plain = _wl(Epilogue(shifted_bias=True, out="u8", requant32=True))
    _, _, q = random_inputs(plain, 5)
    with pytest.raises(ValueError, match="hold 0 vectors"):
        check_params(plain, EpilogueParams(**{**q.__dict__, "thresholds": (t0,)}), cpu)
    with pytest.raises(ValueError, match="has no residual"):
        check_params(plain, EpilogueParams(**{**q.__dict__, "residual": p.residual}), cpu)
    assert len(cases) == 14


# ------------------------------------------------------------------------------ reference
def python_block_end(acc, res, m, b, r, s, lo, hi, thresholds, qmins):
    """(q_mid, [q_j]) of the formula in exact Python integers (>> floors)."""
    mid = [[min(max((a * mc + bc + x * rc + (1 << (sc - 1))) >> sc, lo), hi)
            for a, x, mc, bc, rc, sc in zip(arow, xrow, m, b, r, s, strict=True)]
           for arow, xrow in zip(acc, res, strict=True)]
    derived = [[[qmin + sum(q >= t for t in thr) for q in row] for row in mid]
               for thr, qmin in zip(thresholds, qmins, strict=True)]
    return mid, derived


#: (mid, residual, derived outputs, store_out)
REFERENCE_CASES = [
    (U8, S8, ((U2, BP),), True),
    (U8, U8, ((U2, BP), (U8, I8)), True),
    (S8, S8, ((S4, I8),), False),
    (U4, S4, ((U2, PK), (Precision(1), BP)), True),
    (S8, None, ((S2, BP), (U8, I8)), False),
    (U8, Precision(5), (), True),
]


def _against_python(epi: Epilogue, acc: list, res: list, formula: tuple, thresholds: list
                    ) -> tuple[EpilogueParams, list[torch.Tensor], list]:
    """`apply_epilogue_outputs` of block end `epi` on accumulators `acc` and residual values
    `res` (lists of rows) with the per-channel (m, b, r, s) of `formula` (b and r int64
    vectors with Epilogue.sum64, int32 otherwise) equals `python_block_end`; returns the
    params, the expected outputs and mid values."""
    m, b, r, s = formula
    res_prec, derived, store = epi.narrow_residual, epi.derived, epi.store_out
    i32 = {"dtype": torch.int32}
    wide = {"dtype": torch.int64 if epi.sum64 else torch.int32}
    params = EpilogueParams(
        multiplier=torch.tensor(m, **i32), shift=torch.tensor(s, **i32),
        shifted_bias=torch.tensor(b, **wide),
        residual=pack(torch.tensor(res), res_prec, I8) if res_prec else None,
        residual_multiplier=torch.tensor(r, **wide) if res_prec else None,
        thresholds=tuple(torch.tensor(t, **i32) for t in thresholds))
    got = apply_epilogue_outputs(torch.tensor(acc), epi, params)
    lo, hi = epi.mid_range
    want_mid, want_derived = python_block_end(acc, res, m, b, r, s, lo, hi, thresholds,
                                              [p.qmin for p, _ in derived])
    want = ([pack(torch.tensor(want_mid), epi.out, I8)] if store else []) + [
        pack(torch.tensor(v), p, lay) for v, (p, lay) in zip(want_derived, derived,
                                                             strict=True)]
    assert len(got) == len(want) == store + len(derived)
    for g, w_ in zip(got, want, strict=True):
        assert torch.equal(g, w_), epi.key
    return params, want, want_mid


@pytest.mark.parametrize("relu", [False, True])
def test_reference_matches_python_integers(relu):
    """Random accumulators and residuals over their whole ranges, multipliers up to the
    bound, shifts 1..31, biases of either sign, thresholds with ties and outside the mid
    range, every output layout, odd K: `apply_epilogue_outputs` equals the formula, and
    `apply_epilogue` returns the stored output and fills params.derived_out."""
    rnd = random.Random(11 + relu)
    checked = 0
    for mid, res_prec, derived, store in REFERENCE_CASES:
        k, rows, top_acc = 37, 13, 3000
        top_res = max(-res_prec.qmin, res_prec.qmax) if res_prec else 0
        s = [rnd.choice([1, 2, 30, 31]) if i < 4 else rnd.randint(8, 24) for i in range(k)]
        m, b, r = [], [], []
        for i in range(k):  # the budget |acc| m + |b| + |res| |r| + 2^(s-1) < 2^31, shared
            room = 2**31 - 1 - (1 << (s[i] - 1))
            m.append(rnd.randint(0, room // (3 * top_acc)) if i != 5 else room // top_acc)
            rc = rnd.randint(-(room // (3 * max(top_res, 1))), room // (3 * max(top_res, 1)))
            r.append(rc if res_prec and i != 5 else 0)
            left = room - top_acc * m[-1] - top_res * abs(r[-1])
            b.append(rnd.randint(-left, left))
        acc = [[rnd.choice([-top_acc, top_acc]) if rnd.random() < 0.05 else
                rnd.randint(-top_acc, top_acc) for _ in range(k)] for _ in range(rows)]
        res = [[rnd.randint(res_prec.qmin, res_prec.qmax) if res_prec else 0
                for _ in range(k)] for _ in range(rows)]
        lo, hi = (max(mid.qmin, 0) if relu else mid.qmin), mid.qmax
        thresholds = [sorted(rnd.randint(lo - 3, hi + 3) for _ in range(p.qmax - p.qmin))
                      for p, _ in derived]
        epi = block_end(mid, res_prec, relu, derived, store)
        params, want, want_mid = _against_python(epi, acc, res, (m, b, r, s), thresholds)
        assert len({v for row in want_mid for v in row}) >= 3  # not one clamped value
        bufs = tuple(torch.full(w_.shape, 7, dtype=w_.dtype) for w_ in want[store:])
        stored = apply_epilogue(torch.tensor(acc), epi,
                                EpilogueParams(**{**params.__dict__, "derived_out": bufs}))
        assert torch.equal(stored, want[0]) if store else stored.numel() == 0
        assert all(torch.equal(buf, w_) for buf, w_ in zip(bufs, want[store:], strict=True))
        checked += 1
    assert checked == len(REFERENCE_CASES)


def test_64_bit_block_end_keys_and_dicts():
    """Epilogue.sum64 spells 's64' in the key and 'sum64' in the dict (only when set: every
    32-bit block end's key stays), and round-trips through both."""
    epi = replace(block_end(), sum64=True)
    assert epi.key == "sbias+res8+s64+relu->u8/int8+u2/bitplane"
    assert epi.to_dict()["sum64"] is True and "sum64" not in block_end().to_dict()
    shortcut = replace(block_end(out=S8, residual=None, derived=()), sum64=True)
    assert shortcut.key == "sbias+r32+s64+relu->s8/int8"
    for e in (epi, shortcut):
        assert Epilogue.from_dict(e.to_dict()) == e
        assert workload_from_json(_wl(e).to_json()) == _wl(e)


def test_reference_64_bit_sum_matches_python_integers():
    """Epilogue.sum64: multipliers of 31 bits, shifts 1..62 (both sides of 32), int64 biases
    and residual multipliers past 2^32 of either sign, sums up to the 2^min(63, 31 + s)
    bound: `apply_epilogue_outputs` equals the formula in Python integers."""
    rnd = random.Random(5)
    checked = 0
    for mid, res_prec, derived, store in REFERENCE_CASES:
        k, rows, top_acc = 37, 11, 3000
        top_res = max(-res_prec.qmin, res_prec.qmax) if res_prec else 0
        relu = checked % 2 == 0
        lo, hi = (max(mid.qmin, 0) if relu else mid.qmin), mid.qmax
        span = hi - lo + 1
        s = [rnd.choice([1, 31, 32, 33, 62]) if i < 5 else rnd.randint(20, 36) for i in range(k)]
        m, b, r = [], [], []
        for i, sc in enumerate(s):  # the sum below 2^min(63, 31 + s), the room shared
            room = 2 ** min(63, 31 + sc) - 1 - (1 << (sc - 1))
            top_m, top_r = min(2**31 - 1, room // (3 * top_acc)), room // (3 * max(top_res, 1))
            if i < 5:  # the bounds
                mc, rc = rnd.randint(0, top_m), rnd.randint(-top_r, top_r)
            else:  # about the mid range's span over the accumulator's and residual's ranges
                mc = min(top_m, round(rnd.uniform(0.2, 1.0) * span / top_acc * 2**sc))
                rc = max(-top_r, min(top_r, round(rnd.uniform(-1, 1) * span / max(top_res, 1)
                                                  * 2**sc)))
            m.append(mc)
            r.append(max(min(rc, 2**62 - 1), 1 - 2**62) if res_prec else 0)
            left = min(room - top_acc * m[-1] - top_res * abs(r[-1]), 2**62 - 1)
            b.append(rnd.randint(-left, left) if i < 5 else
                     max(-left, min(left, round(rnd.uniform(-0.5, 0.5) * span * 2**sc))))
        acc = [[rnd.randint(-top_acc, top_acc) for _ in range(k)] for _ in range(rows)]
        res = [[rnd.randint(res_prec.qmin, res_prec.qmax) if res_prec else 0
                for _ in range(k)] for _ in range(rows)]
        thresholds = [sorted(rnd.randint(lo - 3, hi + 3) for _ in range(p.qmax - p.qmin))
                      for p, _ in derived]
        epi = replace(block_end(mid, res_prec, relu, derived, store), sum64=True)
        _, _, want_mid = _against_python(epi, acc, res, (m, b, r, s), thresholds)
        assert len({v for row in want_mid for v in row}) >= 3
        checked += 1
    assert checked == len(REFERENCE_CASES)


def test_reference_refuses_64_bit_sums_past_their_bound():
    """sum64: a sum reaching 2^(31 + s) (z >> s past int32) or an int32 residual multiplier
    is refused, naming the bound; the same params pass below it."""
    epi = replace(block_end(derived=()), sum64=True)
    k = 3
    params = EpilogueParams(multiplier=torch.full((k,), 2**30, dtype=torch.int32),
                            shift=torch.full((k,), 40, dtype=torch.int32),
                            shifted_bias=torch.zeros(k, dtype=torch.int64),
                            residual=torch.zeros(2, k, dtype=torch.int8),
                            residual_multiplier=torch.full((k,), 2**40, dtype=torch.int64))
    acc = torch.full((2, k), 2**30)
    assert apply_epilogue(acc, epi, params).shape == (2, k)  # 2^60 + 128 2^40 < 2^63
    with pytest.raises(ValueError, match=r"channel 0: .* reaches 2\^63"):
        apply_epilogue(acc * 8, epi, params)
    low = EpilogueParams(**{**params.__dict__, "shift": torch.full((k,), 20, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"reaches 2\^51"):
        apply_epilogue(acc, epi, low)
    narrow = EpilogueParams(**{**params.__dict__,
                               "residual_multiplier": torch.ones(k, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"residual_multiplier must be a contiguous torch\.int64"):
        apply_epilogue(acc, epi, narrow)


def test_reference_refuses_sums_past_int32():
    epi = block_end(derived=())
    k = 5
    vec = {"dtype": torch.int32}
    params = EpilogueParams(multiplier=torch.full((k,), 2**20, **vec),
                            shift=torch.full((k,), 20, **vec),
                            shifted_bias=torch.zeros(k, **vec),
                            residual=torch.zeros(2, k, dtype=torch.int8),
                            residual_multiplier=torch.ones(k, **vec))
    acc = torch.full((2, k), 2000)
    assert apply_epilogue(acc, epi, params).shape == (2, k)  # 2000 * 2^20 < 2^31
    with pytest.raises(ValueError, match=r"channel 0: .* reaches 2\^31"):
        apply_epilogue(acc * 2, epi, params)
    with pytest.raises(ValueError, match="must lie in"):  # the residual's values
        apply_epilogue(acc, block_end(residual=S4, derived=()),
                       EpilogueParams(**{**params.__dict__,
                                         "residual": torch.full((2, k), 9, dtype=torch.int8)}))


@pytest.mark.parametrize("store", [True, False])
def test_run_outputs_on_random_inputs(store):
    """`random_inputs` draws requant32 params that pass the validator and spread the mid
    values; `run_outputs` gives the mid (when stored) then the derived outputs, each the
    thresholds of the mid values; a conv with odd K and a GEMM."""
    for wl in (_wl(block_end(derived=((U2, BP), (S4, I8)), store_out=store)),
               GemmWorkload(w=S2, a=U2, w_layout=BP, a_layout=BP, M=45, N=33, K=300,
                            epilogue=block_end(S8, U8, False, ((U8, I8),), store))):
        x, w, p = random_inputs(wl, 7)
        check_params(wl, p, torch.device("cpu"))
        outs = run_outputs(wl, x, w, p)
        mid = run_outputs(wl.replace(epilogue=block_end(
            wl.epilogue.out, wl.epilogue.residual, wl.epilogue.relu, ())), x, w,
            EpilogueParams(**{**p.__dict__, "thresholds": (), "derived_out": ()}))[0]
        k = mid.shape[-1]
        q = mid.to(torch.int64)
        assert len(set(q.flatten().tolist())) > 20
        assert len(outs) == store + len(wl.epilogue.derived)
        if store:
            assert torch.equal(outs[0], mid)
        for (prec, lay), thr, got in zip(wl.epilogue.derived, p.thresholds,
                                         outs[store:], strict=True):
            want = prec.qmin + (q.unsqueeze(-1) >= thr.to(torch.int64)).sum(-1)
            assert torch.equal(unpack(got, prec, lay, k), want)
            assert len(set(want.flatten().tolist())) >= 2
        stored = run(wl, x, w, p)
        assert stored.numel() == (mid.numel() if store else 0)
        assert all(torch.equal(b, o) for b, o in zip(p.derived_out, outs[store:], strict=True))


def test_params_move_with_their_thresholds_and_buffers():
    wl = _wl(block_end(derived=((U2, BP), (U8, I8))))
    _, _, p = random_inputs(wl, 2)
    moved = p.to("cpu")
    assert len(moved.thresholds) == len(moved.derived_out) == 2
    assert all(torch.equal(a, b) for a, b in zip(moved.thresholds, p.thresholds, strict=True))
    assert [t.shape for t in moved.derived_out] == [t.shape for t in p.derived_out]
    assert moved.residual.dtype == torch.int8 and moved.multiplier.dtype == torch.int32


def test_a_block_end_no_family_builds_is_not_planned_on_the_bit_serial_kernels():
    """ResNet-50's w4a4 bottleneck end (4-bit bit planes derived beside the stored stream): no
    bit-serial family has a config for it, so `runs` says no and the plan takes the kernel +
    epilogue pass instead of failing to compile; w1a2's block end (2-bit planes) runs."""
    from lowbit.graph.impl import runs
    from lowbit.kernels.cuda import default_bitserial

    shape = dict(N=2, H=16, W=16, C=64, K=256, R=1, S=1, stride=1, pad=0)
    wide_planes = ConvWorkload(w=S4, a=U4, w_layout=BP, a_layout=BP,
                               epilogue=block_end(derived=((U4, BP),)), **shape)
    with pytest.raises(ValueError):
        default_bitserial(wide_planes, "sm_90a")
    assert not runs("cuda.bitserial_wgmma", wide_planes)
    assert runs("cuda.bitserial_wgmma", ConvWorkload(w=B1, a=U2, w_layout=BP, a_layout=BP,
                                                     epilogue=block_end(), **shape))


def test_guarded_block_end_keys_dicts_and_fields():
    """Epilogue.guarded spells 'g' after 's64' in the key and 'guarded' in the dict (only when
    set: every other key stays), round-trips, and needs sum64."""
    epi = replace(block_end(), sum64=True, guarded=True)
    assert epi.key == "sbias+res8+s64+g+relu->u8/int8+u2/bitplane"
    assert epi.to_dict()["guarded"] is True
    assert "guarded" not in replace(block_end(), sum64=True).to_dict()
    assert Epilogue.from_dict(epi.to_dict()) == epi
    assert workload_from_json(_wl(epi).to_json()) == _wl(epi)
    with pytest.raises(ValueError, match="set sum64=True"):
        replace(block_end(), guarded=True)
    with pytest.raises(TypeError, match="guarded must be a bool"):
        replace(block_end(), sum64=True, guarded=1)


def test_plan_picks_the_guarded_block_end_and_binds_its_tables():
    """ResNet-18 w1a2 with the 8-bit stream: every block end is exact (sum64 params); those
    whose 32-bit form has bands averaging at most GUARD_MAX_BAND over its columns are planned
    guarded (the 1x1 downsamples here; the 3x3 block ends' wider accumulators give wider
    bands), and their bound column tables hold the 32-bit entries (shifts 1..30, 2E <=
    2^(s-1)) before the sum64 ones; PlanOptions(guarded_block_ends=False) and the
    approximate option (PlanOptions(requant32=True)) plan none."""
    import warnings

    from lowbit.bench import build_quantized
    from lowbit.graph import PlanOptions
    from lowbit.graph.kernel_epilogues import GUARD_MAX_BAND
    from lowbit.kernels.cuda.bitserial_shape import conv_shape, wsum_columns
    from lowbit.kernels.cuda.bitserial_tables import requant32_columns
    from lowbit.runtime.compiled import compile_model
    from lowbit.runtime.layers import block_end_params

    q, _ = build_quantized("resnet18", "w1a2", image_size=32, residual_bits=8, seed=2)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        plan = compile_model(q, x, records=False).plan
        approx = compile_model(q, x, records=False, options=PlanOptions(requant32=True)).plan
        plain = compile_model(q, x, records=False,
                              options=PlanOptions(guarded_block_ends=False)).plan
    all_ends = [s for s in plan.layers if s.workload.epilogue.requant32]
    ends = [s for s in all_ends if s.workload.epilogue.guarded]
    assert len(all_ends) >= 8 and all(s.workload.epilogue.sum64 for s in all_ends)
    assert {s.name for s in ends} == {"layer.layer2_0_downsample_0",
                                      "layer.layer3_0_downsample_0"}
    assert not any(s.workload.epilogue.guarded for s in plain.layers)
    approx_ends = [s.workload.epilogue for s in approx.layers if s.workload.epilogue.requant32]
    assert approx_ends and not any(e.guarded for e in approx_ends)
    assert not all(e.sum64 for e in approx_ends)
    for s in ends:
        epi = s.workload.epilogue
        shape = tuple(plan.tensors[s.layer_outputs[0].tensor].shape)
        res = torch.zeros(1, dtype=torch.int8) if epi.residual is not None else None
        params = block_end_params(s, plan, torch.device("cpu"), res,
                                  [torch.zeros(1, dtype=torch.uint8)] * len(epi.derived))
        table = requant32_columns(s.workload, params).to(torch.int64) & 0xFFFFFFFF
        cols = wsum_columns(conv_shape(s.workload))
        assert table.shape == (cols * 12,) and shape[-1] == conv_shape(s.workload).kout
        words = table[:cols * 4].view(cols, 4)[:shape[-1], 3]
        shift, band = words & 31, words >> 5
        assert bool((shift >= 1).all() & (shift <= 30).all() & (band >= 2).all())
        assert bool((band <= 2 ** (shift - 1)).all())
        assert float(((2 ** shift - (band << 5)) / 2.0 ** shift).mean()) <= GUARD_MAX_BAND
