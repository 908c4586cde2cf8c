"""The weight-streaming split-K GEMV template (`triton.gemv_int8`) and its dispatch.

CPU: under TRITON_INTERPRET=1 on small odd shapes (M = 1, 3, 16; K = 100, 1001; N = 1, 513),
every epilogue, packed inputs, the shifted bias, deep and ragged K splits, a bound launcher
reused across calls (the atomic sum workspace must be left at zero), bad input; the config
space and default; the weight-streaming estimate and the zero-tuning choices (dispatch and the
engine's default policy). Every integer output is compared bit for bit with
`lowbit.reference.run` on fresh random inputs into a poisoned buffer. GPU (`gpu` mark): the
FC shapes of the issue at the default config and a deep split, exact, and a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from lowbit.core import Config, Epilogue, GemmWorkload
from lowbit.core.epilogue import EpilogueParams
from lowbit.kernels import load_backends
from lowbit.kernels.base import NUM_SMS
from lowbit.kernels.triton.gemv import GEMV_MAX_M, GemvInt8Template, block_m, k_per_split
from lowbit.perfmodel.hardware import H100, H200
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


# ------------------------------------------------------------------------------- CPU: exact
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: e.key)
def test_every_epilogue_with_split_k(epi):
    wl = GemmWorkload(M=3, N=45, K=100, epilogue=epi)
    check(wl, GEMV.build(wl, SPLIT), seed=1)


@pytest.mark.parametrize("m,n,k", [(1, 513, 1001), (3, 1, 100), (16, 513, 100),
                                   (1, 1, 1001), (16, 1, 1001), (3, 513, 1001)])
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


@pytest.mark.parametrize("split", [1, 2, 8])
def test_deep_and_ragged_splits(split):
    """K = 900: 29 chunks of 32, so every split leaves a ragged last slice (8 splits: 7 of 4
    chunks and one of 1); 16 splits would leave one empty and are refused."""
    wl = GemmWorkload(M=2, N=33, K=900, epilogue=Epilogue(bias=True, out="s8"))
    cfg = small(SPLIT_K=split)
    assert GEMV.space(wl).is_valid(cfg)
    assert "empty" in GEMV.space(wl).why_invalid(small(SPLIT_K=16))
    check(wl, GEMV.build(wl, cfg), seed=split)


def test_bound_launcher_stays_exact_and_leaves_the_sums_at_zero():
    wl = GemmWorkload(M=4, N=40, K=300, epilogue=Epilogue(bias=True, out="s8"))
    kernel = GEMV.build(wl, small(SPLIT_K=4))
    x, w, params = random_inputs(wl, 6, device=DEVICE)
    plan = kernel.plan(kernel.problem, x, w, poisoned(wl), (params.bias, None,
                                                            params.multiplier, params.shift))
    sums, arrivals = plan[0].args[7], plan[0].args[8]
    launch = kernel.bind(x, w, params, out=poisoned(wl))
    checked = 0
    for seed in (7, 8, 9):
        x.copy_(random_inputs(wl, seed, device=DEVICE)[0])
        assert torch.equal(launch(), run(wl, x, w, params)), seed
        checked += 1
    from lowbit.kernels.triton.igemm import replay

    replay(plan)  # a plan of its own: its workspace must be zero afterwards
    assert sums.shape == (4, 40) and not sums.any() and not arrivals.any()
    assert checked == 3


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
        # the grid reaches one program per SM unless the K chunks run out
        assert programs >= NUM_SMS or 2 * cfg["SPLIT_K"] > chunks, (wl.key, cfg)
        assert k_per_split(k, cfg) * (cfg["SPLIT_K"] - 1) < k  # no empty slice
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


def test_engine_default_policy_prefers_the_gemv_up_to_16_rows():
    from lowbit.graph.impl import GEMV_ROWS, INT8_GEMV, choose_impl

    impl, why = choose_impl(GemmWorkload(M=GEMV_ROWS, N=1000, K=2048, w="s8", a="s8"))
    assert impl == INT8_GEMV == GEMV.name and "int8 tensor cores" in why
    impl, _ = choose_impl(GemmWorkload(M=GEMV_ROWS + 1, N=1000, K=2048, w="s8", a="s8"))
    assert impl != INT8_GEMV


def test_compiles_for_sm90_with_wide_weight_loads():
    """Offline sm_90 compile (tests/triton_offline.py): int8 MMAs, 16-byte cp.async for
    K % 16 == 0 and 8-byte for K = 1000, one acquire-release arrival atomic with split-K,
    no spills."""
    import os

    import triton

    from triton_offline import compile_in_subprocess

    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    shapes = {(8, 4096, 25088): 16, (1, 1000, 1000): 8, (16, 1000, 2048): 16}
    cases = []
    for m, n, k in shapes:
        wl = GemmWorkload(M=m, N=n, K=k, epilogue=Epilogue(bias=True, relu=True, out="s8"))
        cases.append((GEMV.name, wl.to_json(), GEMV.default_config(wl).to_json()))
    for (shape, width), got in zip(shapes.items(), compile_in_subprocess(cases), strict=True):
        assert isinstance(got, list), got  # else the compiler's error text
        main = got[0]
        assert main["mma_sync"] + main["wgmma"] > 0 and main["spill_bytes"] == 0, (shape, main)
        assert main["cp_async_bytes"] == [width] and main["byte_loads"] == 0, (shape, main)
        assert main["acq_rel_atomics"] == 1, (shape, main)
    assert len(cases) == 3


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
