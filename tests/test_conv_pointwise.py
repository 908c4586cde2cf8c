"""`triton.conv2d_pointwise`: the persistent weight-resident kernel of 1x1 stride-1 convs of
few input channels.

CPU: under TRITON_INTERPRET=1 on small odd shapes (row counts off BLOCK_M, C of 3 to 200, K
off BLOCK_N), s8 / u8 / packed u4 activations, packed s4 weights, every output kind (int32,
fp16, requantized INT8, PACKED, BITPLANE) and the shifted-bias requantization in its int64,
float64 and int32 forms, with programs fewer than the tiles (each loops over several, some
one more than others) and as many as the tiles, bit-exact against `lowbit.reference.run`
with a poisoned output. Refusals name what is not a 1x1 stride-1 conv of few channels; the
default configs of MobileNet-V2's few-channel 1x1s; the performance model and the tuner's
candidates see the template; the planner puts it first on few-channel 1x1s. The default
configs of MobileNet-V2's shapes compile for sm_90 (offline) without spills, the activation
loads pipelined (cp.async inside the row-tile loop).
GPU (`gpu` mark): MobileNet-V2's few-channel 1x1 layers at batch 2, bit-exact.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import triton

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload
from lowbit.core.epilogue import SHIFTED_BIAS_LIMIT, EpilogueParams
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.base import acc_bound
from lowbit.kernels.triton.epilogue import (
    BIAS_SHIFTED,
    BIAS_SHIFTED_FLOAT64,
    BIAS_SHIFTED_INT32,
)
from lowbit.kernels.triton.pointwise import PointwiseKernel, programs
from lowbit.kernels.triton.templates import problem, with_float64_requant
from lowbit.reference import random_inputs, run
from lowbit.reference.epilogue import shifted_bias_from
from lowbit.reference.netops import fixed_point_pair32
from triton_cases import DEVICE, poisoned

load_backends()
POINTWISE = get_template("triton.conv2d_pointwise")
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

U8_SHIFTED = Epilogue(shifted_bias=True, relu=True, out="u8")
S8_SHIFTED = Epilogue(shifted_bias=True, out="s8")
#: MobileNet-V2's few-channel 1x1s at batch 64: (H, C, K)
MOBILENET = [(112, 16, 96), (56, 24, 144), (14, 64, 384), (112, 32, 16), (28, 32, 192)]


def pw(c: int, k: int, n: int = 3, h: int = 7, width: int = 9, **kw) -> ConvWorkload:
    """A 1x1 stride-1 layer of n*h*width rows (189 by default: off every BLOCK_M)."""
    return ConvWorkload(N=n, H=h, W=width, C=c, K=k, R=1, S=1, **kw)


def cfg(bm: int = 64, bn: int = 16, per_sm: int = 1, stages: int = 2) -> Config:
    return Config(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=stages,
                  PROGRAMS_PER_SM=per_sm)


def shifted_params(wl: ConvWorkload, p: EpilogueParams, form: int) -> EpilogueParams:
    """Shifted-bias parameters whose cheapest exact requantization is `form`: 31-bit
    multipliers and two biases near 2^62 (int64), the same multipliers 10 bits shorter
    (float64), or multipliers sized for the int32 sum (`fixed_point_pair32` at the
    workload's acc_bound)."""
    g = torch.Generator().manual_seed(wl.K)
    if form == BIAS_SHIFTED_INT32:
        span = wl.epilogue.out.qmax - wl.epilogue.out.qmin
        ratio = (torch.rand(wl.K, generator=g, dtype=torch.float64) + 0.5) * span * 8 \
            / acc_bound(wl)
        m, _, s = fixed_point_pair32(ratio, 0.0, acc_bound(wl), 0, bias_steps=span / 4)
        b = ((torch.rand(wl.K, generator=g, dtype=torch.float64) - 0.5) * span / 2
             * torch.pow(2.0, s)).to(torch.int64)
        return EpilogueParams(multiplier=m.to(torch.int32), shift=s.to(torch.int32),
                              shifted_bias=b)
    m, s = p.multiplier, p.shift
    if form == BIAS_SHIFTED_FLOAT64:
        m, s = torch.clamp(m >> 10, min=1), s - 10
    b = shifted_bias_from(torch.randint(-500, 500, (wl.K,), generator=g), m, s, g)
    if form == BIAS_SHIFTED:  # two channels' biases past float64's exact range
        b[0], b[1] = SHIFTED_BIAS_LIMIT - 1, -(SHIFTED_BIAS_LIMIT - 1)
    return EpilogueParams(multiplier=m, shift=s, shifted_bias=b)


# (id, workload, config, SMs the grid is sized for, shifted-bias form or None)
CASES = [
    # 2 column tiles x 3 row tiles on 2 programs per column tile: 2 and 1 row tiles each
    ("c3_k24_s8_int32", pw(3, 24), cfg(per_sm=2), 2, None),
    # 3 column tiles x 3 row tiles on 3 programs: 3 row tiles each
    ("c24_k96_u8_relu_u8_f64", pw(24, 96, a="u8", epilogue=U8_SHIFTED), cfg(bn=32), 1,
     BIAS_SHIFTED_FLOAT64),
    # 5 column tiles (the last half full) x 2 row tiles: a program per tile
    ("c40_k144_u8_s8_int32form", pw(40, 144, n=2, h=5, width=11, a="u8", epilogue=S8_SHIFTED),
     cfg(bn=32, per_sm=4), 132, BIAS_SHIFTED_INT32),
    ("c24_k40_u8_int64form", pw(24, 40, a="u8", epilogue=U8_SHIFTED), cfg(), 3, BIAS_SHIFTED),
    ("c24_k40_u8_u4packed", pw(24, 40, a="u8", epilogue=Epilogue(bias=True, relu=True,
                                                                    out="u4",
                                                                    out_layout="packed")),
     cfg(), 1, None),
    ("c16_k72_s8_u2bitplane", pw(16, 72, epilogue=Epilogue(relu=True, out="u2",
                                                           out_layout="bitplane")),
     cfg(bn=32), 2, None),
    ("c24_k24_s8_fp16", pw(24, 24, epilogue=Epilogue(bias=True, out="fp16")), cfg(), 1, None),
    ("c64_k48_u4packed_s4packed_s8", pw(64, 48, a="u4", a_layout="packed", w="s4",
                                        w_layout="packed",
                                        epilogue=Epilogue(bias=True, relu=True, out="s8")),
     cfg(bn=32), 1, None),
    ("c200_k24_s8_int32", pw(200, 24, n=1, h=9, width=11), cfg(), 1, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bit_exact(case):
    _, wl, config, sms, form = case
    assert POINTWISE.unsupported_reason(wl) is None
    config = POINTWISE.checked_config(wl, config)
    kernel = PointwiseKernel(POINTWISE.name, wl, config, problem(wl, False), sms=sms)
    x, w, params = random_inputs(wl, len(wl.key), device=DEVICE)
    if form is not None:
        params = shifted_params(wl, params.to("cpu"), form).to(DEVICE)
        picked = with_float64_requant(wl, kernel.problem, params, (None,) * 4, DEVICE)[0]
        assert picked.bias == form
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    got = kernel(x, w, params, out=poisoned(wl))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want), f"{(got.cpu() != want).sum().item()} differ"
    assert len(want.unique()) > 2  # the outputs are not constant


def test_programs_cover_every_tile_once():
    """The grid: PROGRAMS_PER_SM a SM rounded down to whole column tiles, capped at the
    tiles; program p's row tiles p // cols + i * step cover each row tile once per column."""
    assert programs(189, 24, cfg(per_sm=2), 2) == (4, 2, 2)      # fewer programs than tiles
    assert programs(189, 96, cfg(bn=32), 1) == (3, 3, 1)         # one per column tile
    assert programs(110, 144, cfg(bn=32, per_sm=4), 132) == (10, 5, 2)  # one per tile
    assert programs(802816, 96, cfg(128, 32, 4), 132) == (528, 3, 176)
    for m, n, c, sms in ((189, 24, cfg(per_sm=2), 2), (1000, 40, cfg(bn=16, per_sm=3), 5)):
        grid, cols, step = programs(m, n, c, sms)
        rows = -(-m // c["BLOCK_M"])
        seen = sorted((p % cols, t) for p in range(grid)
                      for t in range(p // cols, rows, step))
        assert seen == [(col, t) for col in range(cols) for t in range(rows)]


def test_bound_launcher_serves_new_activations():
    wl = pw(24, 40, a="u8", epilogue=U8_SHIFTED)
    kernel = PointwiseKernel(POINTWISE.name, wl, cfg(), problem(wl, False), sms=1)
    x, w, params = random_inputs(wl, 7, device=DEVICE)
    launch = kernel.bind(x, w, params, out=poisoned(wl))
    for seed in (8, 9):
        x.copy_(random_inputs(wl, seed, device=DEVICE)[0])
        assert torch.equal(launch().cpu(), run(wl, x.cpu(), w.cpu(), params.to("cpu")))


@pytest.mark.parametrize("wl,match", [
    (ConvWorkload(N=3, H=7, W=9, C=16, K=96, R=3, S=3, pad=1), "only 1x1 stride-1"),
    (pw(16, 96).replace(stride=2), "stride=2"),
    (pw(16, 96).replace(pad=1), "pad=1"),
    (pw(16, 96).replace(groups=2), "groups=2"),
    (pw(300, 96), "C=300 > 256"),
    (pw(16, 96, w="u8"), "int8 range"),
    (pw(16, 96, epilogue=Epilogue(out="int16")), "int16"),
    (GemmWorkload(M=64, N=96, K=16), "needs a ConvWorkload"),
], ids=["3x3", "stride2", "pad1", "groups", "wide_c", "u8_weights", "int16", "gemm"])
def test_refusals_name_the_reason(wl, match):
    reason = POINTWISE.unsupported_reason(wl)
    assert reason is not None and match in reason, reason
    with pytest.raises(ValueError, match="does not support"):
        POINTWISE.space(wl)


def test_configs_outside_the_space_are_refused():
    wl = pw(24, 96, n=64, h=56, width=56, a="u8", epilogue=U8_SHIFTED)
    with pytest.raises(ValueError, match="accumulators a thread"):
        POINTWISE.build(wl, cfg(bm=256, bn=128))
    with pytest.raises(ValueError, match="registers exceed"):
        POINTWISE.build(wl, cfg(bm=128, bn=64, per_sm=4))


def test_mobilenet_defaults_and_model():
    """The defaults of MobileNet-V2's few-channel 1x1s (BLOCK_N padding K the least, the
    most resident programs), their geometry (persistent, one reduction step), the tuner's
    candidates and the performance model's predictions."""
    from lowbit.perfmodel.geometry import geometry
    from lowbit.perfmodel.predict import predict_many
    from lowbit.tune.dispatch import candidate_configs, choose

    want = {96: (32, 3), 144: (32, 3), 384: (64, 2), 16: (16, 4), 192: (64, 2)}
    for h, c, k in MOBILENET:
        wl = ConvWorkload(N=64, H=h, W=h, C=c, K=k, R=1, S=1, a="u8", epilogue=U8_SHIFTED)
        d = POINTWISE.default_config(wl)
        assert (d["BLOCK_M"], d["num_warps"], d["num_stages"]) == (128, 4, 3)
        assert (d["BLOCK_N"], d["PROGRAMS_PER_SM"]) == want[k], (k, dict(d))
        cands = candidate_configs(POINTWISE, wl, n=16)
        assert cands[0] == d and len(cands) >= 8
        geo = geometry(POINTWISE, wl, d)
        assert geo.persistent and geo.k_steps == 1 and geo.k_step == max(32, c)
        assert all(t > 0 for t in predict_many(POINTWISE, wl, cands[:4]))
    assert choose(ConvWorkload(N=64, H=56, W=56, C=24, K=144, R=1, S=1, a="u8",
                               epilogue=U8_SHIFTED)).predicted_us > 0


def test_plan_puts_it_first_on_few_channel_pointwise():
    """The default policy: few-channel 1x1 stride-1 convs (C <= 64) on this template first,
    with the old order after it; wider or spatial convs keep theirs; `int8_preferring` still
    puts another template first, and `int8_without` gives the old order."""
    from lowbit.bench.recipes import impl_chooser
    from lowbit.graph.impl import INT8_CONV, INT8_CONV_LARGE, choose_impl, int8_preferring

    def layer(h: int, c: int, k: int, **kw) -> ConvWorkload:
        return ConvWorkload(N=64, H=h, W=h, C=c, K=k, R=1, S=1, a="u8", epilogue=U8_SHIFTED,
                            **kw)

    picks = [choose_impl(layer(h, c, k))[0] for h, c, k in MOBILENET]
    assert picks == [POINTWISE.name] * len(MOBILENET)
    assert choose_impl(layer(14, 96, 576))[0] == INT8_CONV_LARGE[0]  # C > 64: the old order
    assert choose_impl(layer(7, 160, 960))[0] == INT8_CONV[0]
    spatial = ConvWorkload(N=64, H=56, W=56, C=16, K=96, R=3, S=3, pad=1, a="u8",
                           epilogue=U8_SHIFTED)
    assert choose_impl(spatial)[0] == INT8_CONV_LARGE[0]
    old = int8_preferring("triton.conv2d_int8")(layer(112, 16, 96))
    assert old[0] == "triton.conv2d_int8"
    impl, why = int8_preferring(POINTWISE.name)(layer(56, 24, 144))
    assert impl == POINTWISE.name and "persistent weight-resident kernel" in why
    # the order behind it (the network A/B `:int8=-triton.conv2d_pointwise`)
    without = impl_chooser("-" + POINTWISE.name)
    assert [without(layer(h, c, k))[0] for h, c, k in MOBILENET] == [
        INT8_CONV[0], INT8_CONV[0], INT8_CONV_LARGE[0], INT8_CONV_LARGE[0], INT8_CONV[0]]
    with pytest.raises(ValueError, match="template must be one of"):
        impl_chooser("-triton.no_such")


@pytest.mark.timeout(600)
def test_mobilenet_defaults_compile_for_sm90_pipelined():
    """The defaults of MobileNet-V2's few-channel 1x1s (u8 in, ReLU, u8 out in the float64
    and int32 requantization forms) compile for sm_90 with wgmma, no spill, no float64
    conversion instruction, registers within
    the resident programs' share of the SM, and the activation loads as cp.async of the
    rows' alignment (16 bytes; 8 for 24-byte rows): Triton lowers a loop's loads to cp.async
    only where it software-pipelines them (`triton_offline.report`)."""
    from triton_offline import compile_in_subprocess

    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    cases, names = [], []
    for h, c, k in MOBILENET[:3]:
        wl = ConvWorkload(N=64, H=h, W=h, C=c, K=k, R=1, S=1, a="u8", epilogue=U8_SHIFTED)
        d = POINTWISE.default_config(wl)
        for form in (BIAS_SHIFTED_FLOAT64, BIAS_SHIFTED_INT32):
            cases.append((POINTWISE.name, wl.to_json(), d.to_json(), form))
            names.append((f"{c}to{k}_{form}", d, math.gcd(c, 16)))
    checked = 0
    for (name, d, width), got in zip(names, compile_in_subprocess(cases), strict=True):
        assert isinstance(got, list) and len(got) == 1, (name, got)
        r = got[0]
        assert r["spill_bytes"] == 0 and r["wgmma"] > 0, (name, r)
        regs_round = -(-r["regs"] // 8) * 8
        assert regs_round * 128 * d["PROGRAMS_PER_SM"] <= 65536, (name, r)
        assert r["cp_async_bytes"] == [width] and r["byte_loads"] == 0, (name, r)
        # the float64 form's epilogue runs no float64 conversion (`epilogue.floor_int32`)
        assert r["cvt_f64"] == 0, (name, r)
        checked += 1
    assert checked == 6


# ------------------------------------------------------------------------------- GPU tests

@pytest.mark.gpu
@pytest.mark.parametrize("form", [BIAS_SHIFTED_FLOAT64, BIAS_SHIFTED_INT32, None],
                         ids=["f64", "int32", "int32_out"])
@pytest.mark.parametrize("shape", MOBILENET, ids=lambda s: "h{}_c{}_k{}".format(*s))
def test_gpu_mobilenet_layers(shape, form):
    """MobileNet-V2's few-channel 1x1s at batch 2 on the GPU at the default config (grid
    sized for the device's SMs): u8 in, ReLU u8 out in both requantization forms, and the
    int32 accumulator."""
    h, c, k = shape
    epi = U8_SHIFTED if form is not None else Epilogue()
    wl = ConvWorkload(N=2, H=h, W=h, C=c, K=k, R=1, S=1, a="u8", epilogue=epi)
    kernel = POINTWISE.build(wl, POINTWISE.default_config(wl))
    x, w, params = random_inputs(wl, 21, device="cuda")
    if form is not None:
        params = shifted_params(wl, params.to("cpu"), form).to("cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    assert torch.equal(kernel(x, w, params, out=poisoned(wl, "cuda")).cpu(), want)
