"""Bit-serial (APNN-TC) conv2d and GEMM on 1-bit tensor cores (mma.sync m16n8k256 b1 AND).

Operands are in `Layout.BITPLANE` (`core/layout.py`): activations x [a_bits, N, H, W, ceil(C/32)]
(GEMM: [a_bits, M, ceil(K/32)]), weights w [w_bits, K, R, S, ceil(C/32)] (GEMM: [w_bits, N,
ceil(K/32)]), int32 words. A GEMM runs as the conv with H = W = R = S = 1. Every encoding pair is
rewritten onto AND-popcounts (`lowbit.reference.bitserial`); padded pixels contribute nothing
(input-aware padding). The fused epilogue gives int32, fp16, or requantized output in the INT8
or BITPLANE layout (bit planes packed in registers so the next layer reads them directly).

Knobs (the CUDA template parameters): BM x BN block tile (output rows x columns), WM x WN warp
tile, KT k256 steps per pipeline stage, STAGES cp.async stages, PERSIST (0: one tile per block;
1: one wave of persistent blocks whose copy pipeline runs across tiles, hiding the load latency
of short reductions such as 3x3 convs on 64 channels).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

import torch

from ...core import Config, ConfigSpace, ConvWorkload, Encoding, Knob, Layout, Workload
from ...core.epilogue import OUT_FP16, EpilogueParams
from ...core.validate import check_inputs, output_buffer
from ...reference.bitserial import plane_coefficients
from ..base import KernelTemplate
from .nvrtc import CudaKernel, compile_cubin, device_arch

MAX_BITS = 4          # per operand; wider precisions belong to the int8 path
MAX_ACC_REGS = 160    # int32 accumulators per thread (p*q plane pairs share the register file)
OTHER_REGS = 48       # registers besides the accumulators (fragments, addresses), estimated
REGISTER_FILE = 65536  # 32-bit registers per SM (sm_80, sm_90)
MAX_SMEM = 160 * 1024  # bytes of dynamic shared memory a config may use (sm_80: 163 KB)
MAX_COPY_ITERS = 16   # copy chunks per thread per stage (row index registers)
GRID_Y_MAX = 65535


@cache
def _cu(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


def kernel_source_body(persistent: bool) -> str:
    """Shared helpers + the one-tile-per-block or the persistent kernel."""
    return _cu("bitserial_common.cu") + _cu(
        "bitserial_persistent.cu" if persistent else "bitserial.cu")


@dataclass(frozen=True)
class Shape:
    """The conv view of a workload: GEMMs are 1x1 convs on 1x1 images."""

    nb: int
    h: int
    w: int
    c: int
    kout: int
    r: int
    s: int
    stride: int
    pad: int
    p: int
    q: int

    @property
    def words(self) -> int:
        return -(-self.c // 32)

    @property
    def rows(self) -> int:
        return self.nb * self.p * self.q

    @property
    def k_words(self) -> int:
        return self.r * self.s * self.words


def conv_shape(wl: Workload) -> Shape:
    if isinstance(wl, ConvWorkload):
        return Shape(wl.N, wl.H, wl.W, wl.C, wl.K, wl.R, wl.S, wl.stride, wl.pad, wl.P, wl.Q)
    m, n, k = wl.gemm_shape
    return Shape(m, 1, 1, k, n, 1, 1, 1, 0, 1, 1)


def copy_vec(shape: Shape) -> int:
    """Words per cp.async chunk: 16-byte copies when the channel words of a tap allow it."""
    return next(v for v in (4, 2, 1) if shape.words % v == 0)


def _out_mode(wl: Workload) -> int:
    epi = wl.epilogue
    if epi.requantizes:
        return 3 if epi.out_layout is Layout.BITPLANE else 2
    return 1 if epi.out == OUT_FP16 else 0


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def render(wl: Workload, config: Config) -> str:
    """CUDA source for (workload, config): constexpr parameters + the bitserial.cu body."""
    sh = conv_shape(wl)
    aa, ba, _ = plane_coefficients(wl.a)
    ab, bb, _ = plane_coefficients(wl.w)
    epi = wl.epilogue
    out = epi.out if epi.requantizes else None
    params = {
        "Q_BITS": wl.a.bits, "P_BITS": wl.w.bits,
        "A_SIGNED": int(wl.a.encoding is Encoding.SIGNED),
        "W_SIGNED": int(wl.w.encoding is Encoding.SIGNED),
        "A_ALPHA": aa, "A_BETA": ba, "W_ALPHA": ab, "W_BETA": bb,
        "NB": sh.nb, "H": sh.h, "W": sh.w, "C": sh.c, "CW": sh.words, "KOUT": sh.kout,
        "R": sh.r, "S": sh.s, "STRIDE": sh.stride, "PAD": sh.pad, "P_OUT": sh.p, "Q_OUT": sh.q,
        "BM": config["BM"], "BN": config["BN"], "WM": config["WM"], "WN": config["WN"],
        "KT": config["KT"], "STAGES": config["STAGES"], "PERSIST": config["PERSIST"],
        "VEC": copy_vec(sh),
        "HAS_BIAS": int(epi.bias), "RELU": int(epi.relu), "OUT_MODE": _out_mode(wl),
        "OUT_BITS": out.bits if out else 1, "OUT_QMIN": out.qmin if out else 0,
        "OUT_QMAX": out.qmax if out else 0,
    }
    lines = [f"// lowbit bit-serial kernel for {wl.key}", f"// config {config.to_json()}"]
    lines += [f"constexpr int {k} = {int(v)};" for k, v in params.items()]
    lines.append(f"constexpr long long M_ROWS = {sh.rows}ll;")
    return "\n".join(lines) + "\n" + kernel_source_body(bool(config["PERSIST"]))


def smem_bytes(wl: Workload, config: Mapping) -> int:
    """Dynamic shared memory of a config: STAGES x (a_bits*BM + w_bits*BN) rows x KT*32 bytes."""
    rows = wl.a.bits * config["BM"] + wl.w.bits * config["BN"]
    operands = config["STAGES"] * rows * config["KT"] * 32
    epi = wl.epilogue
    if epi.requantizes and epi.out_layout is Layout.BITPLANE and config["WN"] % 32:
        packing = epi.out.bits * config["BM"] * config["BN"] // 8
        # the persistent kernel keeps its packing tile apart: the next tiles' copies are in flight
        return operands + packing if config["PERSIST"] else max(operands, packing)
    return operands


def acc_regs(wl: Workload, config: Mapping) -> int:
    """int32 accumulator registers per thread (plane pairs + row sums for binary weights)."""
    tiles = (config["WM"] // 16) * (config["WN"] // 8) * 4
    extra = (config["WM"] // 16) * 4 * wl.a.bits if wl.w.encoding is Encoding.BINARY else 0
    return tiles * wl.a.bits * wl.w.bits + extra


class BitserialKernel:
    """Compiled bit-serial kernel for one (workload, config); call as kernel(x, w, params)."""

    def __init__(self, workload: Workload, config: Config, arch: str | None = None) -> None:
        self.workload = workload
        self.config = config
        self.source = render(workload, config)
        self.arch = arch or device_arch()
        cubin = compile_cubin(self.source, self.arch)
        self._persistent = bool(config["PERSIST"])
        self._main = CudaKernel(cubin, "bitserial_persistent" if self._persistent
                                else "bitserial_kernel")
        self._wtap = CudaKernel(cubin, "bitserial_wtap")
        sh = conv_shape(workload)
        self._shape = sh
        self._grid = (math.ceil(sh.kout / config["BN"]), math.ceil(sh.rows / config["BM"]))
        self._tiles = self._grid[0] * self._grid[1]
        self._threads = (config["BM"] // config["WM"]) * (config["BN"] // config["WN"]) * 32
        self._smem = smem_bytes(workload, config)
        self._needs_wtap = workload.a.encoding is Encoding.BINARY

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """Validate, then launch; `out` (optional) is a preallocated contiguous output buffer."""
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        """Validate once and return a no-argument launcher (CUDA-graph capture, timing):
        `check_inputs` reads the epilogue vectors, which syncs the device."""
        wl = self.workload
        check_inputs(wl, x, w, params)
        if x.device.type != "cuda":
            raise ValueError(f"x must be a CUDA tensor for {wl.key}, got device {x.device}")
        for name, t in (("x", x), ("w", w)):
            if t.data_ptr() % 16:
                raise ValueError(f"{name} must start at a 16-byte aligned address")
        out = output_buffer(wl, x.device, out)
        sh = self._shape
        wtap = None
        if self._needs_wtap:
            wtap = torch.empty(sh.kout * (sh.r + 1) * (sh.s + 1), dtype=torch.int32,
                               device=x.device)
        args = [x, w, out, params.bias, params.scale, params.multiplier, params.shift, wtap]
        grid: tuple[int, ...] = self._grid
        if self._persistent:  # one wave of resident blocks, each looping over tiles
            per_sm = self._main.max_active_blocks(self._threads, self._smem, x.device)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            grid = (max(1, min(self._tiles, per_sm * sms)),)

        def launch() -> torch.Tensor:
            if wtap is not None:
                self._wtap.launch(math.ceil(sh.kout / 4), 128, [w, wtap])  # a warp per column
            self._main.launch(grid, self._threads, args, shared_mem=self._smem)
            return out

        return launch


def _constraints(wl: Workload) -> list:
    sh = conv_shape(wl)
    bitplane_out = wl.epilogue.requantizes and wl.epilogue.out_layout is Layout.BITPLANE
    vec = copy_vec(sh)

    def tiles(c: Config) -> str | None:
        if c["BM"] % c["WM"] or c["BN"] % c["WN"]:
            return "block tile must be a multiple of the warp tile"
        warps = (c["BM"] // c["WM"]) * (c["BN"] // c["WN"])
        if not 1 <= warps <= 16:
            return f"{warps} warps per block (1..16 allowed)"
        return None

    def registers(c: Config) -> str | None:
        n = acc_regs(wl, c)
        if n > MAX_ACC_REGS:
            return f"{n} accumulator registers > {MAX_ACC_REGS}"
        threads = (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]) * 32
        if threads * (n + OTHER_REGS) > REGISTER_FILE:
            return f"{threads} threads x {n + OTHER_REGS} registers exceed the register file"
        return None

    def shared(c: Config) -> str | None:
        n = smem_bytes(wl, c)
        return f"{n} bytes of shared memory > {MAX_SMEM}" if n > MAX_SMEM else None

    def copies(c: Config) -> str | None:
        threads = (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]) * 32
        iters = -(-c["BM"] * c["KT"] * 8 // vec // threads)
        return f"{iters} copy chunks per thread" if iters > MAX_COPY_ITERS else None

    def output(c: Config) -> str | None:
        if bitplane_out and c["BN"] % 32:
            return "bit-plane output packs 32-column words per block: BN must be a multiple of 32"
        return None

    def waste(c: Config) -> str | None:
        if c["BN"] > max(32, _pow2_ceil(sh.kout)):
            return f"BN={c['BN']} wider than the {sh.kout} output columns"
        if c["BM"] > max(32, _pow2_ceil(sh.rows)):
            return f"BM={c['BM']} taller than the {sh.rows} output rows"
        if -(-sh.rows // c["BM"]) > GRID_Y_MAX:
            return "too many row tiles for grid.y"
        return None

    return [tiles, registers, shared, copies, output, waste]


# Preferred defaults, best first (APNN-TC-like: big warp tiles for small p*q, smaller for larger).
_DEFAULTS = [
    dict(BM=128, BN=128, WM=64, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=128, BN=64, WM=32, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=64, BN=64, WM=32, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=64, BN=64, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=64, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=32, WM=16, WN=32, KT=2, STAGES=3, PERSIST=0),
    dict(BM=32, BN=32, WM=16, WN=16, KT=1, STAGES=2, PERSIST=0),
    dict(BM=16, BN=32, WM=16, WN=32, KT=1, STAGES=2, PERSIST=0),
    dict(BM=16, BN=16, WM=16, WN=16, KT=1, STAGES=2, PERSIST=0),
]


class BitserialTemplate(KernelTemplate):
    """APNN-TC bit-serial conv2d/GEMM for bit-plane operands of 1..4 bits, any encoding."""

    name = "cuda.bitserial"
    backend = "cuda"

    def unsupported_reason(self, workload: Workload) -> str | None:
        wl = workload
        if wl.a_layout is not Layout.BITPLANE or wl.w_layout is not Layout.BITPLANE:
            return "operands must be in the bitplane layout"
        if wl.a.bits > MAX_BITS or wl.w.bits > MAX_BITS:
            return f"bit-serial supports 1..{MAX_BITS} bits per operand (wider: int8 path)"
        epi = wl.epilogue
        if epi.requantizes and epi.out_layout is Layout.PACKED:
            return "requantized output must be in the int8 or bitplane layout, not packed"
        sh = conv_shape(wl)
        if sh.rows >= 2**31 or sh.kout * sh.k_words >= 2**31:
            return "problem too large for 32-bit row indices"
        return None

    def space(self, workload: Workload) -> ConfigSpace:
        self.check_supported(workload)
        knobs = [Knob("BM", (16, 32, 64, 128, 256)), Knob("BN", (16, 32, 64, 128, 256)),
                 Knob("WM", (16, 32, 64)), Knob("WN", (16, 32, 64)),
                 Knob("KT", (1, 2, 4, 8)), Knob("STAGES", (2, 3, 4)), Knob("PERSIST", (0, 1))]
        return ConfigSpace(knobs, _constraints(workload))

    def default_config(self, workload: Workload) -> Config:
        space = self.space(workload)
        for d in _DEFAULTS:  # defaults keep the accumulators well inside the register file
            if space.is_valid(Config(d)) and acc_regs(workload, d) <= 128:
                return Config(d)
        return space.all_configs()[0]

    def build(self, workload: Workload, config: Config, arch: str | None = None) -> BitserialKernel:
        """Compile for `arch` (default: the current device's); ValueError on an invalid config."""
        return BitserialKernel(workload, self.checked_config(workload, config), arch)


BITSERIAL = BitserialTemplate()

__all__ = ["BITSERIAL", "BitserialKernel", "BitserialTemplate", "render"]
