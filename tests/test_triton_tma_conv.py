"""Triton int8 conv with TMA-loaded operands (`triton.conv2d_int8_tma`, stride 1).

CPU: under TRITON_INTERPRET=1 (tests/conftest.py), whose interpreter emulates tensor
descriptors with the same out-of-bounds zero fill as TMA: odd H/W, pad 0/1/2 (negative box
coordinates), 1x1/3x3/5x5 filters, C = 16 / 48 (channel tail inside a BLOCK_K chunk), odd K,
every epilogue and output packing, several images per tile, both loop orders; all bit-exact
against `lowbit.reference.run` with a poisoned output. Bad inputs raise before any launch.
GPU (`gpu` mark): every stride-1 layer of the shared ResNet-50 3x3 and TVM suites at the
default config, plus a random sample of configs.
"""

from __future__ import annotations

import random

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.triton import CONV2D_INT8_TMA, TmaConvKernel
from lowbit.reference import random_inputs, run
from triton_cases import DEVICE, EPILOGUES, HAS_CUDA, check, poisoned

# tiny tiles (the interpreter's dot works at 16) outside the H100 space: 4 x 4 pixels of one
# image x 32 filters (bit-plane words need 32) x 16 channels: several tiles in every dimension
TINY = Config(BLOCK_I=1, BLOCK_P=4, BLOCK_Q=4, BLOCK_N=32, BLOCK_K=16, num_warps=4,
              num_stages=2, GROUP_M=2, LOOP_ORDER="rsc", SPLIT_K=1)


S8_OUT = Epilogue(bias=True, relu=True, out="s8")


def conv(epi=S8_OUT, **shape) -> ConvWorkload:
    dims = dict(N=2, H=7, W=9, C=48, K=37, R=3, S=3, stride=1, pad=1)
    return ConvWorkload(**{**dims, **shape}, epilogue=epi)


# ------------------------------------------------------------------------------- CPU tests

@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: e.key)
def test_epilogues(epi):
    wl = conv(epi)
    check(wl, TmaConvKernel("test", wl, TINY), seed=1)


@pytest.mark.parametrize("shape", [
    dict(R=1, S=1, pad=0, C=16, K=21),
    dict(R=3, S=3, pad=0, H=6, W=5),
    dict(R=5, S=5, pad=2, C=16, K=17, H=5, W=7),
    dict(R=3, S=3, pad=2, N=3, H=5, W=5, C=16),
    dict(R=1, S=3, pad=1, N=1, H=9, W=3, C=32, K=33),
], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_shapes_and_padding(shape):
    wl = conv(**shape)
    check(wl, TmaConvKernel("test", wl, TINY), seed=2)


@pytest.mark.parametrize("shape", [
    dict(stride=2, H=8, W=10, C=32),
    dict(stride=2, R=1, S=1, pad=0, H=6, W=8, C=64),
    dict(stride=2, pad=0, H=10, W=6, C=32, K=19),
    dict(stride=2, R=5, S=5, pad=2, N=3, H=6, W=6, C=32),
    dict(stride=2, R=3, S=1, pad=1, N=1, H=12, W=4, C=32, K=33),
], ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_stride2_phase_view(shape):
    # the 5-D view [N, H/2, 2, W/2, 2C]: negative box coordinates (pad) and boxes past H/2,
    # W/2 are zero-filled; every row and column phase of every tap
    wl = conv(**shape)
    assert CONV2D_INT8_TMA.supports(wl)
    check(wl, TmaConvKernel("test", wl, TINY), seed=9)


@pytest.mark.parametrize("epi", [EPILOGUES[4], EPILOGUES[8]], ids=lambda e: e.key)
def test_stride2_split_k_and_packed_outputs(epi):
    wl = conv(epi, stride=2, H=8, W=8, C=32)
    check(wl, TmaConvKernel("test", wl, TINY.replace(SPLIT_K=2, LOOP_ORDER="crs")), seed=10)


@pytest.mark.parametrize("cfg", [
    TINY.replace(BLOCK_I=2, BLOCK_P=2, BLOCK_Q=4, LOOP_ORDER="crs"),
    TINY.replace(BLOCK_I=16, BLOCK_P=1, BLOCK_Q=1, GROUP_M=1),
    TINY.replace(BLOCK_P=2, BLOCK_Q=8, BLOCK_K=32, BLOCK_N=64),
    TINY.replace(BLOCK_I=2, BLOCK_P=2, BLOCK_Q=4, SPLIT_K=4),
    TINY.replace(SPLIT_K=2, LOOP_ORDER="crs"),
], ids=["2img-crs", "pixel-per-image", "wide-q", "split4", "split2-crs"])
def test_tile_shapes(cfg):
    wl = conv(N=3, H=5, W=6, C=48, K=19)
    check(wl, TmaConvKernel("test", wl, cfg), seed=3)


@pytest.mark.parametrize("epi", [EPILOGUES[0], EPILOGUES[3], EPILOGUES[4], EPILOGUES[7]],
                         ids=lambda e: e.key)
def test_split_k_epilogues(epi):
    # 27 reduction steps in 3 splits of 9; the last program of a tile runs the epilogue
    wl = conv(epi)
    check(wl, TmaConvKernel("test", wl, TINY.replace(SPLIT_K=3)), seed=8)


def test_unsigned_and_binary_operands():
    wl = conv(N=1, H=5, W=5, C=16, K=16).replace(a="u4", w="b1")
    check(wl, TmaConvKernel("test", wl, TINY), seed=4)


@pytest.mark.parametrize("shape,cfg", [
    (dict(C=32), TINY),
    (dict(R=5, S=5, pad=2, N=3, H=5, W=6, C=32, K=19), TINY.replace(SPLIT_K=3)),
    (dict(stride=2, H=8, W=10, C=32), TINY.replace(LOOP_ORDER="crs")),
    (dict(R=1, S=1, pad=0, C=64, K=21), TINY.replace(BLOCK_K=32)),
], ids=["pad1", "5x5-split3", "stride2", "1x1"])
def test_u8_activations_take_a_zero_point(shape, cfg):
    # padding and the stride-2 phase view's zero fill read zero bytes, which flip to -128 and
    # are restored by the zero-point term (`zero_point`)
    checked = 0
    for epi in (EPILOGUES[0], EPILOGUES[2], EPILOGUES[8]):
        wl = conv(epi, **shape).replace(a="u8")
        kernel = TmaConvKernel("test", wl, cfg)
        assert kernel.problem.a_zero == 128
        check(wl, kernel, seed=30)
        checked += 1
    assert checked == 3


def test_u8_activations_keep_block_k_dividing_c():
    wl = conv(C=96).replace(a="u8")
    ks = {c["BLOCK_K"] for c in CONV2D_INT8_TMA.space(wl)}
    assert ks == {32}  # 64 and 128 do not divide 96
    assert {c["BLOCK_K"] for c in CONV2D_INT8_TMA.space(conv(C=96))} == {32, 64, 128}


@pytest.mark.parametrize("split", [1, 3])
def test_bound_launcher_reads_the_tensors_at_each_launch(split):
    # bind() builds the TMA descriptors (and the split-K workspace) once; they must point at
    # x and w, not copy them, and the split counters must be reset by each launch
    wl = conv(N=1, H=5, W=6, C=16, K=21)
    kernel = TmaConvKernel("test", wl, TINY.replace(SPLIT_K=split))
    x, w, params = random_inputs(wl, 6, device=DEVICE)
    out = poisoned(wl)
    launch = kernel.bind(x, w, params, out)
    launch()
    assert torch.equal(out, run(wl, x, w, params))
    x2, w2, _ = random_inputs(wl, 7, device=DEVICE)
    x.copy_(x2)
    w.copy_(w2)
    launch()
    assert torch.equal(out, run(wl, x2, w2, params))


def test_registered_template_and_space():
    t = get_template("triton.conv2d_int8_tma")
    assert t is CONV2D_INT8_TMA
    layers = dict(load_workloads("resnet50_3x3_b256"))
    for name in ("resnet50_s2_3x3_b256", "resnet50_s5_3x3_b256"):
        wl = layers[name]
        space = t.space(wl)
        default = t.default_config(wl)
        assert default in space, name
        rows = default["BLOCK_I"] * default["BLOCK_P"] * default["BLOCK_Q"]
        assert rows == 128, (name, dict(default))
        assert len(space) > 100
    # a layer too small for any tile without overhang still has a space
    assert CONV2D_INT8_TMA.default_config(conv()) in CONV2D_INT8_TMA.space(conv())


def test_stride2_chunks_divide_the_channels():
    wl = conv(stride=2, H=16, W=16, C=96)
    space = CONV2D_INT8_TMA.space(wl)
    assert {c["BLOCK_K"] for c in space} == {32}
    bad = CONV2D_INT8_TMA.default_config(wl).replace(BLOCK_K=64)
    assert "BLOCK_K dividing C=96" in space.why_invalid(bad)
    assert "multiple of 32" in CONV2D_INT8_TMA.unsupported_reason(conv(stride=2, H=8, W=8))


def test_split_k_only_where_the_grid_under_fills():
    b16 = dict(load_workloads("resnet50_3x3_b16"))
    deep = CONV2D_INT8_TMA.space(b16["resnet50_s5_3x3"])
    assert {c["SPLIT_K"] for c in deep} == {1, 2, 4}
    assert CONV2D_INT8_TMA.default_config(b16["resnet50_s5_3x3"])["SPLIT_K"] == 1
    b256 = dict(load_workloads("resnet50_3x3_b256"))["resnet50_s5_3x3_b256"]
    assert CONV2D_INT8_TMA.space(b256).knob("SPLIT_K").values == (1,)
    # a config recorded before the knob existed builds as SPLIT_K = 1
    old = Config({k: v for k, v in CONV2D_INT8_TMA.default_config(b256).items()
                  if k != "SPLIT_K"})
    assert CONV2D_INT8_TMA.build(b256, old).config["SPLIT_K"] == 1


@pytest.mark.parametrize("change, match", [
    (dict(stride=3, H=9, W=9), "stride=3"),
    (dict(stride=2, H=7), "needs even H and W"),
    (dict(C=24), "C=24 is not a multiple of 16"),
    (dict(a_layout="packed", a="u4"), "a_layout='packed'"),
    (dict(w="u8"), "w=u8"),
    (dict(a="u8", C=48), "u8 activations need C a multiple of 32"),
])
def test_unsupported_workloads(change, match):
    wl = conv(**change)
    assert not CONV2D_INT8_TMA.supports(wl)
    with pytest.raises(ValueError, match=match):
        CONV2D_INT8_TMA.space(wl)
    good = conv()
    with pytest.raises(ValueError, match=match):
        CONV2D_INT8_TMA.build(wl, CONV2D_INT8_TMA.default_config(good))


def test_bad_inputs_raise_before_launch():
    wl = conv(N=1, H=5, W=5, C=16, K=16)
    kernel = TmaConvKernel("test", wl, TINY)
    x, w, params = random_inputs(wl, 5)
    with pytest.raises(TypeError, match="x must have dtype"):
        kernel(x.to(torch.int32), w, params)
    with pytest.raises(TypeError, match="w must have dtype"):
        kernel(x, w.float(), params)
    with pytest.raises(ValueError, match="x must have shape"):
        kernel(x[:, :4].contiguous(), w, params)
    with pytest.raises(ValueError, match="must be contiguous"):
        kernel(x.permute(0, 2, 1, 3), w, params)
    with pytest.raises(ValueError, match="out must be"):
        kernel(x, w, params, out=torch.empty(3, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"not in .*space"):
        CONV2D_INT8_TMA.build(wl, TINY)


# ------------------------------------------------------------------------------- GPU tests

def stride1_layers():
    epi = Epilogue(bias=True, relu=True, out="s8")
    return [(name, wl) for suite in ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial")
            for name, wl in load_workloads(suite, epilogue=epi) if wl.stride == 1]


def stride2_layers():
    epi = Epilogue(bias=True, relu=True, out="s8")
    return [(name, wl) for name, wl in load_workloads("resnet18_b8", epilogue=epi)
            if wl.stride == 2 and CONV2D_INT8_TMA.supports(wl)]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name, wl", stride1_layers(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_gpu_shared_layers_default(name, wl):
    check(wl, CONV2D_INT8_TMA.build(wl, CONV2D_INT8_TMA.default_config(wl)), seed=11)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("seed", range(4))
def test_gpu_random_configs(seed):
    rng = random.Random(seed)
    _, wl = rng.choice(stride1_layers()[:4])  # the batch-16 layers: fast references
    wl = wl.replace(epilogue=rng.choice(EPILOGUES))
    cfg = rng.choice(CONV2D_INT8_TMA.space(wl).all_configs())
    check(wl, CONV2D_INT8_TMA.build(wl, cfg), seed=seed)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("index", range(4))
def test_gpu_u8_activations_on_real_layers(index):
    name, wl = (stride1_layers()[:4] + stride2_layers())[index]
    wl = wl.replace(a="u8", epilogue=Epilogue(bias=True, relu=True, out="u8"))
    assert CONV2D_INT8_TMA.supports(wl), name
    check(wl, CONV2D_INT8_TMA.build(wl, CONV2D_INT8_TMA.default_config(wl)), seed=13)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_odd_shape_padding():
    wl = conv(N=3, H=13, W=11, C=48, K=77, R=5, S=5, pad=2)
    cfg = CONV2D_INT8_TMA.default_config(wl)
    check(wl, CONV2D_INT8_TMA.build(wl, cfg), seed=12)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name, wl", stride2_layers(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_gpu_stride2_layers_default_and_sampled(name, wl):
    space = CONV2D_INT8_TMA.space(wl)
    for i, cfg in enumerate([CONV2D_INT8_TMA.default_config(wl),
                             *space.sample(2, random.Random(name))]):
        check(wl, CONV2D_INT8_TMA.build(wl, cfg), seed=20 + i)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("epi", [EPILOGUES[1], EPILOGUES[4], EPILOGUES[7]], ids=lambda e: e.key)
def test_gpu_split_k_in_kernel_repeated_launches(epi):
    """Split-K summed by the last program of each tile, on the batch-16 s5 layer: five bound
    launches on fresh inputs, each exact (the arrival counters reset between launches)."""
    wl = dict(stride1_layers())["resnet50_s5_3x3"].replace(epilogue=epi)
    cfgs = [c for c in CONV2D_INT8_TMA.space(wl) if c["SPLIT_K"] > 1]
    cfg = random.Random(3).choice(cfgs)
    kernel = CONV2D_INT8_TMA.build(wl, cfg)
    x, w, params = random_inputs(wl, 30, device="cuda")
    launch = kernel.bind(x, w, params, poisoned(wl, "cuda"))
    for seed in range(31, 36):
        x.copy_(random_inputs(wl, seed, device="cuda")[0])
        assert torch.equal(launch(), run(wl, x, w, params)), (seed, dict(cfg))
