"""The tap-shift wgmma conv (template cuda.bitserial_tap_shift, `tap_shift.py`,
`bitserial_tap_shift.cu`): its geometry checked exhaustively in Python over random shapes, its
CUDA text bit-exact in the host emulation and on a GPU, its constraints and its NVRTC compile
for sm_90a."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.core import Epilogue, Layout, Precision
from lowbit.core.workloads import load_workloads
from lowbit.kernels.cuda import (
    TAP_SHIFT,
    WGMMA,
    WGMMA_PERSISTENT,
    bitserial_emu,
    bitserial_render,
    bitserial_tables,
    migrate_config,
    tap_shift,
)
from lowbit.kernels.cuda import bitserial_layout as layout
from lowbit.kernels.cuda.bitserial_shape import PairRange, Shape, conv_shape, pair_range, rect_slots
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.kernels.cuda.nvrtc import device_arch
from test_cuda_bitserial import (
    ARCH90,
    EPILOGUES,
    _assert_exact,
    build,
    conv,
    encodings,
    gemm,
    plain,
    specs,
    split,
    why_invalid,
)
from test_cuda_bitserial_emu import _check, edit_kernel

B1, U1, U2, S2, S3, U4 = (Precision(1, "binary"), Precision(1), Precision(2),
                          Precision(2, "signed"), Precision(3, "signed"), Precision(4))
U3 = Precision(3)
S2_OUT = Epilogue(bias=True, out=Precision(2, "signed"), out_layout=Layout.BITPLANE)
SHIFT = "bitserial_tap_shift.cu"  # the tap-shift kernels' file, which mutation tests edit


def _shape(n, h, w, c, r, s, pad):
    return Shape(n, h, w, c, 8, r, s, 1, pad, h + 2 * pad - r + 1, w + 2 * pad - s + 1)


def _position(plan: tap_shift.ShiftPlan, sh: Shape, f: int) -> tuple[int, int, int] | None:
    """The input pixel (n, y, c) at virtual position f, None in the margin (slab_pixel)."""
    if f < 0:
        return None
    n, rest = divmod(f, plan.vp * plan.vq)
    y, c = divmod(rest, plan.vq)
    return (n, y, c) if n < sh.nb and y < sh.h and c < sh.w else None


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       c=st.sampled_from([1, 20, 32, 33, 64, 128, 256, 384, 512, 1024]),
       r=st.integers(1, 5), s=st.integers(1, 5), pad=st.integers(0, 3),
       bm=st.sampled_from([64, 128, 256]))
def test_plan_reads_every_tap_and_channel_once(n, h, w, c, r, s, pad, bm):
    """For every valid output pixel and every 128-bit half of every step: the slab entry its A
    rows read holds the input pixel of the tap whose weight words the B half holds (or margin
    zeros where that pixel is padding), channel for channel; every (tap, channel word) is met
    exactly once; LBO > 0 and every entry read lies inside the slab."""
    sh = _shape(n, h, w, c, r, s, pad)
    if sh.p < 1 or sh.q < 1 or r * s == 1 or tap_shift.unsupported_reason(sh):
        return
    plan = tap_shift.shift_plan(sh, bm)
    cw, seen = sh.words, []
    for step in plan.steps:
        assert step.lbo > 0
        for half in (step.lo, step.hi):
            chunk, shift = divmod(half.offset, plan.slab_pix)
            assert bm - 1 + shift < plan.slab_pix
            for i in range(half.words):  # word i of the half
                tap, word = divmod(half.word + i, cw)
                tr, ts = divmod(tap, sh.s)
                pos = shift + (i // cw if cw <= 2 else 0)  # entries hold 4 / CW positions
                a_word = i % cw if cw <= 2 else 4 * (2 * step.group + chunk) + i
                assert (pos, a_word) == (tr * plan.vq + ts, word)
                seen.append((tap, word))
    assert sorted(seen) == [(t, k) for t in range(r * s) for k in range(cw)]
    for n_, ho, wo in itertools.product(range(sh.nb), range(sh.p), range(sh.q)):
        v = (n_ * plan.vp + ho) * plan.vq + wo
        assert v < plan.v_rows
        for tr, ts in itertools.product(range(r), range(s)):
            y, x = ho + tr - pad, wo + ts - pad
            want = (n_, y, x) if 0 <= y < sh.h and 0 <= x < sh.w else None
            assert _position(plan, sh, v - plan.base + tr * plan.vq + ts) == want


def test_tap_shift_family_runs_where_it_applies():
    """The tap-shift family supports stride-1 convs with a window, C <= 64 or a multiple of
    128, bit planes, sm_90a; its kernels fix KT=1, no halo load and no split-K; its block grid
    covers the virtual rows."""
    wl = conv(B1, U2, EPILOGUES[1], C=128)
    assert TAP_SHIFT.supports(wl) and TAP_SHIFT.archs == (ARCH90,)
    for other, why in ((conv(B1, U2, C=128, stride=2), "stride 1"),
                       (conv(B1, U2, C=96), "multiple of 128"),
                       (conv(B1, U2, C=128, R=1, S=1, pad=0), "1x1"), (gemm(B1, U2), "1x1")):
        assert why in TAP_SHIFT.unsupported_reason(other)
    cfg = plain(wl).replace(TAP_SHIFT=1, KT=1, STAGES=3)
    assert why_invalid(wl, cfg) is None and split(cfg)[0] is TAP_SHIFT
    assert TAP_SHIFT.fixed["KT"] == 1 and TAP_SHIFT.fixed["HALO"] == 0
    assert TAP_SHIFT.fixed["SPLIT_K"] == 1
    assert "no bit-serial family" in why_invalid(wl, cfg.replace(HALO=1))
    assert "no bit-serial family" in why_invalid(wl, cfg.replace(KT=2))
    assert "no bit-serial family" in why_invalid(wl, cfg.replace(MMA="mma_sync", SWIZZLE=0))
    # the block grid covers the virtual rows: (N * VP - margin rows) * VQ > N * P * Q
    plan = tap_shift.shift_plan(conv_shape(wl), cfg["BM"])
    assert layout.tile_grid(wl, cfg)[1] == -(-plan.v_rows // cfg["BM"])
    assert plan.v_rows > wl.N * wl.P * wl.Q


def test_slab_row_sums_only_in_the_persistent_tap_shift_kernel():
    """ROWSUM="slab" is offered for binary weights and valid only where it is implemented;
    it needs no ones tiles and no row-sum accumulators, but 4 bytes per slab position."""
    wl = conv(B1, U2, EPILOGUES[1], C=128)
    assert "slab" in TAP_SHIFT.space(wl, ARCH90).knob("ROWSUM").values
    assert "slab" not in TAP_SHIFT.space(conv(S2, U2, C=128), ARCH90).knob("ROWSUM").values
    mma = plain(wl).replace(TAP_SHIFT=1, KT=1, STAGES=3, PERSIST=1, HALO=0)
    slab = mma.replace(ROWSUM="slab")
    assert why_invalid(wl, mma) is None and why_invalid(wl, slab) is None
    for bad in (slab.replace(PERSIST=0), slab.replace(STAGES=4)):
        assert "ROWSUM='slab' needs" in why_invalid(wl, bad)
    assert "ROWSUM='slab' not in" in why_invalid(wl, slab.replace(TAP_SHIFT=0))
    assert layout.acc_regs(wl, slab) == layout.acc_regs(wl, mma) - 4 * 2  # u2: 2 planes
    plan = tap_shift.shift_plan(conv_shape(wl), slab["BM"])
    ones = 256 * len(plan.ones_tiles)
    buffers = 2  # C = 128: each thread counts its own copies, two buffers by tile parity
    assert (layout.smem_bytes(wl, slab) - layout.smem_bytes(wl, mma)
            == buffers * -(-plan.slab_pix // 4) * 16 - ones)


@pytest.mark.slow  # 10 NVRTC compiles of tap-shift kernels: ~60 s cold on 2 loaded cores
def test_nvrtc_compiles_tap_shift_for_sm90a():
    """Sampled tap-shift configs compile for sm_90a: one tile per block and persistent, two
    tiles in flight, two teams."""
    rng, built = random.Random(3), 0
    for wl in (conv(B1, B1, EPILOGUES[5], N=4, H=14, W=14, C=256, K=256),
               conv(S2, U2, EPILOGUES[1], N=2, H=9, W=9, C=64, K=64),
               conv(B1, U2, EPILOGUES[3], N=1, H=7, W=7, C=512, K=128)):
        space = TAP_SHIFT.space(wl, ARCH90).all_configs()
        pingpong = [c for c in space if c["STAGES"] == 4]
        teams = [c for c in space if c["TEAMS"] == 2]
        for cfg in [*rng.sample(space, 2), *rng.sample(pingpong, min(1, len(pingpong))),
                    *rng.sample(teams, min(1, len(teams)))]:
            kernel = TAP_SHIFT.build(wl, cfg, arch=ARCH90)
            assert kernel._main.cubin[:4] == b"\x7fELF"
            assert kernel._main.name == TAP_SHIFT.kernel_name(cfg)
            assert kernel._main.name.startswith("bitserial_wgmma_shift")
            built += 1
    assert built >= 10


# (id, workload, knob changes to the wgmma default): every slab layout (C <= 32: 4 positions
# per entry; C = 64: 2; 128: tap pairs; 256-1024: chunk-major groups, an odd chunk count),
# kernel sizes 1x3 to 7x7, padding 0 to 3, binary activations' border sums, binary weights'
# row sums (masked ones tiles, and the table), every epilogue, several warpgroups
EMU_CASES = [
    ("c32_b1b1_border", conv(B1, B1, EPILOGUES[5], N=3, H=5, W=6, C=32, K=24), {}),
    ("c20_s3u4_int8", conv(S3, U4, EPILOGUES[3], N=2, H=5, W=7, C=20, K=33), {}),
    ("c64_b1u2_5x5", conv(B1, U2, EPILOGUES[0], N=2, H=6, W=7, C=64, K=37, R=5, S=5, pad=2),
     {}),
    ("c64_pad0_s2s2", conv(S2, S2, EPILOGUES[1], N=2, H=7, W=6, C=64, K=40, pad=0),
     {"SWIZZLE": 0}),
    ("c128_u1b1_7x7", conv(U1, B1, EPILOGUES[1], N=1, H=9, W=8, C=128, K=16, R=7, S=7,
                           pad=3), {}),
    ("c128_b1b1_rowsum_table", conv(B1, B1, EPILOGUES[1], N=2, H=5, W=6, C=128, K=40),
     {"ROWSUM": "table"}),
    ("c256_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=2, H=4, W=5, C=256, K=64),
     {"REQUANT": "threshold"}),
    ("c384_u2u2_fp16", conv(U2, U2, EPILOGUES[2], N=2, H=4, W=4, C=384, K=40), {}),
    ("c64_b1u2_int16_relu", conv(B1, U2, Epilogue(relu=True, out="int16"), N=2, H=5, W=6,
                                 C=64, K=40), {}),
    ("c512_b1b1_4wg", conv(B1, B1, EPILOGUES[4], N=2, H=6, W=6, C=512, K=64),
     {"BM": 128, "BN": 64, "WN": 32}),
    ("c128_1x3_pad2", conv(B1, U2, EPILOGUES[1], N=2, H=5, W=6, C=128, K=32, R=1, S=3,
                           pad=2), {}),
    # persistent blocks (the emulation runs 2 per column tile): resident weights, the slab
    # double buffer reused over 4-9 row tiles, the last tiles' loads skipped
    ("persistent_c64_b1b1", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=32),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32}),
    ("persistent_c512_u2s2_2cols", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32}),
    ("persistent_c128_b1u2_packed", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=48),
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 16}),
    # STAGES=4: the next tile's MMAs in the other accumulator set during this tile's epilogue
    # (the emulation runs a wgmma at its wait: a slab reloaded too early would show)
    ("pingpong_c64_b1b1", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=32),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 32, "WN": 32}),
    ("pingpong_c512_u2s2_2cols", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 32, "WN": 32}),
    ("pingpong_c128_b1u2_packed", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=48),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 64, "WN": 16}),
    # ROWSUM="slab": binary weights' row popcounts from the slab, every slab layout (one and
    # two words per position, chunk-major groups with an odd chunk count), two warpgroups in M,
    # thresholds
    ("slab_c32_b1b1", conv(B1, B1, EPILOGUES[5], N=3, H=7, W=9, C=32, K=24),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "slab"}),
    ("slab_c64_b1u2_2wg", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 32, "ROWSUM": "slab", "REQUANT": "threshold"}),
    ("slab_c384_b1s2", conv(B1, S2, EPILOGUES[3], N=2, H=5, W=6, C=384, K=40),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "slab"}),
    ("slab_c128_b1b1_5x5", conv(B1, B1, EPILOGUES[1], N=2, H=7, W=8, C=128, K=40, R=5, S=5,
                                pad=2),
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "ROWSUM": "slab", "REQUANT": "threshold"}),
    # ROW_TABLE=1: output rows and tap rectangles from the bound per-row table: border sums
    # and their thresholds of binary activations up to 7x7, one tile per block, persistent,
    # two tiles in flight, slab row sums
    ("table_c32_b1b1_border", conv(B1, B1, EPILOGUES[5], N=3, H=5, W=6, C=32, K=24),
     {"ROW_TABLE": 1}),
    ("table_c128_u1b1_7x7_fp16", conv(U1, B1, EPILOGUES[2], N=1, H=9, W=8, C=128, K=16, R=7,
                                      S=7, pad=3), {"ROW_TABLE": 1}),
    ("table_persistent_c64_b1b1_threshold", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64,
                                                 K=32),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 1, "REQUANT": "threshold"}),
    ("table_pingpong_c128_s2b1_5x5", conv(S2, B1, EPILOGUES[1], N=2, H=7, W=8, C=128, K=48,
                                          R=5, S=5, pad=2),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 64, "WN": 16, "ROW_TABLE": 1,
      "REQUANT": "threshold"}),
    ("table_slab_c64_b1u2_2wg", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 32, "ROWSUM": "slab", "REQUANT": "threshold",
      "ROW_TABLE": 1}),
    # ROW_TABLE=2: the slab copies' input pixels from the table too, on every slab layout (4
    # and 2 positions per entry, tap pairs, chunk-major groups), persistent blocks (pixels
    # fetched an iteration early), two tiles in flight, slab row sums counted from own copies
    ("pixels_c32_b1b1_border", conv(B1, B1, EPILOGUES[5], N=3, H=5, W=6, C=32, K=24),
     {"ROW_TABLE": 2}),
    ("pixels_persistent_c64_b1b1", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=32),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 2, "REQUANT": "threshold"}),
    ("pixels_persistent_c512_u2s2_2cols", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512,
                                               K=64),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 2}),
    ("pixels_pingpong_c128_b1u2_packed", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128,
                                              K=48),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 64, "WN": 16, "ROW_TABLE": 2}),
    ("pixels_slab_c64_b1u2_2wg", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 32, "ROWSUM": "slab", "REQUANT": "threshold",
      "ROW_TABLE": 2}),
    # TEAMS=2: two teams per block take its row tiles in turn (MMA issue ordered by named
    # barriers): an even tile count per block (4: two each) and odd ones (3: team 0 has the
    # last tile, whose order arrival must be left out), two column tiles, the packing tile in
    # shared memory per team, slab row sums (own copies' and a pass over the slab), row tables
    ("teams_c64_b1b1_even", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=32),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32}),
    ("teams_c512_u2s2_2cols_odd", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32}),
    ("teams_c128_b1u2_packed", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=48),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 16}),
    ("teams_slab_c64_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 64, "WN": 64, "ROWSUM": "slab",
      "REQUANT": "threshold", "ROW_TABLE": 2}),
    ("teams_slab_c384_b1s2_2wg", conv(B1, S2, EPILOGUES[3], N=2, H=5, W=6, C=384, K=40),
     {"PERSIST": 1, "TEAMS": 2, "BM": 128, "BN": 32, "WN": 32, "ROWSUM": "slab",
      "ROW_TABLE": 1}),
    # THR_SMEM: persistent blocks read their columns' thresholds from shared memory: three
    # column tiles (the last one partial: its padding columns), after one packing tile or two
    # teams' tiles
    ("thr_smem_c512_u2s2_3cols_packed", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=70),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 16, "REQUANT": "threshold"}),
    ("thr_smem_teams_c128_b1u2_3cols", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=70),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 16, "REQUANT": "threshold"}),
    # binary activations: one shared table per tap rectangle, the rows' slots from the row
    # table (both kinds), two-bit outputs, 5x5 (81 slots), teams
    ("thr_slots_c64_b1b1_u2_3cols", conv(B1, B1, EPILOGUES[1], N=3, H=11, W=13, C=64, K=70),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 1, "REQUANT": "threshold"}),
    ("thr_slots_teams_c128_b1b1_5x5", conv(B1, B1, EPILOGUES[5], N=2, H=7, W=8, C=128, K=40,
                                           R=5, S=5, pad=2),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 16, "ROW_TABLE": 2,
      "REQUANT": "threshold"}),
    ("thr_slots_pad0_c64_s4b1", conv(S2, B1, EPILOGUES[1], N=2, H=7, W=6, C=64, K=40, pad=0),
     {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 2, "REQUANT": "threshold"}),
    # FUSE_PLANES: the two activation planes summed in one accumulator by the MMAs (plane 1
    # issued twice): one tile per block with two weight planes and channel groups, persistent
    # blocks with shared thresholds, teams with slab row sums, two tiles in flight
    ("fused_c512_u2s2_2groups", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64),
     {"FUSE_PLANES": 1}),
    ("fused_persistent_c64_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64,
                                                 K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 64, "REQUANT": "threshold", "FUSE_PLANES": 1}),
    ("fused_teams_slab_c128_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=70),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "slab",
      "REQUANT": "threshold", "ROW_TABLE": 1, "FUSE_PLANES": 1}),
    ("fused_pingpong_c64_u2u2", conv(U2, U2, EPILOGUES[4], N=2, H=7, W=8, C=64, K=40),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 32, "WN": 16, "FUSE_PLANES": 1}),
    # ROWSUM="cols": the row popcounts from ones columns after the weights in the products'
    # wgmma (N = WN + 16): every slab layout (4 and 2 positions per entry: ones tiles of part
    # words, C = 512: two channel groups), one tile per block and persistent, teams, two tiles
    # in flight, thresholds per tap rectangle
    ("cols_c32_b1b1_border", conv(B1, B1, EPILOGUES[5], N=3, H=5, W=6, C=32, K=24),
     {"ROWSUM": "cols", "BN": 32, "WN": 32}),
    ("cols_persistent_c64_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64,
                                                K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 64, "ROWSUM": "cols", "REQUANT": "threshold",
      "ROW_TABLE": 1}),
    ("cols_teams_c512_b1s2_2groups", conv(B1, S2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "cols"}),
    ("cols_pingpong_c128_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=48),
     {"PERSIST": 1, "STAGES": 4, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "cols"}),
    ("cols_teams_c128_b1b1_5x5_slots", conv(B1, B1, EPILOGUES[5], N=2, H=7, W=8, C=128, K=40,
                                            R=5, S=5, pad=2),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "cols",
      "ROW_TABLE": 1, "REQUANT": "threshold"}),
    # THR_PAIRS: two columns per add in 16-bit halves, lanes owning contiguous channels (the
    # weights' B rows permuted): 16 channels per lane (WN = 64, two lanes per word) with ones
    # columns and a partial last word; 32 (WN = 128) over two column tiles, the second
    # partial; binary activations' threshold slots with one-bit outputs; four-bit activations
    # with signed two-bit outputs and two teams; fused planes of unsigned weights
    ("pairs_c64_b1u2_cols", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 64, "ROWSUM": "cols", "REQUANT": "threshold",
      "ROW_TABLE": 1, "THR_PAIRS": 1}),
    ("pairs_c64_b1u2_wn128_2cols", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=200),
     {"PERSIST": 1, "BM": 64, "BN": 128, "WN": 128, "ROWSUM": "cols", "REQUANT": "threshold",
      "THR_PAIRS": 1}),
    ("pairs_c64_b1b1_slots", conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=70),
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "ROW_TABLE": 1, "REQUANT": "threshold",
      "THR_PAIRS": 1}),
    ("pairs_teams_c64_b1u4_s2out", conv(B1, U4, S2_OUT, N=2, H=9, W=10, C=64, K=70),
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 64, "WN": 64, "REQUANT": "threshold",
      "THR_PAIRS": 1}),
    ("pairs_fused_c64_u1u2", conv(U1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 64, "REQUANT": "threshold", "FUSE_PLANES": 1,
      "THR_PAIRS": 1}),
    # ... and signed operands: two planes of signed weights (the products' sum offset by its
    # least value), signed activations with binary weights' ones columns, unsigned two-bit
    # weights and fused activation planes with signed two-bit outputs over two column tiles
    ("pairs_c64_s2u2", conv(S2, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"PERSIST": 1, "BM": 128, "BN": 64, "WN": 64, "REQUANT": "threshold", "THR_PAIRS": 1}),
    ("pairs_c128_b1s2_cols", conv(B1, S2, EPILOGUES[5], N=2, H=7, W=8, C=128, K=70),
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "ROWSUM": "cols", "REQUANT": "threshold",
      "THR_PAIRS": 1}),
    ("pairs_fused_c64_u2u2_s2out_wn128", conv(U2, U2, S2_OUT, N=2, H=9, W=10, C=64, K=200),
     {"PERSIST": 1, "BM": 64, "BN": 128, "WN": 128, "REQUANT": "threshold", "FUSE_PLANES": 1,
      "THR_PAIRS": 1}),
    # ... and from global memory: binary activations of a 5 x 5 conv whose 81 rectangle slots
    # exceed THR_SMEM_BYTES at BN = 64 (the wtap kernel's packed part 4), persistent; one tile
    # per block with unsigned activations (the bind-time pair table)
    ("pairs_global_c128_b1b1_5x5", conv(B1, B1, EPILOGUES[5], N=2, H=7, W=8, C=128, K=70, R=5,
                                        S=5, pad=2),
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "ROW_TABLE": 1, "REQUANT": "threshold",
      "THR_PAIRS": 1}),
    ("pairs_global_one_tile_c64_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48),
     {"BM": 128, "BN": 64, "WN": 64, "ROWSUM": "cols", "REQUANT": "threshold", "THR_PAIRS": 1}),
]


def _shift_config(wl, changes, arch=ARCH90):
    """The kernel parameters of a tap-shift kernel: the plain wgmma default made tap-shift,
    then `changes`."""
    cfg = plain(wl, "wgmma", arch).replace(
        REQUANT="multiply", TAP_SHIFT=1, KT=1, STAGES=3, HALO=0, PERSIST=0).replace(**changes)
    assert why_invalid(wl, cfg, arch) is None, why_invalid(wl, cfg, arch)
    return cfg


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("wl,changes", [c[1:] for c in EMU_CASES], ids=[c[0] for c in EMU_CASES])
def test_emulated_tap_shift_is_bit_exact(wl, changes):
    assert _check(wl, _shift_config(wl, changes), seed=len(wl.key))


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("mutation", ["lbo", "margin"])
def test_emulation_catches_a_wrong_shift(mutation, monkeypatch):
    """A descriptor LBO one entry off, or a virtual grid without the margin column, breaks the
    result: the exact cases above are not exact by accident."""
    wl = conv(B1, U2, EPILOGUES[1], N=2, H=5, W=6, C=128, K=40)
    cfg = _shift_config(wl, {})
    plan = tap_shift.shift_plan(conv_shape(wl), cfg["BM"])
    if mutation == "lbo":
        step = plan.steps[0]
        lo = step.lo
        bad = tap_shift.Step(step.group, step.slab, lo, tap_shift.Half(step.hi.offset + 1,
                                                                      step.hi.word, 4))
        plan = tap_shift.ShiftPlan(**{**plan.__dict__, "steps": (bad, *plan.steps[1:])})
    else:
        plan = tap_shift.ShiftPlan(**{**plan.__dict__, "vq": wl.W, "base": wl.W + 1})
    for module in (bitserial_render, layout, bitserial_tables):  # the kernel, grid, tables
        monkeypatch.setattr(module, "shift_plan", lambda sh, bm: plan)
    assert not _check(wl, cfg, seed=1)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("edit", [
    ("one ? ~0u : 0u;", "one || row < 8 ? ~0u : 0u;"),
    ("slot(B_ROWS, BN + row, T_, wd)", "slot(B_ROWS, BN + (row ^ 8), T_, wd)")],
    ids=["ones_in_every_word", "ones_in_the_zero_rows"])
def test_emulation_catches_wrong_ones_columns(edit, monkeypatch):
    """ROWSUM="cols" with ones in weight words a step does not use (C = 32: steps of three
    taps leave a half's words unused, whose A bits then count), or the ones written into the
    zero rows (the row popcounts' registers then hold zeros), is caught."""
    wl = conv(B1, U2, EPILOGUES[0], N=2, H=5, W=6, C=32, K=40)  # int32 out: every sum shows
    cfg = _shift_config(wl, {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "cols"})
    assert _check(wl, cfg, seed=3)
    edit_kernel(monkeypatch, *edit, file=SHIFT)
    assert not _check(wl, cfg, seed=3)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("edit,c", [
    (("s < S; ++s) sum += p[", "s < S - 1; ++s) sum += p["), 256),
    (("(lc * SLAB_PIX + j) * 4", "(lc * SLAB_PIX + j + 1) * 4"), 256),
    (("pop[idx / PER_ENTRY] = weighted", "pop[idx / PER_ENTRY + 1] = weighted"), 64)],
    ids=["tap_left_out", "position_off_by_one", "own_position_off_by_one"])
def test_emulation_catches_a_wrong_slab_rowsum(edit, c, monkeypatch):
    """ROWSUM="slab" with one tap left out of a row's sum, or a position's popcount read
    (C = 256) or stored (C = 64: each thread's own copies) one position on, is caught: the slab
    cases above are not exact by accident. (The two popcount buffers of C <= 128 guard a race
    between warps a tile apart, which the emulation's schedule does not produce.)"""
    wl = conv(B1, U2, EPILOGUES[1], N=2, H=5 if c > 128 else 11, W=6, C=c, K=40)
    cfg = _shift_config(wl, {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROWSUM": "slab"})
    edit_kernel(monkeypatch, *edit, file=SHIFT)
    assert not _check(wl, cfg, seed=2)


def test_team_cases_cover_both_tile_parities():
    """The TEAMS emulation cases give their persistent blocks (2 per column tile) even and odd
    numbers of row tiles, so both teams' last tiles and the left-out order arrival are run."""
    parities = set()
    for _, wl, changes in (c for c in EMU_CASES if c[0].startswith("teams")):
        cfg = _shift_config(wl, changes)
        rows = layout.tile_grid(wl, cfg)[1]
        grid_y = layout.persistent_grid(wl, cfg, 2)[1]
        parities |= {len(range(y, rows, grid_y)) % 2 for y in range(grid_y)}
    assert parities == {0, 1}


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("edit,c,wn", [
    (("+ team * SLAB_BUFFERS * SLABS_WORDS;", ";"), 512, 32),
    (("+ team * PACK_WORDS;", ";"), 128, 16)],
    ids=["teams_share_slabs", "teams_share_packing_tile"])
def test_emulation_catches_teams_in_each_others_way(edit, c, wn, monkeypatch):
    """TEAMS=2 with both teams loading into the same slab buffers, or packing their output
    bits into the same shared-memory tile, is caught."""
    wl = conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=c, K=64)
    cfg = _shift_config(wl, {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": wn})
    edit_kernel(monkeypatch, *edit, file=SHIFT)
    assert not _check(wl, cfg, seed=4)


def test_threshold_slots():
    """Shared threshold tables: one per column without binary activations; with them one per
    tap rectangle some output pixel has (16 for a padded 3x3, 81 for 5x5 pad 2), every row's
    rectangle among them, and the row table gives slots; none without a row table or past
    THR_SMEM_BYTES."""
    for name in ("thr_smem_c512_u2s2_3cols_packed", "thr_slots_c64_b1b1_u2_3cols",
                 "thr_slots_teams_c128_b1b1_5x5", "thr_slots_pad0_c64_s4b1"):
        wl, changes = next(c[1:] for c in EMU_CASES if c[0] == name)
        cfg = _shift_config(wl, changes)
        sh = conv_shape(wl)
        slots = layout.threshold_slots(wl, cfg)
        if name.startswith("thr_smem"):
            assert slots == 1
            continue
        ids = rect_slots(sh)
        assert slots == len(ids) == {(3, 1): 16, (5, 2): 81, (3, 0): 1}[sh.r, sh.pad]
        table = bitserial_tables.row_table(wl, cfg.replace(ROW_TABLE=1), "cpu")
        rects = bitserial_tables.row_table(wl, cfg.replace(ROW_TABLE=1, REQUANT="multiply"),
                                           "cpu")
        kept = rects[:, 0] < sh.rows
        assert set(rects[kept, 1].tolist()) <= set(ids)
        assert [ids[i] for i in table[kept, 1].tolist()] == rects[kept, 1].tolist()
        assert layout.threshold_slots(wl, cfg.replace(ROW_TABLE=0)) == 0
        assert layout.threshold_slots(wl, cfg.replace(BN=64)) == (0 if sh.r == 5 else slots)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("edit,teams", [
    (("const int j = n0 * THR_STRIDE + i % SLOT_WORDS;", "const int j = i % SLOT_WORDS;"), 1),
    (("(PACK_IN_SMEM ? TEAMS * PACK_WORDS : 0)", "0"), 2)],
    ids=["first_column_tile_for_all", "over_the_packing_tile"])
def test_emulation_catches_wrong_shared_thresholds(edit, teams, monkeypatch):
    """THR_SMEM with every block copying the first column tile's thresholds, or its copy
    placed over a team's packing tile, is caught."""
    wl = conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=128, K=70)
    cfg = _shift_config(wl, {"PERSIST": 1, "TEAMS": teams, "BM": 64, "BN": 32, "WN": 16,
                             "REQUANT": "threshold"})
    edit_kernel(monkeypatch, *edit, file=SHIFT)
    assert not _check(wl, cfg, seed=6)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("mutation", ["slots_reversed", "rect_ids_kept"])
def test_emulation_catches_wrong_threshold_slots(mutation, monkeypatch):
    """Rectangle slots copied in another order than the row table's, or a row table that
    keeps the rectangle ids, are caught."""
    wl = conv(B1, B1, EPILOGUES[1], N=3, H=11, W=13, C=64, K=70)
    cfg = _shift_config(wl, {"PERSIST": 1, "BM": 64, "BN": 32, "WN": 32, "ROW_TABLE": 1,
                             "REQUANT": "threshold"})
    ids = rect_slots(conv_shape(wl))
    if mutation == "slots_reversed":  # the kernel's RECT_OF_SLOT, not the row table's
        monkeypatch.setattr(bitserial_render, "rect_slots", lambda sh: ids[::-1])
    else:
        real_table = bitserial_emu.row_table

        def rect_ids(wl, c, device):
            table = real_table(wl, c, device)
            table[:, 1] = torch.tensor(ids, dtype=torch.int32)[table[:, 1].long()]
            return table
        monkeypatch.setattr(bitserial_emu, "row_table", rect_ids)
    assert not _check(wl, cfg, seed=7)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
def test_emulation_reports_an_order_arrival_without_its_partner(monkeypatch):
    """A team's order arrival after its last tile, where the other team has no tile left to
    wait for it, leaves a named barrier phase half full: the emulation reports it (on a GPU
    the next block on that SM would inherit the count)."""
    wl = conv(S2, U2, EPILOGUES[1], N=2, H=7, W=9, C=512, K=64)
    cfg = _shift_config(wl, {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 32})
    edit_kernel(monkeypatch, "mma_turn_pass(team, tile + (int)gridDim.y < ROW_TILES)",
                "mma_turn_pass(team, true)", file=SHIFT)
    with pytest.raises(RuntimeError, match="named barrier"):
        _check(wl, cfg, seed=4)


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("edit,case", [
    (("+ pair_column(n % WN);", "+ n % WN;"), "pairs_c64_b1u2_cols"),
    (("b ? 0x3276 : 0x5410", "b ? 0x7632 : 0x5410"), "pairs_c64_b1u2_cols"),
    (("const int c0 = n0 + block_channel(2 * p), c1 = n0 + block_channel(2 * p + 1);",
      "const int c0 = n0 + 2 * p, c1 = n0 + 2 * p + 1;"), "pairs_c64_b1u2_cols"),
    (("int dot[2] = {-PAIR_DOT_LO, -PAIR_DOT_LO};", "int dot[2] = {0, 0};"), "pairs_c64_s2u2")],
    ids=["weights_not_permuted", "odd_lanes_other_half", "thresholds_not_permuted",
         "negative_sums_packed"])
def test_emulation_catches_wrong_channel_pairs(edit, case, monkeypatch):
    """THR_PAIRS with the weights' B rows in channel order (the lanes' bits then belong to
    other channels), the odd lane of a word storing its partner's plane, the thresholds
    copied in channel order, or signed weights' negative sums packed without their offset,
    is caught."""
    wl, changes = next(c[1:] for c in EMU_CASES if c[0] == case)
    cfg = _shift_config(wl, changes)
    edit_kernel(monkeypatch, *edit)
    assert not _check(wl, cfg, seed=5)


def test_threshold_pairs_constraints():
    """THR_PAIRS is offered on sm_90a where the span of compared values fits 16-bit halves
    (ResNet-50 s2 w1a2: [-1728, 1728]; signed two-bit weights x unsigned two-bit activations:
    [-6K, 3K] with K = 9C; C = 1024, four-bit activations at C = 128 or signed two-bit
    weights at C = 512 too wide) and valid in wgmma threshold kernels with 16, 32 or 64
    channels per lane; binary activations too (their thresholds per tap rectangle packed in
    shared memory by tap-shift blocks, by the wtap kernel for the others)."""
    wl = conv(B1, U2, EPILOGUES[1], N=2, H=9, W=10, C=64, K=48)
    assert pair_range(wl) == PairRange(-1728, 1728, 0)
    assert pair_range(conv(B1, B1, EPILOGUES[5], C=64)) == PairRange(-1152, 1152, 0)
    assert pair_range(conv(S2, U2, EPILOGUES[1], C=64)) == PairRange(-6 * 576, 3 * 576,
                                                                     -6 * 576)
    assert pair_range(gemm(B1, U2, EPILOGUES[1], K=300)) == PairRange(-900, 900, 0)
    for none in (conv(B1, U2, EPILOGUES[1], C=1024), conv(B1, U4, EPILOGUES[1], C=128),
                 conv(S2, U2, EPILOGUES[1], C=512)):
        assert pair_range(none) is None
        assert WGMMA.space(none, ARCH90).knob("THR_PAIRS").values == (0,)
    for family in (TAP_SHIFT, WGMMA, WGMMA_PERSISTENT):
        assert family.space(wl, ARCH90).knob("THR_PAIRS").values == (0, 1)
    assert TAP_SHIFT.space(conv(B1, U2, EPILOGUES[0], C=64), ARCH90).knob(
        "THR_PAIRS").values == (0,)  # int32 output: no thresholds
    cfg = _shift_config(wl, dict(next(c[2] for c in EMU_CASES if c[0] == "pairs_c64_b1u2_cols")))
    assert why_invalid(wl, cfg.replace(PERSIST=0, TAP_SHIFT=0)) is None
    assert "needs WN in (64, 128, 256)" in why_invalid(wl, cfg.replace(BN=32, WN=32))
    assert "needs REQUANT='threshold'" in why_invalid(wl, cfg.replace(REQUANT="multiply"))
    assert layout.smem_bytes(wl, cfg) == layout.smem_bytes(wl, cfg.replace(THR_PAIRS=0))
    binary = conv(B1, B1, EPILOGUES[5], N=3, H=11, W=13, C=64, K=70)
    slots = _shift_config(binary, next(c[2] for c in EMU_CASES if c[0] == "pairs_c64_b1b1_slots"))
    assert why_invalid(binary, slots.replace(PERSIST=0, TAP_SHIFT=0)) is None


def test_nvrtc_compiles_threshold_pairs_for_sm90a():
    """Every THR_PAIRS emulation case compiles for sm_90a, its kernel a tap-shift one."""
    built = 0
    for _, wl, changes in (c for c in EMU_CASES if c[0].startswith("pairs")):
        kernel = build(wl, _shift_config(wl, changes), arch=ARCH90)
        assert kernel._main.cubin[:4] == b"\x7fELF"
        assert kernel._main.name.startswith("bitserial_wgmma_shift")
        built += 1
    assert built == sum(c[0].startswith("pairs") for c in EMU_CASES) >= 4


def test_teams_constraints():
    """TEAMS=2 is offered on sm_90a, valid only in the persistent wgmma kernels (tap-shift:
    STAGES=3) with at most 4 warpgroups in all, and doubles the block's threads and its slab
    buffers but not its resident weights."""
    wl = conv(B1, B1, EPILOGUES[5], N=4, H=14, W=14, C=256, K=256)
    assert TAP_SHIFT.space(wl, ARCH90).knob("TEAMS").values == (1, 2)
    one = _shift_config(wl, {"PERSIST": 1, "BM": 128, "BN": 128, "WN": 128, "ROWSUM": "mma"})
    two = one.replace(TEAMS=2)
    assert why_invalid(wl, two) is None
    for bad in (two.replace(PERSIST=0), two.replace(STAGES=4)):
        assert "TEAMS=2 needs" in why_invalid(wl, bad)
    assert "no bit-serial family" in why_invalid(
        wl, two.replace(MMA="mma_sync", TAP_SHIFT=0, SWIZZLE=0, WN=64, KT=2))
    assert why_invalid(wl, two.replace(TAP_SHIFT=0, KT=1, STAGES=4)) is None  # wgmma persistent
    assert "warpgroups" in why_invalid(wl, two.replace(BM=256))
    assert layout.threads(two) == 2 * layout.threads(one) == 512
    plan = tap_shift.shift_plan(conv_shape(wl), one["BM"])
    slab, _ = tap_shift.group_words(plan, 1, 128)
    assert (layout.smem_bytes(wl, two) - layout.smem_bytes(wl, one)
            == plan.groups * slab * layout.slab_buffers(one) * 4)
    # records made before the knob existed read as one team
    legacy = {k: v for k, v in one.items() if k != "TEAMS"}
    assert migrate_config("cuda.bitserial", legacy) == (TAP_SHIFT.name, split(one)[1])


@pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("part", ["output_row", "tap_rectangle", "pixel"])
def test_emulation_catches_a_wrong_row_table(part, monkeypatch):
    """ROW_TABLE with the rows' output rows, or their tap rectangles, shifted by one virtual
    row (rows at image borders then get their neighbour's), or (ROW_TABLE=2) the slab copies'
    pixels shifted by one position, breaks the result."""
    wl = conv(B1, B1, EPILOGUES[5], N=2, H=5, W=6, C=32, K=40)  # packed in registers
    cfg = _shift_config(wl, {"ROW_TABLE": 2 if part == "pixel" else 1, "REQUANT": "threshold",
                             "BN": 32, "WN": 32, "PERSIST": 1})
    original = bitserial_tables.row_table

    def shifted(*args):
        table = original(*args)
        if part == "pixel":  # the flat ROW_TABLE=2 table: the pixels after the row entries
            plan = tap_shift.shift_plan(conv_shape(wl), cfg["BM"])
            start = 2 * -(-plan.v_rows // cfg["BM"]) * cfg["BM"]
            table[start:] = table[start:].roll(1)
        else:
            column = int(part == "tap_rectangle")
            table[:, column] = table[:, column].roll(1)
        return table
    monkeypatch.setattr(bitserial_emu, "row_table", shifted)
    assert not _check(wl, cfg, seed=3)


def test_row_table_values_and_constraints():
    """ROW_TABLE 1 everywhere, 2 (the slab pixels) where TAP_SHIFT is offered and valid only
    with TAP_SHIFT=1; neither with the per-pixel popcount table (whose sums need each row's
    pixel)."""
    wl = conv(B1, B1, EPILOGUES[5], N=2, H=8, W=8, C=64, K=64)
    assert TAP_SHIFT.space(wl, ARCH90).knob("ROW_TABLE").values == (0, 1, 2)
    assert WGMMA.space(wl, ARCH90).knob("ROW_TABLE").values == (0, 1)
    cfg = _shift_config(wl, {"ROW_TABLE": 1})
    assert why_invalid(wl, cfg.replace(ROW_TABLE=2)) is None
    assert why_invalid(wl, cfg.replace(TAP_SHIFT=0, KT=2)) is None
    assert "ROW_TABLE=2 not in" in why_invalid(wl, cfg.replace(ROW_TABLE=2, TAP_SHIFT=0, KT=2))
    assert "ROW_TABLE=1 needs ROWSUM in" in why_invalid(wl, cfg.replace(ROWSUM="table"))
    table = bitserial_tables.row_table(wl, cfg, "cpu")
    plan = tap_shift.shift_plan(conv_shape(wl), cfg["BM"])
    assert table.shape == (-(-plan.v_rows // cfg["BM"]) * cfg["BM"], 2)
    kept = table[:, 0] < conv_shape(wl).rows
    assert sorted(table[kept, 0].tolist()) == list(range(2 * 8 * 8))  # each output row once
    assert bitserial_tables.row_table(wl, cfg.replace(ROW_TABLE=0), "cpu") is None
    both = bitserial_tables.row_table(wl, cfg.replace(ROW_TABLE=2), "cpu")
    assert torch.equal(both[:table.numel()], table.flatten())
    pix = both[table.numel():]  # virtual input position f at f + BASE: each pixel once
    assert sorted(pix[pix >= 0].tolist()) == list(range(2 * 8 * 8))
    assert pix[:plan.base].eq(-1).all()  # positions before the first image


# ---------------------------------------------------------------- GPU: bit-exact

def _sm90a_only():
    if device_arch() != ARCH90:
        pytest.skip("the tap-shift kernels need an sm_90a GPU")


GPU_SHAPES = [dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, pad=2),
              dict(N=2, H=9, W=9, C=128, K=96, R=3, S=3, pad=1),
              dict(N=2, H=6, W=7, C=256, K=64, R=3, S=3, pad=0),
              dict(N=2, H=7, W=7, C=512, K=40, R=3, S=3, pad=1),
              dict(N=1, H=10, W=9, C=32, K=33, R=7, S=7, pad=3)]


@pytest.mark.parametrize("wb,ab", list(itertools.product(range(1, 5), range(1, 5))))
@pytest.mark.gpu
def test_bit_exact_tap_shift(wb, ab):
    """Every bit pair and encoding pair on the slab layouts above: the space's first config one
    tile per block, persistent, and persistent with two tiles in flight (where registers allow),
    with binary weights persistent with the slab row sums, the first and last persistent ones
    with the row table, the first and last with two teams, the first and last with the
    activation planes fused in one accumulator and with the row sums' ones columns in the
    weights' wgmma, the first and last with two columns' thresholds per add, and a random
    valid one."""
    _sm90a_only()
    rng = random.Random(wb * 10 + ab)
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        wl = conv(w_prec, a_prec, EPILOGUES[(wb + ab + combo) % len(EPILOGUES)],
                  **GPU_SHAPES[(wb + ab + combo) % len(GPU_SHAPES)])
        space = specs(wl, [TAP_SHIFT])
        persistent = [c for c in space if c["PERSIST"] and c["STAGES"] == 3]
        pingpong = [c for c in space if c["PERSIST"] and c["STAGES"] == 4]
        slab = [c for c in persistent if c["ROWSUM"] == "slab"]  # binary weights
        table = [c for c in space if c["ROW_TABLE"] and c["PERSIST"]]
        teams = [c for c in persistent if c["TEAMS"] == 2]
        fused = [c for c in space if c["FUSE_PLANES"]]  # unsigned two-bit activations
        cols = [c for c in space if c["ROWSUM"] == "cols"]  # binary weights
        pairs = [c for c in space if c["THR_PAIRS"]]  # one weight plane, thresholds
        for cfg in (space[0], persistent[0], *pingpong[:1], *slab[-1:], *table[:1],
                    *table[-1:], *teams[:1], *teams[-1:], *fused[:1], *fused[-1:],
                    *cols[:1], *cols[-1:], *pairs[:1], *pairs[-1:], rng.choice(space)):
            _assert_exact(wl, cfg, seed=wb * 100 + ab * 10 + combo)


# two-bit weights with three- or four-bit activations: no THR_PAIRS config (values too wide
# at C = 128, accumulators past the register estimate at C = 64)
PAIR_PRECISIONS = [*itertools.product([B1, U1], [B1, U1, U2, U3, U4, S2]),
                   *itertools.product([S2, U2], [B1, U1, U2, S2])]


@pytest.mark.parametrize("w_prec,a_prec", PAIR_PRECISIONS,
                         ids=lambda p: f"{p.encoding.value[0]}{p.bits}")
@pytest.mark.gpu
def test_bit_exact_threshold_pairs(w_prec, a_prec):
    """THR_PAIRS on binary, unsigned and signed weights and activations, one- and two-bit
    (unsigned and signed) outputs, C = 64 and 128 with padding 1 and 2, output columns in
    partial words: the first and last valid configs and a random one (WN = 64 and 128, teams,
    fused planes, ones columns, slab row sums among them)."""
    _sm90a_only()
    rng, tested = random.Random(a_prec.bits + 10 * (w_prec is B1)), 0
    for i, epi in enumerate([EPILOGUES[1], EPILOGUES[5], S2_OUT]):
        shape = [dict(N=2, H=9, W=11, C=64, K=100, pad=1),
                 dict(N=2, H=8, W=7, C=128, K=200, R=5, S=5, pad=2)][(i + a_prec.bits) % 2]
        wl = conv(w_prec, a_prec, epi, **shape)
        # none: values too wide (four-bit activations at C = 128), or binary activations' 81
        # threshold slots of a 5x5 conv past THR_SMEM_BYTES
        pairs = [c for c in specs(wl) if c["THR_PAIRS"]]
        for cfg in pairs[:1] + pairs[-1:] + rng.sample(pairs, min(1, len(pairs))):
            _assert_exact(wl, cfg, seed=i)
        tested += bool(pairs)
    assert tested >= 1


@pytest.mark.gpu
def test_bit_exact_tap_shift_shared_workloads():
    """The tap-shift default on every resnet18_b8 and apconv_sweep layer it runs whose CPU
    reference stays quick."""
    _sm90a_only()
    epi = Epilogue(bias=True, relu=True, out=Precision(2), out_layout=Layout.BITPLANE)
    checked = 0
    for suite in ("resnet18_b8", "apconv_sweep"):
        for name, wl in load_workloads(suite, w=B1, a=U2, w_layout=Layout.BITPLANE,
                                       a_layout=Layout.BITPLANE, epilogue=epi):
            if not TAP_SHIFT.supports(wl) or wl.gemm_shape[0] * wl.gemm_shape[
                    1] * wl.gemm_shape[2] > 5e9:
                continue
            _assert_exact(wl, TAP_SHIFT.spec(TAP_SHIFT.default_config(wl)), seed=len(name))
            checked += 1
    assert checked == 7  # 4 resnet18_b8 layers of stride 1, 3 apconv_sweep layers
