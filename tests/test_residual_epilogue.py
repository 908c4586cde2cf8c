"""The residual operand in the kernels' requantizing epilogue (Epilogue.residual, issue 32):
q = clamp(floor((acc m + b + res r + 2^(s-1)) / 2^s), lo, qmax), b int64 at the output's
shift, res a wide tensor (int16 / int32 storage) of the output's shape, m and r int64. The
reference against exact Python integers; the bit-serial multiply path (bitserial_epilogue.cu,
HAS_BIAS 3 / 4) through the host emulation against the reference on fresh random inputs, a
mutation of its CUDA text caught, NVRTC builds; ResNet plans that fuse their single-output
block-ending layers and CPU executors that give the reference executor's integers; GPU tests
(`gpu`)."""

from __future__ import annotations

import random

import pytest
import torch

from lowbit.core import (
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    WidePrecision,
    Workload,
)
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.validate import check_params, out_storage
from lowbit.quant.packing import pack, unpack
from lowbit.reference import apply_epilogue, random_inputs, requant_thresholds, run
from test_shifted_bias import (  # the workloads, plans and executor check of Phase 1
    _conv,
    _family,
    _gemm,
    _plan,
    check_cpu_executor,
    epilogue_part_holding,
)

BP, I8, PK = Layout.BITPLANE, Layout.INT8, Layout.PACKED
R24, R16 = WidePrecision(24), WidePrecision(16)
B1, U2, S2 = Precision(1, "binary"), Precision(2), Precision(2, "signed")
U4, S4, S8 = Precision(4), Precision(4, "signed"), Precision(8, "signed")


def res_epi(out: Precision, relu: bool, layout: Layout = BP, residual: WidePrecision = R24
            ) -> Epilogue:
    return Epilogue(shifted_bias=True, relu=relu, out=out, out_layout=layout, residual=residual)


def python_requantize(acc, res, m, b, r, s, lo, hi) -> list[list[int]]:
    """The formula in exact Python integers (>> floors)."""
    return [[min(max((a * mc + bc + x * rc + (1 << (sc - 1))) >> sc, lo), hi)
             for a, x, mc, bc, rc, sc in zip(arow, xrow, m, b, r, s, strict=True)]
            for arow, xrow in zip(acc, res, strict=True)]


# ------------------------------------------------------------------------------ core
def test_epilogue_field_key_and_dicts():
    epi = res_epi(U2, True)
    assert epi.key == "sbias+res24+relu->u2/bitplane"
    assert epi.to_dict()["residual"] == 24
    assert Epilogue.from_dict(epi.to_dict()) == epi
    plain = Epilogue(shifted_bias=True, out="u2")
    assert "residual" not in plain.to_dict() and Epilogue.from_dict(plain.to_dict()) == plain
    assert res_epi(S4, False, I8, R16).key == "sbias+res16->s4/int8"
    with pytest.raises(ValueError, match="shifted_bias"):
        Epilogue(out="u2", residual=R24)
    with pytest.raises(ValueError, match="requant32"):  # a narrow residual: the 32-bit path
        Epilogue(out="u2", shifted_bias=True, residual=Precision(8, "signed"))
    with pytest.raises(TypeError, match="WidePrecision"):
        Epilogue(out="u2", shifted_bias=True, residual=8)


OUTS = [(Precision(1), BP, R24), (U2, BP, R16), (S2, PK, R24), (S4, I8, R24), (U4, PK, R16),
        (S8, I8, R24), (Precision(8), I8, R16), (Precision(3, "signed"), BP, R24)]


@pytest.mark.parametrize("relu", [False, True])
def test_apply_epilogue_matches_python_integers(relu):
    """Random accumulators, residuals of either sign over the wide range, int64 multipliers
    up to 2^50 (as the planner's shared shift makes them), residual multipliers of either
    sign up to where res r leaves int64, shifts 1..62, biases of either sign, 1/2/3/4/8-bit
    outputs in every layout: apply_epilogue equals the formula in exact integers (where the
    sum passes int64 too)."""
    rnd = random.Random(5 + relu)
    checked = 0
    for out, layout, wide in OUTS:
        k, rows = 37, 11
        s = [rnd.choice([1, 2, 40, 61, 62]) if i < 5 else rnd.randint(30, 56) for i in range(k)]
        m = [rnd.choice([0, 1, 2**50]) if i < 3 else rnd.randint(1, 2**50) for i in range(k)]
        top_r = (2**63 - 1) // -wide.qmin  # |res r| inside int64
        r = [rnd.randint(-(2**38), 2**38) if i % 4 else rnd.choice([top_r, -top_r])
             for i in range(k)]
        b = [rnd.randint(-(2**61), 2**61) if i % 5 == 0 else
             rnd.randint(-(8 << min(s[i], 58)), 8 << min(s[i], 58)) for i in range(k)]
        acc = [[rnd.randint(-(2**12), 2**12) for _ in range(k)] for _ in range(rows)]
        res = [[rnd.choice([wide.qmin, wide.qmax]) if rnd.random() < 0.05 else
                rnd.randint(wide.qmin, wide.qmax) for _ in range(k)] for _ in range(rows)]
        epi = res_epi(out, relu, layout, wide)
        params = EpilogueParams(multiplier=torch.tensor(m), shift=torch.tensor(s),
                                shifted_bias=torch.tensor(b),
                                residual=torch.tensor(res, dtype=wide.storage_dtype),
                                residual_multiplier=torch.tensor(r))
        got = apply_epilogue(torch.tensor(acc), epi, params)
        lo = max(out.qmin, 0) if relu else out.qmin
        want = torch.tensor(python_requantize(acc, res, m, b, r, s, lo, out.qmax))
        assert torch.equal(got, pack(want, out, layout)), (out, layout)
        assert torch.equal(unpack(got, out, layout, k), want)
        assert len(set(want.flatten().tolist())) >= 2  # not one clamped value
        checked += 1
    assert checked == len(OUTS)


def _params(k: int = 5, rows: int = 3, **changes) -> EpilogueParams:
    base = dict(multiplier=torch.full((k,), 2**40), shift=torch.full((k,), 50, dtype=torch.int32),
                shifted_bias=torch.zeros(k, dtype=torch.int64) + 7,
                residual=torch.arange(rows * k, dtype=torch.int32).reshape(rows, k) - 4,
                residual_multiplier=torch.full((k,), -(2**30)))
    base.update(changes)
    return EpilogueParams(**base)


def test_apply_epilogue_rejects_bad_residuals():
    epi = res_epi(U2, False)
    acc = torch.ones(3, 5, dtype=torch.int64)
    assert apply_epilogue(acc, epi, _params()).shape == (2, 3, 1)  # the good case runs
    bad = [
        (TypeError, "residual must be a torch.Tensor", dict(residual=None)),
        (TypeError, "residual_multiplier", dict(residual_multiplier=[1] * 5)),
        (ValueError, "torch.int32 tensor of shape", dict(residual=torch.ones(3, 5,
                                                                          dtype=torch.int16))),
        (ValueError, "of shape", dict(residual=torch.ones(3, 4, dtype=torch.int32))),
        (ValueError, "must lie in", dict(residual=torch.full((3, 5), 2**23, dtype=torch.int32))),
        (ValueError, "int64 vector", dict(multiplier=torch.full((5,), 9, dtype=torch.int32))),
        (ValueError, "int64 vector", dict(residual_multiplier=torch.ones(4, dtype=torch.int64))),
        (ValueError, "residual_multiplier must lie", dict(residual_multiplier=torch.full(
            (5,), 2**62))),
        (ValueError, "multiplier must lie", dict(multiplier=torch.full((5,), -1))),
        (ValueError, "can leave int64", dict(multiplier=torch.full((5,), 2**61))),
    ]
    for err, match, change in bad:
        with pytest.raises(err, match=match):
            apply_epilogue(acc * (2**4 if "leave" in match else 1), epi, _params(**change))
    with pytest.raises(ValueError, match="has no residual"):
        apply_epilogue(acc, Epilogue(out="u2", shifted_bias=True), _params())
    with pytest.raises(ValueError, match="cannot fold a residual"):
        requant_thresholds(epi, _params())
    assert len(bad) == 10


def test_check_params_proves_the_kernels_sum_fits_int64():
    """Kernels add the terms in 64 bits: check_params refuses multipliers whose worst-case
    sum (the workload's accumulator bound, the residual precision's range) reaches 2^63,
    before any launch, and checks no residual values (a buffer a previous layer fills)."""
    wl = GemmWorkload(M=3, N=5, K=1000, w=B1, a=U2, epilogue=res_epi(U2, False, I8))
    ok = _params(residual=torch.full((3, 5), 2**30, dtype=torch.int32))  # values unchecked
    check_params(wl, ok, torch.device("cpu"))
    check_params(wl, _params(multiplier=torch.full((5,), 2**51)), torch.device("cpu"))
    for change in (dict(multiplier=torch.full((5,), 2**53)),
                   dict(residual_multiplier=torch.full((5,), 2**40)),
                   dict(shifted_bias=torch.full((5,), 2**62 - 1),
                        multiplier=torch.full((5,), 2**51))):  # the sum, not one term
        with pytest.raises(ValueError, match="could overflow"):
            check_params(wl, _params(**change), torch.device("cpu"))


def test_random_inputs_of_residual_workloads():
    """random_inputs draws the residual term (both signs, the wide range), and the reference
    runs it: the outputs depend on the residual."""
    wl = ConvWorkload(w=B1, a=U2, w_layout=BP, a_layout=BP, epilogue=res_epi(U2, True), N=2,
                      H=5, W=6, C=64, K=40, R=3, S=3, stride=1, pad=1)
    x, w, p = random_inputs(wl, 3)
    assert p.residual.dtype == torch.int32 and p.residual.shape == (2, 5, 6, 40)
    assert int(p.residual.min()) < -(2**20) and int(p.residual.max()) > 2**20
    assert p.multiplier.dtype == torch.int64 and int(p.multiplier.max()) >= 2**31
    assert bool((p.residual_multiplier < 0).any()) and bool((p.residual_multiplier > 0).any())
    y = run(wl, x, w, p)
    flipped = EpilogueParams(**{**p.__dict__, "residual": -p.residual})
    assert not torch.equal(y, run(wl, x, w, flipped))


def test_templates_without_the_residual_term_refuse_it():
    """Every template that takes the layer without a residual term but does not declare
    takes_residual names the residual (or the shifted bias it needs) in its unsupported
    reason: none silently drops the term."""
    from lowbit.kernels import load_backends
    from lowbit.kernels.base import templates

    load_backends()
    s8 = Precision.parse("s8")
    plain = ConvWorkload(w="s8", a="s8", epilogue=Epilogue(bias=True, relu=True, out=s8),
                         N=2, H=6, W=6, C=64, K=40, R=3, S=3, stride=1, pad=1)
    wl = plain.replace(epilogue=res_epi(s8, True, Layout.INT8))
    checked = 0
    for t in templates():
        if getattr(t, "takes_residual", False) or t.unsupported_reason(plain) is not None:
            continue
        reason = t.unsupported_reason(wl)
        assert reason and ("residual" in reason or "shifted" in reason), (t.name, reason)
        checked += 1
    assert checked >= 3


# ------------------------------------------------------------------------------ bit-serial
#: the tap-shift config default_bitserial picks for ResNet-18's 56 x 56 x 64 block-ending
#: convs with a residual (multiply path)
TAP_SHIFT_NET = {"BM": 128, "BN": 64, "FUSE_PLANES": 0, "PERSIST": 1, "REQUANT": "multiply",
                 "ROWSUM": "cols", "ROW_TABLE": 2, "STAGES": 3, "SWIZZLE": 32, "TEAMS": 1,
                 "THR_PAIRS": 0, "WN": 64}

#: (id, family, workload, knob changes to the family's default config on sm_90a): the
#: families the w1a2 ResNets' block-ending layers run on (wgmma, tap-shift) first, then the
#: others; int32 and int16 residuals, relu on and off, 1/2/4/8-bit outputs, odd shapes
BITSERIAL_CASES = [
    ("wgmma_b1u2_u2_relu", "cuda.bitserial_wgmma",
     _conv(B1, U2, res_epi(U2, True), N=1, H=6, W=5, C=64, K=40), {}),
    ("wgmma_b1u2_s4_int8_res16", "cuda.bitserial_wgmma",
     _conv(B1, U2, res_epi(S4, False, I8, R16), N=1, H=5, W=7, C=64, K=37, R=1, S=1, pad=0),
     {}),
    ("tap_shift_b1u2_u2_relu", "cuda.bitserial_tap_shift",
     _conv(B1, U2, res_epi(U2, True), N=2, H=9, W=8, C=64, K=64), TAP_SHIFT_NET),
    ("tap_shift_b1u2_u1_res16", "cuda.bitserial_tap_shift",
     _conv(B1, U2, res_epi(Precision(1), False, BP, R16), N=2, H=9, W=8, C=64, K=64),
     TAP_SHIFT_NET),
    ("mma_sync_s2u2_u4_relu", "cuda.bitserial_mma_sync", _conv(S2, U2, res_epi(U4, True)), {}),
    ("mma_sync_persistent_s2u2_s8_int8", "cuda.bitserial_mma_sync_persistent",
     _conv(S2, U2, res_epi(S8, False, I8), N=1, H=6, W=6, C=40, K=33), {}),
    ("wgmma_persistent_gemm_u1_relu", "cuda.bitserial_wgmma_persistent",
     _gemm(B1, U2, res_epi(Precision(1), True), M=130, N=70, K=512), {}),
    ("int8_wgmma_s8_relu", "cuda.int8_wgmma",
     _conv(S8, Precision(7), res_epi(S8, True, I8), I8, N=1, H=5, W=6, C=36, K=40), {}),
]


def _needs_compiler() -> None:
    from lowbit.kernels.cuda.host_emu import compiler

    if compiler() is None:
        pytest.skip("needs a host C++ compiler")


def _emulate(name: str, wl: Workload, changes: dict, x, w, params, supplied=None):
    from lowbit.core import Config
    from lowbit.kernels.cuda import bitserial_emu

    family = _family(name)
    cfg = Config({**family.default_config(wl, "sm_90a"), **changes})
    assert cfg.get("REQUANT", "multiply") == "multiply"
    return bitserial_emu.emulate(family, wl, cfg, x, w, params, supplied=supplied)


@pytest.mark.parametrize("name,wl,changes", [pytest.param(*c[1:], id=c[0])
                                             for c in BITSERIAL_CASES])
def test_emulated_bitserial_kernels_are_bit_exact(name, wl, changes):
    """The multiply path with a residual equals the reference on fresh random inputs; the
    outputs depend on the residual (the same inputs with it negated differ)."""
    _needs_compiler()
    x, w, params = random_inputs(wl, seed=len(wl.key))
    got = _emulate(name, wl, changes, x, w, params)
    want = run(wl, x, w, params)
    assert torch.equal(got, want)
    k = wl.K if isinstance(wl, ConvWorkload) else wl.N
    values = unpack(want, wl.epilogue.out, wl.epilogue.out_layout, k)
    assert len(set(values.flatten().tolist())) >= 2  # not all clamped
    flipped = EpilogueParams(**{**params.__dict__, "residual": -params.residual})
    assert not torch.equal(want, run(wl, x, w, flipped))


@pytest.mark.parametrize("edit,k,wide", [
    (("+ res * cp.rmult", ""), 37, R16),
    (("(i64)reinterpret_cast<const short*>(ea.thr)[at]", "(i64)ea.thr[at]"), 37, R16),
    # an even K: the column pair's residuals arrive as one load (load_residual_pair)
    (("res[0] = (short)(v & 0xffffu);", "res[0] = (short)(v >> 16);"), 40, R16),
    (("res[1] = v.y;", "res[1] = v.x;"), 40, None),
    # the requantization's round half up (round_shift) truncated to a floor
    (("return (q >> 1) + (q & 1);", "return q >> 1;"), 37, R16),
], ids=["residual_dropped", "int16_read_as_int32", "int16_pair_crossed", "int32_pair_crossed",
        "rounding_floored"])
def test_emulation_catches_a_broken_residual_epilogue(edit, k, wide):
    """The exactness test fails when the kernel drops the residual term, reads an int16
    residual as int32 or crosses a column pair's residuals (a .cu file edited for the test)."""
    _needs_compiler()
    name, text = epilogue_part_holding(edit[0])
    wl = _conv(S2, U2, res_epi(S4, True, I8, *([wide] if wide else [])), K=k)
    x, w, params = random_inputs(wl, 3)
    good = _emulate("cuda.bitserial_mma_sync", wl, {}, x, w, params)
    assert torch.equal(good, run(wl, x, w, params))
    got = _emulate("cuda.bitserial_mma_sync", wl, {}, x, w, params,
                   supplied={name: text.replace(*edit)})
    assert not torch.equal(got, good)


def test_residual_renders_a_switch_that_stays_off_elsewhere():
    """The residual is HAS_BIAS = 3 (int32) / 4 (int16), no new rendered constant; residual
    workloads never take thresholds (REQUANT keeps 'multiply')."""
    from lowbit.kernels.cuda.bitserial_render import (
        RESIDUAL_I16,
        RESIDUAL_I32,
        SHIFTED_BIAS,
        constexpr_params,
    )
    from lowbit.kernels.cuda.bitserial_shape import threshold_epilogue

    family = _family("cuda.bitserial_wgmma")
    plain = _conv(B1, U2, Epilogue(shifted_bias=True, relu=True, out=U2, out_layout=BP), C=64,
                  K=64)
    spec = family.spec(family.default_config(plain, "sm_90a"))
    got = {}
    for wide in (None, R24, R16):
        epi = Epilogue(shifted_bias=True, relu=True, out=U2, out_layout=BP, residual=wide)
        got[wide] = constexpr_params(plain.replace(epilogue=epi), spec)
    assert [got[x]["HAS_BIAS"] for x in (None, R24, R16)] == [SHIFTED_BIAS, RESIDUAL_I32,
                                                              RESIDUAL_I16] == [2, 3, 4]
    assert set(got[R24]) == set(got[None])
    wl = plain.replace(epilogue=res_epi(U2, True))
    assert threshold_epilogue(plain) and not threshold_epilogue(wl)
    from lowbit.core import Config

    for w in (plain, wl):  # thresholds are in the plain workload's space, not the residual's
        cfg = Config({**family.default_config(plain, "sm_90a"), "REQUANT": "threshold",
                      "THR_PAIRS": 0})
        assert (family.space(w, "sm_90a").why_invalid(cfg) is None) == (w is plain)


@pytest.mark.parametrize("name,arch", [("cuda.bitserial_mma_sync", "sm_80"),
                                       ("cuda.bitserial_wgmma", "sm_90a"),
                                       ("cuda.bitserial_tap_shift", "sm_90a")])
def test_residual_path_compiles_with_nvrtc(name, arch):
    """The residual multiply path compiles for the device (the emulation compiles the same
    text for the host), int32 and int16 residuals."""
    from lowbit.core import Config
    from lowbit.kernels.cuda.nvrtc import compile_cubin

    family = _family(name)
    built = 0
    for wide in (R24, R16):
        wl = _conv(B1, U2, res_epi(U2, True, BP, wide), N=2, H=14, W=14, C=64, K=64)
        cfg = Config(family.default_config(wl, arch))
        assert len(compile_cubin(family.render(wl, cfg), arch)) > 1000
        built += 1
    assert built == 2


# ------------------------------------------------------------------------------ plans
def _residual_layers(plan) -> tuple[list, list]:
    """(layers with a residual and one requantized output, the other residual layers)."""
    res = [s for s in plan.layers if s.residual is not None]
    single = [s for s in res if len(s.layer_outputs) == 1 and s.layer_outputs[0].requantized
              and s.pool is None]
    return single, [s for s in res if s not in single]


@pytest.mark.parametrize("name,single,double", [("resnet18", 4, 4), ("resnet50", 4, 12)])
def test_plans_fuse_the_single_output_residual_layers(name, single, double):
    """w1a2 ResNets: every block-ending layer with one output (its block's output read only
    as the next block's conv input: the next block has a downsample shortcut or none is
    left) runs its kernel's own epilogue with the residual; those that also write the next
    block's wide residual keep the int32 pass."""
    plan = _plan(name)
    ones, twos = _residual_layers(plan)
    assert (len(ones), len(twos)) == (single, double)
    for s in ones:
        epi, o = s.workload.epilogue, s.layer_outputs[0]
        assert epi.residual == plan.tensors[s.residual].precision == WidePrecision(24)
        assert epi.shifted_bias and epi.relu == o.relu
        assert epi.out == plan.tensors[o.tensor].precision
        assert int(plan.params[o.multiplier].max()) >= 2**31  # the shared shift's wide m
    assert all(not s.workload.epilogue.requantizes for s in twos)


def test_accumulator_unit_plans_fuse_the_residual_with_a_shifted_bias():
    """exact_bias=False plans: the residual layers' bias (accumulator units times m) goes to
    the kernel at the output's shift too."""
    plan = _plan("resnet18", exact_bias=False)
    ones, _ = _residual_layers(plan)
    assert len(ones) == 4 and all(s.workload.epilogue.residual == WidePrecision(24)
                                  and s.workload.epilogue.shifted_bias for s in ones)


def test_planner_keeps_the_separate_pass_where_the_sum_could_overflow():
    from dataclasses import replace

    from lowbit.graph.kernel_epilogues import kernel_epilogue, residual_fits
    from lowbit.kernels.base import acc_bound

    plan = _plan("resnet18")
    step = _residual_layers(plan)[0][0]
    assert residual_fits(step, plan.tensors, plan.params)
    o = step.layer_outputs[0]
    params = dict(plan.params)
    params[o.multiplier] = params[o.multiplier].clone()
    params[o.multiplier][3] = 2**63 // acc_bound(step.workload)  # |acc| m alone near 2^63
    assert not residual_fits(step, plan.tensors, params)
    back = kernel_epilogue(replace(step, workload=step.workload.replace(
        epilogue=Epilogue())), plan.tensors, params)
    pass_acc = Epilogue(out="int16")  # w1a2: |acc| < 2^15 (test_accumulator_workload)
    assert back.workload.epilogue == pass_acc
    assert kernel_epilogue(step, plan.tensors).workload.epilogue == pass_acc  # no params


def test_planner_keeps_the_separate_pass_for_large_residual_outputs(monkeypatch):
    """Above RESIDUAL_FUSE_MAX_OUTPUTS output values (the measured crossover: the fused
    residual's 64-bit arithmetic then costs more than the separate pass) the layer keeps the
    separate pass (its int16 accumulator); at or below it the residual is fused."""
    from dataclasses import replace
    from math import prod

    from lowbit.graph import kernel_epilogues

    plan = _plan("resnet18")
    step = _residual_layers(plan)[0][0]
    size = prod(plan.tensors[step.layer_outputs[0].tensor].shape)
    plain = replace(step, workload=step.workload.replace(epilogue=Epilogue()))
    fused = kernel_epilogues.kernel_epilogue(plain, plan.tensors, plan.params).workload.epilogue
    assert fused.residual == WidePrecision(24)
    monkeypatch.setattr(kernel_epilogues, "RESIDUAL_FUSE_MAX_OUTPUTS", size - 1)
    back = kernel_epilogues.kernel_epilogue(plain, plan.tensors, plan.params).workload.epilogue
    assert back == Epilogue(out="int16")
    monkeypatch.setattr(kernel_epilogues, "RESIDUAL_FUSE_MAX_OUTPUTS", size)
    again = kernel_epilogues.kernel_epilogue(plain, plan.tensors, plan.params)
    assert again.workload.epilogue == fused


def test_a_plan_layer_through_the_emulation():
    """A fused residual layer of the ResNet-18 plan, with the plan's own multipliers (m past
    2^31) and bias and a random residual, through the emulated kernel of its family equals
    the reference."""
    from lowbit.core import Config
    from lowbit.kernels.cuda import bitserial_emu
    from lowbit.runtime.layers import kernel_params, packed_weight

    _needs_compiler()
    plan = _plan("resnet18")
    step = _residual_layers(plan)[0][-1]
    wl = step.workload
    g = torch.Generator().manual_seed(2)
    shape = out_storage(wl.replace(epilogue=Epilogue()))[0]
    wide = wl.epilogue.residual
    res = torch.randint(wide.qmin // 4, wide.qmax // 4, shape, generator=g,
                        dtype=torch.int32)
    params = kernel_params(step, plan, torch.device("cpu"), res)
    x = pack(torch.randint(0, 4, (wl.N, wl.H, wl.W, wl.C), generator=g), wl.a, wl.a_layout)
    w = packed_weight(step, plan, torch.device("cpu"))
    family = _family(step.impl)
    cfg = Config(family.default_config(wl, "sm_90a"))
    got = bitserial_emu.emulate(family, wl, cfg, x, w, params)
    want = run(wl, x, w, params)
    assert torch.equal(got, want)
    assert len(set(unpack(want, wl.epilogue.out, wl.epilogue.out_layout, wl.K).flatten()
                   .tolist())) >= 2


@pytest.mark.parametrize("name", ["resnet18", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_cpu_executors_give_the_reference_integers(name):
    """The GPU executor on the CPU (kernels through the reference shim, which runs the fused
    epilogue by `apply_epilogue` with the residual buffer) writes every tensor of the
    reference executor bit for bit."""
    plan = _plan(name)
    fused = [s for s in plan.layers if s.workload.epilogue.residual is not None]
    assert len(fused) == 4
    check_cpu_executor(plan, fused)


def test_residual_plans_round_trip_through_json():
    import json

    from lowbit.graph import Plan

    plan = _plan("resnet18")
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())), plan.params, plan.modules)
    got = [s.workload for s in again.layers]
    assert got == [s.workload for s in plan.layers]
    assert sum(wl.epilogue.residual is not None and "res24" in wl.key for wl in got) == 4


# ------------------------------------------------------------------------------ GPU
GPU_CASES = [
    ("wgmma_1x1_u2_relu", "cuda.bitserial_wgmma",
     _conv(B1, U2, res_epi(U2, True), N=8, H=14, W=14, C=256, K=512, R=1, S=1, pad=0), {}),
    ("wgmma_3x3_u2_relu", "cuda.bitserial_wgmma",
     _conv(B1, U2, res_epi(U2, True), N=4, H=14, W=14, C=128, K=128), {}),
    ("tap_shift_u2_relu", "cuda.bitserial_tap_shift",
     _conv(B1, U2, res_epi(U2, True), N=4, H=28, W=28, C=64, K=64), TAP_SHIFT_NET),
    ("wgmma_s4_int8_res16", "cuda.bitserial_wgmma",
     _conv(B1, U2, res_epi(S4, False, I8, R16), N=2, H=14, W=14, C=128, K=96), {}),
    ("mma_sync_u4", "cuda.bitserial_mma_sync",
     _conv(S2, U2, res_epi(U4, True), N=2, H=14, W=13, C=96, K=80), {}),
    ("wgmma_persistent_gemm_s8", "cuda.bitserial_wgmma_persistent",
     _gemm(B1, U2, res_epi(S8, True, I8), M=1000, N=200, K=1024), {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,wl,changes", [pytest.param(*c[1:], id=c[0]) for c in GPU_CASES])
def test_gpu_kernels_are_bit_exact(name, wl, changes):
    from lowbit.core import Config

    template = _family(name)
    x, w, params = random_inputs(wl, seed=len(wl.key))
    cfg = Config({**template.default_config(wl), **changes})
    kernel = template.build(wl, cfg)
    shape, dtype = out_storage(wl)
    out = torch.full(shape, 0x5A, dtype=dtype, device="cuda")
    got = kernel(x.cuda(), w.cuda(), params.to("cuda"), out=out)
    assert torch.equal(got.cpu(), run(wl, x, w, params)), (name, dict(cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_gpu_executor_gives_the_reference_integers(name):
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor

    plan = _plan(name)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    ex = GpuExecutor(plan, "cuda")
    y, got = ex(x.cuda(), record=True)
    y_ref, want = ReferenceExecutor(plan)(x, record=True)
    fused = [s for s in plan.layers if s.workload.epilogue.residual is not None]
    assert len(fused) == 4 and all("own epilogue" in ex.implementations()[s.name]
                                   for s in fused)
    for key, ref in want.items():
        assert torch.equal(got[key].cpu(), ref), key
    assert torch.equal(y.cpu(), y_ref)
