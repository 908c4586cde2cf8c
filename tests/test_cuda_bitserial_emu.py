"""The bit-serial kernels' own CUDA text run on the CPU by the host emulation (bitserial_emu.py):
bit-exact against `lowbit.reference.run` for every family but tap-shift (test_cuda_tap_shift.py)
(mma.sync, wgmma with and without the 32-byte swizzle, persistent blocks of both kinds, the
duplicate-aware load, split-K, k slices, teams, the in-place halo), the row-sum table, every
encoding pair, every epilogue, odd shapes, stride 2 and GEMMs. Before the emulation existed
these kernels were checked only on a GPU. The last tests show the emulation fails when the
kernel is wrong (a .cu file edited for the test: `edit_kernel`)."""

from __future__ import annotations

from importlib import resources

import pytest
import torch

from lowbit.core import Epilogue, Layout, Precision
from lowbit.kernels.cuda import MMA_SYNC, MMA_SYNC_PERSISTENT, WGMMA, bitserial_emu, cu_source
from lowbit.kernels.cuda import bitserial_layout as layout
from lowbit.kernels.cuda import bitserial_tables as tables
from lowbit.kernels.cuda.bitserial_kernel import CHAIN_TRIGGERS
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.reference import random_inputs, run
from test_cuda_bitserial import ARCH90, EPILOGUES, conv, gemm, plain, split, why_invalid

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")

U2, S2, S3, U4 = Precision(2), Precision(2, "signed"), Precision(3, "signed"), Precision(4)
B1, U1 = Precision(1, "binary"), Precision(1)

# (id, workload, MMA, knob changes to that MMA's default config)
CASES = [
    ("mma_u2s2_bitplane", conv(S2, U2, EPILOGUES[1], N=1, H=6, W=5, C=45, K=37),
     "mma_sync", {}),
    ("mma_persistent_b1b1_fp16", conv(B1, B1, EPILOGUES[2], N=2, H=5, W=4, C=70, K=40),
     "mma_sync", {"PERSIST": 1}),
    ("mma_halo_stride2_s3u4", conv(S3, U4, EPILOGUES[4], N=2, H=7, W=6, C=33, K=40, stride=2),
     "mma_sync", {"HALO": 1}),
    ("wgmma_unswizzled_b1u2", conv(B1, U2, EPILOGUES[3], N=1, H=6, W=5, C=64, K=37),
     "wgmma", {"SWIZZLE": 0}),
    ("wgmma_swizzled_s2b1", conv(S2, B1, EPILOGUES[1], N=1, H=6, W=5, C=45, K=70),
     "wgmma", {}),
    ("wgmma_u1u4_1x1", conv(U1, U4, EPILOGUES[5], N=1, H=5, W=5, C=70, K=35, R=1, S=1, pad=0),
     "wgmma", {}),
    ("wgmma_halo_u2u2", conv(U2, U2, EPILOGUES[1], N=2, H=6, W=5, C=64, K=40), "wgmma",
     {"HALO": 1}),
    ("wgmma_3stage_kt2", conv(S2, U2, EPILOGUES[0], N=1, H=6, W=5, C=200, K=37),
     "wgmma", {"STAGES": 3, "KT": 2}),
    # the 128-row fused-plane default of 1x1 convs of <= 128 channels (bitserial_defaults
    # FUSED_TILES), two columns' thresholds per add, K past the last full column group
    ("wgmma_fused_tile_b1u2_pairs", conv(B1, U2, EPILOGUES[1], N=3, H=7, W=6, C=64, K=120,
                                         R=1, S=1, pad=0), "wgmma",
     {"BM": 128, "BN": 128, "WN": 128, "KT": 1, "STAGES": 4, "FUSE_PLANES": 1, "THR_PAIRS": 1,
      "REQUANT": "threshold"}),
    ("mma_rowsum_table_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=7, W=6, C=33, K=37, stride=2),
     "mma_sync", {"ROWSUM": "table"}),
    ("wgmma_rowsum_table_b1b1", conv(B1, B1, EPILOGUES[4], N=1, H=6, W=6, C=40, K=33, R=5,
                                     S=5, pad=2), "wgmma", {"ROWSUM": "table"}),
    ("wgmma_persistent_s2u2_stride2", conv(S2, U2, EPILOGUES[4], N=2, H=7, W=6, C=64, K=40,
                                           stride=2), "wgmma", {"PERSIST": 1}),
    ("wgmma_persistent_b1b1_table", gemm(B1, B1, EPILOGUES[1], M=130, N=64, K=512), "wgmma",
     {"PERSIST": 1, "ROWSUM": "table", "SWIZZLE": 0}),
    # several tiles per persistent block (the emulation runs 2 blocks): the copy cursor moves
    # to the next tile's rows and columns mid-pipeline
    ("mma_persistent_many_tiles_s2u2", conv(S2, U2, EPILOGUES[1], N=2, H=9, W=8, C=40, K=70),
     "mma_sync", {"PERSIST": 1, "BM": 32, "WM": 16, "BN": 32, "WN": 16}),
    ("wgmma_persistent_many_tiles_b1u2", conv(B1, U2, EPILOGUES[5], N=2, H=9, W=8, C=40,
                                              K=130), "wgmma",
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "REQUANT": "threshold"}),
    # four warpgroups (256 x 128 tiles) in a persistent block, one accumulator plane: 3 row
    # tiles x 2 column tiles over the emulation's 2 blocks
    ("wgmma_persistent_4wg_b1b1_threshold", conv(B1, B1, EPILOGUES[5], N=2, H=17, W=16, C=40,
                                                 K=130), "wgmma",
     {"PERSIST": 1, "BM": 256, "BN": 128, "WN": 128, "REQUANT": "threshold"}),
    # persistent wgmma k loops: copies four k tiles ahead of one-k-tile tiles (each copy a
    # later tile's), and 38 k tiles (past K_UNROLL: the loop is not unrolled)
    ("wgmma_persistent_copies_tiles_ahead", gemm(S2, U2, EPILOGUES[1], M=300, N=70, K=250),
     "wgmma", {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 6}),
    ("wgmma_persistent_38_k_tiles", gemm(B1, U2, EPILOGUES[5], M=130, N=40, K=9500), "wgmma",
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 4,
      "REQUANT": "threshold"}),
    # 6 k tiles: STAGES 6 and 3 divide them, so the unrolled steps' stages are constants
    ("wgmma_persistent_fixed_stages_6", gemm(B1, U2, EPILOGUES[1], M=300, N=70, K=1536),
     "wgmma", {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 6}),
    ("wgmma_persistent_fixed_stages_3", gemm(S2, B1, EPILOGUES[4], M=300, N=70, K=1536),
     "wgmma", {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 3}),
    # three warpgroups in M (BM=192): one tile per block with border thresholds, persistent
    # blocks over several row tiles
    ("wgmma_bm192_b1b1_border_threshold", conv(B1, B1, EPILOGUES[5], N=3, H=9, W=9, C=64, K=45),
     "wgmma", {"BM": 192, "BN": 64, "WN": 64, "REQUANT": "threshold"}),
    # BM=192 x BN=WN=256 (m64n256 per warpgroup, 132 accumulator registers: the wide one-tile
    # rows of s4 / s5 w1a1), two column tiles, the second partial, with the halo load
    ("wgmma_bm192_bn256_b1b1_halo", conv(B1, B1, EPILOGUES[5], N=2, H=9, W=9, C=64, K=300),
     "wgmma", {"BM": 192, "BN": 256, "WN": 256, "KT": 1, "STAGES": 4, "HALO": 1,
               "REQUANT": "threshold"}),
    ("wgmma_persistent_bm192_b1b1", gemm(B1, B1, EPILOGUES[5], M=700, N=70, K=600), "wgmma",
     {"PERSIST": 1, "BM": 192, "BN": 64, "WN": 64, "KT": 1, "STAGES": 4,
      "REQUANT": "threshold"}),
    # SLICES: a one-tile block's k tiles split over sets of warpgroups, the sums added through
    # shared memory: with the halo load and two-bit thresholds, binary activations with border
    # taps over four slices, uneven ranges (11 k tiles: 2, 3, 3, 3) with ones columns, the
    # planes fused, two warpgroups per slice with bit-plane packing, signed int32 output
    ("wgmma_slices2_b1u2_halo_threshold", conv(B1, U2, EPILOGUES[1], N=1, H=6, W=5, C=200,
                                               K=70), "wgmma",
     {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 4, "HALO": 1, "SLICES": 2,
      "REQUANT": "threshold"}),
    ("wgmma_slices4_b1b1_border", conv(B1, B1, EPILOGUES[5], N=2, H=5, W=6, C=256, K=40),
     "wgmma", {"BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 3, "SLICES": 4,
               "REQUANT": "threshold"}),
    ("wgmma_slices4_uneven_cols", gemm(B1, U2, EPILOGUES[4], M=70, N=40, K=2600), "wgmma",
     {"BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 3, "SLICES": 4, "ROWSUM": "cols"}),
    ("wgmma_slices2_fused", conv(B1, U2, EPILOGUES[1], N=1, H=6, W=5, C=200, K=70), "wgmma",
     {"BM": 64, "BN": 32, "WN": 32, "KT": 2, "STAGES": 3, "SLICES": 2, "FUSE_PLANES": 1}),
    ("wgmma_slices2_two_warpgroups_packed", conv(B1, U2, EPILOGUES[1], N=1, H=9, W=8, C=96,
                                                 K=40), "wgmma",
     {"BM": 64, "BN": 32, "WN": 16, "KT": 1, "STAGES": 3, "SLICES": 2}),
    ("wgmma_slices2_s2s2_int32", gemm(S2, S2, EPILOGUES[0], M=65, N=33, K=1900), "wgmma",
     {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 4, "SLICES": 2}),
    # TEAMS=2: two teams of warpgroups per persistent block, each with its own stage ring,
    # taking the block's tiles in turn (MMA issue ordered by named barriers): an odd tile count
    # per block (team 0 has the last tile) with border thresholds, an even one with constant
    # stage indices and the row-sum ones tile, the packing tile in shared memory per team
    ("wgmma_persistent_teams_odd_b1b1", conv(B1, B1, EPILOGUES[5], N=2, H=17, W=16, C=40,
                                             K=130), "wgmma",
     {"PERSIST": 1, "TEAMS": 2, "BM": 128, "BN": 128, "WN": 128, "REQUANT": "threshold"}),
    ("wgmma_persistent_teams_even_s2b1", gemm(S2, B1, EPILOGUES[4], M=250, N=70, K=1536),
     "wgmma", {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 64, "WN": 64, "KT": 1,
               "STAGES": 6}),
    ("wgmma_persistent_teams_packed_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=8, C=40,
                                                K=70), "wgmma",
     {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 32, "WN": 16}),
    # FUSE_PLANES: the activation planes summed in one accumulator by the MMAs, one tile per
    # block (two weight planes, KT=2) and persistent (binary weights: the row-sum MMAs per plane)
    ("wgmma_fused_u2u2_kt2", conv(U2, U2, EPILOGUES[0], N=1, H=6, W=5, C=200, K=37), "wgmma",
     {"STAGES": 3, "KT": 2, "FUSE_PLANES": 1}),
    ("wgmma_persistent_fused_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=8, C=40,
                                                   K=130), "wgmma",
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "REQUANT": "threshold", "FUSE_PLANES": 1}),
    # ROWSUM="cols": the row popcounts from ones columns after the weights in the stage's B
    # tiles (N = WN + 16): one tile per block with KT=2 and with the duplicate-aware load,
    # persistent blocks with border thresholds, two teams over a GEMM
    ("wgmma_cols_kt2_b1s2", conv(B1, S2, EPILOGUES[0], N=1, H=6, W=5, C=200, K=37), "wgmma",
     {"STAGES": 3, "KT": 2, "BN": 32, "WN": 32, "ROWSUM": "cols"}),
    ("wgmma_cols_halo_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=6, W=5, C=64, K=40), "wgmma",
     {"HALO": 1, "BN": 64, "WN": 64, "ROWSUM": "cols"}),
    ("wgmma_persistent_cols_b1b1_threshold", conv(B1, B1, EPILOGUES[5], N=2, H=9, W=8, C=40,
                                                  K=130), "wgmma",
     {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "REQUANT": "threshold", "ROWSUM": "cols"}),
    ("wgmma_persistent_teams_cols_gemm", gemm(B1, U2, EPILOGUES[4], M=250, N=70, K=1536),
     "wgmma", {"PERSIST": 1, "TEAMS": 2, "BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 6,
               "ROWSUM": "cols"}),
    # 40 channel words: a warp per pixel in bitserial_xpop, lanes 8-31 reading one word
    ("gemm_rowsum_table_wide_k", gemm(B1, U2, EPILOGUES[1], M=67, N=40, K=1280), "mma_sync",
     {"ROWSUM": "table"}),
    # bias, ReLU and requantization as per-column integer thresholds
    ("mma_threshold_s2u2_stride2", conv(S2, U2, EPILOGUES[1], N=2, H=7, W=6, C=33, K=37,
                                        stride=2), "mma_sync", {"REQUANT": "threshold"}),
    ("wgmma_persistent_threshold_b1b1", gemm(B1, B1, EPILOGUES[5], M=130, N=64, K=512),
     "wgmma", {"PERSIST": 1, "REQUANT": "threshold"}),
    # signed codes (qmin = -2: the bits of columns past KOUT = 45 must be masked) from three
    # thresholds per column
    ("wgmma_threshold_signed_out", conv(B1, U2, Epilogue(bias=True, out=S2,
                                                         out_layout=Layout.BITPLANE),
                                        N=1, H=5, W=9, C=40, K=45), "wgmma",
     {"REQUANT": "threshold"}),
    ("gemm_mma_s3b1", gemm(S3, B1, EPILOGUES[4], M=77, N=45, K=300), "mma_sync", {}),
    # an even KOUT: int32 / fp16 / INT8 outputs leave as one store per column pair
    ("wgmma_int32_pairs_b1u2", conv(B1, U2, EPILOGUES[0], N=1, H=6, W=5, C=64, K=72),
     "wgmma", {}),
    ("mma_int32_pairs_gemm_s2b1", gemm(S2, B1, EPILOGUES[0], M=45, N=66, K=300), "mma_sync",
     {}),
    ("mma_fp16_pairs_u2b1", conv(U2, B1, EPILOGUES[2], N=1, H=5, W=7, C=40, K=34),
     "mma_sync", {}),
    # the bare accumulator as int16 (|acc| < 2^15): column pairs, and an odd KOUT with ReLU
    ("wgmma_int16_pairs_b1u2", conv(B1, U2, Epilogue(out="int16"), N=1, H=6, W=5, C=64, K=72),
     "wgmma", {}),
    ("mma_int16_relu_odd_gemm_s2u2", gemm(S2, U2, Epilogue(relu=True, out="int16"), M=45, N=33,
                                         K=300), "mma_sync", {}),
    ("gemm_wgmma_b1b1", gemm(B1, B1, EPILOGUES[1], M=70, N=64, K=512), "wgmma", {}),
    # wide rows: interior pixels and every kind of border pixel (tap-rectangle corrections of
    # binary activations) in one launch
    ("wgmma_b1b1_wide_rows", conv(B1, B1, EPILOGUES[1], N=1, H=4, W=40, C=32, K=24),
     "wgmma", {}),
    ("wgmma_b1b1_wide_rows_threshold", conv(B1, B1, EPILOGUES[5], N=1, H=4, W=40, C=32,
                                                 K=24), "wgmma", {"REQUANT": "threshold"}),
    # binary activations and padding with three thresholds per column: the thresholds less
    # each tap rectangle's weight sums (bitserial_wtap part 3), 3 levels stored as 4
    ("mma_b1b1_border_threshold_u2", conv(B1, B1, EPILOGUES[1], N=1, H=5, W=9, C=40, K=37),
     "mma_sync", {"REQUANT": "threshold"}),
    ("wgmma_s2b1_border_threshold_s2", conv(S2, B1, Epilogue(bias=True, out=S2,
                                                             out_layout=Layout.BITPLANE),
                                            N=1, H=4, W=11, C=64, K=45), "wgmma",
     {"REQUANT": "threshold"}),
    ("mma_s2b1_wide_rows_int8", conv(S2, B1, EPILOGUES[3], N=1, H=3, W=72, C=40, K=20),
     "mma_sync", {"BM": 64, "WM": 32, "BN": 32, "WN": 32}),
    # split-K: k tiles over SPLIT_K blocks per tile, the last to arrive adds the others' partial
    # sums (10 k tiles in 4 splits: 3, 3, 3, 1; the block order of the emulation varies which
    # split arrives last from tile to tile)
    ("mma_split4_s2u2_bitplane", conv(S2, U2, EPILOGUES[1], N=1, H=6, W=5, C=280, K=37),
     "mma_sync", {"SPLIT_K": 4, "KT": 1, "STAGES": 3}),
    ("mma_split2_halo_s3u4_int8", conv(S3, U4, EPILOGUES[3], N=2, H=7, W=6, C=100, K=40,
                                       stride=2), "mma_sync", {"SPLIT_K": 2, "HALO": 1}),
    # binary weights: the row-sum MMA's popcounts are part of the partial sums
    ("mma_split4_b1u2_threshold", conv(B1, U2, EPILOGUES[1], N=1, H=6, W=5, C=300, K=70),
     "mma_sync", {"SPLIT_K": 4, "KT": 1, "REQUANT": "threshold"}),
    # binary activations with padding: the tap-rectangle sums are added once, by the last block
    ("mma_split8_b1b1_border", conv(B1, B1, EPILOGUES[5], N=1, H=5, W=9, C=448, K=33),
     "mma_sync", {"SPLIT_K": 8, "KT": 1}),
    ("mma_split2_rowsum_table_b1u2", gemm(B1, U2, EPILOGUES[2], M=70, N=48, K=2048),
     "mma_sync", {"SPLIT_K": 2, "ROWSUM": "table", "BN": 32, "WN": 16}),
    ("mma_split8_gemm_s2b1_int32", gemm(S2, B1, EPILOGUES[0], M=40, N=45, K=4090),
     "mma_sync", {"SPLIT_K": 8, "KT": 1}),
    # ROW_TABLE=1: each row's output row and tap rectangle from the bound table: several m16
    # tiles per warp with stride 2 and border sums, persistent blocks over many tiles, wide
    # rows with thresholds, split-K with border sums, a GEMM
    ("mma_rowtable_stride2_b1b1", conv(B1, B1, EPILOGUES[1], N=2, H=7, W=6, C=33, K=37,
                                       stride=2), "mma_sync", {"ROW_TABLE": 1}),
    ("wgmma_rowtable_persistent_s2b1", conv(S2, B1, EPILOGUES[5], N=2, H=9, W=8, C=40, K=130),
     "wgmma", {"PERSIST": 1, "BM": 64, "BN": 64, "WN": 64, "ROW_TABLE": 1,
               "REQUANT": "threshold"}),
    ("wgmma_rowtable_wide_rows_threshold", conv(B1, B1, EPILOGUES[5], N=1, H=4, W=40, C=32,
                                                K=24), "wgmma",
     {"REQUANT": "threshold", "ROW_TABLE": 1}),
    ("mma_rowtable_split8_b1b1_border", conv(B1, B1, EPILOGUES[5], N=1, H=5, W=9, C=448,
                                             K=33), "mma_sync",
     {"SPLIT_K": 8, "KT": 1, "ROW_TABLE": 1}),
    ("gemm_rowtable_wgmma_b1b1", gemm(B1, B1, EPILOGUES[1], M=70, N=64, K=512), "wgmma",
     {"ROW_TABLE": 1}),
    # THR_PAIRS outside the tap-shift kernel (the packed pair table from bind, in global
    # memory): a wide block of fused planes (WN = 256: 64 channels per lane) over two column
    # tiles, the second partial; a persistent GEMM (WN = 128); signed two-plane weights with
    # the halo load and two k slices (WN = 64, two lanes per word) and one-bit outputs
    ("wgmma_pairs_wide_fused_b1u2", conv(B1, U2, EPILOGUES[1], N=3, H=8, W=9, C=64, K=300),
     "wgmma", {"BM": 192, "BN": 256, "WN": 256, "KT": 1, "STAGES": 4, "FUSE_PLANES": 1,
               "REQUANT": "threshold", "THR_PAIRS": 1}),
    ("wgmma_pairs_persistent_gemm_b1u2", gemm(B1, U2, EPILOGUES[1], M=300, N=200, K=384),
     "wgmma", {"PERSIST": 1, "BM": 128, "BN": 128, "WN": 128, "REQUANT": "threshold",
               "THR_PAIRS": 1}),
    ("wgmma_pairs_halo_slices_s2u1", conv(S2, U1, EPILOGUES[5], N=1, H=8, W=9, C=256, K=70),
     "wgmma", {"BM": 64, "BN": 64, "WN": 64, "KT": 2, "STAGES": 4, "HALO": 1, "SLICES": 2,
               "REQUANT": "threshold", "THR_PAIRS": 1}),
    # ... binary activations: thresholds per tap rectangle packed by the wtap kernel (part 4,
    # each column's half): the wide block with the halo, padding 2 of a 5 x 5 conv with
    # two-bit outputs, and a GEMM (one rectangle)
    ("wgmma_pairs_wide_halo_b1b1", conv(B1, B1, EPILOGUES[5], N=3, H=8, W=9, C=64, K=300),
     "wgmma", {"BM": 192, "BN": 256, "WN": 256, "KT": 1, "STAGES": 4, "HALO": 1,
               "REQUANT": "threshold", "THR_PAIRS": 1}),
    ("wgmma_pairs_5x5_u1b1", conv(U1, B1, EPILOGUES[1], N=2, H=7, W=8, C=64, K=70, R=5, S=5,
                                  pad=2),
     "wgmma", {"BM": 64, "BN": 128, "WN": 128, "REQUANT": "threshold", "THR_PAIRS": 1}),
    ("wgmma_pairs_gemm_b1b1", gemm(B1, B1, EPILOGUES[1], M=200, N=100, K=512), "wgmma",
     {"BM": 128, "BN": 64, "WN": 64, "PERSIST": 1, "REQUANT": "threshold", "THR_PAIRS": 1}),
    # A tiles read in place from a pixel tile's halo (A_IN_HALO): 8 x 8 tiles over two images
    # with margins (9 x 11 outputs: the last tile row and column mostly outside), the ones
    # tile's row sums; 16 x 8 tiles of two warpgroups in two k slices (the middle one of three
    # channel groups read, and copied, by both), binary activations' tap rectangles and
    # thresholds, ones columns; a 5 x 5 window (pad 2) of signed planes
    # the 32-byte swizzle left to the weights
    ("wgmma_a_in_halo_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=11, C=256, K=40),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 4, "HALO": 1,
               "A_IN_HALO": 1}),
    ("wgmma_a_in_halo_slices_b1b1", conv(B1, B1, EPILOGUES[5], N=1, H=10, W=7, C=768, K=70),
     "wgmma", {"BM": 128, "BN": 64, "WN": 64, "KT": 1, "STAGES": 3, "HALO": 1,
               "A_IN_HALO": 1, "SLICES": 2, "ROWSUM": "cols", "REQUANT": "threshold"}),
    # ... with every k tile resident (STAGES=12: no stage refilled, no wait for the previous
    # stage's MMAs), alone and in two k slices
    ("wgmma_a_in_halo_resident_u2b1", conv(U2, B1, EPILOGUES[2], N=1, H=9, W=10, C=512, K=45),
     "wgmma", {"BM": 64, "BN": 64, "WN": 64, "KT": 2, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1}),
    # ... its halo copied channel group by channel group with the first stage reading each
    # (four groups, stages of 4 slabs straddling them)
    ("wgmma_a_in_halo_staged_b1u2", conv(B1, U2, EPILOGUES[1], N=1, H=9, W=7, C=1024, K=40),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 4, "STAGES": 4, "HALO": 1,
               "A_IN_HALO": 1}),
    ("wgmma_a_in_halo_resident_slices_b1u2", conv(B1, U2, EPILOGUES[1], N=1, H=8, W=8, C=512,
                                                  K=64),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1, "SLICES": 2}),
    # ... each k tile's weights by one bulk copy of their bind-time image on an mbarrier
    # (BULK_WEIGHTS): margins over two images; 16 x 8 tiles of four warpgroups, four channel
    # groups, binary activations' thresholds
    ("wgmma_a_in_halo_bulk_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=11, C=256, K=40),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1, "BULK_WEIGHTS": 1}),
    ("wgmma_a_in_halo_bulk_u1b1", conv(U1, B1, EPILOGUES[5], N=1, H=10, W=7, C=1024, K=70),
     "wgmma", {"BM": 128, "BN": 64, "WN": 64, "KT": 4, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1, "BULK_WEIGHTS": 1, "REQUANT": "threshold"}),
    ("wgmma_a_in_halo_5x5_s2s3", conv(S2, S3, EPILOGUES[4], N=1, H=6, W=9, C=256, K=37,
                                      R=5, S=5, pad=2),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 3, "HALO": 1,
               "A_IN_HALO": 1, "SWIZZLE": 32}),
    # ... the window by tensor copies into swizzled pixel rows, read in place through
    # swizzled descriptors, a barrier per channel block (TMA_HALO = the swizzle width): margins
    # over two images with bulk weights (two 128-byte blocks); two warpgroups' 16 x 8 tiles
    # with refilled stages and thresholds (32-byte blocks, four per plane); a 5 x 5 window
    # whose rows start left of the image (64-byte blocks)
    ("wgmma_a_in_halo_tma_halo_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=11, C=2048, K=40),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 8, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1, "BULK_WEIGHTS": 1, "TMA_HALO": 128}),
    ("wgmma_a_in_halo_tma_halo_u1b1", conv(U1, B1, EPILOGUES[5], N=1, H=10, W=7, C=1024, K=70),
     "wgmma", {"BM": 128, "BN": 64, "WN": 64, "KT": 4, "STAGES": 4, "HALO": 1,
               "A_IN_HALO": 1, "TMA_HALO": 32, "REQUANT": "threshold"}),
    ("wgmma_a_in_halo_tma_halo_5x5_s2s3", conv(S2, S3, EPILOGUES[4], N=1, H=6, W=9, C=1024,
                                               K=37, R=5, S=5, pad=2),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 4, "STAGES": 3, "HALO": 1,
               "A_IN_HALO": 1, "TMA_HALO": 64}),
    # ... both activation planes as rows of one A tile (PLANE_ROWS): margins over two images
    # with bulk weights; two warpgroups' 8 x 8 tiles of a 5 x 5 window; signed activations
    # with thresholds and refilled stages
    ("wgmma_plane_rows_b1u2", conv(B1, U2, EPILOGUES[1], N=2, H=9, W=11, C=256, K=40),
     "wgmma", {"BM": 64, "BN": 64, "WN": 64, "KT": 1, "STAGES": 12, "HALO": 1,
               "A_IN_HALO": 1, "BULK_WEIGHTS": 1, "PLANE_ROWS": 1}),
    ("wgmma_plane_rows_5x5_s2u2", conv(S2, U2, EPILOGUES[4], N=1, H=10, W=9, C=256, K=37,
                                       R=5, S=5, pad=2),
     "wgmma", {"BM": 128, "BN": 32, "WN": 32, "KT": 1, "STAGES": 3, "HALO": 1,
               "A_IN_HALO": 1, "PLANE_ROWS": 1}),
    ("wgmma_plane_rows_u1s2", conv(U1, S2, EPILOGUES[5], N=1, H=6, W=13, C=512, K=70),
     "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 2, "STAGES": 4, "HALO": 1,
               "A_IN_HALO": 1, "PLANE_ROWS": 1, "REQUANT": "threshold"}),
]


def _config(wl, mma, changes):
    """The kernel parameters of the plain default of the MMA kind with `changes`: multiplying
    requantization unless a case names REQUANT (the default where allowed is "threshold",
    which the *_threshold cases cover)."""
    spec = plain(wl, mma).replace(REQUANT="multiply").replace(**changes)
    assert why_invalid(wl, spec) is None, why_invalid(wl, spec)
    return spec


def edit_kernel(monkeypatch, old, new, file=None):
    """Render the kernels with `old` replaced by `new` in the one kernel .cu file that holds it
    (`file`, where named: a mutation the emulation must catch); `old` must occur there exactly
    once."""
    original = cu_source.cu_file
    files = [file] if file else [
        f.name for f in resources.files("lowbit.kernels.cuda").iterdir()
        if f.name.startswith(("bitserial_", "mma_conv")) and f.name.endswith(".cu")]
    holders = [f for f in files if old in original(f)]
    assert len(holders) == 1 and original(holders[0]).count(old) == 1, (old, holders)

    def edited(name):
        text = original(name)
        return text.replace(old, new) if name == holders[0] else text
    monkeypatch.setattr(cu_source, "cu_file", edited)


def emulate(wl, spec, x, w, params, **kw):
    """The emulated kernel of kernel parameters `spec` (its family's)."""
    family, cfg = split(spec)
    return bitserial_emu.emulate(family, wl, cfg, x, w, params, **kw)


def _check(wl, spec, seed):
    """Whether the emulated kernel is exact (False also where its wgmma operands changed while
    in flight: a race on the GPU)."""
    x, w, params = random_inputs(wl, seed)
    try:
        got = emulate(wl, spec, x, w, params)
    except bitserial_emu.StaleOperands:
        return False
    want = run(wl, x, w, params)
    if got.dtype == torch.float16:
        got, want = got.view(torch.int16), want.view(torch.int16)
    return torch.equal(got, want)


# the slowest cases (384-thread blocks of m64n256, ~40-50 s each on 2 loaded cores, their host
# compile included): `slow`, where CI may leave them out
SLOW_CASES = {"wgmma_bm192_bn256_b1b1_halo", "wgmma_pairs_wide_halo_b1b1"}


@pytest.mark.parametrize("wl,mma,changes", [
    pytest.param(*c[1:], id=c[0], marks=pytest.mark.slow if c[0] in SLOW_CASES else ())
    for c in CASES])
def test_emulated_kernel_is_bit_exact(wl, mma, changes):
    assert _check(wl, _config(wl, mma, changes), seed=len(wl.key))


def test_emulation_catches_resident_stages_that_are_refilled(monkeypatch):
    """A_IN_HALO without the wait for the previous stage's MMAs where stages are refilled (9 k
    tiles through 4 stages): the refilled stage is overwritten while its MMAs are in flight."""
    wl = conv(B1, U2, EPILOGUES[1], N=1, H=8, W=8, C=256, K=32)
    cfg = _config(wl, "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 4,
                                "HALO": 1, "A_IN_HALO": 1})
    assert _check(wl, cfg, seed=4)
    edit_kernel(monkeypatch, "A_IN_HALO && (KTILES + SLICES - 1) / SLICES <= STAGES - 2;",
                "A_IN_HALO;")
    assert not _check(wl, cfg, seed=4)


def test_emulation_catches_a_halo_group_copied_late(monkeypatch):
    """A_IN_HALO with the halo's channel groups each copied one stage after the first stage
    that reads them: those MMAs read chunks not yet landed."""
    wl = conv(B1, U2, EPILOGUES[1], N=1, H=8, W=8, C=512, K=32)
    cfg = _config(wl, "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 2, "STAGES": 4,
                                "HALO": 1, "A_IN_HALO": 1})
    assert _check(wl, cfg, seed=5)
    edit_kernel(monkeypatch, "halo_stage_load(x, halo, next, k0, tid);",
                     "halo_stage_load(x, halo, next - 1, k0, tid);")
    assert not _check(wl, cfg, seed=5)


def test_emulation_catches_mmas_before_their_bulk_weights(monkeypatch):
    """BULK_WEIGHTS with each stage's MMAs issued before the wait on its weights' mbarrier:
    they read the stage before its bulk copy lands."""
    wl = conv(B1, U2, EPILOGUES[1], N=1, H=8, W=8, C=256, K=32)
    cfg = _config(wl, "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 1, "STAGES": 12,
                                "HALO": 1, "A_IN_HALO": 1, "BULK_WEIGHTS": 1})
    assert _check(wl, cfg, seed=6)
    wait = "    if constexpr (BULK_WEIGHTS) mbar_wait(bars + kt, 0);"
    after_mmas = "    if constexpr (!RESIDENT_STAGES) wgmma_wait<1>();"
    edit_kernel(monkeypatch, wait, "")
    edit_kernel(monkeypatch, after_mmas, wait + "\n" + after_mmas)
    assert not _check(wl, cfg, seed=6)


WINDOW_WAIT = ("    if constexpr (TMA_HALO)  // the window's channel blocks this k tile reads\n"
               "      for (; halo_waited <= halo_last_block(kt); ++halo_waited)\n"
               "        mbar_wait(halo_bars + halo_waited, 0);\n")
TMA_MMAS = "                TMA_HALO ? halo_tiles(halo) : halo, kt);\n"


@pytest.mark.parametrize("edits", [
    [("bitserial_wgmma.cu", WINDOW_WAIT, ""),
     ("bitserial_wgmma.cu", TMA_MMAS, TMA_MMAS + WINDOW_WAIT)],
    [("bitserial_wgmma_common.cu", "(HALO_SWIZZLE_MODE << 62)",
      "((u64)((a >> 7) & 7) << 49) | (HALO_SWIZZLE_MODE << 62)")]],
    ids=["mmas_before_the_window_lands", "base_offset_of_the_tile_start"])
def test_emulation_catches_a_broken_tma_halo(edits, monkeypatch):
    """TMA_HALO issuing the first MMAs before waiting for the window's tensor copies, or
    giving the tap tiles their first row's swizzle phase as base offset (the pattern starts on
    1,024-byte boundaries: that shifts every row's phase; exact in the emulation's first model,
    wrong on an H100), is caught."""
    wl = conv(B1, U2, EPILOGUES[1], N=1, H=7, W=6, C=1024, K=32)
    cfg = _config(wl, "wgmma", {"BM": 64, "BN": 32, "WN": 32, "KT": 4, "STAGES": 12,
                                "HALO": 1, "A_IN_HALO": 1, "BULK_WEIGHTS": 1, "TMA_HALO": 128})
    assert _check(wl, cfg, seed=7)
    for file, old, new in edits:  # each edit wraps the previous ones
        edit_kernel(monkeypatch, old, new, file)
    assert not _check(wl, cfg, seed=7)


def test_emulation_catches_plane_rows_left_in_place(monkeypatch):
    """PLANE_ROWS without moving rows g + 8 (plane 1) into plane 1's registers before the
    epilogue is caught: the cases above are not exact by accident."""
    wl, mma, changes = next(c[1:] for c in CASES if c[0] == "wgmma_plane_rows_b1u2")
    cfg = _config(wl, mma, changes)
    edit_kernel(monkeypatch, "  planes_from_rows(acc, rsum);\n", "")
    assert not _check(wl, cfg, seed=3)


def test_emulation_catches_a_pair_table_in_channel_order(monkeypatch):
    """THR_PAIRS from global memory with the bind-time pair table's columns in channel order
    instead of the lanes' (`pair_channel`) is caught: the pair cases above are not exact by
    accident."""
    wl, mma, changes = next(c[1:] for c in CASES if c[0] == "wgmma_pairs_wide_fused_b1u2")
    cfg = _config(wl, mma, changes)
    monkeypatch.setattr(tables, "pair_channel", lambda j, wn: j)
    assert not _check(wl, cfg, seed=3)


@pytest.mark.slow  # 6 s: a mutation check of the emulation
def test_emulation_catches_swapped_halves_of_packed_rectangle_thresholds(monkeypatch):
    """Binary activations' packed thresholds (wtap part 4) with each column written into its
    partner's half are caught."""
    wl, mma, changes = next(c[1:] for c in CASES if c[0] == "wgmma_pairs_5x5_u1b1")
    cfg = _config(wl, mma, changes)
    edit_kernel(monkeypatch, "* PAIR_STRIDE + k) * 2 + j % 2] =",
                     "* PAIR_STRIDE + k) * 2 + 1 - j % 2] =")
    assert not _check(wl, cfg, seed=3)


def test_split_k_counters_come_back_to_zero(monkeypatch):
    """A second launch on the same workspace and counters is exact too: the last block of
    each tile resets its counter (otherwise no block of the next launch would see itself last
    and the output would stay poisoned)."""
    wl = conv(S2, U2, EPILOGUES[1], N=1, H=6, W=5, C=280, K=37)
    cfg = _config(wl, "mma_sync", {"SPLIT_K": 4, "KT": 1, "STAGES": 3})
    x, w, params = random_inputs(wl, 5)
    want = run(wl, x, w, params)
    assert torch.equal(emulate(wl, cfg, x, w, params, launches=2), want)
    real = bitserial_emu.host_source
    reset = "if (tid == 0) split_count[tile] = 0;"
    monkeypatch.setattr(bitserial_emu, "host_source",
                        lambda *args: real(*args).replace(reset, ""))
    assert torch.equal(emulate(wl, cfg, x, w, params), want)
    assert not torch.equal(emulate(wl, cfg, x, w, params, launches=2), want)


def test_split_k_constraints():
    """Split-K: the mma.sync one-tile family's knob, each split at least a k tile, only on
    grids that leave SMs idle with more than one k tile."""
    wl = conv(S2, U2, EPILOGUES[1], N=1, H=6, W=5, C=280, K=37)  # 9 taps x 9 words: 11 k tiles
    base = _config(wl, "mma_sync", {"KT": 1})
    assert why_invalid(wl, base.replace(SPLIT_K=4)) is None  # 3, 3, 3, 2 k tiles
    assert "without k tiles" in why_invalid(wl, base.replace(SPLIT_K=8))  # 2 x 7 >= 11
    assert "SPLIT_K" not in MMA_SYNC_PERSISTENT.knobs.names
    assert "SPLIT_K" not in WGMMA.knobs.names  # (wgmma split-K was wrong on an H100)
    big = conv(S2, U2, EPILOGUES[1], N=64, H=56, W=56, C=64, K=64)
    assert MMA_SYNC.space(big, ARCH90).knob("SPLIT_K").values == (1,)
    one_k_tile = gemm(S2, U2, EPILOGUES[1], M=64, N=64, K=256)
    assert MMA_SYNC.space(one_k_tile, ARCH90).knob("SPLIT_K").values == (1,)


def test_team_cases_cover_both_tile_parities():
    """The persistent TEAMS cases give their blocks (the emulation runs 2) odd and even tile
    counts, so both teams' last tiles and the left-out order arrival are run."""
    parities = set()
    for _, wl, mma, changes in (c for c in CASES if "teams" in c[0]):
        cfg = _config(wl, mma, changes)
        cols, rows = layout.tile_grid(wl, cfg)
        blocks = layout.persistent_grid(wl, cfg, 2)[0]
        parities |= {len(range(b, cols * rows, blocks)) % 2 for b in range(blocks)}
    assert parities == {0, 1}


@pytest.mark.parametrize("edit", [
    ("u32* stages = smem + team * STAGES * STAGE_WORDS;", "u32* stages = smem;"),
    ("mma_turn_pass(team, tile + (int)gridDim.x < N_TILES)", "mma_turn_pass(team, true)")],
    ids=["teams_share_stages", "order_arrival_without_partner"])
@pytest.mark.slow  # 6 s a case: a mutation check of the emulation
def test_emulation_catches_broken_teams(edit, monkeypatch):
    """Persistent wgmma teams that share one stage ring give wrong results; an order arrival
    after a team's last tile where the other team has none left is reported."""
    edit_kernel(monkeypatch, *edit)
    wl = conv(B1, B1, EPILOGUES[5], N=2, H=17, W=16, C=40, K=130)
    cfg = _config(wl, "wgmma", {"PERSIST": 1, "TEAMS": 2, "BM": 128, "BN": 128, "WN": 128,
                                "REQUANT": "threshold"})
    if "stages" in edit[0]:
        assert not _check(wl, cfg, seed=2)
    else:
        with pytest.raises(RuntimeError, match="named barrier"):
            _check(wl, cfg, seed=2)


def test_emulation_catches_misplaced_ones_columns(monkeypatch):
    """ROWSUM="cols" with the ones written into the zero rows of the stages' B tiles (the row
    popcounts' registers then hold zeros) is caught: the cols cases above are not exact by
    accident."""
    wl = conv(B1, U2, EPILOGUES[0], N=1, H=6, W=5, C=64, K=40)
    cfg = _config(wl, "wgmma", {"BN": 64, "WN": 64, "ROWSUM": "cols"})
    assert _check(wl, cfg, seed=2)
    edit_kernel(monkeypatch, "row < 8 ? ~0u : 0u;",
                     "row >= 8 ? ~0u : 0u;")
    assert not _check(wl, cfg, seed=2)


def _break_source(monkeypatch, edit: tuple[str, str]) -> None:
    """Emulate kernels from their text with edit[0] (which must occur) replaced by edit[1]."""
    real = bitserial_emu.host_source

    def broken(*args):
        text = real(*args)
        assert edit[0] in text
        return text.replace(edit[0], edit[1])

    monkeypatch.setattr(bitserial_emu, "host_source", broken)


@pytest.mark.parametrize("edit,extra", [
    # one more wgmma batch in flight: the stage being refilled is still being read
    (("if constexpr (!RESIDENT_STAGES) wgmma_wait<1>();",
      "if constexpr (!RESIDENT_STAGES) wgmma_wait<2>();"), {}),
    # the staged tiles without the 32-byte swizzle that the descriptors declare
    (("(((wd >> 2) ^ ((row >> 2) & 1)) << 2)", "((wd >> 2) << 2)"), {}),
    # a tile's first wgmma accumulating onto registers nobody zeroed (scale-d must be 0)
    (("ones, wg_m, wg_n, kt > k0,", "ones, wg_m, wg_n, true,"), {}),
    # split-K: the last block leaves out the first split's partial sums
    (("for (int z = 0; z < SPLIT_K; ++z) {", "for (int z = 1; z < SPLIT_K; ++z) {"),
     {"SPLIT_K": 4}),
    # two-bit thresholds: the low bit compared with the other half's threshold
    (("(upper ? thr[THR_SEARCH ? 2 : 0] : thr[0])", "(upper ? thr[0] : thr[THR_SEARCH ? 2 : 0])"),
     {"REQUANT": "threshold"}),
    # duplicate-aware load: a stage's activation planes stored crosswise
    (("halo_vals[it][i]);", "halo_vals[it][Q_BITS - 1 - i]);"), {"HALO": 1}),
    # FUSE_PLANES: plane 1 issued once (coefficient 1, not 2); its first MMA overwriting plane
    # 0's sums on a tile's first k step
    (("rep < a_coef(i); ++rep)", "rep < 1; ++rep)"), {"FUSE_PLANES": 1}),
    (("i == 0 && rep == 0 ? acc_in : 1", "rep == 0 ? acc_in : 1"), {"FUSE_PLANES": 1}),
    # SLICES: the second slice's sums left out; every slice starting at k tile 0
    (("for (int s = 1; s < SLICES; ++s) slice_sums<true>",
      "for (int s = 2; s < SLICES; ++s) slice_sums<true>"), {"SLICES": 2}),
    (("SLICES > 1 ? slice * KTILES / SLICES : 0", "SLICES > 1 ? 0 : 0"),
     {"SLICES": 4, "BN": 32}),
], ids=["wgmma_wait_too_late", "swizzle_missing", "first_wgmma_accumulates",
        "split_k_first_split_left_out", "threshold_search_swapped", "halo_planes_crossed",
        "fused_plane_once", "fused_plane_overwrites", "slice_sums_left_out",
        "slices_overlap"])
def test_emulation_catches_a_broken_kernel(edit, extra, monkeypatch):
    _break_source(monkeypatch, edit)
    wl = conv(S2, U2, EPILOGUES[1], N=1, H=6, W=5, C=200, K=37)
    changes = {"STAGES": 3, "KT": 1, **extra}
    mma = "mma_sync" if "SPLIT_K" in extra else "wgmma"  # split-K runs on mma.sync only
    assert not _check(wl, _config(wl, mma, changes), seed=1)


@pytest.mark.parametrize("case,edit", [
    ("wgmma_int32_pairs_b1u2", ("make_int2(v[0], v[1])", "make_int2(v[1], v[0])")),
    ("mma_fp16_pairs_u2b1", ("((u32)v[0] & 0xffffu) | ((u32)v[1] << 16)",
                             "((u32)v[1] & 0xffffu) | ((u32)v[0] << 16)")),
    ("wgmma_int16_pairs_b1u2", ("((u32)v[0] & 0xffffu) | ((u32)v[1] << 16)",
                                "((u32)v[1] & 0xffffu) | ((u32)v[0] << 16)")),
    ("mma_s2b1_wide_rows_int8", ("(((u32)v[1] & 0xffu) << 8)", "(((u32)v[0] & 0xffu) << 8)")),
])
def test_emulation_catches_crossed_output_pairs(case, edit, monkeypatch):
    """The column-pair stores of int32 / fp16 / int16 / INT8 outputs: a pair stored crosswise
    fails."""
    wl, mma, changes = CASE_BY_ID[case]
    assert wl.epilogue.out in ("int32", "fp16", "int16") or wl.epilogue.out_layout is Layout.INT8
    assert _check(wl, _config(wl, mma, changes), seed=2)
    _break_source(monkeypatch, edit)
    assert not _check(wl, _config(wl, mma, changes), seed=2)


# CHAINED (programmatic dependent launch): one case per kernel body and prologue order; the
# emulation raises EarlyInputRead where a thread copies from x before griddepcontrol.wait.
CHAINED_CASES = ["mma_u2s2_bitplane", "mma_persistent_b1b1_fp16", "mma_halo_stride2_s3u4",
                 "wgmma_halo_u2u2", "wgmma_rowsum_table_b1b1", "wgmma_persistent_s2u2_stride2",
                 "wgmma_a_in_halo_b1u2", "wgmma_a_in_halo_bulk_b1u2",
                 "wgmma_a_in_halo_bulk_u1b1", "wgmma_a_in_halo_tma_halo_b1u2",
                 "wgmma_plane_rows_b1u2", "mma_split4_b1u2_threshold"]
CASE_BY_ID = {c[0]: c[1:] for c in CASES}


def _check_chained(wl, cfg, seed, mode=1):
    x, w, params = random_inputs(wl, seed)
    got = emulate(wl, cfg, x, w, params, chained=mode)
    return torch.equal(got, run(wl, x, w, params))


@pytest.mark.parametrize("mode", sorted(CHAIN_TRIGGERS.values()))
@pytest.mark.parametrize("case", CHAINED_CASES)
def test_emulated_chained_kernel_is_bit_exact(case, mode):
    """Rendered for programmatic dependent launch (either trigger), every kernel reads x only
    after its wait (bulk weights and the epilogue's prefetches before it) and stays exact."""
    wl, mma, changes = CASE_BY_ID[case]
    assert _check_chained(wl, _config(wl, mma, changes), seed=len(wl.key) + 1, mode=mode)


EARLY_WAIT = "    grid_dependency_wait();\n  }\n"
TOP_WAIT = "  if constexpr (CHAINED && !CHAIN_EARLY_WEIGHTS) grid_dependency_wait();\n"
HALO_BARS = "  int halo_waited = 0;"


@pytest.mark.parametrize("case,edits", [
    ("mma_halo_stride2_s3u4", [("bitserial_chain.cu", TOP_WAIT, "")]),
    ("wgmma_a_in_halo_bulk_b1u2", [("bitserial_wgmma.cu", EARLY_WAIT, "  }\n"),
                                   ("bitserial_wgmma.cu", HALO_BARS,
                                    "  grid_dependency_wait();\n" + HALO_BARS)]),
    ("wgmma_a_in_halo_tma_halo_b1u2", [("bitserial_wgmma.cu",
                                        "      bulk_weights_load(w, stages, bars);\n    }\n",
                                        "      bulk_weights_load(w, stages, bars);\n"
                                        "      halo_tensor_load(BITSERIAL_XMAP, halo_tiles(halo),"
                                        " blockIdx.y, halo_bars);\n    }\n")])],
    ids=["no_wait", "wait_after_the_window_copies", "window_before_the_wait"])
def test_emulation_catches_input_read_before_the_wait(case, edits, monkeypatch):
    """A chained kernel without its wait, with the wait after the window's cp.async, or
    with the window's tensor copies issued with the early weights: x read too soon."""
    wl, mma, changes = CASE_BY_ID[case]
    cfg = _config(wl, mma, changes)
    assert _check_chained(wl, cfg, seed=3)
    for file, old, new in edits:  # each edit wraps the previous ones
        edit_kernel(monkeypatch, old, new, file)
    with pytest.raises(bitserial_emu.EarlyInputRead):
        _check_chained(wl, cfg, seed=3)


def test_chained_render_leaves_unchained_text_alone():
    """CHAINED is a render option: the default text defines it 0 (the kernels' SASS as
    before) and the chained text differs only in that constant."""
    wl, mma, changes = CASE_BY_ID["wgmma_a_in_halo_bulk_b1u2"]
    family, cfg = split(_config(wl, mma, changes))
    text = family.render(wl, cfg)
    assert "constexpr int CHAINED = 0;" in text
    for mode in CHAIN_TRIGGERS.values():
        assert family.render(wl, cfg, chained=mode) == text.replace(
            "constexpr int CHAINED = 0;", f"constexpr int CHAINED = {mode};")
