"""The weight-streaming split-K GEMV template (`triton.gemv_int8`) and its dispatch.

CPU: under TRITON_INTERPRET=1 on small odd shapes (M = 1, 3, 16; K = 100, 1001; N = 1, 513),
every epilogue, packed inputs, the shifted bias, deep and ragged K splits, a bound launcher
reused across calls (the atomic sum workspace must be left at zero), bad input; the config
space and default; the weight-streaming estimate and the zero-tuning choices (dispatch and the
engine's default policy). u8 activations (the zero-point rewrite) at M = 1 and 8 with int32,
fp16 and requantized outputs, split and unsplit, on inputs with a quarter of the values at the
operands' extremes (a: 0 / 255, w: -128 / 127; a row at the worst-case accumulator), and their
exactness bound. Convs of M = N*P*Q <= 64 pixels (the implicit-GEMM gather): C = 3, 72,
100, K not a multiple of 16, stride 2, pad 0 and 1, H != W, R != S, M = 1 and 64, 1x1 convs
(stride 1 unpadded: the GEMM path), every epilogue, u8 activations on padded convs (random and
extreme), packed operands, the shifted bias, the refusals (M > 64 among them), the defaults
and streaming estimate of the probe's layers and the probe's conv rows. Every integer output
is compared bit for bit with `lowbit.reference.run` on fresh random inputs into a poisoned
buffer. GPU (`gpu` mark): the FC shapes of the issue at the default config and a deep split,
exact, the VGG classifier's u8 x s8 GEMM, a CUDA-graph replay, the probe's batch-1 convs and
the CPU conv shapes.
"""

from __future__ import annotations

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Workload
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.hardware import H100, H200, TARGET
from lowbit.kernels import load_backends
from lowbit.kernels.triton.gemv import (
    ACT_ZERO_POINT,
    GEMV_MAX_M,
    GemvInt8Template,
    block_m,
    split_slices,
    target_programs,
)
from lowbit.kernels.triton.igemm import reduction_steps
from lowbit.perfmodel.learned import LearnedModel
from lowbit.reference import random_inputs, run
from lowbit.tune import dispatch
from triton_cases import DEVICE, EPILOGUES, check, poisoned

load_backends()
GEMV = GemvInt8Template()
SPLIT = Config(BLOCK_N=32, BLOCK_K=32, SPLIT_K=4, num_warps=4, num_stages=2)


def small(**kw) -> Config:
    """A small-tile config for the interpreter (valid in the space of the shapes used)."""
    return Config({**SPLIT, **kw})


def with_extremes(wl: Workload, x: torch.Tensor, w: torch.Tensor, seed: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x and w (one value per byte) with an eighth of their values at each end of the
    operand's range, x's row 0 (a conv's image 0) all at its maximum and w's row 0 (filter 0)
    all at its minimum (the worst-case |accumulator|, 255 x 128 x K for u8 x s8); the rest
    stays random."""
    g = torch.Generator().manual_seed(seed)

    def pinned(t: torch.Tensor, prec) -> torch.Tensor:
        t = t.cpu().clone()
        r = torch.rand(t.shape, generator=g)
        t[r < 0.125] = prec.qmin
        t[(r >= 0.125) & (r < 0.25)] = prec.qmax
        return t

    x, w, dev = pinned(x, wl.a), pinned(w, wl.w), x.device
    x[0], w[0] = wl.a.qmax, wl.w.qmin
    return x.to(dev), w.to(dev)


def check_extremes(wl: Workload, cfg: Config, seed: int, device=DEVICE) -> None:
    """The kernel of `cfg` on `with_extremes` inputs equals `lowbit.reference.run`."""
    x, w, params = random_inputs(wl, seed, device=device)
    x, w = with_extremes(wl, x, w, seed)
    out = GEMV.build(wl, cfg)(x, w, params, out=poisoned(wl, device))
    ref = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    assert torch.equal(out.cpu(), ref), f"{wl.key} {dict(cfg)}: " \
        f"{(out.cpu() != ref).sum().item()} of {out.numel()} differ"


# ------------------------------------------------------------------------------- CPU: exact
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: e.key)
def test_every_epilogue_with_split_k(epi):
    wl = GemmWorkload(M=3, N=45, K=100, epilogue=epi)
    check(wl, GEMV.build(wl, SPLIT), seed=1)


@pytest.mark.parametrize("m,n,k", [pytest.param(1, 513, 1001, marks=pytest.mark.slow),
                                   (3, 1, 100), (16, 513, 100), (1, 1, 1001), (16, 1, 1001),
                                   (3, 513, 1001)])
def test_odd_shapes_at_the_default_and_a_split_config(m, n, k):
    wl = GemmWorkload(M=m, N=n, K=k, epilogue=Epilogue(bias=True, relu=True, out="s8"))
    cfgs = [GEMV.default_config(wl), small(SPLIT_K=8 if k > 256 else 2)]
    for i, cfg in enumerate(cfgs):
        check(wl, GEMV.build(wl, cfg), seed=10 * m + n + k + i)
    assert len(cfgs) == 2


def test_packed_inputs_and_fp16_output():
    wl = GemmWorkload(M=5, N=70, K=200, a="u4", w="s4", a_layout="packed", w_layout="packed",
                      epilogue=Epilogue(bias=True, out="fp16"))
    check(wl, GEMV.build(wl, small(SPLIT_K=4)), seed=3)


def test_shifted_bias_is_exact():
    from lowbit.reference.epilogue import shifted_bias_from

    wl = GemmWorkload(M=7, N=40, K=130, epilogue=Epilogue(relu=True, out="s8",
                                                           shifted_bias=True))
    base = wl.replace(epilogue=Epilogue(bias=True, relu=True, out="s8"))
    x, w, p = random_inputs(base, 4)
    b = shifted_bias_from(p.bias, p.multiplier, p.shift, torch.Generator().manual_seed(5))
    params = EpilogueParams(multiplier=p.multiplier, shift=p.shift, shifted_bias=b)
    out = GEMV.build(wl, small(SPLIT_K=2))(x, w, params, out=poisoned(wl, "cpu"))
    assert torch.equal(out, run(wl, x, w, params))


@pytest.mark.parametrize("split", [1, 2, 8, 16])
def test_deep_and_ragged_splits(split):
    """K = 900: 29 chunks of 32, which no split > 1 divides: the slices differ by one chunk
    (16 splits: 13 of 2 chunks and 3 of 1); 32 splits would leave one empty and are refused."""
    wl = GemmWorkload(M=2, N=33, K=900, epilogue=Epilogue(bias=True, out="s8"))
    cfg = small(SPLIT_K=split)
    assert GEMV.space(wl).is_valid(cfg)
    assert "empty" in GEMV.space(wl).why_invalid(small(SPLIT_K=32))
    sizes = [hi - lo for lo, hi in split_slices(29, split)]
    assert sum(sizes) == 29 and max(sizes) - min(sizes) <= (split > 1) and min(sizes) >= 1
    check(wl, GEMV.build(wl, cfg), seed=split)


@pytest.mark.parametrize("a", ["s8", "u8"])
def test_bound_launcher_stays_exact_and_leaves_the_sums_at_zero(a):
    """New activations each replay (u8: with extremes); the zero-point terms of u8 are the
    bound weights' row sums x 128."""
    wl = GemmWorkload(M=4, N=40, K=300, a=a, epilogue=Epilogue(bias=True, out="s8"))
    kernel = GEMV.build(wl, small(SPLIT_K=4))
    x, w, params = random_inputs(wl, 6, device=DEVICE)
    plan = kernel.plan(kernel.problem, x, w, poisoned(wl), (params.bias, None,
                                                            params.multiplier, params.shift))
    sums, arrivals = plan[0].args[7], plan[0].args[8]
    if a == "u8":
        terms = plan[0].args[9]
        assert terms.dtype == torch.int32 and plan[0].kwargs["A_ZERO"] == ACT_ZERO_POINT
        assert torch.equal(terms.cpu(), (w.cpu().to(torch.int64).sum(1) * 128).to(torch.int32))
    launch = kernel.bind(x, w, params, out=poisoned(wl))
    checked = 0
    for seed in (7, 8, 9):
        fresh = random_inputs(wl, seed, device=DEVICE)[0]
        x.copy_(with_extremes(wl, fresh, w, seed)[0] if a == "u8" else fresh)
        assert torch.equal(launch(), run(wl, x, w, params)), seed
        checked += 1
    from lowbit.kernels.triton.igemm import replay

    replay(plan)  # a plan of its own: its workspace must be zero afterwards
    assert sums.shape == (4, 40) and not sums.any() and not arrivals.any()
    assert checked == 3


# ------------------------------------------------------------------------------- CPU: u8
U8_CASES = [  # (M, N, K, epilogue, SPLIT_K of the small config; None: the default config)
    pytest.param(1, 513, 1001, Epilogue(bias=True, relu=True, out="s8"), 8,
                 marks=pytest.mark.slow),  # 13 s in the interpreter
    (8, 1, 1001, Epilogue(), 8),
    (8, 513, 100, Epilogue(bias=True, out="fp16"), 2),
    (1, 513, 100, Epilogue(), 1),
    (8, 1, 100, Epilogue(relu=True, out="u8"), 1),
    (8, 45, 1001, Epilogue(bias=True, relu=True, out="u4", out_layout="packed"), None),
    (8, 40, 201, Epilogue(bias=True, out="s3", out_layout="bitplane"), 4),
]


@pytest.mark.parametrize("m,n,k,epi,split", U8_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3].key}-{c[4]}" for c in (
                             getattr(c, "values", c) for c in U8_CASES)])
def test_u8_activations_are_exact(m, n, k, epi, split):
    wl = GemmWorkload(M=m, N=n, K=k, a="u8", w="s8", epilogue=epi)
    assert GEMV.unsupported_reason(wl) is None
    cfg = GEMV.default_config(wl) if split is None else small(SPLIT_K=split)
    check(wl, GEMV.build(wl, cfg), seed=m + n + k)
    check_extremes(wl, cfg, seed=m * n + k)


def test_u8_activations_with_packed_weights_and_shifted_bias():
    from lowbit.reference.epilogue import shifted_bias_from

    wl = GemmWorkload(M=8, N=70, K=201, a="u8", w="s4", w_layout="packed")
    check(wl.replace(epilogue=Epilogue(bias=True, out="fp16")),
          GEMV.build(wl.replace(epilogue=Epilogue(bias=True, out="fp16")), small(SPLIT_K=4)),
          seed=12)
    shifted = wl.replace(epilogue=Epilogue(relu=True, out="s8", shifted_bias=True))
    x, w, p = random_inputs(wl.replace(epilogue=Epilogue(bias=True, relu=True, out="s8")), 13)
    b = shifted_bias_from(p.bias, p.multiplier, p.shift, torch.Generator().manual_seed(14))
    params = EpilogueParams(multiplier=p.multiplier, shift=p.shift, shifted_bias=b)
    out = GEMV.build(shifted, small(SPLIT_K=2))(x.to(DEVICE), w.to(DEVICE),
                                                params.to(DEVICE), out=poisoned(shifted))
    assert torch.equal(out.cpu(), run(shifted, x, w, params))


def test_u8_exactness_bound_counts_the_true_sum():
    """The dot's |a - 128| w sums stay within 128 x 128 x K, but the epilogue's sum reaches
    255 x 128 x K: K = 70000 fits the first and not the second."""
    k = 70000
    assert 128 * 128 * k < 2**31 <= 255 * 128 * k
    assert GEMV.unsupported_reason(GemmWorkload(M=8, N=8, K=k, a="s8")) is None
    reason = GEMV.unsupported_reason(GemmWorkload(M=8, N=8, K=k, a="u8"))
    assert reason is not None and "accumulator" in reason and "a=u8" in reason
    assert GEMV.unsupported_reason(GemmWorkload(M=8, N=8, K=2**17 // 2, a="u8")) is None
    reason = GEMV.unsupported_reason(GemmWorkload(M=8, N=8, K=100, a="s8", w="u8"))
    assert reason is not None and "w=u8" in reason  # u8 weights: no zero point for them


# ------------------------------------------------------------------------------- CPU: conv
S8_RELU = Epilogue(bias=True, relu=True, out="s8")
#: small convs of M = N*P*Q <= 64 output pixels: odd C, K not a multiple of 16, stride 2,
#: pad 0 and 1, H != W, R != S, M = 1 and 64; the 1x1 stride-1 unpadded ones are GEMMs
CONV_SHAPES = {
    "7x7_3x3_p1_c3": dict(N=1, H=7, W=7, C=3, K=17, R=3, S=3, pad=1),
    "7x7_3x3_p1_c72": dict(N=1, H=7, W=7, C=72, K=40, R=3, S=3, pad=1),
    "14x14_3x3_s2_p1_c100": dict(N=1, H=14, W=14, C=100, K=24, R=3, S=3, stride=2, pad=1),
    "7x5_3x3_s2_p0": dict(N=1, H=7, W=5, C=72, K=33, R=3, S=3, stride=2),
    "3x3_3x3_p0_m1": dict(N=1, H=3, W=3, C=40, K=24, R=3, S=3),
    "b4_4x4_3x3_p1_m64": dict(N=4, H=4, W=4, C=24, K=70, R=3, S=3, pad=1),
    "4x6_1x3_p1": dict(N=1, H=4, W=6, C=40, K=24, R=1, S=3, pad=1),
    "b2_3x5_1x1": dict(N=2, H=3, W=5, C=100, K=20),
    "1x1_1x1_m1": dict(N=1, H=1, W=1, C=72, K=24),
    "9x9_1x1_s2": dict(N=1, H=9, W=9, C=40, K=16, stride=2),
    "5x5_1x1_p1": dict(N=1, H=5, W=5, C=16, K=16, pad=1),
}


def conv(shape: dict, **kw) -> ConvWorkload:
    return ConvWorkload(**shape, **{"epilogue": S8_RELU, **kw})


def conv_split(wl: ConvWorkload, split: int = 4) -> Config:
    """The small config with `split` (a power of two) K slices, fewer where the 32-channel
    steps run out."""
    most = min(split, reduction_steps(wl.R, wl.S, wl.C, 32))
    return small(SPLIT_K=1 << (most.bit_length() - 1))


@pytest.mark.parametrize("name", list(CONV_SHAPES))
def test_conv_shapes_at_the_default_and_a_split_config(name):
    wl = conv(CONV_SHAPES[name])
    assert wl.gemm_shape[0] <= GEMV_MAX_M and GEMV.unsupported_reason(wl) is None
    cfgs = [GEMV.default_config(wl), conv_split(wl)]
    for i, cfg in enumerate(cfgs):
        check(wl, GEMV.build(wl, cfg), seed=len(name) + i)
    assert len(cfgs) == 2


@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: e.key)
def test_conv_every_epilogue_with_split_k(epi):
    wl = ConvWorkload(N=1, H=5, W=6, C=72, K=45, R=3, S=3, pad=1, epilogue=epi)
    check(wl, GEMV.build(wl, conv_split(wl)), seed=2)


U8_CONV_CASES = [  # padded convs: a padding position is the byte 0, -128 in the dot
    ("7x7_3x3_p1_c72", Epilogue(), None),
    ("7x7_3x3_p1_c72", Epilogue(bias=True, relu=True, out="s8"), 4),
    ("14x14_3x3_s2_p1_c100", Epilogue(bias=True, relu=True, out="s8"), None),
    ("4x6_1x3_p1", Epilogue(bias=True, out="fp16"), 2),
    ("5x5_1x1_p1", Epilogue(relu=True, out="u4", out_layout="packed"), 1),
    ("b4_4x4_3x3_p1_m64", Epilogue(bias=True, out="s3", out_layout="bitplane"), 8),
]


@pytest.mark.parametrize("name,epi,split", U8_CONV_CASES,
                         ids=[f"{c[0]}-{c[1].key}-{c[2]}" for c in U8_CONV_CASES])
def test_u8_conv_with_padding_is_exact(name, epi, split):
    """u8 activations on padded convs, random and at the extremes (image 0 all 255, filter 0
    all -128, an eighth of the values 0 / 255): the zero-point term restores 128 w at every
    padding tap, so a padding load other than the byte 0 breaks the border outputs."""
    wl = conv(CONV_SHAPES[name], a="u8", epilogue=epi)
    assert wl.pad > 0 and GEMV.unsupported_reason(wl) is None
    cfg = GEMV.default_config(wl) if split is None else conv_split(wl, split)
    check(wl, GEMV.build(wl, cfg), seed=len(name) + wl.K)
    check_extremes(wl, cfg, seed=wl.C + wl.K)


def test_conv_packed_operands_and_shifted_bias():
    """Packed activations gathered by the conv (rows of C = 5 or 13 values: 3 or 4 bytes a
    pixel, sub-byte offsets unpacked in registers), packed weights with u8 activations, and
    the shifted bias."""
    from lowbit.reference.epilogue import shifted_bias_from

    both = ConvWorkload(N=1, H=5, W=4, C=5, K=33, R=3, S=3, pad=1, a="u4", w="s4",
                        a_layout="packed", w_layout="packed",
                        epilogue=Epilogue(bias=True, relu=True, out="u2",
                                          out_layout="bitplane"))
    acts = ConvWorkload(N=1, H=6, W=6, C=13, K=20, R=3, S=3, stride=2, pad=1, a="s2",
                        a_layout="packed", epilogue=Epilogue(bias=True, out="fp16"))
    weights = ConvWorkload(N=1, H=7, W=7, C=20, K=24, R=3, S=3, pad=1, a="u8", w="s4",
                           w_layout="packed", epilogue=Epilogue(bias=True, out="s8"))
    for i, wl in enumerate((both, acts, weights)):
        for cfg in (GEMV.default_config(wl), conv_split(wl)):
            check(wl, GEMV.build(wl, cfg), seed=20 + i)
    shifted = conv(CONV_SHAPES["7x7_3x3_p1_c72"], a="u8",
                   epilogue=Epilogue(relu=True, out="s8", shifted_bias=True))
    x, w, p = random_inputs(shifted.replace(epilogue=S8_RELU), 23)
    b = shifted_bias_from(p.bias, p.multiplier, p.shift, torch.Generator().manual_seed(24))
    params = EpilogueParams(multiplier=p.multiplier, shift=p.shift, shifted_bias=b)
    out = GEMV.build(shifted, conv_split(shifted))(x, w, params, out=poisoned(shifted, "cpu"))
    assert torch.equal(out, run(shifted, x, w, params))


def test_conv_1x1_stride_1_unpadded_is_the_gemm():
    """Such a conv launches the GEMM path (rows are NHWC pixels: no per-row division, no
    padding masks) and equals the GEMV on the GEMM of its pixels; a strided or padded 1x1 and
    a 3x3 gather their rows."""
    wl = conv(CONV_SHAPES["b2_3x5_1x1"], a="u8")
    gemm = GemmWorkload(M=30, N=20, K=100, a="u8", epilogue=S8_RELU)
    x, w, params = random_inputs(wl, 30)
    kernel = GEMV.build(wl, conv_split(wl))
    launch = kernel.plan(kernel.problem, x, w, poisoned(wl, "cpu"),
                         (params.bias, None, params.multiplier, params.shift))[0]
    assert launch.kwargs["IS_GEMM"] and launch.args[12:19] == (1, 1, 100, 1, 1, 1, 0)
    got = kernel(x, w, params).reshape(30, 20)
    assert torch.equal(got, GEMV.build(gemm, conv_split(wl))(x.reshape(30, 100),
                                                             w.reshape(20, 100), params))
    gathered = 0
    for name in ("9x9_1x1_s2", "5x5_1x1_p1", "7x7_3x3_p1_c72"):
        other = conv(CONV_SHAPES[name])
        assert not GEMV.build(other, conv_split(other)).problem.is_gemm, name
        gathered += 1
    assert gathered == 3


def test_conv_refusals_name_the_reason():
    big = conv(dict(N=4, H=7, W=7, C=64, K=64, R=3, S=3, pad=1))
    reason = GEMV.unsupported_reason(big)
    assert reason is not None and "M=N*P*Q=196" in reason and f"> {GEMV_MAX_M}" in reason
    with pytest.raises(ValueError, match=r"M=N\*P\*Q=196"):
        GEMV.build(big, SPLIT)
    with pytest.raises(ValueError, match="196"):
        GEMV.space(big)
    # a 3x3 reduction of 9 x 8192: within int32 for s8 x s8, not for the u8 true sum
    deep = conv(dict(N=1, H=3, W=3, C=8192, K=8, R=3, S=3, pad=1))
    assert 128 * 128 * 9 * 8192 < 2**31 <= 255 * 128 * 9 * 8192
    assert GEMV.unsupported_reason(deep) is None
    reason = GEMV.unsupported_reason(deep.replace(a="u8"))
    assert reason is not None and "accumulator" in reason and "a=u8" in reason
    reason = GEMV.unsupported_reason(conv(CONV_SHAPES["7x7_3x3_p1_c3"], w="u8"))
    assert reason is not None and "w=u8" in reason
    reason = GEMV.unsupported_reason(conv(CONV_SHAPES["7x7_3x3_p1_c3"], a="u2", w="s2",
                                          a_layout="bitplane", w_layout="bitplane"))
    assert reason is not None and "bitplane" in reason


#: the probe's layers (benchmarks/probes/gemv_probe.py --conv)
PROBE_CONVS = [dict(N=1, H=7, W=7, C=512, K=512, R=3, S=3, pad=1),
               dict(N=1, H=7, W=7, C=960, K=320), dict(N=1, H=7, W=7, C=1152, K=320),
               dict(N=1, H=7, W=7, C=2048, K=512), dict(N=1, H=7, W=7, C=512, K=2048),
               dict(N=1, H=14, W=14, C=256, K=256, R=3, S=3, stride=2, pad=1),
               dict(N=1, H=7, W=7, C=100, K=200, R=3, S=3, pad=1)]


def test_conv_space_default_and_stream_estimate():
    """Defaults of the probe's layers (49 rows: 32 weight rows a program, at least a program
    per two SMs): valid, the grid at its target unless the reduction steps (taps x channel
    chunks) run out, no slice empty; the launch shape and the weight-streaming estimate take
    the implicit GEMM's (M, N, K)."""
    checked = 0
    for shape in PROBE_CONVS:
        wl = conv(shape)
        m, n, _ = wl.gemm_shape
        cfg = GEMV.default_config(wl)
        assert GEMV.space(wl).is_valid(cfg), (wl.key, cfg)
        steps = reduction_steps(wl.R, wl.S, wl.C, cfg["BLOCK_K"])
        programs = -(-n // cfg["BLOCK_N"]) * cfg["SPLIT_K"]
        assert programs >= target_programs(m) or 2 * cfg["SPLIT_K"] > steps, (wl.key, cfg)
        assert cfg["BLOCK_N"] == 32 and target_programs(m) == TARGET.sms // 2  # 49 rows
        assert all(hi > lo for lo, hi in split_slices(steps, cfg["SPLIT_K"]))
        assert GEMV.launch_shape(wl, cfg)["block_m"] == block_m(m) == 64
        t = dispatch.stream_estimate_us(GEMV, wl, cfg, H100)
        floor = wl.R * wl.S * wl.C * wl.K / 3.0e12 * 1e6
        assert floor < t < floor + 15, (wl.key, t)
        checked += 1
    assert checked == len(PROBE_CONVS)


def test_dispatch_weighs_the_gemv_for_small_convs(analytic_model):
    """The GEMV is a candidate of zero-tuning dispatch for a conv of 49 pixels (timed by the
    streaming estimate) and its pick is a valid config of its template."""
    from lowbit.kernels import get_template

    wl = conv(PROBE_CONVS[0])
    pool = [GEMV, get_template("triton.conv2d_int8")]
    choice = dispatch.choose(wl, H100, templates=pool, include_fp16=False)
    assert choice.template in {t.name for t in pool}
    assert get_template(choice.template).space(wl).is_valid(choice.config)
    assert GEMV.name in dict(choice.alternatives)


def test_probe_conv_rows_are_gemv_layers():
    """benchmarks/probes/gemv_probe.py --conv: distinct `conv_` row names, every layer of at
    most GEMV_MAX_M rows and run by the GEMV, and the measurement-free part of a row."""
    import importlib
    import sys
    from pathlib import Path

    from lowbit.core.hardware import H100 as H100_PEAKS

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probes"))
    probe = importlib.import_module("gemv_probe")
    rows = probe.conv_workloads()
    names = [n for n, _ in rows]
    assert len(set(names)) == len(names) == len(probe.CONV) + len(probe.CONV_U8)
    assert [wl.to_dict() for _, wl in rows if str(wl.a) == "s8"] == \
        [conv(shape, epilogue=probe.EPI).to_dict() for shape in PROBE_CONVS]
    for name, wl in rows:
        assert name.startswith("conv_") and GEMV.unsupported_reason(wl) is None, name
        head = probe.conv_row_head(name, wl, H100_PEAKS)
        assert head["op"] == "conv2d" and head["gemm_shape"] == list(wl.gemm_shape)
        assert head["M"] == 49 and 0 < head["weight_read_us"] <= head["floor_us"]


# ------------------------------------------------------------------------------- CPU: checks
def test_bad_input_raises_naming_the_argument():
    wl = GemmWorkload(M=3, N=40, K=100)
    kernel = GEMV.build(wl, SPLIT)
    x, w, params = random_inputs(wl, 1)
    with pytest.raises((TypeError, ValueError), match="x"):
        kernel(x.to(torch.float32), w, params)
    with pytest.raises(ValueError, match="w"):
        kernel(x, w[:, :99].contiguous(), params)
    with pytest.raises(TypeError, match="x"):
        kernel(x.tolist(), w, params)
    with pytest.raises(ValueError, match="M=65"):
        GEMV.build(GemmWorkload(M=65, N=40, K=100), SPLIT)
    with pytest.raises(ValueError, match="SPLIT_K"):
        GEMV.build(wl, SPLIT.replace(SPLIT_K=8))  # 4 chunks of 32
    with pytest.raises(ValueError, match="accumulator"):
        GEMV.build(GemmWorkload(M=2, N=8, K=2**20), SPLIT)


def test_space_and_default_config():
    checked = 0
    for m, n, k in [(1, 1000, 2048), (8, 4096, 25088), (16, 4096, 4096), (8, 1000, 512),
                    (1, 1, 1001), (64, 513, 100), (3, 17, 31)]:
        wl = GemmWorkload(M=m, N=n, K=k)
        space = GEMV.space(wl)
        cfg = GEMV.default_config(wl)
        assert space.is_valid(cfg), (wl.key, cfg)
        chunks = -(-k // cfg["BLOCK_K"])
        programs = -(-n // cfg["BLOCK_N"]) * cfg["SPLIT_K"]
        # the grid reaches one program per SM (half that at M > 32) unless the K chunks run
        # out
        assert programs >= target_programs(m) or 2 * cfg["SPLIT_K"] > chunks, (wl.key, cfg)
        assert all(hi > lo for lo, hi in split_slices(chunks, cfg["SPLIT_K"]))  # none empty
        checked += 1
    assert checked == 7
    assert block_m(1) == block_m(16) == 16 and block_m(17) == 32 and block_m(GEMV_MAX_M) == 64
    assert GEMV.unsupported_reason(GemmWorkload(M=GEMV_MAX_M + 1, N=8, K=8)) is not None


# ------------------------------------------------------------------------------- dispatch
def test_stream_estimate_reads_bytes_over_bandwidth():
    fc7 = GemmWorkload(M=8, N=4096, K=4096)
    fc6 = fc7.replace(K=25088)
    t6 = dispatch.stream_estimate_us(GEMV, fc6, GEMV.default_config(fc6), H100)
    t7 = dispatch.stream_estimate_us(GEMV, fc7, GEMV.default_config(fc7), H100)
    floor6 = 4096 * 25088 / 3.0e12 * 1e6
    assert floor6 < t6 < floor6 + 10 and t7 < t6
    assert dispatch.stream_estimate_us(GEMV, fc6, GEMV.default_config(fc6), H200) < t6
    # one program per column tile keeps too few bytes in flight
    one = GEMV.default_config(fc6).replace(SPLIT_K=1, num_stages=2)
    assert dispatch.stream_estimate_us(GEMV, fc6, one, H100) > t6


@pytest.fixture
def analytic_model(monkeypatch):
    monkeypatch.setattr(dispatch, "default_model", lambda: LearnedModel())


def test_dispatch_picks_the_gemv_for_skinny_gemms(analytic_model):
    from lowbit.kernels import get_template

    pool = [GEMV, get_template("triton.gemm_int8")]
    picked = 0
    for m, n, k in [(1, 1000, 2048), (8, 4096, 4096), (16, 1000, 2048), (8, 4096, 25088)]:
        choice = dispatch.choose(GemmWorkload(M=m, N=n, K=k), H100, templates=pool,
                                 include_fp16=False)
        assert choice.template == GEMV.name, choice
        assert GEMV.space(GemmWorkload(M=m, N=n, K=k)).is_valid(choice.config)
        picked += 1
    assert picked == 4


@pytest.mark.parametrize("a", ["s8", "u8"])
def test_engine_default_policy_prefers_the_gemv_up_to_16_rows(a):
    """u8: a classifier after ReLU and average pooling (VGG's fc8 at batch 8)."""
    from lowbit.graph.impl import GEMV_ROWS, INT8_GEMV, choose_impl

    checked = 0
    for m in (8, GEMV_ROWS):
        impl, why = choose_impl(GemmWorkload(M=m, N=1000, K=2048, w="s8", a=a))
        assert impl == INT8_GEMV == GEMV.name and "int8 tensor cores" in why, (m, why)
        checked += 1
    impl, _ = choose_impl(GemmWorkload(M=GEMV_ROWS + 1, N=1000, K=2048, w="s8", a=a))
    assert impl != INT8_GEMV and checked == 2


def test_dispatch_times_u8_activations_like_s8(analytic_model):
    """The zero point adds no weight bytes: the same estimate, and the pick over every
    registered template (cuda.int8_wgmma takes u8 natively) and fp16 is the GEMV."""
    checked = 0
    for n, k in ((1000, 2048), (1000, 4096), (4096, 25088)):
        u8 = GemmWorkload(M=8, N=n, K=k, a="u8", epilogue=Epilogue(bias=True, out="s8"))
        s8 = u8.replace(a="s8")
        cfg = GEMV.default_config(u8)
        assert cfg == GEMV.default_config(s8)
        assert dispatch.stream_estimate_us(GEMV, u8, cfg, H200) == \
            dispatch.stream_estimate_us(GEMV, s8, cfg, H200)
        assert dispatch.choose(u8, H200).template == GEMV.name, u8.key
        checked += 1
    assert checked == 3


def test_compiles_for_sm90_with_wide_weight_loads():
    """Offline sm_90 compile (tests/triton_offline.py): int8 MMAs, 16-byte cp.async for
    K % 16 == 0 and 8-byte for K = 1000, one acquire-release arrival atomic with split-K,
    no spills; u8 activations too (the zero point flips a bit in registers). Convs: the
    gathered rows of a 3x3 (s8 and u8, stride 1 and 2) and a 1x1 load 16 bytes wide where
    C % 16 == 0, 4 bytes where C = 100."""
    import os

    import triton

    from triton_offline import compile_in_subprocess

    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    gemms = {(8, 4096, 25088, "s8"): 16, (1, 1000, 1000, "s8"): 8,
             (16, 1000, 2048, "s8"): 16, (8, 1000, 4096, "u8"): 16, (1, 1000, 1000, "u8"): 8}
    shapes = [(GemmWorkload(M=m, N=n, K=k, a=a, epilogue=S8_RELU), width)
              for (m, n, k, a), width in gemms.items()]
    shapes += [(conv(PROBE_CONVS[0]), 16), (conv(PROBE_CONVS[0], a="u8"), 16),
               (conv(PROBE_CONVS[1]), 16), (conv(PROBE_CONVS[5]), 16),
               (conv(PROBE_CONVS[6]), 4)]
    cases = [(GEMV.name, wl.to_json(), GEMV.default_config(wl).to_json()) for wl, _ in shapes]
    for (wl, width), got in zip(shapes, compile_in_subprocess(cases), strict=True):
        assert isinstance(got, list), got  # else the compiler's error text
        main = got[0]
        assert main["mma_sync"] + main["wgmma"] > 0 and main["spill_bytes"] == 0, (wl, main)
        assert main["cp_async_bytes"] == [width] and main["byte_loads"] == 0, (wl, main)
        assert main["acq_rel_atomics"] == 1, (wl, main)
    assert len(cases) == 10


# ------------------------------------------------------------------------------- GPU
FC = [(m, n, k) for m in (1, 8, 16) for n, k in ((1000, 2048), (4096, 25088), (4096, 4096),
                                                 (1000, 512))]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", FC)
def test_gpu_fc_shapes_are_exact(m, n, k):
    checked = 0
    for epi in (Epilogue(), Epilogue(bias=True, relu=True, out="s8"),
                Epilogue(bias=True, out="fp16")):
        wl = GemmWorkload(M=m, N=n, K=k, epilogue=epi)
        default = GEMV.default_config(wl)
        deep = default.replace(SPLIT_K=min(64, 2 * default["SPLIT_K"]))
        for cfg in (default, deep) if GEMV.space(wl).is_valid(deep) else (default,):
            check(wl, GEMV.build(wl, cfg), seed=m + n + k + checked, device="cuda")
            checked += 1
    assert checked >= 3


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 1000, 1001), (16, 513, 100), (3, 1, 1000)])
def test_gpu_odd_shapes_are_exact(m, n, k):
    wl = GemmWorkload(M=m, N=n, K=k, epilogue=Epilogue(bias=True, relu=True, out="u4",
                                                       out_layout="packed"))
    check(wl, GEMV.build(wl, GEMV.default_config(wl)), seed=m * k, device="cuda")


@pytest.mark.gpu
def test_gpu_u8_classifier_is_exact():
    """VGG-16's fc8 at batch 8 (u8 activations after ReLU and pooling): every output kind at
    the default config and a deeper split, on random and extreme inputs."""
    checked = 0
    for epi in (Epilogue(), Epilogue(bias=True, relu=True, out="s8"),
                Epilogue(bias=True, out="fp16"), Epilogue(relu=True, out="u8")):
        wl = GemmWorkload(M=8, N=1000, K=4096, a="u8", w="s8", epilogue=epi)
        default = GEMV.default_config(wl)
        deep = default.replace(SPLIT_K=min(64, 2 * default["SPLIT_K"]))
        for cfg in (default, deep) if GEMV.space(wl).is_valid(deep) else (default,):
            check(wl, GEMV.build(wl, cfg), seed=checked, device="cuda")
            check_extremes(wl, cfg, seed=100 + checked, device="cuda")
            checked += 1
    assert checked >= 4


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_stay_exact():
    wl = GemmWorkload(M=8, N=1000, K=2048, epilogue=Epilogue(bias=True, out="s8"))
    kernel = GEMV.build(wl, GEMV.default_config(wl))
    x, w, params = random_inputs(wl, 1, device="cuda")
    out = poisoned(wl, "cuda")
    launch = kernel.bind(x, w, params, out=out)
    launch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    for seed in (2, 3, 4):
        x.copy_(random_inputs(wl, seed, device="cuda")[0])
        out.fill_(0x5A)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), run(wl, x.cpu(), w.cpu(), params.to("cpu"))), seed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", PROBE_CONVS,
                         ids=[f"{s['C']}to{s['K']}_{s.get('R', 1)}x{s.get('S', 1)}"
                              f"_s{s.get('stride', 1)}" for s in PROBE_CONVS])
def test_gpu_probe_convs_are_exact(shape):
    """The probe's batch-1 layers, s8 and u8 (random and extreme inputs), three output kinds,
    at the default config and a deeper split."""
    checked = 0
    for a in ("s8", "u8"):
        for epi in (Epilogue(), S8_RELU, Epilogue(bias=True, out="fp16")):
            wl = conv(shape, a=a, epilogue=epi)
            default = GEMV.default_config(wl)
            deep = default.replace(SPLIT_K=min(64, 2 * default["SPLIT_K"]))
            for cfg in (default, deep) if GEMV.space(wl).is_valid(deep) else (default,):
                check(wl, GEMV.build(wl, cfg), seed=checked, device="cuda")
                if a == "u8":
                    check_extremes(wl, cfg, seed=100 + checked, device="cuda")
                checked += 1
    assert checked >= 6


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONV_SHAPES))
def test_gpu_odd_convs_are_exact(name):
    checked = 0
    for a in ("s8", "u8"):
        wl = conv(CONV_SHAPES[name], a=a)
        for cfg in (GEMV.default_config(wl), conv_split(wl)):
            check(wl, GEMV.build(wl, cfg), seed=len(name) + checked, device="cuda")
            checked += 1
    assert checked == 4
