"""The block-end epilogue in the CUDA bit-serial families and cuda.int8_wgmma
(bitserial_block_end.cu, HAS_BIAS = 5): a narrow residual, 32-bit requantization, the mid value
as bytes and derived outputs by thresholds (bit planes, or bytes through a table of the mid
value), store_out=False. The kernels' own CUDA text run by the host emulation bit-exact against
`lowbit.reference.run_outputs` on fresh random inputs (ResNet-like block ends made small: 1x1
64 -> 256 and 3x3 convs, odd batch, K not a multiple of 32, w1a2 and w2a2, ReLU on and off,
mid u8 and s8, one and two derived outputs, int8 operands), a broken kernel caught, NVRTC
builds for sm_80 and sm_90a, the families' spaces and defaults, and the same cases on a GPU
through bind / launch (`gpu`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Layout, Precision, Workload
from lowbit.core.epilogue import EpilogueParams
from lowbit.kernels.cuda import (
    BY_NAME,
    FAMILIES,
    INT8_WGMMA,
    bitserial_emu,
    default_bitserial,
)
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.reference import random_inputs, run_outputs

BP, I8, PK = Layout.BITPLANE, Layout.INT8, Layout.PACKED
B1, U2, S2 = Precision(1, "binary"), Precision(2), Precision(2, "signed")
U8, S8, S4 = Precision(8), Precision(8, "signed"), Precision(4, "signed")
SM80, SM90 = "sm_80", "sm_90a"


def block_end(mid: Precision = U8, residual: Precision | None = S8, relu: bool = True,
              derived: tuple = ((U2, BP),), store_out: bool = True, sum64: bool = False,
              layout: Layout = I8) -> Epilogue:
    return Epilogue(shifted_bias=True, relu=relu, out=mid, out_layout=layout, requant32=True,
                    residual=residual, derived=derived, store_out=store_out, sum64=sum64)


def block_end64(mid: Precision = U8, residual: Precision | None = S8, relu: bool = True,
                derived: tuple = ((U2, BP),), store_out: bool = True,
                layout: Layout = I8) -> Epilogue:
    """The 64-bit block end (Epilogue.sum64): random params of 31-bit multipliers."""
    return block_end(mid, residual, relu, derived, store_out, True, layout)


def conv(w: Precision, a: Precision, epi: Epilogue, layout: Layout = BP, **dims) -> ConvWorkload:
    shape = dict(N=3, H=4, W=4, C=64, K=256, R=1, S=1, stride=1, pad=0)
    shape.update(dims)
    return ConvWorkload(w=w, a=a, w_layout=layout, a_layout=layout, epilogue=epi, **shape)


#: (id, family, workload, knob changes to the family's default on sm_90a): fast ones first
EMU_CASES = [
    # ResNet-50's block end made small: 1x1 64 -> 256, odd batch, u8 stream + u2 bit planes
    ("wgmma_1x1_w1a2_u8_u2", "cuda.bitserial_wgmma", conv(B1, U2, block_end()), {}),
    # 3x3, K not a multiple of 32 (nor of 8: pair accesses), w2a2, u8 residual
    ("mma_sync_3x3_w2a2_odd_k", "cuda.bitserial_mma_sync",
     conv(S2, U2, block_end(residual=U8), N=1, H=6, W=5, C=40, K=37, R=3, S=3, pad=1), {}),
    # a downsampling shortcut: no residual read, the s8 stream written (its default tile)
    ("wgmma_1x1_w1a2_shortcut_s8", "cuda.bitserial_wgmma",
     conv(B1, U2, block_end(S8, None, False, ()), K=72), {}),
    ("int8_wgmma_s8_residual_int8_derived", "cuda.int8_wgmma",
     conv(S8, U8, block_end(derived=((U8, I8),)), I8, N=1, H=5, W=6, C=32, K=64, R=3, S=3,
          pad=1), {}),
]
#: the 64-bit block end (Epilogue.sum64): 31-bit multipliers, residual terms up to 2^8 times
#: the accumulator's multiplier (r past 2^32), shifts on both sides of 32
EMU64_CASES = [
    ("wgmma_1x1_w1a2_u8_u2_s8_residual", "cuda.bitserial_wgmma", conv(B1, U2, block_end64()), {}),
    ("mma_sync_3x3_w2a2_odd_k_u8_residual", "cuda.bitserial_mma_sync",
     conv(S2, U2, block_end64(residual=U8), N=1, H=6, W=5, C=40, K=37, R=3, S=3, pad=1), {}),
    ("wgmma_1x1_u4_mid_bitplane_no_relu", "cuda.bitserial_wgmma",
     conv(B1, U2, block_end64(Precision(4), S8, False, (), layout=BP), N=1, H=5, W=7, K=96), {}),
    ("mma_sync_shortcut_s8_no_residual", "cuda.bitserial_mma_sync",
     conv(B1, U2, block_end64(S8, None, False, ()), N=1, H=5, W=5, K=72), {}),
]
SLOW_EMU64_CASES = [
    ("wgmma_3x3_w2a2_two_derived_unstored", "cuda.bitserial_wgmma",
     conv(S2, U2, block_end64(S8, U8, False, ((S2, BP), (S8, I8)), False), N=1, H=6, W=5,
          K=64, R=3, S=3, pad=1), {}),
    ("tap_shift_3x3_w1a2", "cuda.bitserial_tap_shift",
     conv(B1, U2, block_end64(), N=2, H=9, W=8, K=64, R=3, S=3, pad=1),
     {"BM": 128, "BN": 64, "WN": 64, "PERSIST": 1, "STAGES": 3, "TEAMS": 1, "ROWSUM": "cols",
      "ROW_TABLE": 2, "FUSE_PLANES": 0, "THR_PAIRS": 0, "SWIZZLE": 32}),
    ("mma_sync_persistent_gemm_w1a2", "cuda.bitserial_mma_sync_persistent",
     GemmWorkload(w=B1, a=U2, w_layout=BP, a_layout=BP, M=130, N=96, K=512,
                  epilogue=block_end64(S8, S8, True, ((U2, BP), (U8, I8)))), {}),
    ("int8_wgmma_s8_residual_int8_derived", "cuda.int8_wgmma",
     conv(S8, U8, block_end64(derived=((U8, I8),)), I8, N=1, H=5, W=6, C=32, K=64, R=3, S=3,
          pad=1), {}),
    ("mma_sync_split_k_u2_mid_bitplane", "cuda.bitserial_mma_sync",
     conv(S2, U2, block_end64(U2, S8, True, ((U8, I8),), layout=BP), N=1, H=4, W=4, C=512,
          K=64, R=3, S=3, pad=1), {"SPLIT_K": 2, "BM": 16, "WM": 16, "BN": 64, "WN": 32}),
]
SLOW_EMU_CASES = [
    # no ReLU, a signed mid value, two derived outputs (u2 bit planes and s8 bytes through the
    # table), the mid value not stored
    ("wgmma_3x3_w2a2_s8_two_derived_unstored", "cuda.bitserial_wgmma",
     conv(S2, U2, block_end(S8, U8, False, ((S2, BP), (S8, I8)), False), N=1, H=6, W=5, K=64,
          R=3, S=3, pad=1), {}),
    ("tap_shift_3x3_w1a2", "cuda.bitserial_tap_shift",
     conv(B1, U2, block_end(), N=2, H=9, W=8, K=64, R=3, S=3, pad=1),
     {"BM": 128, "BN": 64, "WN": 64, "PERSIST": 1, "STAGES": 3, "TEAMS": 1, "ROWSUM": "cols",
      "ROW_TABLE": 2, "FUSE_PLANES": 0, "THR_PAIRS": 0, "SWIZZLE": 32}),
    ("mma_sync_persistent_gemm_w1a2", "cuda.bitserial_mma_sync_persistent",
     GemmWorkload(w=B1, a=U2, w_layout=BP, a_layout=BP, M=130, N=96, K=512,
                  epilogue=block_end(S8, S8, True, ((U2, BP), (U8, I8)))), {}),
    ("wgmma_persistent_w1a2_binary_acts", "cuda.bitserial_wgmma_persistent",
     conv(B1, B1, block_end(derived=((Precision(1), BP),)), N=1, H=6, W=6, C=64, K=64, R=3,
          S=3, pad=1), {}),
    ("mma_sync_split_k_u2_mid_bitplane", "cuda.bitserial_mma_sync",
     conv(S2, U2, Epilogue(shifted_bias=True, relu=True, out=U2, out_layout=BP, requant32=True,
                           residual=S8, derived=((U8, I8),)), N=1, H=4, W=4, C=512, K=64,
          R=3, S=3, pad=1), {"SPLIT_K": 2, "BM": 16, "WM": 16, "BN": 64, "WN": 32}),
]


def _needs_compiler() -> None:
    if compiler() is None:
        pytest.skip("needs a host C++ compiler")


def _check_emulated(name: str, wl: Workload, changes: dict, seed: int = 0) -> None:
    """Emulated outputs equal the reference's (every one: the mid value where stored, each
    derived output), the values spread, and the outputs depend on the residual."""
    _needs_compiler()
    family = BY_NAME[name]
    cfg = Config({**family.default_config(wl, SM90), **changes})
    assert cfg.get("REQUANT", "multiply") == "multiply"
    x, w, params = random_inputs(wl, seed=seed + len(wl.key))
    got = bitserial_emu.emulate_outputs(family, wl, cfg, x, w, params)
    want = run_outputs(wl, x, w, params)
    assert len(got) == len(want) == wl.epilogue.store_out + len(wl.epilogue.derived)
    for g, w_ in zip(got, want, strict=True):
        assert torch.equal(g, w_), (name, dict(cfg))
    assert all(len(set(w_.flatten().tolist())) >= 3 for w_ in want)
    if wl.epilogue.residual is not None:
        flipped = EpilogueParams(**{**params.__dict__, "residual": params.residual.flip(-1)})
        assert any(not torch.equal(a, b) for a, b in
                   zip(want, run_outputs(wl, x, w, flipped), strict=True))


def _emu_params() -> list:
    """The 32- and 64-bit block-end cases, the slow ones in the slow tier."""
    return [pytest.param(*c[1:], id=f"{sum_bits}-{c[0]}",
                         marks=[pytest.mark.slow] if slow else [])
            for sum_bits, cases, slow in (("sum32", EMU_CASES, False),
                                          ("sum32", SLOW_EMU_CASES, True),
                                          ("sum64", EMU64_CASES, False),
                                          ("sum64", SLOW_EMU64_CASES, True))
            for c in cases]


@pytest.mark.parametrize("name,wl,changes", _emu_params())
def test_emulated_block_end_is_bit_exact(name, wl, changes):
    _check_emulated(name, wl, changes)


def test_64_bit_block_end_params_reach_past_32_bits():
    """The emulated sum64 cases' params exercise what the 32-bit path cannot hold: most
    multipliers of 31 bits, residual multipliers past 2^32 (the high word's multiply), shifts
    both at most 32 (the funnel's low word) and past it (the high word's shift), negative
    residual multipliers, biases past int32."""
    shifts, wide_r, negative_r, wide_b, full_m, channels = set(), 0, 0, 0, 0, 0
    for _, _, wl, _ in EMU64_CASES:
        _, _, p = random_inputs(wl, seed=len(wl.key))
        shifts |= set(p.shift.tolist())
        full_m += int((p.multiplier >= 2**30).sum())
        channels += p.multiplier.numel()
        wide_b += int((p.shifted_bias.abs() >= 2**31).sum())
        if p.residual_multiplier is not None:
            assert p.residual_multiplier.dtype == torch.int64
            wide_r += int((p.residual_multiplier >= 2**32).sum())
            negative_r += int((p.residual_multiplier < 0).sum())
    assert min(shifts) <= 32 < max(shifts)
    assert full_m >= channels // 2 and wide_r >= 20 and negative_r >= 20 and wide_b >= 20


@pytest.mark.slow
@pytest.mark.parametrize("edit", [
    ("(int)c.z;", "(int)c.z * 0;"),  # the residual term dropped
    ("prmt(first, second, hi ? 0x7632 : 0x5410)", "prmt(first, second, 0x5410)"),
    ("(hit[1][t] & hit[2][t]) | (~hit[1][t] & hit[0][t])", "hit[0][t]"),  # bit 0 = T_0 only
    ("return __ldg(be.lut[J] + qo);", "return __ldg(be.lut[J] + qo + 1);"),
], ids=["residual_dropped", "quad_transpose_unswapped", "u2_low_bit_wrong", "table_shifted"])
def test_emulation_catches_a_broken_block_end(edit):
    """The exactness check fails when the kernel drops the residual, leaves the quad's
    transpose half done, misplaces the derived u2 planes' low bit or reads the table one off
    (bitserial_block_end.cu edited for the test)."""
    _check_broken(edit, block_end(derived=((U2, BP), (S4, I8))))


@pytest.mark.slow
@pytest.mark.parametrize("edit", [
    ("hi = (u32)(z >> 32) + (u32)u * d.y;", "hi = (u32)(z >> 32);"),  # r's high word dropped
    ("quad.x ^ RES_FLIP, quad.y ^ RES_FLIP", "quad.x, quad.y"),  # signed bytes read as is
    ("__funnelshift_rc(lo, hi, c.y) >> (int)d.z", "__funnelshift_rc(lo, hi, c.y)"),
], ids=["residual_high_word_dropped", "signed_residual_unflipped", "high_shift_dropped"])
def test_emulation_catches_a_broken_64_bit_block_end(edit):
    """The same check on the 64-bit block end (Epilogue.sum64): it fails without the residual
    multiplier's high word, without the signed residual's offset or without the shift past
    32."""
    _check_broken(edit, block_end64(Precision(4), S8, True, ((U2, BP),), layout=BP))


def _check_broken(edit: tuple[str, str], epi: Epilogue) -> None:
    from lowbit.kernels.cuda.cu_source import cu_file

    _needs_compiler()
    text = cu_file("bitserial_block_end.cu")
    assert text.count(edit[0]) == 1
    wl = conv(B1, U2, epi, N=1, K=64)
    family = BY_NAME["cuda.bitserial_wgmma"]
    cfg = family.default_config(wl, SM90)
    x, w, params = random_inputs(wl, 5)
    want = run_outputs(wl, x, w, params)
    good = bitserial_emu.emulate_outputs(family, wl, cfg, x, w, params)
    assert all(torch.equal(a, b) for a, b in zip(good, want, strict=True))
    broken = bitserial_emu.emulate_outputs(
        family, wl, cfg, x, w, params,
        supplied={"bitserial_block_end.cu": text.replace(*edit)})
    assert any(not torch.equal(a, b) for a, b in zip(broken, want, strict=True))


# ------------------------------------------------------------------------------ NVRTC
COMPILE_CASES = [
    ("cuda.bitserial_mma_sync", SM80, conv(B1, U2, block_end(), N=256, H=56, W=56)),
    ("cuda.bitserial_wgmma", SM90, conv(B1, U2, block_end(), N=256, H=56, W=56)),
]
SLOW_COMPILE_CASES = [
    ("cuda.bitserial_mma_sync_persistent", SM80,
     conv(S2, U2, block_end(S8, U8, False, ((S2, BP), (U8, I8)), False), N=8, H=14, W=14,
          C=256, K=1024)),
    ("cuda.bitserial_wgmma_persistent", SM90, conv(S2, U2, block_end(), N=8, H=28, W=28,
                                                  C=128, K=512)),
    ("cuda.bitserial_tap_shift", SM90, conv(B1, U2, block_end(), N=8, H=56, W=56, K=64, R=3,
                                            S=3, pad=1)),
    ("cuda.int8_wgmma", SM90, conv(S8, U8, block_end(derived=((U8, I8),)), I8, N=8, H=14,
                                   W=14, C=256, K=1024)),
]


def _compile(name: str, arch: str, wl: Workload) -> None:
    from lowbit.kernels.cuda.nvrtc import compile_cubin
    from lowbit.kernels.cuda.sass import kernel_instructions, nvdisasm_path, opcodes

    family = BY_NAME[name]
    cfg = family.default_config(wl, arch)
    cubin = compile_cubin(family.render(wl, cfg), arch)
    assert len(cubin) > 1000
    if nvdisasm_path() is not None:  # the block-end code is in the kernel
        ops = opcodes(kernel_instructions(cubin)[family.kernel_name(cfg)])
        assert ops.count("SHFL.BFLY") >= 4 and "STG.E.64" in ops
        if wl.epilogue.sum64:  # the 64-bit sum: wide multiply-adds, funnel shifts
            wide = "IMAD.WIDE.U32" if wl.epilogue.residual is not None else "IMAD.WIDE"
            assert ops.count(wide) >= 32 and ops.count("SHF.R.U32") >= 32, ops


@pytest.mark.parametrize("name,arch,wl", COMPILE_CASES, ids=[c[0] for c in COMPILE_CASES])
def test_block_end_compiles_with_nvrtc(name, arch, wl):
    _compile(name, arch, wl)


#: ResNet-50's w1a2 block ends at batch 256 (layer1's, with the s8 and the u8 residual) and
#: its downsampling shortcut (no residual, the s8 stream written), 64-bit
COMPILE64_CASES = [
    (family, arch, epi_id, conv(B1, U2, epi, N=256, H=56, W=56))
    for family, arch in (("cuda.bitserial_mma_sync", SM80), ("cuda.bitserial_wgmma", SM90))
    for epi_id, epi in (("s8_residual", block_end64()), ("u8_residual", block_end64(residual=U8)),
                        ("shortcut", block_end64(S8, None, False, ())))]


@pytest.mark.parametrize("name,arch,wl", [pytest.param(n, a, w, id=f"{n}-{i}")
                                          for n, a, i, w in COMPILE64_CASES])
def test_64_bit_block_end_compiles_without_spills(name, arch, wl):
    """NVRTC builds the sum64 block end for sm_80 (mma.sync) and sm_90a (wgmma) with no
    register spill (ptxas), its sum formed by wide multiply-adds (IMAD.WIDE.U32 with a
    residual) and its shift by funnel shifts, and the default config the 32-bit one has."""
    _compile(name, arch, wl)
    _builds_without_spills(name, arch, wl, replace(wl.epilogue, sum64=False))


def _builds_without_spills(name: str, arch: str, wl: Workload, other: Epilogue) -> Config:
    """ptxas builds the default kernel of (name, wl) on arch with no spill and at most 128
    registers, its config that of the same workload with the epilogue `other`; returns it."""
    from lowbit.kernels.cuda.nvrtc import ptxas_report

    family = BY_NAME[name]
    cfg = family.default_config(wl, arch)
    assert cfg == family.default_config(wl.replace(epilogue=other), arch)
    report = ptxas_report(family.render(wl, cfg), arch, family.kernel_name(cfg))
    assert report["spill_bytes"] == 0 and 0 < report["registers"] <= 128, report
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("name,arch,wl", SLOW_COMPILE_CASES,
                         ids=[c[0] for c in SLOW_COMPILE_CASES])
def test_block_end_compiles_with_nvrtc_slow(name, arch, wl):
    _compile(name, arch, wl)


# ------------------------------------------------------------------------------ templates
def test_families_take_the_block_end_epilogue():
    """Every bit-serial family and cuda.int8_wgmma supports it where it supports the plain
    requantized layer, with the multiply path only (REQUANT="threshold" cannot serve a
    residual or derived outputs) and whole 32-column warp words for bit planes; default
    configs pick multiply; the packed layout and derived outputs without requant32 are
    refused with a reason."""
    wl = conv(B1, U2, block_end(), N=8, H=28, W=28, K=128, R=3, S=3, pad=1)
    int8 = conv(S8, U8, block_end(derived=((U8, I8),)), I8, N=8, H=14, W=14, C=128, K=128)
    checked = 0
    for family in (*FAMILIES, INT8_WGMMA):
        target = int8 if family is INT8_WGMMA else wl
        assert family.takes_block_end and family.workload_reason(target) is None, family.name
        space = family.space(target, SM90)
        assert all(c.get("REQUANT", "multiply") == "multiply" for c in space.all_configs()[:50])
        cfg = family.default_config(target, SM90)
        assert space.is_valid(cfg)
        if "WN" in cfg and "BN" in family.knobs.names:
            narrow = Config({**cfg, "WN": 16, "BN": 16})
            assert "multiple of 32" in (space.why_invalid(narrow) or "multiple of 32")
        checked += 1
    assert checked == len(FAMILIES) + 1
    picked, cfg = default_bitserial(wl, SM90)
    assert cfg.get("REQUANT", "multiply") == "multiply" and picked.takes_block_end
    packed = wl.replace(epilogue=block_end(derived=((U2, PK),)))
    assert "packed" in BY_NAME["cuda.bitserial_wgmma"].workload_reason(packed)
    loose = wl.replace(epilogue=Epilogue(shifted_bias=True, out=U8, derived=((U2, BP),)))
    assert "requant32" in BY_NAME["cuda.bitserial_mma_sync"].workload_reason(loose)


def test_byte_bound_epilogues_of_binary_weights_take_the_block_end_tile():
    """ResNet-50's w1a2 block ends and its downsampling shortcuts (the s8 stream written, no
    residual read) at batch 256 default to the 64 x 128 fused-plane tile; the same convs with
    a plain bit-plane output or 2-bit weights do not."""
    from lowbit.kernels.cuda.bitserial_defaults import BLOCK_END_TILE

    def tile(cfg: Config) -> dict:
        return {k: cfg.get(k) for k in BLOCK_END_TILE}

    shapes = [dict(N=256, H=56, W=56, C=64, K=256), dict(N=256, H=28, W=28, C=128, K=512)]
    plain = Epilogue(shifted_bias=True, relu=True, out=U2, out_layout=BP, requant32=True)
    checked = 0
    for shape in shapes:
        for epi, want in [(block_end(), True), (block_end(S8, None, False, ()), True),
                          (plain, False)]:
            family, cfg = default_bitserial(conv(B1, U2, epi, **shape), SM90)
            took = family.name == "cuda.bitserial_wgmma" and tile(cfg) == BLOCK_END_TILE
            assert took == want, (epi.key, family.name, dict(cfg))
            checked += 1
        _, cfg = default_bitserial(conv(S2, U2, block_end(S8, None, False, ()), **shape), SM90)
        assert tile(cfg) != BLOCK_END_TILE
        checked += 1
    assert checked == 8


def test_templates_without_the_block_end_refuse_it():
    """Every registered template that runs the plain requantized layer but does not declare
    takes_block_end (the tiled mma.sync s8 / s4 convs, the Triton templates) refuses the
    block-end epilogue with a reason naming it (kernels.base.block_end_refusal): none drops a
    derived output or misreads the int32 vectors."""
    from lowbit.kernels import load_backends
    from lowbit.kernels.base import templates

    load_backends()
    plains = [conv(S8, U8, Epilogue(shifted_bias=True, relu=True, out=S8), I8, N=2, H=8, W=8,
                   C=64, K=64, R=3, S=3, pad=1),
              conv(S8, S8, Epilogue(bias=True, relu=True, out=S8), I8, N=2, H=8, W=8, C=64,
                   K=64, R=3, S=3, pad=1),
              conv(S4, S4, Epilogue(bias=True, relu=True, out=S8), PK, N=2, H=8, W=8, C=64,
                   K=64, R=3, S=3, pad=1)]
    ends = (Epilogue(shifted_bias=True, relu=True, out=S8, requant32=True),
            block_end(S8, S8), block_end(S8, None, derived=((U8, I8),), store_out=False))
    checked = set()
    for t in templates():
        for plain in plains:
            if t.takes_block_end or t.unsupported_reason(plain) is not None:
                continue
            for epi in ends:
                reason = t.unsupported_reason(plain.replace(epilogue=epi))
                assert reason and "block-end" in reason, (t.name, reason)
            checked.add(t.name)
    assert {"cuda.mma_conv_s8", "cuda.mma_conv_s4", "triton.conv2d_int8"} <= checked


def test_bind_requires_the_derived_buffers():
    from lowbit.kernels.cuda.bitserial_tables import block_end_args

    wl = conv(B1, U2, block_end(derived=((U2, BP), (U8, I8))), N=1)
    _, _, params = random_inputs(wl, 1)
    args, keep = block_end_args(wl, params)
    assert args.derived[0] == params.derived_out[0].data_ptr() and len(keep) == 3
    assert args.lut[0] is None and args.lut[1] == keep[2].data_ptr()  # u2 planes: compares
    lo = wl.epilogue.mid_range[0]
    t = params.thresholds[0].tolist()
    want = [(0x8000 - min(max(v - lo, 0), 256)) * 0x10001 for v in t]
    assert [v % 2**32 for v in args.thr[0]] == want
    table = keep[2].tolist()  # u8 bytes: 0 + #{T <= q}
    assert table == [sum(v <= q for v in params.thresholds[1].tolist()) for q in range(256)]
    with pytest.raises(ValueError, match="derived_out must hold"):
        block_end_args(wl, EpilogueParams(**{**params.__dict__, "derived_out": ()}))


# ------------------------------------------------------------------------------ GPU
GPU_CASES = [
    ("1x1_w1a2_u8_u2", conv(B1, U2, block_end(), N=3, H=14, W=14)),
    ("1x1_w2a2_s8_two_derived", conv(S2, U2, block_end(S8, U8, False, ((U2, BP), (S8, I8))),
                                     N=3, H=7, W=7, C=128, K=512)),
    ("3x3_w1a2_odd_k", conv(B1, U2, block_end(residual=U8), N=3, H=9, W=9, C=64, K=37, R=3, S=3,
                            pad=1)),
    ("3x3_w2a2_unstored", conv(S2, U2, block_end(derived=((U2, BP), (U8, I8)), store_out=False),
                               N=5, H=14, W=14, C=128, K=128, R=3, S=3, pad=1)),
    ("1x1_w1a2_layer4", conv(B1, U2, block_end(), N=3, H=7, W=7, C=512, K=2048)),
]
GPU_INT8 = conv(S8, U8, block_end(derived=((U8, I8),)), I8, N=3, H=14, W=14, C=64, K=256)


def _gpu_check(family, wl: Workload, cfg: Config, seed: int) -> None:
    x, w, params = random_inputs(wl, seed, "cuda")
    params = EpilogueParams(**{**params.__dict__, "derived_out": tuple(
        torch.full_like(b, 0x5A) for b in params.derived_out)})
    kernel = family.build(wl, cfg)
    launch = kernel.bind(x, w, params)
    out = launch()
    got = ([out] if wl.epilogue.store_out else []) + list(params.derived_out)
    want = run_outputs(wl, x.cpu(), w.cpu(), params.to("cpu"))
    for g, w_ in zip(got, want, strict=True):
        assert torch.equal(g.cpu(), w_), (family.name, dict(cfg), wl.key)


@pytest.mark.gpu
@pytest.mark.parametrize("wl", [c[1] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_block_end_every_family(wl):
    """The default kernel of every family that runs the workload on this GPU, bit for bit."""
    checked = 0
    for family in FAMILIES:
        if not family.supports(wl):
            continue
        _gpu_check(family, wl, family.default_config(wl), seed=checked)
        checked += 1
    assert checked >= 2


@pytest.mark.gpu
def test_gpu_block_end_int8_wgmma():
    if not INT8_WGMMA.supports(GPU_INT8):
        pytest.skip(INT8_WGMMA.unsupported_reason(GPU_INT8))
    _gpu_check(INT8_WGMMA, GPU_INT8, INT8_WGMMA.default_config(GPU_INT8), seed=3)


def _sum64(wl: Workload) -> Workload:
    return wl.replace(epilogue=replace(wl.epilogue, sum64=True))


@pytest.mark.gpu
@pytest.mark.parametrize("wl", [_sum64(c[1]) for c in GPU_CASES] + [
    conv(B1, U2, block_end64(S8, None, False, ()), N=5, H=14, W=14, C=256, K=512),
    conv(B1, U2, block_end64(Precision(4), S8, False, (), layout=BP), N=3, H=7, W=7, K=96)],
    ids=[c[0] for c in GPU_CASES] + ["shortcut_s8", "u4_mid_bitplane"])
def test_gpu_64_bit_block_end_every_family(wl):
    """The 64-bit block end (Epilogue.sum64, 31-bit multipliers, residual multipliers past
    2^32), the default kernel of every family that runs it on this GPU, bit for bit."""
    assert _gpu_every_family(wl, seed=11) >= 2


def _gpu_every_family(wl, seed: int) -> int:
    """`_gpu_check` of the default kernel of every family that runs `wl`; how many ran."""
    checked = 0
    for family in FAMILIES:
        if family.supports(wl):
            _gpu_check(family, wl, family.default_config(wl), seed=checked + seed)
            checked += 1
    return checked


@pytest.mark.gpu
def test_gpu_64_bit_block_end_int8_wgmma():
    wl = _sum64(GPU_INT8)
    if not INT8_WGMMA.supports(wl):
        pytest.skip(INT8_WGMMA.unsupported_reason(wl))
    _gpu_check(INT8_WGMMA, wl, INT8_WGMMA.default_config(wl), seed=4)


# ------------------------------------------------------------- the guarded block end
def _guarded(wl: Workload) -> Workload:
    return wl.replace(epilogue=replace(wl.epilogue, guarded=True))


def _columns(wl: Workload, params: EpilogueParams) -> list[list[int]] | None:
    from lowbit.kernels.cuda.bitserial_tables import guarded_columns

    m, b, s = (t.tolist() for t in (params.multiplier, params.shifted_bias, params.shift))
    r = (params.residual_multiplier.tolist() if params.residual_multiplier is not None
         else [0] * len(m))
    return guarded_columns(wl, m, b, r, s)


@pytest.mark.parametrize("name,wl,changes", [pytest.param(c[1], _guarded(c[2]), c[3], id=c[0])
                                             for c in EMU64_CASES])
def test_emulated_guarded_block_end_is_bit_exact(name, wl, changes):
    """Epilogue.guarded (the 32-bit sum, the 64-bit one near rounding steps) on the sum64
    cases' random params (31-bit multipliers, s8 / u8 / no residual, byte and bit-plane
    outputs, the shortcut without a residual): every column has the guarded form, and the
    emulated kernel equals the reference's exact 64-bit result."""
    _, _, params = random_inputs(wl, seed=len(wl.key))
    assert _columns(wl, params) is not None
    _check_emulated(name, wl, changes)


def _near_step_inputs(wl: Workload, seed: int):
    """Inputs whose exact block end sits at a rounding step for many outputs: x = y m / 2^32
    + u r / 2^32 + b / 2^32 with m = 2^30 + jm, r = 2^29 + jr, b = -2^31 + jb and |jm|, |jr|,
    |jb| < 128 gives (2y + u) / 8 + (y jm + u jr + jb) / 2^32 - 1/2: where 8 divides 2y + u
    the output lies a hair off a step (the 32-bit form's rounded multipliers drop the hair),
    and which side follows the jitters' sign."""
    x, w, params = random_inputs(wl, seed)
    k = params.shift.numel()
    gen = torch.Generator().manual_seed(seed)

    def jitter() -> torch.Tensor:
        return torch.randint(-127, 128, (k,), generator=gen, dtype=torch.int64)

    res = wl.epilogue.residual is not None
    params = EpilogueParams(**{
        **params.__dict__, "multiplier": (2**30 + jitter()).to(torch.int32),
        "shift": torch.full((k,), 32, dtype=torch.int32),
        "shifted_bias": -(2**31) + jitter(),
        "residual_multiplier": 2**29 + jitter() if res else None})
    return x, w, params


def _near_counts(wl: Workload, x, w, params: EpilogueParams) -> tuple[int, int]:
    """(outputs whose 32-bit sum lies within E of a step: the kernel's 64-bit redo, outputs
    whose plain 32-bit result differs from the exact one), from the guarded columns."""
    from lowbit.kernels.base import acc_bound
    from lowbit.kernels.cuda.bitserial_tables import guarded_form
    from lowbit.reference.ops import _accumulators

    y = _accumulators(wl, x, w, params).to(torch.int64)
    res = wl.epilogue.narrow_residual
    u = params.residual.to(torch.int64) if res is not None else torch.zeros_like(y)
    top_res = 0 if res is None else max(-res.qmin, res.qmax)
    r = params.residual_multiplier if res is not None else torch.zeros_like(params.shift)
    forms = [guarded_form(mc, bc, rc, sc, acc_bound(wl), top_res) for mc, bc, rc, sc in zip(
        params.multiplier.tolist(), params.shifted_bias.tolist(), r.tolist(),
        params.shift.tolist(), strict=True)]
    m2, b2, r2, s2, e = (torch.tensor(v) for v in zip(*forms, strict=True))
    z32 = y * m2 + u * r2 + b2 + (1 << (s2 - 1))
    s = params.shift.to(torch.int64)
    z64 = (y * params.multiplier.to(torch.int64) + u * r.to(torch.int64)
           + params.shifted_bias + (1 << (s - 1)))
    rem = z32 & ((1 << s2) - 1)
    near = (rem < e) | (rem >= (1 << s2) - e)
    lo, hi = wl.epilogue.mid_range
    differ = (z32 >> s2).clamp(lo, hi) != (z64 >> s).clamp(lo, hi)
    assert not bool((differ & ~near).any())  # the guard's claim: only near outputs differ
    half_e = (rem < e // 2) | (rem >= (1 << s2) - e // 2)
    return int(half_e.sum()), int(differ.sum())


NEAR_CASES = [
    ("wgmma_s8_residual_u8_u2", "cuda.bitserial_wgmma",
     conv(B1, U2, replace(block_end64(), guarded=True), N=2, H=5, W=7, K=96)),
    ("wgmma_shortcut_no_residual", "cuda.bitserial_wgmma",
     conv(B1, U2, replace(block_end64(S8, None, False, ()), guarded=True), N=2, H=5, W=7, K=72)),
    ("mma_sync_u8_residual_u4_bitplane", "cuda.bitserial_mma_sync",
     conv(B1, U2, replace(block_end64(Precision(4), U8, True, (), layout=BP), guarded=True),
          N=2, H=5, W=7, K=96)),
]


@pytest.mark.parametrize("name,wl", [c[1:] for c in NEAR_CASES], ids=[c[0] for c in NEAR_CASES])
def test_guarded_block_end_redoes_outputs_at_rounding_steps(name, wl):
    """Outputs constructed to sit within E/2 of a rounding step (`_near_step_inputs`): many
    take the 64-bit redo, the plain 32-bit result differs on some, and the emulated guarded
    kernel still equals the reference (the redo per tile on wgmma's one-row-pair warp tiles,
    per column on mma.sync's taller ones); with the guard broken (a band of 0: never redone)
    it does not."""
    from lowbit.kernels.cuda.cu_source import cu_file

    _needs_compiler()
    family = BY_NAME[name]
    cfg = family.default_config(wl, SM90)
    x, w, params = _near_step_inputs(wl, seed=3)
    assert _columns(wl, params) is not None
    near, differ = _near_counts(wl, x, w, params)
    outputs = wl.gemm_shape[0] * wl.gemm_shape[1]
    assert near >= outputs // 20 and differ >= 50, (near, differ)
    want = run_outputs(wl, x, w, params)
    got = bitserial_emu.emulate_outputs(family, wl, cfg, x, w, params)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    text = cu_file("bitserial_block_end.cu")
    edit = ("redo |= (z & c.w & ~31u) == 0u;", "redo |= false;")  # never redone
    assert text.count(edit[0]) == 1
    broken = bitserial_emu.emulate_outputs(family, wl, cfg, x, w, params,
                                           supplied={"bitserial_block_end.cu":
                                                     text.replace(*edit)})
    assert any(not torch.equal(a, b) for a, b in zip(broken, want, strict=True))


def test_guarded_form_is_exact_off_its_band():
    """`guarded_form` on random columns (31-bit multipliers, residual multipliers up to 2^38
    either sign, shifts 33..60) and on columns at rounding steps (`_near_step_inputs`'
    multipliers): for every accumulator and residual value in the bounds, the 32-bit sum's
    output is the exact one wherever its remainder lies >= E from a step; outputs differ
    inside the band at the steps (the guard is needed), few random ones lie in it; and a
    column whose 32-bit sum cannot fit has no form."""
    from lowbit.kernels.cuda.bitserial_tables import guarded_form

    gen = torch.Generator().manual_seed(7)
    top_acc, top_res = 300, 128
    y = torch.arange(-top_acc, top_acc + 1).view(-1, 1)
    u = torch.arange(-top_res, top_res).view(1, -1)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=gen))

    counts = {"random": [0, 0, 0], "step": [0, 0, 0]}  # columns, outputs in the band, wrong
    for i in range(60):
        kind = "random" if i % 2 else "step"
        if kind == "random":
            s = draw(33, 61)
            m = draw(2**30, 2**31) >> max(0, 40 - s)
            r = draw(-(2**38), 2**38) >> max(0, 62 - s)
            b = draw(-(2**40), 2**40) >> max(0, 62 - s)
        else:
            s, m, r = 32, 2**30 + draw(-127, 128), 2**29 + draw(-127, 128)
            b = -(2**31) + draw(-127, 128)
        form = guarded_form(m, b, r, s, top_acc, top_res)
        if form is None:
            continue
        m2, b2, r2, s2, e = form
        z32 = y * m2 + u * r2 + b2 + (1 << (s2 - 1))
        assert int(z32.abs().max()) + e < 2**31
        z64 = y * m + u * r + b + (1 << (s - 1))
        rem = z32 & ((1 << s2) - 1)
        near = (rem < e) | (rem >= (1 << s2) - e)
        wrong = (z32 >> s2) != (z64 >> s)
        assert not bool((wrong & ~near).any()), (m, b, r, s)
        c = counts[kind]
        c[0], c[1], c[2] = c[0] + 1, c[1] + int(near.sum()), c[2] + int(wrong.sum())
    grid = y.numel() * u.numel()
    assert counts["random"][0] >= 25 and counts["random"][1] < 1e-3 * counts["random"][0] * grid
    assert counts["step"][0] == 30 and counts["step"][2] >= 1000, counts
    assert guarded_form(2**30, 0, 0, 2, top_acc, top_res) is None  # 2^28 steps per unit


@pytest.mark.parametrize("name,arch,wl", [pytest.param(n, a, _guarded(w), id=f"{n}-{i}")
                                          for n, a, i, w in COMPILE64_CASES])
def test_guarded_block_end_compiles_without_spills(name, arch, wl):
    """NVRTC builds the guarded block end (the sum64 cases) for sm_80 and sm_90a with no
    register spill, the 64-bit redo behind branches (one per n8 tile or column: the 32-bit
    path runs no predicated 64-bit code) and the default config of the other forms."""
    from lowbit.kernels.cuda.nvrtc import compile_cubin
    from lowbit.kernels.cuda.sass import kernel_instructions, nvdisasm_path, opcodes

    family = BY_NAME[name]
    plain = wl.replace(epilogue=replace(wl.epilogue, guarded=False))
    cfg = _builds_without_spills(name, arch, wl, plain.epilogue)
    if nvdisasm_path() is None:
        return
    ins = {w: kernel_instructions(compile_cubin(family.render(w, cfg), arch))[
        family.kernel_name(cfg)] for w in (wl, plain)}
    ops = {w: opcodes(i) for w, i in ins.items()}
    wide = "IMAD.WIDE.U32" if wl.epilogue.residual is not None else "IMAD.WIDE"
    assert ops[wl].count(wide) >= 2  # the redo's wide multiply-adds
    assert ops[wl].count("BRA") >= ops[plain].count("BRA") + 16
    predicated = [i for i in ins[wl] if i.startswith("@") and wide in i]
    assert len(predicated) <= ops[wl].count(wide) // 4, predicated[:4]


@pytest.mark.gpu
@pytest.mark.parametrize("wl", [_guarded(_sum64(c[1])) for c in GPU_CASES] + [
    _guarded(conv(B1, U2, block_end64(S8, None, False, ()), N=5, H=14, W=14, C=256, K=512))],
    ids=[c[0] for c in GPU_CASES] + ["shortcut_s8"])
def test_gpu_guarded_block_end_every_family(wl):
    """The guarded block end (Epilogue.guarded) on random sum64 params, the default kernel of
    every family that runs it on this GPU, bit for bit (cuda.int8_wgmma's int8 accumulators
    leave no guarded form: the plan keeps sum64 there)."""
    assert _gpu_every_family(wl, seed=21) >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("name,wl", [c[1:] for c in NEAR_CASES], ids=[c[0] for c in NEAR_CASES])
def test_gpu_guarded_block_end_at_rounding_steps(name, wl):
    """The near-step inputs (`_near_step_inputs`: many sums redone in 64 bits) through bind /
    launch on the GPU, bit for bit."""
    family = BY_NAME[name]
    x, w, params = _near_step_inputs(wl, seed=3)
    assert _near_counts(wl, x, w, params)[1] >= 50
    params = EpilogueParams(**{**params.__dict__, "derived_out": tuple(
        torch.full_like(b, 0x5A) for b in params.derived_out)}).to("cuda")
    out = family.build(wl, family.default_config(wl)).bind(x.cuda(), w.cuda(), params)()
    got = ([out] if wl.epilogue.store_out else []) + list(params.derived_out)
    want = run_outputs(wl, x, w, params.to("cpu"))
    assert all(torch.equal(g.cpu(), w_) for g, w_ in zip(got, want, strict=True))
