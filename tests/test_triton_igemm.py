"""Triton implicit-GEMM templates (conv2d int8, GEMM int8, conv2d on fp16 tensor cores).

CPU: under TRITON_INTERPRET=1 (tests/conftest.py sets it when no GPU exists) on tiny odd
shapes: every epilogue and output packing, packed sub-byte inputs, stride 2 and padding,
split-K and the grouped tile order, all bit-exact against `lowbit.reference.run` with a
poisoned output buffer. GPU (`gpu` mark): every shared workload at its default config and a
sampled config, plus packed I/O on real layer shapes.
"""

from __future__ import annotations

import random

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Layout, load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.triton import CONV2D_FP16, CONV2D_INT8, GEMM_INT8, IgemmKernel, conv2d_fp16
from lowbit.kernels.triton.templates import problem
from lowbit.reference import random_inputs, run
from triton_cases import DEVICE, EPILOGUES, HAS_CUDA, check, poisoned

# tiny tiles (the interpreter's dot works at 16) outside the H100 space: several tiles in M
# and N, the grouped order, split-K with a ragged last split
TINY = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=2,
              LOOP_ORDER="rsc", SPLIT_K=1)
SPLIT3 = TINY.replace(SPLIT_K=3, LOOP_ORDER="crs")
SPLIT3_LAST = SPLIT3.replace(SPLIT_SUM="last_program")


def tiny_kernel(wl, cfg: Config, dot_fp16: bool = False) -> IgemmKernel:
    if isinstance(wl, GemmWorkload):
        cfg = Config({k: v for k, v in cfg.items() if k != "LOOP_ORDER"})
    return IgemmKernel("test", wl, cfg, problem(wl, dot_fp16))


# ------------------------------------------------------------------------------- CPU tests

@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: e.key)
def test_conv_epilogues_stride2(epi):
    wl = ConvWorkload(N=2, H=7, W=9, C=19, K=37, R=3, S=3, stride=2, pad=1, epilogue=epi)
    check(wl, tiny_kernel(wl, TINY), seed=1)


@pytest.mark.parametrize("epi", EPILOGUES[:2] + EPILOGUES[3:5] + EPILOGUES[7:8],
                         ids=lambda e: e.key)
def test_gemm_epilogues_split_k(epi):
    wl = GemmWorkload(M=37, N=45, K=83, epilogue=epi)
    check(wl, tiny_kernel(wl, SPLIT3), seed=2)


@pytest.mark.parametrize("epi", [EPILOGUES[1], EPILOGUES[3], EPILOGUES[7]], ids=lambda e: e.key)
def test_conv_split_k_crs(epi):
    wl = ConvWorkload(N=1, H=6, W=5, C=33, K=40, R=3, S=2, stride=1, pad=1, epilogue=epi)
    check(wl, tiny_kernel(wl, SPLIT3), seed=3)


@pytest.mark.parametrize("epi", EPILOGUES[:2] + EPILOGUES[3:5] + EPILOGUES[7:8],
                         ids=lambda e: e.key)
def test_gemm_split_k_summed_by_the_last_program(epi):
    wl = GemmWorkload(M=37, N=45, K=83, epilogue=epi)
    check(wl, tiny_kernel(wl, SPLIT3_LAST), seed=12)


def test_conv_split_k_last_program_fp16_dot():
    wl = ConvWorkload(N=1, H=6, W=5, C=33, K=40, R=3, S=2, stride=1, pad=1, a="u8", w="s4",
                      epilogue=Epilogue(bias=True, relu=True, out="u4", out_layout="packed"))
    check(wl, tiny_kernel(wl, SPLIT3_LAST, dot_fp16=True), seed=13)


@pytest.mark.parametrize("cfg", [SPLIT3, SPLIT3_LAST], ids=["second_kernel", "last_program"])
def test_bound_split_k_launcher_stays_exact_across_calls(cfg):
    """The bound launcher reuses its workspace: the arrival counters must be back at zero
    after each launch, or the next launch's last program never sums (stale output)."""
    wl = GemmWorkload(M=21, N=40, K=90, epilogue=Epilogue(bias=True, out="s8"))
    kernel = tiny_kernel(wl, cfg)
    x, w, params = random_inputs(wl, 14, device=DEVICE)
    launch = kernel.bind(x, w, params, out=poisoned(wl))
    for seed in (15, 16, 17):
        x.copy_(random_inputs(wl, seed, device=DEVICE)[0])
        assert torch.equal(launch(), run(wl, x, w, params)), seed


@pytest.mark.parametrize("a,w,a_layout,w_layout", [
    ("u4", "s4", "packed", "packed"),
    ("u2", "s8", "packed", "int8"),
    ("s2", "b1", "packed", "packed"),
    ("u1", "s2", "packed", "packed"),
    ("s4", "b1", "int8", "int8"),
])
def test_conv_packed_inputs(a, w, a_layout, w_layout):
    epi = Epilogue(bias=True, relu=True, out="u2", out_layout="packed")
    wl = ConvWorkload(N=2, H=5, W=6, C=21, K=35, R=3, S=3, stride=2, pad=2, a=a, w=w,
                      a_layout=a_layout, w_layout=w_layout, epilogue=epi)
    check(wl, tiny_kernel(wl, TINY), seed=4)


def test_gemm_packed_inputs_even_channels():
    # K % BLOCK_K == 0 takes the unmasked (EVEN_C) channel path
    wl = GemmWorkload(M=23, N=33, K=64, a="u4", w="s4", a_layout="packed", w_layout="packed",
                      epilogue=Epilogue(bias=True, out="s8"))
    check(wl, tiny_kernel(wl, TINY), seed=5)


def test_conv_1x1_even_channels_int32():
    wl = ConvWorkload(N=3, H=4, W=5, C=32, K=48, R=1, S=1, stride=1, pad=0)
    check(wl, tiny_kernel(wl, TINY), seed=6)


def test_channel_alignment_is_the_power_of_two_dividing_the_rows():
    from lowbit.kernels.triton.igemm import channel_alignment

    cases = {(1000, "int8"): 8, (100, "int8"): 4, (90, "int8"): 2, (1001, "int8"): 1,
             (64, "int8"): 16, (1000, "packed"): 1}
    for (k, layout), want in cases.items():
        wl = GemmWorkload(M=3, N=5, K=k, a="u4", w="s4", a_layout=layout, w_layout=layout)
        assert channel_alignment(problem(wl, False)) == want, (k, layout)
    conv = ConvWorkload(N=1, H=5, W=5, C=20, K=8, R=3, S=3, pad=1)
    assert channel_alignment(problem(conv, False)) == 4
    assert len(cases) == 6


@pytest.mark.parametrize("k", [40, 90, 100])
def test_gemm_unaligned_k_is_exact(k):
    """K % 16 != 0 with the alignment hint (ALIGN_C 8, 2, 4) and a masked last chunk."""
    wl = GemmWorkload(M=21, N=37, K=k, epilogue=Epilogue(bias=True, relu=True, out="s8"))
    check(wl, tiny_kernel(wl, TINY), seed=k)
    check(wl, tiny_kernel(wl, SPLIT3_LAST), seed=k + 1)


@pytest.mark.parametrize("k,a", [(99, "s8"), (99, "u8"), (90, "s8"), (100, "u8")])
def test_gemm_rows_under_8_byte_alignment_run_padded(k, a):
    """K % 8 != 0: W copied at bind and A on every launch into 16-byte rows of zeros
    (kernels/triton/padded.py); the pad bytes add nothing (u8: a pad byte enters the dot as
    -128 times a zero weight), split-K included."""
    from lowbit.kernels.triton.padded import PAD_K, pad_rows_kernel, padded_k

    wl = GemmWorkload(M=21, N=37, K=k, a=a, epilogue=Epilogue(bias=True, relu=True, out="s8"))
    kernel = tiny_kernel(wl, TINY)
    assert padded_k(kernel.problem) == -(-k // PAD_K) * PAD_K
    x, w, params = random_inputs(wl, seed=k, device=DEVICE)
    plan = kernel.plan(kernel.problem, x, w, poisoned(wl), (params.bias, None, None, None))
    assert [s.fn is pad_rows_kernel for s in plan] == [True, False]
    assert plan[1].args[1].shape == (37, padded_k(kernel.problem))  # the padded weights
    check(wl, kernel, seed=k)
    check(wl, tiny_kernel(wl, SPLIT3_LAST), seed=k + 1)


def test_aligned_or_packed_rows_are_not_padded():
    from lowbit.kernels.triton.padded import padded_k

    unpadded = [GemmWorkload(M=5, N=7, K=40), GemmWorkload(M=5, N=7, K=1000),
                GemmWorkload(M=5, N=7, K=99, a="u4", w="s4", a_layout="packed",
                             w_layout="packed"),
                ConvWorkload(N=1, H=5, W=5, C=99, K=8, R=3, S=3, pad=1)]
    assert [padded_k(problem(wl, False)) for wl in unpadded] == [None] * 4
    pointwise = ConvWorkload(N=2, H=3, W=5, C=99, K=8, R=1, S=1)
    assert padded_k(problem(pointwise, False)) == 112
    assert padded_k(problem(pointwise, True)) is None  # the fp16 dot keeps its loads


def test_pointwise_conv_odd_channels_runs_padded():
    wl = ConvWorkload(N=2, H=3, W=5, C=99, K=24, R=1, S=1, a="u8",
                      epilogue=Epilogue(bias=True, out="s8"))
    check(wl, tiny_kernel(wl, TINY), seed=31)


def test_conv_unaligned_channels_is_exact():
    wl = ConvWorkload(N=2, H=6, W=7, C=20, K=24, R=3, S=3, stride=2, pad=1,
                      epilogue=Epilogue(bias=True, out="s8"))
    check(wl, tiny_kernel(wl, TINY), seed=21)


@pytest.mark.parametrize("stride,pad", [(1, 0), (2, 0), (1, 1)])
def test_conv_1x1_runs_as_a_gemm_only_when_pointwise(stride, pad):
    """A 1x1 stride-1 unpadded conv takes the GEMM path (rows = pixels); stride 2 or padding
    keep the spatial path. Odd channels, packed u4 activations, bit-plane output."""
    wl = ConvWorkload(N=2, H=5, W=7, C=19, K=37, R=1, S=1, stride=stride, pad=pad, a="u4",
                      a_layout="packed", epilogue=EPILOGUES[7])
    assert problem(wl, False).is_gemm == (stride == 1 and pad == 0)
    check(wl, tiny_kernel(wl, TINY), seed=16)


def test_fp16_template_exact_on_integers():
    # u8 operands (beyond int8) are exact on fp16 tensor cores while |sum| < 2^24; the int8
    # dot takes u8 activations through a zero point, not u8 weights
    wl = ConvWorkload(N=2, H=5, W=5, C=13, K=20, R=3, S=3, stride=1, pad=1, a="u8", w="s4",
                      epilogue=Epilogue(bias=True, relu=True, out="s8"))
    assert CONV2D_FP16.supports(wl) and CONV2D_FP16.supports(wl.replace(w="u8"))
    assert not CONV2D_INT8.supports(wl.replace(w="u8"))
    check(wl, tiny_kernel(wl, TINY, dot_fp16=True), seed=7)


ROW_TAPS = TINY.replace(LOOP_ORDER="r_sc")


@pytest.mark.parametrize("shape,epi", [
    (dict(N=2, H=11, W=9, C=3, K=20, R=7, S=7, stride=2, pad=3), EPILOGUES[1]),  # a stem
    (dict(N=1, H=6, W=7, C=5, K=37, R=3, S=3, stride=1, pad=1), EPILOGUES[3]),
    (dict(N=2, H=7, W=5, C=11, K=24, R=3, S=2, stride=2, pad=0), EPILOGUES[7]),
], ids=["stem_c3_7x7_s2", "c5_3x3", "c11_3x2_s2_nopad"])
def test_row_taps_loop_order(shape, epi):
    """LOOP_ORDER 'r_sc': (tap s, channel) pairs of a kernel row packed along the reduction;
    chunks straddle taps, padding masks per element; also split-K and the fp16 dot."""
    wl = ConvWorkload(**shape, epilogue=epi)
    check(wl, tiny_kernel(wl, ROW_TAPS), seed=13)
    check(wl, tiny_kernel(wl, ROW_TAPS.replace(SPLIT_K=2)), seed=14)
    check(wl, tiny_kernel(wl, ROW_TAPS, dot_fp16=True), seed=15)


def test_row_taps_in_the_space_only_where_it_applies():
    stem = ConvWorkload(N=8, H=224, W=224, C=3, K=64, R=7, S=7, stride=2, pad=3)
    space = CONV2D_INT8.space(stem)
    assert {c["LOOP_ORDER"] for c in space} == {"rsc", "crs", "r_sc"}
    row_taps = [c for c in space if c["LOOP_ORDER"] == "r_sc"]
    assert row_taps and all(c["BLOCK_K"] == 32 for c in row_taps)  # 7 x 3 values per row
    assert not CONV2D_INT8.space(stem.replace(C=64)).is_valid(
        row_taps[0].replace(BLOCK_K=64))  # C >= BLOCK_K: plain taps fill their chunks
    for wl in (stem.replace(R=1, S=1, pad=0), stem.replace(C=128),
               stem.replace(a="s4", a_layout="packed")):
        assert "r_sc" not in {c["LOOP_ORDER"] for c in CONV2D_INT8.space(wl)}


def test_build_default_and_sampled_configs_from_space():
    """The contract path: space -> default_config / sampled config -> build -> call."""
    wl = ConvWorkload(N=1, H=6, W=7, C=24, K=40, R=3, S=3, stride=1, pad=1,
                      epilogue=Epilogue(bias=True, relu=True, out="s8"))
    space = CONV2D_INT8.space(wl)
    configs = [CONV2D_INT8.default_config(wl), *space.sample(1, random.Random(0))]
    for cfg in configs:
        assert cfg in space
        check(wl, CONV2D_INT8.build(wl, cfg), seed=8)
    g = GemmWorkload(M=9, N=20, K=50, epilogue=Epilogue(out="fp16", bias=True))
    check(g, GEMM_INT8.build(g, GEMM_INT8.default_config(g)), seed=9)


@pytest.mark.parametrize("n,h,w_,c,k", [(2, 6, 5, 19, 24), (1, 3, 3, 256, 8)])
def test_conv2d_fp16_float_path(n, h, w_, c, k):
    # C*R*S = 2304 once failed: the float path was checked against the int8 exactness bound
    g = torch.Generator().manual_seed(10)
    x = torch.randn(n, h, w_, c, generator=g).half()
    w = torch.randn(k, 3, 3, c, generator=g).half()
    out = conv2d_fp16(x.to(DEVICE), w.to(DEVICE), stride=2, pad=1).cpu()
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2),
                                     w.double().permute(0, 3, 1, 2), stride=2, padding=1)
    ref = ref.permute(0, 2, 3, 1)
    assert out.shape == ref.shape and out.dtype == torch.float16
    rel = (out.double() - ref).norm() / ref.norm()
    assert rel < 2e-3, rel


def test_registered_and_spaces_bounded():
    assert get_template("triton.conv2d_int8") is CONV2D_INT8
    assert get_template("triton.gemm_int8") is GEMM_INT8
    for suite in ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial", "resnet18_b8",
                  "resnet50_1x1", "apconv_sweep", "gemm"):
        for name, wl in load_workloads(suite):
            t = GEMM_INT8 if wl.op == "gemm" else CONV2D_INT8
            space = t.space(wl)
            assert 20 <= len(space) <= 900, (name, len(space))
            assert t.default_config(wl) in space
            for cfg in space.sample(20, random.Random(1)):
                smem = cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
                assert smem <= 220 * 1024


def test_unsupported_workloads():
    conv = ConvWorkload(N=1, H=4, W=4, C=8, K=8, R=3, S=3, pad=1)
    assert "bit-serial" in CONV2D_INT8.unsupported_reason(conv.replace(a="u2",
                                                                       a_layout="bitplane"))
    # u8 activations take a zero point; u8 weights do not fit the int8 dot
    assert CONV2D_INT8.unsupported_reason(conv.replace(a="u8")) is None
    assert "int8 range" in CONV2D_INT8.unsupported_reason(conv.replace(w="u8"))
    assert "int32" in GEMM_INT8.unsupported_reason(GemmWorkload(M=2, N=2, K=200_000))
    assert "fp32" in CONV2D_FP16.unsupported_reason(conv.replace(C=1024))
    assert "GemmWorkload" in GEMM_INT8.unsupported_reason(conv)
    with pytest.raises(ValueError, match="does not support"):
        CONV2D_INT8.build(conv.replace(w="u8"), CONV2D_INT8.default_config(conv))
    bad = CONV2D_INT8.default_config(conv).replace(BLOCK_M=96)
    with pytest.raises(ValueError, match="not in"):
        CONV2D_INT8.build(conv, bad)


U8_CASES = [
    # padding and odd channels: zero bytes in place of padding flip to -128, restored by the
    # zero-point term; channels past C meet zero weights
    (ConvWorkload(N=2, H=7, W=6, C=19, K=37, R=3, S=3, stride=1, pad=1, a="u8"), TINY),
    (ConvWorkload(N=2, H=7, W=9, C=24, K=20, R=3, S=3, stride=2, pad=1, a="u8"), SPLIT3),
    (ConvWorkload(N=1, H=6, W=5, C=3, K=24, R=5, S=5, stride=2, pad=2, a="u8"), ROW_TAPS),
    (ConvWorkload(N=2, H=5, W=4, C=40, K=36, R=1, S=1, a="u8"), SPLIT3_LAST),
    (GemmWorkload(M=37, N=45, K=83, a="u8"), SPLIT3),
    (GemmWorkload(M=21, N=30, K=64, a="u8", w="s4", w_layout="packed"), TINY),
]


@pytest.mark.parametrize("case", range(len(U8_CASES)))
def test_u8_activations_take_a_zero_point(case: int):
    wl, cfg = U8_CASES[case]
    checked = 0
    for epi in (EPILOGUES[0], EPILOGUES[2], EPILOGUES[7]):
        wl_e = wl.replace(epilogue=epi)
        kernel = tiny_kernel(wl_e, cfg)
        assert kernel.problem.a_zero == 128
        check(wl_e, kernel, seed=40 + case)
        checked += 1
    assert checked == 3


def test_split_sum_knob_only_with_split_k():
    fc = load_workloads("gemm")[2][1]
    space = GEMM_INT8.space(fc)
    assert {c["SPLIT_SUM"] for c in space if c["SPLIT_K"] > 1} == {"second_kernel",
                                                                   "last_program"}
    one = GEMM_INT8.default_config(fc)
    assert one["SPLIT_K"] == 1
    assert "SPLIT_K > 1 only" in space.why_invalid(one.replace(SPLIT_SUM="last_program"))
    big = load_workloads("gemm")[3][1]
    assert "SPLIT_SUM" not in GEMM_INT8.space(big).names


def test_bad_inputs_raise_before_launch():
    wl = ConvWorkload(N=1, H=4, W=4, C=8, K=8, R=3, S=3, pad=1)
    kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    x, w, params = random_inputs(wl, 11, device=DEVICE)
    with pytest.raises(TypeError, match="x must have dtype"):
        kernel(x.to(torch.int32), w, params)
    with pytest.raises(ValueError, match="w must have shape"):
        kernel(x, w[:, :2].contiguous(), params)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(x.permute(0, 2, 1, 3), w, params)
    with pytest.raises(ValueError, match="out must be"):
        kernel(x, w, params, out=torch.empty(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="channels"):
        conv2d_fp16(x.half(), w[..., :4].contiguous().half())
    with pytest.raises(ValueError, match="float16"):
        conv2d_fp16(x, w.half())


# ------------------------------------------------------------------------------- GPU tests

def _shared_workloads(epi: Epilogue) -> list[tuple[str, object]]:
    out = []
    for suite in ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial", "resnet18_b8",
                  "resnet50_1x1", "apconv_sweep", "gemm"):
        out += load_workloads(suite, epilogue=epi)
    return out


REQUANT_S8 = Epilogue(bias=True, relu=True, out="s8")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,wl", _shared_workloads(REQUANT_S8), ids=lambda v: str(v)[:40])
def test_gpu_shared_workloads_default_and_sampled(name, wl):
    t = GEMM_INT8 if wl.op == "gemm" else CONV2D_INT8
    rng = random.Random(name)
    configs = [t.default_config(wl), *t.space(wl).sample(1, rng)]
    row_taps = [c.replace(LOOP_ORDER="r_sc") for c in configs if "LOOP_ORDER" in c]
    configs += [c for c in row_taps if t.space(wl).is_valid(c)]  # small-C layers (the stem)
    for i, cfg in enumerate(configs):
        check(wl, t.build(wl, cfg), seed=100 + i, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("suite", ["resnet50_3x3_b16", "resnet18_b8", "resnet50_1x1", "gemm"])
def test_gpu_u8_activations_default_config(suite):
    # u8 activations (ReLU outputs) through the zero point, on real layers
    epi = Epilogue(bias=True, relu=True, out="u8")
    layers = [(n, wl.replace(a="u8")) for n, wl in load_workloads(suite, epilogue=epi)][:3]
    for name, wl in layers:
        t = GEMM_INT8 if wl.op == "gemm" else CONV2D_INT8
        assert t.supports(wl), name
        check(wl, t.build(wl, t.default_config(wl)), seed=17)
    assert layers


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("epi", [Epilogue(), Epilogue(bias=True, out="fp16"),
                                 Epilogue(relu=True, out="u4", out_layout="packed"),
                                 Epilogue(bias=True, out="s2", out_layout="bitplane")],
                         ids=lambda e: e.key)
def test_gpu_packed_io_real_layer(epi):
    base = load_workloads("resnet50_3x3_b16")[1][1]
    for a, w, lay in (("s8", "s8", "int8"), ("u4", "s4", "packed"), ("u2", "s2", "packed")):
        wl = base.replace(a=a, w=w, a_layout=lay, w_layout=lay, epilogue=epi)
        check(wl, CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl)), seed=7,
              device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["fc_b8_4096to4096", "fc_b128_4096to4096"])
def test_gpu_fc_split_k_summed_by_the_last_program(name):
    """One-launch split-K on the FC shapes: every SPLIT_SUM=last_program config of a sample,
    three bound launches each on fresh inputs (counters reset), bit-exact."""
    wl = dict(load_workloads("gemm", epilogue=REQUANT_S8))[name]
    pts = [c for c in GEMM_INT8.space(wl) if c["SPLIT_SUM"] == "last_program"]
    for cfg in random.Random(name).sample(pts, 4):
        x, w, params = random_inputs(wl, 40, device="cuda")
        launch = GEMM_INT8.build(wl, cfg).bind(x, w, params, poisoned(wl, "cuda"))
        for seed in (41, 42, 43):
            x.copy_(random_inputs(wl, seed, device="cuda")[0])
            assert torch.equal(launch(), run(wl, x, w, params)), (seed, dict(cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_fp16_template_and_float_conv():
    wl = load_workloads("tvm_tutorial")[0][1]
    small = wl.replace(N=8, a="u4", w="s4", epilogue=REQUANT_S8)
    check(small, CONV2D_FP16.build(small, CONV2D_FP16.default_config(small)), seed=3,
          device="cuda")
    x = torch.randn(8, wl.H, wl.W, wl.C, device="cuda").half()
    w = torch.randn(wl.K, wl.R, wl.S, wl.C, device="cuda").half()
    out = conv2d_fp16(x, w, stride=1, pad=1)
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2),
                                     w.double().permute(0, 3, 1, 2), padding=1)
    rel = (out.double().permute(0, 3, 1, 2) - ref).norm() / ref.norm()
    assert rel < 2e-3, rel


def test_layout_constants_match_core():
    from lowbit.kernels.triton.epilogue import LAYOUT_BITPLANE, LAYOUT_CODE, LAYOUT_PACKED
    assert LAYOUT_CODE[Layout.PACKED] == LAYOUT_PACKED
    assert LAYOUT_CODE[Layout.BITPLANE] == LAYOUT_BITPLANE


@pytest.mark.parametrize("epi", range(len(EPILOGUES)))
def test_ahead_of_time_compile_specializes_like_the_launch(epi: int, monkeypatch) -> None:
    """`compile()` must fill the cache entry the launch looks up: the same argument dtypes
    (a float32 stand-in where the launch passes `out` compiles a second binary, so every
    precompiled candidate would be compiled again while it is timed)."""
    import lowbit.kernels.triton.igemm as igemm

    calls: list[tuple] = []

    def record(fn, grid, args, kwargs, compile_only):
        calls.append(tuple(str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
                           for a in args) + tuple(sorted(kwargs.items())))

    monkeypatch.setattr(igemm, "launch_or_compile", record)
    wl = ConvWorkload(N=1, H=5, W=6, C=8, K=16, R=3, S=3, pad=1, w="s8", a="s8",
                      epilogue=EPILOGUES[epi])
    for cfg in (TINY, SPLIT3):
        kernel = tiny_kernel(wl, cfg)
        kernel.compile_on("cpu")
        x, w, params = random_inputs(wl, 0)
        kernel.bind(x, w, params)()
        half = len(calls) // 2  # split-K: the main kernel and the reduction, each time
        assert half and calls[:half] == calls[half:], "compile and launch specialize differently"
        calls.clear()
