"""CUDA source of a bit-serial kernel: constexpr parameters, then its family's .cu entry file
with the package's .cu includes expanded.

Every family has an entry file (`bitserial_mma_sync.cu`, ...) that `#include`s the shared device
code (`bitserial_params.cu`, `bitserial_epilogue.cu`, ...). `expand` resolves those includes
from the package's .cu files, once each, in place; a caller may supply some files itself:
the rendered wgmma instruction wrappers (`WGMMA_OPS`, made by `wgmma_source`), or the host
emulation's stand-ins for the device primitives (`bitserial_emu.py`). Probes cut parts of a
kernel through named cut points (`CUTS`, `LOWBIT_CUT_*` in the .cu files), never by editing
its text.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from ...core import Encoding, Epilogue, Layout, Workload
from ...core.epilogue import MAX_DERIVED
from ...reference.bitserial import plane_coefficients
from .bitserial_layout import (
    ONES_ROWS,
    block_rows,
    halo_bytes,
    pixel_tiles,
    rowsum_cols,
    rowsum_slab,
    rowsum_table,
    slab_buffers,
    slice_sum_words,
    tap_shift,
    threshold_slots,
    uses_thresholds,
)
from .bitserial_shape import (
    conv_shape,
    copy_vec,
    int8_operands,
    needs_wtap,
    out_mode,
    pair_range,
    planes,
    rect_slots,
    s8_atype,
    threshold_stride,
    wsum_columns,
    wsum_start,
    xpop_lanes,
)
from .cu_source import expand
from .tap_shift import render_tables, shift_plan

#: the generated file of wgmma instruction wrappers that bitserial_wgmma_common.cu includes
WGMMA_OPS = "bitserial_wgmma_ops.cu"
#: named cut points of the kernels (`render(..., cuts=...)`): with a cut on, that part runs
#: only behind a branch the GPU never takes, so its code stays but its work is gone (the
#: output is garbage: for timing where a kernel's time goes, benchmarks/probes/cut_probe.py)
CUTS = {"mma": "every stage's MMAs", "epilogue": "the fused epilogue",
        "loads": "the operand copies of every stage after the first STAGES - 1"}
def _asm_operands(names: list[str]) -> tuple[str, str]:
    regs = ", ".join(f"%{i}" for i in range(len(names)))
    return regs, ", ".join(f'"+r"({n})' for n in names)


def wgmma_source(w_bits: int, wn: int, s8_type: str | None = None,
                 ones_cols: bool = False) -> str:
    """wgmma_planes (one activation plane x all w_bits weight planes of WN columns: m64nNk256,
    N = w_bits * WN) and wgmma_rowsum (m64n8k256 against ones) as inline PTX. Register d[k] of
    the s32 m64nN fragment is row g (+8 for k % 4 >= 2), column 8 (k / 4) + 2 t4 + k % 2: the
    mma.sync m16n8 layout per n8 tile, so acc[i][j][0][ni][e] is register (j * NT + ni) * 4 + e.
    s8_type ("s8" / "u8"): the int8 mode, m64nNk32 .s32.<s8_type>.s8 on a 32-byte k slab.
    `accumulate` is the instruction's scale-d: 0 writes d = a * b, ignoring d's old values (a
    tile's first k step; no zeroed accumulators: ptxas 13.0 miscompiled those, reusing a
    register the previous wgmma had written as a zero source). ones_cols (ROWSUM="cols"):
    also wgmma_planes_ones, m64n(N+16)k256 whose last 16 B rows are the ones and zeros after
    the weights: rs[0][0..3] the row popcounts' registers, rs[0][4..7] the zero columns'. (A
    generator, not a .cu file: the operand lists depend on N.)"""
    n = w_bits * wn
    regs_of = [f"d[{j}][0][{ni}][{e}]" for j in range(w_bits) for ni in range(wn // 8)
               for e in range(4)]
    if s8_type:
        main = f"m64n{n}k32.s32.{s8_type}.s8"
    else:
        main = f"m64n{n}k256.s32.b1.b1.and.popc"
    out = []
    wrappers = [("wgmma_planes", main, regs_of, "int (&d)[P_BITS][MT][NT][4]"),
                ("wgmma_rowsum", "m64n8k256.s32.b1.b1.and.popc",
                 [f"d[0][{e}]" for e in range(4)], "int (&d)[MT][RS_REGS]")]
    if ones_cols:
        wrappers.append(("wgmma_planes_ones", f"m64n{n + ONES_ROWS}k256.s32.b1.b1.and.popc",
                         regs_of + [f"rs[0][{e}]" for e in range(8)],
                         "int (&d)[P_BITS][MT][NT][4], int (&rs)[MT][RS_REGS]"))
    for fn, op, names, arr in wrappers:
        regs, ops = _asm_operands(names)
        k = len(names)
        out.append(
            f"__device__ __forceinline__ void {fn}({arr}, u64 da, u64 db, int accumulate) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.{op} "\n'
            f'      "{{{regs}}}, %{k}, %{k + 1}, p;\\n}}\\n"\n'
            f'      : {ops}\n      : "l"(da), "l"(db), "r"(accumulate));\n}}\n')
    if not ones_cols:  # named in a discarded `if constexpr` branch of the tap-shift kernel
        out.append("__device__ void wgmma_planes_ones(int (&d)[P_BITS][MT][NT][4], "
                   "int (&rs)[MT][RS_REGS], u64 da, u64 db, int accumulate);\n")
    return "".join(out)


#: HAS_BIAS of Epilogue.shifted_bias (bitserial_epilogue.cu: int64 bias added after the multiply)
SHIFTED_BIAS = 2
#: HAS_BIAS of the shifted bias with Epilogue.residual in int32 / int16 storage
RESIDUAL_I32, RESIDUAL_I16 = 3, 4
#: HAS_BIAS of Epilogue.requant32 (bitserial_block_end.cu: int32 vectors, a narrow residual,
#: derived outputs)
REQUANT32 = 5
#: the block-end output modes (bitserial_block_end.cu's D<j>_MODE): none, bytes, bit planes
DERIVED_MODES = {None: 0, Layout.INT8: 2, Layout.BITPLANE: 3}


def has_bias(epi: Epilogue) -> int:
    """bitserial_epilogue.cu's HAS_BIAS of the epilogue: 0 none, 1 accumulator units,
    SHIFTED_BIAS, RESIDUAL_I32 / RESIDUAL_I16 (the shifted bias and a wide residual), or
    REQUANT32 (the 32-bit block-end path)."""
    if epi.requant32:
        return REQUANT32
    if epi.residual is not None:
        return RESIDUAL_I16 if epi.residual.storage_dtype == torch.int16 else RESIDUAL_I32
    return SHIFTED_BIAS if epi.shifted_bias else int(epi.bias)


def block_end_params(epi: Epilogue) -> dict[str, int]:
    """The block-end epilogue's constexpr parameters (bitserial_block_end.cu): RES_BYTES (0
    none, 1 a u<=8 residual, 2 a signed one), SUM64 (Epilogue.sum64: the 64-bit sum),
    GUARDED (Epilogue.guarded: the 32-bit sum, the 64-bit one near rounding steps),
    STORE_OUT, N_DERIVED and per derived output j
    D<j>_MODE (DERIVED_MODES), D<j>_BITS, D<j>_QMIN, D<j>_LEVELS (zeros where absent).
    Rendered for block-end kernels only: each namespace-scope constant takes a slot in
    constant bank 4, and eleven more moved the address a tap-shift kernel reads there."""
    res = epi.narrow_residual
    out = {"RES_BYTES": 0 if res is None else 1 if res.encoding is Encoding.UNSIGNED else 2,
           "SUM64": int(epi.sum64), "GUARDED": int(epi.guarded), "STORE_OUT": int(epi.store_out),
           "N_DERIVED": len(epi.derived)}
    for j in range(MAX_DERIVED):
        prec, layout = epi.derived[j] if j < len(epi.derived) else (None, None)
        out.update({f"D{j}_MODE": DERIVED_MODES[layout], f"D{j}_BITS": prec.bits if prec else 1,
                    f"D{j}_QMIN": prec.qmin if prec else 0,
                    f"D{j}_LEVELS": prec.qmax - prec.qmin if prec else 0})
    return out


def pair_params(wl: Workload, spec: Mapping) -> dict[str, int]:
    """PAIR_YLO, PAIR_YHI, PAIR_DOT_LO of `pair_range` (zeros without THR_PAIRS)."""
    r = pair_range(wl) if spec["THR_PAIRS"] else None
    return {"PAIR_YLO": r.base if r else 0, "PAIR_YHI": r.hi if r else 0,
            "PAIR_DOT_LO": r.dot_lo if r else 0}


def constexpr_params(wl: Workload, spec: Mapping, chained: int = 0) -> dict[str, int]:
    """The constexpr int parameters of the kernel of (wl, spec): the workload's shape,
    encodings and epilogue, every integer kernel parameter of the spec under its own name
    (BM, BN, ..., STAGES, ROW_TABLE, ...), and what is derived from the others (WGMMA from
    MMA, ROWSUM_* from ROWSUM, OUT_THRESH from REQUANT, ...)."""
    sh = conv_shape(wl)
    elem8 = int8_operands(wl)
    if elem8:  # one plane of bytes, products summed by the s8 tensor cores: coefficients 1
        aa, ba, ab, bb = 1, 0, 1, 0
    else:
        aa, ba, _ = plane_coefficients(wl.a)
        ab, bb, _ = plane_coefficients(wl.w)
    q, p = planes(wl)
    epi = wl.epilogue
    out = epi.out if epi.requantizes else None
    thresholds = uses_thresholds(spec)
    tiles_y, tiles_x = pixel_tiles(wl, spec)
    return {
        "Q_BITS": q, "P_BITS": p, "ELEM8": int(elem8),
        "A_SIGNED": int(wl.a.encoding is Encoding.SIGNED and not elem8),
        "W_SIGNED": int(wl.w.encoding is Encoding.SIGNED and not elem8),
        "A_ALPHA": aa, "A_BETA": ba, "W_ALPHA": ab, "W_BETA": bb,
        "NB": sh.nb, "H": sh.h, "W": sh.w, "C": sh.c, "CW": sh.words, "KOUT": sh.kout,
        "R": sh.r, "S": sh.s, "STRIDE": sh.stride, "PAD": sh.pad, "P_OUT": sh.p, "Q_OUT": sh.q,
        **{name: int(value) for name, value in spec.items() if isinstance(value, int)},
        "WGMMA": int(spec["MMA"] == "wgmma"), "ROWSUM_TABLE": int(rowsum_table(spec)),
        "ROWSUM_SLAB": int(rowsum_slab(spec)), "ROWSUM_COLS": int(rowsum_cols(spec)),
        "SLICE_SUM_WORDS": slice_sum_words(wl, spec),
        "HALO_WORDS": halo_bytes(wl, spec) // 4 // q,
        "TILES_Y": tiles_y, "TILES_X": tiles_x,
        "VEC": copy_vec(sh), "XPOP_LANES": xpop_lanes(sh), "KPAD": wsum_columns(sh),
        "WSUM0": wsum_start(sh),
        "HAS_BIAS": has_bias(epi),
        "RELU": int(epi.relu), "OUT_MODE": out_mode(wl),
        "OUT_THRESH": int(thresholds),
        "OUT_BITS": out.bits if out else 1, "OUT_QMIN": out.qmin if out else 0,
        "OUT_QMAX": out.qmax if out else 0,
        "THR_STRIDE": threshold_stride(wl) if thresholds else 1,
        "THR_SLOTS": threshold_slots(wl, spec),
        "CHAINED": int(chained),
        **pair_params(wl, spec), **(block_end_params(epi) if epi.requant32 else {}),
    }


def render(wl: Workload, spec: Mapping, entry: str, chained: int = 0,
           cuts: Collection[str] = (), supplied: Mapping[str, str] | None = None) -> str:
    """CUDA source of the kernels of (wl, spec): constexpr parameters, then `entry` (a family's
    .cu entry file) expanded. chained = 1 or 2 renders them for launch as programmatic
    dependents of the previous kernel on the stream, letting the next kernel launch at their
    start (1) or once their MMAs are issued (2) (`bitserial_kernel.CHAIN_TRIGGERS`). `cuts`:
    names of `CUTS` to take out (probes only). `supplied`: files that replace the package's
    (the host emulation's primitives); the wgmma wrappers are rendered unless supplied."""
    unknown = set(cuts) - set(CUTS)
    if unknown:
        raise ValueError(f"cuts must be among {sorted(CUTS)}, got {sorted(unknown)}")
    sh = conv_shape(wl)
    params = constexpr_params(wl, spec, chained)
    lines = [f"// lowbit bit-serial kernel for {wl.key}",
             f"// parameters {dict(sorted(spec.items()))}"]
    lines += [f"#define LOWBIT_CUT_{c.upper()} 1" for c in sorted(cuts)]
    lines += [f"constexpr int {k} = {int(v)};" for k, v in params.items()]
    lines.append(f"constexpr long long M_ROWS = {sh.rows}ll;")
    tma = spec["TMA_HALO"]  # the tensor map parameter, and what the kernel passes on of it
    lines.append("#define BITSERIAL_XMAP_PARAM" + (", const __grid_constant__ TensorMap xmap"
                                                   if tma else ""))
    lines.append(f"#define BITSERIAL_XMAP {'&xmap' if tma else 'nullptr'}")
    block_end = wl.epilogue.requant32  # the BlockEndArgs parameter, and the epilogue's copy
    lines.append("#define BITSERIAL_BLOCK_END_PARAM" + (", BlockEndArgs block_end"
                                                        if block_end else ""))
    lines.append(f"#define BITSERIAL_BLOCK_END{', block_end' if block_end else ''}")
    lines.append(f"#define LOWBIT_BLOCK_END {int(block_end)}")
    slots = rect_slots(sh) if params["THR_SLOTS"] and needs_wtap(wl) else [0]
    lines.append(f"__device__ constexpr int RECT_OF_SLOT[] = {{{', '.join(map(str, slots))}}};")
    if tap_shift(spec):
        lines.append(render_tables(shift_plan(sh, spec["BM"])))
        lines.append(f"constexpr int SLAB_BUFFERS = {slab_buffers(spec)};")
    else:  # out_row's virtual grid: the output itself, or A_IN_HALO's pixel tiles
        lines.append("constexpr int VQ = 1, VP = 1;\n"
                     f"constexpr long long V_ROWS = {block_rows(wl, spec)}ll;")
    files = dict(supplied or {})
    if spec["MMA"] == "wgmma" and WGMMA_OPS not in files:
        files[WGMMA_OPS] = wgmma_source(
            planes(wl)[1], spec["WN"], s8_atype(wl) if int8_operands(wl) else None,
            rowsum_cols(spec))
    text = expand(entry, files)
    for c in cuts:
        if f"LOWBIT_CUT_{c.upper()}" not in text:
            raise ValueError(f"{entry} has no cut point {c!r}")
    return "\n".join(lines) + "\n" + text
