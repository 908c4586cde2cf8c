"""The Triton launches the GPU executor adds compile for sm_90 without a GPU and without
spills (the stem's conv kernel: a small spill, as in test_triton_netops_compile.py): layer
epilogues in each exact mode (float64, int64, split sum) with a shifted bias, wide 16 / 24-bit
outputs and residuals, NCHW float outputs with a residual term; the stem with those outputs;
window-table and global average pools of wide tensors; int32 max-pools; quantization with
ReLU into wide tensors. The interpreter tests check what they compute; this that Triton's
compiler accepts them at ResNet sizes. Runs in a fresh Python without TRITON_INTERPRET
(tests/triton_offline.py)."""

from __future__ import annotations

import json
import os

import pytest
import triton

from triton_offline import run_module_report

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
STEM_SPILL_LIMIT = 512


def _launchers() -> dict:
    """name -> Launcher, built on CPU tensors (device checks off; nothing launched)."""
    import torch

    from lowbit.core import Layout, WidePrecision
    from lowbit.kernels.triton import netops as K
    from lowbit.kernels.triton import stem as S
    from lowbit.kernels.triton import stored

    stored.interpreting = lambda: True
    int8, planes = Layout.INT8, Layout.BITPLANE
    s16, s24, i32 = (WidePrecision(b) for b in (16, 24, 32))
    shape = (8, 7, 7, 512)
    k = shape[-1]
    y = torch.zeros(shape, dtype=torch.int32)
    m = torch.full((k,), 2**30, dtype=torch.int64)
    b = torch.full((k,), -(2**35), dtype=torch.int64)
    split = [K.Requantized("u2", m, 61, b * 2**20, m * 4, True),  # y m + b may pass 2^63
             K.Requantized(s24, m, 50, b, m, True),
             K.Dequantized(torch.ones(k), torch.zeros(k), 0.5, True, channels_first=True)]
    split_outs = [K.empty_packed(shape, "u2", planes, "cpu"),
                  K.empty_packed(shape, s24, int8, "cpu"),
                  torch.empty(8, k, 7, 7)]
    fast = [K.Requantized("u8", m, 50, b, relu=True), K.Requantized(s16, m, 40, b)]
    fast_outs = [K.empty_packed(shape, "u8", int8, "cpu"), K.empty_packed(shape, s16, int8,
                                                                          "cpu")]
    direct = [K.Requantized("s4", m, 40, b, m), K.Dequantized(torch.ones(k))]
    direct_outs = [K.empty_packed(shape, "s4", planes, "cpu"), torch.empty(shape)]
    image = torch.empty(8, 3, 224, 224)
    stem_specs = [K.Requantized("u2", 2**30, 40, -(2**35), relu=True),
                  K.Requantized(s24, 2**30, 30, -(2**35), relu=True),
                  K.Dequantized(torch.ones(64), channels_first=True)]
    stem_outs = [K.empty_packed((8, 56, 56, 64), "u2", planes, "cpu"),
                 K.empty_packed((8, 56, 56, 64), s24, int8, "cpu"), torch.empty(8, 64, 56, 56)]
    x16 = K.empty_packed((8, 7, 7, 512), s16, int8, "cpu")
    rows = [(0, 4, 4), (3, 7, 4)]
    acc = K.empty_packed((8, 112, 112, 64), i32, int8, "cpu")
    return {
        "epilogue_split_wide_float": K.bind_layer_epilogue(
            y, split, split_outs, K.empty_packed(shape, s24, int8, "cpu")),
        "epilogue_fast": K.bind_layer_epilogue(y, fast, fast_outs, y_bound=2**10),
        "epilogue_direct": K.bind_layer_epilogue(
            y, direct, direct_outs, K.empty_packed(shape, "u4", planes, "cpu"), y_bound=2**20),
        "stem_wide_float": S.bind_stem(image, torch.ones(64, 7, 7, 3, dtype=torch.int64), None,
                                       stem_specs, stem_outs, stride=2, pad=3, pool_pad=1,
                                       scale=0.02, status=torch.zeros(1, dtype=torch.int32)),
        "avgpool_windows": K.bind_avgpool_windows(
            x16, K.empty_packed((8, 2, 2, 512), "u4", planes, "cpu"), rows, rows, [16],
            [2**30], [40], relu=True),
        "avgpool_global_wide": K.bind_avgpool2d(
            x16, K.empty_packed((8, 1, 1, 512), "s8", int8, "cpu"), None, None, 0, 2**30, 40,
            relu=True),
        "maxpool_int32": K.bind_maxpool2d(
            acc, K.empty_packed((8, 56, 56, 64), i32, int8, "cpu"), 3, 2, 1),
        "quantize_relu_wide": K.bind_quantize(
            torch.empty(8, 512), 0.02, K.empty_packed((8, 512), s16, int8, "cpu"), True,
            torch.zeros(1, dtype=torch.int32)),
    }


@pytest.fixture(scope="module")
def report() -> dict:
    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(__file__)


def test_engine_launches_compile_for_sm90(report):
    failed = {k: v for k, v in report.items() if not isinstance(v, list)}
    assert not failed, failed
    assert len(report) == 8
    spills = {k: r for k, rows in report.items() for r in rows if r["spill_bytes"] > (
        STEM_SPILL_LIMIT if r["kernel"] in ("stem_conv_kernel", "stem_ring_kernel") else 0)}
    assert not spills, spills
    # the float64 requantization whose results fit int32 (FAST_NARROW) converts nothing
    assert [r["cvt_f64"] for r in report["epilogue_fast"]] == [0], report["epilogue_fast"]


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(_launchers())))
