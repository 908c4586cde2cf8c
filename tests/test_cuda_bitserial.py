"""Bit-serial b1-AND conv2d/GEMM kernel families: knob tables, spaces and defaults, the one
migration of records made before the split, NVRTC compilation on the CPU; on a GPU, bit-exact
equality with `lowbit.reference.run` for every (w_bits, a_bits) in 1..4 x 1..4, every encoding,
odd shapes, stride 2, padding and every epilogue.

Configs are written as kernel parameters (`spec`: every family's knobs, `kernel_spec`) where a
test varies the kernel across families; `split` gives the family and its config."""

from __future__ import annotations

import itertools
import json
import random
from functools import cache
from pathlib import Path

import pytest
import torch

from lowbit.core import (
    Config,
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    workload_from_json,
)
from lowbit.core.knobs import KnobDef, KnobTable
from lowbit.core.workloads import load_workloads
from lowbit.kernels import get_template
from lowbit.kernels.cuda import (
    BY_NAME,
    FAMILIES,
    LEGACY,
    MMA_SYNC,
    MMA_SYNC_PERSISTENT,
    TAP_SHIFT,
    WGMMA,
    WGMMA_PERSISTENT,
    default_bitserial,
    family_of,
    kernel_spec,
    migrate_config,
)
from lowbit.kernels.cuda import bitserial_family as fam
from lowbit.kernels.cuda import bitserial_layout as layout
from lowbit.kernels.cuda import bitserial_shape as shape
from lowbit.kernels.cuda import bitserial_tables as tables
from lowbit.kernels.cuda.bitserial_kernel import CHAIN_TRIGGERS, chain_trigger
from lowbit.kernels.cuda.nvrtc import compile_cubin, compile_ptx, device_arch, nvrtc_version
from lowbit.kernels.cuda.sass import nvdisasm_path, sass_summary
from lowbit.reference import random_inputs, run

BP = Layout.BITPLANE
ARCH90 = shape.WGMMA_ARCH
SASS_BASELINE = Path(__file__).resolve().parent.parent / "benchmarks" / "sass_baseline.json"


@cache
def baseline() -> dict:
    """What the single template did before the split (benchmarks/sass_check.py)."""
    return json.loads(SASS_BASELINE.read_text())


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


def conv(w: Precision, a: Precision, epi: Epilogue | None = None, **dims) -> ConvWorkload:
    shape_ = dict(N=2, H=9, W=7, C=45, K=37, R=3, S=3, stride=1, pad=1)
    shape_.update(dims)
    return ConvWorkload(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi or Epilogue(), **shape_)


def gemm(w: Precision, a: Precision, epi: Epilogue | None = None, **dims) -> GemmWorkload:
    shape_ = dict(M=77, N=45, K=300)
    shape_.update(dims)
    return GemmWorkload(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi or Epilogue(),
                        **shape_)


def plain(wl, mma: str = "wgmma", arch: str = ARCH90) -> Config:
    """The kernel parameters of the one-tile family's default of an MMA kind without the regime
    defaults: the stable base the tests vary (`spec.replace(...)`)."""
    family = MMA_SYNC if mma == "mma_sync" else WGMMA
    return family.spec(family.default_config(wl, arch, plain=True))


def split(spec):
    """(family, config) of kernel parameters."""
    family = family_of(spec)
    return family, family.config_of(spec)


def why_invalid(wl, spec, arch: str = ARCH90) -> str | None:
    """Why no family's space on `arch` holds these kernel parameters (None: one does)."""
    try:
        family, cfg = split(spec)
    except ValueError as e:
        return str(e)
    reason = family.arch_reason(arch) or family.workload_reason(wl)
    return reason or family.space(wl, arch).why_invalid(cfg)


def build(wl, spec, arch: str | None = None):
    family, cfg = split(spec)
    return family.build(wl, cfg, arch)


def specs(wl, families=FAMILIES, arch: str | None = None) -> list[Config]:
    """Every config of the families' spaces (those that run `wl`), as kernel parameters."""
    arch = arch or device_arch()
    return [f.spec(c) for f in families if f.supports(wl) and not f.arch_reason(arch)
            for c in f.space(wl, arch)]


# ---------------------------------------------------------------- CPU: knob tables

def test_knob_table_generates_space_docs_and_requirements():
    """A table's space holds each knob's values where it applies (the neutral one alone
    elsewhere), rejects a knob's non-neutral values where what it requires is off, with the
    knob and requirement named, and lists the same in its docs."""
    table = KnobTable(
        KnobDef("A", (0, 1), "turns on a"),
        KnobDef("B", (0, 1, 2), "b needs a", requires={"A": (1,)}),
        KnobDef("C", ("x", "y"), "c", applies=lambda wl: wl == "wide",
                value_requires={"y": {"B": (2,)}}))
    assert table.space("narrow").knob("C").values == ("x",)
    space = table.space("wide")
    assert {tuple(c.values()) for c in space} == {(0, 0, "x"), (1, 0, "x"), (1, 1, "x"),
                                                  (1, 2, "x"), (1, 2, "y")}
    assert "B=1 needs A=1" in space.why_invalid(Config(A=0, B=1, C="x"))
    assert "C='y' needs B=2" in space.why_invalid(Config(A=1, B=1, C="y"))
    docs = "\n".join(table.describe())
    assert "B (0, 1, 2): b needs a [needs A=1]" in docs and "'y' needs B=2" in docs
    with pytest.raises(ValueError, match="must come before"):
        KnobTable(KnobDef("B", (0, 1), "", requires={"A": (1,)}), KnobDef("A", (0, 1), ""))


def test_families_registered_with_their_kernels():
    for family in FAMILIES:
        assert get_template(family.name) is family and family.backend == "cuda"
        assert set(family.fixed) | set(family.knobs.names) == set(fam.SPEC_NEUTRAL)
        assert not set(family.fixed) & set(family.knobs.names)
    assert {f.name: f.entry for f in FAMILIES} == {
        "cuda.bitserial_mma_sync": "bitserial_mma_sync.cu",
        "cuda.bitserial_mma_sync_persistent": "bitserial_mma_sync_persistent.cu",
        "cuda.bitserial_wgmma": "bitserial_wgmma.cu",
        "cuda.bitserial_wgmma_persistent": "bitserial_wgmma_persistent.cu",
        "cuda.bitserial_tap_shift": "bitserial_tap_shift.cu"}
    with pytest.raises(ValueError, match="unknown template"):
        get_template(LEGACY)


def test_unsupported_workloads_have_reasons():
    wl = conv(Precision(2), Precision(2))
    assert all(f.supports(wl) for f in (MMA_SYNC, WGMMA))
    assert "bitplane" in MMA_SYNC.unsupported_reason(wl.replace(a_layout=Layout.INT8))
    assert "bits" in WGMMA.unsupported_reason(wl.replace(w=Precision(5)))
    packed = Epilogue(out=Precision(2), out_layout=Layout.PACKED)
    assert "packed" in MMA_SYNC_PERSISTENT.unsupported_reason(wl.replace(epilogue=packed))
    assert "128" in TAP_SHIFT.unsupported_reason(wl.replace(C=96))
    with pytest.raises(ValueError, match="bitplane"):
        MMA_SYNC.space(wl.replace(w_layout=Layout.PACKED))
    with pytest.raises(ValueError, match="needs sm_90a"):
        WGMMA.space(wl, "sm_80")


# ---------------------------------------------------------------- CPU: migration, defaults

def test_old_configs_migrate_into_their_family_unchanged():
    """Valid configs of the single template's spaces (sampled before the split, with their
    grid, threads, shared memory and accumulator registers) migrate into a valid config of
    the family whose kernel they were, with the same figures; and each workload's families
    together hold as many configs as its single space did."""
    checked, sizes = 0, {}
    for item in baseline()["space_sample"]:
        wl = workload_from_json(item["workload_json"])
        name, cfg = migrate_config(LEGACY, item["config"])
        family = BY_NAME[name]
        spec = family.spec(cfg)
        assert {k: spec[k] for k in item["config"]} == item["config"]
        assert family.space(wl, item["arch"]).is_valid(cfg), (name, dict(cfg))
        assert family.kernel_name(cfg) == item["kernel"]
        assert [*layout.tile_grid(wl, spec), layout.threads(spec), layout.smem_bytes(wl, spec),
                layout.acc_regs(wl, spec)] == [*item["grid"], item["threads"], item["smem"],
                                               item["acc_regs"]]
        sizes[item["workload_json"], item["arch"]] = item["space_size"]
        checked += 1
    assert checked >= 500
    for (text, arch), size in sorted(sizes.items())[::7]:  # a few: listing takes ~0.1-1 s
        wl = workload_from_json(text)
        assert sum(len(f.space(wl, arch)) for f in FAMILIES
                   if f.workload_reason(wl) is None and not f.arch_reason(arch)) == size


def test_migration_of_partial_and_int8_records():
    """A legacy record lacking knobs added later reads them as neutral; int8 records drop the
    knobs cuda.int8_wgmma no longer has; configs of today's templates pass unchanged; a legacy
    config that is no family's kernel is refused."""
    old = dict(BM=128, BN=64, WM=32, WN=32, KT=2, STAGES=3, PERSIST=0, MMA="mma_sync",
               SWIZZLE=0, HALO=1)
    assert migrate_config(LEGACY, old) == (MMA_SYNC.name, Config(
        BM=128, BN=64, WM=32, WN=32, KT=2, STAGES=3, HALO=1, ROWSUM="mma", ROW_TABLE=0,
        REQUANT="multiply", SPLIT_K=1))
    shift = {**old, "MMA": "wgmma", "WM": 64, "KT": 1, "HALO": 0, "SWIZZLE": 32,
             "TAP_SHIFT": 1, "PERSIST": 1, "TEAMS": 2}
    name, cfg = migrate_config(LEGACY, shift)
    assert name == TAP_SHIFT.name and cfg["TEAMS"] == 2 and "KT" not in cfg
    assert kernel_spec(LEGACY, shift) == TAP_SHIFT.spec(cfg)
    int8 = dict(BM=128, BN=128, WM=64, WN=128, KT=1, STAGES=6, PERSIST=0, MMA="wgmma",
                SWIZZLE=32, HALO=0, ROWSUM="mma", REQUANT="multiply", SPLIT_K=1)
    assert migrate_config("cuda.int8_wgmma", int8)[1] == Config(
        BM=128, BN=128, WN=128, KT=1, STAGES=6, PERSIST=0, SWIZZLE=32, HALO=0,
        REQUANT="multiply")
    assert migrate_config(WGMMA.name, {"BM": 64}) == (WGMMA.name, Config(BM=64))
    assert migrate_config("triton.igemm_int8", {"BLOCK_M": 64})[1] == Config(BLOCK_M=64)
    with pytest.raises(ValueError, match="no bit-serial family"):
        migrate_config(LEGACY, {**old, "TAP_SHIFT": 1})


def test_defaults_pick_the_recorded_kernels():
    """`default_bitserial` picks, on sm_90a and sm_80, the kernel the single template's
    `default_config` picked on every shared workload (recorded before the split), and each
    family's `default_config` the kernel of its recorded preferred default."""
    checked = 0
    for entry in baseline()["entries"]:
        if entry["template"] != LEGACY:
            continue
        wl = workload_from_json(entry["workload_json"])
        name, cfg = migrate_config(LEGACY, entry["config"])
        if entry["role"].startswith("default"):
            family, got = default_bitserial(wl, entry["arch"])
            assert (family.name, got) == (name, cfg), entry["role"]
        else:
            assert BY_NAME[name].default_config(wl, entry["arch"]) == cfg, entry["role"]
        checked += 1
    assert checked >= 700


def test_default_kernels_compile_to_the_recorded_sass():
    """The first recorded default of each (family, arch), int8 included, migrated and rendered
    by its family's template, compiles to the SASS instructions recorded before the split
    (benchmarks/sass_check.py checks every recorded default)."""
    if nvdisasm_path() is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    recorded = tuple(baseline().get("nvrtc", ()))
    if recorded != nvrtc_version():  # another ptxas schedules other SASS
        pytest.skip(f"SASS recorded with NVRTC {recorded}, this is NVRTC {nvrtc_version()}")
    picked: dict[tuple[str, str], dict] = {}
    for entry in baseline()["entries"]:
        name, _ = migrate_config(entry["template"], entry["config"])
        picked.setdefault((name, entry["arch"]), entry)
    for (name, arch), entry in sorted(picked.items()):
        wl = workload_from_json(entry["workload_json"])
        cfg = migrate_config(entry["template"], entry["config"])[1]
        cubin = compile_cubin(BY_NAME[name].render(wl, cfg), arch)
        assert sass_summary(cubin) == entry["sass"], (name, arch, entry["workload"])
    assert len(picked) == 8  # 5 families on sm_90a, the mma.sync two on sm_80, int8


def test_defaults_requantize_by_thresholds_where_allowed():
    """1-2 bit bit-plane outputs default to REQUANT="threshold" (it won every measured row);
    3-bit planes and int32 outputs cannot use it."""
    checked = 0
    for epi, requant in ((EPILOGUES[1], "threshold"), (EPILOGUES[5], "threshold"),
                         (EPILOGUES[4], "multiply"), (EPILOGUES[0], "multiply")):
        wl = conv(Precision(1, "binary"), Precision(2), epi)
        for arch in ("sm_80", ARCH90):
            family, cfg = default_bitserial(wl, arch)
            assert cfg["REQUANT"] == requant and family.space(wl, arch).is_valid(cfg)
            assert (family.kind == "wgmma") == (arch == ARCH90)
            checked += 1
    assert checked == 8


def test_checking_a_config_does_not_enumerate_the_space(monkeypatch):
    """build() checks one config against the constraints; enumerating a space inside every
    tuning trial made each measurement cost seconds."""
    from lowbit.core.knobs import KnobSpace

    def enumerate_all(self):
        raise AssertionError("the whole space was enumerated")

    wl = gemm(Precision(1), Precision(2), M=4096, N=4096, K=4096)
    family, cfg = default_bitserial(wl, ARCH90)
    monkeypatch.setattr(KnobSpace, "all_configs", enumerate_all)
    assert family.checked_config(wl, cfg, family.space(wl, ARCH90)) == cfg
    with pytest.raises(ValueError, match="is not in"):
        family.checked_config(wl, cfg.replace(BM=48), family.space(wl, ARCH90))


def test_invalid_config_is_rejected():
    wl = gemm(Precision(1), Precision(2))
    with pytest.raises(ValueError, match="is not in cuda\\.bitserial_mma_sync's space"):
        MMA_SYNC.build(wl, Config(BM=64, BN=64, WM=48, WN=32, KT=1, STAGES=2, HALO=0,
                                  ROWSUM="mma", ROW_TABLE=0, REQUANT="multiply", SPLIT_K=1),
                       arch="sm_80")
    with pytest.raises(ValueError, match="has no knobs \\['MMA'\\]"):
        MMA_SYNC.spec({"MMA": "wgmma"})


# ---------------------------------------------------------------- CPU: spaces

@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 3), (4, 4), (2, 4)])
def test_space_constraints_hold(wb, ab):
    """Sampled configs of every family keep the block tile a multiple of the warp tile, whole
    bit-plane words per block, the accumulators and shared memory within their limits."""
    wl = conv(Precision(wb), Precision(ab), EPILOGUES[1], N=8, H=14, W=14, C=256, K=256)
    rng, checked, sampled = random.Random(wb * 10 + ab), 0, 0
    for family in FAMILIES:
        space = family.space(wl, ARCH90)
        assert family.default_config(wl, ARCH90) in space
        sampled += min(40, len(space))
        for cfg in space.sample(40, rng):
            c = family.spec(cfg)
            assert c["BM"] % c["WM"] == 0 and c["BN"] % c["WN"] == 0
            assert c["BN"] % 32 == 0  # bit-plane output packs whole words per block
            assert layout.acc_regs(wl, c) <= fam.MAX_ACC_REGS
            assert layout.smem_bytes(wl, c) <= fam.MAX_SMEM
            checked += 1
    assert checked == sampled >= 120


def test_persistent_wgmma_blocks_of_four_warpgroups_hold_one_accumulator_plane():
    """Persistent wgmma blocks of 4 warpgroups (128 registers per thread) are offered where a
    thread's accumulators are one m64n128 plane (64 registers: binary activations and weights)
    and not with two planes, which spill."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    for a_prec, ok in ((b1, True), (u2, False)):
        wl = conv(b1, a_prec, EPILOGUES[1], N=4, H=14, W=14, C=256, K=256)
        cfg = plain(wl).replace(BM=256, BN=128, WN=128, PERSIST=1, KT=1, STAGES=4)
        assert layout.threads(cfg) == 512
        assert (why_invalid(wl, cfg) is None) == ok, why_invalid(wl, cfg)
        assert why_invalid(wl, cfg.replace(BM=128)) is None


def test_three_warpgroup_rows_are_wgmma_without_tap_shift():
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[1], N=4, H=7, W=7,
              C=512, K=512)
    assert 192 in WGMMA.knobs["BM"].values and 192 in WGMMA_PERSISTENT.knobs["BM"].values
    assert 192 not in TAP_SHIFT.knobs["BM"].values and 192 not in MMA_SYNC.knobs["BM"].values
    cfg = plain(wl).replace(BM=192, BN=128, WN=128)
    assert why_invalid(wl, cfg) is None and layout.threads(cfg) == 384


def test_wide_one_tile_rows_take_one_accumulator_plane():
    """BM=192 x BN=WN=256 one-tile wgmma blocks (132 accumulator registers, 384 threads) are in
    the space for binary weights and activations, where ptxas fits them in 168 registers with
    a few bytes of spill (OTHER_REGS_WGMMA_TILE), and for two-bit activations with the planes
    fused into one accumulator (136 registers), not with two accumulator planes or as
    persistent blocks."""
    b1 = Precision(1, "binary")
    wl = conv(b1, b1, EPILOGUES[5], N=4, H=7, W=7, C=512, K=512)
    cfg = plain(wl).replace(BM=192, BN=256, WN=256, KT=1, STAGES=4, HALO=0)
    assert layout.acc_regs(wl, cfg) == 132 and layout.threads(cfg) == 384
    assert why_invalid(wl, cfg) is None
    assert "spill" in why_invalid(wl, cfg.replace(PERSIST=1, STAGES=6))
    w1a2 = conv(b1, Precision(2), EPILOGUES[1], N=4, H=7, W=7, C=512, K=512)
    assert "register file" in why_invalid(w1a2, cfg.replace(BM=192, BN=128, WN=128,
                                                            REQUANT="threshold"))
    fused = cfg.replace(REQUANT="threshold", FUSE_PLANES=1)
    assert layout.acc_regs(w1a2, fused) == 136
    assert why_invalid(w1a2, fused) is None
    assert "accumulator registers" in why_invalid(w1a2, fused.replace(FUSE_PLANES=0))


def test_wide_one_tile_default_only_where_it_fills_the_gpu():
    """The w1a1 default is the 192 x 256 block on grids of at least one such tile per SM
    (ResNet-50 s5 at batch 256: 66 x 2), and a smaller default below that (batch 16); w1a2's
    is the same block with its activation planes fused, both with two columns' thresholds per
    add; signed two-bit activations (which cannot fuse) keep a smaller one."""
    b1, u2, s2 = Precision(1, "binary"), Precision(2), Precision(2, "signed")
    for n, wide in ((256, True), (16, False)):
        for a_prec in (b1, u2):
            wl = conv(b1, a_prec, EPILOGUES[5 if a_prec is b1 else 1], N=n, H=7, W=7, C=512,
                      K=512)
            family, cfg = default_bitserial(wl, ARCH90)
            assert ((cfg["BM"], cfg["BN"]) == (192, 256)) == wide, dict(cfg)
            assert family is WGMMA and cfg["FUSE_PLANES"] == int(wide and a_prec is u2)
            assert cfg["THR_PAIRS"] == int(wide)
    signed = conv(b1, s2, EPILOGUES[1], N=256, H=7, W=7, C=512, K=512)
    assert default_bitserial(signed, ARCH90)[1]["BM"] != 192


def test_fused_tiles_default_on_narrow_binary_weight_convs_that_fill_the_gpu():
    """1x1 convs of binary weights, two unsigned activation planes and <= 128 output channels
    (where 192 x 256 cannot serve) take a FUSED_TILES tile on grids of at least one tile per
    SM (ResNet-50's conv1s at batch 256); 2-bit weights, 256 channels and a grid of 12 tiles
    (batch 8 at 14 x 14) do not."""
    from lowbit.kernels.cuda.bitserial_defaults import FUSED_TILES

    b1, s2, u2 = Precision(1, "binary"), Precision(2, "signed"), Precision(2)

    def fused(cfg: Config) -> bool:
        return any(all(cfg.get(k) == v for k, v in t.items() if k != "SWIZZLE")
                   for t in FUSED_TILES)
    cases = [(b1, 64, 256, 56, True), (b1, 128, 256, 56, True), (b1, 256, 256, 56, False),
             (s2, 128, 256, 56, False), (b1, 128, 8, 14, False)]
    for w, k, n, hw, want in cases:
        wl = conv(w, u2, EPILOGUES[1], N=n, H=hw, W=hw, C=256, K=k, R=1, S=1, pad=0)
        family, cfg = default_bitserial(wl, ARCH90)
        assert (family is WGMMA and fused(cfg)) == want, (w, k, n, hw, dict(cfg))
    assert len(cases) == 5


def test_tap_shift_default_on_narrow_convs_that_fill_the_gpu():
    """Convs of at most 128 output channels that the tap-shift kernel runs get its persistent
    128-row blocks (ones columns for binary weights, two columns' thresholds per add) where
    they make a tile per SM; two activation planes up to 256 output channels two-team 64 x 128
    blocks (slab row sums for binary weights); wider convs, one activation plane past 128
    channels, small grids and unsupported shapes (stride 2) keep the stage kernels."""
    b1, u1, u2 = Precision(1, "binary"), Precision(1), Precision(2)

    def default(wl):
        family, cfg = default_bitserial(wl, ARCH90)
        assert family.space(wl, ARCH90).is_valid(cfg)
        return family.spec(cfg)

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
    """The APNN-TC conv (w1a2) and a valid 64 x 32 one-warpgroup halo config with
    `changes` (kernel parameters)."""
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], N=1, H=16, W=16, C=1024,
              K=1024)
    cfg = plain(wl).replace(BM=64, BN=32, WN=32, HALO=1, **changes)
    assert why_invalid(wl, cfg) is None, why_invalid(wl, cfg)
    return wl, cfg


def test_k_slices_only_in_small_one_tile_wgmma_grids():
    """SLICES > 1 (a one-tile wgmma block's k tiles split over sets of its warpgroups) is in the
    one-tile wgmma space for grids that leave SMs idle, not beyond 4 warpgroups or under two k
    tiles per slice; no other family has the knob."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, cfg = _apnn_conv_config(KT=1, STAGES=4, SLICES=4)
    assert layout.threads(cfg) == 512
    assert build(wl, cfg, arch=ARCH90)._main.cubin[:4] == b"\x7fELF"  # NVRTC
    assert [f.name for f in FAMILIES if "SLICES" in f.knobs.names] == [WGMMA.name]
    assert "warpgroups" in why_invalid(wl, cfg.replace(WN=16))
    gemm_small_k = gemm(b1, u2, EPILOGUES[1], M=128, N=128, K=768)  # 3 k tiles
    assert "two of the 3 k tiles" in why_invalid(gemm_small_k, plain(gemm_small_k).replace(
        BM=64, BN=32, WN=32, SLICES=2, KT=1))
    big = conv(b1, u2, EPILOGUES[1], N=64, H=56, W=56, C=64, K=64)
    assert WGMMA.space(big, ARCH90).knob("SLICES").values == (1,)


def test_a_in_halo_space():
    """A_IN_HALO=1 (A tiles read in place from a pixel tile's halo) is a one-tile wgmma
    kernel's with HALO=1, on stride-1 convs of channels a multiple of 256 whose k slabs KT
    divides; its grid counts BM / 8 x 8 pixel tiles, margins included, and its halo is the
    tile's window. NVRTC compiles it for sm_90a."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    assert layout.tile_grid(wl, cfg) == (32, 4)
    assert layout.halo_bytes(wl, cfg) == 2 * 101 * 1024 // 8  # 10 x 10 pixels, odd stride
    assert build(wl, cfg, arch=ARCH90)._main.cubin[:4] == b"\x7fELF"
    assert "needs HALO=1" in why_invalid(wl, cfg.replace(HALO=0))
    assert "'table' needs A_IN_HALO=0" in why_invalid(wl, cfg.replace(ROWSUM="table"))
    tall = cfg.replace(BM=128, WN=32, KT=2)  # 16 x 8 pixel tiles: 1 x 2 per image
    assert why_invalid(wl, tall) is None and layout.tile_grid(wl, tall) == (32, 2)
    margins = conv(b1, u2, EPILOGUES[1], N=3, H=14, W=14, C=256, K=64)
    assert layout.block_rows(margins, cfg.replace(KT=1)) == 3 * 2 * 2 * 64
    for other, why in ((conv(b1, u2, N=1, H=16, W=16, C=1024, K=64, stride=2), "A_IN_HALO=1"),
                       (conv(b1, u2, N=1, H=16, W=16, C=384, K=64), "A_IN_HALO=1"),
                       (conv(b1, u2, N=1, H=16, W=16, C=512, K=64), "KT to divide")):
        assert why in why_invalid(other, cfg.replace(BN=64, WN=64, REQUANT="multiply"))
    assert WGMMA.space(conv(b1, u2, N=1, H=16, W=16, C=384, K=64), ARCH90).knob(
        "A_IN_HALO").values == (0,)
    bulk = cfg.replace(STAGES=12, BULK_WEIGHTS=1)  # 9 k tiles, each one bulk copy
    assert why_invalid(wl, bulk) is None
    assert layout.smem_bytes(wl, bulk) == 12 * 32 * 4 * 32 + 256 + 2 * 101 * 128 + 9 * 8
    assert build(wl, bulk, arch=ARCH90)._main.cubin[:4] == b"\x7fELF"
    assert "STAGES >= 11" in why_invalid(wl, bulk.replace(STAGES=6))
    assert "A_IN_HALO" in why_invalid(wl, bulk.replace(A_IN_HALO=0, HALO=1))


def test_tma_halo_space():
    """TMA_HALO (the in-place window by tensor copies, in channel blocks of 32, 64 or 128
    bytes) is A_IN_HALO's, in one k slice, on whole channel blocks; its window takes the
    blocks' pixel rows rounded up to 8 plus 1,024 bytes of alignment slack per plane and a
    barrier per block; the tensor map's box is one block of the window."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    wl, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    bulk = cfg.replace(STAGES=12, BULK_WEIGHTS=1)
    window = bulk.replace(TMA_HALO=128)  # the window by tensor copies: 128-byte blocks
    assert why_invalid(wl, window) is None
    assert layout.halo_bytes(wl, window) == 2 * (104 * 128 + 1024)  # 100 rows, to 8
    assert (layout.smem_bytes(wl, window) == layout.smem_bytes(wl, bulk)
            - layout.halo_bytes(wl, bulk) + layout.halo_bytes(wl, window) + 8)
    narrow = window.replace(TMA_HALO=32)  # four 32-byte blocks per plane, a barrier each
    assert layout.smem_bytes(wl, narrow) == layout.smem_bytes(wl, window) + 3 * 8
    for c in (window, narrow):
        assert build(wl, c, arch=ARCH90)._main.cubin[:4] == b"\x7fELF"
    assert "SLICES=2 needs TMA_HALO=0" in why_invalid(wl, cfg.replace(TMA_HALO=32, SLICES=2))
    assert "needs A_IN_HALO=1" in why_invalid(wl, window.replace(A_IN_HALO=0, BULK_WEIGHTS=0))
    c512 = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=512, K=64)
    assert "multiple of 1024" in why_invalid(c512, cfg.replace(KT=2, TMA_HALO=128))
    assert why_invalid(c512, cfg.replace(KT=2, TMA_HALO=64)) is None
    dims, strides, box = tables.halo_map_geometry(wl, narrow)
    assert (dims, strides, box) == ([128, 16, 16, 2], [128, 2048, 32768], [32, 10, 10, 1])


def test_plane_rows_space():
    """PLANE_ROWS (both activation planes as rows of one A tile) halves the pixel tile's rows
    (BM / 16 x 8), keeps both planes' pixels in each chunk of the window (an odd count), and
    is A_IN_HALO's with two activation planes, without TMA_HALO."""
    b1 = Precision(1, "binary")
    wl, cfg = _apnn_conv_config(KT=4, STAGES=6, A_IN_HALO=1)
    rows2 = cfg.replace(PLANE_ROWS=1)  # 4 x 8 pixel tiles, both planes in each wgmma's rows
    assert why_invalid(wl, rows2) is None
    assert layout.tile_grid(wl, rows2) == (32, 8)
    assert layout.halo_bytes(wl, rows2) == (2 * 6 * 10 | 1) * 128
    assert build(wl, rows2, arch=ARCH90)._main.cubin[:4] == b"\x7fELF"
    assert "TMA_HALO" in why_invalid(wl, rows2.replace(TMA_HALO=128))
    b1b1 = conv(b1, b1, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=64)  # one activation plane
    assert WGMMA.space(b1b1, ARCH90).knob("PLANE_ROWS").values == (0,)


def test_small_grid_default_splits_long_reductions():
    """Where the preferred wgmma default leaves most SMs idle and the reduction is long, the
    default is a one-warpgroup 64-row block wide enough for half a wave: on convs with the
    in-place halo and every k tile resident where that applies (two activation planes: 64
    wide, weights by bulk copies), else with two k slices and (convs) the halo load; short
    reductions and full grids keep the preferred default."""
    b1, u2 = Precision(1, "binary"), Precision(2)

    def default(wl):
        family, cfg = default_bitserial(wl, ARCH90)
        assert family.space(wl, ARCH90).is_valid(cfg)
        c = family.spec(cfg)
        return (c["BM"], c["BN"], c["KT"], c["HALO"], c["SLICES"])

    apconv = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    assert default(apconv) == (64, 64, 4, 1, 1)  # 4 x 16 tiles of 64 x 64, 9 k tiles resident
    family, cfg = default_bitserial(apconv, ARCH90)
    assert family is WGMMA and cfg["A_IN_HALO"] == 1
    assert cfg["STAGES"] == layout.RESIDENT_STAGES and cfg["BULK_WEIGHTS"] == 1
    b1_apconv = conv(b1, b1, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    assert default(b1_apconv) == (64, 32, 4, 1, 1)
    assert default_bitserial(b1_apconv, ARCH90)[1]["BULK_WEIGHTS"] == 0
    assert WGMMA.default_config(b1_apconv, ARCH90) == default_bitserial(b1_apconv, ARCH90)[1]
    wide_c = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=2048, K=1024)  # 18 k tiles of 4
    assert default(wide_c) == (64, 32, 2, 1, 2)
    stride2 = conv(b1, u2, EPILOGUES[1], N=1, H=32, W=32, C=1024, K=1024, stride=2)
    assert default(stride2) == (64, 32, 2, 1, 2)
    assert default(gemm(b1, u2, EPILOGUES[1], M=128, N=4096, K=4096)) == (64, 64, 1, 0, 2)
    assert default(gemm(b1, u2, EPILOGUES[1], M=8, N=4096, K=4096)) == (64, 32, 1, 0, 2)
    short = gemm(b1, u2, EPILOGUES[1], M=64, N=1024, K=1024)  # 4 k tiles
    assert default(short)[4] == 1
    assert default(conv(b1, u2, EPILOGUES[1], N=256, H=14, W=14, C=256, K=256))[4] == 1


def test_wgmma_families_fix_the_warpgroup_geometry():
    """The wgmma families' sampled configs: WM = 64, at least 3 stages, N = w_bits * WN a
    wgmma N, threads per warpgroup and team or slice, a warp's m16 x N share of accumulators;
    fused planes only for unsigned two-bit activations; the families need sm_90a."""
    wl = gemm(Precision(2, "signed"), Precision(2), EPILOGUES[1], M=512, N=256, K=1024)
    rng, fused = random.Random(3), set()
    for family in (WGMMA, WGMMA_PERSISTENT):
        for c in map(family.spec, family.space(wl, ARCH90).sample(60, rng)):
            assert c["WM"] == 64 and c["STAGES"] >= 3 and c["MMA"] == "wgmma"
            planes = 1 if c["FUSE_PLANES"] else 2
            assert 2 * c["WN"] in fam.WGMMA_N  # N = w_bits * WN of m64nNk256
            assert layout.threads(c) == ((c["BM"] // 64) * (c["BN"] // c["WN"]) * 128
                                         * c["TEAMS"] * c["SLICES"])
            assert layout.acc_regs(wl, c) == planes * 2 * c["WN"] // 2
            fused.add(c["FUSE_PLANES"])
    assert fused == {0, 1}
    signed = gemm(Precision(2), Precision(2, "signed"), EPILOGUES[1], M=512, N=256, K=1024)
    assert WGMMA.space(signed, ARCH90).knob("FUSE_PLANES").values == (0,)
    family, cfg = default_bitserial(wl, ARCH90)
    with pytest.raises(ValueError, match="sm_80"):
        family.build(wl, cfg, arch="sm_80")
    assert default_bitserial(wl, "sm_80")[0] is MMA_SYNC


def test_render_names_the_parameters_and_includes_its_files():
    """The rendered source: the constexpr parameters, then the family's entry file with its
    includes expanded once each; wgmma kernels carry their rendered instruction wrappers."""
    wl = conv(Precision(2, "signed"), Precision(3), EPILOGUES[1], stride=2)
    src = MMA_SYNC.render(wl, MMA_SYNC.default_config(wl, "sm_80"))
    for name in ("BM", "BN", "WM", "WN", "KT", "STAGES", "PERSIST", "WGMMA", "VEC", "STRIDE",
                 "OUT_MODE"):
        assert f"constexpr int {name} = " in src
    assert "constexpr int STRIDE = 2;" in src and "constexpr int W_SIGNED = 1;" in src
    assert "and.popc" in src and "wgmma.mma_async" not in src
    assert '#include "' not in src and src.count("struct EpilogueArgs {") == 1
    family, cfg = default_bitserial(wl, ARCH90)
    src = family.render(wl, cfg)
    assert "constexpr int WGMMA = 1;" in src
    assert f"wgmma.mma_async.sync.aligned.m64n{2 * cfg['WN']}k256.s32.b1.b1.and.popc" in src


def test_probe_cuts_render_only_where_asked():
    """Named cut points: a cut renders its part behind a never-taken branch; the default
    render has none, and an unknown cut is refused."""
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[1])
    cfg = WGMMA.default_config(wl, ARCH90)
    assert "#define LOWBIT_CUT" not in WGMMA.render(wl, cfg)
    cut = WGMMA.render(wl, cfg, cuts=("mma", "epilogue"))
    assert "#define LOWBIT_CUT_MMA 1" in cut and "#define LOWBIT_CUT_EPILOGUE 1" in cut
    with pytest.raises(ValueError, match="cuts must be among"):
        WGMMA.render(wl, cfg, cuts=("gather",))


def _compile_sample() -> list[tuple[object, Config]]:
    rng = random.Random(6)
    cases = []
    for i, (wb, ab) in enumerate([(1, 1), (1, 2), (2, 2), (3, 4)]):
        for make in (conv, gemm):
            wl = make(rng.choice(encodings(wb)), rng.choice(encodings(ab)),
                      EPILOGUES[i % len(EPILOGUES)])
            cases.append((wl, MMA_SYNC.spec(MMA_SYNC.space(wl, "sm_80").sample(1, rng)[0])))
    return cases


@pytest.mark.parametrize("arch", ["sm_80", ARCH90])
def test_nvrtc_compiles_sample_configs(arch):
    """Sampled mma.sync configs compile one tile per block, persistent and with the halo."""
    built = 0
    for wl, cfg in _compile_sample():
        for persist, halo in ((0, 0), (1, 0), (0, 1)):  # both mma.sync bodies, halo load
            cfg = cfg.replace(PERSIST=persist, HALO=halo)
            if why_invalid(wl, cfg, arch) is None:
                kernel = build(wl, cfg, arch=arch)
                assert kernel._main.cubin[:4] == b"\x7fELF"
                assert kernel._main.name == ("bitserial_persistent" if persist
                                             else "bitserial_kernel")
                built += 1
    assert built >= 12


@pytest.mark.slow  # 32 NVRTC compiles: ~40 s cold on 2 loaded cores
def test_nvrtc_compiles_wgmma_sample_configs():
    """Per sampled workload: the default, the plain default's halo twin and a random config of
    each wgmma family without tap-shift (tap-shift: its own test file) compile for sm_90a."""
    rng, built = random.Random(9), 0
    for wl, _ in _compile_sample():
        family, default = default_bitserial(wl, ARCH90)
        cases = [(family, default),
                 (WGMMA, WGMMA.default_config(wl, ARCH90, plain=True).replace(HALO=1)),
                 (WGMMA, WGMMA.space(wl, ARCH90).sample(1, rng)[0]),
                 (WGMMA_PERSISTENT, WGMMA_PERSISTENT.space(wl, ARCH90).sample(1, rng)[0])]
        for family, cfg in cases:
            if not family.space(wl, ARCH90).is_valid(cfg):
                cfg = cfg.replace(HALO=0)
            kernel = family.build(wl, cfg, arch=ARCH90)
            assert kernel._main.cubin[:4] == b"\x7fELF"
            assert kernel._main.name == family.kernel_name(cfg)
            built += 1
    assert built == 32


def _chained_configs(arch):
    """(workload, kernel parameters) per kernel body: the APNN-TC conv's defaults (w1a2: the
    in-place block with bulk weights, whose weights go out before the wait; w1a1), a block
    reading the row-sum table (the xpop kernel chained too), a tap-shift block, persistent
    wgmma and mma.sync blocks."""
    b1, u2 = Precision(1, "binary"), Precision(2)
    apconv = conv(b1, u2, EPILOGUES[1], N=1, H=16, W=16, C=1024, K=1024)
    b1_apconv = conv(b1, b1, EPILOGUES[5], N=1, H=16, W=16, C=1024, K=1024)
    s3 = conv(b1, u2, EPILOGUES[1], N=4, H=28, W=28, C=128, K=128)
    cases = [(s3, plain(s3, "mma_sync", arch).replace(PERSIST=1))]
    if arch == ARCH90:
        cases += [(apconv, kernel_spec(*_named(default_bitserial(apconv, arch)))),
                  (b1_apconv, kernel_spec(*_named(default_bitserial(b1_apconv, arch)))),
                  (b1_apconv, plain(b1_apconv, "wgmma", arch).replace(ROWSUM="table")),
                  (s3, plain(s3, "wgmma", arch).replace(TAP_SHIFT=1, KT=1, STAGES=3, HALO=0,
                                                        PERSIST=0)),
                  (s3, plain(s3, "wgmma", arch).replace(PERSIST=1))]
    for wl, cfg in cases:
        assert why_invalid(wl, cfg, arch) is None, why_invalid(wl, cfg, arch)
    return cases


def _named(picked):
    family, cfg = picked
    return family.name, cfg


def _ptx_entry(ptx: str, name: str) -> str:
    body = ptx[ptx.index(f".entry {name}"):]
    end = body.find(".entry ", 1)
    return body if end < 0 else body[:end]


@pytest.mark.parametrize("trigger", sorted(CHAIN_TRIGGERS))
@pytest.mark.parametrize("arch", ["sm_80", ARCH90])
def test_nvrtc_compiles_chained_kernels(arch, trigger):
    """CHAINED kernels compile for both targets; on sm_90a every kernel that reads x waits for
    the previous grid (griddepcontrol.wait) and lets the next one launch: at its start, or
    ("after_mma") the one-tile kernels after their last MMA and persistent ones at exit; the
    in-place block with bulk weights issues its weights' copies before the wait and its
    window's after. On sm_80 (no PDL) the instructions are left out."""
    mode = CHAIN_TRIGGERS[trigger]
    for wl, spec in _chained_configs(arch):
        family, cfg = split(spec)
        ptx = compile_ptx(family.render(wl, cfg, chained=mode), arch).decode()
        main = _ptx_entry(ptx, family.kernel_name(cfg))
        xpop = _ptx_entry(ptx, "bitserial_xpop")
        if arch != ARCH90:
            assert "griddepcontrol" not in ptx
            continue
        assert xpop.index("griddepcontrol.launch_dependents") < xpop.index("griddepcontrol.wait")
        wait = main.index("griddepcontrol.wait")
        if trigger == "start":
            assert main.index("griddepcontrol.launch_dependents") < wait
        elif spec["PERSIST"]:
            assert "griddepcontrol.launch_dependents" not in main
        else:
            mma = "wgmma.mma_async" if spec["MMA"] == "wgmma" else "mma.sync"
            assert wait < main.rindex(mma) < main.index("griddepcontrol.launch_dependents")
        if spec["BULK_WEIGHTS"]:
            assert main.index("cp.async.bulk.shared") < wait < main.index("cp.async.cg.shared")
        assert "griddepcontrol" not in compile_ptx(family.render(wl, cfg), arch).decode()


def test_chained_bind_refuses_bad_requests():
    """bind(chained=True) on a kernel built for sm_80, or with an unknown trigger, is refused
    before any launch."""
    wl, spec = _chained_configs("sm_80")[0]
    kernel = build(wl, spec, arch="sm_80")
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
    assert chain_trigger(blocks, per_sm, 132, persistent) == want


SPLIT_CASES = [  # (workload, knob changes): split-K with every kind of epilogue term
    (conv(Precision(2, "signed"), Precision(2), EPILOGUES[1], N=1, H=6, W=5, C=280, K=37),
     {"SPLIT_K": 4, "KT": 1}),
    (conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=2, H=5, W=9, C=448,
          K=70), {"SPLIT_K": 8, "KT": 1, "REQUANT": "threshold"}),
    (conv(Precision(1, "binary"), Precision(2), EPILOGUES[3], N=1, H=16, W=16, C=1024, K=256),
     {"SPLIT_K": 4}),
    (gemm(Precision(1, "binary"), Precision(2), EPILOGUES[2], M=128, N=512, K=4096),
     {"SPLIT_K": 8, "ROWSUM": "table"}),
    (gemm(Precision(3, "signed"), Precision(1, "binary"), EPILOGUES[0], M=40, N=45, K=4090),
     {"SPLIT_K": 2}),
    # the APNN-TC conv at w1a1 (binary activations with padding, 1-bit threshold output)
    (conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=1, H=16, W=16,
          C=1024, K=1024), {"SPLIT_K": 2, "KT": 4, "REQUANT": "threshold"}),
]


def _split_config(wl, changes, arch):
    cfg = MMA_SYNC.default_config(wl, arch, plain=True).replace(**changes)
    assert MMA_SYNC.space(wl, arch).is_valid(cfg), (wl.key, dict(cfg))
    return cfg


@pytest.mark.parametrize("arch", ["sm_80", ARCH90])
def test_nvrtc_compiles_split_k(arch):
    """Split-K, the mma.sync one-tile kernel's: every case compiles."""
    for wl, changes in SPLIT_CASES:
        kernel = MMA_SYNC.build(wl, _split_config(wl, changes, arch), arch=arch)
        assert kernel._main.cubin[:4] == b"\x7fELF"
        assert "constexpr int SPLIT_K = " + str(changes["SPLIT_K"]) in kernel.source
    assert [f.name for f in FAMILIES if "SPLIT_K" in f.knobs.names] == [MMA_SYNC.name]


def test_halo_rows_cover_every_tap_of_the_block():
    """The halo slab starts where the kernel starts it and holds every input row that a valid
    tap of any output pixel of the block reads."""
    checked = 0
    for dims in (dict(N=3, H=11, W=13, C=64, K=8, R=5, S=5, stride=1, pad=2),
                 dict(N=2, H=9, W=9, C=33, K=8, R=3, S=3, stride=2, pad=1),
                 dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3)):
        sh = shape.conv_shape(ConvWorkload(**dims))
        for bm in (16, 64, 128):
            height = shape.halo_rows(sh, bm)
            for m0 in range(0, sh.rows, bm):
                n0, p0 = divmod(m0 // sh.q, sh.p)
                first = n0 * sh.h + max(0, p0 * sh.stride - sh.pad)  # as halo_load computes it
                for m in range(m0, min(m0 + bm, sh.rows)):
                    n, p = divmod(m // sh.q, sh.p)
                    for r in range(sh.r):
                        ih = p * sh.stride - sh.pad + r
                        if 0 <= ih < sh.h:
                            assert first <= n * sh.h + ih < first + height
                            checked += 1
    assert checked > 5000


def test_halo_constraints():
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[0])
    base = plain(wl)
    assert why_invalid(wl, base.replace(HALO=1)) is None
    assert why_invalid(wl, plain(wl, "mma_sync").replace(HALO=1)) is None
    assert "HALO" not in MMA_SYNC_PERSISTENT.knobs.names
    assert "HALO" not in WGMMA_PERSISTENT.knobs.names
    g = gemm(Precision(1, "binary"), Precision(2), EPILOGUES[0])
    assert WGMMA.space(g, ARCH90).knob("HALO").values == (0,)  # a 1x1 window: nothing to share
    assert layout.smem_bytes(wl, base.replace(HALO=1)) > layout.smem_bytes(wl, base)
    family, cfg = split(base.replace(HALO=1))
    assert "constexpr int HALO = 1;" in family.render(wl, cfg)


# ---------------------------------------------------------------- CPU: rows and thresholds

ROWSUM_SHAPES = [dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
                 dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
                 dict(N=2, H=6, W=6, C=128, K=64, R=1, S=1, stride=1, pad=0)]


@pytest.mark.parametrize("arch", ["sm_80", ARCH90])
def test_nvrtc_compiles_rowsum_table_configs(arch):
    wl = conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], **ROWSUM_SHAPES[0])
    for mma in ("mma_sync", "wgmma") if arch == ARCH90 else ("mma_sync",):
        spec = plain(wl, mma, arch).replace(ROWSUM="table")
        kernel = build(wl, spec, arch=arch)
        assert kernel._xpop.cubin[:4] == b"\x7fELF"
        assert tables.side_tables(wl, kernel.spec, "cpu")[1] is not None  # xpop filled
    plain_wl = conv(Precision(2), Precision(2), EPILOGUES[1])  # no binary weights
    assert "ROWSUM='table' not in" in why_invalid(
        plain_wl, plain(plain_wl, "mma_sync", arch).replace(ROWSUM="table"), arch)


THRESHOLD_EPILOGUES = [EPILOGUES[1], EPILOGUES[5],  # u2 / u1 with bias + ReLU
                       Epilogue(out=Precision(2, "signed"), out_layout=BP),
                       Epilogue(bias=True, out=Precision(1), out_layout=BP)]


@pytest.mark.parametrize("arch", ["sm_80", ARCH90])
def test_nvrtc_compiles_threshold_configs(arch):
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], **ROWSUM_SHAPES[1])
    for mma in ("mma_sync", "wgmma") if arch == ARCH90 else ("mma_sync",):
        spec = plain(wl, mma, arch).replace(REQUANT="threshold")
        assert "OUT_THRESH = 1;" in build(wl, spec, arch=arch).source
    for epi in (EPILOGUES[4], EPILOGUES[0]):  # 3-bit planes, int32: no thresholds
        other = conv(Precision(2), Precision(2), epi)
        assert "REQUANT='threshold' not in" in why_invalid(
            other, plain(other, "mma_sync", arch).replace(REQUANT="threshold"), arch)


def test_threshold_table_is_padded_for_unguarded_pair_loads():
    """The kernel loads a lane's column pair of thresholds without a KOUT guard: the table has
    wsum_columns rows (a block tile never leaves it), INT32_MAX past KOUT (never reached, so
    those codes are qmin's bits, masked at the store) and in the fourth column that pads 3
    levels to 16 bytes, and the reference's values in front."""
    from lowbit.reference.epilogue import INT32_MAX, requant_thresholds

    epi = Epilogue(bias=True, relu=True, out=Precision(2, "signed"), out_layout=BP)
    wl = conv(Precision(1, "binary"), Precision(2), epi, K=37)
    params = random_inputs(wl, 3)[2]
    spec = plain(wl).replace(REQUANT="threshold")
    table = tables.epilogue_thresholds(wl, spec, params)
    want = requant_thresholds(epi, params)
    assert table.shape == (shape.wsum_columns(shape.conv_shape(wl)), 4)
    assert torch.equal(table[:37, :3], want)
    assert bool((table[37:] == INT32_MAX).all()) and bool((table[:, 3] == INT32_MAX).all())
    assert tables.epilogue_thresholds(wl, spec.replace(REQUANT="multiply"), params) is None


# ---------------------------------------------------------------- GPU: bit-exact

VARIANTS = [("mma_sync", 0, 0), ("mma_sync", 1, 0), ("wgmma", 0, 0), ("wgmma", 0, 32)]


def _wgmma_gpu() -> bool:
    return device_arch() == ARCH90


def _config(wl, variant):
    """The plain default's kernel parameters of a (MMA, PERSIST, SWIZZLE) variant, requantizing
    by multiplication (test_bit_exact_threshold_epilogue covers the thresholds); None where
    the GPU has no wgmma."""
    mma, persist, swizzle = variant
    if mma == "wgmma" and not _wgmma_gpu():
        return None
    return plain(wl, mma, device_arch()).replace(PERSIST=persist, SWIZZLE=swizzle,
                                                 REQUANT="multiply")


def _poisoned_run(wl, spec=None, seed=0):
    """(kernel output over a poisoned buffer, reference output); spec None: the default."""
    if spec is None:
        family, cfg = default_bitserial(wl)
        kernel = family.build(wl, cfg)
    else:
        kernel = build(wl, spec)
    x, w, params = random_inputs(wl, seed, device="cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    out = torch.empty(want.shape, dtype=want.dtype, device="cuda")
    out.view(torch.uint8).fill_(0xA5)
    got = kernel(x, w, params, out=out)
    assert got is out
    return got.cpu(), want


def _assert_exact(wl, spec=None, seed=0):
    got, want = _poisoned_run(wl, spec, seed)
    assert got.dtype == want.dtype and got.shape == want.shape, wl.key
    if got.dtype == torch.float16:
        got, want = got.view(torch.int16), want.view(torch.int16)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        pairs = [(tuple(i.tolist()), got[tuple(i)].item(), want[tuple(i)].item()) for i in bad[:6]]
        raise AssertionError(f"{wl.key} {dict(spec) if spec else 'default'}: "
                             f"{len(bad)}/{got.numel()} wrong; (index, got, want): {pairs}")


_PAIRS = list(itertools.product(range(1, 5), range(1, 5)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("wb,ab", _PAIRS)
@pytest.mark.parametrize("combo", range(4))
@pytest.mark.gpu
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


@pytest.mark.parametrize("dims", [
    dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3),
    dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
    dict(N=1, H=8, W=8, C=96, K=33, R=2, S=2, stride=2, pad=0),
    dict(N=2, H=6, W=6, C=128, K=64, R=3, S=3, stride=1, pad=0),
    dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
])
@pytest.mark.gpu
def test_bit_exact_odd_conv_shapes(dims):
    checked = 0
    for i, (w, a) in enumerate([(Precision(1, "binary"), Precision(1, "binary")),
                                (Precision(1, "binary"), Precision(2)),
                                (Precision(2, "signed"), Precision(3, "signed"))]):
        wl = conv(w, a, EPILOGUES[i + 1], **dims)
        for variant in (VARIANTS[i % 2], VARIANTS[2 + i % 2]):
            cfg = _config(wl, variant)
            if cfg is not None:
                _assert_exact(wl, cfg, seed=i)
                checked += 1
    assert checked == (6 if _wgmma_gpu() else 3)


@pytest.mark.gpu
def test_bit_exact_int16_accumulator():
    """Epilogue(out="int16") (the bare accumulator a separate pass reads, |acc| < 2^15): every
    kernel variant and the default (tap-shift where it applies), odd and even K, signed
    values and ReLU, a GEMM, and a C = 1024 w1a2 conv whose bound 3 * 9216 is near 2^15."""
    B1, U2, S2 = Precision(1, "binary"), Precision(2), Precision(2, "signed")
    cases = [conv(B1, U2, Epilogue(out="int16"), N=2, H=9, W=9, C=1024, K=64),
             conv(S2, U2, Epilogue(relu=True, out="int16"), N=3, H=14, W=14, C=64, K=37),
             gemm(B1, U2, Epilogue(out="int16"), M=77, N=66, K=2000)]
    checked = 0
    for i, wl in enumerate(cases):
        for variant in VARIANTS:
            cfg = _config(wl, variant)
            if cfg is not None:
                _assert_exact(wl, cfg, seed=i)
                checked += 1
        _assert_exact(wl, None, seed=i)
        checked += 1
    assert checked == (15 if _wgmma_gpu() else 9)


@pytest.mark.parametrize("case", range(len(SPLIT_CASES)))
@pytest.mark.gpu
def test_bit_exact_split_k(case):
    """Split-K configs, launched three times through one bound launcher (the workspace and the
    tile counters are reused: each launch must leave the counters at zero), the output poisoned
    before each launch."""
    wl, changes = SPLIT_CASES[case]
    cfg = _split_config(wl, changes, device_arch())
    x, w, params = random_inputs(wl, case, device="cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    out = torch.empty(want.shape, dtype=want.dtype, device="cuda")
    launch = MMA_SYNC.build(wl, cfg).bind(x, w, params, out)
    for _ in range(3):
        out.view(torch.uint8).fill_(0xA5)
        got = launch().cpu()
        if got.dtype == torch.float16:
            got, want = got.view(torch.int16), want.view(torch.int16)
        assert torch.equal(got, want), (wl.key, dict(cfg))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 1), (3, 3)])
@pytest.mark.gpu
def test_bit_exact_row_table(wb, ab, variant):
    """ROW_TABLE=1 (rows' output rows and tap rectangles from the bound table) on each kernel
    variant, both encodings per operand, stride 1 and 2 with padding, thresholds where the
    output allows and multiplying requantization."""
    checked = 0
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        wl = conv(w_prec, a_prec, EPILOGUES[(wb + ab + combo) % len(EPILOGUES)], N=2, H=9, W=7,
                  C=96, K=70, stride=1 + combo % 2)
        cfg = _config(wl, variant)
        if cfg is None:
            pytest.skip("wgmma needs sm_90a")
        for requant in {"multiply", default_bitserial(wl)[1]["REQUANT"]}:
            _assert_exact(wl, cfg.replace(ROW_TABLE=1, REQUANT=requant), seed=combo)
            checked += 1
    assert checked >= 4


def _kernel_variant_workload(w_prec: Precision, a_prec: Precision, epi: Epilogue,
                             combo: int):
    """The workload of a kernel-variant GPU test's `combo` (0..3): a 3x3 conv of stride 1
    (even combos) or 2 (odd), and a GEMM for combo 3."""
    if combo == 3:
        return gemm(w_prec, a_prec, epi, M=333, N=96, K=700)
    return conv(w_prec, a_prec, epi, N=3, H=11, W=9, C=96, K=70, stride=1 + combo % 2)


def _sm90a_only():
    if not _wgmma_gpu():
        pytest.skip("wgmma needs an sm_90a GPU")


@pytest.mark.parametrize("wb,ab", _PAIRS)
@pytest.mark.gpu
def test_bit_exact_persistent_wgmma_teams(wb, ab):
    """TEAMS=2 in the persistent wgmma kernel (two teams of warpgroups taking a block's tiles
    in turn, MMA issue ordered by named barriers): every bit pair and encoding pair, convs with
    stride 1 and 2 and a GEMM, the first and the last valid team config of each (tile counts
    per team vary with the grid; wider bit pairs may have none: registers)."""
    _sm90a_only()
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = _kernel_variant_workload(w_prec, a_prec, epi, combo)
        teams = [c for c in specs(wl, [WGMMA_PERSISTENT]) if c["TEAMS"] == 2]
        assert teams or wb * ab >= 6, "two teams fit every bit pair of up to 5 plane products"
        for cfg in teams[:1] + teams[-1:]:
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("wb", range(1, 5))
@pytest.mark.gpu
def test_bit_exact_fused_planes(wb):
    """FUSE_PLANES=1 (the two unsigned activation planes summed in one accumulator by the
    wgmma, plane 1 issued twice): every weight encoding, conv stride 1 and 2 and a GEMM, one
    tile per block, persistent and two teams, both requantizations."""
    _sm90a_only()
    rng = random.Random(wb)
    for combo, w_prec in enumerate(encodings(wb) * 2):
        epi = EPILOGUES[(wb + combo) % len(EPILOGUES)]
        wl = _kernel_variant_workload(w_prec, Precision(2), epi, combo)
        fused = [c for c in specs(wl, [WGMMA, WGMMA_PERSISTENT]) if c["FUSE_PLANES"]]
        persistent = [c for c in fused if c["PERSIST"]]
        teams = [c for c in persistent if c["TEAMS"] == 2]
        for cfg in (fused[0], *persistent[-1:], *teams[:1], rng.choice(fused)):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("ab", range(1, 5))
@pytest.mark.gpu
def test_bit_exact_rowsum_cols(ab):
    """ROWSUM="cols" in the wgmma kernels without tap-shift (the row popcounts from ones
    columns after the weights, N = WN + 16): binary weights x every activation encoding, conv
    stride 1 and 2 and a GEMM, one tile per block, with the duplicate-aware load, persistent
    and two teams."""
    _sm90a_only()
    rng = random.Random(ab)
    for combo, a_prec in enumerate(encodings(ab) * 2):
        epi = EPILOGUES[(ab + combo) % len(EPILOGUES)]
        wl = _kernel_variant_workload(Precision(1, "binary"), a_prec, epi, combo)
        cols = [c for c in specs(wl, [WGMMA, WGMMA_PERSISTENT]) if c["ROWSUM"] == "cols"]
        persistent = [c for c in cols if c["PERSIST"]]
        halo = [c for c in cols if c["HALO"]]
        teams = [c for c in persistent if c["TEAMS"] == 2]
        for cfg in (cols[0], *halo[-1:], *persistent[-1:], *teams[:1], rng.choice(cols)):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.gpu
def test_bound_launcher_keeps_the_weight_tables_of_bind_time():
    """Binary activations: the weight sums per tap rectangle are filled once, at bind. A
    launcher replays them (exact, three times); after new weights are copied into the bound
    tensor its `refresh_tables()` makes it exact for those, without a new bind."""
    wl = conv(Precision(1, "binary"), Precision(1, "binary"), EPILOGUES[5], N=2, H=7, W=6, C=64,
              K=48)
    x, w, params = random_inputs(wl, 11, device="cuda")
    family, cfg = default_bitserial(wl)
    launch = family.build(wl, cfg).bind(x, w, params)
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
def test_bit_exact_across_configs():
    """Random configs of every family the GPU runs, on a conv and a GEMM."""
    rng, checked = random.Random(1), 0
    for wl in (conv(Precision(1, "binary"), Precision(2), EPILOGUES[1], N=4, C=96, K=96),
               gemm(Precision(2, "signed"), Precision(2), EPILOGUES[0], M=200, N=130, K=700)):
        for family in FAMILIES:
            if not family.supports(wl):
                continue
            for cfg in family.space(wl).sample(4, rng):
                _assert_exact(wl, family.spec(cfg), seed=rng.randrange(1000))
                checked += 1
    assert checked >= 16


@pytest.mark.gpu
def test_bit_exact_shared_workloads():
    """The plain mma.sync and wgmma defaults on every resnet18_b8 and apconv_sweep layer
    (those whose CPU reference stays quick)."""
    epi = Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP)
    checked = skipped = 0
    for suite in ("resnet18_b8", "apconv_sweep"):
        for name, wl in load_workloads(suite, w=Precision(1, "binary"), a=Precision(2),
                                       w_layout=BP, a_layout=BP, epilogue=epi):
            if wl.gemm_shape[0] * wl.gemm_shape[1] * wl.gemm_shape[2] > 5e9:
                skipped += 1  # keep the CPU reference quick
                continue
            for variant in VARIANTS[::2]:
                cfg = _config(wl, variant)
                if cfg is not None:
                    got, want = _poisoned_run(wl, cfg, seed=len(name))
                    assert torch.equal(got, want), (name, dict(cfg))
                    checked += 1
    assert skipped == 1 and checked == 12 * (2 if _wgmma_gpu() else 1)


@pytest.mark.gpu
def test_bad_inputs_raise_before_launch():
    wl = gemm(Precision(1), Precision(2))
    family, cfg = default_bitserial(wl)
    kernel = family.build(wl, cfg)
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
def test_bit_exact_halo_load(wb, ab, mma):
    """HALO=1 (duplicate-aware load) on convs: every bit pair, all encodings, odd shapes,
    stride 2, padding, blocks spanning image boundaries; mma.sync and wgmma kernels."""
    dims = [dict(N=3, H=11, W=13, C=64, K=70, R=5, S=5, stride=1, pad=2),
            dict(N=2, H=9, W=9, C=33, K=31, R=3, S=3, stride=2, pad=1),
            dict(N=1, H=5, W=5, C=3, K=5, R=7, S=7, stride=2, pad=3),
            dict(N=2, H=6, W=6, C=128, K=64, R=3, S=3, stride=1, pad=0)]
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        wl = conv(w_prec, a_prec, EPILOGUES[(wb + ab + combo) % len(EPILOGUES)],
                  **dims[(wb + ab + combo) % len(dims)])
        cfg = _config(wl, (mma, 0, 32 * (combo % 2) if mma == "wgmma" else 0))
        if cfg is None:
            pytest.skip("wgmma needs sm_90a")
        _assert_exact(wl, cfg.replace(HALO=1), seed=wb * 100 + ab * 10 + combo)


@pytest.mark.gpu
def test_bit_exact_halo_shared_workloads():
    """The plain defaults with the halo load on every resnet18_b8 layer with a window."""
    epi = Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP)
    checked = windows = 0
    for name, wl in load_workloads("resnet18_b8", w=Precision(1, "binary"), a=Precision(2),
                                   w_layout=BP, a_layout=BP, epilogue=epi):
        windows += wl.R * wl.S > 1
        for variant in VARIANTS[::2]:
            cfg = _config(wl, variant)
            if cfg is None or wl.R * wl.S == 1:
                continue
            cfg = cfg.replace(HALO=1)
            if why_invalid(wl, cfg, device_arch()):
                continue  # the slab of a large image past shared memory
            got, want = _poisoned_run(wl, cfg, seed=len(name))
            assert torch.equal(got, want), (name, dict(cfg))
            checked += 1
    assert windows == 8 and checked >= (2 * windows if _wgmma_gpu() else windows - 1)


@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("ab", [1, 2, 4])
@pytest.mark.gpu
def test_bit_exact_rowsum_table(ab, mma):
    """ROWSUM='table' (binary weights' row popcounts from the per-pixel table): every
    activation encoding, padding, stride 2, 1x1, both MMA kinds, persistent and halo too."""
    checked = 0
    for combo, a_prec in enumerate(encodings(ab)):
        for i, dims in enumerate(ROWSUM_SHAPES):
            wl = conv(Precision(1, "binary"), a_prec, EPILOGUES[(ab + combo + i) % 6], **dims)
            cfg = _config(wl, (mma, 0, 32 if mma == "wgmma" else 0))
            if cfg is None:
                pytest.skip("wgmma needs sm_90a")
            for c in (cfg, cfg.replace(PERSIST=1), cfg.replace(HALO=1)):
                c = c.replace(ROWSUM="table")
                if why_invalid(wl, c, device_arch()) is None:
                    _assert_exact(wl, c, seed=ab * 10 + combo + i)
                    checked += 1
    assert checked >= 12


@pytest.mark.parametrize("mma", ["mma_sync", "wgmma"])
@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1)])
@pytest.mark.gpu
def test_bit_exact_threshold_epilogue(wb, ab, mma):
    """REQUANT='threshold' (bias, ReLU, requantize to 1-2 bit planes as integer compares):
    every encoding pair, u1/u2/s2 outputs with and without bias and ReLU, padding, stride 2,
    1x1, one tile per block and persistent."""
    checked = 0
    for combo, (w_prec, a_prec) in enumerate(itertools.product(encodings(wb), encodings(ab))):
        for i, dims in enumerate(ROWSUM_SHAPES):
            epi = THRESHOLD_EPILOGUES[(combo + i) % len(THRESHOLD_EPILOGUES)]
            wl = conv(w_prec, a_prec, epi, **dims)
            cfg = _config(wl, (mma, 0, 32 if mma == "wgmma" else 0))
            if cfg is None:
                pytest.skip("wgmma needs sm_90a")
            for c in (cfg, cfg.replace(PERSIST=1)):
                c = c.replace(REQUANT="threshold")
                if why_invalid(wl, c, device_arch()) is None:
                    _assert_exact(wl, c, seed=wb * 100 + ab * 10 + combo + i)
                    checked += 1
    assert checked >= 12


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
def test_bit_exact_threshold_pairs_outside_tap_shift(wl):
    """THR_PAIRS in the one-tile and persistent wgmma kernels (two columns' thresholds per add
    from the packed table of bind): binary, unsigned and signed weights and activations, one-
    and two-bit outputs, stride 2, odd channel counts, GEMMs; the first and last such configs
    of both families, the first with 64 channels per lane (WN = 256) and two random ones."""
    _sm90a_only()
    rng = random.Random(len(wl.key))
    pairs = [c for c in specs(wl, [WGMMA, WGMMA_PERSISTENT]) if c["THR_PAIRS"]]
    wide = [c for c in pairs if c["WN"] == 256]
    assert pairs
    for cfg in pairs[:1] + pairs[-1:] + wide[:1] + rng.sample(pairs, 2):
        _assert_exact(wl, cfg, seed=len(wl.key) + cfg["WN"])


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1), (4, 4)])
@pytest.mark.gpu
def test_bit_exact_persistent_wgmma(wb, ab):
    """The persistent wgmma family (bitserial_wgmma_persistent.cu): tiles looped per block
    with the copy pipeline across tile boundaries; convs and GEMMs, both swizzles, both row-sum
    modes."""
    _sm90a_only()
    rng = random.Random(wb * 10 + ab)
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = (conv(w_prec, a_prec, epi, N=4, H=9, W=9, C=96, K=70, stride=1 + combo % 2)
              if combo % 2 == 0 else gemm(w_prec, a_prec, epi, M=300, N=130, K=700))
        pts = specs(wl, [WGMMA_PERSISTENT])
        for cfg in rng.sample(pts, min(2, len(pts))):
            _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("combo", range(4))
@pytest.mark.gpu
def test_bit_exact_wide_one_tile_rows(combo):
    """BM=192 x BN=WN=256 one-tile wgmma blocks (168 registers with a few bytes of spill), all
    four w1a1 encoding pairs: convs with border taps and partial column tiles (stride 1 and 2,
    with and without the halo load) and a GEMM, thresholds and multipliers."""
    _sm90a_only()
    w_prec, a_prec = encodings(1)[combo // 2], encodings(1)[combo % 2]
    epi = EPILOGUES[(combo * 3 + 1) % len(EPILOGUES)]
    wl = (conv(w_prec, a_prec, epi, N=4, H=21, W=19, C=96, K=300, stride=1 + combo // 2)
          if combo < 3 else gemm(w_prec, a_prec, epi, M=500, N=300, K=900))
    for changes in ({"HALO": 0, "STAGES": 4}, {"HALO": int(combo < 3), "STAGES": 6},
                    {"HALO": 0, "STAGES": 6, "REQUANT": "multiply"}):
        cfg = plain(wl).replace(BM=192, BN=256, WN=256, KT=1, **changes)
        assert why_invalid(wl, cfg) is None, why_invalid(wl, cfg)
        _assert_exact(wl, cfg, seed=combo)


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (3, 1)])
@pytest.mark.gpu
def test_bit_exact_k_slices(wb, ab):
    """SLICES = 2 and 4 (one tile's k tiles over sets of warpgroups, sums added in shared
    memory): every encoding pair of the bit pair, convs with the halo load (stride 1 and 2)
    and GEMMs with uneven slice ranges."""
    _sm90a_only()
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        wl = (conv(w_prec, a_prec, epi, N=1, H=11, W=13, C=416, K=70, stride=1 + combo // 2)
              if combo % 2 == 0 else gemm(w_prec, a_prec, epi, M=100, N=70, K=2900))
        for sl, halo in ((2, combo % 2 == 0), (4, False)):
            cfg = plain(wl).replace(BM=64, BN=32, WN=32, KT=1, STAGES=4, HALO=int(halo),
                                    SLICES=sl)
            assert why_invalid(wl, cfg) is None, why_invalid(wl, cfg)
            _assert_exact(wl, cfg, seed=combo + sl)


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (1, 4), (2, 3)])
@pytest.mark.gpu
def test_bit_exact_tma_halo(wb, ab):
    """TMA_HALO (the window by tensor copies into swizzled pixel rows, read in place through
    swizzled descriptors with base offset 0, a barrier per channel block): every encoding pair
    of the bit pair on convs over two images whose tiles overrun the image, of 1,024 channels
    (3 x 3 and 5 x 5 windows) and 2,048; 8 x 8 tiles with every k tile resident (the weights by
    bulk copies, or cp.async) and 16 x 8 tiles of two warpgroups with 4 stages, where they
    fit; 128-, 64- and 32-byte blocks in turn."""
    _sm90a_only()
    ran = 0
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        window = dict(R=5, S=5, pad=2) if combo == 3 else {}
        wide = combo == 1  # two channel blocks
        wl = conv(w_prec, a_prec, epi, N=2, H=11, W=13, C=2048 if wide else 1024, K=70,
                  **window)
        kt = 8 if wide else 4
        for changes in (dict(BM=64, BN=32, WN=32, KT=kt, STAGES=12, BULK_WEIGHTS=1),
                        dict(BM=64, BN=32, WN=32, KT=kt, STAGES=12),
                        dict(BM=128, BN=32, WN=32, KT=kt, STAGES=4)):
            width = (128, 64, 32)[(combo + ran) % 3]
            cfg = plain(wl).replace(HALO=1, A_IN_HALO=1, TMA_HALO=width, **changes)
            why = why_invalid(wl, cfg)
            if why and ("STAGES" in why or "shared memory" in why):
                continue  # too many k tiles to keep resident, or too many planes' windows
            assert why is None, why
            _assert_exact(wl, cfg, seed=combo)
            ran += 1
    assert ran >= 4


@pytest.mark.parametrize("trigger", [*sorted(CHAIN_TRIGGERS), "auto"])
@pytest.mark.parametrize("graph", [False, True], ids=["stream", "cuda_graph"])
@pytest.mark.gpu
def test_bit_exact_chained_layers(graph, trigger):
    """Four layers launched back to back with bind(chained=True), each reading the previous
    one's output (programmatic dependent launch: a layer's blocks start while the previous
    layer runs), on the stream and replayed from a CUDA graph: every layer's output equals the
    reference of its own input, for each kernel body of `_chained_configs`."""
    _sm90a_only()
    for seed, (wl, spec) in enumerate(_chained_configs(ARCH90)):
        kernel = build(wl, spec)
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
            assert torch.equal(bufs[i + 1].cpu(), want), (wl.key, dict(spec), f"layer {i}")


@pytest.mark.parametrize("wb,ab", [(1, 1), (1, 2), (2, 2), (1, 4), (2, 3)])
@pytest.mark.gpu
def test_bit_exact_a_in_halo(wb, ab):
    """A_IN_HALO=1 (wgmma reading each tap's A tile in place from the halo): every encoding
    pair of the bit pair on convs whose 8-pixel tiles overrun the image (margins), 3 x 3 and
    5 x 5 windows, 8 x 8 tiles of one warpgroup (also with STAGES=12, and with the weights by
    bulk copies where every k tile is resident) and 16 x 8 tiles of two (in two k slices where
    the registers allow); for two activation planes also both planes as rows of one A tile
    (PLANE_ROWS: 64 x 64 tiles with bulk weights, 128 x 32 tiles of two warpgroups)."""
    _sm90a_only()
    checked = 0
    for combo in range(4):
        w_prec, a_prec = encodings(wb)[combo // 2], encodings(ab)[combo % 2]
        epi = EPILOGUES[(wb + ab + combo) % len(EPILOGUES)]
        window = dict(R=5, S=5, pad=2) if combo == 3 else {}
        wl = conv(w_prec, a_prec, epi, N=2, H=11, W=13, C=256 * (1 + combo % 2), K=70,
                  **window)
        for changes in (dict(BM=64, BN=32, WN=32, KT=1, STAGES=4),
                        dict(BM=64, BN=32, WN=32, KT=1, STAGES=12),  # C = 256: all resident
                        dict(BM=64, BN=32, WN=32, KT=1, STAGES=12, BULK_WEIGHTS=1),
                        dict(BM=64, BN=64, WN=64, KT=1, STAGES=12, BULK_WEIGHTS=1,
                             PLANE_ROWS=1),
                        dict(BM=128, BN=32, WN=32, KT=1, STAGES=4, PLANE_ROWS=1),
                        dict(BM=128, BN=32, WN=32, KT=1, STAGES=3,
                             SLICES=2 if wb * ab <= 2 else 1)):  # 512 threads' registers
            cfg = plain(wl).replace(HALO=1, A_IN_HALO=1, **changes)
            if changes.get("BULK_WEIGHTS") and layout.k_tiles(wl, cfg) > 10:
                continue  # bulk weights: every k tile resident (C = 256 only here)
            if changes.get("PLANE_ROWS") and ab != 2:
                continue  # both activation planes as rows: two planes only
            assert why_invalid(wl, cfg) is None, why_invalid(wl, cfg)
            _assert_exact(wl, cfg, seed=combo)
            checked += 1
    assert checked >= 12
