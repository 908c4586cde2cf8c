"""The int8 implicit-GEMM kernels with a layer's whole epilogue fused (`conv_outputs`).

CPU (TRITON_INTERPRET=1): tiny odd convs and GEMMs, u8 and s8 activations, a wide or 8-bit
residual, two outputs in INT8 / BITPLANE / wide storage or a float output, split-K summed in
the kernel; every output equals the exact oracle applied to `lowbit.reference.run`'s int32
accumulator, bit for bit, in poisoned buffers. The refusals name their reason before any
launch. GPU (`gpu`): ResNet-50's first block end at batch 8 with the default config.
"""

from __future__ import annotations

import pytest
import torch

from lowbit.core import (
    Config,
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    PackedTensor,
    Precision,
)
from lowbit.core import WidePrecision as Wide
from lowbit.kernels.base import acc_bound
from lowbit.kernels.triton import CONV2D_INT8
from lowbit.kernels.triton import layer_outputs as L
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton.conv_outputs import bind_conv_outputs, fused_config, fused_reason
from lowbit.kernels.triton.templates import IgemmKernel, problem
from lowbit.quant.packing import pack
from lowbit.reference import (
    epilogue_outputs,
    fixed_point_pair,
    random_inputs,
    random_values,
    run,
)
from test_triton_netops import poisoned, shifted_oracle, stored_values, wide_packed
from test_triton_netops_block_end import LAYOUT_OF, block_end_specs
from triton_cases import DEVICE

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
S24 = Wide(24)
TINY = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=2,
              LOOP_ORDER="rsc", SPLIT_K=1)
SPLIT3_LAST = TINY.replace(SPLIT_K=3, LOOP_ORDER="crs", SPLIT_SUM="last_program")


def kernel_for(wl, cfg: Config, dot_fp16: bool = False) -> IgemmKernel:
    if isinstance(wl, GemmWorkload):
        cfg = Config({k: v for k, v in cfg.items() if k != "LOOP_ORDER"})
    return IgemmKernel("test", wl, cfg, problem(wl, dot_fp16))


def requantized(prec, k: int, y_top: int, seed: int, res_top: int, relu: bool):
    """An output spec with its own shifted bias and (res_top > 0: residual values up to
    res_top) a residual multiplier, both terms spanning the output's range."""
    g = torch.Generator().manual_seed(seed)
    p = Precision.parse(prec) if isinstance(prec, str) else prec
    ratio = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * p.qmax / y_top
    rr = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * p.qmax / max(res_top, 1)
    m, r, s = fixed_point_pair(ratio, rr if res_top else 0.0)
    b = ((torch.rand(k, generator=g, dtype=torch.float64) * 6 - 3) * torch.pow(2.0, s)
         ).to(torch.int64)
    return K.Requantized(p, m, s, b, r if res_top else None, relu=relu)


CASES = {
    # 3x3 with padding, u8 activations (zero point), a wide residual into a u8 output (ReLU)
    # and its wide copy: a block end
    "block_end_u8": (ConvWorkload(N=2, H=5, W=6, C=19, K=40, R=3, S=3, pad=1, a="u8"), TINY,
                     (("u8", INT8, True), (S24, INT8, False)), (S24, INT8)),
    # a 1x1 conv run as a GEMM (its kernel's split-K config: the fused launch runs one
    # split), bit-plane and s8 outputs, an s8 residual
    "pointwise_split": (ConvWorkload(N=2, H=3, W=5, C=40, K=64, R=1, S=1), SPLIT3_LAST,
                        (("u2", BITPLANE, True), ("s8", INT8, False)), ("s8", INT8)),
    # a GEMM without residual, one output
    "gemm": (GemmWorkload(M=21, N=45, K=83, a="u8"), TINY, (("s8", INT8, False),), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_outputs_equal_the_oracle_on_the_accumulator(name):
    wl, cfg, out_defs, res_def = CASES[name]
    wl = wl.replace(epilogue=Epilogue())
    kernel = kernel_for(wl, cfg)
    assert fused_reason(kernel, len(out_defs)) is None
    x, w, params = random_inputs(wl, seed=3, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int64)  # the int32 accumulator
    shape = tuple(acc.shape)
    y_top = int(acc.abs().max()) + 1
    res_vals = residual = None
    res_top = 0
    if res_def is not None:
        prec = Precision.parse(res_def[0]) if isinstance(res_def[0], str) else res_def[0]
        res_vals = random_values(shape, prec, torch.Generator().manual_seed(4))
        res_top = int(res_vals.abs().max())
        residual = wide_packed(res_vals, prec) if isinstance(prec, Wide) else \
            PackedTensor(pack(res_vals, prec, res_def[1]).to(DEVICE), shape, prec, res_def[1])
    specs = [requantized(p, shape[-1], y_top, 10 + i, res_top, relu)
             for i, (p, _, relu) in enumerate(out_defs)]
    outs = [K.empty_packed(shape, sp.precision, lay, DEVICE) if isinstance(sp.precision, Wide)
            else poisoned(shape, sp.precision, lay)
            for sp, (_, lay, _) in zip(specs, out_defs, strict=True)]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs, residual)
    assert len(launch.launches) == 1
    launch()
    checked = 0
    for out, sp in zip(outs, specs, strict=True):
        want = shifted_oracle(acc, sp, res_vals)
        assert torch.equal(stored_values(out), want), (name, sp.precision)
        checked += int(want.unique().numel() > 2)
    assert checked == len(specs)


BLOCK_END_CASES = {  # workload, config, residual, kinds, int32, (mid, relu)
    # a 3x3 block end with u8 activations and a u8 residual: the stored u8 mid, a derived u2
    # (bit planes) and a derived s8 at another scale, in 32-bit arithmetic
    "three_outputs_u8_res_int32": (
        ConvWorkload(N=3, H=5, W=6, C=19, K=40, R=3, S=3, pad=1, a="u8"), TINY, "u8",
        ("mid", "u2", "s8"), True, ("u8", True)),
    # the same outputs in the wide (31-bit multiplier) path, an s8 residual, an s8 mid
    "three_outputs_s8_res_wide": (
        ConvWorkload(N=3, H=5, W=6, C=19, K=40, R=3, S=3, pad=1, a="u8"), TINY, "s8",
        ("s8", "mid", "u2"), False, ("s8", False)),
    # a strided 3x3 with derived outputs only (no stored mid), ReLU on an s8 mid, int32
    "derived_only_strided": (
        ConvWorkload(N=3, H=7, W=9, C=24, K=33, R=3, S=3, pad=1, stride=2), TINY, "s8",
        ("wave", "u2"), True, ("s8", True)),
    # a pointwise conv with its kernel's split-K config (the fused launch runs one split)
    "pointwise_split_wide": (
        ConvWorkload(N=3, H=3, W=5, C=40, K=64, R=1, S=1), SPLIT3_LAST, "u8",
        ("mid", "wave"), False, ("u8", True)),
    # a GEMM, one derived output, no residual
    "gemm_one_derived": (GemmWorkload(M=21, N=45, K=83, a="u8"), TINY, None, ("s8",), True,
                         ("s8", True)),
}


def check_block_end(wl, kernel, res_prec, kinds, int32, mid, relu, device, seed=3,
                    conversion_free: bool | None = True) -> int:
    """`bind_conv_outputs` of block-end specs (test_triton_netops_block_end) on fresh random
    inputs: the exact mode (INT32 where int32), one formula per tile, the reference's values.
    Returns the formula's mode."""
    x, w, params = random_inputs(wl, seed=seed, device=device)
    acc = run(wl, x, w, params).to(torch.int64).cpu()  # the int32 accumulator
    shape = tuple(acc.shape)
    res_vals = residual = None
    res_top = 0
    if res_prec is not None:
        p = Precision.parse(res_prec)
        res_vals = random_values(shape, p, torch.Generator().manual_seed(seed + 1))
        res_top = max(-p.qmin, p.qmax)
        residual = PackedTensor(pack(res_vals, p, INT8).to(device), shape, p, INT8)
    specs = block_end_specs(shape[-1], acc_bound(wl), res_top, int32, mid, relu, kinds,
                            seed + 2, y_typical=int(acc.abs().max()) // 2 + 1)
    outs = [poisoned(shape, sp.precision, LAYOUT_OF[kd]) if device == DEVICE else
            K.empty_packed(shape, sp.precision, LAYOUT_OF[kd], device)
            for sp, kd in zip(specs, kinds, strict=True)]
    launch = bind_conv_outputs(kernel, x, w, params, specs, outs, residual,
                               conversion_free=conversion_free)
    (one,) = launch.launches
    assert (one.kwargs["MODE0"] == L.INT32) == int32
    assert [one.kwargs[f"SAME{j}"] for j in range(3)] == [0, 1, 1][:len(kinds)] + \
        [0] * (3 - len(kinds))
    launch()
    ref = epilogue_outputs(acc, None, specs, residual=res_vals)
    for out, want in zip(outs, ref, strict=True):
        assert torch.equal(stored_values(out), want), out.precision
    assert all(int(v.unique().numel()) >= 3 for v in ref)
    return one.kwargs["MODE0"]


@pytest.mark.parametrize("name", sorted(BLOCK_END_CASES))
def test_block_end_outputs_equal_the_reference(name):
    wl, cfg, res_prec, kinds, int32, (mid, relu) = BLOCK_END_CASES[name]
    wl = wl.replace(epilogue=Epilogue())
    check_block_end(wl, kernel_for(wl, cfg), res_prec, kinds, int32, mid, relu, DEVICE)


@pytest.mark.parametrize("conversion_free", [True, False], ids=["bit_tricks", "conversions"])
@pytest.mark.parametrize("res_prec", ["u8", "s8"])
def test_wide_block_end_in_either_float64_form(res_prec, conversion_free):
    """The wide block end's float64 requantization with or without conversion instructions
    (FAST_NARROW / FAST_NARROW_CVT, `epilogue.CONVERSION_FREE_FUSED_OUTPUTS`): the same
    exact values."""
    wl = ConvWorkload(N=2, H=5, W=7, C=24, K=40, R=1, S=1, a="u8")
    mode = check_block_end(wl, kernel_for(wl, TINY), res_prec, ("mid", "u2"), False, "u8",
                           True, DEVICE, seed=11, conversion_free=conversion_free)
    assert mode == (L.FAST_NARROW if conversion_free else L.FAST_NARROW_CVT)


@pytest.mark.parametrize("old_triton", [True, False], ids=["triton<3.9", "triton>=3.9"])
def test_default_float64_form_converts_only_block_ends_on_older_triton(old_triton,
                                                                      monkeypatch):
    """conversion_free=None: FAST_NARROW_CVT for a block end (a residual read) where Triton
    compiles the conversion-free one fatter (`epilogue.CONVERSION_FREE_FUSED_OUTPUTS` off),
    FAST_NARROW for every layer without a residual and on newer Triton; exact either way."""
    from lowbit.kernels.triton import conv_outputs

    monkeypatch.setattr(conv_outputs, "CONVERSION_FREE_FUSED_OUTPUTS", not old_triton)
    wl = ConvWorkload(N=2, H=5, W=7, C=24, K=40, R=1, S=1, a="u8")
    modes = [check_block_end(wl, kernel_for(wl, TINY), res, ("mid", "u2"), False, "u8", True,
                             DEVICE, seed=13, conversion_free=None) for res in ("s8", None)]
    assert modes == ([L.FAST_NARROW_CVT, L.FAST_NARROW] if old_triton else
                     [L.FAST_NARROW, L.FAST_NARROW])


def test_float_output_equals_the_separate_pass():
    wl = ConvWorkload(N=1, H=4, W=5, C=24, K=33, R=3, S=3, pad=1, a="u8")
    kernel = kernel_for(wl, TINY)
    x, w, params = random_inputs(wl, seed=5, device=DEVICE)
    acc = run(wl, x.cpu(), w.cpu(), params).to(torch.int32).to(DEVICE)
    g = torch.Generator().manual_seed(6)
    spec = K.Dequantized(torch.rand(33, generator=g) * 1e-3, torch.rand(33, generator=g),
                         relu=True, channels_first=True)
    fused = torch.full((1, 33, 4, 5), float("nan"), device=DEVICE)
    bind_conv_outputs(kernel, x, w, params, [spec], [fused])()
    separate = K.layer_epilogue(acc, [spec])[0]
    assert torch.equal(fused, separate) and int((fused > 0).sum()) > 100


def test_refusals_name_their_reason():
    wl = ConvWorkload(N=1, H=4, W=4, C=16, K=32, R=3, S=3, pad=1)
    kernel = kernel_for(wl, TINY)
    assert "1..3" in fused_reason(kernel, 4)
    second = kernel_for(wl, TINY.replace(SPLIT_K=2, LOOP_ORDER="crs"))
    assert fused_reason(second, 1) is None  # the fused launch runs its own tile, one split
    assert fused_config(second.config)["SPLIT_K"] == 1
    assert "float" in fused_reason(kernel_for(wl, TINY, dot_fp16=True), 1)
    requant = kernel_for(wl.replace(epilogue=Epilogue(relu=True, out="u8")), TINY)
    assert "bare int32" in fused_reason(requant, 1)
    assert "implicit-GEMM" in fused_reason(object(), 1)
    x, w, params = random_inputs(wl, seed=1, device=DEVICE)
    spec = requantized("u8", 32, 2**20, 1, 0, True)
    with pytest.raises(ValueError, match="cannot run this layer epilogue"):
        bind_conv_outputs(requant, x, w, params, [spec], [poisoned((1, 4, 4, 32), "u8", INT8)])
    with pytest.raises(ValueError, match="outs\\[0\\]"):
        bind_conv_outputs(kernel, x, w, params, [spec], [poisoned((1, 4, 4, 16), "u8", INT8)])


@pytest.mark.gpu
@pytest.mark.parametrize("int32", [True, False], ids=["requant32", "wide"])
@pytest.mark.parametrize("res_prec", ["u8", "s8"])
def test_gpu_resnet50_narrow_block_end(res_prec, int32):
    """ResNet-50's layer1 block end at batch 8 (default config): an 8-bit residual into the
    stored u8 mid, a derived u2 in bit planes and a derived s8; and a strided 3x3."""
    wl = ConvWorkload(N=8, H=56, W=56, C=64, K=256, R=1, S=1, a="u8")
    kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    check_block_end(wl, kernel, res_prec, ("mid", "u2", "s8"), int32, "u8", True, "cuda")
    wl3 = ConvWorkload(N=5, H=28, W=28, C=128, K=128, R=3, S=3, pad=1, stride=2, a="u8")
    kernel = CONV2D_INT8.build(wl3, CONV2D_INT8.default_config(wl3))
    check_block_end(wl3, kernel, res_prec, ("wave", "u2"), int32, "s8", True, "cuda")


@pytest.mark.gpu
def test_gpu_resnet50_block_end_default_config():
    wl = ConvWorkload(N=8, H=56, W=56, C=64, K=256, R=1, S=1, a="u8")
    kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    assert fused_reason(kernel, 2) is None
    x, w, params = random_inputs(wl, seed=7, device="cuda")
    acc = run(wl, x, w, params).to(torch.int64).cpu()
    shape = tuple(acc.shape)
    res_vals = random_values(shape, S24, torch.Generator().manual_seed(8))
    y_top = int(acc.abs().max()) + 1
    res_top = int(res_vals.abs().max())
    specs = [requantized("u8", 256, y_top, 1, res_top, True),
             requantized(S24, 256, y_top, 2, res_top, False)]
    outs = [K.empty_packed(shape, sp.precision, INT8, "cuda") for sp in specs]
    bind_conv_outputs(kernel, x, w, params, specs, outs, wide_packed(res_vals, S24))()
    for out, sp in zip(outs, specs, strict=True):
        assert torch.equal(stored_values(out), shifted_oracle(acc, sp, res_vals))
