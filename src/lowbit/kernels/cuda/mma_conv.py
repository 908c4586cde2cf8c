"""Tiled mma.sync implicit-GEMM convolution (Choi et al.'s schedule space), CUDA through NVRTC.

Two registered templates share one kernel body (`mma_conv.cu`):
- ``cuda.mma_conv_s8``: ``mma.sync m16n8k32`` on 8-bit storage (Layout.INT8 activations NHWC and
  weights KRSC, any precision up to 8 bits: signed/binary operands as s8, unsigned as u8);
- ``cuda.mma_conv_s4``: ``mma.sync m16n8k64`` on 4-bit dense-packed storage (Layout.PACKED,
  u4/s4). Native on sm_80..sm_89; Hopper emulates it (47 TOPS measured): the tuner learns that.
GEMM workloads run as 1x1 convolutions (a [M, K] = NHWC [1, 1, M, K], b [N, K] = KRSC).

Knobs (`MmaConvTemplate.knobs`, a table per variant): warps per block in M and N, MMA tiles per
warp, K chunk, loop order, duplicate-aware load and register-level output packing (see
`mma_conv.cu` for what the two techniques do in the kernel). Constraints: shared memory,
registers, threads per block, and tiles no larger than the workload needs.
Outputs: the fused epilogue of `lowbit.core.epilogue` (int32, fp16, requantized in Layout.INT8
or Layout.PACKED), bit-exact with `lowbit.reference.run` for integer outputs; fp16 outputs are
fp16(float32(y) * scale) with the same roundings as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ...core import (
    OUT_FP16,
    OUT_INT16,
    Config,
    ConfigSpace,
    ConvWorkload,
    Layout,
    Workload,
)
from ...core.epilogue import EpilogueParams
from ...core.hardware import TARGET
from ...core.knobs import KnobDef, KnobTable
from ...core.precision import Encoding
from ...core.validate import check_inputs, output_buffer
from ..base import KernelTemplate, grouped_reason, register
from ..geometry import Geometry, conv_taps
from . import nvrtc
from .cu_source import expand

KERNEL_NAME = "mma_conv"
#: the constants `render` defines before the kernel text (mma_conv.cu)
PRELUDE_NAMES = (
    "WARPS_M", "WARPS_N", "TILES_M", "TILES_N", "KB", "LOOP_CRS", "DUP", "REG_PACK",
    "MMA_S4", "A_SIGNED", "W_SIGNED", "VEC", "NIBBLE_TAIL",
    "NB", "H", "W", "CB", "K", "R", "S", "STRIDE", "PAD", "P", "Q", "TP", "TQ",
    "HAS_BIAS", "RELU", "OUT_KIND", "OUT_BITS", "QMIN", "QMAX",
)
SMEM_LIMIT = TARGET.smem_per_block  # dynamic shared memory per block (sm_80: 163 KiB)
MAX_REGS = TARGET.max_regs_per_thread
MAX_WARPS = 8
OUT_KINDS = {"int32": 0, "fp16": 1, "bytes": 2, "packed": 3}


@dataclass(frozen=True)
class Variant:
    """Instruction family: operand storage and the MMA instruction."""

    name: str
    bits: int          # bits per stored element
    layout: Layout
    mma: str

    def chunk_values(self) -> tuple[int, ...]:
        """K chunk candidates in elements: 32, 64 and 128 bytes of channels per stage."""
        return tuple(b * 8 // self.bits for b in (32, 64, 128))

    def chunk_bytes(self, k_chunk: int) -> int:
        return k_chunk * self.bits // 8


S8 = Variant("s8", 8, Layout.INT8, "mma.sync.m16n8k32.s8")
S4 = Variant("s4", 4, Layout.PACKED, "mma.sync.m16n8k64.s4")


@dataclass(frozen=True)
class ConvShape:
    """The convolution a workload is (GEMMs as 1x1 convs); CB = stored bytes per pixel row."""

    N: int
    H: int
    W: int
    C: int
    K: int
    R: int
    S: int
    stride: int
    pad: int
    P: int
    Q: int
    CB: int

    @property
    def M(self) -> int:
        return self.N * self.P * self.Q


def conv_shape(wl: Workload, variant: Variant) -> ConvShape:
    if isinstance(wl, ConvWorkload):
        dims = (wl.N, wl.H, wl.W, wl.C, wl.K, wl.R, wl.S, wl.stride, wl.pad, wl.P, wl.Q)
    else:
        m, n, k = wl.gemm_shape
        dims = (1, 1, m, k, n, 1, 1, 1, 0, 1, m)
    return ConvShape(*dims, CB=-(-dims[3] * variant.bits // 8))


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def block_tile(config: Config) -> tuple[int, int]:
    """(BM, BN): output pixels and filters of one block."""
    return (config["warps_m"] * config["tiles_m"] * 16, config["warps_n"] * config["tiles_n"] * 8)


def pixel_tile(shape: ConvShape, bm: int) -> tuple[int, int]:
    """(TP, TQ) output-pixel tile of BM = TP*TQ rows for the duplicate-aware load: the least
    wasted rows over the P x Q image, then the smallest halo."""
    best = None
    tq = 1
    while tq <= bm:
        tp = bm // tq
        waste = -(-shape.P // tp) * tp * -(-shape.Q // tq) * tq
        halo = ((tp - 1) * shape.stride + shape.R) * ((tq - 1) * shape.stride + shape.S)
        key = (waste, halo, tq)
        if best is None or key < best[0]:
            best = (key, (tp, tq))
        tq *= 2
    return best[1]


def out_kind(wl: Workload) -> int:
    epi = wl.epilogue
    if epi.requantizes:
        return OUT_KINDS["packed" if epi.out_layout is Layout.PACKED else "bytes"]
    return OUT_KINDS["fp16" if epi.out == OUT_FP16 else "int32"]


def smem_bytes(shape: ConvShape, config: Config, variant: Variant, kind: int) -> int:
    """Dynamic shared memory of one block: two pipeline stages (+ row table, + output tile)."""
    bm, bn = block_tile(config)
    kbp = variant.chunk_bytes(config["k_chunk"]) + 16
    if config["duplicate_aware_load"]:
        tp, tq = pixel_tile(shape, bm)
        a_rows, rowinfo = ((tp - 1) * shape.stride + shape.R) * ((tq - 1) * shape.stride
                                                                 + shape.S), 0
    else:
        a_rows, rowinfo = bm, 12 * bm
    pipe = rowinfo + 2 * (a_rows + bn) * kbp
    staged = bm * bn if kind == OUT_KINDS["packed"] and not config["register_packing"] else 0
    return max(pipe, staged)


def registers_estimate(config: Config) -> int:
    """Registers per thread: accumulators + A/B fragments + ~40 for addresses and indices."""
    tm, tn = config["tiles_m"], config["tiles_n"]
    return 4 * tm * tn + 4 * tm + 2 * tn + tm + 40


def _is_conv(wl: Workload) -> bool:
    return isinstance(wl, ConvWorkload)


def _packs_output(wl: Workload) -> bool:
    """A requantized output in bytes or packed sub-byte values: what register packing packs."""
    epi = wl.epilogue
    return epi.requantizes and epi.out_layout in (Layout.INT8, Layout.PACKED)


def mma_conv_knobs(variant: Variant) -> KnobTable:
    """The knobs of one variant's template (its K chunks are bytes of its elements)."""
    return KnobTable(
        KnobDef("warps_m", (1, 2, 4), "warps per block in M"),
        KnobDef("warps_n", (1, 2, 4), "warps per block in N"),
        KnobDef("tiles_m", (1, 2, 4, 8), "MMA tiles per warp in M (16 rows each)"),
        KnobDef("tiles_n", (1, 2, 4, 8), "MMA tiles per warp in N (8 columns each)"),
        KnobDef("k_chunk", variant.chunk_values(), "K elements per pipeline stage (32, 64 or "
                "128 bytes of channels)"),
        KnobDef("loop_order", ("rsc", "crs"), "'rsc': kernel position outer, channel chunks "
                "inner; 'crs': channel chunk outer"),
        KnobDef("duplicate_aware_load", (False, True), "the block's input rows plus halo "
                "loaded once, the taps' tiles read from there (convs)", applies=_is_conv),
        KnobDef("register_packing", (False, True), "requantized outputs packed in registers "
                "before the store", applies=_packs_output),
    )


class MmaConvTemplate(KernelTemplate):
    """Tiled mma.sync convolution/GEMM for one instruction variant (s8 or s4)."""

    backend = "cuda"

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self.name = f"cuda.mma_conv_{variant.name}"
        self.knobs = mma_conv_knobs(variant)

    def unsupported_reason(self, wl: Workload) -> str | None:
        v = self.variant
        if grouped_reason(wl):
            return grouped_reason(wl)
        for side, prec, layout in (("w", wl.w, wl.w_layout), ("a", wl.a, wl.a_layout)):
            if layout is not v.layout:
                return f"{side} must be stored in layout '{v.layout.value}', got '{layout.value}'"
            if v.layout is Layout.PACKED and prec.bits != v.bits:
                return f"{side} must have {v.bits} bits (packed), got {prec}"
        epi = wl.epilogue
        if epi.requantizes and epi.out_layout is Layout.BITPLANE:
            return "bit-plane output is written by the bit-serial templates, not this one"
        if epi.out == OUT_INT16:
            return "int16 output is written by the bit-serial templates: use int32"
        if epi.shifted_bias:
            return "the bias at the output's shift (Epilogue.shifted_bias) is not in this " \
                   "template's epilogue: bias in accumulator units only"
        shape = conv_shape(wl, v)
        if shape.N * shape.H * shape.W >= 2**31 or shape.M >= 2**31:
            return "more than 2^31 input or output pixels"
        return None

    def space(self, wl: Workload) -> ConfigSpace:
        self.check_supported(wl)
        shape, kind, v = conv_shape(wl, self.variant), out_kind(wl), self.variant

        def threads(c: Config) -> str | None:
            if c["warps_m"] * c["warps_n"] > MAX_WARPS:
                return f"more than {MAX_WARPS} warps per block"
            return None

        def registers(c: Config) -> str | None:
            regs = registers_estimate(c)
            if regs > MAX_REGS:
                return f"about {regs} registers per thread > {MAX_REGS}"
            if regs * c["warps_m"] * c["warps_n"] * 32 > TARGET.regs_per_sm:
                return f"about {regs} registers x {c['warps_m'] * c['warps_n']} warps > the SM's"
            return None

        def loop_order(c: Config) -> str | None:
            if c["duplicate_aware_load"] and c["loop_order"] != "crs":
                return "duplicate-aware load reuses a halo across (r, s): needs loop_order 'crs'"
            return None

        def shared(c: Config) -> str | None:
            need = smem_bytes(shape, c, v, kind)
            return f"{need} B shared memory > {SMEM_LIMIT}" if need > SMEM_LIMIT else None

        def fits(c: Config) -> str | None:
            bm, bn = block_tile(c)
            if bn > max(32, _next_pow2(shape.K)):
                return f"block N tile {bn} is larger than K={shape.K} needs"
            if bm > max(64, _next_pow2(shape.M)):
                return f"block M tile {bm} is larger than M={shape.M} needs"
            if v.chunk_bytes(c["k_chunk"]) > max(64, _next_pow2(shape.CB)):
                return f"K chunk {c['k_chunk']} is larger than C={shape.C} needs"
            return None

        return self.knobs.space(wl, [threads, registers, loop_order, fits, shared])

    def default_config(self, wl: Workload) -> Config:
        """2x2 warps of 2x2 MMA tiles (64 x 32 outputs), 64-byte K chunks, no techniques."""
        return Config(warps_m=2, warps_n=2, tiles_m=2, tiles_n=2,
                      k_chunk=self.variant.chunk_values()[1], loop_order="rsc",
                      duplicate_aware_load=False, register_packing=False)

    def geometry(self, wl: Workload, config: Mapping) -> Geometry:
        """warps_m x warps_n warps of tiles_m x tiles_n 16 x 16 MMA tiles, k_chunk channels of
        a tap a step, two stages; s4 operands stage half a byte an element."""
        c = config
        m, n, k = wl.gemm_shape
        wm_, wn_ = int(c["warps_m"]), int(c["warps_n"])
        bm, bn = wm_ * int(c.get("tiles_m", 1)) * 16, wn_ * int(c.get("tiles_n", 1)) * 16
        bk = int(c.get("k_chunk", 32))
        four = self.variant.bits == 4
        taps, chans = conv_taps(wl)
        steps = taps * math.ceil(chans / bk)
        elem = 0.5 if four else 1.0
        return Geometry("mma_conv", "int4_mma_sync" if four else "int8_mma_sync", m, n, k, bm,
                        bn, math.ceil(m / bm) * bm, math.ceil(m / bm) * math.ceil(n / bn), 1, bk,
                        steps, 32 * wm_ * wn_, 2, int(2 * (bm + bn) * bk * elem),
                        min(255, bm * bn // (32 * wm_ * wn_) + 48), False, 1, elem)

    def build(self, wl: Workload, config: Config) -> MmaConvKernel:
        config = self.checked_config(wl, config)
        kernel = MmaConvKernel(self, wl, config)
        if torch.cuda.is_available():
            kernel.compile(nvrtc.device_arch())
        return kernel


def vector_bytes(shape: ConvShape, variant: Variant) -> int:
    """Widest global->shared copy (16, 4 or 1 bytes) that never straddles a pixel row's end."""
    if variant.bits == 4 and shape.C % 2:
        return 1  # the padding nibble of each row must be masked byte by byte
    for vec in (16, 4):
        if shape.CB % vec == 0:
            return vec
    return 1


def render(wl: Workload, config: Config, variant: Variant, vec: int | None = None,
           supplied: dict[str, str] | None = None) -> str:
    """CUDA source of one (workload, config): knob and shape constants + mma_conv.cu expanded
    (``supplied``: files in place of the package's; the host emulation swaps the device
    primitives, see `mma_conv_emu`)."""
    shape = conv_shape(wl, variant)
    bm, _ = block_tile(config)
    tp, tq = pixel_tile(shape, bm)
    epi = wl.epilogue
    kind = out_kind(wl)
    values = {
        "WARPS_M": config["warps_m"], "WARPS_N": config["warps_n"],
        "TILES_M": config["tiles_m"], "TILES_N": config["tiles_n"],
        "KB": variant.chunk_bytes(config["k_chunk"]),
        "LOOP_CRS": int(config["loop_order"] == "crs"),
        "DUP": int(bool(config["duplicate_aware_load"])),
        "REG_PACK": int(bool(config["register_packing"])),
        "MMA_S4": int(variant.bits == 4),
        "A_SIGNED": int(wl.a.encoding is not Encoding.UNSIGNED),
        "W_SIGNED": int(wl.w.encoding is not Encoding.UNSIGNED),
        "VEC": vector_bytes(shape, variant) if vec is None else vec,
        "NIBBLE_TAIL": int(variant.bits == 4 and shape.C % 2 == 1),
        "NB": shape.N, "H": shape.H, "W": shape.W, "CB": shape.CB, "K": shape.K,
        "R": shape.R, "S": shape.S, "STRIDE": shape.stride, "PAD": shape.pad,
        "P": shape.P, "Q": shape.Q, "TP": tp, "TQ": tq,
        "HAS_BIAS": int(epi.bias), "RELU": int(epi.relu), "OUT_KIND": kind,
        "OUT_BITS": epi.out.bits if epi.requantizes else 8,
        "QMIN": epi.out.qmin if epi.requantizes else 0,
        "QMAX": epi.out.qmax if epi.requantizes else 0,
    }
    assert set(values) == set(PRELUDE_NAMES)
    # macros, not constexpr: the MMA instruction is chosen with #if
    prelude = "".join(f"#define {k} {int(v)}\n" for k, v in values.items())
    body = expand("mma_conv.cu", supplied)
    return f"// lowbit {variant.mma} conv, config {config.to_json()}\n{prelude}{body}"


class MmaConvKernel:
    """One compiled (workload, config): ``kernel(x, w, params) -> out``."""

    def __init__(self, template: MmaConvTemplate, wl: Workload, config: Config) -> None:
        self.template = template
        self.workload = wl
        self.config = config
        self.variant = template.variant
        self.shape = conv_shape(wl, self.variant)
        self.kind = out_kind(wl)
        self.vec = vector_bytes(self.shape, self.variant)
        self.source = render(wl, config, self.variant)
        self.smem = smem_bytes(self.shape, config, self.variant, self.kind)
        bm, bn = block_tile(config)
        s = self.shape
        if config["duplicate_aware_load"]:
            tp, tq = pixel_tile(s, bm)
            blocks_m = s.N * -(-s.P // tp) * -(-s.Q // tq)
        else:
            blocks_m = -(-s.M // bm)
        self.grid = (blocks_m, -(-s.K // bn))
        self.block = config["warps_m"] * config["warps_n"] * 32
        self._kernels: dict[tuple[str, int], nvrtc.CudaKernel] = {}

    def compile(self, arch: str, vec: int | None = None) -> bytes:
        """The cubin for ``arch`` (e.g. 'sm_80', 'sm_90a'); CompileError with the NVRTC log."""
        source = self.source if vec in (None, self.vec) else render(
            self.workload, self.config, self.variant, vec)
        return nvrtc.compile_cubin(source, arch)

    def _kernel(self, vec: int) -> nvrtc.CudaKernel:
        arch = nvrtc.device_arch()
        key = (arch, vec)
        if key not in self._kernels:
            source = self.source if vec == self.vec else render(
                self.workload, self.config, self.variant, vec)
            self._kernels[key] = nvrtc.load_kernel(source, KERNEL_NAME, arch)
        return self._kernels[key]

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """Run on PyTorch's current stream; writes into ``out`` when given (the output storage
        shape and dtype of `lowbit.core.validate.out_storage`, contiguous, on x's device)."""
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Validate once (`check_inputs` reads the epilogue vectors: a device sync) and return
        a no-argument launcher for these tensors (timing, CUDA-graph capture)."""
        wl = self.workload
        check_inputs(wl, x, w, params)
        if x.device.type != "cuda":
            raise ValueError(f"x must be on a CUDA device for {self.template.name}, "
                             f"got {x.device}")
        if torch.cuda.get_device_capability(x.device) < (8, 0):
            raise ValueError(f"{self.template.name} needs mma.sync (compute capability >= 8.0)")
        out = output_buffer(wl, x.device, out)
        return lambda: self.launch(x, w, params, out)

    def launch(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
               out: torch.Tensor) -> torch.Tensor:
        """The launch alone, no checks (timing loops, after one checked call on the same
        tensors): one kernel on PyTorch's current stream, no host-device synchronization."""
        # a view may start at any byte: fall back to byte copies rather than misaligned cp.async
        aligned = x.data_ptr() % self.vec == 0 and w.data_ptr() % self.vec == 0
        kernel = self._kernel(self.vec if aligned else 1)
        vecs = [params.bias, params.scale, params.multiplier, params.shift]
        args = [x, w, out, *(out if t is None else t for t in vecs)]
        with torch.cuda.device(x.device):
            kernel.launch(self.grid, self.block, args, shared_mem=self.smem)
        return out


S8_TEMPLATE = register(MmaConvTemplate(S8))
S4_TEMPLATE = register(MmaConvTemplate(S4))
