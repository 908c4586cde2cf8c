"""Global average pools with their map split over several programs (`pools.global_pool_splits`:
int32 partial sums per chunk of pixels, summed and requantized by a second kernel), bit for
bit against `lowbit.reference.avgpool2d_int` on fresh random inputs: INT8, BITPLANE and wide
inputs, odd shapes (odd batch, a last chunk shorter than the others, channels not a multiple
of 64), ReLU on and off; which launch ran is counted in the bound launcher.

CPU: under TRITON_INTERPRET=1. GPU (`gpu` mark): EfficientNet-B0's first squeeze-excite pool
(batch 64, 112 x 112 x 32, wide s16 input)."""

from __future__ import annotations

import pytest
import torch

from lowbit.core import Layout, Precision, WidePrecision
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton import pools
from lowbit.reference import avgpool2d_int, avgpool_multiplier, random_values
from test_triton_netops import assert_stored, packed, poisoned, stored_values, wide_packed
from triton_cases import DEVICE, HAS_CUDA

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
S16, S24 = WidePrecision(16), WidePrecision(24)


def values(shape, prec, seed: int) -> torch.Tensor:
    """Uniform values over prec's range plus a per-channel offset (so the channels' means
    differ and the pooled outputs spread over the output range)."""
    g = torch.Generator().manual_seed(seed)
    x = random_values(shape, prec, g)
    span = int(prec.qmax) - int(prec.qmin)
    shift = torch.randint(-span // 4, span // 4 + 1, (shape[-1],), generator=g)
    return (x + shift).clamp(int(prec.qmin), int(prec.qmax))


def pool_case(x: torch.Tensor, out_prec, relu: bool):
    """(multiplier, shift, reference output) mapping the largest |mean| to ~1.25 x qmax."""
    hw = x.shape[1] * x.shape[2]
    top = float(x.sum(dim=(1, 2)).abs().max()) / hw
    m, s = avgpool_multiplier(hw, 1.0, 0.8 * top / int(out_prec.qmax))
    ref = avgpool2d_int(x, None, None, 0, m, s, out_prec)
    return m, s, ref.clamp_min(0) if relu else ref


def stored_input(x: torch.Tensor, prec, layout: Layout):
    return wide_packed(x, prec) if isinstance(prec, WidePrecision) else packed(x, prec, layout)


REDUCE, FINISH = pools.global_avgpool_kernel, pools.global_pool_finish_kernel


def launched(launcher) -> list[tuple[object, tuple[int, ...]]]:
    """(kernel, grid) of each launch of a bound launcher."""
    return [(s.fn, s.grid) for s in launcher.launches]


# (input precision, input layout, output precision, output layout, relu)
SPLIT_CASES = [
    ("s8", INT8, "s8", INT8, False),
    ("u8", INT8, "u8", INT8, True),
    ("u8", INT8, "s8", BITPLANE, True),
    ("s4", BITPLANE, "s8", INT8, False),
    (S16, INT8, "s8", INT8, False),
    (S16, INT8, "u4", BITPLANE, True),
]


def split_case(xp, lin, op, lout, relu, seed):
    """(stored input, poisoned output, bound launcher, reference) of a 3 x 37 x 29 x 70 pool:
    6 programs of 1,073 pixels, split 4 ways in 320-pixel chunks (the last 113 pixels) with
    the H100's constants, so two launches, the reduction's grid split 4 ways."""
    x = values((3, 37, 29, 70), xp, seed)
    m, s, ref = pool_case(x, op, relu)
    out = poisoned(ref.shape, op, lout)
    stored = stored_input(x, xp, lin)
    bound = K.bind_avgpool2d(stored, out, None, None, 0, m, s, relu)
    assert launched(bound) == [(REDUCE, (3, 2, 4)), (FINISH, (3, 2))]
    return stored, out, bound, ref, (m, s)


@pytest.mark.parametrize("xp,lin,op,lout,relu", SPLIT_CASES)
def test_split_global_pool_bit_exact(xp, lin, op, lout, relu):
    xp = Precision.parse(xp) if isinstance(xp, str) else xp
    op = Precision.parse(op)
    _, out, bound, ref, _ = split_case(xp, lin, op, lout, relu, 11)
    bound()
    assert_stored(out, ref)
    low = 0 if relu else int(op.qmin)
    assert int(ref.unique().numel()) > min(20, (int(op.qmax) - low) // 2)


def test_bound_split_pool_replays_on_new_input():
    """The launcher's scratch holds no state between calls: a replay on new input is exact."""
    op = Precision.parse("s8")
    stored, out, bound, _, (m, s) = split_case(S16, INT8, op, INT8, False, 12)
    bound()
    x2 = values((3, 37, 29, 70), S16, 13)
    stored.data.copy_(wide_packed(x2, S16).data)
    bound()
    assert_stored(out, avgpool2d_int(x2, None, None, 0, m, s, op))


def test_split_sums_are_exact():
    """Requantized with m / 2^s = 1 into 24-bit output: the pooled value is the map's sum
    itself, so any pixel lost or counted twice at a chunk's edge shows."""
    x = values((3, 37, 29, 70), Precision.parse("u8"), 21)
    out = K.empty_packed((3, 1, 1, 70), S24, INT8, DEVICE)
    bound = K.bind_avgpool2d(packed(x, "u8", INT8), out, None, None, 0, 1 << 30, 30)
    assert len(bound.launches) == 2
    bound()
    assert torch.equal(stored_values(out), x.sum(dim=(1, 2), keepdim=True))


def test_many_splits_fold_in_several_loads(monkeypatch):
    """36 splits of 64 pixels: the finishing kernel folds them in two loads of 32."""
    monkeypatch.setattr(pools, "SPLIT_POOL_CHUNK", 64)
    x = values((1, 50, 45, 40), Precision.parse("s8"), 31)
    out_prec = Precision.parse("s8")
    m, s, ref = pool_case(x, out_prec, False)
    out = poisoned(ref.shape, out_prec, INT8)
    bound = K.bind_avgpool2d(packed(x, "s8", INT8), out, None, None, 0, m, s)
    (_, grid), (_, _) = launched(bound)
    assert grid == (1, 1, 36) and bound.launches[1].kwargs["BLOCK_S"] == 32
    bound()
    assert_stored(out, ref)


def test_small_map_keeps_one_reduction():
    """5 x 9 x 11 x 45 (99 pixels, under SPLIT_POOL_MIN_CHUNK): one launch, no scratch."""
    x = values((5, 9, 11, 45), Precision.parse("u8"), 41)
    out_prec = Precision.parse("s8")
    m, s, ref = pool_case(x, out_prec, False)
    out = poisoned(ref.shape, out_prec, INT8)
    bound = K.bind_avgpool2d(packed(x, "u8", INT8), out, None, None, 0, m, s)
    assert launched(bound) == [(REDUCE, (5, 1, 1))]
    assert bound.launches[0].kwargs["PARTIAL"] is False
    bound()
    assert_stored(out, ref)


@pytest.mark.parametrize("n,c,hw,splits", [
    (64, 32, 112 * 112, 25),   # EfficientNet-B0 features_1 squeeze-excite: 1,600 programs
    (64, 96, 56 * 56, 7),      # features_2_0
    (64, 144, 56 * 56, 7),     # features_2_1
    (64, 144, 28 * 28, 3),     # features_3_0
    (64, 72, 28 * 28, 3),      # MobileNet-V3-Large features_4
    (64, 480, 14 * 14, 1),     # 196 pixels: under SPLIT_POOL_MIN_CHUNK
    (64, 1280, 7 * 7, 1),      # MobileNet-V2 / EfficientNet-B0 head pool
    (8, 2048, 7 * 7, 1),       # ResNet-50 b8 head pool
    (256, 32, 112 * 112, 25),  # a large batch still keeps chunks of <= SPLIT_POOL_CHUNK
])
def test_split_counts(n, c, hw, splits):
    bc = min(64, max(32, 1 << (c - 1).bit_length()))
    got, chunk = pools.global_pool_splits(n, -(-c // bc), hw, 64)
    assert got == splits
    assert (got - 1) * chunk < hw <= got * chunk
    assert got == 1 or (chunk % 64 == 0 and chunk <= pools.SPLIT_POOL_CHUNK)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_efficientnet_b0_squeeze_excite_pool_on_gpu():
    """64 x 112 x 112 x 32 wide s16 (the plan's features_1 squeeze-excite pool input) into s8,
    split 25 ways, bit-exact; and u8 into bit planes with ReLU."""
    for xp, op, lout, relu in ((S16, "s8", INT8, False), ("u8", "u4", BITPLANE, True)):
        xp = Precision.parse(xp) if isinstance(xp, str) else xp
        x = values((64, 112, 112, 32), xp, 51)
        m, s, ref = pool_case(x, Precision.parse(op), relu)
        out = poisoned(ref.shape, Precision.parse(op), lout)
        bound = K.bind_avgpool2d(stored_input(x, xp, INT8), out, None, None, 0, m, s, relu)
        assert launched(bound)[0] == (REDUCE, (64, 1, 25))
        bound()
        torch.cuda.synchronize()
        assert_stored(out, ref)


def test_plan_squeeze_excite_pools_split_exactly():
    """A plan's AvgPool steps on 32 x 32 maps (a squeeze-excite pool and the head's adaptive
    pool, each split 4 ways) under the GPU executor equal the reference executor's."""
    from any_cnn_cases import compiled, quantized
    from lowbit.graph.ir import AvgPool
    from lowbit.runtime.engine import ReferenceExecutor
    from lowbit.runtime.gpu import GpuExecutor
    from test_squeeze_excite import ReluBlock

    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    torch.manual_seed(0)
    q = quantized(ReluBlock(), x.cpu()).to(DEVICE)
    plan = compiled(q, x).plan
    pooled = [s.output for s in plan.steps if isinstance(s, AvgPool)
              and plan.tensors[s.input].shape[1:3] == (32, 32)]
    assert len(pooled) == 2
    executor = GpuExecutor(plan, DEVICE)
    split = [b.launches[0].launches[0].grid for b in executor.steps
             if isinstance(b.step, AvgPool) and len(b.launches[0].launches) == 2]
    assert split == [(1, 1, 4)] * 2
    y, rec = executor(x, record=True)
    y_ref, rec_ref = ReferenceExecutor(plan, DEVICE)(x, record=True)
    assert torch.equal(y, y_ref)
    for name in pooled:
        assert torch.equal(rec[name], rec_ref[name]), name
