"""Bit-serial b1-AND conv2d/GEMM template: config space and NVRTC compilation on the CPU; on a
GPU, bit-exact equality with `lowbit.reference.run` for every (w_bits, a_bits) in 1..4 x 1..4,
every encoding, odd shapes, stride 2, padding and every epilogue."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Layout, Precision
from lowbit.core.workloads import load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.reference import random_inputs, run

BP = Layout.BITPLANE


def encodings(bits: int) -> list[Precision]:
    if bits == 1:
        return [Precision(1, "binary"), Precision(1)]
    return [Precision(bits), Precision(bits, "signed")]


EPILOGUES = [
    Epilogue(),
    Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP),
    Epilogue(bias=True, out="fp16"),
    Epilogue(relu=True, out=Precision(4, "signed"), out_layout=Layout.INT8),
    Epilogue(bias=True, out=Precision(3, "signed"), out_layout=BP),
    Epilogue(bias=True, relu=True, out=Precision(1), out_layout=BP),
]


def conv(w: Precision, a: Precision, epi: Epilogue | None = None, **shape) -> ConvWorkload:
    dims = dict(N=2, H=9, W=7, C=45, K=37, R=3, S=3, stride=1, pad=1)
    dims.update(shape)
    return ConvWorkload(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi or Epilogue(), **dims)


def gemm(w: Precision, a: Precision, epi: Epilogue | None = None, **shape) -> GemmWorkload:
    dims = dict(M=77, N=45, K=300)
    dims.update(shape)
    return GemmWorkload(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi or Epilogue(), **dims)


# ---------------------------------------------------------------- CPU: space and compilation

def test_registered():
    assert get_template("cuda.bitserial") is BITSERIAL
    assert BITSERIAL.backend == "cuda"


def test_unsupported_workloads_have_reasons():
    wl = conv(Precision(2), Precision(2))
    assert BITSERIAL.supports(wl)
    assert "bitplane" in BITSERIAL.unsupported_reason(wl.replace(a_layout=Layout.INT8))
    assert "bits" in BITSERIAL.unsupported_reason(wl.replace(w=Precision(5)))
    packed = Epilogue(out=Precision(2), out_layout=Layout.PACKED)
    assert "packed" in BITSERIAL.unsupported_reason(wl.replace(epilogue=packed))
    with pytest.raises(ValueError, match="bitplane"):
        BITSERIAL.space(wl.replace(w_layout=Layout.PACKED))


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 3), (4, 4), (2, 4)])
def test_space_constraints_hold(wb, ab):
    wl = conv(Precision(wb), Precision(ab), EPILOGUES[1], N=8, H=14, W=14, C=256, K=256)
    space = BITSERIAL.space(wl)
    assert len(space) > 0
    default = BITSERIAL.default_config(wl)
    assert default in space
    for cfg in space:
        assert cfg["BM"] % cfg["WM"] == 0 and cfg["BN"] % cfg["WN"] == 0
        assert cfg["BN"] % 32 == 0  # bit-plane output packs whole words per block
        assert bitserial.acc_regs(wl, cfg) <= bitserial.MAX_ACC_REGS
        assert bitserial.smem_bytes(wl, cfg) <= bitserial.MAX_SMEM


def test_invalid_config_is_rejected():
    wl = gemm(Precision(1), Precision(2))
    with pytest.raises(ValueError, match="is not in cuda\\.bitserial's space"):
        BITSERIAL.build(wl, Config(BM=64, BN=64, WM=48, WN=32, KT=1, STAGES=2, PERSIST=0,
                                   MMA="mma_sync", SWIZZLE=0, HALO=0), arch="sm_80")


def test_checking_a_config_does_not_enumerate_the_space(monkeypatch):
    """build() checks one config against the constraints; enumerating the 4-5k configs of a
    space (1-3 s) inside every tuning trial made each measurement cost seconds."""
    from lowbit.core.space import ConfigSpace

    def enumerate_all(self):
        raise AssertionError("the whole space was enumerated")

    wl = gemm(Precision(1), Precision(2), M=4096, N=4096, K=4096)
    cfg = BITSERIAL.default_config(wl, "wgmma", arch=bitserial.WGMMA_ARCH)
    monkeypatch.setattr(ConfigSpace, "all_configs", enumerate_all)
    assert BITSERIAL.checked_config(wl, cfg, BITSERIAL.space(wl, bitserial.WGMMA_ARCH)) == cfg
    with pytest.raises(ValueError, match="is not in"):
        BITSERIAL.checked_config(wl, cfg.replace(WM=48), BITSERIAL.space(wl, "sm_90a"))


def test_persistent_wgmma_blocks_of_four_warpgroups_hold_one_accumulator_plane():
    """Persistent wgmma blocks of 4 warpgroups (128 registers per thread) are offered where a
    thread's accumulators are one m64n128 plane (64 registers: binary activations and weights)
    and not with two planes, which spill."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    for a_prec, ok in ((b1, True), (u2, False)):
        wl = conv(b1, a_prec, EPILOGUES[1], N=4, H=14, W=14, C=256, K=256)
        space = BITSERIAL.space(wl, bitserial.WGMMA_ARCH)
        cfg = BITSERIAL.plain_config(wl, "wgmma", arch=bitserial.WGMMA_ARCH).replace(
            BM=256, BN=128, WN=128, PERSIST=1, KT=1, STAGES=4)
        assert bitserial.threads(cfg) == 512
        assert space.is_valid(cfg) == ok, space.why_invalid(cfg)
        assert space.is_valid(cfg.replace(BM=128)), space.why_invalid(cfg.replace(BM=128))


def test_three_warpgroup_rows_are_wgmma_without_tap_shift():
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[1], N=4, H=7, W=7,
              C=512, K=512)
    space = BITSERIAL.space(wl, bitserial.WGMMA_ARCH)
    bm192 = [c for c in space if c["BM"] == 192]
    assert bm192 and all(c["MMA"] == "wgmma" and not c["TAP_SHIFT"] for c in bm192)
    cfg = BITSERIAL.plain_config(wl, "wgmma", arch=bitserial.WGMMA_ARCH).replace(
        BM=192, BN=128, WN=128)
    assert space.is_valid(cfg) and bitserial.threads(cfg) == 384
    assert "BM=192" in space.why_invalid(cfg.replace(TAP_SHIFT=1, KT=1, STAGES=3))


def test_wide_one_tile_rows_take_one_accumulator_plane():
    """BM=192 x BN=WN=256 one-tile wgmma blocks (132 accumulator registers, 384 threads) are in
    the space for binary weights and activations, where ptxas fits them in 168 registers with
    a few bytes of spill (OTHER_REGS_WGMMA_TILE), and for two-bit activations with the planes
    fused into one accumulator (136 registers), not with two accumulator planes or as
    persistent blocks."""
    b1 = Precision(1, "binary")
    wl = conv(b1, b1, EPILOGUES[5], N=4, H=7, W=7, C=512, K=512)
    space = BITSERIAL.space(wl, bitserial.WGMMA_ARCH)
    cfg = BITSERIAL.plain_config(wl, "wgmma", arch=bitserial.WGMMA_ARCH).replace(
        BM=192, BN=256, WN=256, KT=1, STAGES=4, HALO=0)
    assert bitserial.acc_regs(wl, cfg) == 132 and bitserial.threads(cfg) == 384
    assert space.is_valid(cfg), space.why_invalid(cfg)
    assert "spill" in space.why_invalid(cfg.replace(PERSIST=1, STAGES=6))
    w1a2 = conv(b1, Precision(2), EPILOGUES[1], N=4, H=7, W=7, C=512, K=512)
    w1a2_space = BITSERIAL.space(w1a2, bitserial.WGMMA_ARCH)
    assert "register file" in w1a2_space.why_invalid(
        cfg.replace(BM=192, BN=128, WN=128, REQUANT="threshold"))
    fused = cfg.replace(REQUANT="threshold", FUSE_PLANES=1)
    assert bitserial.acc_regs(w1a2, fused) == 136
    assert w1a2_space.is_valid(fused), w1a2_space.why_invalid(fused)
    assert "accumulator registers" in w1a2_space.why_invalid(fused.replace(FUSE_PLANES=0))


def test_wide_one_tile_default_only_where_it_fills_the_gpu():
    """The w1a1 wgmma default is the 192 x 256 block on grids of at least one such tile per SM
    (ResNet-50 s5 at batch 256: 66 x 2), and a smaller default below that (batch 16); w1a2's
    is the same block with its activation planes fused, both with two columns' thresholds per
    add; signed two-bit activations (which cannot fuse) keep a smaller one."""
    b1, u2, s2 = Precision(1, "binary"), Precision(2), Precision(2, "signed")
    arch = bitserial.WGMMA_ARCH
    for n, wide in ((256, True), (16, False)):
        for a_prec in (b1, u2):
            wl = conv(b1, a_prec, EPILOGUES[5 if a_prec is b1 else 1], N=n, H=7, W=7, C=512,
                      K=512)
            cfg = BITSERIAL.default_config(wl, "wgmma", arch=arch)
            assert ((cfg["BM"], cfg["BN"]) == (192, 256)) == wide, dict(cfg)
            assert cfg["FUSE_PLANES"] == int(wide and a_prec is u2)
            assert cfg["THR_PAIRS"] == int(wide)
    signed = conv(b1, s2, EPILOGUES[1], N=256, H=7, W=7, C=512, K=512)
    assert BITSERIAL.default_config(signed, "wgmma", arch=arch)["BM"] != 192


def test_tap_shift_default_on_narrow_convs_that_fill_the_gpu():
    """Convs of at most 128 output channels that the tap-shift kernel runs get its persistent
    128-row blocks (ones columns for binary weights, two columns' thresholds per add) where
    they make a tile per SM; two activation planes up to 256 output channels two-team 64 x 128
    blocks (slab row sums for binary weights); wider convs, one activation plane past 128
    channels, small grids and unsupported shapes (stride 2) keep the stage kernels."""
    b1, u1, u2 = Precision(1, "binary"), Precision(1), Precision(2)
    arch = bitserial.WGMMA_ARCH

    def default(wl):
        cfg = BITSERIAL.default_config(wl, "wgmma", arch=arch)
        assert cfg in BITSERIAL.space(wl, arch)
        return cfg

    s2 = default(conv(b1, u2, EPILOGUES[1], N=256, H=56, W=56, C=64, K=64))
    assert (s2["TAP_SHIFT"], s2["PERSIST"], s2["BN"], s2["ROWSUM"], s2["THR_PAIRS"]) == (
        1, 1, 64, "cols", 1)
    s3 = default(conv(b1, b1, EPILOGUES[5], N=256, H=28, W=28, C=128, K=128))
    assert (s3["TAP_SHIFT"], s3["BN"], s3["TEAMS"], s3["THR_PAIRS"]) == (1, 128, 1, 1)
    for k in (128, 256):
        two = default(conv(b1, u2, EPILOGUES[1], N=256, H=28, W=28, C=k, K=k))
        assert (two["TAP_SHIFT"], two["BM"], two["TEAMS"], two["ROWSUM"]) == (1, 64, 2, "slab")
    unsigned = default(conv(u1, u2, EPILOGUES[1], N=256, H=14, W=14, C=256, K=256))
    assert (unsigned["TEAMS"], unsigned["ROWSUM"]) == (2, "mma")
    assert not default(conv(b1, b1, EPILOGUES[5], N=256, H=14, W=14, C=256, K=256))["TAP_SHIFT"]
    assert not default(conv(b1, u2, EPILOGUES[1], N=256, H=7, W=7, C=512, K=512))["TAP_SHIFT"]
    assert not default(conv(b1, u2, EPILOGUES[1], N=1, H=8, W=8, C=64, K=64))["TAP_SHIFT"]
    assert not default(conv(b1, u2, EPILOGUES[1], N=256, H=56, W=56, C=64, K=64,
                            stride=2))["TAP_SHIFT"]


def _apnn_conv_config(**changes):
    """The APNN-TC conv (w1a2), its sm_90a space, and a valid 64 x 32 one-warpgroup halo config
    with `changes`."""
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], N=1, H=16, W=16, C=1024,
              K=1024)
    space = BITSERIAL.space(wl, bitserial.WGMMA_ARCH)
    cfg = BITSERIAL.plain_config(wl, "wgmma", arch=bitserial.WGMMA_ARCH).replace(
        BM=64, BN=32, WN=32, HALO=1, **changes)
    assert space.is_valid(cfg), space.why_invalid(cfg)
    return wl, space, cfg


def test_k_slices_only_in_small_one_tile_wgmma_grids():
    """SLICES > 1 (a one-tile wgmma block's k tiles split over sets of its warpgroups) is in the
    space for grids that leave SMs idle, not for persistent or tap-shift blocks, not beyond
    4 warpgroups or under two k tiles per slice, and not on sm_80."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, space, cfg = _apnn_conv_config(KT=1, STAGES=4, SLICES=4)
    assert bitserial.threads(cfg) == 512
    assert BITSERIAL.build(wl, cfg, arch="sm_90a")._main.cubin[:4] == b"\x7fELF"  # NVRTC
    assert "SLICES" in space.why_invalid(cfg.replace(PERSIST=1, HALO=0))
    assert "warpgroups" in space.why_invalid(cfg.replace(WN=16))
    assert BITSERIAL.space(wl, "sm_80").knob("SLICES").values == (1,)
    gemm_small_k = gemm(b1, u2, EPILOGUES[1], M=128, N=128, K=768)  # 3 k tiles
    assert "two of the 3 k tiles" in BITSERIAL.space(gemm_small_k, "sm_90a").why_invalid(
        BITSERIAL.plain_config(gemm_small_k, "wgmma", arch="sm_90a").replace(
            BM=64, BN=32, WN=32, SLICES=2, KT=1))
    big = conv(b1, u2, EPILOGUES[1], N=64, H=56, W=56, C=64, K=64)
    assert BITSERIAL.space(big, bitserial.WGMMA_ARCH).knob("SLICES").values == (1,)


def test_a_in_halo_space():
    """A_IN_HALO=1 (A tiles read in place from a pixel tile's halo) is a one-tile wgmma
    kernel's with HALO=1, on stride-1 convs of channels a multiple of 256 whose k slabs KT
    divides; its grid counts BM / 8 x 8 pixel tiles, margins included, and its halo is the
    tile's window. NVRTC compiles it for sm_90a."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, space, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    assert bitserial.tile_grid(wl, cfg) == (32, 4)
    assert bitserial.halo_bytes(wl, cfg) == 2 * 101 * 1024 // 8  # 10 x 10 pixels, odd stride
    assert BITSERIAL.build(wl, cfg, arch="sm_90a")._main.cubin[:4] == b"\x7fELF"
    assert "HALO=1" in space.why_invalid(cfg.replace(HALO=0))
    assert "ROWSUM='table'" in space.why_invalid(cfg.replace(ROWSUM="table"))
    tall = cfg.replace(BM=128, WN=32, KT=2)  # 16 x 8 pixel tiles: 1 x 2 per image
    assert space.is_valid(tall) and bitserial.tile_grid(wl, tall) == (32, 2)
    margins = conv(b1, u2, EPILOGUES[1], N=3, H=14, W=14, C=256, K=64)
    assert bitserial.block_rows(margins, cfg.replace(KT=1)) == 3 * 2 * 2 * 64
    for other, why in ((conv(b1, u2, N=1, H=16, W=16, C=1024, K=64, stride=2), "stride 1"),
                       (conv(b1, u2, N=1, H=16, W=16, C=384, K=64), "multiple of 256"),
                       (conv(b1, u2, N=1, H=16, W=16, C=512, K=64), "KT to divide")):
        assert why in BITSERIAL.space(other, "sm_90a").why_invalid(
            cfg.replace(BN=64, WN=64, REQUANT="multiply"))
    assert BITSERIAL.space(wl, "sm_80").knob("A_IN_HALO").values == (0,)
    bulk = cfg.replace(STAGES=12, BULK_WEIGHTS=1)  # 9 k tiles, each one bulk copy
    assert space.is_valid(bulk), space.why_invalid(bulk)
    assert bitserial.smem_bytes(wl, bulk) == 12 * 32 * 4 * 32 + 256 + 2 * 101 * 128 + 9 * 8
    assert BITSERIAL.build(wl, bulk, arch="sm_90a")._main.cubin[:4] == b"\x7fELF"
    assert "STAGES >= 11" in space.why_invalid(bulk.replace(STAGES=6))
    assert "A_IN_HALO" in space.why_invalid(bulk.replace(A_IN_HALO=0, HALO=1))



def test_tma_halo_space():
    """TMA_HALO (the in-place window by tensor copies, in channel blocks of 32, 64 or 128
    bytes) is A_IN_HALO's, in one k slice, on whole channel blocks; its window takes the
    blocks' pixel rows rounded up to 8 plus 1,024 bytes of alignment slack per plane and a
    barrier per block; the tensor map's box is one block of the window. sm_90a only."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, space, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    bulk = cfg.replace(STAGES=12, BULK_WEIGHTS=1)
    window = bulk.replace(TMA_HALO=128)  # the window by tensor copies: 128-byte blocks
    assert space.is_valid(window), space.why_invalid(window)
    assert bitserial.halo_bytes(wl, window) == 2 * (104 * 128 + 1024)  # 100 rows, to 8
    assert (bitserial.smem_bytes(wl, window) == bitserial.smem_bytes(wl, bulk)
            - bitserial.halo_bytes(wl, bulk) + bitserial.halo_bytes(wl, window) + 8)
    narrow = window.replace(TMA_HALO=32)  # four 32-byte blocks per plane, a barrier each
    assert bitserial.smem_bytes(wl, narrow) == bitserial.smem_bytes(wl, window) + 3 * 8
    for c in (window, narrow):
        assert BITSERIAL.build(wl, c, arch="sm_90a")._main.cubin[:4] == b"\x7fELF"
    assert "one k slice" in space.why_invalid(cfg.replace(TMA_HALO=32, SLICES=2))
    assert "A_IN_HALO=1's" in space.why_invalid(window.replace(A_IN_HALO=0, BULK_WEIGHTS=0))
    c512 = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=512, K=64)
    assert "multiple of 1024" in BITSERIAL.space(c512, "sm_90a").why_invalid(
        cfg.replace(KT=2, TMA_HALO=128))
    assert BITSERIAL.space(c512, "sm_90a").is_valid(cfg.replace(KT=2, TMA_HALO=64))
    dims, strides, box = bitserial.halo_map_geometry(wl, narrow)
    assert (dims, strides, box) == ([128, 16, 16, 2], [128, 2048, 32768], [32, 10, 10, 1])
    assert BITSERIAL.space(wl, "sm_80").knob("TMA_HALO").values == (0,)


def test_plane_rows_space():
    """PLANE_ROWS (both activation planes as rows of one A tile) halves the pixel tile's rows
    (BM / 16 x 8), keeps both planes' pixels in each chunk of the window (an odd count), and
    is A_IN_HALO's with two activation planes, without TMA_HALO."""
    b1 = Precision(1, "binary")
    wl, space, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    rows2 = cfg.replace(PLANE_ROWS=1)  # 4 x 8 pixel tiles, both planes in each wgmma's rows
    assert space.is_valid(rows2), space.why_invalid(rows2)
    assert bitserial.tile_grid(wl, rows2) == (32, 8)
    assert bitserial.halo_bytes(wl, rows2) == (2 * 6 * 10 | 1) * 128
    assert BITSERIAL.build(wl, rows2, arch="sm_90a")._main.cubin[:4] == b"\x7fELF"
    assert "TMA_HALO" in space.why_invalid(rows2.replace(TMA_HALO=128))
    b1b1 = conv(b1, b1, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=64)  # one activation plane
    assert BITSERIAL.space(b1b1, "sm_90a").knob("PLANE_ROWS").values == (0,)


def test_small_grid_default_splits_long_reductions():
    """Where the preferred wgmma default leaves most SMs idle and the reduction is long, the
    default is a one-warpgroup 64-row block wide enough for half a wave: on convs with the
    in-place halo and every k tile resident where that applies (two activation planes: 64
    wide, weights by bulk copies), else with two k slices and (convs) the halo load; short
    reductions and full grids keep the preferred default."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    arch = bitserial.WGMMA_ARCH

    def default(wl):
        cfg = BITSERIAL.default_config(wl, "wgmma", arch=arch)
        assert cfg in BITSERIAL.space(wl, arch)
        return (cfg["BM"], cfg["BN"], cfg["KT"], cfg["HALO"], cfg["SLICES"])

    apconv = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    assert default(apconv) == (64, 64, 4, 1, 1)  # 4 x 16 tiles of 64 x 64, 9 k tiles resident
    cfg = BITSERIAL.default_config(apconv, "wgmma", arch=arch)
    assert cfg["A_IN_HALO"] == 1 and cfg["STAGES"] == bitserial.RESIDENT_STAGES
    assert cfg["BULK_WEIGHTS"] == 1  # two activation planes
    b1_apconv = conv(b1, b1, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    assert default(b1_apconv) == (64, 32, 4, 1, 1)
    assert BITSERIAL.default_config(b1_apconv, "wgmma", arch=arch)["BULK_WEIGHTS"] == 0
    wide_c = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=2048, K=1024)  # 18 k tiles of 4
    assert default(wide_c) == (64, 32, 2, 1, 2)
    stride2 = conv(b1, u2, EPILOGUES[1], N=1, H=32, W=32, C=1024, K=1024, stride=2)
    assert default(stride2) == (64, 32, 2, 1, 2)
    assert default(gemm(b1, u2, EPILOGUES[1], M=128, N=4096, K=4096)) == (64, 64, 1, 0, 2)
    assert default(gemm(b1, u2, EPILOGUES[1], M=8, N=4096, K=4096)) == (64, 32, 1, 0, 2)
    short = gemm(b1, u2, EPILOGUES[1], M=64, N=1024, K=1024)  # 4 k tiles
    assert default(short)[4] == 1
    assert default(conv(b1, u2, EPILOGUES[1], N=256, H=14, W=14, C=256, K=256))[4] == 1


def test_wgmma_only_on_sm90a():
    wl = gemm(Precision(2, "signed"), Precision(2), EPILOGUES[1], M=512, N=256, K=1024)
    assert {(c["MMA"], c["SWIZZLE"]) for c in BITSERIAL.space(wl, arch="sm_80")} == {
        ("mma_sync", 0)}
    wgmma = [c for c in BITSERIAL.space(wl, arch="sm_90a") if c["MMA"] == "wgmma"]
    assert wgmma
    for c in wgmma:
        assert c["WM"] == 64 and c["STAGES"] >= 3
        # FUSE_PLANES=1: the two activation planes in one accumulator
        planes = 1 if c["FUSE_PLANES"] else 2
        # persistent blocks of 4 warpgroups only with one m64n128's worth of accumulators
        assert not c["PERSIST"] or bitserial.threads(c) <= 256 or planes * 2 * c["WN"] <= 128
        assert 2 * c["WN"] in bitserial.WGMMA_N  # N = w_bits * WN of m64nNk256
        assert bitserial.threads(c) == ((c["BM"] // 64) * (c["BN"] // c["WN"]) * 128
                                        * c["TEAMS"] * c["SLICES"])
        assert bitserial.acc_regs(wl, c) == planes * 2 * c["WN"] // 2  # a warp's m16 x N share
    assert {c["FUSE_PLANES"] for c in wgmma} == {0, 1}
    # not for signed activations (coefficient -2), nor mma.sync kernels
    signed = gemm(Precision(2), Precision(2, "signed"), EPILOGUES[1], M=512, N=256, K=1024)
    assert BITSERIAL.space(signed, arch="sm_90a").knob("FUSE_PLANES").values == (0,)
    sync = next(c for c in BITSERIAL.space(wl, arch="sm_90a") if c["MMA"] == "mma_sync")
    assert "wgmma" in BITSERIAL.space(wl, arch="sm_90a").why_invalid(sync.replace(FUSE_PLANES=1))
    cfg = BITSERIAL.default_config(wl, "wgmma", arch="sm_90a")
    assert cfg["MMA"] == "wgmma"
    with pytest.raises(ValueError, match="sm_80"):
        BITSERIAL.build(wl, cfg, arch="sm_80")
    # no kind named: wgmma where it exists (measured 1.3-2.1x faster on H100), else mma.sync
    assert BITSERIAL.default_config(wl, arch="sm_90a")["MMA"] == "wgmma"
    assert BITSERIAL.default_config(wl, arch="sm_80")["MMA"] == "mma_sync"


@pytest.mark.parametrize("epi,requant", [(EPILOGUES[1], "threshold"), (EPILOGUES[5], "threshold"),
                                         (EPILOGUES[4], "multiply"), (EPILOGUES[0], "multiply")])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_defaults_requantize_by_thresholds_where_allowed(epi, requant, arch):
    """1-2 bit bit-plane outputs default to REQUANT="threshold" (it won every measured row);
    3-bit planes and int32 outputs cannot use it."""
    wl = conv(Precision(1, "binary"), Precision(2), epi)
    for mma in ("mma_sync", "wgmma") if arch == "sm_90a" else ("mma_sync",):
        cfg = BITSERIAL.default_config(wl, mma, arch=arch)
        assert cfg["REQUANT"] == requant and cfg in BITSERIAL.space(wl, arch)


def test_render_names_the_knobs():
    wl = conv(Precision(2, "signed"), Precision(3), EPILOGUES[1], stride=2)
    src = bitserial.render(wl, BITSERIAL.default_config(wl, "mma_sync"))
    for name in ("BM", "BN", "WM", "WN", "KT", "STAGES", "PERSIST", "WGMMA", "VEC", "STRIDE",
                 "OUT_MODE"):
        assert f"constexpr int {name} = " in src
    assert "constexpr int STRIDE = 2;" in src and "constexpr int W_SIGNED = 1;" in src
    assert "and.popc" in src and "wgmma.mma_async" not in src
    src = bitserial.render(wl, BITSERIAL.default_config(wl, "wgmma", arch="sm_90a"))
    assert "constexpr int WGMMA = 1;" in src
    wn = BITSERIAL.default_config(wl, "wgmma", arch="sm_90a")["WN"]
    assert f"wgmma.mma_async.sync.aligned.m64n{2 * wn}k256.s32.b1.b1.and.popc" in src


def _compile_sample() -> list[tuple[object, Config]]:
    rng = random.Random(6)
    cases = []
    for i, (wb, ab) in enumerate([(1, 1), (1, 2), (2, 2), (3, 4)]):
        for make in (conv, gemm):
            wl = make(rng.choice(encodings(wb)), rng.choice(encodings(ab)),
                      EPILOGUES[i % len(EPILOGUES)])
            cfg = BITSERIAL.space(wl).sample(1, rng)[0]
            cases.append((wl, cfg))
    return cases


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_sample_configs(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    for wl, cfg in _compile_sample():
        cfg = cfg.replace(MMA="mma_sync", SWIZZLE=0)
        for persist, halo in ((0, 0), (1, 0), (0, 1)):  # both mma.sync bodies, halo load
            cfg = cfg.replace(PERSIST=persist, HALO=halo)
            if BITSERIAL.space(wl, arch).is_valid(cfg):
                kernel = BITSERIAL.build(wl, cfg, arch=arch)
                assert kernel._main.cubin[:4] == b"\x7fELF"
                assert kernel._main.name == ("bitserial_persistent" if persist
                                             else "bitserial_kernel")


def test_nvrtc_compiles_wgmma_sample_configs(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    rng = random.Random(9)
    for wl, _ in _compile_sample():
        space = [c for c in BITSERIAL.space(wl, "sm_90a")  # (tap-shift: its own test file)
                 if c["MMA"] == "wgmma" and not c["TAP_SHIFT"]]
        default = BITSERIAL.default_config(wl, "wgmma", arch="sm_90a")
        persistent = [c for c in space if c["PERSIST"]]
        for cfg in [default, default.replace(SWIZZLE=32, HALO=1), rng.choice(space),
                    rng.choice(persistent)]:
            if not BITSERIAL.space(wl, "sm_90a").is_valid(cfg):
                cfg = cfg.replace(HALO=0)
            kernel = BITSERIAL.build(wl, cfg, arch="sm_90a")
            assert kernel._main.cubin[:4] == b"\x7fELF"
            assert kernel._main.name == ("bitserial_wgmma_persistent" if cfg["PERSIST"]
                                         else "bitserial_wgmma")


def _chained_configs(arch):
    """(workload, config) per kernel body: the APNN-TC conv's defaults (w1a2: the in-place
    block with bulk weights, whose weights go out before the wait; w1a1), a block reading the
    row-sum table (the xpop kernel chained too), a tap-shift block, persistent wgmma and
    mma.sync blocks."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    apconv = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    b1_apconv = conv(b1, b1, EPILOGUES[5], N=1, H=16, W=16, C=1024, K=1024)
    s3 = conv(b1, u2, EPILOGUES[1], N=4, H=28, W=28, C=128, K=128)
    cases = [(s3, BITSERIAL.plain_config(s3, "mma_sync", arch=arch).replace(PERSIST=1))]
    if arch == "sm_90a":
        cases += [(apconv, BITSERIAL.default_config(apconv, "wgmma", arch=arch)),
                  (b1_apconv, BITSERIAL.default_config(b1_apconv, "wgmma", arch=arch)),
                  (b1_apconv, BITSERIAL.plain_config(b1_apconv, "wgmma", arch=arch).replace(
                      ROWSUM="table")),
                  (s3, BITSERIAL.plain_config(s3, "wgmma", arch=arch).replace(
                      TAP_SHIFT=1, KT=1, STAGES=3, HALO=0, PERSIST=0)),
                  (s3, BITSERIAL.plain_config(s3, "wgmma", arch=arch).replace(PERSIST=1))]
    for wl, cfg in cases:
        assert BITSERIAL.space(wl, arch).is_valid(cfg), BITSERIAL.space(wl, arch).why_invalid(cfg)
    return cases


def _ptx_entry(ptx: str, name: str) -> str:
    body = ptx[ptx.index(f".entry {name}"):]
    end = body.find(".entry ", 1)
    return body if end < 0 else body[:end]


@pytest.mark.parametrize("trigger", sorted(bitserial.CHAIN_TRIGGERS))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_chained_kernels(arch, trigger, tmp_path, monkeypatch):
    """CHAINED kernels compile for both targets; on sm_90a every kernel that reads x waits for
    the previous grid (griddepcontrol.wait) and lets the next one launch: at its start, or
    ("after_mma") the one-tile kernels after their last MMA and persistent ones at exit; the
    in-place block with bulk weights issues its weights' copies before the wait and its
    window's after. On sm_80 (no PDL) the instructions are left out."""
    from lowbit.kernels.cuda.nvrtc import compile_ptx

    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    mode = bitserial.CHAIN_TRIGGERS[trigger]
    for wl, cfg in _chained_configs(arch):
        ptx = compile_ptx(bitserial.render(wl, cfg, chained=mode), arch).decode()
        main = _ptx_entry(ptx, bitserial.kernel_name(cfg))
        xpop = _ptx_entry(ptx, "bitserial_xpop")
        if arch != "sm_90a":
            assert "griddepcontrol" not in ptx
            continue
        assert xpop.index("griddepcontrol.launch_dependents") < xpop.index("griddepcontrol.wait")
        wait = main.index("griddepcontrol.wait")
        if trigger == "start":
            assert main.index("griddepcontrol.launch_dependents") < wait
        elif cfg["PERSIST"]:
            assert "griddepcontrol.launch_dependents" not in main
        else:
            mma = "wgmma.mma_async" if cfg["MMA"] == "wgmma" else "mma.sync"
            assert wait < main.rindex(mma) < main.index("griddepcontrol.launch_dependents")
        if cfg["BULK_WEIGHTS"]:
            assert main.index("cp.async.bulk.shared") < wait < main.index("cp.async.cg.shared")
        assert "griddepcontrol" not in compile_ptx(bitserial.render(wl, cfg), arch).decode()


def test_chained_bind_refuses_bad_requests(tmp_path, monkeypatch):
    """bind(chained=True) on a kernel built for sm_80, or with an unknown trigger, is refused
    before any launch."""
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    wl, cfg = _chained_configs("sm_80")[0]
    kernel = BITSERIAL.build(wl, cfg, arch="sm_80")
    x, w, params = random_inputs(wl, 1)
    with pytest.raises(ValueError, match="chained=True needs sm_90"):
        kernel.bind(x, w, params, chained=True)
    with pytest.raises(ValueError, match="trigger must be 'auto' or one of"):
        kernel.bind(x, w, params, chained=True, trigger="late")


@pytest.mark.parametrize("blocks,per_sm,persistent,want", [
    (64, 1, False, "start"),        # APNN-TC conv w1a2, 64-wide: the other SMs are free
    (128, 3, False, "after_mma"),   # ... 32-wide: three fit an SM, one wave
    (64, 2, False, "after_mma"),    # ... w1a1 64-wide
    (512, 7, False, "after_mma"),   # the c512 sweep layer's 32-wide blocks
    (512, 2, False, "start"),       # the c1024 sweep layer at w1a1: two waves
    (264, 2, True, "start"),        # persistent blocks trigger at exit otherwise
])
def test_chain_trigger_rule(blocks, per_sm, persistent, want):
    """trigger="auto": "after_mma" only for one wave of blocks that share SMs (measured on an
    H100, layer_chain-20261126-054513.json)."""
    assert bitserial.chain_trigger(blocks, per_sm, 132, persistent) == want


SPLIT_CASES = [  # (workload, MMA, knob changes): split-K with every kind of epilogue term
    (conv(Precision(2, "signed"), Precision(2), EPILOGUES[1], N=1, H=6, W=5, C=280, K=37),
     "mma_sync", {"SPLIT_K": 4, "KT": 1}),
    (conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=2, H=5, W=9, C=448,
          K=70), "mma_sync", {"SPLIT_K": 8, "KT": 1, "REQUANT": "threshold"}),
    (conv(Precision(1, "binary"), Precision(2), EPILOGUES[3], N=1, H=16, W=16, C=1024, K=256),
     "mma_sync", {"SPLIT_K": 4}),
    (gemm(Precision(1, "binary"), Precision(2), EPILOGUES[2], M=128, N=512, K=4096),
     "mma_sync", {"SPLIT_K": 8, "ROWSUM": "table"}),
    (gemm(Precision(3, "signed"), Precision(1, "binary"), EPILOGUES[0], M=40, N=45, K=4090),
     "mma_sync", {"SPLIT_K": 2}),
    # the APNN-TC conv at w1a1 (binary activations with padding, 1-bit threshold output): its
    # wgmma 128x256 split-K twin was wrong on the H100 (NOTES.md); the mma.sync one
    (conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=1, H=16, W=16,
          C=1024, K=1024), "mma_sync", {"SPLIT_K": 2, "KT": 4, "REQUANT": "threshold"}),
]


def _split_config(wl, mma, changes, arch):
    cfg = BITSERIAL.plain_config(wl, mma, arch=arch).replace(**changes)
    assert BITSERIAL.space(wl, arch).is_valid(cfg), (wl.key, dict(cfg))
    return cfg


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_split_k(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    for wl, mma, changes in SPLIT_CASES:
        if mma == "wgmma" and arch != "sm_90a":
            continue
        kernel = BITSERIAL.build(wl, _split_config(wl, mma, changes, arch), arch=arch)
        assert kernel._main.cubin[:4] == b"\x7fELF"
        assert "constexpr int SPLIT_K = " + str(changes["SPLIT_K"]) in kernel.source


def test_halo_rows_cover_every_tap_of_the_block():
    """The halo slab starts where the kernel starts it and holds every input row that a valid
    tap of any output pixel of the block reads."""
    for shape in (dict(N=3, H=11, W=13, C=64, K=8, R=5, S=5, stride=1, pad=2),
                  dict(N=2, H=9, W=9, C=33, K=8, R=3, S=3, stride=2, pad=1),
                  dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3)):
        sh = bitserial.conv_shape(ConvWorkload(**shape))
        for bm in (16, 64, 128):
            height = bitserial.halo_rows(sh, bm)
            for m0 in range(0, sh.rows, bm):
                n0, p0 = divmod(m0 // sh.q, sh.p)
                first = n0 * sh.h + max(0, p0 * sh.stride - sh.pad)  # as halo_load computes it
                for m in range(m0, min(m0 + bm, sh.rows)):
                    n, p = divmod(m // sh.q, sh.p)
                    for r in range(sh.r):
                        ih = p * sh.stride - sh.pad + r
                        if 0 <= ih < sh.h:
                            assert first <= n * sh.h + ih < first + height


def test_halo_constraints():
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[0])
    space = BITSERIAL.space(wl, "sm_90a")
    base = BITSERIAL.default_config(wl, arch="sm_90a")
    assert space.is_valid(base.replace(HALO=1))
    assert space.is_valid(BITSERIAL.plain_config(wl, "wgmma", arch="sm_90a").replace(HALO=1))
    assert "PERSIST=0" in space.why_invalid(base.replace(HALO=1, PERSIST=1))
    g = gemm(Precision(1, "binary"), Precision(2), EPILOGUES[0])
    assert "1x1" in BITSERIAL.space(g, "sm_90a").why_invalid(
        BITSERIAL.plain_config(g, arch="sm_90a").replace(HALO=1))
    assert bitserial.smem_bytes(wl, base.replace(HALO=1)) > bitserial.smem_bytes(wl, base)
    assert "constexpr int HALO = 1;" in bitserial.render(wl, base.replace(HALO=1))


# ---------------------------------------------------------------- GPU: bit-exact

VARIANTS = [("mma_sync", 0, 0), ("mma_sync", 1, 0), ("wgmma", 0, 0), ("wgmma", 0, 32)]


def _config(wl, variant):
    """The default config of a (MMA, PERSIST, SWIZZLE) variant, requantizing by multiplication
    (test_bit_exact_threshold_epilogue covers the thresholds); None where the GPU has no
    wgmma."""
    mma, persist, swizzle = variant
    if mma == "wgmma" and bitserial.device_arch() != bitserial.WGMMA_ARCH:
        return None
    return BITSERIAL.plain_config(wl, mma).replace(PERSIST=persist, SWIZZLE=swizzle,
                                                     REQUANT="multiply")


def _poisoned_run(wl, cfg=None, seed=0):
    """(kernel output over a poisoned buffer, reference output)."""
    kernel = BITSERIAL.build(wl, cfg or BITSERIAL.default_config(wl))
    x, w, params = random_inputs(wl, seed, device="cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    out = torch.empty(want.shape, dtype=want.dtype, device="cuda")
    out.view(torch.uint8).fill_(0xA5)
    got = kernel(x, w, params, out=out)
    assert got is out
    return got.cpu(), want


def _assert_exact(wl, cfg=None, seed=0):
    got, want = _poisoned_run(wl, cfg, seed)
    assert got.dtype == want.dtype and got.shape == want.shape, wl.key
    if got.dtype == torch.float16:
        got, want = got.view(torch.int16), want.view(torch.int16)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        pairs = [(tuple(i.tolist()), got[tuple(i)].item(), want[tuple(i)].item()) for i in bad[:6]]
        raise AssertionError(f"{wl.key} {dict(cfg or BITSERIAL.default_config(wl))}: "
                             f"{len(bad)}/{got.numel()} wrong; (index, got, want): {pairs}")


_PAIRS = list(itertools.product(range(1, 5), range(1, 5)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("wb,ab", _PAIRS)
@pytest.mark.parametrize("combo", range(4))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_every_precision_and_encoding(wb, ab, combo, variant):
    """All four encoding pairs of every bit pair: two as convs (stride 1 and 2), two as GEMMs;
    one-tile-per-block and persistent mma.sync kernels, and the wgmma kernel (sm_90a)."""
    w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
    epi = EPILOGUES[(wb * 4 + ab + combo) % len(EPILOGUES)]
    if combo in (0, 3):
        stride, pad = (2, 2) if combo == 3 else (1, 1)
        taps = 1 + 2 * ((wb + ab) % 3)
        wl = conv(w_prec, a_prec, epi, stride=stride, pad=pad, R=taps, S=taps)
    else:
        wl = gemm(w_prec, a_prec, epi, M=33 + 16 * combo, N=40 + wb, K=200 + 67 * ab)
    cfg = _config(wl, variant)
    if cfg is None:
        pytest.skip("wgmma needs sm_90a")
    _assert_exact(wl, cfg, seed=wb * 100 + ab * 10 + combo)


@pytest.mark.parametrize("shape", [
    dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3),
    dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
    dict(N=1, H=8, W=8, C=96, K=33, R=2, S=2, stride=2, pad=0),
    dict(N=2, H=6, W=6, C=128, K=64, R=3, S=3, stride=1, pad=0),
    dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_odd_conv_shapes(shape):
    for i, (w, a) in enumerate([(Precision(1, "binary"), Precision(1, "binary")),
                                (Precision(1, "binary"), Precision(2)),
                                (Precision(2, "signed"), Precision(3, "signed"))]):
        wl = conv(w, a, EPILOGUES[i + 1], **shape)
        for variant in (VARIANTS[i % 2], VARIANTS[2 + i % 2]):
            cfg = _config(wl, variant)
            if cfg is not None:
                _assert_exact(wl, cfg, seed=i)


@pytest.mark.parametrize("case", range(len(SPLIT_CASES)))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_split_k(case):
    """Split-K configs, launched three times through one bound launcher (the workspace and the
    tile counters are reused: each launch must leave the counters at zero), the output poisoned
    before each launch."""
    wl, mma, changes = SPLIT_CASES[case]
    if mma == "wgmma" and bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    cfg = _split_config(wl, mma, changes, bitserial.device_arch())
    x, w, params = random_inputs(wl, case, device="cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    out = torch.empty(want.shape, dtype=want.dtype, device="cuda")
    launch = BITSERIAL.build(wl, cfg).bind(x, w, params, out)
    for _ in range(3):
        out.view(torch.uint8).fill_(0xA5)
        got = launch().cpu()
        if got.dtype == torch.float16:
            got, want = got.view(torch.int16), want.view(torch.int16)
        assert torch.equal(got, want), (wl.key, dict(cfg))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 1), (3, 3)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_row_table(wb, ab, variant):
    """ROW_TABLE=1 (rows' output rows and tap rectangles from the bound table) on each kernel
    variant, both encodings per operand, stride 1 and 2 with padding, thresholds where the
    output allows and multiplying requantization."""
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        wl = conv(w_prec, a_prec, EPILOGUES[(wb + ab + combo) % len(EPILOGUES)], N=2, H=9, W=7,
                  C=96, K=70, stride=1 + combo % 2)
        cfg = _config(wl, variant)
        if cfg is None:
            continue
        for requant in {"multiply", BITSERIAL.default_config(wl)["REQUANT"]}:
            _assert_exact(wl, cfg.replace(ROW_TABLE=1, REQUANT=requant), seed=combo)


def _kernel_variant_workload(w_prec: Precision, a_prec: Precision, epi: Epilogue,
                             combo: int):
    """The workload of a kernel-variant GPU test's `combo` (0..3): a 3x3 conv of stride 1
    (even combos) or 2 (odd), and a GEMM for combo 3."""
    if combo == 3:
        return gemm(w_prec, a_prec, epi, M=333, N=96, K=700)
    return conv(w_prec, a_prec, epi, N=3, H=11, W=9, C=96, K=70, stride=1 + combo % 2)


@pytest.mark.parametrize("wb,ab", _PAIRS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_persistent_wgmma_teams(wb, ab):
    """TEAMS=2 in the persistent wgmma kernel (two teams of warpgroups taking a block's tiles
    in turn, MMA issue ordered by named barriers): every bit pair and encoding pair, convs with
    stride 1 and 2 and a GEMM, the first and the last valid team config of each (tile counts
    per team vary with the grid; wider bit pairs may have none: registers)."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("needs an sm_90a GPU")
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = _kernel_variant_workload(w_prec, a_prec, epi, combo)
        teams = [c for c in BITSERIAL.space(wl) if c["TEAMS"] == 2 and not c["TAP_SHIFT"]]
        assert teams or wb * ab >= 6, "two teams fit every bit pair of up to 5 plane products"
        for cfg in teams[:1] + teams[-1:]:
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("wb", range(1, 5))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_fused_planes(wb):
    """FUSE_PLANES=1 (the two unsigned activation planes summed in one accumulator by the
    wgmma, plane 1 issued twice): every weight encoding, conv stride 1 and 2 and a GEMM, one
    tile per block, persistent and two teams, both requantizations."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("needs an sm_90a GPU")
    rng = random.Random(wb)
    for combo, w_prec in enumerate(encodings(wb) * 2):
        epi = EPILOGUES[(wb + combo) % len(EPILOGUES)]
        wl = _kernel_variant_workload(w_prec, Precision(2), epi, combo)
        fused = [c for c in BITSERIAL.space(wl) if c["FUSE_PLANES"] and not c["TAP_SHIFT"]]
        persistent = [c for c in fused if c["PERSIST"]]
        teams = [c for c in persistent if c["TEAMS"] == 2]
        for cfg in (fused[0], *persistent[-1:], *teams[:1], rng.choice(fused)):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("ab", range(1, 5))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_rowsum_cols(ab):
    """ROWSUM="cols" in the wgmma kernels without tap-shift (the row popcounts from ones
    columns after the weights, N = WN + 16): binary weights x every activation encoding, conv
    stride 1 and 2 and a GEMM, one tile per block, with the duplicate-aware load, persistent
    and two teams."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("needs an sm_90a GPU")
    rng = random.Random(ab)
    for combo, a_prec in enumerate(encodings(ab) * 2):
        epi = EPILOGUES[(ab + combo) % len(EPILOGUES)]
        w_prec = Precision(1, "binary")
        wl = _kernel_variant_workload(w_prec, a_prec, epi, combo)
        cols = [c for c in BITSERIAL.space(wl) if c["ROWSUM"] == "cols" and not c["TAP_SHIFT"]]
        persistent = [c for c in cols if c["PERSIST"]]
        halo = [c for c in cols if c["HALO"]]
        teams = [c for c in persistent if c["TEAMS"] == 2]
        for cfg in (cols[0], *halo[-1:], *persistent[-1:], *teams[:1], rng.choice(cols)):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bound_launcher_keeps_the_weight_tables_of_bind_time():
    """Binary activations: the weight sums per tap rectangle are filled once, at bind. A
    launcher replays them (exact, three times); after new weights are copied into the bound
    tensor its `refresh_tables()` makes it exact for those, without a new bind."""
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=2, H=7, W=6, C=64,
              K=48)
    x, w, params = random_inputs(wl, 11, device="cuda")
    launch = BITSERIAL.build(wl, BITSERIAL.default_config(wl)).bind(x, w, params)
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    for _ in range(3):
        got = launch()
        assert torch.equal(got.cpu(), want)
        got.fill_(-1)
    _, w2, _ = random_inputs(wl, 12, device="cuda")
    w.copy_(w2)
    launch.refresh_tables()
    want2 = run(wl, x.cpu(), w2.cpu(), params.to("cpu"))
    assert not torch.equal(want2, want)
    assert torch.equal(launch().cpu(), want2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_across_configs():
    rng = random.Random(1)
    for wl in (conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], N=4, C=96, K=96),
               gemm(Precision(2, "signed"), Precision(2), EPILOGUES[0], M=200, N=130, K=700)):
        space = BITSERIAL.space(wl)
        wgmma = [c for c in space if c["MMA"] == "wgmma"]
        for cfg in space.sample(10, rng) + rng.sample(wgmma, min(6, len(wgmma))):
            _assert_exact(wl, cfg, seed=rng.randrange(1000))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_shared_workloads():
    epi = Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP)
    for suite in ("resnet18_b8", "apconv_sweep"):
        for name, wl in load_workloads(suite, w=Precision(1, "binary"), a=Precision(2),
                                       w_layout=BP, a_layout=BP, epilogue=epi):
            if wl.gemm_shape[0] * wl.gemm_shape[1] * wl.gemm_shape[2] > 5e9:
                continue  # keep the CPU reference quick
            for variant in VARIANTS[::2]:
                cfg = _config(wl, variant)
                if cfg is not None:
                    got, want = _poisoned_run(wl, cfg, seed=len(name))
                    assert torch.equal(got, want), (name, dict(cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bad_inputs_raise_before_launch():
    wl = gemm(Precision(1), Precision(2))
    kernel = BITSERIAL.build(wl, BITSERIAL.default_config(wl))
    x, w, params = random_inputs(wl, 0, device="cuda")
    with pytest.raises(TypeError, match="x"):
        kernel(x.to(torch.int64), w, params)
    with pytest.raises(ValueError, match="w"):
        kernel(x, w[:, :-1].contiguous(), params)
    with pytest.raises(ValueError, match="CUDA"):
        kernel(x.cpu(), w.cpu(), params.to("cpu"))


@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("wb,ab", _PAIRS)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_halo_load(wb, ab, mma):
    """HALO=1 (duplicate-aware load) on convs: every bit pair, all encodings, odd shapes,
    stride 2, padding, blocks spanning image boundaries; mma.sync and wgmma kernels."""
    shapes = [dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
              dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
              dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3),
              dict(N=2, H=6, W=6, C=128, K=64, R=3, S=3, stride=1, pad=0)]
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        wl = conv(w_prec, a_prec, EPILOGUES[(wb + ab + combo) % len(EPILOGUES)],
                  **shapes[(wb + ab + combo) % len(shapes)])
        cfg = _config(wl, (mma, 0, 32 * (combo % 2) if mma == "wgmma" else 0))
        if cfg is None:
            pytest.skip("wgmma needs sm_90a")
        _assert_exact(wl, cfg.replace(HALO=1), seed=wb * 100 + ab * 10 + combo)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_halo_shared_workloads():
    epi = Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP)
    for name, wl in load_workloads("resnet18_b8", w=Precision(1, "binary"), a=Precision(2),
                                   w_layout=BP, a_layout=BP, epilogue=epi):
        for variant in VARIANTS[::2]:
            cfg = _config(wl, variant)
            if cfg is None or wl.R * wl.S == 1:
                continue
            cfg = cfg.replace(HALO=1)
            if not BITSERIAL.space(wl).is_valid(cfg):
                continue
            got, want = _poisoned_run(wl, cfg, seed=len(name))
            assert torch.equal(got, want), (name, dict(cfg))


ROWSUM_SHAPES = [dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
                 dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
                 dict(N=2, H=6, W=6, C=128, K=64, R=1, S=1, stride=1, pad=0)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_rowsum_table_configs(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], **ROWSUM_SHAPES[0])
    mmas = ("mma_sync", "wgmma") if arch == "sm_90a" else ("mma_sync",)
    for mma in mmas:
        cfg = BITSERIAL.plain_config(wl, mma, arch=arch).replace(ROWSUM="table")
        kernel = BITSERIAL.build(wl, cfg, arch=arch)
        assert kernel._xpop.cubin[:4] == b"\x7fELF"
        assert bitserial.side_tables(wl, kernel.config, "cpu")[1] is not None  # xpop filled
    with pytest.raises(ValueError, match="ROWSUM='table' not in"):  # no binary weights
        plain = conv(Precision(2), Precision(2), EPILOGUES[1])
        BITSERIAL.build(plain, BITSERIAL.plain_config(plain, arch=arch).replace(ROWSUM="table"),
                        arch=arch)


@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("ab", [1, 2, 4])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_rowsum_table(ab, mma):
    """ROWSUM='table' (binary weights' row popcounts from the per-pixel table): every
    activation encoding, padding, stride 2, 1x1, both MMA kinds, persistent and halo too."""
    for combo, a_prec in enumerate(encodings(ab)):
        for i, shape in enumerate(ROWSUM_SHAPES):
            wl = conv(Precision(1, "binary"), a_prec, EPILOGUES[(ab + combo + i) % 6], **shape)
            cfg = _config(wl, (mma, 0, 32 if mma == "wgmma" else 0))
            if cfg is None:
                pytest.skip("wgmma needs sm_90a")
            twins = [cfg, cfg.replace(PERSIST=1), cfg.replace(HALO=1)]
            for c in twins:
                c = c.replace(ROWSUM="table")
                if BITSERIAL.space(wl).is_valid(c):
                    _assert_exact(wl, c, seed=ab * 10 + combo + i)


THRESHOLD_EPILOGUES = [EPILOGUES[1], EPILOGUES[5],  # u2 / u1 with bias + ReLU
                      Epilogue(out=Precision(2, "signed"), out_layout=BP),
                      Epilogue(bias=True, out=Precision(1), out_layout=BP)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_threshold_configs(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], **ROWSUM_SHAPES[1])
    mmas = ("mma_sync", "wgmma") if arch == "sm_90a" else ("mma_sync",)
    for mma in mmas:
        cfg = BITSERIAL.plain_config(wl, mma, arch=arch).replace(REQUANT="threshold")
        assert "OUT_THRESH = 1;" in BITSERIAL.build(wl, cfg, arch=arch).source
    for epi in (EPILOGUES[4], EPILOGUES[0]):  # 3-bit planes, int32: no thresholds
        plain = conv(Precision(2), Precision(2), epi)
        with pytest.raises(ValueError, match="REQUANT='threshold' not in"):
            BITSERIAL.build(plain, BITSERIAL.plain_config(plain, arch=arch)
                            .replace(REQUANT="threshold"), arch=arch)


def test_threshold_table_is_padded_for_unguarded_pair_loads():
    """The kernel loads a lane's column pair of thresholds without a KOUT guard: the table has
    wsum_columns rows (a block tile never leaves it), INT32_MAX past KOUT (never reached, so
    those codes are qmin's bits, masked at the store) and in the fourth column that pads 3
    levels to 16 bytes, and the reference's values in front."""
    from lowbit.reference.epilogue import INT32_MAX, requant_thresholds

    epi = Epilogue(bias=True, relu=True, out=Precision(2, "signed"), out_layout=BP)
    wl = conv(Precision(1, "binary"), Precision(2), epi, K=37)
    params = random_inputs(wl, 3)[2]
    cfg = BITSERIAL.plain_config(wl, arch="sm_90a").replace(REQUANT="threshold")
    table = bitserial.epilogue_thresholds(wl, cfg, params)
    want = requant_thresholds(epi, params)
    assert table.shape == (bitserial.wsum_columns(bitserial.conv_shape(wl)), 4)
    assert torch.equal(table[:37, :3], want)
    assert bool((table[37:] == INT32_MAX).all()) and bool((table[:, 3] == INT32_MAX).all())
    assert bitserial.epilogue_thresholds(wl, cfg.replace(REQUANT="multiply"), params) is None


@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_threshold_epilogue(wb, ab, mma):
    """REQUANT='threshold' (bias, ReLU, requantize to 1-2 bit planes as integer compares):
    every encoding pair, u1/u2/s2 outputs with and without bias and ReLU, padding, stride 2,
    1x1, one tile per block and persistent."""
    for combo, (w_prec, a_prec) in enumerate(itertools.product(encodings(wb), encodings(ab))):
        for i, shape in enumerate(ROWSUM_SHAPES):
            epi = THRESHOLD_EPILOGUES[(combo + i) % len(THRESHOLD_EPILOGUES)]
            wl = conv(w_prec, a_prec, epi, **shape)
            cfg = _config(wl, (mma, 0, 32 if mma == "wgmma" else 0))
            if cfg is None:
                pytest.skip("wgmma needs sm_90a")
            for c in (cfg, cfg.replace(PERSIST=1)):
                c = c.replace(REQUANT="threshold")
                if BITSERIAL.space(wl).is_valid(c):
                    _assert_exact(wl, c, seed=wb * 100 + ab * 10 + combo + i)


_B1, _S2 = Precision(1, "binary"), Precision(2, "signed")
PAIR_WORKLOADS = [  # kernels without tap-shift: the pair table from bind, in global memory
    conv(_B1, Precision(2), THRESHOLD_EPILOGUES[0], N=2, H=9, W=7, C=64, K=300),
    conv(_S2, Precision(2), THRESHOLD_EPILOGUES[2], N=2, H=9, W=9, C=128, K=70, stride=2),
    conv(Precision(1), _S2, THRESHOLD_EPILOGUES[1], N=2, H=7, W=6, C=45, K=37),
    gemm(_B1, Precision(2), THRESHOLD_EPILOGUES[3], M=300, N=260, K=512),
    gemm(_S2, Precision(1), THRESHOLD_EPILOGUES[0], M=77, N=200, K=1000),
    # binary activations: thresholds per tap rectangle, packed by the wtap kernel
    conv(_B1, _B1, THRESHOLD_EPILOGUES[1], N=2, H=9, W=8, C=64, K=300),
    conv(Precision(1), _B1, THRESHOLD_EPILOGUES[2], N=2, H=7, W=8, C=96, K=70, R=5, S=5, pad=2),
    gemm(_B1, _B1, THRESHOLD_EPILOGUES[0], M=300, N=130, K=700),
]


@pytest.mark.parametrize("wl", PAIR_WORKLOADS, ids=lambda wl: wl.key[:40])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_threshold_pairs_outside_tap_shift(wl):
    """THR_PAIRS in the one-tile and persistent wgmma kernels (two columns' thresholds per add
    from the packed table of bind): binary, unsigned and signed weights and activations, one-
    and two-bit outputs, stride 2, odd channel counts, GEMMs; the space's first and last such
    configs, its first with 64 channels per lane (WN = 256) and two random ones."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    rng = random.Random(len(wl.key))
    pairs = [c for c in BITSERIAL.space(wl) if c["THR_PAIRS"] and not c["TAP_SHIFT"]]
    wide = [c for c in pairs if c["WN"] == 256]
    assert pairs
    for cfg in pairs[:1] + pairs[-1:] + wide[:1] + rng.sample(pairs, 2):
        _assert_exact(wl, cfg, seed=len(wl.key) + cfg["WN"])


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1), (4, 4)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_persistent_wgmma(wb, ab):
    """PERSIST=1 with wgmma (bitserial_wgmma_persistent.cu): tiles looped per block with the
    copy pipeline across tile boundaries; convs and GEMMs, both swizzles, both row-sum modes."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    rng = random.Random(wb * 10 + ab)
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = (conv(w_prec, a_prec, epi, N=4, H=9, W=9, C=96, K=70, stride=1 + combo % 2)
              if combo % 2 == 0 else gemm(w_prec, a_prec, epi, M=300, N=130, K=700))
        pts = [c for c in BITSERIAL.space(wl) if c["MMA"] == "wgmma" and c["PERSIST"]]
        for cfg in rng.sample(pts, min(2, len(pts))):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("combo", range(4))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_wide_one_tile_rows(combo):
    """BM=192 x BN=WN=256 one-tile wgmma blocks (168 registers with a few bytes of spill), all
    four w1a1 encoding pairs: convs with border taps and partial column tiles (stride 1 and 2,
    with and without the halo load) and a GEMM, thresholds and multipliers."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    w_prec, a_prec = encodings(1)[combo // 2], encodings(1)[combo % 2]
    epi = EPILOGUES[(combo * 3 + 1) % len(EPILOGUES)]
    wl = (conv(w_prec, a_prec, epi, N=4, H=21, W=19, C=96, K=300, stride=1 + combo // 2)
          if combo < 3 else gemm(w_prec, a_prec, epi, M=500, N=300, K=900))
    space = BITSERIAL.space(wl)
    for changes in ({"HALO": 0, "STAGES": 4}, {"HALO": int(combo < 3), "STAGES": 6},
                    {"HALO": 0, "STAGES": 6, "REQUANT": "multiply"}):
        cfg = BITSERIAL.plain_config(wl, "wgmma").replace(BM=192, BN=256, WN=256, KT=1,
                                                            **changes)
        assert space.is_valid(cfg), space.why_invalid(cfg)
        _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_k_slices(wb, ab):
    """SLICES = 2 and 4 (one tile's k tiles over sets of warpgroups, sums added in shared
    memory): every encoding pair of the bit pair, convs with the halo load (stride 1 and 2)
    and GEMMs with uneven slice ranges."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = (conv(w_prec, a_prec, epi, N=1, H=11, W=13, C=416, K=70, stride=1 + combo // 2)
              if combo % 2 == 0 else gemm(w_prec, a_prec, epi, M=100, N=70, K=2900))
        space = BITSERIAL.space(wl)
        for sl, halo in ((2, combo % 2 == 0), (4, False)):
            cfg = BITSERIAL.plain_config(wl, "wgmma").replace(
                BM=64, BN=32, WN=32, KT=1, STAGES=4, HALO=int(halo), SLICES=sl)
            assert space.is_valid(cfg), space.why_invalid(cfg)
            _assert_exact(wl, cfg, seed=combo + sl)


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (1, 4), (2, 3)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_tma_halo(wb, ab):
    """TMA_HALO (the window by tensor copies into swizzled pixel rows, read in place through
    swizzled descriptors with base offset 0, a barrier per channel block): every encoding pair
    of the bit pair on convs over two images whose tiles overrun the image, of 1,024 channels
    (3 x 3 and 5 x 5 windows) and 2,048; 8 x 8 tiles with every k tile resident (the weights by
    bulk copies, or cp.async) and 16 x 8 tiles of two warpgroups with 4 stages, where they
    fit; 128-, 64- and 32-byte blocks in turn."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    ran = 0
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        window = dict(R=5, S=5, pad=2) if combo == 3 else {}
        wide = combo == 1  # two channel blocks
        wl = conv(w_prec, a_prec, epi, N=2, H=11, W=13, C=2048 if wide else 1024, K=70,
                  **window)
        space = BITSERIAL.space(wl)
        kt = 8 if wide else 4
        for changes in (dict(BM=64, BN=32, WN=32, KT=kt, STAGES=12, BULK_WEIGHTS=1),
                        dict(BM=64, BN=32, WN=32, KT=kt, STAGES=12),
                        dict(BM=128, BN=32, WN=32, KT=kt, STAGES=4)):
            width = (128, 64, 32)[(combo + ran) % 3]
            cfg = BITSERIAL.plain_config(wl, "wgmma").replace(HALO=1, A_IN_HALO=1,
                                                               TMA_HALO=width, **changes)
            why = space.why_invalid(cfg)
            if why and ("STAGES" in why or "shared memory" in why):
                continue  # too many k tiles to keep resident, or too many planes' windows
            assert why is None, why
            _assert_exact(wl, cfg, seed=combo)
            ran += 1
    assert ran >= 4


@pytest.mark.parametrize("trigger", [*sorted(bitserial.CHAIN_TRIGGERS), "auto"])
@pytest.mark.parametrize("graph", [False, True], ids=["stream", "cuda_graph"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_chained_layers(graph, trigger):
    """Four layers launched back to back with bind(chained=True), each reading the previous
    one's output (programmatic dependent launch: a layer's blocks start while the previous
    layer runs), on the stream and replayed from a CUDA graph: every layer's output equals the
    reference of its own input, for each kernel body of `_chained_configs`."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("programmatic dependent launch and wgmma need sm_90a")
    for seed, (wl, cfg) in enumerate(_chained_configs("sm_90a")):
        kernel = BITSERIAL.build(wl, cfg)
        x, w, params = random_inputs(wl, seed, device="cuda")
        bufs = [x] + [torch.empty_like(x) for _ in range(4)]
        layers = [kernel.bind(bufs[i], w, params, out=bufs[i + 1], chained=True,
                              trigger=trigger) for i in range(4)]
        replay = None
        if graph:
            replay = torch.cuda.CUDAGraph()
            with torch.cuda.graph(replay):
                for layer in layers:
                    layer()
        for b in bufs[1:]:
            b.view(torch.uint8).fill_(0xA5)
        if replay is not None:
            replay.replay()
        else:
            for layer in layers:
                layer()
        torch.cuda.synchronize()
        w_cpu, p_cpu = w.cpu(), params.to("cpu")
        for i in range(4):
            want = run(wl, bufs[i].cpu(), w_cpu, p_cpu)
            assert torch.equal(bufs[i + 1].cpu(), want), (wl.key, dict(cfg), f"layer {i}")


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (1, 4), (2, 3)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bit_exact_a_in_halo(wb, ab):
    """A_IN_HALO=1 (wgmma reading each tap's A tile in place from the halo): every encoding
    pair of the bit pair on convs whose 8-pixel tiles overrun the image (margins), 3 x 3 and
    5 x 5 windows, 8 x 8 tiles of one warpgroup (also with STAGES=12, and with the weights by
    bulk copies where every k tile is resident) and 16 x 8 tiles of two (in two k slices where
    the registers allow); for two activation planes also both planes as rows of one A tile
    (PLANE_ROWS: 64 x 64 tiles with bulk weights, 128 x 32 tiles of two warpgroups)."""
    if bitserial.device_arch() != bitserial.WGMMA_ARCH:
        pytest.skip("wgmma needs sm_90a")
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        window = dict(R=5, S=5, pad=2) if combo == 3 else {}
        wl = conv(w_prec, a_prec, epi, N=2, H=11, W=13, C=256 * (1 + combo % 2), K=70,
                  **window)
        space = BITSERIAL.space(wl)
        for changes in (dict(BM=64, BN=32, WN=32, KT=1, STAGES=4),
                        dict(BM=64, BN=32, WN=32, KT=1, STAGES=12),  # C = 256: all resident
                        dict(BM=64, BN=32, WN=32, KT=1, STAGES=12, BULK_WEIGHTS=1),
                        dict(BM=64, BN=64, WN=64, KT=1, STAGES=12, BULK_WEIGHTS=1,
                             PLANE_ROWS=1),
                        dict(BM=128, BN=32, WN=32, KT=1, STAGES=4, PLANE_ROWS=1),
                        dict(BM=128, BN=32, WN=32, KT=1, STAGES=3,
                             SLICES=2 if wb * ab <= 2 else 1)):  # 512 threads' registers
            cfg = BITSERIAL.plain_config(wl, "wgmma").replace(HALO=1, A_IN_HALO=1, **changes)
            if changes.get("BULK_WEIGHTS") and bitserial.k_tiles(wl, cfg) > 10:
                continue  # bulk weights: every k tile resident (C = 256 only here)
            if changes.get("PLANE_ROWS") and ab != 2:
                continue  # both activation planes as rows: two planes only
            assert space.is_valid(cfg), space.why_invalid(cfg)
            _assert_exact(wl, cfg, seed=combo)
