"""The fused first layer as one warp-specialized CUDA kernel (`StemConfig(kernel="ws")`):
ResNet's 7x7/2 (any stride-2 conv whose space-to-depth filter spans at most 4 x 4 pixels, on at
most 4 channels) + bias + ReLU + requantization + the 3x3/2 max-pool, from the float32 or
uint8 NCHW image (any strides) to the layer's outputs, in one launch; compiled with NVRTC
(`stem_ws.cu` and the files it includes), emulated on the CPU by `stem_ws_emu`.

Semantics: those of `kernels.triton.stem` (its module docstring), bit for bit: the image
quantized as `reference.quantize_float` (IEEE division, round half up; in the kernel a
candidate by one multiply-add, made exact by the quantizer's steps, `float_thresholds`) or
looked up in the uint8 image's table, int8 x int8 products summed in int32 on the tensor
cores, the pool on the int32 accumulators (INT32_MIN outside the conv output), then per
output either
- integer thresholds (outputs of 1-2 bits, plain or derived: `stem_gemm.threshold_table`,
  `stem_gemm.derived_threshold_table`), in the INT8 or BITPLANE layout, or
- the formula floor((y m + b + 2^(s-1)) / 2^s) clamped to [low, high], exact: in int32 where
  every partial sum fits, else as one int64 sum whose quotient is an int32, else with
  b + 2^(s-1) split at 2^s on the host so that no partial sum leaves int64 (`_formula_kind`),
  for outputs of 3-8 bits with m < 2^31, in the INT8 layout.
Anything else is refused with its reason (`ws_refusal`, `ws_output_refusal`), so the caller
falls back to the Triton stem: float outputs, derived outputs wider than 2 bits, wide outputs,
residual terms, other strides, no pool.

Work: `stem_ws.cu`'s header. The reduction is 64 C bytes (4 x 4 pixels of 4 C bytes, no
padding to 16: 192 bytes for 3 channels, 6 k32 steps); a tile is an image, a band of pooled
rows (`ws_band_rows`) and 4 (4 NT_W - 1) pooled columns (NT_W n-tiles a consumer warp,
`ws_n_tiles`); one CTA per SM, persistent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...core import Layout, PackedTensor, Precision
from ...core.hardware import TARGET
from ..triton.layer_outputs import Dequantized, Requantized, as_output_spec
from ..triton.stem_gemm import derived_threshold_table, threshold_table
from ..triton.stem_geometry import StemGeometry
from . import nvrtc
from .cu_source import expand

__all__ = ["WsOutput", "WsShape", "bind_ws_stem", "render", "ws_arguments", "ws_band_rows",
           "ws_n_tiles", "ws_output_refusal", "ws_outputs_refusal", "ws_refusal", "ws_weights"]

KERNEL_NAME = "stem_ws"
#: threads of a CTA (4 producer warps, 8 consumer warps) and output channels per CTA
THREADS = 384
CONSUMER_WARPS = 8
KBLOCK = 64
#: ring slots (pairs of space-to-depth rows)
NSLOT = 6
#: output kinds of the kernel: none, integer thresholds, the formula with one 64-bit sum and an
#: int32 quotient, the formula with b + 2^(s-1) split at 2^s (any int64 sum), the formula in
#: int32 (`_formula_kind`)
KIND_NONE, KIND_THRESHOLDS, KIND_FORMULA, KIND_FORMULA_SPLIT, KIND_FORMULA32 = 0, 1, 2, 3, 4
MAX_OUTPUTS = 3
EPI_WORDS = 8


@dataclass(frozen=True)
class WsOutput:
    """One output's compile-time values: kind (KIND_*), layout (0 INT8, 1 BITPLANE), bits, and
    lo / hi: the thresholds' lowest value and lowest value + levels, or the formula's clamp."""

    kind: int = KIND_NONE
    layout: int = 0
    bits: int = 8
    lo: int = 0
    hi: int = 0


@dataclass(frozen=True)
class WsShape:
    """The kernel's compile-time values (its prelude, `render`)."""

    C: int
    PS: int
    PP: int
    NT_W: int
    U8_INPUT: bool
    HAS_STATUS: bool
    QMIN: int
    QMAX: int
    outputs: tuple[WsOutput, ...]
    NSLOT: int = NSLOT
    #: a float image quantized by IEEE division (a scale whose reciprocal is not a normal
    #: float), not by the thresholds (`float_thresholds`)
    DIV_QUANT: bool = False

    def prelude(self) -> dict[str, int]:
        values = {"C": self.C, "PS": self.PS, "PP": self.PP, "NT_W": self.NT_W,
                  "NSLOT": self.NSLOT, "U8_INPUT": int(self.U8_INPUT),
                  "DIV_QUANT": int(self.DIV_QUANT),
                  "HAS_STATUS": int(self.HAS_STATUS), "QMIN": self.QMIN, "QMAX": self.QMAX,
                  "NOUT": MAX_OUTPUTS}
        outs = list(self.outputs) + [WsOutput()] * (MAX_OUTPUTS - len(self.outputs))
        for i, o in enumerate(outs):
            values.update({f"OUT{i}_KIND": o.kind, f"OUT{i}_LAYOUT": o.layout,
                           f"OUT{i}_BITS": o.bits, f"OUT{i}_LO": o.lo, f"OUT{i}_HI": o.hi})
        return values


def render(shape: WsShape, supplied: dict[str, str] | None = None) -> str:
    """CUDA source of one shape: its constants + stem_ws.cu expanded (`supplied`: files in
    place of the package's, the host emulation's primitives)."""
    values = {**shape.prelude(), "SMEM_EXPECTED": smem_bytes(shape)}
    prelude = "".join(f"#define {k} {int(v)}\n" for k, v in values.items())
    return f"// lowbit warp-specialized stem {shape}\n{prelude}{expand('stem_ws.cu', supplied)}"


# =========================================================================== refusals
def ws_refusal(geom: StemGeometry) -> str | None:
    """Why the kernel cannot run the first layer `geom` (None: it can)."""
    if geom.stride != 2:
        return f"stride {geom.stride} (the warp-specialized stem runs stride 2)"
    if geom.C > 3:
        return f"{geom.C} channels (at most 3: 4 take more registers than a CTA of 384 " \
               "threads has without spilling)"
    if geom.RS > 4 or geom.a_min < -2:
        return f"a {geom.R}x{geom.R} filter with pad {geom.pad} spans more than 4x4 " \
               "space-to-depth pixels"
    if geom.pool_pad is None:
        return "no max-pool (the warp-specialized stem fuses the 3x3/2 pool)"
    return None


def _formula_refusal(spec: Requantized, k: int) -> str | None:
    m = torch.as_tensor(spec.multiplier).to(torch.int64).reshape(-1)
    s = torch.as_tensor(spec.shift).to(torch.int64).reshape(-1)
    b = torch.as_tensor(0 if spec.bias is None else spec.bias).to(torch.int64).reshape(-1)
    if int(m.min()) < 0 or int(m.max()) >= 2**31:
        return "a multiplier outside [0, 2^31)"
    if int(s.min()) < 1 or int(s.max()) > 62 or int(b.abs().max()) >= 2**62:
        return "a shift outside 1..62 or an output bias of 2^62 or more"
    return None


def ws_output_refusal(i: int, spec: object, layout: Layout | None, k: int) -> str | None:
    """Why the kernel cannot write output i (`spec`, in `layout`; None: a float tensor) of
    K channels (None: it can)."""
    spec = as_output_spec(i, spec)
    if isinstance(spec, Dequantized) or layout is None:
        return f"outputs[{i}] is a float output"
    p = spec.precision
    if not isinstance(p, Precision) or layout not in (Layout.INT8, Layout.BITPLANE):
        return f"outputs[{i}] is not a <= 8-bit output in the INT8 or BITPLANE layout"
    if spec.residual_multiplier is not None:
        return f"outputs[{i}] has a residual term"
    if p.bits <= 2:
        thr = (threshold_table(spec, k) if spec.table is None
               else derived_threshold_table(spec, k))
        return None if thr is not None else f"outputs[{i}] has no integer thresholds"
    if spec.table is not None:
        return f"outputs[{i}] is a derived output of more than 2 bits"
    if layout is not Layout.INT8:
        return f"outputs[{i}] has more than 2 bits in the BITPLANE layout"
    why = _formula_refusal(spec, k)
    return None if why is None else f"outputs[{i}] has {why}"


def ws_outputs_refusal(specs: Sequence[object], layouts: Sequence[Layout | None], k: int
                       ) -> str | None:
    """Why the kernel cannot write these outputs (`ws_output_refusal`; None: it can)."""
    return next((why for i, (spec, layout) in enumerate(zip(specs, layouts, strict=True))
                 if (why := ws_output_refusal(i, spec, layout, k)) is not None), None)


# =========================================================================== host tables
#: scales whose float image the kernel quantizes by thresholds (1 / scale a normal float with
#: room: `stem_ws_kernel.cu`'s quantize_by_thresholds, candidate within one of the value)
THRESHOLD_SCALES = (2.0**-100, 2.0**100)


def _float_of(key: torch.Tensor) -> torch.Tensor:
    """Ordered int64 keys (the float32 bit patterns, negative ones mirrored) -> float32."""
    bits = torch.where(key >= 0, key, -key - 2**31)  # sign bit set: int32 -2^31 + |key|
    return bits.to(torch.int32).view(torch.float32)


def float_thresholds(scale: float, prec: Precision) -> torch.Tensor:
    """The float image's quantizer steps, int32 [256, 4] (the kernel's QuantStep: float32 bits
    of T(k), T(k + 1), then the base value, 0): T(l), l = 1 .. qmax - qmin, the least float32
    x with `reference.quantize_float(x)` >= qmin + l (the quantizer is monotone: x's value is
    qmin + #{l : x >= T(l)}), T(0) and T(qmax - qmin + 1) NaN (no comparison holds); base
    qmin + k, past the last level (k > qmax - qmin) qmax with NaN thresholds. Bisection over
    the ordered finite float32 values, each probe quantized by the reference itself."""
    from ...reference import quantize_float

    levels = int(prec.qmax) - int(prec.qmin) + 1
    targets = torch.arange(int(prec.qmin) + 1, int(prec.qmax) + 1, dtype=torch.int64)
    top = 0x7F7FFFFF  # FLT_MAX's key: every finite float32 lies in [-top, top]
    lo = torch.full_like(targets, -top)  # quantize(lo) < target <= quantize(hi)
    hi = torch.full_like(targets, top)
    while bool((hi - lo > 1).any()):
        mid = (lo + hi).div(2, rounding_mode="floor")
        ok = quantize_float(_float_of(mid), scale, prec) >= targets
        hi, lo = torch.where(ok, mid, hi), torch.where(ok, lo, mid)
    t = torch.full((257,), float("nan"), dtype=torch.float32)
    t[1:levels] = _float_of(hi)
    steps = torch.zeros(256, 4, dtype=torch.int32)
    steps[:, 0] = t[:256].view(torch.int32)
    steps[:, 1] = t[1:].view(torch.int32)
    steps[:, 2] = (int(prec.qmin) + torch.arange(256)).clamp(max=int(prec.qmax))
    return steps


def ws_weights(weight: torch.Tensor, geom: StemGeometry) -> torch.Tensor:
    """KRSC integer weights -> int8 [K rounded up to 64, 64 C]: window row a, column b, byte
    (d C + c) 2 + e holds filter tap (2 (a - PS) + d + pad, 2 (b - PS) + e + pad) of channel
    c, PS = -a_min; zero where the tap is outside the filter and for padding channels."""
    k, r, _, c = weight.shape
    kpad = -(-k // KBLOCK) * KBLOCK
    a = torch.arange(4).view(4, 1)
    taps = 2 * (a + geom.a_min) + torch.arange(2).view(1, 2) + geom.pad  # [window, d]
    ok = (taps >= 0) & (taps < r)
    src = weight.to(torch.int8).cpu()[:, taps.clamp(0, r - 1)][:, :, :, taps.clamp(0, r - 1)]
    # src [K, a, d, b, e, C] -> [K, a, b, d, C, e]
    mask = ok.view(1, 4, 2, 1, 1, 1) & ok.view(1, 1, 1, 4, 2, 1)
    src = torch.where(mask, src, torch.zeros((), dtype=torch.int8))
    out = torch.zeros(kpad, 4, 4, 2, c, 2, dtype=torch.int8)
    out[:k] = src.permute(0, 1, 3, 2, 5, 4)
    return out.reshape(kpad, 64 * c).contiguous()


def _reduced(m: torch.Tensor, cb: torch.Tensor, s: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, c, s) per channel divided by the largest 2^d (d <= s - 1) dividing m and c =
    b + 2^(s-1): floor((y m + c) / 2^s) is the same for every y, at a shift d smaller."""
    d = torch.zeros_like(s)
    for i in range(1, 62):
        ok = (s > i) & (m % (1 << i) == 0) & (cb % (1 << i) == 0)
        if not bool(ok.any()):
            break
        d = torch.where(ok, torch.full_like(d, i), d)
    return m >> d, cb >> d, s - d


def _formula_kind(m: torch.Tensor, cb: torch.Tensor, s: torch.Tensor, acc_bound: int
                  ) -> tuple[int, torch.Tensor]:
    """The cheapest exact form of floor((y m + c) / 2^s) for |y| <= acc_bound (int32 y) and
    its int64 [k, 4] words (m, s, c low, c high):
    - KIND_FORMULA32: every partial sum of y m + c in int32 (after `_reduced`);
    - KIND_FORMULA: y m + c in int64 and its quotient in int32 for every int32 y
      (2^31 m + |c| < 2^min(s + 31, 63)), so the kernel shifts the sum and keeps one word;
    - KIND_FORMULA_SPLIT otherwise (c split at 2^s, `_epilogue_rows`)."""
    rm, rc, rs = _reduced(m, cb, s)
    if all(acc_bound * mi + abs(ci) < 2**31
           for mi, ci in zip(rm.tolist(), rc.tolist(), strict=True)):
        return KIND_FORMULA32, torch.stack([rm, rs, rc, torch.zeros_like(rc)], 1)
    fits = [2**31 * mi + abs(ci) < 2 ** min(si + 31, 63)
            for mi, ci, si in zip(m.tolist(), cb.tolist(), s.tolist(), strict=True)]
    if all(fits):
        return KIND_FORMULA, torch.stack([m, s, cb & 0xFFFFFFFF, cb >> 32], 1)
    return KIND_FORMULA_SPLIT, torch.empty(0)


def _epilogue_rows(i: int, spec: Requantized, layout: Layout, k: int, acc_bound: int
                   ) -> tuple[WsOutput, torch.Tensor]:
    """Output i's compile-time values and its int32 [k, EPI_WORDS] constants: thresholds, or
    the formula's words (`_formula_kind`; KIND_FORMULA_SPLIT: m, s, then hi and lo of
    b + 2^(s-1) = hi 2^s + lo as int64 words, low word first)."""
    p = spec.precision
    rows = torch.zeros(k, EPI_WORDS, dtype=torch.int64)
    lay = 1 if layout is Layout.BITPLANE else 0
    if p.bits <= 2:
        thr = threshold_table(spec, k) if spec.table is None else derived_threshold_table(
            spec, k)
        rows[:, :thr.shape[1]] = thr.to(torch.int64)
        qlo = int(p.qmin)
        return WsOutput(KIND_THRESHOLDS, lay, p.bits, qlo, int(p.qmax)), rows.to(torch.int32)
    m = torch.as_tensor(spec.multiplier).to(torch.int64).expand(k)
    s = torch.as_tensor(spec.shift).to(torch.int64).expand(k)
    b = torch.as_tensor(0 if spec.bias is None else spec.bias).to(torch.int64).expand(k)
    cb = b + (torch.ones_like(s) << (s - 1))
    kind, words = _formula_kind(m, cb, s, acc_bound)
    if kind == KIND_FORMULA_SPLIT:
        hi, lo = cb >> s, cb & ((torch.ones_like(s) << s) - 1)
        words = torch.stack([m, s, hi & 0xFFFFFFFF, hi >> 32, lo & 0xFFFFFFFF, lo >> 32], 1)
    rows[:, :words.shape[1]] = words
    rows = torch.where(rows >= 2**31, rows - 2**32, rows)
    return WsOutput(kind, lay, p.bits, spec.low, spec.high), rows.to(torch.int32)


def ws_epilogue(specs: Sequence[object], outs: Sequence[object], k: int, acc_bound: int = 2**31
                ) -> tuple[tuple[WsOutput, ...], torch.Tensor]:
    """The outputs' compile-time values and their constants int32 [MAX_OUTPUTS, K rounded up
    to 64, EPI_WORDS] for pooled values y + bias of |y + bias| <= acc_bound (ValueError:
    `ws_output_refusal`)."""
    kpad = -(-k // KBLOCK) * KBLOCK
    table = torch.zeros(MAX_OUTPUTS, kpad, EPI_WORDS, dtype=torch.int32)
    kinds = []
    for i, (spec, out) in enumerate(zip(specs, outs, strict=True)):
        why = ws_output_refusal(i, spec, out.layout if isinstance(out, PackedTensor) else None,
                                k)
        if why is not None:
            raise ValueError(f"the warp-specialized stem cannot write {why}")
        kind, rows = _epilogue_rows(i, as_output_spec(i, spec), out.layout, k, acc_bound)
        table[i, :k] = rows
        kinds.append(kind)
    return tuple(kinds), table


def ws_n_tiles(geom: StemGeometry) -> int:
    """n-tiles per consumer warp: the fewest whose tile (4 (4 n - 1) pooled columns) covers the
    pooled width, at most 4 (wider images split into column blocks)."""
    return next((n for n in (1, 2, 3) if 4 * (4 * n - 1) >= geom.PW), 4)


def ws_band_rows(geom: StemGeometry, n_tiles: int, ctas: int) -> int:
    """The band (pooled rows per tile) of least predicted time: tiles run in rounds of `ctas`,
    a band of r rows costs r + 1 steps and ~1 step of ring fill; the longest on ties."""
    col_blocks = -(-geom.PW // (4 * (4 * n_tiles - 1)))

    def cost(rows: int) -> tuple[int, int]:
        tiles = geom.N * col_blocks * -(-geom.PH // rows)
        return -(-tiles // ctas) * (rows + 2), -rows

    return min(range(1, geom.PH + 1), key=cost)


# =========================================================================== arguments
def _acc_bound(weight: torch.Tensor, bias: torch.Tensor | None, prec: Precision) -> int:
    """The largest |conv + bias| of any channel: sum |w| times the image's largest |value|
    plus |bias| (an int32 sum in the kernel: at most 2^31)."""
    w = weight.to(torch.int64).cpu().abs().reshape(weight.shape[0], -1).sum(1)
    b = torch.zeros_like(w) if bias is None else bias.to(torch.int64).cpu().abs()
    top = max(abs(int(prec.qmin)), abs(int(prec.qmax)))
    return min(int((w * top + b).max()), 2**31)


def ws_arguments(image: torch.Tensor, table: torch.Tensor | None, weight: torch.Tensor,
                 bias: torch.Tensor | None, specs: Sequence[object], outs: Sequence[object],
                 geom: StemGeometry, prec: Precision, scale: float,
                 status: torch.Tensor | None, ctas: int, band_rows: int | None = None
                 ) -> tuple[WsShape, tuple, tuple[int, int]]:
    """(shape, kernel arguments in `stem_ws`'s order, grid) for checked inputs on one device
    (`kernels.triton.stem.bind_stem` checks them; ValueError where `ws_refusal` or
    `ws_output_refusal` refuses): table int8 [C, 256] for a uint8 image, bias int32 [K] or
    None, `ctas` the persistent grid's most CTAs, band_rows None: `ws_band_rows`."""
    why = ws_refusal(geom)
    if why is not None:
        raise ValueError(f"the warp-specialized stem cannot run this layer: {why}")
    device = image.device
    kinds, epi = ws_epilogue(specs, outs, geom.K, _acc_bound(weight, bias, prec))
    kpad = epi.shape[1]
    nt = ws_n_tiles(geom)
    rows = band_rows or ws_band_rows(geom, nt, ctas)
    col_blocks = -(-geom.PW // (4 * (4 * nt - 1)))
    bands = -(-geom.PH // rows)
    tiles = geom.N * bands * col_blocks
    is_u8 = image.dtype == torch.uint8
    s32 = float(torch.tensor(scale, dtype=torch.float32))
    shape = WsShape(C=geom.C, PS=-geom.a_min, PP=geom.pool_pad, NT_W=nt, U8_INPUT=is_u8,
                    HAS_STATUS=status is not None and not is_u8, QMIN=int(prec.qmin),
                    QMAX=int(prec.qmax), outputs=kinds,
                    DIV_QUANT=not is_u8 and not THRESHOLD_SCALES[0] <= s32
                    <= THRESHOLD_SCALES[1])
    table = (table.to(torch.int8).contiguous() if is_u8
             else float_thresholds(s32, prec).to(device))
    bias_pad = torch.zeros(kpad, dtype=torch.int32)
    if bias is not None:
        bias_pad[:geom.K] = bias.to(torch.int32).cpu()
    w = ws_weights(weight, geom).to(device)
    placeholder = w
    datas = [o.data for o in outs] + [placeholder] * (MAX_OUTPUTS - len(outs))
    args = (image, table, w, epi.to(device), bias_pad.to(device),
            *datas, status if status is not None else placeholder, geom.N, geom.H, geom.W,
            *image.stride(), float(scale), geom.OH, geom.OW, geom.PH, geom.PW, geom.K, bands,
            rows, col_blocks, tiles)
    return shape, args, (max(1, min(tiles, ctas)), kpad // KBLOCK)


def smem_bytes(shape: WsShape) -> int:
    """The kernel's shared memory (stem_ws_common.cu's layout)."""
    xs = 2 * 4 * (4 * shape.NT_W - 1) + 5
    row = -(-xs * 4 * shape.C // 16) * 16
    table = -(-shape.C * 256 // 16) * 16 if shape.U8_INPUT else 256 * 16
    return shape.NSLOT * 2 * row + MAX_OUTPUTS * KBLOCK * EPI_WORDS * 4 + KBLOCK * 4 + table \
        + 2 * shape.NSLOT * 8 + shape.NT_W * 4 * (THREADS - 128) * 4


class WsKernelFn:
    """The compiled kernel as a Triton-style launch target (`igemm.Launch.fn`):
    fn[grid](*args) launches it, fn.warmup compiles it."""

    def __init__(self, shape: WsShape) -> None:
        self.shape = shape
        self.source = render(shape)
        self.smem = smem_bytes(shape)

    def kernel(self) -> nvrtc.CudaKernel:
        return nvrtc.load_kernel(self.source, KERNEL_NAME)

    def __getitem__(self, grid: tuple[int, int]):
        def launch(*args, **_: object) -> None:
            self.kernel().launch(grid, THREADS, args, shared_mem=self.smem)
        return launch

    def warmup(self, *args, grid: tuple[int, int], **_: object) -> nvrtc.CudaKernel:
        return self.kernel()


def bind_ws_stem(image: torch.Tensor, table: torch.Tensor | None, weight: torch.Tensor,
                 bias: torch.Tensor | None, specs: Sequence[object], outs: Sequence[object],
                 geom: StemGeometry, prec: Precision, scale: float,
                 status: torch.Tensor | None, sms: int = TARGET.sms,
                 band_rows: int | None = None):
    """The kernel's launch (`igemm.Launch`) for checked inputs on a CUDA device
    (`ws_arguments`); compiled on the first call."""
    from ..triton.igemm import Launch

    shape, args, grid = ws_arguments(image, table, weight, bias, specs, outs, geom, prec,
                                     scale, status, sms, band_rows)
    return Launch(WsKernelFn(shape), grid, args, {})
