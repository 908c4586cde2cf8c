"""The network-op and stem kernels compile for sm_90 (Hopper) without a GPU, as launched: the
interpreter tests check what they compute, these that Triton's compiler accepts them and
ptxas fits them without spills. Run in a fresh Python without TRITON_INTERPRET (the launchers
are built there on CPU tensors and each launch compiled with `triton.compile`, through
tests/triton_offline.py)."""

from __future__ import annotations

import json
import os

import pytest
import triton

from triton_offline import run_module_report

#: register / spill checks (ptxas, several seconds each): the slow tier
pytestmark = pytest.mark.slow

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def _launchers() -> dict:
    """name -> Launcher, built on CPU tensors (device checks off)."""
    import torch

    from lowbit.core import Layout, WidePrecision
    from lowbit.kernels.triton import netops as K
    from lowbit.kernels.triton import stem as S
    from lowbit.kernels.triton import stored
    from lowbit.reference import FloatOutput, RequantizedOutput

    stored.interpreting = lambda: True  # build launchers on CPU tensors; nothing is launched
    shape = (8, 7, 7, 2048)
    y = torch.zeros(shape, dtype=torch.int32)
    specs = [RequantizedOutput("u8", 2**30, 40, 2**30, True),
             RequantizedOutput("u2", 2**30, 40, 2**30, True), FloatOutput(1.0)]
    outs = [K.empty_packed(shape, "u8", Layout.INT8, "cpu"),
            K.empty_packed(shape, "u2", Layout.BITPLANE, "cpu"),
            torch.empty(shape, dtype=torch.float32)]
    res = K.empty_packed(shape, "u8", Layout.INT8, "cpu")
    x_bp = K.empty_packed((8, 112, 112, 64), "u2", Layout.BITPLANE, "cpu")
    x_i8 = K.empty_packed((8, 112, 112, 64), "s8", Layout.INT8, "cpu")
    image = torch.empty(8, 3, 224, 224)
    weight = torch.ones(64, 7, 7, 3, dtype=torch.int64)
    stem_outs = [K.empty_packed((8, 56, 56, 64), "u8", Layout.INT8, "cpu"),
                 K.empty_packed((8, 56, 56, 64), "u2", Layout.BITPLANE, "cpu")]
    stem_specs = [RequantizedOutput("u8", 2**30, 40, relu=True),
                  RequantizedOutput("u2", 2**30, 40, relu=True)]
    alex_out = [K.empty_packed((8, 27, 27, 64), "u8", Layout.INT8, "cpu")]
    return {
        **_block_end_launchers(),
        "stem_resnet": S.bind_stem(image, weight, torch.zeros(64, dtype=torch.int64),
                                   stem_specs, stem_outs, stride=2, pad=3, pool_pad=1,
                                   scale=0.02, status=torch.zeros(1, dtype=torch.int32)),
        "stem_alexnet": S.bind_stem(image.to(torch.uint8),
                                    torch.ones(64, 11, 11, 3, dtype=torch.int64), None,
                                    stem_specs[:1], alex_out, stride=4, pad=2,
                                    pool_pad=0, table=torch.zeros(3, 256, dtype=torch.int64)),
        "layer_epilogue": K.bind_layer_epilogue(y, specs, outs, res),
        "maxpool_bitplane": K.bind_maxpool2d(x_bp, K.empty_packed((8, 56, 56, 64), "u2",
                                                                 Layout.BITPLANE, "cpu"), 3, 2, 1),
        "avgpool_global": K.bind_avgpool2d(x_i8, K.empty_packed((8, 1, 1, 64), "s8",
                                                                Layout.INT8, "cpu"),
                                           None, None, 0, 2**30, 40),
        # (above: 112 x 112 split 25 ways, two kernels) ResNet-50's head pool: one reduction
        "avgpool_global_head": K.bind_avgpool2d(
            K.empty_packed(shape, WidePrecision(16), Layout.INT8, "cpu"),
            K.empty_packed((8, 1, 1, 2048), "u4", Layout.BITPLANE, "cpu"), None, None, 0,
            2**30, 40, relu=True),
        "quantize_image": K.bind_quantize_image(
            torch.empty(8, 3, 224, 224, dtype=torch.float16), 0.02,
            K.empty_packed((8, 224, 224, 3), "s8", Layout.BITPLANE, "cpu"),
            torch.zeros(1, dtype=torch.int32)),
    }


def _block_end_launchers() -> dict:
    """The block-end pass (an 8-bit residual, the stored u8 mid and two derived outputs, 32-bit
    requantization), the fused conv writing the same outputs (int32 and float64 modes) and
    the int8 conv's own int32 requantized epilogue, at ResNet-50's layer1 block end."""
    import torch

    from lowbit.core import ConvWorkload, Epilogue, Layout
    from lowbit.core.epilogue import EpilogueParams
    from lowbit.kernels.base import acc_bound
    from lowbit.kernels.triton import CONV2D_INT8, templates
    from lowbit.kernels.triton import netops as K
    from lowbit.kernels.triton.conv_outputs import bind_conv_outputs
    from lowbit.kernels.triton.stored import Launcher
    from lowbit.reference import RequantizedOutput, random_inputs
    from lowbit.reference.netops import fixed_point_pair32

    templates.interpreting = lambda: True
    wl = ConvWorkload(N=8, H=56, W=56, C=64, K=256, R=1, S=1, a="u8")
    shape = (8, 56, 56, 256)
    top = acc_bound(wl)
    m, r, s = fixed_point_pair32(torch.full((256,), 1e-4, dtype=torch.float64), 0.3, top, 255)
    levels = torch.arange(256)
    specs = [RequantizedOutput("u8", m, s, r, True, bias=s),
             RequantizedOutput("u2", m, s, r, True, mid="u8", table=levels // 64, bias=s),
             RequantizedOutput("s8", m, s, r, True, mid="u8", table=levels // 2, bias=s)]
    layouts = (Layout.INT8, Layout.BITPLANE, Layout.INT8)

    def outs():
        return [K.empty_packed(shape, sp.precision, lay, "cpu")
                for sp, lay in zip(specs, layouts, strict=True)]

    res = K.empty_packed(shape, "u8", Layout.INT8, "cpu")
    x, w, params = random_inputs(wl, seed=1)
    kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    y = torch.zeros(shape, dtype=torch.int32)
    req = wl.replace(epilogue=Epilogue(relu=True, out="u8", shifted_bias=True))
    conv = CONV2D_INT8.build(req, CONV2D_INT8.default_config(req))
    p32 = EpilogueParams(multiplier=m.to(torch.int32), shift=s.to(torch.int32),
                         shifted_bias=torch.zeros(256, dtype=torch.int64))
    prob, vecs = templates.with_float64_requant(req, conv.problem, p32, (None,) * 4, "cpu")
    assert prob.bias == 4  # BIAS_SHIFTED_INT32
    out = torch.empty(shape, dtype=torch.uint8)
    return {
        "layer_epilogue_block_end": K.bind_layer_epilogue(y, specs, outs(), res, top),
        "conv_outputs_block_end_int32": bind_conv_outputs(kernel, x, w, params, specs, outs(),
                                                          res),
        "conv_outputs_block_end_float64": bind_conv_outputs(kernel, x, w, params, specs,
                                                            outs(), res, requant32=False),
        "conv_epilogue_int32": Launcher(tuple(conv.plan(prob, x, w, out, vecs)), (out,)),
    }


SPILL_LIMIT = {"stem_resnet": 512, "stem_alexnet": 512}


@pytest.fixture(scope="module")
def reports() -> dict:
    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(__file__)


@pytest.mark.parametrize("name", ["layer_epilogue", "maxpool_bitplane", "avgpool_global",
                                  "avgpool_global_head", "quantize_image", "stem_resnet",
                                  "stem_alexnet", "layer_epilogue_block_end",
                                  "conv_outputs_block_end_int32",
                                  "conv_outputs_block_end_float64", "conv_epilogue_int32"])
def test_compiles_for_sm90_without_spills(reports, name):
    """Every launch compiles; none spills, except the stem's conv kernel (255 registers: its
    carried rows and accumulators), held to a small spill (measured 224 / 392 bytes)."""
    rows = reports[name]
    assert isinstance(rows, list), rows
    limit = SPILL_LIMIT.get(name, 0)
    assert rows and all(r["spill_bytes"] <= limit for r in rows), rows


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(_launchers())))
