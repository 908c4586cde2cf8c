"""Tiled mma.sync conv templates (s8 m16n8k32, s4 m16n8k64): config spaces, rendering and
NVRTC compilation for sm_80 / sm_90a on the CPU; bit-exact runs against the reference on a GPU."""

from __future__ import annotations

import random

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Layout, load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.cuda import nvrtc
from lowbit.kernels.cuda.mma_conv import (
    S4_TEMPLATE,
    S8_TEMPLATE,
    block_tile,
    conv_shape,
    pixel_tile,
    render,
    smem_bytes,
)
from lowbit.reference import random_inputs, run

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu

REQ_U4_PACKED = Epilogue(bias=True, relu=True, out="u4", out_layout="packed")
EPILOGUES = [
    Epilogue(),
    Epilogue(bias=True, out="fp16"),
    Epilogue(bias=True, relu=True, out="s8"),
    Epilogue(bias=True, out="u8"),
    REQ_U4_PACKED,
    Epilogue(bias=True, out="s4", out_layout="packed"),
    Epilogue(bias=True, relu=True, out="u2", out_layout="packed"),
    Epilogue(relu=True, out="u1", out_layout="packed"),
]


def s8_conv(**kw) -> ConvWorkload:
    base = dict(N=2, H=9, W=7, C=13, K=21, R=3, S=3, stride=1, pad=1, w="s8", a="s8")
    return ConvWorkload(**{**base, **kw})


def s4_conv(**kw) -> ConvWorkload:
    base = dict(N=2, H=9, W=7, C=13, K=21, R=3, S=3, stride=1, pad=1, w="s4", a="u4",
                w_layout="packed", a_layout="packed")
    return ConvWorkload(**{**base, **kw})


# ---------------------------------------------------------------- spaces (CPU)

def test_templates_are_registered() -> None:
    assert get_template("cuda.mma_conv_s8") is S8_TEMPLATE
    assert get_template("cuda.mma_conv_s4") is S4_TEMPLATE
    assert S8_TEMPLATE.backend == S4_TEMPLATE.backend == "cuda"


@pytest.mark.parametrize("suite", ["resnet50_3x3_b256", "resnet50_3x3_b16", "tvm_tutorial",
                                   "resnet18_b8", "resnet50_1x1", "gemm"])
def test_default_config_is_in_every_space(suite: str) -> None:
    for _, wl in load_workloads(suite, epilogue=REQ_U4_PACKED):
        for template, w in ((S8_TEMPLATE, wl.replace(w="s8", a="u8")),
                            (S4_TEMPLATE, wl.replace(w="s4", a="u4", w_layout="packed",
                                                     a_layout="packed"))):
            space = template.space(w)
            assert space.why_invalid(template.default_config(w)) is None
            assert len(space) > 20


def test_space_knobs_and_constraints() -> None:
    wl = load_workloads("resnet50_3x3_b256", w="s8", a="s8", epilogue=REQ_U4_PACKED)[2][1]
    space = S8_TEMPLATE.space(wl)
    assert set(space.names) == {"warps_m", "warps_n", "tiles_m", "tiles_n", "k_chunk",
                                "loop_order", "duplicate_aware_load", "register_packing"}
    assert space.knob("register_packing").values == (False, True)
    assert S4_TEMPLATE.variant.chunk_values() == (64, 128, 256)
    base = S8_TEMPLATE.default_config(wl)
    assert "loop_order" in space.why_invalid(base.replace(duplicate_aware_load=True))
    assert space.is_valid(base.replace(duplicate_aware_load=True, loop_order="crs"))
    assert "warps" in space.why_invalid(base.replace(warps_m=4, warps_n=4))
    assert "registers" in space.why_invalid(base.replace(tiles_m=8, tiles_n=8))
    for cfg in space:
        assert smem_bytes(conv_shape(wl, S8_TEMPLATE.variant), cfg, S8_TEMPLATE.variant,
                          3) <= 227 * 1024
        assert not (cfg["duplicate_aware_load"] and cfg["loop_order"] == "rsc")


def test_small_workloads_prune_oversized_tiles() -> None:
    wl = s8_conv(C=3, K=5)
    for cfg in S8_TEMPLATE.space(wl):
        assert block_tile(cfg)[1] <= 32 and cfg["k_chunk"] <= 64


def test_register_packing_only_for_requantized_outputs() -> None:
    for epi in (Epilogue(), Epilogue(out="fp16")):
        assert S8_TEMPLATE.space(s8_conv(epilogue=epi)).knob("register_packing").values == (
            False,)
    gemm = GemmWorkload(M=33, N=17, K=40, w="s8", a="s8")
    assert S8_TEMPLATE.space(gemm).knob("duplicate_aware_load").values == (False,)


def test_pixel_tile_least_waste_then_smallest_halo() -> None:
    shape = conv_shape(s8_conv(H=14, W=14), S8_TEMPLATE.variant)
    assert pixel_tile(shape, 64) == (8, 8)
    shape7 = conv_shape(s8_conv(H=7, W=7), S8_TEMPLATE.variant)
    tp, tq = pixel_tile(shape7, 64)
    assert tp * tq == 64 and tq >= 7 and tp >= 7


def test_unsupported_workloads_have_reasons() -> None:
    assert "layout" in S8_TEMPLATE.unsupported_reason(s4_conv())
    assert "layout" in S4_TEMPLATE.unsupported_reason(s8_conv())
    two_bit = s4_conv(w="u2", a="u2")
    assert "4 bits" in S4_TEMPLATE.unsupported_reason(two_bit)
    planes = s8_conv(epilogue=Epilogue(out="u2", out_layout=Layout.BITPLANE))
    assert "bit-plane" in S8_TEMPLATE.unsupported_reason(planes)
    with pytest.raises(ValueError, match="does not support"):
        S8_TEMPLATE.space(s4_conv())


def test_build_rejects_configs_outside_the_space() -> None:
    wl = s8_conv()
    bad = S8_TEMPLATE.default_config(wl).replace(duplicate_aware_load=True)
    with pytest.raises(ValueError, match="loop_order"):
        S8_TEMPLATE.build(wl, bad)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-side error path")
def test_cpu_tensors_are_rejected_before_launch() -> None:
    wl = s8_conv()
    kernel = S8_TEMPLATE.build(wl, S8_TEMPLATE.default_config(wl))
    x, w, params = random_inputs(wl, seed=1)
    with pytest.raises(ValueError, match="CUDA device"):
        kernel(x, w, params)
    with pytest.raises(TypeError, match="dtype"):
        kernel(x.to(torch.int32), w, params)


# ---------------------------------------------------------------- NVRTC compile (CPU)

def _compile_cases() -> list[tuple[object, object, Config]]:
    rng = random.Random(6)
    cases = []
    for template, wl in (
        (S8_TEMPLATE, s8_conv(C=64, K=40, epilogue=REQ_U4_PACKED)),
        (S8_TEMPLATE, s8_conv(C=3, K=5, stride=2, a="u8", epilogue=Epilogue(out="fp16"))),
        (S8_TEMPLATE, GemmWorkload(M=100, N=24, K=72, w="s8", a="s8",
                                   epilogue=Epilogue(bias=True, out="s8"))),
        (S4_TEMPLATE, s4_conv(C=67, K=40, w="s4", a="s4",
                              epilogue=Epilogue(relu=True, out="u2", out_layout="packed"))),
    ):
        space = template.space(wl)
        picks = [template.default_config(wl), *space.sample(2, rng)]
        dup = [c for c in space if c["duplicate_aware_load"] and c["register_packing"]]
        picks += dup[:1]
        cases += [(template, wl, c) for c in picks]
    return cases


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_sample_of_configs_compiles_with_nvrtc(arch: str) -> None:
    for template, wl, cfg in _compile_cases():
        kernel = template.build(wl, cfg) if not HAS_CUDA else None
        cubin = (kernel.compile(arch) if kernel is not None
                 else nvrtc.compile_cubin(render(wl, cfg, template.variant), arch))
        assert cubin[:4] == b"\x7fELF", (template.name, cfg)


def test_ptx_uses_the_variant_instruction() -> None:
    wl8 = s8_conv(a="u8", epilogue=REQ_U4_PACKED)
    cfg8 = S8_TEMPLATE.default_config(wl8).replace(register_packing=True)
    ptx8 = nvrtc.compile_ptx(render(wl8, cfg8, S8_TEMPLATE.variant), "sm_80").decode()
    assert "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32" in ptx8
    assert "ldmatrix.sync.aligned.m8n8.x4" in ptx8 and "cp.async" not in ptx8  # C=13: bytes
    assert "shfl.sync.bfly" in ptx8
    wl4 = s4_conv(C=64, w="s4", a="s4")
    ptx4 = nvrtc.compile_ptx(render(wl4, S4_TEMPLATE.default_config(wl4),
                                    S4_TEMPLATE.variant), "sm_80").decode()
    assert "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32" in ptx4
    assert "cp.async.cg.shared.global" in ptx4


def test_compile_error_carries_the_nvrtc_log() -> None:
    with pytest.raises(nvrtc.CompileError) as err:
        nvrtc.compile_cubin(render(s8_conv(), S8_TEMPLATE.default_config(s8_conv()),
                                   S8_TEMPLATE.variant) + "\nthis is not C++;\n", "sm_80")
    assert "error" in err.value.log


# ---------------------------------------------------------------- bit-exact on a GPU

def _poisoned_run(kernel, wl, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from lowbit.core.validate import out_storage

    x, w, params = random_inputs(wl, seed, device="cuda")
    shape, dtype = out_storage(wl)
    out = torch.empty(shape, dtype=dtype, device="cuda")
    if dtype.is_floating_point:
        out.fill_(float("nan"))
    else:
        out.view(torch.uint8).fill_(0xA5)
    kernel(x, w, params, out=out)
    torch.cuda.synchronize()
    return out, run(wl, x, w, params)


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    if out.dtype == torch.float16:
        # fp16(float32(y) * scale): same roundings as the reference, so exact; NaN = unwritten
        assert not out.isnan().any(), f"{what}: unwritten outputs"
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-3, atol=0, msg=what)
        return
    bad = (out != ref)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} outputs differ, " \
                          f"first at {tuple(bad.nonzero()[0].tolist())}"


def _configs(template, wl, n: int, seed: int) -> list[Config]:
    space = template.space(wl)
    rng = random.Random(seed)
    picks = [template.default_config(wl), *space.sample(n, rng)]
    for dup, pack in ((True, False), (True, True), (False, True)):
        match = [c for c in space if c["duplicate_aware_load"] == dup
                 and c["register_packing"] == pack]
        if match:
            picks.append(rng.choice(match))
    return list(dict.fromkeys(picks))


S8_SHAPES = [
    dict(),                                            # odd everything, 3x3 pad 1
    dict(C=3, K=5, stride=2, pad=1, H=11, W=10),       # odd C (byte loads), stride 2
    dict(C=20, K=13, R=1, S=1, pad=0),                 # 1x1, 4-byte loads
    dict(C=48, K=72, R=5, S=5, stride=2, pad=2, a="u8"),
    dict(C=64, K=40, R=7, S=7, stride=2, pad=3, H=15, W=13, w="u4", a="u4"),
    dict(C=32, K=16, a="b1", w="b1"),                  # binary -1/+1 in int8 storage
]


@gpu
@pytest.mark.parametrize("shape", range(len(S8_SHAPES)))
@pytest.mark.parametrize("epi", range(len(EPILOGUES)))
def test_s8_bit_exact(shape: int, epi: int) -> None:
    wl = s8_conv(**S8_SHAPES[shape], epilogue=EPILOGUES[epi])
    for i, cfg in enumerate(_configs(S8_TEMPLATE, wl, 2, seed=shape * 31 + epi)):
        out, ref = _poisoned_run(S8_TEMPLATE.build(wl, cfg), wl, seed=100 + i)
        _assert_matches(out, ref, f"{wl.key} {cfg}")


S4_SHAPES = [
    dict(),                                            # odd C: masked padding nibble
    dict(C=64, K=24, stride=2, w="s4", a="s4"),
    dict(C=128, K=40, R=1, S=1, pad=0, H=5, W=6, w="u4", a="s4"),
]


@gpu
@pytest.mark.parametrize("shape", range(len(S4_SHAPES)))
@pytest.mark.parametrize("epi", [0, 1, 2, 4, 6])
def test_s4_bit_exact(shape: int, epi: int) -> None:
    wl = s4_conv(**S4_SHAPES[shape], epilogue=EPILOGUES[epi])
    for i, cfg in enumerate(_configs(S4_TEMPLATE, wl, 2, seed=shape * 17 + epi)):
        out, ref = _poisoned_run(S4_TEMPLATE.build(wl, cfg), wl, seed=200 + i)
        _assert_matches(out, ref, f"{wl.key} {cfg}")


@gpu
@pytest.mark.parametrize("epi", [0, 2, 4])
def test_gemm_bit_exact(epi: int) -> None:
    for m, n, k in ((1, 8, 32), (37, 19, 100), (256, 96, 512)):
        wl = GemmWorkload(M=m, N=n, K=k, w="s8", a="s8", epilogue=EPILOGUES[epi])
        for i, cfg in enumerate(_configs(S8_TEMPLATE, wl, 2, seed=m + epi)):
            out, ref = _poisoned_run(S8_TEMPLATE.build(wl, cfg), wl, seed=300 + i)
            _assert_matches(out, ref, f"{wl.key} {cfg}")


@gpu
@pytest.mark.parametrize("suite", ["resnet18_b8", "resnet50_3x3_b16", "tvm_tutorial"])
def test_shared_workloads_bit_exact(suite: str) -> None:
    layers = load_workloads(suite, w="s8", a="u8", epilogue=REQ_U4_PACKED)
    checked = 0
    for name, wl in layers:
        wl = wl.replace(N=min(wl.N, 2))
        configs = _configs(S8_TEMPLATE, wl, 1, seed=len(name))
        for i, cfg in enumerate(configs):
            out, ref = _poisoned_run(S8_TEMPLATE.build(wl, cfg), wl, seed=400 + i)
            _assert_matches(out, ref, f"{name} {cfg}")
        checked += len(configs) >= 2  # the default and a sampled config at least
    assert checked == len(layers) > 0


@gpu
def test_misaligned_views_fall_back_to_byte_loads() -> None:
    wl = s8_conv(C=32, K=16)
    kernel = S8_TEMPLATE.build(wl, S8_TEMPLATE.default_config(wl))
    x, w, params = random_inputs(wl, 5, device="cuda")
    x_off = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")[1:].view(x.shape)
    x_off.copy_(x)
    assert x_off.data_ptr() % 16
    torch.testing.assert_close(kernel(x_off, w, params), run(wl, x, w, params), rtol=0, atol=0)
