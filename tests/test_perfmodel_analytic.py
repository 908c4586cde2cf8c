"""Analytic model: occupancy rules, APNN-TC TLP / compute intensity, launch shapes, pruning."""

from __future__ import annotations

from lowbit.core import Config, ConfigSpace, ConvWorkload, GemmWorkload, Knob
from lowbit.perfmodel import H100, analyze, launch_shape, occupancy, prune_reason, pruned_space


def test_occupancy_limiters():
    # 256 threads x 64 regs: 8 warps x 2048 regs = 16384 per block -> 4 blocks (registers)
    o = occupancy(256, 64, 0)
    assert (o.blocks_per_sm, o.limiter, o.warps_per_sm) == (4, "registers", 32)
    assert occupancy(128, 32, 100 * 1024).blocks_per_sm == 2  # 228 KB / 100 KB
    assert occupancy(128, 32, 100 * 1024).limiter == "smem"
    assert occupancy(1024, 16, 0).limiter == "threads" and occupancy(1024, 16, 0).blocks_per_sm == 2
    assert occupancy(128, 32, 300 * 1024).blocks_per_sm == 0  # over the per-block limit
    assert occupancy(2048, 16, 0).limiter == "launch"


def test_tlp_and_compute_intensity_follow_apnn_tc_eq_3_4():
    wl = GemmWorkload(M=1024, N=512, K=256)
    a = analyze(wl, {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4,
                     "num_stages": 2})
    assert a.tlp == (1024 // 128) * (512 // 64)  # Eq. 3
    assert a.compute_intensity == 2 * 128 * 64 / (128 + 64)  # Eq. 4
    assert a.padding_efficiency == 1.0
    assert a.shape.smem_bytes == 2 * (128 + 64) * 32  # int8 tiles, 2 stages
    assert 0 < a.wave_efficiency <= 1 and a.est_us > 0
    odd = analyze(GemmWorkload(M=100, N=60, K=64), {"BLOCK_M": 64, "BLOCK_N": 64})
    assert odd.padding_efficiency == (100 * 60) / (128 * 64)


def test_launch_shape_aliases_and_template_override():
    wl = ConvWorkload(N=2, H=8, W=8, C=32, K=64, R=3, S=3, stride=1, pad=1)
    s = launch_shape(wl, {"BM": 32, "BN": 16, "chunk_k": 64, "warps": 2})
    assert (s.M, s.N, s.K) == (2 * 8 * 8, 64, 9 * 32)
    assert (s.block_m, s.block_n, s.block_k, s.warps) == (32, 16, 64, 2)
    tvm = launch_shape(wl, {"block_row_warps": 2, "block_col_warps": 4, "warp_row_tiles": 2,
                            "warp_col_tiles": 1, "chunk": 2})
    assert (tvm.block_m, tvm.block_n, tvm.block_k, tvm.warps) == (64, 64, 32, 8)

    class Tmpl:
        def launch_shape(self, workload, config):
            return dict(block_m=7, block_n=9, block_k=11, warps=1, stages=1)

    own = launch_shape(wl, {}, Tmpl())
    assert (own.block_m, own.split_k, own.operand_bits) == (7, 1, 8)


def test_prune_rules_and_pruned_space():
    wl = GemmWorkload(M=48, N=48, K=256)
    assert prune_reason(wl, {"BLOCK_M": 256, "BLOCK_N": 32, "BLOCK_K": 32},
                        min_tiles=(32, 32)).startswith("tile M=256")
    assert "16-byte" in prune_reason(wl, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 8})
    assert "cannot launch" in prune_reason(wl, {"BLOCK_M": 256, "BLOCK_N": 256,
                                                 "BLOCK_K": 256, "num_stages": 4})
    space = ConfigSpace([Knob("BLOCK_M", (32, 64, 256)), Knob("BLOCK_N", (32, 64)),
                         Knob("BLOCK_K", (8, 32))])
    kept = pruned_space(space, wl)
    assert 0 < len(kept) < len(space)
    assert Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32) in kept
    assert Config(BLOCK_M=256, BLOCK_N=32, BLOCK_K=32) not in kept
    assert H100.sms == 132
