"""`triton.conv2d_pointwise` writing a layer's whole epilogue (`pointwise_outputs`).

CPU (TRITON_INTERPRET=1): odd 1x1 convs (row counts off BLOCK_M, K off BLOCK_N), u8 and s8
activations, programs fewer than the row tiles (each loops over several) and as many; a u8
residual into the stored u8 stream, a stored u8 mid with a derived u2 in bit planes, an s8
residual into an s8 projection, a float output; every requantization mode (INT32,
FAST_NARROW, FAST, DIRECT, forced through the vectors and y_bound as test_conv_outputs and
test_triton_netops do). Each output equals `lowbit.reference.epilogue_outputs` on
`lowbit.reference.run`'s int32 accumulator (float: the separate pass on it) bit for bit, in
poisoned buffers; the launch is the persistent kernel, reached through
`conv_outputs.bind_conv_outputs`. Refusals name their reason before any launch. The planner
keeps a few-channel block end on the template with its outputs in the kernel.
GPU (`gpu`): ResNet-50's layer1 block end at batch 8, the default outputs tile.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, Layout, PackedTensor, Precision
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.base import acc_bound
from lowbit.kernels.triton import layer_outputs as L
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton import pointwise_outputs as P
from lowbit.kernels.triton.conv_outputs import bind_conv_outputs, fused_reason
from lowbit.kernels.triton.pointwise import PointwiseKernel, programs
from lowbit.kernels.triton.pointwise_outputs import (
    OUTPUTS_TILE,
    outputs_config,
    pointwise_outputs_kernel,
    pointwise_outputs_reason,
)
from lowbit.kernels.triton.templates import problem
from lowbit.quant.packing import pack
from lowbit.reference import epilogue_outputs, random_inputs, random_values, run
from test_conv_outputs import requantized
from test_triton_netops import poisoned, shifted_oracle, stored_values
from test_triton_netops_block_end import LAYOUT_OF, block_end_specs
from triton_cases import DEVICE

load_backends()
POINTWISE = get_template("triton.conv2d_pointwise")
INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
#: a small tile on the interpreter: 189-row layers take 6 row tiles of 32
SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "PROGRAMS_PER_SM": 1}
CONFIG = Config(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, PROGRAMS_PER_SM=1)


def layer(c: int, k: int, a: str = "u8", n: int = 3, h: int = 7, w: int = 9) -> ConvWorkload:
    """A 1x1 layer storing its int32 accumulator (189 rows by default)."""
    return ConvWorkload(N=n, H=h, W=w, C=c, K=k, R=1, S=1, a=a, epilogue=Epilogue())


def kernel_on(wl: ConvWorkload, sms: int) -> PointwiseKernel:
    return PointwiseKernel(POINTWISE.name, wl, CONFIG, problem(wl, False), sms=sms)


def residual_of(shape, prec: str, seed: int) -> tuple[torch.Tensor, PackedTensor, int]:
    p = Precision.parse(prec)
    vals = random_values(shape, p, torch.Generator().manual_seed(seed))
    return vals, PackedTensor(pack(vals, p, INT8).to(DEVICE), shape, p, INT8), \
        max(-p.qmin, p.qmax)


BLOCK_END = {  # workload, residual, kinds, int32 (the INT32 mode), (mid, relu), SMs
    # ResNet-50's layer1 block end: a u8 residual into the u8 stream, INT32, fewer programs
    # than row tiles (2 column tiles, one program each, 6 row tiles)
    "u8_res_u8_int32": (layer(64, 40), "u8", ("mid",), True, ("u8", True), 1),
    # the stored u8 mid and a derived u2 in bit planes (float64 sum), a program a row tile
    "u8_res_mid_u2": (layer(19, 64, n=2, h=5, w=11), "u8", ("mid", "u2"), False,
                      ("u8", True), 64),
    # an s8 residual into an s8 projection of C=144 (MobileNet-V2's features_3_conv_2 at a
    # small size), s8 activations, K off the column tile
    "s8_res_projection": (layer(144, 24, a="s8", n=1, h=13, w=7), "s8", ("mid",), False,
                          ("s8", False), 2),
}


@pytest.mark.parametrize("prefetch", [False, True], ids=["load", "prefetch"])
@pytest.mark.parametrize("name", sorted(BLOCK_END))
def test_block_end_outputs_equal_the_reference(name, prefetch, monkeypatch):
    monkeypatch.setattr(P, "PREFETCH_RESIDUAL", prefetch)
    wl, res_prec, kinds, int32, (mid, relu), sms = BLOCK_END[name]
    kernel = kernel_on(wl, sms)
    x, w, params = random_inputs(wl, seed=3, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int64)
    shape = tuple(acc.shape)
    res_vals, residual, res_top = residual_of(shape, res_prec, 4)
    specs = block_end_specs(shape[-1], acc_bound(wl), res_top, int32, mid, relu, kinds, 5,
                            y_typical=int(acc.abs().max()) // 2 + 1)
    outs = [poisoned(shape, sp.precision, LAYOUT_OF[kd]) for sp, kd in zip(specs, kinds,
                                                                           strict=True)]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs, residual, tile=SMALL)
    (one,) = launch.launches
    assert one.fn is pointwise_outputs_kernel
    rows, cols = -(-shape[0] * shape[1] * shape[2] // 32), -(-shape[-1] // 32)
    assert one.grid == (cols * min(rows, max(1, sms // cols)),)
    assert (one.kwargs["MODE0"] == L.INT32) == int32
    assert [one.kwargs[f"SAME{j}"] for j in range(len(kinds))] == [0, 1][:len(kinds)]
    launch()
    ref = epilogue_outputs(acc, None, specs, residual=res_vals)
    for out, want in zip(outs, ref, strict=True):
        assert torch.equal(stored_values(out), want), out.precision
    assert all(int(v.unique().numel()) >= 3 for v in ref)


#: (rows a tile, the layer): 91 rows (odd) in 6 tiles of 16, each residual tile's values its own
TILED = ({**SMALL, "BLOCK_M": 16}, layer(16, 40, n=1, h=7, w=13))


@pytest.mark.parametrize("res_prec,res_layout", [("u8", INT8), ("u4", BITPLANE)],
                         ids=["u8", "u4_planes"])
@pytest.mark.parametrize("sms", [1, 6], ids=["step1", "step3"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["load", "prefetch"])
def test_each_tile_adds_its_own_residual(res_prec, res_layout, sms, prefetch, monkeypatch):
    """Programs looping over several row tiles (2 column tiles; 1 SM: a program takes all 6
    tiles in turn, 6 SMs: 3 programs a column, tiles 3 apart), the residual's values a
    function of their row tile: the residual that each tile adds is its own (the kernel loads
    it one iteration ahead with PREFETCH_RESIDUAL), the last partial tile's included."""
    monkeypatch.setattr(P, "PREFETCH_RESIDUAL", prefetch)
    tile, wl = TILED
    x, w, params = random_inputs(wl, seed=21, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int64)
    shape = tuple(acc.shape)
    p = Precision.parse(res_prec)
    m, bm = wl.N * wl.H * wl.W, tile["BLOCK_M"]
    rows = torch.arange(m).div(bm, rounding_mode="floor")
    step = (p.qmax + 1) // 6
    noise = torch.randint(0, step, (m, shape[-1]), generator=torch.Generator().manual_seed(22))
    res_vals = (rows[:, None] * step + noise).reshape(shape)
    residual = PackedTensor(pack(res_vals, p, res_layout).to(DEVICE), shape, p, res_layout)
    spec = requantized("s8", shape[-1], int(acc.abs().max()) + 1, 23, p.qmax, False)
    out = poisoned(shape, "s8", INT8)
    launch = bind_conv_outputs(kernel_on(wl, sms), x, w, params, [spec], [out], residual,
                               tile=tile)
    (one,) = launch.launches
    assert one.kwargs["PREFETCH_RES"] == prefetch
    assert one.kwargs["RES_WORDS"] == (res_layout == INT8)
    assert one.grid == (2 * (1 if sms == 1 else 3),) and -(-m // bm) == 6
    launch()
    want = shifted_oracle(acc, spec, res_vals)
    assert torch.equal(stored_values(out), want)
    for shift in (1, 3):  # another tile's residual changes most rows' outputs
        other = res_vals.reshape(m, -1).roll(shift * bm, 0).reshape(shape)
        assert int((shifted_oracle(acc, spec, other) != want).sum()) > want.numel() // 2


def past_narrow(spec, y_bound: int, res_top: int):
    """`spec` with m, b, r times 2^t and shift + t (the same values) for the largest t whose
    float64 terms (`layer_outputs.requant_mode`) stay below 2^53: FAST, not FAST_NARROW."""
    m, s, b, r = (torch.as_tensor(v).to(torch.int64) for v in (
        spec.multiplier, spec.shift, spec.bias, spec.residual_multiplier))
    terms = y_bound * int(m.max()) + int(b.abs().max()) + 2 ** (int(s.max()) - 1) \
        + res_top * int(r.abs().max())
    t = 52 - (terms.bit_length() - 1) if terms * 2 ** (53 - terms.bit_length()) < 2**53 \
        else 52 - terms.bit_length()
    return L.Requantized(spec.precision, m << t, s + t, b << t, r << t, relu=spec.relu)


#: mode: (the specs, fast, requant32)
MODES = {
    L.FAST_NARROW: (lambda sp, y, res: sp, True, True),
    L.FAST: (past_narrow, True, True),
    L.DIRECT: (lambda sp, y, res: sp, False, True),
}


@pytest.mark.parametrize("mode", sorted(MODES), ids=["direct", "fast", "fast_narrow"])
def test_requant_modes_equal_the_oracle(mode):
    """31-bit multipliers (`test_conv_outputs.requantized`): the float64 sum whose results
    fit int32 (FAST_NARROW), past that bound (FAST: y_bound m >= 2^52), and the int64 one
    (DIRECT); a u8 residual, u8 and s8 outputs and an s4 in bit planes."""
    respec, fast, requant32 = MODES[mode]
    wl = layer(40, 70, a="s8", n=1, h=11, w=9)
    kernel = kernel_on(wl, 2)
    x, w, params = random_inputs(wl, seed=11, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int64)
    shape = tuple(acc.shape)
    res_vals, residual, res_top = residual_of(shape, "u8", 12)
    y_top = int(acc.abs().max()) + 1
    defs = (("u8", INT8, True), ("s8", INT8, False), ("s4", BITPLANE, False))
    specs = [respec(requantized(p, shape[-1], y_top, 20 + i, res_top, relu), y_top, res_top)
             for i, (p, _, relu) in enumerate(defs)]
    outs = [poisoned(shape, p, lay) for p, lay, _ in defs]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs, residual,
                               y_bound=y_top, fast=fast, requant32=requant32,
                               tile=SMALL)
    (one,) = launch.launches
    modes = [one.kwargs[f"MODE{j}"] for j in range(3)]
    assert modes.count(mode) >= 2 and set(modes) <= {mode, L.FAST_NARROW}, modes
    launch()
    checked = 0
    for out, sp in zip(outs, specs, strict=True):
        want = shifted_oracle(acc, sp, res_vals)
        assert torch.equal(stored_values(out), want), out.precision
        checked += int(want.unique().numel() > 2)
    assert checked == 3


def test_float_output_equals_the_separate_pass():
    wl = layer(24, 33, n=1, h=4, w=5)
    x, w, params = random_inputs(wl, seed=5, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int32).to(DEVICE)
    g = torch.Generator().manual_seed(6)
    specs = [K.Dequantized(torch.rand(33, generator=g) * 1e-3, torch.rand(33, generator=g),
                           relu=True, channels_first=True),
             K.Dequantized(torch.rand(33, generator=g) * 1e-3, None, 0.25)]
    _, residual, _ = residual_of((1, 4, 5, 33), "s8", 7)
    fused = [torch.full((1, 33, 4, 5), float("nan"), device=DEVICE),
             torch.full((1, 4, 5, 33), float("nan"), device=DEVICE)]
    bind_conv_outputs(kernel_on(wl, 1), x, w, params, specs, fused, residual, tile=SMALL)()
    separate = K.layer_epilogue(acc, specs, residual=residual)
    for got, want in zip(fused, separate, strict=True):
        assert torch.equal(got, want)
    assert int((fused[0] > 0).sum()) > 100 and int((fused[1] < 0).sum()) > 100


def test_programs_and_tile():
    """The default tile, PROGRAMS_PER_SM lowered where shared memory does not fit three
    programs (C=144 pads to a 256-channel reduction tile), the tile's checks."""
    cfg = outputs_config(CONFIG.replace(num_stages=3), 64)
    assert {k: cfg[k] for k in OUTPUTS_TILE} == OUTPUTS_TILE
    assert outputs_config(CONFIG.replace(num_stages=3), 144)["PROGRAMS_PER_SM"] == 2
    grid, cols, step = programs(256 * 56 * 56, 256, cfg, 132)
    assert (cols, step, grid) == (8, 49, 392)  # 3 programs a SM: 396 // 8 per column
    for bad in ({**OUTPUTS_TILE, "BLOCK_N": 16}, {**OUTPUTS_TILE, "BLOCK_M": 96},
                {**OUTPUTS_TILE, "num_warps": 3}, {"BLOCK_M": 64}):
        with pytest.raises(ValueError, match="tile"):
            outputs_config(CONFIG, 64, bad)


def test_refusals_name_their_reason():
    wl = layer(16, 32, n=1, h=4, w=4)
    kernel = kernel_on(wl, 1)
    assert fused_reason(kernel, 2) is None and pointwise_outputs_reason(kernel, 3) is None
    assert "1..3" in fused_reason(kernel, 4)
    requant = kernel_on(wl.replace(epilogue=Epilogue(relu=True, out="u8")), 1)
    assert "bare int32" in pointwise_outputs_reason(requant, 1)
    assert "conv2d_pointwise" in pointwise_outputs_reason(object(), 1)
    x, w, params = random_inputs(wl, seed=1, device=DEVICE)
    spec = requantized("u8", 32, 2**20, 1, 0, True)
    with pytest.raises(ValueError, match="cannot run this layer epilogue"):
        bind_conv_outputs(requant, x, w, params, [spec], [poisoned((1, 4, 4, 32), "u8", INT8)])
    with pytest.raises(ValueError, match="outs\\[0\\]"):
        bind_conv_outputs(kernel, x, w, params, [spec], [poisoned((1, 4, 4, 16), "u8", INT8)])
    with pytest.raises(ValueError, match="same length"):
        bind_conv_outputs(kernel, x, w, params, [spec], [])


def test_planner_keeps_block_ends_on_the_template():
    """A few-channel 1x1 block end (ResNet-50's layer1: C=64 -> K=256, a residual) stays on
    triton.conv2d_pointwise with its layer epilogue written by the kernel
    (`layer_outputs_impl`, `outputs_in_kernel`); on another template it still moves to
    triton.conv2d_int8."""
    from lowbit.graph.ir import Layer, LayerOutput
    from lowbit.graph.kernel_epilogues import layer_outputs_impl
    from lowbit.graph.launches import outputs_in_kernel

    out = LayerOutput("y", relu=True, multiplier="m", shift="s", bias="b",
                      residual_multiplier="r")
    wl = ConvWorkload(N=2, H=8, W=8, C=64, K=256, R=1, S=1, a="u8", epilogue=Epilogue())
    step = Layer(name="layer1_0_conv3", workload=wl, input="x", weight="w", residual="res",
                 layer_outputs=(out,), impl=POINTWISE.name)
    assert layer_outputs_impl(step) is step and outputs_in_kernel(step)
    two = replace(step, layer_outputs=(out, replace(out, tensor="y2")))
    assert layer_outputs_impl(two) is two and outputs_in_kernel(two)
    other = layer_outputs_impl(replace(step, impl="cuda.int8_wgmma"))
    assert other.impl == "triton.conv2d_int8" and outputs_in_kernel(other)


@pytest.mark.gpu
@pytest.mark.parametrize("int32", [True, False], ids=["requant32", "float64"])
def test_gpu_resnet50_layer1_block_end(int32):
    """ResNet-50's layer1 block end (C=64 -> K=256 at 56x56) at batch 8 on the default
    pointwise config and outputs tile: a u8 residual into the stored u8 mid and a derived u2
    in bit planes, bit-exact against the reference."""
    wl = ConvWorkload(N=8, H=56, W=56, C=64, K=256, R=1, S=1, a="u8", epilogue=Epilogue())
    kernel = POINTWISE.build(wl, POINTWISE.default_config(wl))
    x, w, params = random_inputs(wl, seed=7, device="cuda")
    acc = run(wl, x, w, params).to(torch.int64).cpu()
    shape = tuple(acc.shape)
    p = Precision.parse("u8")
    res_vals = random_values(shape, p, torch.Generator().manual_seed(8))
    residual = PackedTensor(pack(res_vals, p, INT8).cuda(), shape, p, INT8)
    kinds = ("mid", "u2")
    specs = block_end_specs(256, acc_bound(wl), 255, int32, "u8", True, kinds, 9,
                            y_typical=int(acc.abs().max()) // 2 + 1)
    outs = [K.empty_packed(shape, sp.precision, LAYOUT_OF[kd], "cuda")
            for sp, kd in zip(specs, kinds, strict=True)]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs, residual)
    assert launch.launches[0].fn is pointwise_outputs_kernel
    launch()
    ref = epilogue_outputs(acc, None, specs, residual=res_vals)
    for out, want in zip(outs, ref, strict=True):
        assert torch.equal(stored_values(out), want), out.precision
