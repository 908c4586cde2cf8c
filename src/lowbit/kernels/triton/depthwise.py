"""Depthwise conv2d (groups == C == K) on CUDA cores: `triton.conv2d_depthwise`, and grouped
convs of few channels per group on the same kernel: `triton.conv2d_grouped_cuda`.

A depthwise conv multiplies each input channel by its own R x S filter: 2 R S operations per
output value against one input and one output value of traffic, so it is bound by memory, not
by any tensor core (an implicit GEMM would pad each filter's one-channel reduction to the MMA
shape and waste 16-32x the work). The kernel streams NHWC activations once:

- a program owns a tile of BLOCK_PIX output pixels (rows m = (n, p, q), row-major over
  N x P x Q, `igemm.output_pixels`) x BLOCK_C channels, with the channels along the lanes, so
  each thread loads contiguous bytes of one pixel (16-byte vectors where the row stride
  allows: `ALIGN_X`);
- per tap (r, s) it loads the [BLOCK_PIX, BLOCK_C] input tile at (p stride - pad + r,
  q stride - pad + s), masked to the value 0 in the padding and past C, and the tap's
  BLOCK_C weights, and accumulates their products in int32 registers (exact: the workload's
  worst-case |sum| is checked below 2^31);
- PACKED sub-byte activations (u4 / u2 / u1, 2 / 4 / 8 values a byte, LSB first:
  `core.layout`) are read as bytes and split in registers, so a 4-bit / 2-bit layer reads a
  half / a quarter of the int8 bytes; any precision of <= 8 bits in the int8 layout too
  (u8 needs no zero point on CUDA cores);
- the fused epilogue is the implicit-GEMM kernels' (`epilogue.epilogue_store`: bias in
  accumulator units or at the output's shift, ReLU, int32 / fp16 / requantized INT8, PACKED
  or BITPLANE outputs packed in registers), so outputs equal `lowbit.reference.run` bit for
  bit.

The workload's KRSC weights [C, R, S, 1] (one value, or one packed byte, a filter tap) are
copied once, when a launch is planned, into tap-major rows of bytes [R*S, C]
(`tap_major_weights`), so a tap's weights of a channel tile are one vector load. Programs run
the channel tiles of one pixel tile next to each other (the channel tile varies fastest), so
they share the pixels' DRAM sectors in L2.

Knobs (`DEPTHWISE_KNOBS`): BLOCK_PIX, BLOCK_C, num_warps, TAP_LOOP ("unrolled": the R*S taps
as straight-line code, every tap's loads in flight at once; "pipelined": a loop Triton
software-pipelines `num_stages` deep), num_stages and MAC ("int32": IMAD; "fp32": FFMA on the
integer values, twice the issue rate, exact while the worst-case |sum| < 2^24, which every
depthwise layer of <= 8 bits and <= 256 taps is; "dp4a": one-byte activations as int32 words
of 4 channels, 4 taps transposed to each channel's bytes and summed by one dp4a with its 4
packed weights, 12 instructions for 16 products: `depthwise_taps`). A 3x3 layer does 9
multiply-accumulates a value read: at 3 TB/s of u8 values in and out that is ~13 T MACs/s, at
u4 ~27 T, against ~17 T IMAD/s (~33 T FFMA/s) of an H100's CUDA cores, so at 4 and 2 bits the
arithmetic, not the bytes, bounds the layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar

import torch
import triton
import triton.language as tl

from ...core import Config, ConfigSpace, ConvWorkload, Layout, Workload
from ...core.knobs import KnobDef, KnobTable
from ...core.validate import operand_shapes, out_storage, storage_shape
from ...quant.packing import unpack
from ..base import EXACT_INT32, KernelTemplate, acc_bound, pow2_ceil
from .depthwise_taps import (
    channel_gather,
    channel_tile,
    dp4a_asm,
    tap_group_sum,
    tap_group_words,
    tap_groups_reason,
    tap_product,
    transpose_asm,
)
from .epilogue import SRC_PACKED, epilogue_store
from .igemm import Launch, Problem, cdiv, output_pixels
from .templates import LAYER_OUTPUTS_MAX, IgemmKernel, int8_refusal, problem

#: accumulators per thread above which the unrolled taps spill (the taps' input tiles are in
#: flight beside them; sm_90, offline ptxas: 32 a thread use 164-244 registers, 64 spill)
ACC_PER_THREAD_MAX = 32
#: values per thread below which a tile leaves lanes idle or replicated
VALUES_PER_THREAD_MIN = 8
#: float32 holds every integer below this exactly
EXACT_FP32 = 2**24
#: 32-bit element offsets: activation and output storage must stay below this
OFFSET_LIMIT = 2**31
#: the fewest filter taps whose default multiply-accumulates are dp4a ones (`default_config`)
DP4A_DEFAULT_TAPS = 9
#: bytes the tap-major weight rows are padded to: the largest BLOCK_C, so that a channel
#: tile's weights are one unmasked load inside the row
ROW_ALIGN = 128


@triton.jit
def depthwise_accumulator(
    x_ptr, w_ptr, M, C, H, W, P, Q, conv_stride, pad, x_row, w_row,
    R: tl.constexpr, S: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr,
    ALIGN_X: tl.constexpr, PIPELINED: tl.constexpr,
    TAP_STAGES: tl.constexpr, MAC_FP32: tl.constexpr, GROUP_C: tl.constexpr,
    GROUP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, W_SIGNED: tl.constexpr,
    DP4A: tl.constexpr, TAP_GROUPS: tl.constexpr, TRANSPOSE: tl.constexpr,
    BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """(rows, first channel, int32 tile [BLOCK_PIX, BLOCK_C]) of program pid: channel tile
    pid % cdiv(C, BLOCK_C) of pixel tile pid // cdiv(C, BLOCK_C) (C: the output channels),
    the sum of the R*S tap products (TAP_GROUPS: 4 taps a dp4a, `tap_group_sum`)."""
    c_tiles = tl.cdiv(C, BLOCK_C)
    pid_m = tl.program_id(0) // c_tiles
    pid_c = tl.program_id(0) % c_tiles
    offs_m = pid_m * BLOCK_PIX + tl.arange(0, BLOCK_PIX)
    m_mask = offs_m < M
    n_img, ih0, iw0 = output_pixels(offs_m, P, Q, conv_stride, pad, False)
    if MAC_FP32:
        acc = tl.zeros((BLOCK_PIX, BLOCK_C), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_PIX, BLOCK_C), dtype=tl.int32)
    if TAP_GROUPS:
        acc = tap_group_sum(x_ptr, w_ptr, n_img, ih0, iw0, m_mask, pid_c, H, W, C, x_row, w_row,
                            R, S, ALIGN_X, PIPELINED, TAP_STAGES, A_ENC != 0, W_SIGNED, DP4A,
                            TRANSPOSE, BLOCK_PIX, BLOCK_C)
    elif PIPELINED:
        for tap in tl.range(0, R * S, num_stages=TAP_STAGES):
            acc += tap_product(x_ptr, w_ptr, tap, n_img, ih0, iw0, m_mask, pid_c, H, W, C, x_row,
                               w_row, S, A_SRC, A_BITS, A_ENC, ALIGN_X, MAC_FP32, GROUP_C,
                               GROUP_K, GROUP_WORDS, W_SIGNED, DP4A, BLOCK_PIX, BLOCK_C)
    else:
        for tap in tl.static_range(R * S):
            acc += tap_product(x_ptr, w_ptr, tap, n_img, ih0, iw0, m_mask, pid_c, H, W, C, x_row,
                               w_row, S, A_SRC, A_BITS, A_ENC, ALIGN_X, MAC_FP32, GROUP_C,
                               GROUP_K, GROUP_WORDS, W_SIGNED, DP4A, BLOCK_PIX, BLOCK_C)
    if MAC_FP32:
        acc = acc.to(tl.int32)  # an integer below 2^24: exact
    return offs_m, pid_c * BLOCK_C, acc


@triton.jit
def depthwise_kernel(
    x_ptr, w_ptr, out_ptr, bias_ptr, scale_ptr, mult_ptr, shift_ptr,
    M, C, H, W, P, Q, conv_stride, pad, x_row, w_row, out_row, out_plane,
    R: tl.constexpr, S: tl.constexpr,
    A_SRC: tl.constexpr, A_BITS: tl.constexpr, A_ENC: tl.constexpr,
    HAS_BIAS: tl.constexpr, RELU: tl.constexpr, OUT_KIND: tl.constexpr,
    OUT_LAYOUT: tl.constexpr, OUT_BITS: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
    WIDE: tl.constexpr, ALIGN_X: tl.constexpr, PIPELINED: tl.constexpr,
    TAP_STAGES: tl.constexpr, MAC_FP32: tl.constexpr, GROUP_C: tl.constexpr,
    GROUP_K: tl.constexpr, GROUP_WORDS: tl.constexpr, W_SIGNED: tl.constexpr,
    DP4A: tl.constexpr, TAP_GROUPS: tl.constexpr, TRANSPOSE: tl.constexpr,
    BLOCK_PIX: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """`depthwise_accumulator`'s tile, then the fused epilogue (module doc)."""
    offs_m, c0, acc = depthwise_accumulator(
        x_ptr, w_ptr, M, C, H, W, P, Q, conv_stride, pad, x_row, w_row, R, S, A_SRC, A_BITS,
        A_ENC, ALIGN_X, PIPELINED, TAP_STAGES, MAC_FP32, GROUP_C, GROUP_K, GROUP_WORDS,
        W_SIGNED, DP4A, TAP_GROUPS, TRANSPOSE, BLOCK_PIX, BLOCK_C)
    epilogue_store(acc, offs_m, c0, M, C, out_ptr, out_row, out_plane,
                   bias_ptr, scale_ptr, mult_ptr, shift_ptr, HAS_BIAS, RELU, OUT_KIND,
                   OUT_LAYOUT, OUT_BITS, QMIN, QMAX, WIDE, BLOCK_PIX, BLOCK_C)


def group_shape(wl: ConvWorkload) -> tuple[int, int]:
    """(input, output) channels of one group: (1, 1) for a depthwise conv."""
    return wl.C // wl.groups, wl.K // wl.groups


def depthwise_problem(wl: ConvWorkload) -> Problem:
    """The kernel's view of a depthwise or narrow-group workload (`templates.problem`'s
    strides and epilogue; w_row: the tap-major weight rows' length; no zero point: CUDA cores
    multiply u8 as it is)."""
    return dataclasses.replace(problem(wl, False), w_row=-(-wl.K // ROW_ALIGN) * ROW_ALIGN,
                               a_zero=0)


def tap_major_weights(wl: ConvWorkload, w: torch.Tensor,
                      tap_groups: bool = False) -> torch.Tensor:
    """The weight values as [R*S*Cg, K rounded up to ROW_ALIGN] on w's device (zeros past K;
    Cg = C / groups, 1 for depthwise): row (tap Cg + j) holds every filter's weight of tap
    `tap` and group channel j, one byte each (int8, uint8 for u8), so a tap's weights of a
    channel tile are one vector load; where the group's inputs go as words (`group_words`),
    the same bytes four channels an int32 word, [R*S*Cg/4, K rounded up] (channel 4u + b in
    byte b of word u); tap_groups (MAC="dp4a"): each channel's taps four a word,
    `tap_group_words`. `w`: the workload's validated KRSC storage [K, R, S, Cg] (INT8 or
    PACKED)."""
    cg = group_shape(wl)[0]
    values = unpack(w, wl.w, wl.w_layout, cg).reshape(wl.K, wl.R * wl.S * cg).T
    w_row = depthwise_problem(wl).w_row
    if tap_groups:
        return tap_group_words(values.T.to(weight_byte_dtype(wl)), w_row)
    out = torch.zeros((wl.R * wl.S * cg, w_row), dtype=weight_byte_dtype(wl), device=w.device)
    out[:, :wl.K] = values.to(out.dtype)
    if group_words(wl):  # little-endian bytes: the rows of 4 channels become one int32 row
        out = out.reshape(-1, 4, w_row).permute(0, 2, 1).contiguous().view(torch.int32)
        out = out.reshape(-1, w_row)
    return out


def weight_byte_dtype(wl: ConvWorkload) -> torch.dtype:
    """The dtype of one tap-major weight byte: uint8 for u8 weights, else int8."""
    return torch.uint8 if wl.w.qmax > 127 else torch.int8


def row_alignment(prob: Problem, run: int = 16) -> int:
    """The largest power of two up to 16 dividing the activation row stride x_row and `run`
    (storage elements a channel tile loads from a row): the width the loads may assume."""
    return math.gcd(prob.x_row, 16, run)


def group_words(wl: ConvWorkload) -> bool:
    """Whether a grouped conv's inputs and weights go as int32 words (`tap_product`): one-byte
    activations (INT8 layout), 4n channels a group and rows of 4n bytes."""
    cg = group_shape(wl)[0]
    return (wl.a_layout is Layout.INT8 and wl.w_layout is not Layout.BITPLANE and cg > 1
            and cg % 4 == 0 and wl.C % 4 == 0)


def mainloop_constants(prob: Problem, cfg: Mapping, group: tuple[int, int] = (1, 1),
                       words: bool = False, w_signed: bool = True) -> dict:
    """The main loop's constexprs and launch options of a launch of `cfg`
    (`depthwise_accumulator`; group: `group_shape`; words: `group_words`, whose int32
    multiply-accumulates ignore MAC; w_signed: the weight bytes are two's complement, not
    u8)."""
    bc = cfg["BLOCK_C"]
    packed = prob.a_operand[0] == SRC_PACKED
    return dict(
        R=prob.R, S=prob.S, A_SRC=prob.a_operand[0], A_BITS=prob.a_operand[1],
        A_ENC=prob.a_operand[2],
        ALIGN_X=row_alignment(prob, bc * prob.a_operand[1] // 8 if packed else bc),
        PIPELINED=cfg["TAP_LOOP"] == "pipelined", TAP_STAGES=cfg["num_stages"],
        MAC_FP32=cfg.get("MAC", "int32") == "fp32" and not words, GROUP_C=group[0],
        GROUP_K=group[1], GROUP_WORDS=words, W_SIGNED=w_signed,
        DP4A=dp4a_asm(prob.a_operand[2] != 0, w_signed),
        TAP_GROUPS=cfg.get("MAC") == "dp4a", TRANSPOSE=transpose_asm(),
        BLOCK_PIX=cfg["BLOCK_PIX"], BLOCK_C=bc, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


def conv_arguments(prob: Problem) -> tuple:
    """The shape arguments of `depthwise_accumulator` after its two pointers."""
    return (prob.M, prob.NOUT, prob.H, prob.W, prob.P, prob.Q, prob.stride, prob.pad,
            prob.x_row, prob.w_row)


def program_count(prob: Problem, cfg: Mapping) -> int:
    """Programs of a launch of `cfg`: one per pixel tile and channel tile."""
    return cdiv(prob.M, cfg["BLOCK_PIX"]) * cdiv(prob.NOUT, cfg["BLOCK_C"])


def depthwise_launch(prob: Problem, cfg: Mapping, x: torch.Tensor, w: torch.Tensor,
                     out: torch.Tensor, vecs: tuple, group: tuple[int, int] = (1, 1),
                     words: bool = False, w_signed: bool = True) -> Launch:
    """The one launch of a validated call (`w`: `tap_major_weights`, in its tap_groups form
    for MAC="dp4a"; `vecs`: bias, scale, multiplier, shift or None; group, words, w_signed:
    `mainloop_constants`). No checks here."""
    kind, layout, obits, qmin, qmax = prob.out
    vecs = tuple(t if t is not None else out for t in vecs)
    args = (x, w, out, *vecs, *conv_arguments(prob), prob.out_row, prob.out_plane)
    kwargs = dict(mainloop_constants(prob, cfg, group, words, w_signed), HAS_BIAS=prob.bias,
                  RELU=prob.relu, OUT_KIND=kind, OUT_LAYOUT=layout, OUT_BITS=obits,
                  QMIN=qmin, QMAX=qmax, WIDE=prob.wide)
    return Launch(depthwise_kernel, (program_count(prob, cfg),), args, kwargs)


class DepthwiseKernel(IgemmKernel):
    """One compiled (workload, config) of `triton.conv2d_depthwise`: `kernel(x, w, params,
    out=None)` and `bind(...)` as `IgemmKernel` (checks, wide bias, float64 requantization);
    a bound launcher keeps the tap-major copy of `w` made at bind (bind again after changing
    the weights)."""

    def weight_taps(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The launch's copy of the weights (`tap_major_weights`, its tap_groups form for
        MAC="dp4a"); ValueError where MAC="dp4a" gets activations off a 4-byte boundary."""
        wl = self.workload
        tap_groups = self.config.get("MAC") == "dp4a"
        if tap_groups and x.data_ptr() % 4:
            raise ValueError("x: MAC='dp4a' reads the activations as int32 words; its data "
                             f"must start on a 4-byte boundary (data_ptr {x.data_ptr():#x})")
        if w.dim() == 1:  # an ahead-of-time compile's placeholder: only the dtype matters
            dtype = torch.int32 if group_words(wl) or tap_groups else weight_byte_dtype(wl)
            return torch.empty(16, dtype=dtype, device=w.device)
        return tap_major_weights(wl, w, tap_groups)

    def mainloop(self, cfg: Mapping) -> dict:
        """`mainloop_constants` of a launch of `cfg` on this kernel's workload."""
        wl = self.workload
        return mainloop_constants(self.problem, cfg, group_shape(wl), group_words(wl),
                                  weight_byte_dtype(wl) == torch.int8)

    def plan(self, prob: Problem, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
             vecs: tuple) -> list[Launch]:
        wl = self.workload
        return [depthwise_launch(prob, self.config, x, self.weight_taps(x, w), out, vecs,
                                 group_shape(wl), group_words(wl),
                                 w_signed=weight_byte_dtype(wl) == torch.int8)]


def fp32_exact(wl: Workload) -> bool:
    """float32 multiply-accumulates are exact for `wl`: every partial sum an integer below
    2^24."""
    return acc_bound(wl) < EXACT_FP32


def mac_choices(wl: Workload) -> tuple[str, ...]:
    """MAC's values on `wl`: fp32 where exact (`fp32_exact`); dp4a everywhere, refused by
    the template's constraints where it cannot run (`tap_groups_reason`)."""
    return ("int32", "fp32", "dp4a") if fp32_exact(wl) else ("int32", "dp4a")


DEPTHWISE_KNOBS = KnobTable(
    KnobDef("BLOCK_PIX", (128, 32, 64, 256, 512), "output pixels per program"),
    KnobDef("BLOCK_C", (32, 16, 64, ROW_ALIGN), "channels per program, along the lanes"),
    KnobDef("num_warps", (4, 1, 2, 8), "warps per program"),
    KnobDef("TAP_LOOP", ("unrolled", "pipelined"),
            "unrolled: the R*S taps as straight-line code (all loads in flight); pipelined: "
            "a loop software-pipelined num_stages deep"),
    KnobDef("num_stages", (1, 2, 3, 4), "pipeline depth of the tap loop",
            requires={"TAP_LOOP": ("pipelined",)}),
    KnobDef("MAC", ("int32", "fp32", "dp4a"),
            "multiply-accumulate in int32 (IMAD), in float32 (FFMA at twice the rate; the "
            "values are integers, exact while the worst-case |sum| < 2^24), or 4 taps of a "
            "channel a dp4a (one-byte activations, C a multiple of 4: depthwise_taps)",
            choices=mac_choices),
)


def fewer_warps_until_valid(space: ConfigSpace, cfg: Config) -> Config:
    """`cfg` with its warps halved until `space` takes it (a tile of few values leaves lanes
    idle on 4 warps), else the space's first config."""
    while not space.is_valid(cfg) and cfg["num_warps"] > 1:
        cfg = cfg.replace(num_warps=cfg["num_warps"] // 2)
    return cfg if space.is_valid(cfg) else space.all_configs()[0]


def default_block_c(wl: ConvWorkload) -> int:
    """BLOCK_C of the defaults: 64 where it divides K, else 32 where that does, else 64 (K
    rounded up to a power of two when smaller)."""
    c = 64 if wl.K % 64 == 0 or wl.K % 32 else 32
    return min(c, max(16, pow2_ceil(wl.K)))


def grouped_conv_reason(wl: ConvWorkload) -> str | None:
    """What the depthwise and grouped templates refuse whatever the groups: a residual term,
    int16 output, bit-plane operands, an accumulator that could leave int32, tensors past
    32-bit offsets (None: they take it)."""
    reason = int8_refusal(wl, "the separate layer-epilogue pass")
    if reason:
        return reason
    bound = acc_bound(wl)  # u8 activations' zero-point sums too (within it)
    if bound >= EXACT_INT32:
        return f"worst-case |accumulator| {bound} >= {EXACT_INT32}: int32 would not be exact"
    return offsets_reason(wl)


def offsets_reason(wl: ConvWorkload) -> str | None:
    """Why 32-bit element offsets cannot address the activations or the output (None: they
    can)."""
    xs = storage_shape(operand_shapes(wl)[0], wl.a, wl.a_layout)
    if max(math.prod(xs), math.prod(out_storage(wl)[0])) >= OFFSET_LIMIT:
        return "activations or output of 2^31 or more storage elements (32-bit offsets)"
    return None


def tile_reason(wl: ConvWorkload, pixels: int, pixel_floor: int, channels: int,
                name: str) -> str | None:
    """Why an output tile of `pixels` (knob BLOCK_PIX) x `channels` (knob `name`) does not fit
    `wl`: wider than K, or taller than N*P*Q, rounded up to a power of two (at least 16 /
    `pixel_floor`), or under 32 channels for a bit-plane output (32 channels a word)."""
    m = wl.gemm_shape[0]
    if channels > max(16, pow2_ceil(wl.K)):
        return f"{name}={channels} exceeds K={wl.K} rounded up"
    if pixels > max(pixel_floor, pow2_ceil(m)):
        return f"BLOCK_PIX={pixels} exceeds N*P*Q={m} rounded up"
    if wl.epilogue.requantizes and wl.epilogue.out_layout is Layout.BITPLANE and channels < 32:
        return f"bit-plane output packs 32 channels a word: {name} >= 32"
    return None


class Conv2dDepthwiseTemplate(KernelTemplate):
    """Depthwise conv2d NHWC x KRSC [C, R, S, 1] (groups == C == K), any R x S, stride and
    padding, int32 accumulation on CUDA cores, the implicit-GEMM kernels' fused epilogue;
    INT8 or PACKED operands of 1-8 bits (module doc)."""

    name = "triton.conv2d_depthwise"
    backend = "triton"
    #: runs Epilogue.shifted_bias (epilogue_store's HAS_BIAS = BIAS_SHIFTED)
    takes_shifted_bias: ClassVar[bool] = True
    #: read by the planner and executor: writes a layer epilogue's outputs
    #: (`depthwise_outputs`, through `conv_outputs.bind_conv_outputs`)
    layer_outputs_max: ClassVar[int] = LAYER_OUTPUTS_MAX

    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, ConvWorkload):
            return f"needs a ConvWorkload, got {type(wl).__name__}"
        if not wl.depthwise:
            return (f"needs a depthwise conv (groups == C == K), got groups={wl.groups}, "
                    f"C={wl.C}, K={wl.K}")
        return grouped_conv_reason(wl)

    def constraints(self, wl: ConvWorkload) -> list:
        def fits(c: Config) -> str | None:
            return tile_reason(wl, c["BLOCK_PIX"], 32, c["BLOCK_C"], "BLOCK_C")

        def threads(c: Config) -> str | None:
            per_thread = c["BLOCK_PIX"] * c["BLOCK_C"] // (32 * c["num_warps"])
            if per_thread > ACC_PER_THREAD_MAX:
                return f"{per_thread} accumulators per thread > {ACC_PER_THREAD_MAX}"
            if per_thread < VALUES_PER_THREAD_MIN:
                return (f"{per_thread} values per thread < {VALUES_PER_THREAD_MIN} (idle or "
                        "replicated lanes)")
            return None

        def mac(c: Config) -> str | None:
            return tap_groups_reason(wl) if c["MAC"] == "dp4a" else None

        return [fits, threads, mac]

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        return DEPTHWISE_KNOBS.space(wl, self.constraints(wl))

    def default_config(self, wl: Workload) -> Config:
        """BLOCK_C: 64 where it divides C, else 32 where that does, else 64 (C rounded up to a
        power of two when smaller); BLOCK_PIX: 4,096 values a tile, 2,048 for packed
        activations (their unpacking takes registers: offline ptxas for sm_90, 32 values a
        thread of u2 / u4 use 240 registers, 16 use 114), at most N*P*Q rounded up; 4 warps,
        the taps unrolled, int32 multiply-accumulates; dp4a ones on filters of at least
        DP4A_DEFAULT_TAPS taps where they apply (offline sm_90 with the float64 epilogue
        free of conversions: MobileNet-V2's 3 x 3 on 144 channels 880 instructions a warp
        against 1,456, 116 registers against 168; 5 x 5 on 240 channels: int32 255 registers
        and 1,136 B of spill, dp4a 137 and none)."""
        space = self.space(wl)
        c = default_block_c(wl)
        values = 2048 if wl.a_layout is Layout.PACKED else 4096
        pix = min(max(32, values // c), max(32, pow2_ceil(wl.gemm_shape[0])))
        cfg = fewer_warps_until_valid(space, Config(
            BLOCK_PIX=min(pix, 512), BLOCK_C=c, num_warps=4, TAP_LOOP="unrolled",
            num_stages=1, MAC="int32"))
        if wl.R * wl.S >= DP4A_DEFAULT_TAPS and space.is_valid(cfg.replace(MAC="dp4a")):
            return cfg.replace(MAC="dp4a")
        return cfg

    def launch_shape(self, wl: Workload, config: Config) -> dict:
        """The launch as plain tiles (`kernels.geometry.LaunchShape` fields): a BLOCK_PIX x
        BLOCK_C tile of the N*P*Q x C output over an R*S reduction, one value a step, no
        shared memory staging beyond Triton's pipeline (operand bits: the stored activation
        width)."""
        bits = wl.a.bits if wl.a_layout is Layout.PACKED else 8
        reduction = wl.R * wl.S * group_shape(wl)[0]
        return dict(M=wl.gemm_shape[0], N=wl.K, K=reduction, block_m=config["BLOCK_PIX"],
                    block_n=config["BLOCK_C"], block_k=1, warps=config["num_warps"],
                    stages=config["num_stages"], split_k=1, operand_bits=bits)

    def build(self, wl: Workload, config: Config) -> DepthwiseKernel:
        config = self.checked_config(wl, config)
        return DepthwiseKernel(self.name, wl, config, depthwise_problem(wl))


#: the most input channels per group `triton.conv2d_grouped_cuda` takes (each is one gathered
#: input tile and one multiply-add per tap and output value)
GROUP_CHANNELS_MAX = 16


class Conv2dGroupedCudaTemplate(Conv2dDepthwiseTemplate):
    """Grouped conv2d of at most GROUP_CHANNELS_MAX input channels per group (1 < groups,
    not depthwise) on CUDA cores: the depthwise kernel with each output channel summing its
    group's Cg gathered inputs per tap (`tap_product`), R*S*Cg multiply-adds an output value
    (ResNeXt 32x4d's 4-16: 36-144 for a 3x3) where the tensor-core template pads each
    column tile's reduction to its groups' span."""

    name = "triton.conv2d_grouped_cuda"
    #: the layer epilogue's outputs are written by the separate pass (netops; the kernel
    #: can write them, `depthwise_outputs`, unmeasured for grouped convs)
    layer_outputs_max: ClassVar[int] = 0

    def unsupported_reason(self, wl: Workload) -> str | None:
        if not isinstance(wl, ConvWorkload):
            return f"needs a ConvWorkload, got {type(wl).__name__}"
        if wl.groups == 1 or wl.depthwise:
            return (f"needs a grouped conv (1 < groups, not depthwise), got groups={wl.groups},"
                    f" C={wl.C}, K={wl.K}")
        cg = group_shape(wl)[0]
        if cg > GROUP_CHANNELS_MAX:
            return (f"{cg} input channels per group > {GROUP_CHANNELS_MAX}: "
                    "triton.conv2d_grouped_int8 (tensor cores)")
        return grouped_conv_reason(wl)

    def constraints(self, wl: ConvWorkload) -> list:
        words = group_words(wl)

        def looped(c: Config) -> str | None:
            if c["TAP_LOOP"] == "unrolled":
                return ("unrolled grouped taps keep R*S*Cg gathered tiles in flight and spill "
                        "(offline ptxas, sm_90: 15-27 KB a thread): TAP_LOOP pipelined")
            if words and c.get("MAC") == "fp32":
                return "a group's words go through int32 dot products (dp4a): MAC int32"
            return None

        return [*super().constraints(wl), looped]

    def default_config(self, wl: Workload) -> Config:
        """The depthwise default's BLOCK_C, the taps in a loop (`constraints`), 2,048 values
        a tile for bit-plane outputs (their packing takes registers: offline ptxas for sm_90,
        ResNeXt's u2 planes on 64 x 64 tiles 242 registers, 32 x 64 107; int32 out 56-95),
        else 4,096."""
        c = default_block_c(wl)
        values = 2048 if wl.epilogue.out_layout is Layout.BITPLANE else 4096
        pix = min(max(32, values // c), max(32, pow2_ceil(wl.gemm_shape[0])), 512)
        return fewer_warps_until_valid(self.space(wl), Config(
            BLOCK_PIX=pix, BLOCK_C=c, num_warps=4, TAP_LOOP="pipelined", num_stages=1,
            MAC="int32"))


__all__ = ["DEPTHWISE_KNOBS", "GROUP_CHANNELS_MAX", "Conv2dDepthwiseTemplate",
           "Conv2dGroupedCudaTemplate", "DepthwiseKernel", "channel_gather", "channel_tile",
           "depthwise_kernel", "depthwise_launch", "depthwise_problem", "group_shape",
           "grouped_conv_reason", "offsets_reason", "tap_major_weights",
           "tile_reason"]
