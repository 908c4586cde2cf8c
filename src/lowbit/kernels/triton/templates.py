"""Triton implicit-GEMM templates: int8 conv2d, int8 GEMM, and conv2d on fp16 tensor cores.

All three drive the one kernel in `igemm.py`. Knobs (`IGEMM_KNOBS`: compile-time constexprs;
shapes stay run-time arguments, so one compiled kernel serves every layer of the same filter
size): BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, GROUP_M, LOOP_ORDER (convs),
SPLIT_K and SPLIT_SUM (where the tile grid under-fills the GPU).

Exactness: the int8 path accumulates in int32 and the fp16 path in fp32; a template refuses a
workload whose worst-case |accumulator| could leave that exact range (2^31 resp. 2^24), so
integer outputs always equal `lowbit.reference.run` bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch

from ...core import (
    OUT_FP16,
    OUT_INT16,
    Config,
    ConfigSpace,
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Workload,
)
from ...core.epilogue import bias_vector, check_shifted_bias
from ...core.hardware import TARGET
from ...core.knobs import KnobDef, KnobTable
from ...core.precision import Encoding, Precision
from ...core.validate import (
    check_inputs,
    epilogue_vector_dtypes,
    out_storage,
    output_buffer,
    storage_dtype,
)
from ..base import EXACT_INT32, KernelTemplate, acc_bound, grouped_reason, pow2_ceil
from ..geometry import Geometry, conv_taps
from .epilogue import (
    BIAS_SHIFTED,
    BIAS_SHIFTED_FLOAT64,
    BIAS_SHIFTED_INT32,
    ENC_CODE,
    LAYOUT_CODE,
    OUT_KIND_FLOAT,
    OUT_KIND_FP16,
    OUT_KIND_INT32,
    OUT_KIND_REQUANT,
    SRC_FLOAT,
    SRC_INT8,
    SRC_PACKED,
    exact_requant,
)
from .igemm import (
    Launch,
    Problem,
    launch,
    launches,
    output_tiles,
    reduction_steps,
    replay,
    split_workspace,
)
from .padded import pad_operands, padded_k
from .zero_point import act_zero_point, bound_terms

#: outputs of a layer's epilogue the implicit-GEMM int8 kernels write themselves
#: (`conv_outputs`: a block end's next input and its wide residual copy)
LAYER_OUTPUTS_MAX = 2
#: shared memory a program may stage: the GPU's per-block opt-in less 7 KiB of headroom for the
#: epilogue
SMEM_LIMIT = TARGET.smem_per_block - 7 * 1024
#: int32 / fp32 accumulator registers per thread above which Triton spills
ACC_REGS_LIMIT = 128
#: accumulators a thread above which a requantizing epilogue in 64-bit arithmetic (float64 or
#: int64: two more registers a value) spills. Offline ptxas, sm_90, Triton 3.9, the float64
#: form: 128 a thread (128 x 128 on 4 warps) 255 registers and 24-1,728 B of spill; 64 a
#: thread (128 x 64 on 4 warps, 128 x 128 on 8) 88-250 registers, no spill
WIDE_REQUANT_ACC_REGS = 64
#: the most reduction steps a tile may take for the default to split it over 8 warps against
#: that spill. H100, network-20261207-113835.json against -085740: MobileNet-V2 b64 w8a8's
#: expansion convs (1-2 steps, 1,280-1,728 B of spill) 2x faster on 8 warps (400 -> 215 us on
#: 16 -> 96 channels at 112 x 112); ResNet-50 b256 w8a8's 128 x 128 layers of 4-36 steps
#: (24-380 B) 1.1-1.4x slower (layer2_0_conv1 290 -> 396 us): the main loop wants 4 warps
SHORT_REDUCTION_STEPS = 2
EXACT_FP32 = 2**24
#: reduction chunk sizes of the implicit-GEMM template (knob BLOCK_K)
BLOCK_K_VALUES = (32, 64, 128)


def _is_conv(wl: Workload) -> bool:
    return isinstance(wl, ConvWorkload)


def wide_requant(wl: Workload) -> bool:
    """Whether the epilogue may requantize in 64-bit arithmetic: a shifted bias into a
    narrow integer output, whose int32 form (`epilogue.int32_requant`) needs every partial
    sum below 2^31 and is chosen only at bind time, from the multipliers."""
    return wl.epilogue.shifted_bias and isinstance(wl.epilogue.out, Precision)


def default_warps(wl: Workload, rows: int, cols: int, steps: int) -> int:
    """4 warps, or 8 for a rows x cols tile whose 64-bit requantization would spill on 4
    (more than WIDE_REQUANT_ACC_REGS accumulators a thread) where the epilogue is most of the
    work (at most SHORT_REDUCTION_STEPS reduction steps) and 8 can split the rows (two m64
    warpgroups)."""
    spills = wide_requant(wl) and rows * cols // (32 * 4) > WIDE_REQUANT_ACC_REGS
    return 8 if spills and steps <= SHORT_REDUCTION_STEPS and rows >= 128 else 4


def reduction_iters(wl: Workload, block_k: int, row_taps: bool = False) -> int:
    """Reduction steps of BLOCK_K: per tap and channel chunk, or (row_taps) per kernel row
    and chunk of its S*C values."""
    if isinstance(wl, ConvWorkload):
        return reduction_steps(wl.R, wl.S, wl.C, block_k, row_taps)
    return reduction_steps(1, 1, wl.K, block_k)


def _row_taps_allowed(wl: Workload) -> bool:
    """LOOP_ORDER "r_sc": a conv with S > 1 whose operand rows hold exactly C values (one per
    element, not packed) and C below the largest BLOCK_K."""
    return (isinstance(wl, ConvWorkload) and wl.S > 1 and wl.C < max(BLOCK_K_VALUES)
            and wl.a_layout is Layout.INT8 and wl.w_layout is Layout.INT8)


def loop_orders(wl: Workload) -> tuple[str, ...]:
    """LOOP_ORDER's values on a conv: "crs" where it has several taps, "r_sc" where its rows
    allow it (`_row_taps_allowed`)."""
    orders = ("rsc", "crs") if wl.R * wl.S > 1 else ("rsc",)
    return (*orders, "r_sc") if _row_taps_allowed(wl) else orders


def split_values(wl: Workload) -> tuple[int, ...]:
    """SPLIT_K's values: split-K helps only when even 64 x 64 tiles leave SMs idle and the
    reduction is long; skinny GEMMs (FC layers, M <= 128) stream the weights, and deeper
    splits put enough blocks in flight to reach the memory bandwidth."""
    m, n, _ = wl.gemm_shape
    if math.ceil(m / 64) * math.ceil(n / 64) < TARGET.sms and reduction_iters(wl, 64) >= 8:
        return (1, 2, 4, 8) if isinstance(wl, GemmWorkload) else (1, 4)
    return (1,)


def split_k_possible(wl: Workload) -> bool:
    return len(split_values(wl)) > 1


IGEMM_KNOBS = KnobTable(
    KnobDef("BLOCK_M", (64, 128, 256), "output pixels (GEMM rows) per tile"),
    KnobDef("BLOCK_N", (32, 64, 128, 256), "filters (GEMM columns) per tile"),
    KnobDef("BLOCK_K", BLOCK_K_VALUES, "reduction (r, s, c) elements per step"),
    KnobDef("num_warps", (4, 8), "warps per program"),
    KnobDef("num_stages", (2, 3, 4), "software-pipeline depth"),
    KnobDef("GROUP_M", (1, 8), "row tiles per group of the swizzled tile order (L2 "
            "reuse)"),
    KnobDef("LOOP_ORDER", ("rsc", "crs", "r_sc"), "'rsc': filter tap outer, channel chunk "
            "inner; 'crs': channel chunk outer; 'r_sc': per kernel row, chunks of its S*C "
            "values (few channels)", choices=loop_orders, present=_is_conv),
    KnobDef("SPLIT_K", (1, 2, 4, 8), "reduction split over programs (int32 / fp32 partial "
            "sums), only where the tile grid under-fills the GPU", choices=split_values),
    KnobDef("SPLIT_SUM", ("second_kernel", "last_program"), "with SPLIT_K > 1: "
            "'second_kernel' sums the partials in a second launch, 'last_program' in the "
            "last program of each tile to finish", present=split_k_possible),
)


def split_k_reason(tiles: int, steps: int, split: int, waves: int) -> str | None:
    """Why SPLIT_K = `split` > 1 is ruled out for a grid of `tiles` output tiles and `steps`
    reduction steps: the split grid must stay within `waves` waves of the GPU and leave each
    split at least 4 steps; None when it is allowed."""
    if tiles * split > waves * TARGET.sms:
        return "SPLIT_K > 1 only while the tile grid under-fills the GPU"
    if steps < 4 * split:
        return "SPLIT_K leaves fewer than 4 reduction steps per split"
    return None


def int8_refusal(wl: Workload, residual_writer: str = "the bit-serial templates' epilogue"
                 ) -> str | None:
    """What keeps `wl` off every Triton int8 template (None: nothing): a residual term in the
    epilogue (written by `residual_writer`), an int16 output or bit-plane operands (the
    bit-serial templates')."""
    if wl.epilogue.residual is not None:
        return (f"a residual term in the epilogue (Epilogue.residual) is written by "
                f"{residual_writer}, not this one")
    if wl.epilogue.out == OUT_INT16:
        return "int16 output is written by the bit-serial templates: use int32"
    for name, layout in (("a_layout", wl.a_layout), ("w_layout", wl.w_layout)):
        if layout is Layout.BITPLANE:
            return f"{name} 'bitplane' operands are served by the bit-serial templates"
    return None


def u8_weights_reason(wl: Workload, alternatives: str = "s8 or <= 7 bits") -> str | None:
    """Why u8 weights cannot run on the int8 tensor cores (u8 activations take a zero point)."""
    if wl.w.encoding is Encoding.UNSIGNED and wl.w.bits == 8:
        return (f"w={wl.w} values exceed the int8 range of the int8 tensor cores (use "
                f"{alternatives})")
    return None


def interpreting() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _operand(prec: Precision, layout: Layout) -> tuple[int, int, int]:
    src = SRC_PACKED if layout is Layout.PACKED else SRC_INT8
    return src, prec.bits, ENC_CODE[prec.encoding]


def _storage_width(channels: int, prec: Precision, layout: Layout) -> int:
    return -(-channels * prec.bits // 8) if layout is Layout.PACKED else channels


def problem(wl: Workload, dot_fp16: bool) -> Problem:
    """The kernel's view of a workload (strides in storage elements)."""
    m, nout, _ = wl.gemm_shape
    epi = wl.epilogue
    if epi.requantizes:
        kind, prec = OUT_KIND_REQUANT, epi.out
        lo = max(prec.qmin, 0) if epi.shifted_bias and epi.relu else prec.qmin
        out = (kind, LAYOUT_CODE[epi.out_layout], prec.bits, lo, prec.qmax)
        if epi.out_layout is Layout.BITPLANE:
            out_row = -(-nout // 32)
            out_plane = m * out_row
        else:
            out_row, out_plane = _storage_width(nout, prec, epi.out_layout), 0
    else:
        kind = OUT_KIND_FP16 if epi.out == OUT_FP16 else OUT_KIND_INT32
        out, out_row, out_plane = (kind, 0, 32, 0, 0), nout, 0
    conv = isinstance(wl, ConvWorkload)
    chans = wl.C if conv else wl.K
    if conv and not (wl.R == wl.S == 1 and wl.stride == 1 and wl.pad == 0):
        shape = dict(H=wl.H, W=wl.W, C=wl.C, P=wl.P, Q=wl.Q, stride=wl.stride, pad=wl.pad,
                     R=wl.R, S=wl.S, is_gemm=False)
    else:  # a GEMM, or a 1x1 stride-1 unpadded conv on NHWC: the GEMM [N*H*W, C] x [C, K]
        # (no per-row division into image, row and column, no padding masks)
        shape = dict(H=1, W=1, C=chans, P=1, Q=1, stride=1, pad=0, R=1, S=1, is_gemm=True)
    return Problem(
        M=m, NOUT=nout, **shape,
        x_row=_storage_width(chans, wl.a, wl.a_layout),
        w_row=_storage_width(chans, wl.w, wl.w_layout),
        out_row=out_row, out_plane=out_plane,
        a_operand=_operand(wl.a, wl.a_layout), w_operand=_operand(wl.w, wl.w_layout),
        dot_fp16=dot_fp16, bias=BIAS_SHIFTED if epi.shifted_bias else epi.bias, relu=epi.relu,
        out=out, a_zero=0 if dot_fp16 or wl.a_layout is not Layout.INT8 else act_zero_point(wl.a))


def _check_device(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"x must be on a CUDA device for Triton kernels, got {x.device} "
                         "(set TRITON_INTERPRET=1 to run them on the CPU)")


#: (bias and multiplier dtype, shift dtype) of the shifted-bias forms bind may pick
REQUANT_DTYPES = {BIAS_SHIFTED_FLOAT64: (torch.float64, torch.int32),
                  BIAS_SHIFTED_INT32: (torch.int32, torch.int32)}


def placeholder_vectors(epi: Epilogue, device: torch.device | str) -> tuple:
    """(bias, scale, multiplier, shift) with the dtypes a real call passes and None where the
    epilogue takes none, so an ahead-of-time compile specializes exactly like the launch
    (a float32 stand-in where the launch passes `out` is a different binary: a cache miss)."""
    need = dict(epilogue_vector_dtypes(epi))
    if epi.shifted_bias:
        need["bias"] = torch.int64
    return tuple(None if need[n] is None else torch.empty(16, dtype=need[n], device=device)
                 for n in ("bias", "scale", "multiplier", "shift"))


def placeholder_requant(wl: Workload, prob: Problem, requant: int | None,
                        device: torch.device | str) -> tuple[Problem, tuple]:
    """(prob, placeholder vectors) for an ahead-of-time compile of `wl`'s epilogue in the
    shifted-bias form `requant` (HAS_BIAS BIAS_SHIFTED_FLOAT64 or BIAS_SHIFTED_INT32, which
    bind picks from the multipliers: `with_float64_requant`); None: as built (int64)."""
    vecs = placeholder_vectors(wl.epilogue, device)
    if requant is None:
        return prob, vecs
    if not wl.epilogue.shifted_bias or requant not in REQUANT_DTYPES:
        raise ValueError(f"requant must be one of {sorted(REQUANT_DTYPES)} for a shifted-bias "
                         f"epilogue, got {requant!r} for {wl.epilogue}")
    dtype, shift_dtype = REQUANT_DTYPES[requant]
    return dataclasses.replace(prob, bias=requant), (
        torch.empty(16, dtype=dtype, device=device), vecs[1],
        torch.empty(16, dtype=dtype, device=device),
        torch.empty(16, dtype=shift_dtype, device=device))


def with_float64_requant(wl: Workload, prob: Problem, params, vecs: tuple,
                         device: torch.device | str) -> tuple[Problem, tuple]:
    """(prob, vecs) with the shifted-bias requantization in int32 or float64
    (`exact_requant`: HAS_BIAS BIAS_SHIFTED_INT32 or BIAS_SHIFTED_FLOAT64 and their vectors)
    where that is exact for the workload's accumulators; unchanged otherwise. vecs: (bias,
    scale, multiplier, shift)."""
    if not wl.epilogue.shifted_bias:
        return prob, vecs
    exact = exact_requant(acc_bound(wl), params, device)
    if exact is None:
        return prob, vecs
    mode, (bias, mult, shift) = exact
    return dataclasses.replace(prob, bias=mode), (bias, vecs[1], mult, shift)


class IgemmKernel:
    """One compiled (workload, config): `kernel(x, w, params, out=None) -> out`.

    `out`, if given, must be a contiguous tensor of the output's storage shape and dtype
    (tests pass a poisoned buffer; benchmarks reuse one); otherwise a new one is allocated.
    """

    def __init__(self, template: str, workload: Workload, config: Config, prob: Problem):
        self.template = template
        self.workload = workload
        self.config = config
        self.problem = prob

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Validate once, return a no-argument launcher for these tensors (CUDA-graph capture
        and timing: `check_inputs` reads the epilogue vectors, a device sync on CUDA)."""
        check_inputs(self.workload, x, w, params)
        check_shifted_bias(self.workload.epilogue, params, self.problem.NOUT, x.device)
        _check_device(x)
        out = output_buffer(self.workload, x.device, out)
        prob = self.problem
        if self.workload.epilogue.bias and not prob.wide:
            top = int(params.bias.to(torch.int64).abs().max()) if params.bias.numel() else 0
            if acc_bound(self.workload) + top >= EXACT_INT32:
                prob = dataclasses.replace(prob, wide=True)
        vecs = (bias_vector(self.workload.epilogue, params), params.scale, params.multiplier,
                params.shift)
        prob, vecs = with_float64_requant(self.workload, prob, params, vecs, x.device)
        plan = self.plan(prob, x, w, out, vecs)  # arguments fixed once

        def launcher() -> torch.Tensor:
            replay(plan)
            return out

        return launcher

    def plan(self, prob: Problem, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             vecs: tuple) -> list[Launch]:
        """The launches of one validated call, every argument fixed, with the launcher's own
        scratch (`vecs`: bias, scale, multiplier, shift or None)."""
        cfg = self.config
        workspace = split_workspace(prob, cfg["SPLIT_K"], output_tiles(prob, cfg), x.device)
        terms = bound_terms(self.workload, w, x.device) if prob.a_zero else None
        copies: list[Launch] = []
        if padded_k(prob) is not None:  # rows under 8-byte aligned: 16-byte rows (padded.py)
            prob, x, w, copies = pad_operands(prob, x, w)
        return copies + launches(prob, cfg, x, w, out, *vecs, workspace, terms)

    def compile(self):
        """Compile ahead of time (fills Triton's on-disk cache) without launching; returns
        Triton's CompiledKernel (n_regs, n_spills, asm), None under the interpreter."""
        if interpreting() or not torch.cuda.is_available():
            return None
        return self.compile_on("cuda")

    def compile_on(self, device: torch.device | str, requant: int | None = None):
        """`compile()` on `device` with placeholder tensors typed as a real call types them.
        requant: the shifted-bias form bind picks from the multipliers (HAS_BIAS
        BIAS_SHIFTED_FLOAT64 or BIAS_SHIFTED_INT32, `with_float64_requant`); None: the
        int64 form."""
        wl = self.workload
        x = torch.empty(16, dtype=storage_dtype(wl.a, wl.a_layout), device=device)
        w = torch.empty(16, dtype=storage_dtype(wl.w, wl.w_layout), device=device)
        out = torch.empty(16, dtype=out_storage(wl)[1], device=device)
        prob, vecs = placeholder_requant(wl, self.problem, requant, device)
        return replay(self.plan(prob, x, w, out, vecs), compile_only=True)


class _IgemmTemplate(KernelTemplate):
    backend = "triton"
    #: runs Epilogue.shifted_bias (epilogue_store's HAS_BIAS = BIAS_SHIFTED)
    takes_shifted_bias: ClassVar[bool] = True
    added_knobs: ClassVar[Mapping[str, object]] = {"SPLIT_SUM": "second_kernel"}
    dot_fp16 = False
    workload_type: type = Workload

    # ---------------------------------------------------------------- support
    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, self.workload_type):
            return f"needs a {self.workload_type.__name__}, got {type(wl).__name__}"
        reason = grouped_reason(wl) or int8_refusal(wl)
        if reason:
            return reason
        if not self.dot_fp16 and (reason := u8_weights_reason(
                wl, "s8, <= 7 bits, or triton.conv2d_fp16")):
            return reason
        bound = acc_bound(wl)
        limit = EXACT_FP32 if self.dot_fp16 else EXACT_INT32
        if bound >= limit:
            acc = "fp32" if self.dot_fp16 else "int32"
            return (f"worst-case |accumulator| {bound} >= {limit}: the {acc} accumulator would "
                    "not be exact")
        return None

    # ---------------------------------------------------------------- space
    def _elem_bytes(self) -> int:
        return 2 if self.dot_fp16 else 1

    def _tiles(self, wl: Workload, cfg: Config) -> int:
        m, n, _ = wl.gemm_shape
        return math.ceil(m / cfg["BLOCK_M"]) * math.ceil(n / cfg["BLOCK_N"])

    #: the knobs (module doc)
    knobs: ClassVar[KnobTable] = IGEMM_KNOBS

    def constraints(self, wl: Workload) -> list:
        m, n, _ = wl.gemm_shape
        chans = wl.C if isinstance(wl, ConvWorkload) else wl.K
        elem = self._elem_bytes()

        def smem(c: Config) -> str | None:
            need = c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * elem
            return f"shared memory {need} B > {SMEM_LIMIT} B" if need > SMEM_LIMIT else None

        def registers(c: Config) -> str | None:
            per_thread = c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"])
            if per_thread > ACC_REGS_LIMIT:
                return f"{per_thread} accumulator registers per thread > {ACC_REGS_LIMIT}"
            return None

        def warpgroups(c: Config) -> str | None:
            # wgmma: each warpgroup (4 warps) owns >= 64 rows; 8 warps split BLOCK_M in two
            if c["num_warps"] == 8 and c["BLOCK_M"] < 128:
                return "num_warps=8 needs BLOCK_M >= 128 (two m64 warpgroups)"
            return None

        def fits(c: Config) -> str | None:
            if c["BLOCK_M"] > max(64, pow2_ceil(m)):
                return f"BLOCK_M={c['BLOCK_M']} exceeds M={m} rounded up"
            if c["BLOCK_N"] > max(32, pow2_ceil(n)):
                return f"BLOCK_N={c['BLOCK_N']} exceeds N={n} rounded up"
            if c["BLOCK_N"] == 32 and n > 64:
                return "BLOCK_N=32 only for N <= 64 (narrower tiles re-read the im2col operand)"
            row_taps = c.get("LOOP_ORDER") == "r_sc"
            if row_taps and c["BLOCK_K"] <= wl.C:
                return "LOOP_ORDER='r_sc' needs C < BLOCK_K (wider channels fill their chunks)"
            reduce = wl.S * wl.C if row_taps else chans
            if c["BLOCK_K"] > max(32, pow2_ceil(reduce)):
                return f"BLOCK_K={c['BLOCK_K']} exceeds C={reduce} rounded up"
            return None

        def split(c: Config) -> str | None:
            if c["SPLIT_K"] == 1:
                if c.get("SPLIT_SUM", "second_kernel") != "second_kernel":
                    return "SPLIT_SUM applies to SPLIT_K > 1 only (use 'second_kernel')"
                return None
            if c["BLOCK_M"] * c["BLOCK_N"] > 128 * 128:
                return "SPLIT_K > 1 only with tiles of at most 128 x 128"
            iters = reduction_iters(wl, c["BLOCK_K"], c.get("LOOP_ORDER") == "r_sc")
            return split_k_reason(self._tiles(wl, c), iters, c["SPLIT_K"],
                                  waves=4 if isinstance(wl, GemmWorkload) else 2)

        def group(c: Config) -> str | None:
            if c["GROUP_M"] > 1 and math.ceil(m / c["BLOCK_M"]) < 2 * c["GROUP_M"]:
                return "GROUP_M > 1 needs at least 2 groups of row tiles"
            return None

        return [fits, smem, registers, warpgroups, split, group]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return self.knobs.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """The untuned baseline: 128 x 128 x 64 tiles, 4 warps, 3 stages (Triton's tutorial);
        8 warps where a short reduction's requantization would spill (`default_warps`); on
        convs of fewer than 32 channels with S > 1 (first layers) LOOP_ORDER "r_sc" with a
        BLOCK_K of a kernel row's S*C values (the 3-channel 7x7: 152.5 -> 46.7 us on an
        H100, docs/history/int8.md)."""
        space = self.space(wl)
        m, n, _ = wl.gemm_shape
        chans = wl.C if isinstance(wl, ConvWorkload) else wl.K
        want = {"BLOCK_M": 128 if m > 64 else 64, "BLOCK_N": min(128, max(32, pow2_ceil(n))),
                "BLOCK_K": 64 if chans > 32 else 32, "num_stages": 3,
                "GROUP_M": 8, "LOOP_ORDER": "rsc", "SPLIT_K": 1, "SPLIT_SUM": "second_kernel"}
        if _row_taps_allowed(wl) and wl.C < min(BLOCK_K_VALUES):
            # few channels (a first layer): a kernel row's S*C values per reduction run
            want["LOOP_ORDER"] = "r_sc"
            want["BLOCK_K"] = min(max(min(BLOCK_K_VALUES), pow2_ceil(wl.S * wl.C)),
                                  max(BLOCK_K_VALUES))
        steps = reduction_iters(wl, want["BLOCK_K"], want["LOOP_ORDER"] == "r_sc")
        want["num_warps"] = default_warps(wl, want["BLOCK_M"], want["BLOCK_N"], steps)
        cfg = Config({k: want[k] for k in space.names})
        if space.is_valid(cfg):
            return cfg
        cfg = cfg.replace(GROUP_M=1)
        return cfg if space.is_valid(cfg) else space.all_configs()[0]

    def launch_shape(self, wl: Workload, config: Config) -> dict:
        """The launch as plain tiles (`kernels.geometry.LaunchShape` fields): tiles stage 8-bit
        (16-bit for fp16) elements in shared memory whatever the stored bit width (unpacked on
        load)."""
        return dict(block_m=config["BLOCK_M"], block_n=config["BLOCK_N"],
                    block_k=config["BLOCK_K"], warps=config["num_warps"],
                    stages=config["num_stages"], split_k=config["SPLIT_K"],
                    operand_bits=8 * self._elem_bytes())

    def geometry(self, wl: Workload, config: Mapping) -> Geometry:
        """BLOCK_M x BLOCK_N tiles, BLOCK_K reduction elements a step (per tap and channel
        chunk, or with LOOP_ORDER "r_sc" per kernel row and chunk of its S*C values), SPLIT_K
        slices; 8-bit tiles staged (16-bit for fp16), registers estimated from the tile."""
        c = config
        m, n, k = wl.gemm_shape
        bm, bn, bk = int(c["BLOCK_M"]), int(c["BLOCK_N"]), int(c["BLOCK_K"])
        warps, stages = int(c.get("num_warps", 4)), int(c.get("num_stages", 2))
        split = int(c.get("SPLIT_K", 1))
        elem = self._elem_bytes()
        taps, chans = conv_taps(wl)
        if c.get("LOOP_ORDER") == "r_sc" and isinstance(wl, ConvWorkload):
            steps = wl.R * math.ceil(wl.S * wl.C / bk)
        else:
            steps = taps * math.ceil(chans / bk)
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        return Geometry("igemm", "fp16" if self.dot_fp16 else "int8", m, n, k, bm, bn,
                        math.ceil(m / bm) * bm, tiles, split, bk, math.ceil(steps / split),
                        32 * warps, stages, stages * (bm + bn) * bk * elem,
                        min(255, bm * bn // (32 * warps) + 40), False, 1, float(elem))

    # ---------------------------------------------------------------- build
    def build(self, wl: Workload, config: Config) -> IgemmKernel:
        config = self.checked_config(wl, config)
        return IgemmKernel(self.name, wl, config, problem(wl, self.dot_fp16))


class Conv2dInt8Template(_IgemmTemplate):
    """NHWC x KRSC conv2d on int8 tensor cores (wgmma s8 on Hopper), fused epilogue."""

    name = "triton.conv2d_int8"
    workload_type = ConvWorkload
    #: read by the planner and executor: writes a layer epilogue's outputs (`conv_outputs`)
    layer_outputs_max: ClassVar[int] = LAYER_OUTPUTS_MAX


class GemmInt8Template(_IgemmTemplate):
    """a [M, K] x b [N, K]^T on int8 tensor cores, fused epilogue."""

    name = "triton.gemm_int8"
    workload_type = GemmWorkload
    layer_outputs_max: ClassVar[int] = LAYER_OUTPUTS_MAX


class Conv2dFp16Template(_IgemmTemplate):
    """The conv template on fp16 tensor cores: integer operands are exact in fp16, and the fp32
    accumulator is exact while the worst-case |sum| < 2^24 (checked); u8 operands allowed."""

    name = "triton.conv2d_fp16"
    workload_type = ConvWorkload
    dot_fp16 = True


def conv2d_fp16(x: torch.Tensor, w: torch.Tensor, stride: int = 1, pad: int = 0,
                config: Config | None = None) -> torch.Tensor:
    """Float conv2d on fp16 tensor cores (the TVM tutorial's operator): x [N, H, W, C] fp16
    NHWC, w [K, R, S, C] fp16 KRSC -> [N, P, Q, K] fp16 (fp32 accumulation, one rounding at the
    end: relative L2 error vs a float64 reference about 1e-3, fp16 output rounding).
    `config` is a point of `Conv2dFp16Template().space(...)` of the same shape."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float16 or t.dim() != 4 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous 4-d float16 tensor, got {t.dtype} "
                             f"{tuple(t.shape)} contiguous={t.is_contiguous()}")
    if w.device != x.device:
        raise ValueError(f"w is on {w.device}, expected {x.device}")
    if w.shape[3] != x.shape[3]:
        raise ValueError(f"w has C={w.shape[3]} channels, x has C={x.shape[3]}")
    _check_device(x)
    n, h, wd, c = x.shape
    k, r, s, _ = w.shape
    # the shape carrier only: operands and output are overridden to float below, so the
    # integer exactness bound of the template (fp32 accumulator) must not reject it
    wl = ConvWorkload(N=n, H=h, W=wd, C=c, K=k, R=r, S=s, stride=stride, pad=pad,
                      w="b1", a="b1")
    template = Conv2dFp16Template()
    cfg = Config(config) if config is not None else template.default_config(wl)
    reason = template.knobs.space(wl, template.constraints(wl)).why_invalid(cfg)
    if reason:
        raise ValueError(f"config {cfg} is not valid for this conv: {reason}")
    prob = problem(wl, dot_fp16=True)
    prob = Problem(**{**prob.__dict__, "a_operand": (SRC_FLOAT, 16, 0),
                      "w_operand": (SRC_FLOAT, 16, 0), "bias": False, "relu": False,
                      "out": (OUT_KIND_FLOAT, 0, 16, 0, 0)})
    out = torch.empty((n, wl.P, wl.Q, k), dtype=torch.float16, device=x.device)
    return launch(prob, cfg, x, w, out, None, None, None, None)
