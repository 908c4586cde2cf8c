"""Block ends in the Triton layer epilogue (`netops.bind_layer_epilogue`) and the int8 kernels'
own requantized epilogue, bit for bit against `lowbit.reference.netops.epilogue_outputs` /
`lowbit.reference.run`:

- narrow residuals (u8 in uint8 storage, s8 in int8), wide ones too;
- derived outputs (a table over a mid value) beside the stored mid value, sharing one formula
  per tile (the launch's SAME flags), in any order, across launches, beside float outputs;
- the 32-bit requantization (INT32 mode: multipliers from `fixed_point_pair32`) and the wide
  paths (31-bit multipliers: float64 / int64), ReLU on and off, odd shapes, int16 y.
CPU under TRITON_INTERPRET=1; GPU (`gpu`): a ResNet-50 block end at batch 8.
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
    Precision,
    WidePrecision,
)
from lowbit.core.epilogue import EpilogueParams
from lowbit.kernels.base import acc_bound
from lowbit.kernels.triton import layer_outputs as L
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton.epilogue import (
    BIAS_SHIFTED,
    BIAS_SHIFTED_FLOAT64,
    BIAS_SHIFTED_INT32,
)
from lowbit.kernels.triton.templates import IgemmKernel, problem, with_float64_requant
from lowbit.reference import RequantizedOutput, epilogue_outputs, fixed_point_pair, run
from lowbit.reference.netops import fixed_point_pair32, round_shift_sum
from test_triton_netops import assert_stored, packed, poisoned, rand, stored_values, wide_packed
from triton_cases import DEVICE

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
S24 = WidePrecision(24)
#: a block end's outputs: the stored mid value, a u2 derived from it (bit planes, the next
#: bit-serial conv's input), an s8 derived at another scale (a consumer's own) and an s8
#: through a table that is not monotone (an activation of the mid value)
KINDS = ("mid", "u2", "s8", "wave")
LAYOUT_OF = {"mid": INT8, "u2": BITPLANE, "s8": INT8, "wave": INT8}


def tables(mid: Precision) -> dict[str, torch.Tensor]:
    """Each derived kind's table over mid's values (index q - mid.qmin)."""
    q = torch.arange(mid.qmin, mid.qmax + 1, dtype=torch.int64)
    return {"u2": (q.clamp_min(0) * 4 // (mid.qmax + 1)).clamp(0, 3),
            "s8": torch.round(q.double() * 0.7 - 9).long().clamp(-128, 127),
            "wave": ((q.abs() * 3) - 100).clamp(-128, 127)}


def block_end_specs(k: int, y_top: int, res_top: int, int32: bool, mid: str, relu: bool,
                    kinds=KINDS, seed: int = 0, y_typical: int | None = None
                    ) -> list[RequantizedOutput]:
    """Outputs of one formula (m, s, b, r spanning mid's range from |y| <= y_typical, default
    y_top, and |res| <= res_top): 32-bit fixed point (`fixed_point_pair32` for |y| <= y_top)
    or 31-bit multipliers."""
    g = torch.Generator().manual_seed(seed)
    p = Precision.parse(mid)
    span = p.qmax - p.qmin
    ra = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * span / (
        2 * (y_typical or y_top))
    rb = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * span / (2 * max(res_top, 1))
    if int32:
        m, r, s = fixed_point_pair32(ra, rb, y_top, res_top, bias_steps=span / 8)
    else:
        m, r, s = fixed_point_pair(ra, rb)
    b = ((torch.rand(k, generator=g, dtype=torch.float64) - 0.5) * span / 4
         * torch.pow(2.0, s)).to(torch.int64)
    r = r if res_top else None
    t = tables(p)
    return [RequantizedOutput(p, m, s, r, relu, bias=b) if kind == "mid" else
            RequantizedOutput("u2" if kind == "u2" else "s8", m, s, r, relu, mid=p,
                              table=t[kind], bias=b) for kind in kinds]


def outs_for(specs, kinds, shape):
    return [poisoned(shape, sp.precision, LAYOUT_OF[kind]) for sp, kind in
            zip(specs, kinds, strict=True)]


def check_outputs(outs, specs, y, res, min_levels: int = 3) -> int:
    """Every output equals the reference (storage too); returns the outputs checked."""
    ref = epilogue_outputs(y, None, specs, residual=res)
    for out, want in zip(outs, ref, strict=True):
        assert_stored(out, want)
    assert all(int(v.unique().numel()) >= min_levels for v in ref)
    return len(ref)


MIDS = [("u8", True), ("s8", False), ("s8", True)]


@pytest.mark.parametrize("mid,relu", MIDS, ids=["u8_relu", "s8", "s8_relu"])
@pytest.mark.parametrize("int32", [True, False], ids=["requant32", "wide"])
@pytest.mark.parametrize("res_prec", ["u8", "s8"])
def test_pass_block_end_outputs(res_prec, int32, mid, relu):
    """Derived outputs first, then the stored mid value: one formula per tile, the same
    values as the reference; INT32 exactly where the vectors fit."""
    shape = (3, 5, 7, 45)
    p = Precision.parse(res_prec)
    y_top, res_top = 2**15, max(-p.qmin, p.qmax)
    g = torch.Generator().manual_seed(len(res_prec) + 3 * int32)
    y = torch.randint(-y_top, y_top + 1, shape, generator=g, dtype=torch.int64)
    y.view(-1)[:2] = torch.tensor([y_top, -y_top])
    res = rand(shape, res_prec, 5)
    kinds = ("u2", "wave", "mid")
    specs = block_end_specs(shape[-1], y_top, res_top, int32, mid, relu, kinds, seed=7)
    outs = outs_for(specs, kinds, shape)
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs,
                                   packed(res, res_prec, INT8), y_bound=y_top)
    (one,) = launch.launches
    kw = one.kwargs
    assert [kw[f"SAME{j}"] for j in range(4)] == [0, 1, 1, 0] and kw["KIND3"] == L.KIND_NONE
    assert [kw[f"TABLE{j}"] for j in range(3)] == [True, True, False]
    assert (kw["MODE0"] == L.INT32) == int32
    launch()
    assert check_outputs(outs, specs, y, res) == 3


@pytest.mark.parametrize("kinds", [("mid",), ("u2",), ("s8", "u2"), ("mid", "s8")])
def test_pass_one_and_two_outputs_int16_y(kinds):
    """A stored mid alone, a derived output alone (no stored mid), two derived; an int16
    accumulator over its whole range, a u8 residual, 32-bit requantization."""
    shape = (5, 3, 70)
    y_top = 2**15
    g = torch.Generator().manual_seed(len(kinds))
    y = torch.randint(-y_top, y_top, shape, generator=g, dtype=torch.int64)
    y.view(-1)[:2] = torch.tensor([y_top - 1, -y_top])
    res = rand(shape, "u8", 9)
    specs = block_end_specs(70, y_top, 255, True, "u8", True, kinds, seed=len(kinds) + 20)
    outs = outs_for(specs, kinds, shape)
    launch = K.bind_layer_epilogue(y.to(torch.int16).to(DEVICE), specs, outs,
                                   packed(res, "u8", INT8), y_bound=y_top, tile_values=512,
                                   num_warps=2)
    assert launch.launches[0].kwargs["MODE0"] == L.INT32
    launch()
    assert check_outputs(outs, specs, y, res) == len(kinds)


def test_pass_formulas_across_launches_and_float_outputs():
    """Five outputs of one formula, a second formula and a float output: seven outputs in
    two launches; a formula shared into the second launch is computed again there (SAME 0),
    a float slot between requantized ones keeps the formula value of the slot before."""
    shape = (3, 4, 5, 37)
    k = shape[-1]
    y_top = 2**20
    g = torch.Generator().manual_seed(30)
    y = torch.randint(-y_top, y_top + 1, shape, generator=g, dtype=torch.int64)
    res = rand(shape, "s8", 31)
    kinds = ("mid", "u2", "s8", "wave", "u2")
    first = block_end_specs(k, y_top, 128, True, "s8", False, kinds, seed=32)
    second = block_end_specs(k, y_top, 128, False, "u8", True, ("u2",), seed=33)
    scale = torch.rand(k, generator=g, dtype=torch.float64) * 1e-4
    fspec = K.Dequantized(scale, None, 0.25, relu=True)
    specs = [first[0], second[0], first[1], fspec, *first[2:]]
    outs = [poisoned(shape, sp.precision, LAYOUT_OF[kd]) for sp, kd in
            ((first[0], "mid"), (second[0], "u2"), (first[1], "u2"))]
    fout = torch.full(shape, float("nan"), device=DEVICE)
    outs += [fout] + [poisoned(shape, sp.precision, LAYOUT_OF[kd])
                      for sp, kd in zip(first[2:], kinds[2:], strict=True)]
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs,
                                   packed(res, "s8", INT8), y_bound=y_top)
    first_kw, second_kw = (s.kwargs for s in launch.launches)
    assert [first_kw[f"SAME{j}"] for j in range(4)] == [0, 1, 1, 1]
    assert [second_kw[f"SAME{j}"] for j in range(4)] == [0, 0, 0, 0]
    assert second_kw["KIND2"] == L.KIND_FLOAT and second_kw["KIND3"] == L.KIND_NONE
    launch()
    req = [s for s in specs if isinstance(s, RequantizedOutput)]
    assert check_outputs([o for o in outs if o is not fout], req, y, res, 2) == 6
    f = (y.double() * scale + res.double() * 0.25).float().clamp_min(0)
    assert torch.equal(fout.cpu(), f) and int((f > 0).sum()) > 100


def test_pass_wide_residual_into_derived_outputs():
    """A 24-bit residual (the wide stream) into a stored s8 mid and two derived outputs: the
    int64 / float64 paths with tables."""
    shape = (2, 3, 5, 40)
    y_top = 2**24
    g = torch.Generator().manual_seed(40)
    y = torch.randint(-y_top, y_top + 1, shape, generator=g, dtype=torch.int64)
    res = torch.randint(S24.qmin, S24.qmax + 1, shape, generator=g, dtype=torch.int64)
    specs = block_end_specs(40, y_top, 2**23, False, "s8", True, KINDS[:3], seed=41)
    outs = outs_for(specs, KINDS[:3], shape)
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs,
                                   wide_packed(res, S24), y_bound=y_top)
    assert launch.launches[0].kwargs["MODE0"] in (L.FAST, L.FAST_NARROW, L.DIRECT)
    launch()
    checked = 0
    for out, sp in zip(outs, specs, strict=True):  # the reference takes |res| <= 255
        k = shape[-1]
        terms = [y * sp.multiplier, sp.bias.expand_as(y), res * sp.residual_multiplier]
        q = round_shift_sum(terms, torch.as_tensor(sp.shift).expand(k)).clamp(sp.low, sp.high)
        want = q if sp.table is None else sp.table[q - sp.mid.qmin]
        assert_stored(out, want)
        checked += int(want.unique().numel() > 2)
    assert checked == 3


def test_pass_requant32_off_and_checks():
    """requant32=False keeps the wide modes (the same values); a derived output's buffer must
    hold its own precision; the one-output slot of the stem refuses a table."""
    shape = (4, 33)
    y_top = 2**14
    y = torch.randint(-y_top, y_top + 1, shape, generator=torch.Generator().manual_seed(50))
    res = rand(shape, "u8", 51)
    specs = block_end_specs(33, y_top, 255, True, "u8", True, ("mid", "u2"), seed=52)
    outs = outs_for(specs, ("mid", "u2"), shape)
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs,
                                   packed(res, "u8", INT8), y_bound=y_top, requant32=False)
    assert launch.launches[0].kwargs["MODE0"] in (L.FAST, L.FAST_NARROW)
    launch()
    assert check_outputs(outs, specs, y, res) == 2
    with pytest.raises(ValueError, match="outs\\[1\\] holds u8"):
        K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, [outs[0], outs[0]],
                              packed(res, "u8", INT8))
    with pytest.raises(ValueError, match="derived output"):
        K.output_slot(0, specs[1], outs[1], shape, outs[1].data.device, True)


def test_pass_int32_rounding_ties():
    """INT32 mode on exact half-way sums: small shifts (1..4) and multipliers put a quarter
    of the values on a tie, which rounds up (floor of + 2^(s-1)), both signs, with the
    residual term, the bias and clamping on both sides."""
    shape = (3, 7, 9, 45)
    k = shape[-1]
    g = torch.Generator().manual_seed(80)
    y_top = 700
    y = torch.randint(-y_top, y_top + 1, shape, generator=g, dtype=torch.int64)
    res = rand(shape, "s8", 81)
    s = torch.randint(1, 5, (k,), generator=g)
    m = torch.randint(1, 4, (k,), generator=g)
    r = torch.randint(-3, 4, (k,), generator=g)
    b = torch.randint(-20, 21, (k,), generator=g)
    u8 = Precision.parse("u8")
    t = tables(Precision.parse("s8"))
    specs = [RequantizedOutput("s8", m, s, r, False, bias=b),
             RequantizedOutput("u8", m, s, r, True, bias=b),
             RequantizedOutput("s8", m, s, r, False, mid="s8", table=t["wave"], bias=b)]
    outs = [poisoned(shape, sp.precision, INT8) for sp in specs]
    launch = K.bind_layer_epilogue(y.to(torch.int32).to(DEVICE), specs, outs,
                                   packed(res, "s8", INT8), y_bound=y_top)
    assert [launch.launches[0].kwargs[f"MODE{j}"] for j in range(3)] == [L.INT32] * 3
    launch()
    assert check_outputs(outs, specs, y, res) == 3
    z = y * m + b + res * r
    ties = (z % (1 << s)) == (1 << (s - 1))
    q = (z >> s) + 1  # the tie rounded up
    assert int((ties & (q > -128) & (q < 127)).sum()) > 500  # inside the range, not clamped
    assert int((ties & (q > 0) & (q < 255)).sum()) > 250 and u8.qmax == 255


# ------------------------------------------------------------------------- kernel epilogue
TINY = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, num_warps=4, num_stages=2, GROUP_M=2,
              LOOP_ORDER="rsc", SPLIT_K=1)
KERNEL_CASES = {
    # an odd 3x3 conv with u8 activations (zero point), K not a multiple of the tile
    "conv_u8_relu": (ConvWorkload(N=3, H=5, W=6, C=19, K=40, R=3, S=3, pad=1, a="u8"),
                     Epilogue(relu=True, out="u8", shifted_bias=True), TINY),
    # a pointwise conv into packed u4 through split-K summed by a second kernel
    "pointwise_u4_split": (ConvWorkload(N=3, H=3, W=5, C=40, K=48, R=1, S=1),
                           Epilogue(out="u4", out_layout="packed", shifted_bias=True),
                           TINY.replace(SPLIT_K=2, LOOP_ORDER="crs")),
    # a GEMM into s3 bit planes
    "gemm_s3_planes": (GemmWorkload(M=21, N=45, K=83),
                       Epilogue(relu=True, out="s3", out_layout="bitplane", shifted_bias=True),
                       Config({k: v for k, v in TINY.items() if k != "LOOP_ORDER"})),
}


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_epilogue_requantizes_in_int32(name):
    """The int8 kernels' own shifted-bias epilogue in int32 (HAS_BIAS BIAS_SHIFTED_INT32)
    where acc_bound m + |b| + 2^(s-1) < 2^31, equal to `reference.run`; 31-bit multipliers
    keep the float64 / int64 forms."""
    wl, epi, cfg = KERNEL_CASES[name]
    wl = wl.replace(epilogue=epi)
    check_int32_epilogue(IgemmKernel("test", wl, cfg, problem(wl, False)), DEVICE)


def test_kernel_epilogue_int32_rounding_ties():
    """The kernels' INT32 epilogue on exact half-way sums: a 2-bit GEMM (|acc| <= 240) with
    shifts 1..3, both signs of the bias, ties rounded up."""
    from lowbit.reference import random_inputs

    wl = GemmWorkload(M=37, N=45, K=40, a="u2", w="s2").replace(
        epilogue=Epilogue(out="s8", shifted_bias=True))
    kernel = IgemmKernel("test", wl, KERNEL_CASES["gemm_s3_planes"][2], problem(wl, False))
    x, w, _ = random_inputs(wl, seed=90, device=DEVICE)
    g = torch.Generator().manual_seed(91)
    s = torch.randint(1, 4, (45,), generator=g)
    m = torch.randint(1, 4, (45,), generator=g)
    b = torch.randint(-9, 10, (45,), generator=g)
    cpu = EpilogueParams(multiplier=m.to(torch.int32), shift=s.to(torch.int32), shifted_bias=b)
    params = EpilogueParams(multiplier=cpu.multiplier.to(DEVICE), shift=cpu.shift.to(DEVICE),
                            shifted_bias=b.to(DEVICE))
    assert with_float64_requant(wl, kernel.problem, params, (None,) * 4, DEVICE)[0].bias == \
        BIAS_SHIFTED_INT32
    want = run(wl, x.cpu(), w.cpu(), cpu)
    assert torch.equal(kernel(x, w, params).cpu(), want)
    acc = run(wl.replace(epilogue=Epilogue()), x.cpu(), w.cpu(), EpilogueParams()).long()
    z = acc * m + b
    ties = (z % (1 << s)) == (1 << (s - 1))
    assert int((ties & (want > -128) & (want < 127)).sum()) > 200


def check_int32_epilogue(kernel: IgemmKernel, device: str) -> None:
    """`kernel` (a shifted-bias requantized workload) on fresh random inputs with 32-bit
    multipliers (`fixed_point_pair32` at the workload's acc_bound) equals the reference."""
    from lowbit.reference import random_inputs

    wl = kernel.workload
    epi = wl.epilogue
    k = wl.K if isinstance(wl, ConvWorkload) else wl.N
    x, w, _ = random_inputs(wl, seed=60, device=device)
    top = acc_bound(wl)
    g = torch.Generator().manual_seed(61)
    span = epi.out.qmax - epi.out.qmin
    # the accumulators spread ~sqrt(C R S) of the bound: scales that span the output range
    ratio = (torch.rand(k, generator=g, dtype=torch.float64) + 0.5) * span * 8 / top
    m, _, s = fixed_point_pair32(ratio, 0.0, top, 0, bias_steps=span / 4)
    b = ((torch.rand(k, generator=g, dtype=torch.float64) - 0.5) * span / 2
         * torch.pow(2.0, s)).to(torch.int64)
    cpu = EpilogueParams(multiplier=m.to(torch.int32), shift=s.to(torch.int32), shifted_bias=b)
    params = EpilogueParams(multiplier=cpu.multiplier.to(device), shift=cpu.shift.to(device),
                            shifted_bias=b.to(device))
    prob, vecs = with_float64_requant(wl, kernel.problem, params, (None,) * 4, device)
    assert prob.bias == BIAS_SHIFTED_INT32 and vecs[2].dtype == torch.int32
    want = run(wl, x.cpu(), w.cpu(), cpu)
    got = kernel(x, w, params, out=torch.full(want.shape, 0x5A, dtype=want.dtype,
                                                device=device))
    assert torch.equal(got.cpu(), want)
    acc = run(wl.replace(epilogue=Epilogue()), x.cpu(), w.cpu(), EpilogueParams())
    levels = ((acc.to(torch.int64) * m + b + (1 << (s - 1))) >> s).clamp(
        max(epi.out.qmin, 0) if epi.relu else epi.out.qmin, epi.out.qmax)
    assert int(levels.unique().numel()) >= min(4, span)  # the outputs span the range
    wide_m, _, wide_s = fixed_point_pair(ratio, 0.0)
    wide = EpilogueParams(multiplier=wide_m.to(torch.int32), shift=wide_s.to(torch.int32),
                          shifted_bias=torch.zeros(k, dtype=torch.int64))
    assert with_float64_requant(wl, kernel.problem, wide, (None,) * 4, "cpu")[0].bias \
        in (BIAS_SHIFTED, BIAS_SHIFTED_FLOAT64)


# ------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("int32", [True, False], ids=["requant32", "wide"])
@pytest.mark.parametrize("res_prec", ["u8", "s8"])
def test_gpu_pass_resnet50_block_end(res_prec, int32):
    shape = (8, 56, 56, 256)
    p = Precision.parse(res_prec)
    y_top, res_top = 2**16, max(-p.qmin, p.qmax)
    g = torch.Generator().manual_seed(70)
    y = torch.randint(-y_top, y_top + 1, shape, generator=g, dtype=torch.int64)
    res = rand(shape, res_prec, 71)
    specs = block_end_specs(256, y_top, res_top, int32, "u8", True, KINDS[:3], seed=72)
    outs = outs_for(specs, KINDS[:3], shape)
    launch = K.bind_layer_epilogue(y.to(torch.int32).cuda(), specs, outs,
                                   packed(res, res_prec, INT8), y_bound=y_top)
    assert (launch.launches[0].kwargs["MODE0"] == L.INT32) == int32
    launch()
    ref = epilogue_outputs(y, None, specs, residual=res)
    for out, want in zip(outs, ref, strict=True):
        assert torch.equal(stored_values(out), want)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_gpu_kernel_epilogue_requantizes_in_int32(name):
    """The same workloads at ResNet / MobileNet sizes with the templates' default configs."""
    from lowbit.kernels.triton import CONV2D_INT8, GEMM_INT8

    wl, epi, _ = KERNEL_CASES[name]
    sizes = {"conv_u8_relu": dict(N=8, H=56, W=56, C=64, K=64),
             "pointwise_u4_split": dict(N=8, H=56, W=56, C=24, K=144),  # MobileNet-V2
             "gemm_s3_planes": dict(M=256, N=1000, K=2048)}
    wl = wl.replace(epilogue=epi, **sizes[name])
    template = GEMM_INT8 if isinstance(wl, GemmWorkload) else CONV2D_INT8
    check_int32_epilogue(template.build(wl, template.default_config(wl)), "cuda")


@pytest.mark.gpu
def test_gpu_tma_conv_epilogue_requantizes_in_int32():
    """The TMA conv template shares the kernels' epilogue and its exact-mode choice."""
    from lowbit.kernels.triton import CONV2D_INT8_TMA

    wl = ConvWorkload(N=4, H=14, W=14, C=64, K=128, R=3, S=3, pad=1).replace(
        epilogue=Epilogue(relu=True, out="u8", shifted_bias=True))
    assert CONV2D_INT8_TMA.unsupported_reason(wl) is None
    check_int32_epilogue(CONV2D_INT8_TMA.build(wl, CONV2D_INT8_TMA.default_config(wl)), "cuda")
