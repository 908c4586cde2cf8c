"""GEMM operands whose reduction length K is not a multiple of 8 bytes, padded to PAD_K.

Where K % 8 != 0 the rows of a [M, K] int8 operand start at addresses aligned to at most
4 bytes (K = 1001: one byte), so the implicit GEMM's loads of A and W are 1-4 byte loads
instead of 16-byte cp.async copies, and the main loop waits on them: at M = 256-4096 with
K = 1001 `triton.gemm_int8` ran 3.6-7.5x the time of `torch._int_mm` on K = 1008 (H100,
`odd_k_probe`), where K = 1000 (8-byte loads) ran at 0.8-1.7x. A padded launch instead
  - copies W once, when the launch is bound, into a zero-filled [N, K16] buffer
    (K16 = K rounded up to PAD_K): bind again after changing the weights;
  - copies A on every launch into a zero-filled [M, K16] buffer (`pad_rows_kernel`, one
    read of M*K and one write of M*K bytes: ~2x the bytes of A, against the GEMM's own
    M*K + N*K + M*N);
  - runs the GEMM on the padded problem (C = x_row = w_row = K16: 16-byte aligned rows).
The pad columns hold 0 in both operands, so every product they add is 0 and the sums are the
unpadded ones bit for bit. u8 activations (`zero_point`): a pad byte 0 enters the dot as
-128, times a weight 0; the zero-point terms are computed on the unpadded weights.
Only GEMM-view problems (a GEMM, or a 1x1 stride-1 unpadded conv) with one int8 byte per
element take it (`padded_k`); sub-byte packed operands and fp16 dots keep their own loads.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .epilogue import SRC_INT8
from .igemm import Launch, Problem, cdiv, channel_alignment

#: padded row length multiple (bytes): the widest cp.async copy
PAD_K = 16
#: below this row alignment (bytes) a GEMM-view launch pads its operands
MIN_ALIGN = 8
#: rows and columns of the tile one program of `pad_rows_kernel` copies: 2 KB, a grid of
#: M / 8 x K / 256 programs (a 256-row copy with 8 programs looping over the columns took
#: ~10 us on an H100, latency-bound)
PAD_BLOCK_ROWS = 8
PAD_BLOCK_COLS = 256


@triton.jit
def pad_rows_kernel(src_ptr, dst_ptr, rows, cols, dst_cols,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[r, c] = src[r, c] over program (row tile, column tile)'s tile, for r < rows and
    c < cols (src row stride cols, dst row stride dst_cols); dst's columns >= cols are left as
    they are (zero since allocation)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    src = src_ptr + r.to(tl.int64)[:, None] * cols + c[None, :]
    dst = dst_ptr + r.to(tl.int64)[:, None] * dst_cols + c[None, :]
    tl.store(dst, tl.load(src, mask=mask), mask=mask)


def padded_k(prob: Problem) -> int | None:
    """K rounded up to PAD_K where `prob` takes padded operands (module doc), else None."""
    if not prob.is_gemm or prob.dot_fp16:
        return None
    if prob.a_operand[0] != SRC_INT8 or prob.w_operand[0] != SRC_INT8:
        return None
    if channel_alignment(prob) >= MIN_ALIGN:
        return None
    return cdiv(prob.C, PAD_K) * PAD_K


def pad_operands(prob: Problem, x: torch.Tensor, w: torch.Tensor
                 ) -> tuple[Problem, torch.Tensor, torch.Tensor, list[Launch]]:
    """(padded problem, padded A buffer, padded W, [the launch that copies x into A]) of a
    launch that `padded_k` pads; W is copied now (placeholder tensors of an ahead-of-time
    compile, smaller than [N, K], are not copied)."""
    k16 = padded_k(prob)
    if k16 is None:
        raise ValueError(f"padded launch of a problem that needs none (C={prob.C})")
    a_pad = torch.zeros((prob.M, k16), dtype=x.dtype, device=x.device)
    w_pad = torch.zeros((prob.NOUT, k16), dtype=w.dtype, device=w.device)
    if w.numel() == prob.NOUT * prob.C:
        w_pad[:, :prob.C].copy_(w.reshape(prob.NOUT, prob.C))
    copy = Launch(pad_rows_kernel, (cdiv(prob.M, PAD_BLOCK_ROWS), cdiv(prob.C, PAD_BLOCK_COLS)),
                  (x, a_pad, prob.M, prob.C, k16),
                  dict(BLOCK_R=PAD_BLOCK_ROWS, BLOCK_C=PAD_BLOCK_COLS, num_warps=4),
                  auxiliary=True)
    padded = dataclasses.replace(prob, C=k16, x_row=k16, w_row=k16)
    return padded, a_pad, w_pad, [copy]


__all__ = ["MIN_ALIGN", "PAD_K", "pad_operands", "pad_rows_kernel", "padded_k"]
