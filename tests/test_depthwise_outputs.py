"""`triton.conv2d_depthwise` writing a layer's whole epilogue (`depthwise_outputs`).

CPU (TRITON_INTERPRET=1): odd depthwise convs (odd batch and H / W, channels off the tile),
3x3 and 5x5, stride 1 and 2, s8 and u8 activations, every MAC form (dp4a tap groups, int32,
fp32 in a pipelined tap loop) and a CUDA-core grouped conv on the same main loop; one and two
outputs: EfficientNet's SiLU table over the s8 mid value (into s16, s8, u8) with that mid value
stored, or beside a requantized output of its own formula, a u2 in bit planes (the tile made
32 channels wide). Each output equals the exact formula (and table) on
`lowbit.reference.run`'s accumulator bit for bit, in poisoned buffers; a float output and a
residual equal the separate pass (`netops.layer_epilogue`). The launch is reached through
`conv_outputs.bind_conv_outputs`; refusals name their reason before any launch. The planner
runs a w8a8 depthwise + SiLU network's depthwise layer with its outputs in the kernel, and the
GPU executor (the depthwise kernel interpreted) equals the reference executor.
GPU (`gpu`): EfficientNet-B0's depthwise layers at batch 8 on their default configs; the same
network on the GPU executor.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from any_cnn_cases import compiled, quantized
from depthwise_outputs_cases import MID, expected, layer_specs
from lowbit.core import Config, ConvWorkload, Epilogue, Layout, PackedTensor, Precision
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.base import acc_bound
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton.conv_outputs import bind_conv_outputs
from lowbit.kernels.triton.depthwise_outputs import (
    TABLE_VALUES_MAX,
    depthwise_outputs_kernel,
    depthwise_outputs_reason,
    outputs_config,
)
from lowbit.quant.packing import pack
from lowbit.reference import random_inputs, random_values, run
from test_triton_netops import poisoned, stored_values
from triton_cases import DEVICE

load_backends()
DEPTHWISE = get_template("triton.conv2d_depthwise")
GROUPED = get_template("triton.conv2d_grouped_cuda")
INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


def dw(n: int, h: int, w: int, c: int, r: int, stride: int, a: str) -> ConvWorkload:
    """A depthwise layer storing its int32 accumulator ('same' padding)."""
    return ConvWorkload(N=n, H=h, W=w, C=c, K=c, R=r, S=r, stride=stride, pad=r // 2,
                        groups=c, a=a, epilogue=Epilogue())


def cfg(pix: int, chans: int, warps: int, mac: str, loop: str = "unrolled",
        stages: int = 1) -> Config:
    return Config(BLOCK_PIX=pix, BLOCK_C=chans, num_warps=warps, TAP_LOOP=loop,
                  num_stages=stages, MAC=mac)


CASES = {  # name: template, workload, config, output kinds, their layouts, launched tile
    # EfficientNet's two outputs of one formula (SiLU into s16, the s8 mid), 3x3 stride 1,
    # dp4a; 189 pixels over 6 pixel tiles, 52 channels over two channel tiles
    "3x3_s1_dp4a_silu16_mid": (DEPTHWISE, dw(3, 7, 9, 52, 3, 1, "s8"),
                               cfg(32, 32, 4, "dp4a"), ("silu_s16", "mid"), (INT8, INT8),
                               (32, 32)),
    # 5x5 stride 2, u8 activations, int32 multiply-accumulates (C odd), one plain output
    "5x5_s2_int32_u8": (DEPTHWISE, dw(1, 9, 11, 37, 5, 2, "u8"), cfg(32, 16, 2, "int32"),
                        ("u8",), (INT8,), (32, 16)),
    # 5x5 stride 1, u8 activations through dp4a (6 groups of 4 taps and one tap), a u2 in bit
    # planes beside a SiLU u8: the 16-channel tile made 32 wide, 64 pixels made 32
    "5x5_s1_dp4a_u8_u2_silu": (DEPTHWISE, dw(3, 5, 7, 20, 5, 1, "u8"),
                               cfg(64, 16, 4, "dp4a"), ("u2", "silu_u8"), (BITPLANE, INT8),
                               (32, 32)),
    # 3x3 stride 2, float32 multiply-accumulates in a pipelined tap loop, a SiLU s8 and an
    # s8 of its own formula; the default tile halved to TABLE_VALUES_MAX values a thread
    "3x3_s2_fp32_silu8_s8": (DEPTHWISE, dw(3, 9, 7, 24, 3, 2, "s8"),
                             cfg(64, 32, 2, "fp32", "pipelined", 2), ("silu_s8", "s8"),
                             (INT8, INT8), (32, 32)),
    # a grouped conv of 2 input channels a group on the same main loop
    "grouped_3x3": (GROUPED, ConvWorkload(N=1, H=5, W=7, C=12, K=24, R=3, S=3, pad=1,
                                          groups=6, a="s8", epilogue=Epilogue()),
                    cfg(32, 32, 4, "int32", "pipelined"), ("silu_s8",), (INT8,), (32, 32)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_equal_the_reference(name):
    template, wl, config, kinds, layouts, (pix, chans) = CASES[name]
    kernel = template.build(wl, config)
    x, w, params = random_inputs(wl, seed=3, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int64)
    shape = tuple(acc.shape)
    specs = layer_specs(kinds, wl.K, int(acc.abs().max()) // 2 + 1, seed=len(name))
    outs = [poisoned(shape, sp.precision, lay) for sp, lay in zip(specs, layouts, strict=True)]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs)
    (one,) = launch.launches
    assert one.fn is depthwise_outputs_kernel
    assert (one.kwargs["BLOCK_PIX"], one.kwargs["BLOCK_C"]) == (pix, chans)
    assert one.kwargs["TAP_GROUPS"] == (config["MAC"] == "dp4a")
    assert one.kwargs["MAC_FP32"] == (config["MAC"] == "fp32")
    assert one.grid == (-(-shape[0] * shape[1] * shape[2] // pix) * -(-wl.K // chans),)
    same = [kinds[j] == "mid" and kinds[j - 1].startswith("silu_") for j in range(len(kinds))]
    assert [bool(one.kwargs[f"SAME{j}"]) for j in range(len(kinds))] == same
    launch()
    for out, spec in zip(outs, specs, strict=True):
        want = expected(acc, spec)
        assert torch.equal(stored_values(out), want), out.precision
        assert int(want.unique().numel()) >= 3, out.precision


def test_float_output_and_residual_equal_the_separate_pass():
    """A float output (NCHW) and a SiLU s8 with an s8 residual term: the fused launch and
    `netops.layer_epilogue` on the int32 accumulator write the same values."""
    wl = dw(1, 6, 5, 28, 3, 1, "s8")
    x, w, params = random_inputs(wl, seed=5, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int32)
    shape = tuple(acc.shape)
    g = torch.Generator().manual_seed(6)
    y_typical = int(acc.abs().max()) // 2 + 1
    (silu,) = layer_specs(("silu_s8",), 28, y_typical, seed=7)
    # the residual term about a quarter of the accumulator's
    r = silu.multiplier * y_typical // 512 * (torch.randint(0, 2, (28,), generator=g) * 2 - 1)
    silu = K.Requantized(silu.precision, silu.multiplier, silu.shift, silu.bias, r, mid=MID,
                         table=silu.table)
    specs = [K.Dequantized(torch.rand(28, generator=g) * 1e-3, torch.rand(28, generator=g),
                           relu=True, channels_first=True), silu]
    p = Precision.parse("s8")
    res = PackedTensor(pack(random_values(shape, p, g), p, INT8).to(DEVICE), shape, p, INT8)
    fused = [torch.full((1, 28, 6, 5), float("nan"), device=DEVICE),
             poisoned(shape, "s8", INT8)]
    bind_conv_outputs(DEPTHWISE.build(wl, cfg(32, 32, 4, "dp4a")), x, w, params, specs, fused,
                      res)()
    separate = K.layer_epilogue(acc.to(DEVICE), specs, residual=res)
    assert torch.equal(fused[0], separate[0]) and int((fused[0] > 0).sum()) > 100
    assert torch.equal(fused[1].data, separate[1].data)
    assert int(stored_values(fused[1]).unique().numel()) >= 3


def test_outputs_config():
    """The kernel's tile by default; halved down to TABLE_VALUES_MAX values a thread with a
    table; 32 channels wide for bit planes; a given tile as it is; bad tiles refused."""
    base = dict(cfg(128, 32, 4, "dp4a"))
    assert outputs_config(base) == base
    assert outputs_config(base, table=True)["BLOCK_PIX"] * 32 // 128 == TABLE_VALUES_MAX
    assert outputs_config({**base, "BLOCK_C": 16, "BLOCK_PIX": 256}, bitplane=True) == \
        {**base, "BLOCK_C": 32, "BLOCK_PIX": 128}
    tile = {"BLOCK_PIX": 64, "BLOCK_C": 64, "num_warps": 4}
    assert outputs_config(base, table=True, tile=tile) == {**base, **tile}
    for bad in ({**tile, "BLOCK_PIX": 48}, {**tile, "num_warps": 3}, {**tile, "BLOCK_C": 8},
                {**tile, "BLOCK_PIX": 512}, {"BLOCK_PIX": 64}):
        with pytest.raises(ValueError, match="tile"):
            outputs_config(base, tile=bad)


def test_refusals_name_their_reason():
    wl = dw(1, 4, 4, 16, 3, 1, "s8")
    kernel = DEPTHWISE.build(wl, cfg(32, 16, 2, "int32"))
    assert depthwise_outputs_reason(kernel, 3) is None
    assert "1..3" in depthwise_outputs_reason(kernel, 4)
    assert "conv2d_depthwise" in depthwise_outputs_reason(object(), 1)
    requant = DEPTHWISE.build(wl.replace(epilogue=Epilogue(relu=True, out="u8")),
                              cfg(32, 16, 2, "int32"))
    assert "bare int32" in depthwise_outputs_reason(requant, 1)
    x, w, params = random_inputs(wl, seed=1, device=DEVICE)
    specs = layer_specs(("s8",), 16, 2**10)
    with pytest.raises(ValueError, match="cannot run this layer epilogue"):
        bind_conv_outputs(requant, x, w, params, specs, [poisoned((1, 4, 4, 16), "s8", INT8)])
    with pytest.raises(ValueError, match="outs\\[0\\]"):
        bind_conv_outputs(kernel, x, w, params, specs, [poisoned((1, 4, 4, 8), "s8", INT8)])
    with pytest.raises(ValueError, match="tile"):
        bind_conv_outputs(kernel, x, w, params, specs, [poisoned((1, 4, 4, 16), "s8", INT8)],
                          tile={"BLOCK_PIX": 16})


# ------------------------------------------------------------------------------ networks
def silu_net() -> nn.Module:
    """A stem conv, a depthwise conv, both with BatchNorm and SiLU, a 1x1 projection, the
    pooled classifier: EfficientNet's depthwise layer in small."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16, bias=False), nn.BatchNorm2d(16),
        nn.SiLU(), nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def silu_plan():
    x = torch.randn(3, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    q = quantized(silu_net(), x)
    return compiled(q, x).plan, x


def depthwise_steps(plan) -> list:
    return [s for s in plan.layers if s.impl == DEPTHWISE.name]


def interpreted_depthwise(step):
    """The executor's kernels: the depthwise template's own (interpreted), the rest as
    test_engine_gpu runs them."""
    from lowbit.runtime.layers import interpreted_kernel

    if step.impl == DEPTHWISE.name:
        return DEPTHWISE.build(step.workload, step.config or
                               DEPTHWISE.default_config(step.workload))
    return interpreted_kernel(step)


def test_planner_fuses_the_depthwise_silu_layer():
    """The depthwise layer's SiLU outputs are written by its kernel (`outputs_in_kernel`;
    off with PlanOptions(fuse_outputs=False)), and the reference executor's result does not
    depend on it."""
    from lowbit.graph.launches import PlanOptions, with_launches
    from lowbit.runtime.engine import ReferenceExecutor

    plan, x = silu_plan()
    (step,) = depthwise_steps(plan)
    assert step.outputs_in_kernel and any(o.derived for o in step.layer_outputs)
    assert step.workload.epilogue.out == "int32"
    off = with_launches(plan, PlanOptions(fuse_outputs=False))
    assert not depthwise_steps(off)[0].outputs_in_kernel
    assert torch.equal(ReferenceExecutor(plan)(x), ReferenceExecutor(off)(x))


def test_executor_equals_the_reference():
    """The GPU executor on the CPU, the depthwise kernel interpreted with its layer epilogue
    fused: every tensor equals the reference executor's."""
    from lowbit.runtime.gpu import GpuExecutor
    from test_engine_gpu import assert_matches_reference

    plan, x = silu_plan()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ex = GpuExecutor(plan, "cpu", kernels=interpreted_depthwise)
    (step,) = depthwise_steps(plan)
    (bound,) = [b for b in ex.steps if b.step.name == step.name]
    assert "layer epilogue fused" in bound.how
    assert assert_matches_reference(plan, ex, x) > 5


# ------------------------------------------------------------------------------ GPU
#: EfficientNet-B0's depthwise layers (H, C, R, stride) at batch 8
EFFICIENTNET_B0 = [(112, 32, 3, 1), (112, 96, 3, 2), (56, 144, 3, 1), (56, 144, 5, 2),
                   (28, 240, 5, 1), (28, 240, 3, 2), (14, 480, 3, 1), (14, 480, 5, 1),
                   (14, 672, 5, 2), (7, 1152, 5, 1), (7, 1152, 3, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("h,c,r,stride", EFFICIENTNET_B0,
                         ids=[f"{h}x{c}_{r}x{r}_s{s}" for h, c, r, s in EFFICIENTNET_B0])
@pytest.mark.parametrize("kinds", [("silu_s16", "mid"), ("s8",)], ids=["silu", "plain"])
def test_gpu_efficientnet_b0_depthwise(h, c, r, stride, kinds):
    """The default config's fused launch on CUDA, bit-exact against the reference."""
    wl = dw(8, h, h, c, r, stride, "s8")
    kernel = DEPTHWISE.build(wl, DEPTHWISE.default_config(wl))
    x, w, params = random_inputs(wl, seed=7, device="cuda")
    acc = run(wl, x, w, params).to(torch.int64).cpu()
    shape = tuple(acc.shape)
    specs = layer_specs(kinds, c, acc_bound(wl) // 16, seed=c)
    outs = [K.empty_packed(shape, sp.precision, INT8, "cuda") for sp in specs]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs)
    assert launch.launches[0].fn is depthwise_outputs_kernel
    launch()
    for out, spec in zip(outs, specs, strict=True):
        assert torch.equal(stored_values(out), expected(acc, spec)), out.precision


@pytest.mark.gpu
def test_gpu_executor_equals_the_reference():
    """The small SiLU network on the GPU executor: its depthwise layer's outputs fused, every
    tensor equal to the reference executor's on the same GPU."""
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor

    plan, x = silu_plan()
    x = x.cuda()
    ex = GpuExecutor(plan, x.device)
    (step,) = depthwise_steps(plan)
    assert "layer epilogue fused" in next(b for b in ex.steps if b.step.name == step.name).how
    y, rec = ex(x, record=True)
    y_ref, rec_ref = ReferenceExecutor(plan, x.device)(x, record=True)
    assert torch.equal(y, y_ref) and len(rec_ref) > 5
    for t, v in rec_ref.items():
        assert torch.equal(rec[t], v), t
