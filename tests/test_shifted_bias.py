"""The kernels' epilogue with the bias at the output's shift (Epilogue.shifted_bias, issue 32):
q = clamp(floor((acc m + b + 2^(s-1)) / 2^s), lo, qmax), b int64 in units of 2^-s output
steps. The reference (`apply_epilogue`) against exact Python integers, the requantization
thresholds against it, and the kernels that run it against the reference on fresh random
inputs: the bit-serial kernels through the host emulation (multiply path and thresholds), the
Triton int8 templates under the interpreter, and every family / template on a GPU (`gpu`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import lowbit.kernels.cuda
from lowbit.core import (
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    Workload,
    workload_from_json,
)
from lowbit.core.epilogue import SHIFTED_BIAS_LIMIT, EpilogueParams, bias_vector
from lowbit.core.validate import out_storage
from lowbit.quant.packing import pack, unpack
from lowbit.reference import apply_epilogue, random_inputs, requant_thresholds, run
from lowbit.reference.epilogue import shifted_bias_from, shifted_requantize

BP, I8, PK = Layout.BITPLANE, Layout.INT8, Layout.PACKED


def shifted(epi: Epilogue) -> Epilogue:
    """`epi` with its bias moved to the output's shift."""
    return Epilogue(relu=epi.relu, out=epi.out, out_layout=epi.out_layout, shifted_bias=True)


def shifted_inputs(wl: Workload, seed: int, extremes: bool = True
                   ) -> tuple[Workload, torch.Tensor, torch.Tensor, EpilogueParams]:
    """(the shifted-bias workload, x, w, params) from `random_inputs` of `wl` (an epilogue
    with an accumulator-unit bias): b = bias m plus random fractions of an output step (so
    outputs land on every side of rounding boundaries), and with `extremes` the first two
    channels' biases at +-(2^62 - 1) (always qmax / lo)."""
    x, w, p = random_inputs(wl, seed)
    b = shifted_bias_from(p.bias, p.multiplier, p.shift, torch.Generator().manual_seed(seed + 1))
    if extremes and b.shape[0] > 4:
        b[0], b[1] = SHIFTED_BIAS_LIMIT - 1, -(SHIFTED_BIAS_LIMIT - 1)
    params = EpilogueParams(multiplier=p.multiplier, shift=p.shift, shifted_bias=b)
    return wl.replace(epilogue=shifted(wl.epilogue)), x, w, params


def python_requantize(acc: list[list[int]], m: list[int], s: list[int], b: list[int], lo: int,
                      hi: int) -> list[list[int]]:
    """The formula in exact Python integers (>> floors)."""
    return [[min(max((a * mc + bc + (1 << (sc - 1))) >> sc, lo), hi)
             for a, mc, sc, bc in zip(row, m, s, b, strict=True)] for row in acc]


# ------------------------------------------------------------------------------ core
def test_epilogue_field_key_and_dicts():
    e = Epilogue(relu=True, out="u2", out_layout="bitplane", shifted_bias=True)
    assert e.key == "sbias+relu->u2/bitplane" and e.requantizes
    assert Epilogue.from_dict(e.to_dict()) == e
    old = Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane")
    assert "shifted_bias" not in old.to_dict() and old.key == "bias+relu->u2/bitplane"
    assert Epilogue.from_dict({"bias": True, "relu": True, "out": "u2",
                               "out_layout": "bitplane"}) == old
    wl = ConvWorkload(N=1, H=4, W=4, C=8, K=8, R=3, S=3, stride=1, pad=1, w="b1", a="u2",
                      epilogue=e)
    assert "sbias" in wl.key and workload_from_json(wl.to_json()) == wl
    checked = 0
    for kw, err in [(dict(out="int32"), ValueError), (dict(out="fp16"), ValueError),
                    (dict(bias=True, out="u2"), ValueError), (dict(out="u2"), None)]:
        if err is None:
            Epilogue(shifted_bias=True, **kw)
        else:
            with pytest.raises(err, match="shifted_bias"):
                Epilogue(shifted_bias=True, **kw)
        checked += 1
    with pytest.raises(TypeError, match="shifted_bias"):
        Epilogue(out="u2", shifted_bias=1)
    assert checked == 4


def test_bias_vector_picks_the_kernels_bias_argument():
    b32, b64 = torch.arange(3, dtype=torch.int32), torch.arange(3, dtype=torch.int64)
    p = EpilogueParams(bias=b32, shifted_bias=b64)
    assert bias_vector(Epilogue(bias=True, out="u2"), p) is b32
    assert bias_vector(Epilogue(out="u2", shifted_bias=True), p) is b64
    assert bias_vector(Epilogue(out="u2"), p) is None
    moved = p.to("cpu")
    assert torch.equal(moved.shifted_bias, b64)


# ------------------------------------------------------------------------------ reference
OUTS = [(Precision(1), BP), (Precision(2), BP), (Precision(2, "signed"), PK),
        (Precision(4, "signed"), I8), (Precision(4), PK), (Precision(8, "signed"), I8),
        (Precision(8), I8), (Precision(3, "signed"), BP)]


def near(shift: int) -> int:
    """A bias bound of 8 output steps at `shift` (within the 2^62 limit)."""
    return min(8 << shift, SHIFTED_BIAS_LIMIT - 1)


@pytest.mark.parametrize("relu", [False, True])
def test_apply_epilogue_matches_python_integers(relu):
    """Random int accumulators up to +-(2^32 - 1), multipliers in [0, 2^31), shifts 1..62 and
    biases up to +-(2^62 - 1), every output width and layout: apply_epilogue equals the
    formula in exact integers (where acc m + b + 2^(s-1) passes int64 too)."""
    rnd = random.Random(11 + relu)
    checked = 0
    for out, layout in OUTS:
        k, rows = 37, 9
        s = [rnd.choice([1, 2, 31, 61, 62]) if i < 5 else rnd.randint(1, 62) for i in range(k)]
        m = [rnd.choice([0, 1, 2**31 - 1]) if i < 3 else rnd.randint(0, 2**31 - 1)
             for i in range(k)]
        # biases near the useful range (|acc m| / 2^s levels) and at the extremes
        b = [rnd.randint(-(2**61), 2**61) if i % 3 == 0 else
             rnd.choice([SHIFTED_BIAS_LIMIT - 1, -(SHIFTED_BIAS_LIMIT - 1)]) if i % 7 == 1 else
             rnd.randint(-near(s[i]), near(s[i])) for i in range(k)]
        acc = [[rnd.choice([2**32 - 1, -(2**32 - 1), 0]) if rnd.random() < 0.1 else
                rnd.randint(-(2**32 - 1), 2**32 - 1) >> rnd.randint(0, 31) for _ in range(k)]
               for _ in range(rows)]
        epi = Epilogue(relu=relu, out=out, out_layout=layout, shifted_bias=True)
        params = EpilogueParams(multiplier=torch.tensor(m, dtype=torch.int32),
                                shift=torch.tensor(s, dtype=torch.int32),
                                shifted_bias=torch.tensor(b, dtype=torch.int64))
        got = apply_epilogue(torch.tensor(acc, dtype=torch.int64), epi, params)
        lo = max(out.qmin, 0) if relu else out.qmin
        want = torch.tensor(python_requantize(acc, m, s, b, lo, out.qmax))
        assert torch.equal(got, pack(want, out, layout)), (out, layout)
        assert torch.equal(unpack(got, out, layout, k), want)
        assert len(set(want.flatten().tolist())) >= 2  # not one clamped value
        checked += 1
    assert checked == len(OUTS)


def test_apply_epilogue_rejects_bad_vectors():
    epi = Epilogue(out="u2", shifted_bias=True)
    acc = torch.randint(-100, 100, (3, 4))
    m, s = torch.full((4,), 5, dtype=torch.int32), torch.full((4,), 3, dtype=torch.int32)
    b = torch.zeros(4, dtype=torch.int64)
    cases = [
        (TypeError, "shifted_bias", EpilogueParams(multiplier=m, shift=s)),
        (ValueError, "shifted_bias", EpilogueParams(multiplier=m, shift=s,
                                                    shifted_bias=b.to(torch.int32))),
        (ValueError, "length 4", EpilogueParams(multiplier=m, shift=s, shifted_bias=b[:3])),
        (ValueError, "2\\^62", EpilogueParams(multiplier=m, shift=s,
                                              shifted_bias=b + SHIFTED_BIAS_LIMIT)),
        (ValueError, "2\\^62", EpilogueParams(multiplier=m, shift=s,
                                              shifted_bias=b - SHIFTED_BIAS_LIMIT)),
        (ValueError, "params.bias", EpilogueParams(bias=b.to(torch.int32), multiplier=m,
                                                   shift=s, shifted_bias=b)),
        (ValueError, "multiplier", EpilogueParams(multiplier=m - 6, shift=s, shifted_bias=b)),
        (ValueError, "multiplier", EpilogueParams(multiplier=m.long() + 2**31, shift=s,
                                                  shifted_bias=b)),
        (ValueError, "shift", EpilogueParams(multiplier=m, shift=s - 3, shifted_bias=b)),
        (ValueError, "shift", EpilogueParams(multiplier=m, shift=s + 60, shifted_bias=b)),
        (TypeError, "multiplier", EpilogueParams(multiplier=m.float(), shift=s,
                                                 shifted_bias=b)),
    ]
    for err, match, params in cases:
        with pytest.raises(err, match=match):
            apply_epilogue(acc, epi, params)
    good = EpilogueParams(multiplier=m, shift=s, shifted_bias=b)
    with pytest.raises(ValueError, match="2\\^32"):
        apply_epilogue(acc + 2**32, epi, good)
    assert apply_epilogue(acc, epi, good).shape == (3, 4)
    assert len(cases) == 11


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("out", [Precision(1), Precision(2), Precision(2, "signed"),
                                 Precision(4, "signed")], ids=str)
def test_thresholds_equal_the_shifted_requantization(out, relu):
    """qmin + #{k : y >= T[c, k]} == shifted_requantize(y) for accumulators on both sides of
    every threshold, random ones and the int32 extremes (m = 0 and huge biases included)."""
    rnd = random.Random(hash((str(out), relu)) % 1000)
    k = 24
    s = [rnd.randint(1, 40) for _ in range(k)]
    m = [0 if i == 0 else rnd.randint(1, 2**31 - 1) >> rnd.randint(0, 30) or 1
         for i in range(k)]
    b = [rnd.randint(-(2**61), 2**61) >> rnd.randint(0, 61) for _ in range(k)]
    b[1], b[2] = SHIFTED_BIAS_LIMIT - 1, -(SHIFTED_BIAS_LIMIT - 1)
    epi = Epilogue(relu=relu, out=out, out_layout=BP if out.bits <= 2 else I8,
                   shifted_bias=True)
    params = EpilogueParams(multiplier=torch.tensor(m, dtype=torch.int32),
                            shift=torch.tensor(s, dtype=torch.int32),
                            shifted_bias=torch.tensor(b, dtype=torch.int64))
    thr = requant_thresholds(epi, params)
    assert thr.shape == (k, out.qmax - out.qmin) and thr.dtype == torch.int32
    lim = 2**31 - 2
    ys = set(range(-3, 4)) | {lim, -lim}
    ys |= {min(max(t + d, -lim), lim) for t in thr.flatten().tolist() for d in (-1, 0, 1)}
    ys |= {rnd.randint(-lim, lim) for _ in range(200)}
    y = torch.tensor(sorted(ys), dtype=torch.int64)
    acc = y[:, None].expand(-1, k)
    want = shifted_requantize(acc, epi, params)
    got = out.qmin + _count(acc, thr)
    assert torch.equal(got, want)
    lo = max(out.qmin, 0) if relu else out.qmin
    assert len(set(want.flatten().tolist())) >= min(3, out.qmax - lo + 1)
    assert want.numel() == len(y) * k >= 200 * k


def _count(acc: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """#{k : acc[r, c] >= thr[c, k]} per accumulator."""
    return (acc[:, :, None] >= thr.to(torch.int64)[None, :, :]).sum(-1)


# ------------------------------------------------------------------------------ bit-serial
def _conv(w: Precision, a: Precision, epi: Epilogue, layout: Layout = BP, **dims
          ) -> ConvWorkload:
    shape = dict(N=2, H=7, W=5, C=45, K=37, R=3, S=3, stride=1, pad=1)
    shape.update(dims)
    return ConvWorkload(w=w, a=a, w_layout=layout, a_layout=layout, epilogue=epi, **shape)


def _gemm(w: Precision, a: Precision, epi: Epilogue, layout: Layout = BP, **dims
          ) -> GemmWorkload:
    shape = dict(M=77, N=45, K=300)
    shape.update(dims)
    return GemmWorkload(w=w, a=a, w_layout=layout, a_layout=layout, epilogue=epi, **shape)


U2, S2, U4, S4 = Precision(2), Precision(2, "signed"), Precision(4), Precision(4, "signed")
B1, S8 = Precision(1, "binary"), Precision(8, "signed")


def _epi(out: Precision, relu: bool, layout: Layout = BP) -> Epilogue:
    return Epilogue(bias=True, relu=relu, out=out, out_layout=layout)


#: the tap-shift config default_bitserial picks for ResNet's 56 x 56 x 64 3x3 w1a2 layers on
#: sm_90a: persistent, thresholds of two columns per add (THR_PAIRS)
TAP_SHIFT_NET = {"BM": 128, "BN": 64, "FUSE_PLANES": 0, "PERSIST": 1, "REQUANT": "threshold",
                 "ROWSUM": "cols", "ROW_TABLE": 2, "STAGES": 3, "SWIZZLE": 32, "TEAMS": 1,
                 "THR_PAIRS": 1, "WN": 64}

#: (id, family name, workload with an accumulator-unit bias, knob changes to the family's
#: default config on sm_90a): the multiply path (SHIFTED_BIAS in bitserial_epilogue.cu) and
#: thresholds (host-folded), the families the networks' w1a2 layers run on first
BITSERIAL_CASES = [
    ("wgmma_threshold_b1u2_relu", "cuda.bitserial_wgmma",
     _conv(B1, U2, _epi(U2, True), N=1, H=6, W=5, C=64, K=40), {"REQUANT": "threshold"}),
    ("wgmma_multiply_b1u2_relu", "cuda.bitserial_wgmma",
     _conv(B1, U2, _epi(U2, True), N=1, H=6, W=5, C=64, K=40), {"REQUANT": "multiply"}),
    ("wgmma_multiply_s2u2_s4_int8", "cuda.bitserial_wgmma",
     _conv(S2, U2, _epi(S4, False, I8), N=1, H=5, W=7, C=45, K=37), {}),
    ("mma_sync_multiply_s2u2_u4_relu", "cuda.bitserial_mma_sync",
     _conv(S2, U2, _epi(U4, True)), {}),
    ("mma_sync_threshold_b1b1_s2", "cuda.bitserial_mma_sync",
     _conv(B1, B1, _epi(S2, False), N=1, H=6, W=6, C=40, K=33), {"REQUANT": "threshold"}),
    ("tap_shift_threshold_pairs_b1u2", "cuda.bitserial_tap_shift",
     _conv(B1, U2, _epi(U2, True), N=2, H=9, W=8, C=64, K=64), TAP_SHIFT_NET),
    ("tap_shift_multiply_b1u2", "cuda.bitserial_tap_shift",
     _conv(B1, U2, _epi(U2, True), N=2, H=9, W=8, C=64, K=64),
     {**TAP_SHIFT_NET, "REQUANT": "multiply", "THR_PAIRS": 0}),
    ("wgmma_persistent_gemm_multiply_u1", "cuda.bitserial_wgmma_persistent",
     _gemm(B1, U2, _epi(Precision(1), True), M=130, N=70, K=512), {"REQUANT": "multiply"}),
    ("int8_wgmma_s8_relu", "cuda.int8_wgmma",
     _conv(S8, Precision(7), _epi(S8, True, I8), I8, N=1, H=5, W=6, C=36, K=40), {}),
]


def _family(name: str):
    from lowbit.kernels import get_template, load_backends

    load_backends()
    return get_template(name)


def _emulated(name: str, wl: Workload, changes: dict, seed: int):
    """(emulated output, reference, config) of the shifted-bias variant of `wl`."""
    from lowbit.core import Config
    from lowbit.kernels.cuda import bitserial_emu

    family = _family(name)
    swl, x, w, params = shifted_inputs(wl, seed)
    cfg = Config({**family.default_config(swl, "sm_90a"), **changes})
    return bitserial_emu.emulate(family, swl, cfg, x, w, params), run(swl, x, w, params), cfg


@pytest.mark.parametrize("name,wl,changes", [pytest.param(*c[1:], id=c[0])
                                             for c in BITSERIAL_CASES])
def test_emulated_bitserial_kernels_are_bit_exact(name, wl, changes):
    from lowbit.kernels.cuda.host_emu import compiler

    if compiler() is None:
        pytest.skip("needs a host C++ compiler")
    got, want, cfg = _emulated(name, wl, changes, seed=len(wl.key))
    assert torch.equal(got, want), cfg
    k = wl.K if isinstance(wl, ConvWorkload) else wl.N
    values = unpack(want, wl.epilogue.out, wl.epilogue.out_layout, k)
    assert len(set(values.flatten().tolist())) >= 2  # not all clamped
    if "REQUANT" in cfg:
        assert cfg["REQUANT"] == changes.get("REQUANT", cfg["REQUANT"])


def test_shifted_bias_renders_a_switch_that_stays_off_elsewhere():
    """The shifted bias is HAS_BIAS = 2, a compile-time switch: the kernels of every other
    epilogue render as before (and compile to the recorded SASS: tests/test_cuda_bitserial.py)."""
    from lowbit.kernels.cuda.bitserial_render import SHIFTED_BIAS, constexpr_params

    family = _family("cuda.bitserial_mma_sync")
    wl = _conv(S2, U2, _epi(U4, True))
    on = wl.replace(epilogue=shifted(wl.epilogue))
    spec = family.spec(family.default_config(wl, "sm_90a"))
    assert constexpr_params(wl, spec)["HAS_BIAS"] == 1
    assert constexpr_params(wl.replace(epilogue=Epilogue(out="u4")), spec)["HAS_BIAS"] == 0
    assert constexpr_params(on, spec)["HAS_BIAS"] == SHIFTED_BIAS == 2
    assert set(constexpr_params(on, spec)) == set(constexpr_params(wl, spec))


def epilogue_part_holding(snippet: str) -> tuple[str, str]:
    """(file name, text) of the one bit-serial epilogue part (`bitserial_epilogue*.cu`) that
    holds `snippet`, exactly once among all the parts."""
    from lowbit.kernels.cuda.cu_source import cu_file

    folder = Path(lowbit.kernels.cuda.__file__).parent
    texts = {p.name: cu_file(p.name) for p in sorted(folder.glob("bitserial_epilogue*.cu"))}
    holding = [(n, t) for n, t in texts.items() if snippet in t]
    assert len(holding) == 1 and holding[0][1].count(snippet) == 1, (snippet, holding)
    return holding[0]


@pytest.mark.parametrize("edit", [("(i64)y * cp.mult + cp.sbias", "(i64)y * cp.mult"),
                                  ("(RELU && HAS_BIAS >= 2 && OUT_QMIN < 0)", "(false)")],
                         ids=["bias_dropped", "relu_clamp_dropped"])
def test_emulation_catches_a_broken_shifted_epilogue(edit):
    """The multiply path's exactness test fails when the kernel drops the shifted bias or
    ReLU's clamp (a .cu file edited for the test)."""
    from lowbit.core import Config
    from lowbit.kernels.cuda import bitserial_emu
    from lowbit.kernels.cuda.host_emu import compiler

    if compiler() is None:
        pytest.skip("needs a host C++ compiler")
    name, text = epilogue_part_holding(edit[0])
    family = _family("cuda.bitserial_mma_sync")
    wl = _conv(S2, U2, _epi(S4, True, I8))
    swl, x, w, params = shifted_inputs(wl, 3)
    cfg = Config(family.default_config(swl, "sm_90a"))
    got = bitserial_emu.emulate(family, swl, cfg, x, w, params,
                                supplied={name: text.replace(*edit)})
    assert not torch.equal(got, run(swl, x, w, params))


# ------------------------------------------------------------------------------ Triton
#: tiny tiles the interpreter runs quickly (outside the H100 space), and split-K in a second
#: kernel (its epilogue reads the bias too)
TINY = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=2,
            SPLIT_K=1)

TRITON_CASES = [  # (id, workload with an accumulator-unit bias, config changes)
    ("conv_s8_relu_stride2", ConvWorkload(N=2, H=7, W=9, C=19, K=37, R=3, S=3, stride=2, pad=1,
                                          epilogue=_epi(S8, True, I8)), {}),
    ("conv_u2_bitplane_relu", ConvWorkload(N=1, H=5, W=7, C=13, K=40, R=3, S=3, stride=1,
                                           pad=1, epilogue=_epi(U2, True)), {}),
    ("conv_s4_packed_split3", ConvWorkload(N=1, H=6, W=5, C=33, K=37, R=3, S=2, stride=1,
                                           pad=1, epilogue=_epi(S4, False, PK)),
     {"SPLIT_K": 3, "LOOP_ORDER": "crs"}),
    ("gemm_u1_packed_relu", GemmWorkload(M=37, N=45, K=83, epilogue=_epi(Precision(1), True,
                                                                         PK)), {}),
    ("gemm_s2_bitplane_split3", GemmWorkload(M=37, N=45, K=83, epilogue=_epi(S2, False)),
     {"SPLIT_K": 3}),
]


def assert_interpreted_exact(swl: Workload, changes: dict, x, w, params, dot_fp16: bool):
    """The interpreted implicit-GEMM kernel of `swl` (TINY tiles with `changes`) equals the
    reference in a poisoned buffer, with at least two output levels."""
    from lowbit.core import Config
    from lowbit.kernels.triton import IgemmKernel
    from lowbit.kernels.triton.templates import problem

    cfg = {**TINY, **({"LOOP_ORDER": "rsc"} if isinstance(swl, ConvWorkload) else {}),
           **changes}
    kernel = IgemmKernel("test", swl, Config(cfg), problem(swl, dot_fp16))
    shape, dtype = out_storage(swl)
    out = kernel(x, w, params, out=torch.full(shape, 0x5A, dtype=dtype))
    want = run(swl, x, w, params)
    assert torch.equal(out, want), cfg
    k = swl.K if isinstance(swl, ConvWorkload) else swl.N
    assert len(set(unpack(want, swl.epilogue.out, swl.epilogue.out_layout, k)
                   .flatten().tolist())) >= 2


@pytest.mark.parametrize("wl,changes", [pytest.param(*c[1:], id=c[0]) for c in TRITON_CASES])
@pytest.mark.parametrize("dot_fp16", [False, True], ids=["int8", "fp16"])
def test_interpreted_triton_templates_are_bit_exact(wl, changes, dot_fp16):
    from lowbit.kernels.triton.templates import interpreting

    if not interpreting():
        pytest.skip("the interpreter's tiny tiles (GPU: test_gpu_templates_are_bit_exact)")
    swl, x, w, params = shifted_inputs(wl, seed=len(wl.key))
    assert_interpreted_exact(swl, changes, x, w, params, dot_fp16)


@pytest.mark.parametrize("wl,changes", [pytest.param(*c[1:], id=c[0]) for c in TRITON_CASES])
def test_interpreted_triton_float64_requantization_is_bit_exact(wl, changes):
    """Where acc_bound m + |b| + 2^(s-1) < 2^53 (multipliers of ~20 bits, as the planner
    picks them) the Triton epilogue requantizes in float64 (HAS_BIAS 3), with the same
    integers as the int64 formula: half-way sums and every output level included."""
    from lowbit.kernels.base import acc_bound
    from lowbit.kernels.triton.epilogue import BIAS_SHIFTED_FLOAT64
    from lowbit.kernels.triton.templates import interpreting, problem, with_float64_requant

    if not interpreting():
        pytest.skip("the interpreter's tiny tiles (GPU: test_gpu_templates_are_bit_exact)")
    x, w, p = random_inputs(wl, seed=len(wl.key) + 1)
    drop = 10
    assert bool((p.shift > drop).all())
    m, sh = torch.clamp(p.multiplier >> drop, min=1), p.shift - drop
    b = shifted_bias_from(p.bias, m, sh, torch.Generator().manual_seed(3))
    params = EpilogueParams(multiplier=m, shift=sh, shifted_bias=b)
    swl = wl.replace(epilogue=shifted(wl.epilogue))
    prob, vecs = with_float64_requant(swl, problem(swl, False), params, (b, None, m, sh), "cpu")
    assert prob.bias == BIAS_SHIFTED_FLOAT64 and vecs[0].dtype == torch.float64
    assert acc_bound(swl) * int(m.max()) < 2**53
    assert_interpreted_exact(swl, changes, x, w, params, False)
    # the extremes of shifted_inputs (|b| near 2^62) keep the int64 form
    swl2, _, _, extreme = shifted_inputs(wl, seed=1)
    assert with_float64_requant(swl2, problem(swl2, False), extreme, (None,) * 4, "cpu")[0] \
        .bias != BIAS_SHIFTED_FLOAT64


def test_triton_bind_rejects_a_missing_or_narrow_shifted_bias():
    from lowbit.core import Config
    from lowbit.kernels.triton import IgemmKernel
    from lowbit.kernels.triton.templates import problem

    wl = GemmWorkload(M=17, N=9, K=20, epilogue=_epi(S8, True, I8))
    swl, x, w, params = shifted_inputs(wl, seed=1)
    kernel = IgemmKernel("test", swl, Config(TINY), problem(swl, False))
    bad = [(TypeError, EpilogueParams(multiplier=params.multiplier, shift=params.shift)),
           (ValueError, EpilogueParams(multiplier=params.multiplier, shift=params.shift,
                                       shifted_bias=params.shifted_bias.to(torch.int32)))]
    for err, p in bad:
        with pytest.raises(err, match="shifted_bias"):
            kernel.bind(x, w, p)
    assert len(bad) == 2


# ------------------------------------------------------------------------------ plans
def _plan(name: str, size: tuple[int, int] = (32, 32), exact_bias: bool = True):
    import warnings

    from engine_cases import calibrated
    from lowbit.graph import build_plan, trace_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q, calib = calibrated(name, "w1a2", seed=4, size=size, width=0.125)
        plan = build_plan(trace_model(q.eval(), calib), tuple(calib.shape),
                          exact_bias=exact_bias)
    return plan


def _fusable(plan) -> list:
    """Layers with one output requantized to a Precision and no residual (max-pooled or not:
    a pooled layer's kernel writes the full-size output, then the pool runs)."""
    return [s for s in plan.layers if len(s.layer_outputs) == 1 and s.residual is None
            and s.layer_outputs[0].requantized
            and isinstance(plan.tensors[s.layer_outputs[0].tensor].precision, Precision)]


@pytest.mark.parametrize("name,blocks", [("resnet18", 8), ("resnet50", 33)])
def test_exact_bias_plans_fuse_every_single_output_layer(name, blocks):
    """w1a2 ResNets with exact biases: every layer without residual or wide output (conv1 of
    each basic block; conv1 and conv2 of each bottleneck; ResNet-50's pooled first conv,
    whose one output is 2-bit: its next layer is bit-serial) runs its kernel's own
    epilogue with the output's bias at its shift; the others write int32 for the pass, but
    for the residual layers of test_residual_epilogue.py."""
    plan = _plan(name)
    fusable = _fusable(plan)
    assert len(fusable) == blocks
    fused = [s for s in plan.layers if s.workload.epilogue.requantizes and s.residual is None]
    assert {s.name for s in fused} == {s.name for s in fusable}
    shifted_steps = [s for s in fused if s.workload.epilogue.shifted_bias]
    assert len(shifted_steps) == blocks  # BN biases are no multiples of the multipliers
    for s in fused:
        epi, o = s.workload.epilogue, s.layer_outputs[0]
        assert epi.relu == o.relu and epi.out == plan.tensors[o.tensor].precision
        assert epi.shifted_bias != (s.bias is not None)


def test_accumulator_unit_plans_keep_their_kernel_bias():
    """exact_bias=False plans fuse the same layers with the bias in accumulator units (and
    the residual layers with it at the output's shift: test_residual_epilogue.py)."""
    plan = _plan("resnet18", exact_bias=False)
    fused = [s for s in plan.layers if s.workload.epilogue.requantizes and s.residual is None]
    assert len(fused) == len(_fusable(plan)) == 8
    assert all(s.workload.epilogue.bias and not s.workload.epilogue.shifted_bias
               for s in fused)


def test_planner_leaves_templates_without_shifted_bias_the_int32_pass():
    from lowbit.graph.kernel_epilogues import takes_shifted_bias

    assert takes_shifted_bias("cuda.bitserial_wgmma") and takes_shifted_bias("cuda.int8_wgmma")
    assert takes_shifted_bias("triton.conv2d_int8") and takes_shifted_bias("triton.gemm_int8")
    assert takes_shifted_bias("triton.conv2d_int8_tma")
    assert not takes_shifted_bias("cuda.mma_conv_s8") and not takes_shifted_bias("torch.fp16")
    assert not takes_shifted_bias("no.such_template")


@pytest.mark.parametrize("name", ["resnet18", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_cpu_executors_give_the_reference_integers(name):
    """The GPU executor on the CPU (kernels through the reference shim, which runs the fused
    epilogue by `apply_epilogue`) writes every tensor of the reference executor (which
    requantizes each output itself) bit for bit, the shifted-bias layers' outputs included."""
    plan = _plan(name)
    fused = [s for s in plan.layers if s.workload.epilogue.shifted_bias]
    assert fused
    check_cpu_executor(plan, fused)


def check_cpu_executor(plan, fused: list) -> None:
    """The GPU executor with interpreted kernels against the reference executor on 4 random
    images: every recorded tensor and the logits equal; each `fused` layer ran its kernel's
    own epilogue and its output holds more than one value."""
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor
    from lowbit.runtime.layers import interpreted_kernel

    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    ex = GpuExecutor(plan, "cpu", kernels=interpreted_kernel)
    y, got = ex(x, record=True)
    y_ref, want = ReferenceExecutor(plan)(x, record=True)
    fused = [s for s in fused if s.name not in ex.stems]  # a fused stem writes its own outputs
    assert fused and all("own epilogue" in ex.implementations()[s.name] for s in fused)
    assert set(got) == set(want)
    for key, ref in want.items():
        assert torch.equal(got[key], ref), key
    assert torch.equal(y, y_ref)
    outs = [s.layer_outputs[0].tensor for s in fused]
    assert all(len(set(want[t].flatten().tolist())) > 1 for t in outs)


# ------------------------------------------------------------------------------ GPU
#: (id, template, workload with an accumulator-unit bias, config changes to its default):
#: every bit-serial family, cuda.int8_wgmma and the Triton int8 templates, both requantization
#: modes of the bit-serial epilogue
GPU_CASES = [
    ("mma_sync_multiply", "cuda.bitserial_mma_sync",
     _conv(B1, U2, _epi(U4, True), N=2, H=14, W=13, C=96, K=80), {}),
    ("mma_sync_threshold", "cuda.bitserial_mma_sync",
     _conv(B1, U2, _epi(U2, True), N=2, H=14, W=13, C=96, K=80), {"REQUANT": "threshold"}),
    ("mma_sync_persistent_multiply", "cuda.bitserial_mma_sync_persistent",
     _conv(S2, U2, _epi(S4, False, I8), N=4, H=14, W=14, C=128, K=96), {}),
    ("wgmma_multiply", "cuda.bitserial_wgmma",
     _conv(B1, U2, _epi(U2, True), N=2, H=14, W=14, C=128, K=128), {"REQUANT": "multiply"}),
    ("wgmma_threshold", "cuda.bitserial_wgmma",
     _conv(B1, U2, _epi(U2, True), N=2, H=14, W=14, C=128, K=128), {"REQUANT": "threshold"}),
    ("wgmma_persistent_gemm_multiply", "cuda.bitserial_wgmma_persistent",
     _gemm(B1, U2, _epi(S4, True, I8), M=1000, N=200, K=1024), {}),
    ("tap_shift_threshold", "cuda.bitserial_tap_shift",
     _conv(B1, U2, _epi(U2, True), N=4, H=28, W=28, C=64, K=64), TAP_SHIFT_NET),
    ("tap_shift_multiply", "cuda.bitserial_tap_shift",
     _conv(B1, U2, _epi(U2, False), N=4, H=28, W=28, C=64, K=64),
     {**TAP_SHIFT_NET, "REQUANT": "multiply", "THR_PAIRS": 0}),
    ("int8_wgmma", "cuda.int8_wgmma",
     _conv(S8, Precision(7), _epi(S8, True, I8), I8, N=4, H=14, W=14, C=64, K=96), {}),
    ("triton_conv2d_int8", "triton.conv2d_int8",
     ConvWorkload(N=2, H=15, W=13, C=35, K=70, R=3, S=3, stride=2, pad=1,
                  epilogue=_epi(U4, True, PK)), {}),
    ("triton_gemm_int8", "triton.gemm_int8",
     GemmWorkload(M=300, N=130, K=333, epilogue=_epi(S2, False)), {}),
    ("triton_conv2d_int8_tma", "triton.conv2d_int8_tma",
     ConvWorkload(N=4, H=14, W=14, C=64, K=128, R=3, S=3, stride=1, pad=1,
                  epilogue=_epi(S8, True, I8)), {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,wl,changes", [pytest.param(*c[1:], id=c[0]) for c in GPU_CASES])
def test_gpu_templates_are_bit_exact(name, wl, changes):
    from lowbit.core import Config

    template = _family(name)
    swl, x, w, params = shifted_inputs(wl, seed=len(wl.key))
    cfg = Config({**template.default_config(swl), **changes})
    kernel = template.build(swl, cfg)
    shape, dtype = out_storage(swl)
    out = torch.full(shape, 0x5A, dtype=dtype, device="cuda")
    got = kernel(x.cuda(), w.cuda(), params.to("cuda"), out=out)
    assert torch.equal(got.cpu(), run(swl, x, w, params)), (name, dict(cfg))


@pytest.mark.parametrize("name,arch", [("cuda.bitserial_mma_sync", "sm_80"),
                                       ("cuda.bitserial_wgmma", "sm_90a")])
def test_multiply_path_compiles_with_nvrtc(name, arch):
    """The SHIFTED_BIAS multiply path compiles for the device (the emulation compiles the same
    text for the host)."""
    from lowbit.core import Config
    from lowbit.kernels.cuda.nvrtc import compile_cubin

    family = _family(name)
    wl = _conv(B1, U2, _epi(U4, True), C=64, K=64)
    swl = wl.replace(epilogue=shifted(wl.epilogue))
    cfg = Config(family.default_config(swl, arch))
    assert cfg.get("REQUANT", "multiply") == "multiply"
    assert len(compile_cubin(family.render(swl, cfg), arch)) > 1000


def test_shifted_bias_plans_round_trip_through_json():
    """A plan's shifted-bias kernel epilogues survive its manifest (Workload / Epilogue
    dicts); the workload keys (tuning records) carry 'sbias'."""
    import json

    from lowbit.graph import Plan

    plan = _plan("resnet18")
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())), plan.params, plan.modules)
    got = [s.workload for s in again.layers]
    assert got == [s.workload for s in plan.layers]
    assert sum(wl.epilogue.shifted_bias and wl.epilogue.residual is None and "sbias" in wl.key
               for wl in got) == 8


def test_random_inputs_and_checks_of_shifted_bias_workloads():
    """Tuning and benchmarks draw inputs with `random_inputs`: a shifted-bias workload gets an
    int64 shifted bias (no accumulator-unit bias) that the reference runs; the common param
    check rejects a missing one; the template without the mode says so."""
    from lowbit.core.validate import check_params
    from lowbit.kernels import get_template, load_backends

    wl = ConvWorkload(N=2, H=5, W=7, C=32, K=40, R=3, S=3, pad=1, w="b1", a="u2",
                      epilogue=Epilogue(relu=True, out="u2", out_layout=I8, shifted_bias=True))
    x, w, p = random_inputs(wl, seed=11)
    assert p.bias is None and p.shifted_bias.dtype == torch.int64
    assert p.shifted_bias.shape == (40,) and int(p.shifted_bias.abs().max()) > 0
    out = run(wl, x, w, p)
    assert out.shape == (2, 5, 7, 40) and 0 < int(out.max()) <= 3
    check_params(wl, p, torch.device("cpu"))
    with pytest.raises((TypeError, ValueError), match="shifted_bias"):
        check_params(wl, EpilogueParams(multiplier=p.multiplier, shift=p.shift),
                     torch.device("cpu"))
    load_backends()
    reasons = [get_template(n).unsupported_reason(wl.replace(a="s8", w="s8"))
               for n in ("cuda.mma_conv_s8",)]
    assert all(r and "shifted_bias" in r for r in reasons)
