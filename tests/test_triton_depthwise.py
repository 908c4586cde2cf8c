"""Depthwise and grouped conv templates: `triton.conv2d_depthwise` (CUDA cores) and
`triton.conv2d_grouped_int8` (block-diagonal implicit GEMM on int8 tensor cores).

CPU: under TRITON_INTERPRET=1 on small odd shapes (MobileNet / EfficientNet / ResNeXt layers
made small): depthwise 3x3/1, 3x3/2 and 5x5/2, grouped 3x3 with 4, 6 and 8 channels per group,
int8 and packed u2 / u4 activations, every output kind (int32, fp16, requantized INT8, PACKED,
BITPLANE, with ReLU, bias in accumulator units or at the output's shift), bit-exact against
`lowbit.reference.run` with a poisoned output. Both templates are registered, dense templates
refuse grouped convs, dispatch's candidate configs and the performance model's launch shapes
work for both, and both compile for sm_90 (offline, the grouped one with wgmma).
GPU (`gpu` mark): MobileNet-V2 and ResNeXt-50 layers at batch 2, default and sampled configs.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import triton

from lowbit.core import Config, ConvWorkload, Epilogue
from lowbit.kernels import get_template, load_backends, templates
from lowbit.kernels.triton.depthwise import DepthwiseKernel, depthwise_problem
from lowbit.kernels.triton.grouped import (
    GroupedKernel,
    block_diagonal_weights,
    grouped_problem,
    tile_spans,
)
from lowbit.reference import random_inputs, run
from triton_cases import DEVICE, check, poisoned

load_backends()
DEPTHWISE = get_template("triton.conv2d_depthwise")
GROUPED = get_template("triton.conv2d_grouped_int8")
GROUPED_CUDA = get_template("triton.conv2d_grouped_cuda")

U8_RELU = Epilogue(bias=True, relu=True, out="u8")
U4_PACKED = Epilogue(bias=True, relu=True, out="u4", out_layout="packed")
S8_SHIFTED = Epilogue(shifted_bias=True, relu=True, out="s8")
S3_PLANES = Epilogue(bias=True, out="s3", out_layout="bitplane")
FP16 = Epilogue(bias=True, out="fp16")
PACKED_U4 = dict(a="u4", a_layout="packed")
PACKED_U2 = dict(a="u2", a_layout="packed")

# small tiles outside the H100 spaces (the interpreter's dot works at 16): several tiles in
# pixels and channels, a ragged last tile in both
DW_TINY = Config(BLOCK_PIX=64, BLOCK_C=32, num_warps=1, TAP_LOOP="unrolled", num_stages=1,
                 MAC="int32")
DW_PIPELINED = Config(BLOCK_PIX=128, BLOCK_C=16, num_warps=2, TAP_LOOP="pipelined",
                      num_stages=2, MAC="fp32")
GR_TINY = Config(BLOCK_PIX=64, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=2)
GR_WIDE = GR_TINY.replace(BLOCK_N=32, GROUP_M=1)


def dw(c: int, r: int, stride: int, n: int = 3, **kw) -> ConvWorkload:
    """A depthwise layer on an odd map, odd batch by default (padding r // 2, as
    MobileNet's)."""
    return ConvWorkload(N=n, H=9, W=7, C=c, K=c, R=r, S=r, stride=stride, pad=r // 2,
                        groups=c, **kw)


def grouped(c: int, k: int, groups: int, stride: int = 1, **kw) -> ConvWorkload:
    return ConvWorkload(N=3, H=7, W=9, C=c, K=k, R=3, S=3, stride=stride, pad=1, groups=groups,
                        **kw)


# (id, workload, config): MobileNet-V2 3x3/1 and 3x3/2, EfficientNet's 5x5/2, int8 / u8 /
# packed activations and packed weights, every output kind
DEPTHWISE_CASES = [
    ("3x3s1_s8_int32", dw(40, 3, 1), DW_TINY),
    ("3x3s2_u8_relu_u8", dw(40, 3, 2, a="u8", epilogue=U8_RELU), DW_TINY),
    ("5x5s2_u8_u4packed", dw(24, 5, 2, a="u8", epilogue=U4_PACKED), DW_PIPELINED),
    ("3x3s1_u4packed_in_out_fp32", dw(40, 3, 1, **PACKED_U4, w="s4", w_layout="packed",
                                      epilogue=U4_PACKED), DW_TINY.replace(MAC="fp32")),
    ("3x3s2_u2packed_shifted_s8", dw(48, 3, 2, **PACKED_U2, w="s2", epilogue=S8_SHIFTED),
     DW_PIPELINED),
    ("5x5s1_u2packed_bitplane", dw(36, 5, 1, n=1, **PACKED_U2, w="s2", w_layout="packed",
                                   epilogue=S3_PLANES),
     DW_TINY.replace(TAP_LOOP="pipelined", num_stages=3)),
    ("3x3s1_s8_fp16", dw(20, 3, 1, epilogue=FP16), DW_TINY),
    ("3x3s2_binary_packed", dw(32, 3, 2, n=1, a="b1", a_layout="packed", w="b1",
                               w_layout="packed", epilogue=S8_SHIFTED), DW_TINY),
]

# MAC="dp4a" (4 taps of a channel a dp4a, `depthwise_taps`): u8 / s8 / s4 / binary one-byte
# activations, s8 / low-bit / u8 weights, 3x3/1, 3x3/2, 5x5 (6 groups of 4 taps and 1), 2x2 (one
# group, no tap left), C = 4, 12, 44 (ragged channel tiles), every output kind
DW_DP4A = DW_TINY.replace(BLOCK_C=16, MAC="dp4a")
DP4A_CASES = [
    ("3x3s1_u8_relu_u8_c12", dw(12, 3, 1, a="u8", epilogue=U8_RELU), DW_DP4A),
    ("3x3s2_s8_int32_c44", dw(44, 3, 2), DW_DP4A.replace(BLOCK_C=32)),
    ("5x5s1_u8_s4packed_w_u4packed_c4", dw(4, 5, 1, a="u8", w="s4", w_layout="packed",
                                           epilogue=U4_PACKED), DW_DP4A),
    ("5x5s2_s8_fp16_pipelined_c12", dw(12, 5, 2, epilogue=FP16),
     DW_DP4A.replace(TAP_LOOP="pipelined", num_stages=2)),
    ("3x3s2_s4_u8w_shifted_s8_c44", dw(44, 3, 2, a="s4", w="u8", epilogue=S8_SHIFTED),
     DW_DP4A.replace(BLOCK_C=32, BLOCK_PIX=32)),
    ("3x3s1_u8_s2w_bitplane_c44", dw(44, 3, 1, n=1, a="u8", w="s2", epilogue=S3_PLANES),
     DW_DP4A.replace(BLOCK_C=32, TAP_LOOP="pipelined", num_stages=3)),
    ("3x3s1_binary_u4w_int32_c12", dw(12, 3, 1, a="b1", w="u4"), DW_DP4A),
    ("2x2s1_u8_relu_u8_c12", ConvWorkload(N=2, H=7, W=5, C=12, K=12, R=2, S=2, pad=1,
                                          groups=12, a="u8", epilogue=U8_RELU), DW_DP4A),
]

# (id, workload, config): ResNeXt's 4 and 8 channels per group, 6 per group with twice the
# filters (a column tile then splits a group), packed activations and weights
GROUPED_CASES = [
    ("cg4_s1_int32", grouped(32, 32, 8), GR_TINY),
    ("cg4_s2_u8_relu_u8", grouped(32, 32, 8, stride=2, a="u8", epilogue=U8_RELU), GR_WIDE),
    ("cg8_s1_u4packed_in_out", grouped(32, 32, 4, **PACKED_U4, w="s4", w_layout="packed",
                                       epilogue=U4_PACKED), GR_TINY),
    ("cg8_s2_u2packed_shifted_s8", grouped(40, 40, 5, stride=2, **PACKED_U2, w="s2",
                                           epilogue=S8_SHIFTED), GR_WIDE),
    ("cg6_kg12_u2packed_unaligned_bitplane", grouped(18, 36, 3, **PACKED_U2,
                                                     epilogue=S3_PLANES), GR_WIDE),
    ("cg4_fp16", grouped(16, 16, 4, epilogue=FP16), GR_TINY),
    ("cg8_binary_packed", grouped(32, 32, 4, stride=2, a="b1", a_layout="packed", w="b1",
                                  w_layout="packed", epilogue=S8_SHIFTED), GR_WIDE),
]

# the same grouped layers on CUDA cores (`triton.conv2d_grouped_cuda`: gathered group inputs),
# at the depthwise tiles (bit-plane outputs need 32 channels a tile), and 16 channels a group
GROUPED_CUDA_CASES = [
    (f"{name}_cuda", wl, DW_TINY if i % 2 == 0 or wl.epilogue == S3_PLANES else DW_PIPELINED)
    for i, (name, wl, _) in enumerate(GROUPED_CASES)] + [
    ("cg16_s2_u8_relu_u8_fp32_cuda", grouped(48, 48, 3, stride=2, a="u8", epilogue=U8_RELU),
     DW_TINY.replace(MAC="fp32")),
]


# ------------------------------------------------------------------------------- CPU tests

@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=[c[0] for c in DEPTHWISE_CASES])
def test_depthwise_bit_exact(case):
    _, wl, cfg = case
    check(wl, DepthwiseKernel("test", wl, cfg, depthwise_problem(wl)), seed=len(wl.key))


@pytest.mark.parametrize("case", DP4A_CASES, ids=[c[0] for c in DP4A_CASES])
def test_depthwise_dp4a_bit_exact(case):
    _, wl, cfg = case
    assert DEPTHWISE.unsupported_reason(wl) is None
    assert DEPTHWISE.constraints(wl)[-1](cfg) is None  # the MAC constraint takes it
    check(wl, DepthwiseKernel("test", wl, cfg, depthwise_problem(wl)), seed=len(wl.key) + 2)


def test_dp4a_transpose_byte_order():
    """The GPU path's 8 prmt (`TRANSPOSE_STEPS` under PTX prmt semantics) put byte j of tap
    t's word in byte t of channel j's word, as the interpreter's shifts do."""
    from lowbit.kernels.triton.depthwise_taps import TRANSPOSE_STEPS, prmt, prmt_transpose

    assert prmt(0x33221100, 0x77665544, 0x5140) == 0x55114400
    assert prmt(0x000000F0, 0, 0x4448) == 0xFF  # a nibble with bit 3: the sign replicated
    rng = random.Random(3)
    for _ in range(200):
        words = tuple(rng.getrandbits(32) for _ in range(4))
        out = prmt_transpose(words)
        for j in range(4):
            for t in range(4):
                assert (out[j] >> (8 * t)) & 0xFF == (words[t] >> (8 * j)) & 0xFF
    assert len(TRANSPOSE_STEPS) == 8


def test_dp4a_weight_words():
    """`tap_major_weights(..., tap_groups=True)`: channel 4u + j's taps 4g..4g+3 in row 4g + j,
    word u; the 25th tap of a 5x5 alone in byte j of rows 24..27; zeros past C."""
    from lowbit.kernels.triton.depthwise import tap_major_weights
    from lowbit.kernels.triton.depthwise_taps import tap_group_rows

    wl = dw(12, 5, 1, w="s8")
    w = torch.randint(-128, 128, (12, 5, 5, 1), dtype=torch.int8)
    words = tap_major_weights(wl, w, tap_groups=True)
    assert words.dtype == torch.int32 and words.shape == (tap_group_rows(25), 128 // 4) == (28, 32)
    b = words.contiguous().view(torch.int8).reshape(7, 4, 32, 4)  # [row group, j, u, byte]
    taps = w.reshape(12, 25)
    for c in range(12):
        u, j = divmod(c, 4)
        for g in range(6):
            assert torch.equal(b[g, j, u], taps[c, 4 * g:4 * g + 4])
        assert b[6, j, u, j] == taps[c, 24]
        assert int(b[6, j, u].abs().sum()) == abs(int(taps[c, 24]))
    assert int(b[:, :, 3:].abs().sum()) == 0


def test_default_mac_is_dp4a_from_9_taps_where_it_applies():
    """The default multiply-accumulates: dp4a on 3 x 3 and 5 x 5 filters of one-byte
    activations with C a multiple of 4 (>= DP4A_DEFAULT_TAPS taps), int32 on 2 x 2 filters,
    on packed activations and where C % 4 != 0."""
    macs = {name: DEPTHWISE.default_config(wl)["MAC"] for name, wl in (
        ("5x5_u8", dw(240, 5, 2, a="u8")), ("5x5_s8", dw(12, 5, 1)),
        ("3x3_u8", dw(144, 3, 1, a="u8")), ("2x2_u8", dw(12, 2, 1, a="u8")),
        ("5x5_u4", dw(12, 5, 1, **PACKED_U4)), ("5x5_c10", dw(10, 5, 1, a="u8")))}
    assert macs == {"5x5_u8": "dp4a", "5x5_s8": "dp4a", "3x3_u8": "dp4a", "2x2_u8": "int32",
                    "5x5_u4": "int32", "5x5_c10": "int32"}


def test_dp4a_refused_where_it_cannot_run():
    """MAC="dp4a" is in the space of one-byte activations with C % 4 == 0 and >= 4 taps, and
    refused elsewhere by the MAC constraint with the reason (not a crash), as built."""
    def reason(template, wl):
        cfg = template.default_config(wl).replace(MAC="dp4a")
        with pytest.raises(ValueError) as err:
            template.build(wl, cfg)
        return str(err.value)

    ok = dw(12, 3, 1, a="u8")
    assert any(c["MAC"] == "dp4a" for c in DEPTHWISE.space(ok).all_configs())
    assert DEPTHWISE.space(ok).is_valid(DEPTHWISE.default_config(ok).replace(MAC="dp4a"))
    assert "C=10 is not a multiple of 4" in reason(DEPTHWISE, dw(10, 3, 1, a="u8"))
    assert "INT8 layout" in reason(DEPTHWISE, dw(12, 3, 1, **PACKED_U4))
    assert "INT8 layout" in reason(DEPTHWISE, dw(12, 3, 1, **PACKED_U2))
    assert "R*S=1 < 4" in reason(DEPTHWISE, dw(12, 1, 1, a="u8"))
    assert "grouped convs take MAC int32" in reason(GROUPED_CUDA, grouped(32, 32, 8))
    for wl in (dw(10, 3, 1, a="u8"), dw(12, 3, 1, **PACKED_U4)):
        assert all(c["MAC"] != "dp4a" for c in DEPTHWISE.space(wl).all_configs())


def test_dp4a_refuses_activations_off_word_boundaries():
    """MAC="dp4a" reads x as int32 words: x starting off a 4-byte boundary is a ValueError
    naming x, before any launch."""
    wl = dw(12, 3, 1, a="u8")
    x, w, params = random_inputs(wl, 4, device=DEVICE)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape)
    shifted.copy_(x)
    kernel = DepthwiseKernel("test", wl, DW_DP4A, depthwise_problem(wl))
    with pytest.raises(ValueError, match=r"x: MAC='dp4a'.*4-byte boundary"):
        kernel(shifted, w, params, out=poisoned(wl))


@pytest.mark.parametrize("case", GROUPED_CASES, ids=[c[0] for c in GROUPED_CASES])
def test_grouped_bit_exact(case):
    _, wl, cfg = case
    check(wl, GroupedKernel("test", wl, cfg, grouped_problem(wl)), seed=len(wl.key))


@pytest.mark.parametrize("case", GROUPED_CUDA_CASES, ids=[c[0] for c in GROUPED_CUDA_CASES])
def test_grouped_cuda_bit_exact(case):
    _, wl, cfg = case
    assert GROUPED_CUDA.unsupported_reason(wl) is None
    check(wl, DepthwiseKernel("test", wl, cfg, depthwise_problem(wl)), seed=len(wl.key) + 1)


def test_group_inputs_load_as_words_where_bytes_align():
    """`group_words`: one-byte activations, 4n channels a group on 4-byte rows (the grouped
    CUDA-core cases above cover both paths: cg4 / cg16 int8 words, packed and cg6 bytes), and
    the weights packed to match."""
    from lowbit.kernels.triton.depthwise import group_words, tap_major_weights

    expect = {"cg4_s1_int32_cuda": True, "cg4_s2_u8_relu_u8_cuda": True,
              "cg8_s1_u4packed_in_out_cuda": False, "cg8_s2_u2packed_shifted_s8_cuda": False,
              "cg6_kg12_u2packed_unaligned_bitplane_cuda": False, "cg4_fp16_cuda": True,
              "cg8_binary_packed_cuda": False, "cg16_s2_u8_relu_u8_fp32_cuda": True}
    got = {name: group_words(wl) for name, wl, _ in GROUPED_CUDA_CASES}
    assert got == expect
    assert not group_words(grouped(18, 18, 3))
    # the weights of a word group: channel 4u + b in byte b of word u, per tap and filter
    wl = grouped(32, 32, 4, w="s8")
    w = torch.randint(-128, 128, (32, 3, 3, 8), dtype=torch.int8)
    words = tap_major_weights(wl, w)
    assert words.dtype == torch.int32 and words.shape == (9 * 2, 128)
    as_bytes = words[:, :32].contiguous().view(torch.int8).reshape(9, 2, 32, 4)
    assert torch.equal(as_bytes.permute(2, 0, 1, 3).reshape(32, 3, 3, 8), w)
    assert int(words[:, 32:].abs().sum()) == 0


def test_default_configs_bit_exact():
    """The templates' own defaults (H100 tile sizes) on a small depthwise and grouped layer."""
    for template, wl in ((DEPTHWISE, dw(24, 3, 2, a="u8", epilogue=U8_RELU)),
                         (GROUPED, grouped(16, 16, 4, a="u8", epilogue=U8_RELU)),
                         (GROUPED_CUDA, grouped(16, 16, 4, a="u8", epilogue=U8_RELU))):
        cfg = template.default_config(wl)
        assert template.space(wl).is_valid(cfg)
        check(wl, template.build(wl, cfg), seed=5)


def test_packed_activations_are_read_as_bytes():
    """A u4 / u2 depthwise layer's activations are half / a quarter of the int8 bytes, and the
    kernel is handed the packed storage itself (no unpacked copy)."""
    base = dw(64, 3, 1)
    sizes = {}
    for name, kw in (("int8", {}), ("u4", PACKED_U4), ("u2", PACKED_U2)):
        wl = base.replace(**kw)
        x, _, _ = random_inputs(wl, 1)
        sizes[name] = x.numel() * x.element_size()
        launch = DEPTHWISE.build(wl, DEPTHWISE.default_config(wl)).plan(
            depthwise_problem(wl), x, torch.zeros(1), poisoned(wl, "cpu"), (None,) * 4)[0]
        assert launch.args[0] is x
    assert sizes["u4"] * 2 == sizes["int8"] == sizes["u2"] * 4


def test_bound_launcher_serves_new_activations():
    """A bound grouped launcher keeps its block-diagonal weights; new x in place is read."""
    wl = grouped(16, 16, 4, epilogue=Epilogue(bias=True, out="u8"))
    kernel = GroupedKernel("test", wl, GR_TINY, grouped_problem(wl))
    x, w, params = random_inputs(wl, 7, device=DEVICE)
    out = poisoned(wl)
    launch = kernel.bind(x, w, params, out=out)
    for seed in (8, 9):
        x.copy_(random_inputs(wl, seed, device=DEVICE)[0])
        assert torch.equal(launch(), run(wl, x, w, params))


def test_block_diagonal_weights_place_each_filter_in_its_groups_span():
    wl = grouped(18, 36, 3, w="s4", w_layout="packed")  # Cg 6, Kg 12: tiles of 16 split groups
    _, w, _ = random_inputs(wl, 3)
    blocks = block_diagonal_weights(wl, w, 16)
    spans = tile_spans(wl, 16)
    assert spans == [(0, 12), (6, 12), (12, 6)]
    from lowbit.quant.packing import unpack

    values = unpack(w, wl.w, wl.w_layout, 6).reshape(36, 9, 6)
    assert blocks.shape == (36, 9, 16)
    for n in range(36):
        lo = (n // 12) * 6 - spans[n // 16][0]
        assert torch.equal(blocks[n, :, lo:lo + 6].long(), values[n])
        assert int(blocks[n].abs().sum()) == int(values[n].abs().sum())  # zeros elsewhere


def test_only_the_grouped_templates_take_grouped_convs():
    dwl = dw(32, 3, 1)
    gwl = grouped(32, 32, 8)
    dense = ConvWorkload(N=1, H=8, W=8, C=32, K=32, R=3, S=3, pad=1)
    takers = {wl.key: {t.name for t in templates() if t.unsupported_reason(wl) is None}
              for wl in (dwl, gwl)}
    assert takers[dwl.key] == {"triton.conv2d_depthwise"}
    assert takers[gwl.key] == {"triton.conv2d_grouped_int8", "triton.conv2d_grouped_cuda"}
    dense_takers = [t for t in templates() if t.unsupported_reason(dense) is None]
    assert len(dense_takers) >= 3
    for t in dense_takers:  # the dense conv templates name the groups as the reason
        assert "groups=8" in t.unsupported_reason(gwl), t.name
    assert "depthwise" in GROUPED.unsupported_reason(dwl)
    assert "groups=1" in GROUPED.unsupported_reason(dense)
    assert "depthwise" in DEPTHWISE.unsupported_reason(gwl)
    assert "not depthwise" in GROUPED_CUDA.unsupported_reason(dwl)
    assert "32 input channels per group > 16" in GROUPED_CUDA.unsupported_reason(
        grouped(64, 64, 2))
    assert "bitplane" in DEPTHWISE.unsupported_reason(dwl.replace(a="u2", w="s2",
                                                                  a_layout="bitplane",
                                                                  w_layout="bitplane"))
    with pytest.raises(ValueError, match="does not support"):
        DEPTHWISE.build(gwl, DEPTHWISE.default_config(dwl))


def test_dispatch_candidates_and_launch_shapes():
    """`tune.dispatch.candidate_configs` draws valid configs of both templates (default first)
    and the performance model estimates them (`geometry` from the templates' launch shapes:
    the grouped reduction is the padded span, not C)."""
    from lowbit.perfmodel.geometry import geometry
    from lowbit.perfmodel.predict import predict_many
    from lowbit.tune.dispatch import candidate_configs

    cases = ((DEPTHWISE, ConvWorkload(N=64, H=112, W=112, C=32, K=32, R=3, S=3, pad=1,
                                      groups=32, a="u8", epilogue=U8_RELU)),
             (GROUPED, ConvWorkload(N=64, H=56, W=56, C=128, K=128, R=3, S=3, pad=1,
                                    groups=32, a="u8", epilogue=U8_RELU)))
    for template, wl in cases:
        cfgs = candidate_configs(template, wl, n=24)
        space = template.space(wl)
        assert cfgs[0] == template.default_config(wl)
        assert len(cfgs) >= 8 and all(space.is_valid(c) for c in cfgs)
        geo = geometry(template, wl, cfgs[0])
        assert geo.family == "generic" and geo.M == wl.gemm_shape[0] and geo.N == wl.K
        times = predict_many(template, wl, cfgs[:4])
        assert all(t > 0 and t == t for t in times)
    geo = geometry(GROUPED, cases[1][1], Config(BLOCK_PIX=128, BLOCK_N=32, BLOCK_K=32,
                                                num_warps=4, num_stages=3, GROUP_M=8))
    assert geo.K == 9 * 32 and geo.k_steps == 9  # span of 8 groups of 4 channels


def test_plan_policy_for_grouped_convs():
    """The plan's default runs grouped convs on tensor cores; the CUDA-core template where a
    policy puts it first (`lowbit bench` / network.py case `:int8=triton.conv2d_grouped_cuda`),
    up to 16 channels a group."""
    from lowbit.bench import impl_chooser
    from lowbit.graph.impl import choose_impl

    cg4 = ConvWorkload(N=2, H=8, W=8, C=128, K=128, R=3, S=3, pad=1, groups=32, a="u2",
                       w="s2")
    cg32 = cg4.replace(C=1024, K=1024)
    assert choose_impl(cg4)[0] == "triton.conv2d_grouped_int8"
    prefer = impl_chooser("triton.conv2d_grouped_cuda")
    assert prefer(cg4)[0] == "triton.conv2d_grouped_cuda"
    impl, why = prefer(cg32)
    assert impl == "triton.conv2d_grouped_int8" and "32 input channels per group" in why


def test_dispatch_choose_picks_among_them():
    from lowbit.tune.dispatch import choose

    wl = dw(32, 3, 1).replace(N=8, H=56, W=56)
    pick = choose(wl, "H100", include_fp16=False)
    assert pick.template == "triton.conv2d_depthwise"


# ---------------------------------------------------------------- sm_90 offline compile

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
COMPILE_CASES = {
    "depthwise_default_u8": (DEPTHWISE, ConvWorkload(N=64, H=56, W=56, C=144, K=144, R=3, S=3,
                                                     pad=1, groups=144, a="u8",
                                                     epilogue=U8_RELU), None),
    "depthwise_u4_pipelined": (DEPTHWISE, ConvWorkload(N=64, H=28, W=28, C=192, K=192, R=3,
                                                       S=3, stride=2, pad=1, groups=192,
                                                       **PACKED_U4, epilogue=U4_PACKED),
                               Config(BLOCK_PIX=64, BLOCK_C=64, num_warps=4,
                                      TAP_LOOP="pipelined", num_stages=3, MAC="int32")),
    "depthwise_u2_fp32_mac": (DEPTHWISE, ConvWorkload(N=64, H=56, W=56, C=144, K=144, R=3,
                                                      S=3, pad=1, groups=144, **PACKED_U2,
                                                      epilogue=U4_PACKED),
                              Config(BLOCK_PIX=32, BLOCK_C=64, num_warps=4,
                                     TAP_LOOP="unrolled", num_stages=1, MAC="fp32")),
    # MAC="dp4a" at the default tiles of MobileNet-V2's 56x56 144-channel 3x3/1
    "depthwise_dp4a_u8": (DEPTHWISE, ConvWorkload(N=64, H=56, W=56, C=144, K=144, R=3, S=3,
                                                  pad=1, groups=144, a="u8", epilogue=U8_RELU),
                          Config(BLOCK_PIX=64, BLOCK_C=64, num_warps=4, TAP_LOOP="unrolled",
                                 num_stages=1, MAC="dp4a")),
    "grouped_default_resnext": (GROUPED, ConvWorkload(N=64, H=56, W=56, C=128, K=128, R=3,
                                                      S=3, pad=1, groups=32, a="u8",
                                                      epilogue=U8_RELU), None),
    "grouped_u4_block_n16": (GROUPED, ConvWorkload(N=64, H=28, W=28, C=256, K=256, R=3, S=3,
                                                   pad=1, groups=32, **PACKED_U4,
                                                   epilogue=U4_PACKED),
                             Config(BLOCK_PIX=128, BLOCK_N=16, BLOCK_K=32, num_warps=4,
                                    num_stages=3, GROUP_M=8)),
    # ResNeXt's w2a2 layer1 grouped conv as the network runs it: u2 bytes in, u2 bit planes
    # out (int32 words of 4 channels a group), and 8 channels a group into u8
    "cuda_grouped_default_resnext_u2_planes": (
        GROUPED_CUDA, ConvWorkload(N=32, H=56, W=56, C=128, K=128, R=3, S=3, pad=1, groups=32,
                                   a="u2", w="s2", epilogue=Epilogue(
                                       shifted_bias=True, relu=True, out="u2",
                                       out_layout="bitplane")), None),
    "cuda_grouped_default_cg8_u8": (GROUPED_CUDA, ConvWorkload(
        N=32, H=28, W=28, C=256, K=256, R=3, S=3, pad=1, groups=32, a="u8",
        epilogue=U8_RELU), None),
}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compile_for_sm90():
    from triton_offline import compile_in_subprocess

    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    cases = []
    for template, wl, cfg in COMPILE_CASES.values():
        cfg = template.checked_config(wl, cfg or template.default_config(wl))
        cases.append((template.name, wl.to_json(), cfg.to_json()))
    got = dict(zip(COMPILE_CASES, compile_in_subprocess(cases), strict=True))
    for name, reports in got.items():
        assert isinstance(reports, list) and len(reports) == 1, (name, reports)
        main = reports[0]
        assert main["regs"] <= 255 and main["spill_bytes"] == 0, (name, main)
        assert (main["wgmma"] > 0) == name.startswith("grouped"), (name, main)
        if name in ("depthwise_default_u8", "depthwise_dp4a_u8"):
            assert main["byte_loads"] == 0, main  # 16-byte channel vectors, not bytes
        if name == "depthwise_dp4a_u8":  # 2 groups of 4 taps transposed, 9 taps a dp4a each
            assert main["dp4a"] > 0 and main["prmt"] >= 8, main
        if name.startswith("cuda_grouped"):
            assert main["byte_loads"] == 0, main  # a group's bytes as int32 words


# ------------------------------------------------------------------------------- GPU tests

#: MobileNet-V2's depthwise layers (C, H, stride) and ResNeXt-50 32x4d's grouped 3x3s
#: (width, H, stride) at batch 2
MOBILENET_DW = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                (384, 14, 1), (576, 14, 2), (960, 7, 1)]
RESNEXT_GROUPED = [(128, 56, 1), (256, 56, 2), (256, 28, 1), (512, 28, 2), (512, 14, 1),
                   (1024, 14, 2), (1024, 7, 1)]
#: (precision, epilogue) pairs: w8a8 (u8 activations) -> u8 and -> int32, w4a4 (packed
#: activations and weights) -> packed u4, w2a2 (packed activations) -> s8 at the output's shift
GPU_COMBOS = {"w8a8_u8": (dict(a="u8"), U8_RELU), "w8a8_int32": (dict(a="u8"), Epilogue()),
              "w4a4_u4": (dict(a="u4", w="s4", a_layout="packed", w_layout="packed"),
                          U4_PACKED),
              "w2a2_shifted_s8": (dict(a="u2", w="s2", a_layout="packed"), S8_SHIFTED)}


def gpu_layer(kind: str, width: int, h: int, stride: int, **kw) -> ConvWorkload:
    """A MobileNet-V2 depthwise ("dw") or ResNeXt-50 grouped ("grouped", 32 groups) 3x3."""
    return ConvWorkload(N=2, H=h, W=h, C=width, K=width, R=3, S=3, stride=stride, pad=1,
                        groups=width if kind == "dw" else 32, **kw)


def _sampled(template, wl, n: int, seed: int) -> list[Config]:
    configs = template.space(wl).all_configs()
    return random.Random(seed).sample(configs, min(n, len(configs)))


GPU_LAYERS = [("dw", *s) for s in MOBILENET_DW] + [("grouped", *s) for s in RESNEXT_GROUPED]


@pytest.mark.gpu
@pytest.mark.parametrize("combo", list(GPU_COMBOS))
@pytest.mark.parametrize("layer", GPU_LAYERS, ids=lambda s: "{}_c{}_h{}_s{}".format(*s))
def test_gpu_network_layers(layer, combo):
    """Each layer at its templates' default configs and one sampled config of each space
    (grouped layers: the tensor-core template and, up to 16 channels a group, the CUDA-core
    one)."""
    prec, epi = GPU_COMBOS[combo]
    wl = gpu_layer(*layer, **prec, epilogue=epi)
    takers = [DEPTHWISE] if wl.depthwise else [
        t for t in (GROUPED, GROUPED_CUDA) if t.unsupported_reason(wl) is None]
    assert takers
    for template in takers:
        for cfg in [template.default_config(wl), *_sampled(template, wl, 1, seed=len(wl.key))]:
            check(wl, template.build(wl, cfg), seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEPTHWISE_CASES + GROUPED_CASES + GROUPED_CUDA_CASES,
                         ids=[c[0] for c in DEPTHWISE_CASES + GROUPED_CASES
                              + GROUPED_CUDA_CASES])
def test_gpu_small_cases_at_default_configs(case):
    """The CPU cases on the GPU at the templates' defaults (EfficientNet's 5x5/2, RegNet-like
    6 channels per group, bit-plane and fp16 outputs)."""
    name, wl, _ = case
    template = DEPTHWISE if wl.depthwise else GROUPED_CUDA if name.endswith("_cuda") \
        else GROUPED
    check(wl, template.build(wl, template.default_config(wl)), seed=13)


@pytest.mark.gpu
@pytest.mark.parametrize("combo", ["w8a8_u8", "w8a8_int32"])
@pytest.mark.parametrize("shape", MOBILENET_DW, ids=lambda s: "c{}_h{}_s{}".format(*s))
def test_gpu_mobilenet_dp4a(shape, combo):
    """MAC="dp4a" (the prmt transpose and dp4a PTX) on MobileNet-V2's depthwise layers at
    batch 2: the default tiles, unrolled and pipelined, and the tiles of 128 channels."""
    prec, epi = GPU_COMBOS[combo]
    wl = gpu_layer("dw", *shape, **prec, epilogue=epi)
    base = DEPTHWISE.default_config(wl).replace(MAC="dp4a")
    space = DEPTHWISE.space(wl)
    configs = [base, base.replace(TAP_LOOP="pipelined", num_stages=3),
               base.replace(BLOCK_C=128, BLOCK_PIX=32)]
    configs = [c for c in configs if space.is_valid(c)]
    assert configs[0] == base
    for cfg in configs:
        check(wl, DEPTHWISE.build(wl, cfg), seed=17)


@pytest.mark.gpu
@pytest.mark.parametrize("case", DP4A_CASES, ids=[c[0] for c in DP4A_CASES])
def test_gpu_dp4a_small_cases(case):
    """The CPU MAC="dp4a" cases through the PTX path (every activation and weight kind, 5x5,
    2x2, ragged channel tiles, every output kind)."""
    _, wl, cfg = case
    check(wl, DepthwiseKernel("test", wl, cfg, depthwise_problem(wl)), seed=len(wl.key) + 3)
