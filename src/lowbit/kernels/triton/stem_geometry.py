"""Shapes of the fused first layer (`stem`): the geometry of a conv on at most a few channels
with its optional 3x3/2 max-pool, the space-to-depth view of it the stem kernels run (the
S x S image blocks of a stride-S conv as pixels of S*S*C channels, the R x R filter as an
RS x RS one on them), the launch knobs of the stem kernels (`StemConfig`), and what their
launches read of both: the compile-time geometry of the conv kernels (`conv_constexprs`) and
of the image quantizer (`quant_constexprs`), the column blocks of a row (`column_blocks`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ...core import Precision
from ...reference.netops import pool_output_size
from .igemm import cdiv
from .stored import ENC

__all__ = ["BLOCK_J", "BLOCK_N", "CHUNK_BYTES", "PIXEL_ALIGN", "STEM_KERNELS", "ConvConstexprs",
           "QuantConstexprs", "StemConfig", "StemGeometry", "column_blocks", "conv_constexprs",
           "geometry_of", "quant_constexprs", "s2d_weights"]

#: reduction bytes per dot chunk, and the alignment of a space-to-depth pixel
CHUNK_BYTES = 64
PIXEL_ALIGN = 16
#: conv kernels a StemConfig names
STEM_KERNELS = ("bands", "gemm", "ring", "ws")
#: output columns and channels per dot (defaults)
BLOCK_J = 64
BLOCK_N = 64


# =========================================================================== geometry
@dataclass(frozen=True)
class StemGeometry:
    """Shapes of one first layer: image [N, C, H, W], filter [K, R, R, C], stride, pad, and
    pool_pad (the 3x3 stride-2 max-pool's padding, 0 or 1; None: no pool)."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    stride: int
    pad: int
    pool_pad: int | None = 1

    def __post_init__(self) -> None:
        for name in ("N", "C", "H", "W", "K", "R", "stride"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if isinstance(self.pad, bool) or not isinstance(self.pad, int) or self.pad < 0:
            raise ValueError(f"pad must be an int >= 0, got {self.pad!r}")
        if self.pool_pad not in (None, 0, 1):
            raise ValueError(f"pool_pad must be None (no pool), 0 or 1, got {self.pool_pad!r}")
        if self.OH < 1 or self.OW < 1:
            raise ValueError(f"a {self.R}x{self.R} filter does not fit the {self.H}x{self.W} "
                             "image")
        if self.pool_pad is not None and (self.PH < 1 or self.PW < 1):
            raise ValueError(f"the 3x3 pool does not fit the {self.OH}x{self.OW} conv output")

    # conv and pool output
    @property
    def OH(self) -> int:
        return (self.H + 2 * self.pad - self.R) // self.stride + 1

    @property
    def OW(self) -> int:
        return (self.W + 2 * self.pad - self.R) // self.stride + 1

    @property
    def PH(self) -> int:
        return self.OH if self.pool_pad is None else pool_output_size(self.OH, 3, 2,
                                                                       self.pool_pad)

    @property
    def PW(self) -> int:
        return self.OW if self.pool_pad is None else pool_output_size(self.OW, 3, 2,
                                                                       self.pool_pad)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """Logical NHWC shape of each output."""
        return (self.N, self.PH, self.PW, self.K)

    # space-to-depth by the stride: filter offset r - pad = stride * a + d, d in [0, stride)
    @property
    def a_min(self) -> int:
        return (-self.pad) // self.stride

    @property
    def RS(self) -> int:
        """Space-to-depth filter size."""
        return (self.R - 1 - self.pad) // self.stride - self.a_min + 1

    @property
    def CSP(self) -> int:
        """Bytes per space-to-depth pixel: stride^2 * C channels padded to 16 (so each
        filter row's RS pixels are 16-byte vectors)."""
        return -(-self.stride * self.stride * self.C // PIXEL_ALIGN) * PIXEL_ALIGN

    @property
    def HS(self) -> int:
        return self.OH + self.RS - 1

    @property
    def WS(self) -> int:
        return self.OW + self.RS - 1

    @property
    def KB(self) -> int:
        """Reduction bytes of the space-to-depth conv: RS filter rows of RS * CSP bytes."""
        return self.RS * self.RS * self.CSP

    @property
    def chunks(self) -> int:
        return -(-self.KB // CHUNK_BYTES)

    @property
    def macs(self) -> int:
        """Multiply-adds of the conv (its own definition, padding taps included)."""
        return self.N * self.OH * self.OW * self.K * self.R * self.R * self.C


def s2d_weights(weight: torch.Tensor, geom: StemGeometry) -> torch.Tensor:
    """KRSC integer weights -> int8 [K, chunks * 64] in the space-to-depth reduction order
    (filter row a, column b, channel (d, e, c), padded to the pixel's bytes and to chunks;
    zero where the space-to-depth filter has no tap)."""
    s, c = geom.stride, geom.C
    rs = geom.RS
    out = torch.zeros(geom.K, rs, rs, geom.CSP, dtype=torch.int8)
    w = weight.to(torch.int8).cpu()
    for a in range(rs):
        for d in range(s):
            r = s * (a + geom.a_min) + d + geom.pad
            if not 0 <= r < geom.R:
                continue
            for b in range(rs):
                for e in range(s):
                    col = s * (b + geom.a_min) + e + geom.pad
                    if 0 <= col < geom.R:
                        out[:, a, b, (d * s + e) * c:(d * s + e + 1) * c] = w[:, r, col, :]
    flat = out.reshape(geom.K, -1)
    return torch.nn.functional.pad(flat, (0, geom.chunks * CHUNK_BYTES - flat.shape[1]))


def geometry_of(image: torch.Tensor, weight: torch.Tensor, stride: int, pad: int,
                pool_pad: int | None) -> StemGeometry:
    n, c, h, w = image.shape
    if weight.shape[3] != c:
        raise ValueError(f"weight has C={weight.shape[3]} but the image has {c} channels")
    return StemGeometry(N=n, C=c, H=h, W=w, K=weight.shape[0], R=weight.shape[1],
                        stride=stride, pad=pad, pool_pad=pool_pad)


# =========================================================================== launch knobs
@dataclass(frozen=True)
class StemConfig:
    """Launch knobs. kernel: "ws" (`kernels.cuda.stem_ws`: one warp-specialized CUDA launch,
    band_rows its only knob; stride 2 with the pool, <= 3 channels, outputs by thresholds or
    the 64-bit formula), "ring" (`stem_ring`: one launch, the image quantized into a
    per-program ring; stride 2 with the pool only), "bands" (`stem_conv_kernel`: four dots of
    BLOCK_J rows per pooled row) or "gemm" (`stem_gemm.stem_gemm_kernel`: one dot of
    4 * block_j rows per pooled row, weights loaded once, loads pipelined by num_stages).
    band_rows: output rows per tile (with the pool each band computes one extra conv row
    pair); images: images stacked along the dots' M ("bands" only: 1 or 2); block_j: output
    columns per dot (pooled: block_j - 1 written per program, block_j - 2 with "ring");
    whole_k: one dot over the whole reduction where its bytes are a power of two, else dots
    of 64 ("bands" / "gemm"); block_n: channels per program (32 halves the registers, each
    program reads the window again); warps, pipeline stages ("ring" runs unpipelined);
    fast_requant: the float64 requantization where it is exact (`netops.requant_mode`);
    thresholds: outputs of 1-2 bits by integer thresholds instead; programs_per_sm ("ring"):
    the persistent grid's programs per SM; transposed ("ring"): the dot as weights x
    windows^T (False: windows x weights); late_loads ("ring"): each step loads the next
    step's image rows after its dot (False: before it, where the dot's operand fence may wait
    for them)."""

    band_rows: int = 4
    images: int = 1
    kernel: str = "bands"
    block_j: int = BLOCK_J
    whole_k: bool = False
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 1
    fast_requant: bool = True
    maxnreg: int | None = None
    thresholds: bool = True
    programs_per_sm: int = 2
    transposed: bool = True
    late_loads: bool = True

    def __post_init__(self) -> None:
        if self.kernel not in STEM_KERNELS:
            raise ValueError(f"kernel must be one of {STEM_KERNELS}, got {self.kernel!r}")
        if not isinstance(self.programs_per_sm, int) or not 1 <= self.programs_per_sm <= 8:
            raise ValueError(f"programs_per_sm must be an int in 1..8, got "
                             f"{self.programs_per_sm!r}")
        if self.images not in ((1, 2) if self.kernel == "bands" else (1,)):
            raise ValueError(f"images must be 1 or 2 (1 with kernel='gemm'), got "
                             f"{self.images!r}")
        if self.block_j not in (16, 32, 64):
            raise ValueError(f"block_j must be 16, 32 or 64, got {self.block_j!r}")
        if self.block_n not in (32, 64):
            raise ValueError(f"block_n must be 32 or 64, got {self.block_n!r}")
        if not isinstance(self.band_rows, int) or self.band_rows < 1:
            raise ValueError(f"band_rows must be an int >= 1, got {self.band_rows!r}")

    def launch_options(self, num_stages: int | None = None) -> dict:
        """Triton's launch options of a stem conv kernel: warps, pipeline stages (the
        config's unless given), no float contraction, the register cap where set."""
        opts: dict = dict(num_warps=self.num_warps, num_stages=num_stages or self.num_stages,
                          enable_fp_fusion=False)
        if self.maxnreg is not None:
            opts["maxnreg"] = self.maxnreg
        return opts


# =========================================================================== launch constexprs
class ConvConstexprs(NamedTuple):
    """The compile-time geometry of the "bands" and "gemm" conv kernels (their CONV, fields
    read by name): bytes per space-to-depth pixel, the space-to-depth filter size, the
    reduction's bytes and 64-byte chunks, one dot over the whole reduction, the pool and its
    padding, a bias."""

    CSP: int
    RS: int
    KB: int
    CHUNKS: int
    WHOLE_K: bool
    POOL: bool
    PP: int
    HAS_BIAS: bool


class QuantConstexprs(NamedTuple):
    """The compile-time values of the image quantizer (QUANT of `stem.stem_input_kernel` and
    `stem_ring.stem_ring_kernel`): channels, the space-to-depth padding in pixels (-a_min), a
    uint8 image (quantized by its table), the precision's encoding and range, the non-finite
    flag (a float image with a status tensor)."""

    C: int
    PS: int
    U8: bool
    ENC: int
    QMIN: int
    QMAX: int
    HAS_STATUS: bool


def conv_constexprs(geom: StemGeometry, whole_k: bool, has_bias: bool) -> ConvConstexprs:
    """CONV of a conv launch of `geom`: whole_k (`StemConfig.whole_k`) where the reduction is
    1, 2 or 4 chunks (a power of two of bytes)."""
    return ConvConstexprs(CSP=geom.CSP, RS=geom.RS, KB=geom.KB, CHUNKS=geom.chunks,
                          WHOLE_K=whole_k and geom.chunks in (1, 2, 4),
                          POOL=geom.pool_pad is not None, PP=geom.pool_pad or 0,
                          HAS_BIAS=has_bias)


def quant_constexprs(geom: StemGeometry, prec: Precision, is_u8: bool, has_status: bool
                     ) -> QuantConstexprs:
    """QUANT of the image quantizer of `geom` into `prec` (the status flag only for a float
    image)."""
    return QuantConstexprs(C=geom.C, PS=-geom.a_min, U8=is_u8, ENC=ENC[prec.encoding],
                           QMIN=prec.qmin, QMAX=prec.qmax, HAS_STATUS=has_status and not is_u8)


def column_blocks(geom: StemGeometry, block_j: int, kernel: str) -> int:
    """Blocks of block_j output columns a row of `geom` splits into for a `kernel` of
    `STEM_KERNELS`: "ring" (which always pools) writes block_j - 2 pooled columns a block;
    the others with the pool block_j - 1 (the last feeds its neighbour's window), without it
    block_j conv columns."""
    if kernel == "ring":
        return cdiv(geom.PW, block_j - 2)
    if geom.pool_pad is None:
        return cdiv(geom.OW, block_j)
    return cdiv(geom.PW, block_j - 1)
