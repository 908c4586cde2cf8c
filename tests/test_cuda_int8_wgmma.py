"""`cuda.int8_wgmma`: int8-layout conv2d / GEMM on s8 wgmma through the bit-serial wgmma kernels.
CPU: support rules, the space, NVRTC compilation for sm_90a, bit-exact runs in the host emulation
(s8 and u8 activations, stride 2, 1x1 with a 1-word channel tail, GEMM, persistent blocks,
every output kind). GPU (sm_90a): bit-exact on the shared ResNet-50 layers and the
FC shapes."""

from __future__ import annotations

import random

import pytest
import torch

from lowbit.core import ConvWorkload, Epilogue, GemmWorkload, load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.cuda import INT8_WGMMA, WGMMA, WGMMA_PERSISTENT
from lowbit.kernels.cuda.bitserial_emu import emulate
from lowbit.kernels.cuda.bitserial_shape import WGMMA_ARCH, conv_shape
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.kernels.cuda.nvrtc import device_arch
from lowbit.reference import random_inputs, run

S8_OUT = Epilogue(bias=True, relu=True, out="s8")
EMU_CASES = [
    (ConvWorkload(N=1, H=6, W=5, C=64, K=40, R=3, S=3, pad=1, epilogue=S8_OUT), {}),
    (ConvWorkload(N=2, H=7, W=6, C=48, K=37, R=3, S=3, pad=1, stride=2, a="u7"),
     {"SWIZZLE": 0}),
    (ConvWorkload(N=1, H=5, W=5, C=20, K=33, R=1, S=1, pad=0, a="u8", w="s4",
                  epilogue=Epilogue(bias=True, out="fp16")), {}),
    (GemmWorkload(M=77, N=64, K=300,
                  epilogue=Epilogue(bias=True, relu=True, out="u4", out_layout="bitplane")),
     {"PERSIST": 1, "BN": 64, "WN": 64}),
    # 2-bit signed bit planes: the threshold form of the requantizing epilogue
    (ConvWorkload(N=1, H=5, W=6, C=32, K=33, R=3, S=3, pad=1,
                  epilogue=Epilogue(bias=True, out="s2", out_layout="bitplane")),
     {"REQUANT": "threshold"}),
]


def test_registered_and_support_rules():
    assert get_template("cuda.int8_wgmma") is INT8_WGMMA
    wl = EMU_CASES[0][0]
    assert INT8_WGMMA.supports(wl)
    assert "C % 4" in INT8_WGMMA.unsupported_reason(wl.replace(C=30))
    assert "int8 layout" in INT8_WGMMA.unsupported_reason(
        wl.replace(a="u2", a_layout="bitplane", w="s2", w_layout="bitplane"))
    assert "s8" in INT8_WGMMA.unsupported_reason(wl.replace(w="u8"))
    with pytest.raises(ValueError, match="sm_90a"):
        INT8_WGMMA.space(wl, arch="sm_80")
    space = INT8_WGMMA.space(wl, "sm_90a")
    default = INT8_WGMMA.default_config(wl, "sm_90a")
    assert default in space
    # a preferred default (the wgmma family's on this template's knobs), not the fallback to
    # the space's first point (BM = 64, BN = 16)
    assert default != space.all_configs()[0]
    assert conv_shape(wl).words == 16  # 64 int8 channels = 16 words per pixel
    # the wgmma families' kernels: one tile per block, or persistent
    for persist, family in ((0, WGMMA), (1, WGMMA_PERSISTENT)):
        cfg = default.replace(PERSIST=persist)
        assert INT8_WGMMA.spec(cfg)["MMA"] == "wgmma"
        assert INT8_WGMMA.kernel_name(cfg) == family.kernels[persist]


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("wl,changes", EMU_CASES, ids=lambda v: str(v)[:48])
def test_emulated_int8_wgmma_is_bit_exact(wl, changes):
    cfg = INT8_WGMMA.default_config(wl, "sm_90a").replace(**changes)
    x, w, params = random_inputs(wl, 3)
    got, want = emulate(INT8_WGMMA, wl, cfg, x, w, params), run(wl, x, w, params)
    if got.dtype == torch.float16:
        got, want = got.view(torch.int16), want.view(torch.int16)
    assert torch.equal(got, want), dict(cfg)


def test_nvrtc_compiles_for_sm90a():
    wl = dict(load_workloads("resnet50_3x3_b256", epilogue=S8_OUT))["resnet50_s2_3x3_b256"]
    for cfg in (INT8_WGMMA.default_config(wl, "sm_90a"),
                INT8_WGMMA.default_config(wl, "sm_90a").replace(PERSIST=1)):
        kernel = INT8_WGMMA.build(wl, cfg, arch="sm_90a")
        assert kernel._main.cubin[:4] == b"\x7fELF" and kernel.template == "cuda.int8_wgmma"
        assert "k32.s32.s8.s8" in kernel.source


# ------------------------------------------------------------------------------- GPU tests

def _gpu_workloads() -> list[tuple[str, object]]:
    out = [(n, wl) for s in ("resnet50_3x3_b16", "resnet50_3x3_b256")
           for n, wl in load_workloads(s, epilogue=S8_OUT)]
    return out + [(n, wl) for n, wl in load_workloads("gemm", epilogue=Epilogue())
                  if wl.M * wl.N * wl.K < 2**33]


def test_gpu_workloads_are_the_shared_layers():
    """The GPU test's layers: the 8 ResNet-50 3x3 layers and the GEMMs under 2^33 MACs."""
    assert len(_gpu_workloads()) == 8 + 3


@pytest.mark.gpu
@pytest.mark.parametrize("name,wl", _gpu_workloads(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_gpu_shared_workloads_default_and_sampled(name, wl):
    if device_arch() != WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    space = INT8_WGMMA.space(wl)
    checked = 0
    for i, cfg in enumerate([INT8_WGMMA.default_config(wl),
                             *space.sample(2, random.Random(name))]):
        x, w, params = random_inputs(wl, 50 + i, device="cuda")
        want = run(wl, x, w, params)
        out = torch.empty_like(want)
        out.view(torch.uint8).fill_(0xA5)
        got = INT8_WGMMA.build(wl, cfg).bind(x, w, params, out)()
        assert torch.equal(got, want), (name, dict(cfg))
        checked += 1
    assert checked == 3


def test_default_fills_the_gpu_where_the_first_preferred_tile_does_not():
    """Small-M layers take a smaller tile (their first preferred config's grid had 8 tiles on
    132 SMs for ResNet-50's classifier at batch 256: 40 us, 18.6 us with the smaller tile on
    an H200); layers whose first preferred grid has MIN_DEFAULT_TILES tiles keep it."""
    import math

    from lowbit.core import Layout, Precision
    from lowbit.kernels.cuda import int8_wgmma
    from lowbit.kernels.cuda.bitserial_layout import tile_grid

    s8, i8 = Precision(8, "signed"), Layout.INT8
    epi = Epilogue(bias=True, out=s8, out_layout=i8)

    def tiles(wl, cfg):
        return math.prod(tile_grid(wl, INT8_WGMMA.spec(cfg)))

    checked = 0
    for m, n, k, big in ((256, 1000, 2048, False), (8, 4096, 9216, False),
                         (4096, 1000, 4096, True), (8192, 4096, 4096, True)):
        wl = GemmWorkload(w=s8, a=s8, w_layout=i8, a_layout=i8, epilogue=epi, M=m, N=n, K=k)
        cfg = INT8_WGMMA.default_config(wl, "sm_90a")
        assert INT8_WGMMA.space(wl, "sm_90a").is_valid(cfg)
        assert tiles(wl, cfg) >= int8_wgmma.MIN_DEFAULT_TILES
        assert ((cfg["BM"], cfg["BN"]) == (128, 256)) == big, (m, n, k, dict(cfg))
        checked += 1
    assert checked == 4


def test_default_stages_deepen_with_the_reduction():
    """Long reductions take 128- or 64-byte stages (KT 4 / 2) where the padding stays within
    MAX_K_PADDING; short ones keep KT = 1 (MobileNet-V2's 24-channel 1x1: 64-byte stages would
    pad 6 words to 16); every default valid."""
    from lowbit.core import Layout, Precision
    from lowbit.kernels.cuda import int8_wgmma

    s8, u8, i8 = Precision(8, "signed"), Precision(8), Layout.INT8
    epi = Epilogue(bias=True, relu=True, out=u8, out_layout=i8)
    want = {(64, 3): 4, (64, 1): 2, (256, 3): 4, (256, 1): 4, (24, 1): 1, (20, 1): 1}
    checked = 0
    for (c, r), kt in want.items():
        wl = ConvWorkload(w=s8, a=u8, w_layout=i8, a_layout=i8, epilogue=epi, N=256, H=28,
                          W=28, C=c, K=128, R=r, S=r, pad=r // 2)
        cfg = INT8_WGMMA.default_config(wl, "sm_90a")
        assert INT8_WGMMA.space(wl, "sm_90a").is_valid(cfg)
        assert cfg["KT"] == kt, (c, r, dict(cfg))
        words = conv_shape(wl).k_words
        padded = -(-words // (8 * kt)) * 8 * kt
        assert padded - words <= int8_wgmma.MAX_K_PADDING * words or kt == 1
        checked += 1
    assert checked == len(want)
