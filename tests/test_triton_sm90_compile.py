"""The Triton kernels compile for sm_90 (Hopper) without a GPU, with the instructions they are
meant to use: wgmma for the int8 dots, TMA loads in the TMA conv, one acquire-release atomic per
tile where split-K is summed in the kernel. The interpreter tests check what the kernels
compute; these check that Triton's compiler accepts them as launched (tests/triton_offline.py).
"""

from __future__ import annotations

import json
import os

import pytest
import triton

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, load_workloads
from triton_offline import compile_in_subprocess

S8 = Epilogue(bias=True, relu=True, out="s8")
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
B256 = dict(load_workloads("resnet50_3x3_b256", epilogue=S8))
B16 = dict(load_workloads("resnet50_3x3_b16", epilogue=S8))
FC_B128 = load_workloads("gemm")[2][1]
R18_S2 = dict(load_workloads("resnet18_b8", epilogue=S8))["resnet18_14x14_256to512_s2"]
STEM = dict(load_workloads("resnet18_b8", epilogue=S8))["resnet18_stem_7x7"]

TMA_S3 = Config(BLOCK_I=64, BLOCK_P=2, BLOCK_Q=1, BLOCK_N=128, BLOCK_K=128, num_warps=4,
                num_stages=3, GROUP_M=1, LOOP_ORDER="crs", SPLIT_K=1)
TMA_S5_SPLIT = Config(BLOCK_I=16, BLOCK_P=1, BLOCK_Q=8, BLOCK_N=64, BLOCK_K=128, num_warps=4,
                      num_stages=3, GROUP_M=1, LOOP_ORDER="crs", SPLIT_K=4)
GEMM_SPLIT = Config(BLOCK_M=128, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=4, GROUP_M=1,
                    SPLIT_K=2, SPLIT_SUM="last_program")
STEM_ROW_TAPS = Config(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3,
                       GROUP_M=8, LOOP_ORDER="r_sc", SPLIT_K=1)
PACKED = B16["resnet50_s3_3x3"].replace(
    a="u4", w="s4", a_layout="packed", w_layout="packed",
    epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"))

CASES = {
    "igemm_conv_default": ("triton.conv2d_int8", B256["resnet50_s3_3x3_b256"], None),
    "igemm_conv_packed_io": ("triton.conv2d_int8", PACKED, None),
    "fp16_dot_conv_u8": ("triton.conv2d_fp16", B16["resnet50_s3_3x3"].replace(a="u8", w="s4"),
                         None),
    "gemm_split_last_program": ("triton.gemm_int8", FC_B128, GEMM_SPLIT),
    "gemm_split_second_kernel": ("triton.gemm_int8", FC_B128,
                                 GEMM_SPLIT.replace(SPLIT_SUM="second_kernel")),
    "tma_conv_tuned_s3": ("triton.conv2d_int8_tma", B256["resnet50_s3_3x3_b256"], TMA_S3),
    "tma_conv_stride2_default": ("triton.conv2d_int8_tma", R18_S2, None),
    "tma_conv_split_s5_b16": ("triton.conv2d_int8_tma", B16["resnet50_s5_3x3"], TMA_S5_SPLIT),
    "igemm_row_taps_stem": ("triton.conv2d_int8", STEM, STEM_ROW_TAPS),
    "gemm_k1000_default": ("triton.gemm_int8", GemmWorkload(M=4096, N=4096, K=1000), None),
    "gemm_k100_default": ("triton.gemm_int8", GemmWorkload(M=512, N=1000, K=100), None),
}
#: the widest cp.async (bytes) each case's operand loads must reach: 16 where K % 16 == 0,
#: the power of two dividing K where that is 8 (`igemm.channel_alignment`: 1-byte loads
#: before), 16 again below 8, on rows padded to 16 bytes (`triton.padded`)
LOAD_BYTES = {"gemm_k1000_default": 8, "gemm_k100_default": 16, "gemm_split_last_program": 16}
#: cases whose first launch copies A into padded rows (`padded.pad_rows_kernel`)
PADDED = ("gemm_k100_default",)


def _main(got: list[dict]) -> dict:
    """The report of the launch that does the work (not an operand copy)."""
    return next(r for r in got if r["name"] != "pad_rows_kernel")


@pytest.fixture(scope="module")
def reports() -> dict:
    from lowbit.kernels import get_template
    from lowbit.kernels.triton import CONV2D_INT8  # noqa: F401  (registers the templates)

    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    cases = []
    for template, wl, cfg in CASES.values():
        t = get_template(template)
        cfg = t.checked_config(wl, cfg if cfg is not None else t.default_config(wl))
        cases.append((template, wl.to_json(), cfg.to_json()))
    return dict(zip(CASES, compile_in_subprocess(cases), strict=True))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(CASES))
def test_compiles_for_sm90_with_wgmma(reports, case):
    got = reports[case]
    assert isinstance(got, list), got  # else the compiler's error text
    main = _main(got)
    assert main["wgmma"] > 0, main
    assert main["regs"] <= 255, main
    if "tma" in case:
        assert main["tma_loads"] >= 2, main  # the im2col box and the weight tile
    split_in_kernel = case in ("gemm_split_last_program", "tma_conv_split_s5_b16")
    assert (main["acq_rel_atomics"] > 0) == split_in_kernel, main
    assert len(got) == (2 if case in ("gemm_split_second_kernel", *PADDED) else 1), got
    assert (got[0]["name"] == "pad_rows_kernel") == (case in PADDED), got


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(LOAD_BYTES))
def test_operand_loads_are_wide_whatever_k(reports, case):
    """K not a multiple of 16 keeps the cp.async pipeline at the row alignment's width, with
    no byte-wise loads (K = 1000 took 1,040 us on an H200 with them, fp16 55 us)."""
    main = _main(reports[case])
    assert main["cp_async_bytes"] == [LOAD_BYTES[case]], main
    assert main["byte_loads"] == 0, main


#: requantizing epilogues (a shifted bias into u8) of short reductions (one step) in the
#: float64 form bind picks for 8-bit layers: MobileNet-V2's first expansion conv (b64),
#: ResNet-50's layer1 downsample (b256) on the implicit GEMM and the TMA conv, a 1x1 conv of
#: two 128-filter groups
U8_REQUANT = Epilogue(shifted_bias=True, relu=True, out="u8")
DOWNSAMPLE = ConvWorkload(w="s8", a="u8", epilogue=U8_REQUANT, N=256, H=56, W=56, C=64, K=256,
                          R=1, S=1)
F64_CASES = {
    "igemm_expansion_1x1": ("triton.conv2d_int8", ConvWorkload(
        w="s8", a="s8", epilogue=U8_REQUANT, N=64, H=112, W=112, C=16, K=96, R=1, S=1)),
    "igemm_downsample_1x1": ("triton.conv2d_int8", DOWNSAMPLE),
    "tma_conv_downsample_1x1": ("triton.conv2d_int8_tma", DOWNSAMPLE),
    "grouped_two_groups_1x1": ("triton.conv2d_grouped_int8", ConvWorkload(
        w="s8", a="s8", epilogue=U8_REQUANT, N=8, H=28, W=28, C=256, K=256, R=1, S=1,
        groups=2)),
    # long reductions keep 4 warps: the float64 form's fused multiply-add and float32 clamp
    # hold a 128 x 128 tile there without spilling (380 B before)
    "igemm_3x3_long": ("triton.conv2d_int8",
                       B256["resnet50_s3_3x3_b256"].replace(a="u8", epilogue=U8_REQUANT)),
}
#: the default's warps per case (8: short reductions; 4: long)
F64_WARPS = {name: 4 if name.endswith("_long") else 8 for name in F64_CASES}


@pytest.fixture(scope="module")
def f64_reports() -> dict:
    from lowbit.kernels import get_template
    from lowbit.kernels.triton import CONV2D_INT8  # noqa: F401  (registers the templates)
    from lowbit.kernels.triton.epilogue import BIAS_SHIFTED_FLOAT64

    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    cases = [(template, wl.to_json(), get_template(template).default_config(wl).to_json(),
              BIAS_SHIFTED_FLOAT64) for template, wl in F64_CASES.values()]
    return dict(zip(F64_CASES, zip(cases, compile_in_subprocess(cases), strict=True),
                    strict=True))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(F64_CASES))
def test_requantizing_default_configs_do_not_spill(f64_reports, case):
    """Where the epilogue is most of the work, the default keeps 64 accumulators a thread (8
    warps on a 128 x 128 tile): on 4 warps the float64 form spilled 24-1,728 B at 255
    registers (MobileNet-V2's expansion convs ran at 13-19x their floor, 2x slower); long
    reductions keep 4 warps, without spilling. The float64 form runs no conversion
    instruction (a quarter of the integer rate)."""
    (_, _, config_json, _), got = f64_reports[case]
    assert isinstance(got, list), got
    main = _main(got)
    assert main["spill_bytes"] == 0, main
    assert main["regs"] <= 255, main
    assert main["cvt_f64"] == 0, main  # no float64 conversion (`epilogue.nearest_int32`)
    assert json.loads(config_json)["num_warps"] == F64_WARPS[case], config_json


@pytest.mark.parametrize("template", ["triton.conv2d_int8", "triton.conv2d_int8_tma"])
def test_long_reductions_keep_four_warps(template):
    """ResNet-50's 3x3 convs at batch 256 (36 reduction steps) keep 4 warps with the same
    requantizing epilogue: 8 were 1.1-1.4x slower there on an H100."""
    from lowbit.kernels import get_template
    from lowbit.kernels.triton import CONV2D_INT8  # noqa: F401  (registers the templates)

    wl = B256["resnet50_s3_3x3_b256"].replace(a="u8", epilogue=U8_REQUANT)
    cfg = get_template(template).default_config(wl)
    assert cfg["BLOCK_N"] == 128 and cfg["num_warps"] == 4, cfg


def test_first_layers_default_to_row_taps():
    """Convs of fewer than 32 channels with S > 1 take a kernel row's S*C values per
    reduction run by default (the 3-channel 7x7: 152.5 -> 46.7 us on an H100); 32 channels
    and more keep per-tap chunks."""
    from lowbit.kernels import get_template
    from lowbit.kernels.triton import CONV2D_INT8  # noqa: F401  (registers the templates)

    t = get_template("triton.conv2d_int8")
    picked = {}
    for c, r in ((3, 3), (3, 7), (16, 3), (32, 3), (16, 1)):
        wl = ConvWorkload(w="s8", a="s8", epilogue=U8_REQUANT, N=8, H=64, W=64, C=c, K=32,
                          R=r, S=r, stride=2, pad=r // 2)
        cfg = t.default_config(wl)
        picked[(c, r)] = (cfg["LOOP_ORDER"], cfg["BLOCK_K"])
    assert picked == {(3, 3): ("r_sc", 32), (3, 7): ("r_sc", 32), (16, 3): ("r_sc", 64),
                      (32, 3): ("rsc", 32), (16, 1): ("rsc", 32)}
