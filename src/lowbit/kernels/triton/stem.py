"""The first layer of a CNN on the GPU: float (fp32 / fp16 / bf16) or uint8 image (NCHW
shape, NCHW or channels_last memory) -> quantized input -> R x R stride-S conv on C channels
(int8 tensor cores, exact int32 accumulation) -> bias, ReLU, requantization into one or more
outputs -> 3x3 stride-2 max-pool -> the next layer's layouts (INT8 NHWC or BITPLANE).

Semantics (oracle, bit for bit): `reference.quantize_float` (or, for a uint8 image,
`reference.quantize_uint8_image`: the lookup `table[c, pixel]`, the table from
`reference.uint8_input_table`), `reference.accumulate` (conv2d_int),
`reference.epilogue_outputs`, then `reference.maxpool2d_int` on each output (pooling the int32
accumulators first is the same: bias, ReLU and requantization are monotone per channel, and
so is a derived output whose table rises over its formula's values; one whose table falls is
refused with the pool).

`bind_stem` is the one entry point; `default_config` picks the kernel by shape, two launches
each (`StemConfig(kernel="ring")`, `stem_ring`, runs ResNet's 7x7/2 + pool in one launch: each
program quantizes its image rows once into a small on-chip ring of space-to-depth rows and runs
the conv from it, no quantized image in DRAM; measured slower than "bands", NOTES.md "Stem"):
  1. `stem_input_kernel` quantizes each image value once (IEEE division, `div_rn`, as on the
     CPU) into a space-to-depth int8 tensor: S x S blocks of pixels become one pixel of
     S*S*C channels ([N, HS, WS, CSP], zero padding written in), so the stride-S R x R conv
     becomes a stride-1 RS x RS conv whose every filter row reads RS*CSP contiguous bytes;
  2. `stem_conv_kernel` ("bands"): per program, one image, a band of output rows and 64
     channels. The conv runs as int8 dots of 64 output columns x 64 channels (K chunks of 64
     bytes, zero weights where the space-to-depth filter has no tap). With the pool, each
     step computes the two new conv rows of one pooled row at the pool windows' first and
     second columns (2j - pad and 2j - pad + 1), keeps the second row for the next step (the
     windows' shared row), and takes the third column from the neighbour window (a gather
     along the 64 columns); then the epilogue runs on the pooled int32 values only.
     `StemConfig(kernel="gemm")` runs the same work as one dot of 4 * block_j rows per pooled
     row instead (`stem_gemm`).

Exactness: int8 x int8 products summed in int32 (|sum| <= K_red * 128 * 128, checked), bias
and requantization as `netops.emit_output` (|acc + bias| < 2^31 - 1 checked at bind; each
output's bias at its shift and its exact mode from `netops.requant_mode`), outputs of 1-2
bits by the integer thresholds of `reference.requant_thresholds` (exact: requantization is
monotone; a derived one's at the steps of its table), wider derived outputs by the formula in
mid and a lookup in their table (`stem_gemm.stem_slot`). AlexNet's 11x11 stride-4 first
layer runs too (space-to-depth by 4, with or without its 3x3/2 pool with pad 0), at a lower
useful fraction of the dots (363 of 768 products).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ...core import Encoding, Layout, PackedTensor, Precision
from ...core.hardware import TARGET
from ..cuda.stem_ws import bind_ws_stem, ws_band_rows, ws_n_tiles, ws_outputs_refusal, ws_refusal
from .igemm import Launch, cdiv
from .netops import (
    FLOAT_INPUTS,
    Dequantized,
    OutputSpec,
    Requantized,
    as_output_spec,
    check_status,
    float32_scale,
    new_outputs,
)
from .stem_gemm import (
    INT32_MIN,
    STEM_MAX_OUTPUTS,
    output_group,
    stem_gemm_kernel,
    stem_outputs,
    stem_slot,
    window_offsets,
)
from .stem_geometry import (
    BLOCK_J,
    BLOCK_N,
    StemConfig,
    StemGeometry,
    column_blocks,
    conv_constexprs,
    geometry_of,
    quant_constexprs,
    s2d_weights,
)
from .stem_ring import ring_band_rows, ring_launch, ring_refusal
from .stored import Launcher, check_device, empty_packed, flag_nonfinite, quantize_f32

__all__ = ["StemConfig", "StemGeometry", "bind_stem", "default_config", "empty_packed",
           "gemm_band_rows", "geometry_of", "ring_config", "ring_refusal", "s2d_weights", "stem",
           "ws_config", "ws_refusal"]

# =========================================================================== kernels
@triton.jit
def stem_input_kernel(
    x_ptr, table_ptr, s2d_ptr, status_ptr, HS, WS, H, W, sn, sc, sh, sw, scale,
    QUANT: tl.constexpr, S: tl.constexpr, CSP: tl.constexpr, CSPP: tl.constexpr,
    BLOCK_X: tl.constexpr,
):
    """Quantized space-to-depth image: s2d[n, Y, X, (d*S + e)*C + c] =
    q(x[n, c, S*(Y - PS) + d, S*(X - PS) + e]), 0 outside the image and in the padding
    channels (C, PS and the quantizer: QUANT, `stem_geometry.QuantConstexprs`). One program
    per space-to-depth row (n, Y) and BLOCK_X of its pixels: it reads the S image rows of each
    channel (image strides sn, sc, sh, sw), each value once, and writes whole pixels (CSP
    bytes, a multiple of 16: vector stores)."""
    C: tl.constexpr = QUANT.C
    PS: tl.constexpr = QUANT.PS
    row = tl.program_id(0)
    n = row // HS
    yy = row % HS
    xx = tl.program_id(1) * BLOCK_X + tl.arange(0, BLOCK_X)
    ch = tl.arange(0, CSPP)  # CSPP: CSP rounded up to a power of two
    d = ch // (S * C)
    e = (ch // C) % S
    c = ch % C
    iy = S * (yy - PS) + d
    ix = (S * (xx - PS))[:, None] + e[None, :]
    xmask = xx < WS
    valid = (xmask[:, None] & ((ch < S * S * C) & (iy >= 0) & (iy < H))[None, :] & (ix >= 0)
             & (ix < W))
    src = (n * sn + c * sc + iy * sh)[None, :] + ix * sw
    if QUANT.U8:
        v = tl.load(x_ptr + src, mask=valid, other=0).to(tl.int32)
        q = tl.load(table_ptr + c[None, :] * 256 + v, mask=valid, other=0).to(tl.int32)
    else:
        xf = tl.load(x_ptr + src, mask=valid, other=0.0).to(tl.float32)
        q = quantize_f32(xf, scale, QUANT.ENC, QUANT.QMIN, QUANT.QMAX)
        if QUANT.HAS_STATUS:
            flag_nonfinite(xf, valid, status_ptr)
    q = tl.where(valid, q, 0)
    tl.store(s2d_ptr + (row * WS + xx)[:, None] * CSP + ch[None, :], q.to(tl.int8),
             mask=xmask[:, None] & (ch < CSP)[None, :])


@triton.jit
def _conv_cols(s2d_ptr, w_ptr, n, n_ok, oh, ow, n_idx, n_mask, dims, CONV: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """int32 conv outputs [BLOCK_M, BLOCK_N] at conv row oh (a scalar) and, per row m, image
    n[m] (valid where n_ok) and column ow[m]; positions outside the conv output are INT32_MIN
    (the pool's padding). The reduction runs in CHUNKS dots of 64 bytes, or one (WHOLE_K:
    every load of the window in flight at once); each filter row is RS * CSP contiguous bytes
    of the space-to-depth tensor (`stem_gemm.window_offsets`), loaded as 16-byte vectors. dims
    and CONV as `conv_launch` makes them."""
    _, OH, OW, _, _, HS, WS, _, KWB, _, _, _ = dims
    ohc = tl.minimum(tl.maximum(oh, 0), OH - 1)
    owc = tl.minimum(tl.maximum(ow, 0), OW - 1)
    base = ((n * HS + ohc) * WS + owc) * CONV.CSP  # the window's corner, 16-byte aligned
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    KC: tl.constexpr = CONV.CHUNKS * 64 if CONV.WHOLE_K else 64  # bytes per dot
    for ci in tl.static_range(CONV.CHUNKS * 64 // KC):
        k = ci * KC + tl.arange(0, KC)
        off = window_offsets(k, WS, CONV)
        if CONV.KB % KC == 0:
            a = tl.load(s2d_ptr + base[:, None] + off[None, :])
        else:
            a = tl.load(s2d_ptr + base[:, None] + off[None, :], mask=(k < CONV.KB)[None, :],
                        other=0)
        b = tl.load(w_ptr + n_idx[None, :] * KWB + k[:, None], mask=n_mask[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    ok = n_ok & (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
    return tl.where(ok[:, None], acc, INT32_MIN)


@triton.jit
def stem_conv_kernel(s2d_ptr, w_ptr, bias_ptr, dims, outs, CONV: tl.constexpr,
                     OUTS: tl.constexpr, IMAGES: tl.constexpr, BLOCK_J: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """One program: IMAGES images (stacked along the dots' M), a band of `band_rows` output
    rows, a block of output columns and BLOCK_N channels; see the module docstring. The
    arguments as `conv_launch` makes them."""
    N, OH, OW, PH, PW, _, _, K, _, bands, col_blocks, band_rows = dims
    BLOCK_M: tl.constexpr = IMAGES * BLOCK_J
    pid = tl.program_id(0)
    cb = pid % col_blocks
    band = (pid // col_blocks) % bands
    mm = tl.arange(0, BLOCK_M)
    jj = mm % BLOCK_J
    n = (pid // (col_blocks * bands)) * IMAGES + mm // BLOCK_J
    n_ok = n < N
    n = tl.minimum(n, N - 1)
    n_idx = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_idx < K
    t0 = band * band_rows
    t_end = tl.minimum(t0 + band_rows, PH)
    if CONV.HAS_BIAS:
        bias = tl.load(bias_ptr + n_idx, mask=n_mask, other=0)
    else:
        bias = tl.zeros((BLOCK_N,), dtype=tl.int32)
    if CONV.POOL:
        # pooled columns j0 + jj (the last of the block only feeds its neighbour's window)
        j = cb * (BLOCK_J - 1) + jj
        col_a = 2 * j - CONV.PP
        nxt = (mm - jj + tl.minimum(jj + 1, BLOCK_J - 1))[:, None] + tl.zeros(
            (BLOCK_M, BLOCK_N), tl.int32)
        carry_a = tl.full((BLOCK_M, BLOCK_N), INT32_MIN, tl.int32)
        carry_b = tl.full((BLOCK_M, BLOCK_N), INT32_MIN, tl.int32)
        j_mask = n_ok & (jj < BLOCK_J - 1) & (j < PW)
        # t0 - 1 first: its second conv row is the first window row of pooled row t0
        for t in range(t0 - 1, t_end):
            oh = 2 * t - CONV.PP + 1
            a_lo = _conv_cols(s2d_ptr, w_ptr, n, n_ok, oh, col_a, n_idx, n_mask, dims, CONV,
                              BLOCK_M, BLOCK_N)
            a_hi = _conv_cols(s2d_ptr, w_ptr, n, n_ok, oh + 1, col_a, n_idx, n_mask, dims, CONV,
                              BLOCK_M, BLOCK_N)
            rows_a = tl.maximum(carry_a, tl.maximum(a_lo, a_hi))
            carry_a = a_hi
            b_lo = _conv_cols(s2d_ptr, w_ptr, n, n_ok, oh, col_a + 1, n_idx, n_mask, dims,
                              CONV, BLOCK_M, BLOCK_N)
            b_hi = _conv_cols(s2d_ptr, w_ptr, n, n_ok, oh + 1, col_a + 1, n_idx, n_mask, dims,
                              CONV, BLOCK_M, BLOCK_N)
            rows_b = tl.maximum(carry_b, tl.maximum(b_lo, b_hi))
            carry_b = b_hi
            pooled = tl.maximum(tl.maximum(rows_a, rows_b), tl.gather(rows_a, nxt, 0))
            pix = (n * PH + t) * PW + j
            stem_outputs(pooled, bias, pix, j_mask & (jj * 0 + t >= t0), n_idx, K, outs, OUTS,
                         BLOCK_M, BLOCK_N)
    else:
        ow = cb * BLOCK_J + jj
        for t in range(t0, t_end):
            acc = _conv_cols(s2d_ptr, w_ptr, n, n_ok, t, ow, n_idx, n_mask, dims, CONV, BLOCK_M,
                             BLOCK_N)
            pix = (n * OH + t) * OW + ow
            stem_outputs(acc, bias, pix, n_ok & (ow < OW), n_idx, K, outs, OUTS, BLOCK_M,
                         BLOCK_N)


# =========================================================================== host side
def gemm_band_rows(geom: StemGeometry, block_j: int, block_n: int = BLOCK_N, sms: int = TARGET.sms,
                   per_sm: int = 2) -> int:
    """The longest band (of 16, 8, 4, 2 output rows, else 1) at which the "gemm" kernel still
    gives every SM `per_sm` programs."""
    per_band = geom.N * cdiv(geom.PW, block_j - 1) * cdiv(geom.K, block_n)
    return next((r for r in (16, 8, 4, 2) if per_band * cdiv(geom.PH, r) >= per_sm * sms), 1)


def ring_config(geom: StemGeometry, sms: int = TARGET.sms, **knobs) -> StemConfig:
    """A "ring" config: block_j 16 or 32 by the pooled width (2 * block_j + 4 pixels per ring
    row), 64 channels, 4 warps, 2 programs per SM and the band of least predicted time
    (`stem_ring.ring_band_rows`); `knobs` override (band_rows recomputed unless given)."""
    base = dict(kernel="ring", block_j=16 if geom.PW <= 14 else 32, block_n=64, num_warps=4,
                programs_per_sm=2)
    base.update(knobs)
    if "band_rows" not in knobs:
        base["band_rows"] = ring_band_rows(geom, base["block_j"], base["block_n"], sms,
                                           base["programs_per_sm"])
    return StemConfig(**base)


def ws_config(geom: StemGeometry, sms: int = TARGET.sms, **knobs) -> StemConfig:
    """A "ws" config (`kernels.cuda.stem_ws`, one CTA per SM): the band of least predicted time
    (`stem_ws.ws_band_rows`) unless `knobs` give band_rows."""
    rows = knobs.pop("band_rows", None) or ws_band_rows(geom, ws_n_tiles(geom), sms)
    return StemConfig(kernel="ws", band_rows=rows, **knobs)


def default_config(geom: StemGeometry, sms: int = TARGET.sms) -> StemConfig:
    """The config per first-layer shape, the fastest measured so far:
    - AlexNet's 11x11/4 + pool and the first layers without a pool (VGG's 3x3/1, MobileNet's
      3x3/2): the "gemm" kernel at 32 columns, 4 warps, 3 stages (H100: 33 against the
      "bands" kernel's 72 us and 77 against 112 us at batch 8; 145 against 307 us and 553
      against 878 us at batch 64; cuDNN fp16 conv + ReLU (+ pool) 61 / 87 us and 296 / 659
      us; `benchmarks/probes/stem_probe.py`, CUDA graph; the 3x3/2 not measured alone),
      32 channels a program for at most 32 filters;
    - the rest: the "bands" kernel, one dot per conv row over the whole reduction, 64
      channels, one image per program, and the longest band (fewest recomputed rows) that
      still gives every SM two programs (ResNet's 7x7/2 + pool, H100: batch 8 29.5 us, the
      best gemm config 31.4; batch 256 ~500 us in the network's CUDA graph, the "ring" kernel
      797 us, `ring_config`)."""
    if geom.stride == 4 or geom.pool_pad is None:
        block_n = 32 if geom.K <= 32 else BLOCK_N  # MobileNet's 32 filters: no idle columns
        return StemConfig(kernel="gemm", block_j=32, num_warps=4, num_stages=3, whole_k=True,
                          block_n=block_n, band_rows=gemm_band_rows(geom, 32, block_n, sms))
    per_band = geom.N * column_blocks(geom, BLOCK_J, "bands") * cdiv(geom.K, BLOCK_N)
    for rows in (8, 4, 2):
        if per_band * cdiv(geom.PH, rows) >= 2 * sms:
            return StemConfig(band_rows=rows, whole_k=True)
    return StemConfig(band_rows=1 if geom.pool_pad is None else 2, whole_k=True)


def _input_precision(p: object) -> Precision:
    p = Precision.parse(p) if isinstance(p, str) else p
    if not isinstance(p, Precision) or p.encoding is Encoding.BINARY or max(
            abs(p.qmin), p.qmax) > 128 or p.qmax > 127:
        raise ValueError(f"precision must be signed (<= 8 bits) or unsigned (<= 7 bits) for "
                         f"the int8 tensor cores, got {p!r}")
    return p


def _check_weight(weight: object) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.dtype.is_floating_point or \
            weight.dtype == torch.bool:
        raise TypeError("weight must be an integer tensor [K, R, R, C] (KRSC values)")
    if weight.dim() != 4 or weight.shape[1] != weight.shape[2]:
        raise ValueError(f"weight must be [K, R, R, C], got {tuple(weight.shape)}")
    if weight.numel() and (int(weight.min()) < -128 or int(weight.max()) > 127):
        raise ValueError("weight values must lie in [-128, 127] (s8)")
    return weight


def _check_image(image: object) -> bool:
    """Check the image (module docstring); True for a uint8 one."""
    if not isinstance(image, torch.Tensor) or image.dtype not in (torch.uint8, *FLOAT_INPUTS):
        got = image.dtype if isinstance(image, torch.Tensor) else type(image).__name__
        raise TypeError(f"image must be a uint8, float32, float16 or bfloat16 tensor, got {got}")
    if image.dim() != 4 or image.numel() == 0 or not (
            image.is_contiguous() or image.is_contiguous(memory_format=torch.channels_last)):
        raise ValueError(f"image must be a non-empty NCHW-shaped tensor, contiguous in NCHW or "
                         f"channels_last (NHWC) memory, got shape {tuple(image.shape)} and "
                         f"strides {image.stride()}")
    if image.numel() >= 2**31:
        raise ValueError(f"image must have fewer than 2^31 values, got {image.numel()}")
    check_device("image", image)
    return image.dtype == torch.uint8


def _sm_count(device: torch.device) -> int:
    """SMs the persistent grid fills (the interpreter: 2, so programs loop over tiles)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2


def conv_launch(s2d: torch.Tensor, w2: torch.Tensor, bias: torch.Tensor | None,
                outputs: tuple[tuple, tuple], geom: StemGeometry, cfg: StemConfig) -> Launch:
    """The conv launch of a "bands" or "gemm" config (`stem_conv_kernel`,
    `stem_gemm.stem_gemm_kernel`): the space-to-depth image and weights, the int32 bias
    (None: none), the outputs' `outs` and OUTS (`stem_gemm.output_group`); the kernels'
    dims (runtime sizes) and CONV (compile-time geometry) in the order they unpack them."""
    col_blocks = column_blocks(geom, cfg.block_j, cfg.kernel)
    bands = cdiv(geom.PH, cfg.band_rows)  # PH = OH without the pool
    dims = dict(N=geom.N, OH=geom.OH, OW=geom.OW, PH=geom.PH, PW=geom.PW, HS=geom.HS,
                WS=geom.WS, K=geom.K, KWB=w2.shape[1], bands=bands, col_blocks=col_blocks,
                band_rows=cfg.band_rows)
    conv = conv_constexprs(geom, cfg.whole_k, bias is not None)
    if bias is None:
        bias = torch.zeros(1, dtype=torch.int32, device=s2d.device)
    outs, out_consts = outputs
    args = (s2d, w2, bias, tuple(dims.values()), outs)
    constexprs = dict(CONV=conv, OUTS=out_consts, BLOCK_J=cfg.block_j, BLOCK_N=cfg.block_n,
                      **cfg.launch_options())
    channel_blocks = cdiv(geom.K, cfg.block_n)
    if cfg.kernel == "gemm":
        tiles = geom.N * bands * col_blocks if conv.POOL else cdiv(
            geom.N * geom.OH * geom.OW, 4 * cfg.block_j)
        return Launch(stem_gemm_kernel, (tiles, channel_blocks), args, constexprs)
    grid = (cdiv(geom.N, cfg.images) * bands * col_blocks, channel_blocks)
    return Launch(stem_conv_kernel, grid, args, dict(constexprs, IMAGES=cfg.images))


def bind_stem(image: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              outputs: Sequence[OutputSpec],
              outs: Sequence[PackedTensor | torch.Tensor], *, stride: int, pad: int,
              pool_pad: int | None = 1, scale: float | None = None,
              precision: Precision | str = "s8", table: torch.Tensor | None = None,
              status: torch.Tensor | None = None, config: StemConfig | None = None
              ) -> Launcher:
    """Bind the first layer: the one entry point for every first-layer shape (the kernel
    picked by `default_config` unless `config` names one).

    image: [N, C, H, W], contiguous in NCHW or in channels_last (NHWC) memory (an NHWC
    uint8 batch x is passed as x.permute(0, 3, 1, 2), no copy), either
    - float32 / float16 / bfloat16, quantized with `scale` into `precision`
      (`reference.quantize_float`), or
    - uint8 pixel values, quantized by `table`: int [C, 256], table[c, v] the `precision`
      value of pixel value v of channel c after the model's own normalization, computed by
      the caller (`reference.uint8_input_table` for ToTensor + Normalize;
      `reference.quantize_uint8_image` is the lookup's semantics); `scale` is not used.
    weight: KRSC integer values in s8 range; bias: int [K] or None. outputs: one spec per
    entry of `outs` (`netops.Requantized` or RequantizedOutput -> PackedTensor of logical
    [N, PH, PW, K] in INT8 or BITPLANE, or a wide one in INT8; derived ones (mid and
    table) too: with the pool, the max of the window's table values, which the kernels get
    by pooling first only where the table rises over the formula's values (ValueError
    otherwise; `stem_gemm.stem_slot`); Dequantized / FloatOutput -> float32 tensor of that
    shape (NCHW with channels_first); with the pool, the max of the window's float values:
    scale >= 0 makes the float output monotone, so pooling commutes with it), at most 3,
    none with a residual. pool_pad: the 3x3 stride-2 max-pool's padding
    (1: ResNet, 0: AlexNet) or None for no pool. status: optional int32 device tensor,
    element 0 set to 1 when a float image held inf or nan. config: a `StemConfig` (its
    kernel "ring" only where `ring_refusal(geometry)` is None)."""
    prec = _input_precision(precision)
    is_u8 = _check_image(image)
    device = image.device
    weight = _check_weight(weight)
    geom = geometry_of(image, weight, stride, pad, pool_pad)
    k_red = geom.R * geom.R * geom.C
    bound = k_red * max(abs(prec.qmin), prec.qmax) * 128
    top = 0
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dtype.is_floating_point or \
                tuple(bias.shape) != (geom.K,):
            raise ValueError(f"bias must be an integer tensor of shape ({geom.K},)")
        top = int(bias.abs().max())
    if bound + top >= 2**31 - 1:
        raise ValueError(f"worst-case |acc + bias| {bound + top} must stay below 2^31 - 1")
    if is_u8:
        if not isinstance(table, torch.Tensor) or table.dtype.is_floating_point or \
                tuple(table.shape) != (geom.C, 256):
            raise ValueError(f"a uint8 image needs table, an int tensor [{geom.C}, 256]")
        if int(table.min()) < prec.qmin or int(table.max()) > prec.qmax:
            raise ValueError(f"table values must lie in {prec}'s range")
        table_dev = table.to(torch.int8).contiguous().to(device)
        s32 = 1.0
    else:
        if scale is None:
            raise ValueError("a float image needs scale (the input quantizer's scale)")
        s32 = float32_scale(scale)
        table_dev = None
    if status is not None:
        check_status(status, device)
    if not isinstance(outputs, (list, tuple)) or not isinstance(outs, (list, tuple)) or \
            not 1 <= len(outputs) == len(outs) <= STEM_MAX_OUTPUTS:
        raise ValueError(f"outputs and outs must have the same length, 1..{STEM_MAX_OUTPUTS}")
    specs = [as_output_spec(i, spec) for i, spec in enumerate(outputs)]
    for i, spec in enumerate(specs):
        if (spec.residual_multiplier if isinstance(spec, Requantized)
                else spec.residual_scale) is not None:
            raise ValueError(f"outputs[{i}] has a residual term: the stem has no residual")
        if isinstance(spec, Dequantized) and pool_pad is not None and \
                bool((torch.as_tensor(spec.scale) < 0).any()):
            raise ValueError(f"outputs[{i}].scale must be >= 0 to pool a float output")
    if config is not None and not isinstance(config, StemConfig):
        raise TypeError(f"config must be a StemConfig or None, got {type(config).__name__}")
    sms = _sm_count(device)
    cfg = config or default_config(geom, sms)
    if cfg.kernel == "ring" and ring_refusal(geom) is not None:
        raise ValueError(f"config.kernel 'ring' cannot run this layer: {ring_refusal(geom)}")
    slots = [stem_slot(i, spec, out, geom.out_shape, device, bound + top, cfg.fast_requant,
                       cfg.thresholds, geom.pool_pad is not None)
             for i, (spec, out) in enumerate(zip(specs, outs, strict=True))]
    results = tuple(o.data if isinstance(o, PackedTensor) else o for o in outs)
    bias_dev = bias.to(torch.int32).contiguous().to(device) if bias is not None else None
    if cfg.kernel == "ws":
        why = ws_refusal(geom) or ws_outputs_refusal(
            specs, [o.layout if isinstance(o, PackedTensor) else None for o in outs], geom.K)
        if why is not None:
            raise ValueError(f"config.kernel 'ws' cannot run this layer: {why}")
        if device.type != "cuda":
            raise ValueError("config.kernel 'ws' runs on a CUDA device (kernels.cuda.stem_ws_emu "
                             "emulates it on the CPU)")
        return Launcher((bind_ws_stem(image, table_dev, weight, bias_dev, specs, outs, geom,
                                      prec, s32, status, sms, cfg.band_rows),), results)
    if cfg.kernel == "ring":
        return Launcher((ring_launch(image, table_dev, weight, bias_dev,
                                     output_group(slots, image), geom, cfg, prec, s32, status,
                                     sms),), results)

    # launch 1: quantized space-to-depth image
    s2d = torch.empty(geom.N, geom.HS, geom.WS, geom.CSP, dtype=torch.int8, device=device)
    cspp = 1 << (geom.CSP - 1).bit_length()
    block_x = max(16, min(1 << (geom.WS - 1).bit_length(), 2048 // cspp))
    in_args = (image, table_dev if is_u8 else image, s2d,
               status if status is not None else s2d, geom.HS, geom.WS, geom.H, geom.W,
               *image.stride(), s32)
    in_kwargs = dict(QUANT=quant_constexprs(geom, prec, is_u8, status is not None),
                     S=geom.stride, CSP=geom.CSP, CSPP=cspp, BLOCK_X=block_x, num_warps=4)
    first = Launch(stem_input_kernel, (geom.N * geom.HS, cdiv(geom.WS, block_x)), in_args,
                   in_kwargs)

    # launch 2: conv, epilogue, pool
    second = conv_launch(s2d, s2d_weights(weight, geom).to(device), bias_dev,
                         output_group(slots, s2d), geom, cfg)
    return Launcher((first, second), results)


def stem(image: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         outputs: Sequence[OutputSpec],
         layouts: Sequence[Layout | str] | None = None, **kwargs
         ) -> list[PackedTensor | torch.Tensor]:
    """`bind_stem` into new outputs (requantized ones in `layouts`, INT8 by default), launched
    once; keyword arguments as `bind_stem`."""
    if not isinstance(image, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("image and weight must be torch tensors")
    geom = geometry_of(image, weight, kwargs.get("stride", 1), kwargs.get("pad", 0),
                       kwargs.get("pool_pad", 1))
    outs = new_outputs(outputs, layouts, geom.out_shape, image.device)
    bind_stem(image, weight, bias, outputs, outs, **kwargs)()
    return outs
