// The fused epilogue's value of one output: bias, ReLU, requantization (bitserial_epilogue.cu
// includes this).
// floor((z + 2^(sh-1)) / 2^sh) for any int64 z and 1 <= sh <= 62, without forming z + 2^(sh-1)
// (which may not fit): with q = floor(z / 2^(sh-1)), floor(floor(x) / 2) = floor(x / 2) makes it
// floor((q + 1) / 2) = (q >> 1) + (q & 1) (no overflow even for q = INT64_MAX): one variable
// 64-bit shift where the split rounding took masks, two of them and adds (the multiply path
// was instruction-bound: 4x the threshold path's time on the same output).
__device__ __forceinline__ i64 round_shift(i64 z, int sh) {
  const i64 q = z >> (sh - 1);
  return (q >> 1) + (q & 1);
}

// Bias, ReLU and the output of one value y (accumulator + row and column terms) of row m,
// column col: stored here for int32 / fp16 / int16 / INT8 outputs, or with PAIR_STORE returned
// (the int32, the fp16 bits, the int16, the byte) for store_output_pair; returns the requantized
// bit pattern for bit-plane outputs (0 past KOUT). thr: OUT_THRESH's thresholds of (m, col).
// res_in: the residual of (m, col) when RES_PAIRS loaded it (load_residual_pair).
__device__ __forceinline__ int epilogue_value(int y, const ColParams& cp,
                                              const int (&thr)[THR_LEVELS], int m, int col,
                                              const EpilogueArgs& ea, i64 res_in) {
  const bool ok = m < M_ROWS && col < KOUT;
  if constexpr (OUT_THRESH) return (int)threshold_code(y, thr);  // past KOUT: word_mask
  if constexpr (RELU && HAS_BIAS < 2) y = y > 0 ? y : 0;
  if constexpr (OUT_MODE == 0) {
    if constexpr (PAIR_STORE) return y;
    if (ok) reinterpret_cast<int*>(ea.out)[(i64)m * KOUT + col] = y;
    return 0;
  } else if constexpr (OUT_MODE == 1) {
    const unsigned short bits = f32_to_f16_bits(__fmul_rn((float)y, cp.scale));
    if constexpr (PAIR_STORE) return bits;
    if (ok) reinterpret_cast<unsigned short*>(ea.out)[(i64)m * KOUT + col] = bits;
    return 0;
  } else if constexpr (OUT_MODE == 4) {  // the host checked |y| < 2^15 (acc_bound)
    if constexpr (PAIR_STORE) return y;
    if (ok) reinterpret_cast<short*>(ea.out)[(i64)m * KOUT + col] = (short)y;
    return 0;
  } else {
    const int sh = cp.shift;
    i64 v;
    if constexpr (HAS_BIAS == 2) {  // |y m| < 2^62 and |b| < 2^62: z fits, z + 2^(sh-1) may not
      v = round_shift((i64)y * cp.mult + cp.sbias, sh);
    } else if constexpr (HAS_BIAS >= 3) {  // the host checked |y| m + |b| + |res| |r| < 2^63
      const i64 at = (i64)m * KOUT + col;
      const i64 res = RES_PAIRS ? res_in
                      : !ok ? 0 : HAS_BIAS == 4 ? (i64)reinterpret_cast<const short*>(ea.thr)[at]
                                                : (i64)ea.thr[at];
      v = round_shift((i64)y * cp.wmult + cp.sbias + res * cp.rmult, sh);
    } else {
      v = ((i64)y * cp.mult + (1ll << (sh - 1))) >> sh;
    }
    // ReLU with a shifted bias: the clamp at 0 after requantizing (requantize(0) is no longer 0)
    constexpr int LO = (RELU && HAS_BIAS >= 2 && OUT_QMIN < 0) ? 0 : OUT_QMIN;
    v = v < LO ? LO : (v > OUT_QMAX ? OUT_QMAX : v);
    if constexpr (OUT_MODE == 2) {  // one byte per value: two's complement of all 8 bits
      if constexpr (PAIR_STORE) return (int)v;
      if (ok) reinterpret_cast<unsigned char*>(ea.out)[(i64)m * KOUT + col] = (unsigned char)(int)v;
    }
    return col < KOUT ? ((int)v & ((1 << OUT_BITS) - 1)) : 0;
  }
}

