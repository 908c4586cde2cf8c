// Output packing tile and the threshold requantization (REQUANT="threshold") of the fused
// epilogue (bitserial_epilogue.cu includes this).
// Zero the tile's shared-memory packing tile [OUT_BITS][BM][BLOCK_WORDS] (narrow warp tiles).
__device__ __forceinline__ void pack_tile_clear(u32* s_out, int tid) {
  tile_sync();  // every warp is done reading the operand tiles
  for (int i = tid; i < PACK_WORDS; i += THREADS) s_out[i] = 0;
  tile_sync();
}

// Bits of output word `word` that hold columns < KOUT (a threshold code past KOUT is OUT_QMIN's).
__device__ __forceinline__ u32 word_mask(int word) {
  return (KOUT % 32 != 0 && word == OUT_WORDS - 1) ? (1u << (KOUT % 32)) - 1 : 0xffffffffu;
}

// Store the packing tile of the block tile at (m0, n0) to the bit-plane output.
__device__ __forceinline__ void pack_tile_store(const u32* s_out, void* out, int m0, int n0, int tid) {
  tile_sync();
  for (int i = tid; i < PACK_WORDS; i += THREADS) {
    const int wd = i % BLOCK_WORDS, row = (i / BLOCK_WORDS) % BM, b = i / (BLOCK_WORDS * BM);
    const int m = out_row(m0 + row);
    const int word = n0 / 32 + wd;
    if (m < M_ROWS && word < OUT_WORDS)
      reinterpret_cast<u32*>(out)[((i64)b * M_ROWS + m) * OUT_WORDS + word] = s_out[i] & word_mask(word);
  }
}

// OUT_THRESH: bias, ReLU and requantization to OUT_BITS <= 2 folded into OUT_QMAX - OUT_QMIN
// integer thresholds per column (lowbit.reference.requant_thresholds, computed on the host;
// bitserial_tables.epilogue_thresholds pads the [KOUT][levels] table to KPAD columns with INT32_MAX):
// the output is OUT_QMIN + #{k : y >= thr[k]}, 1-3 compares instead of a 64-bit multiply, a
// shift and clamps per output (knob REQUANT="threshold").
constexpr u32 OUT_MASK = (1u << OUT_BITS) - 1;
// The thresholds are non-decreasing (the multiplier is >= 1), so level = #{k : y >= thr[k]}
// counts up one compare at a time, and bit b of the code OUT_QMIN + level is bit b of OUT_QMIN
// XOR the compares of the steps k -> k + 1 that flip it (compile-time): per output plane one
// predicate expression and one select, no adds, shifts or clamps.
__device__ __forceinline__ constexpr bool level_flips(int k, int b) {
  return ((((OUT_QMIN + k + 1) ^ (OUT_QMIN + k)) >> b) & 1) != 0;
}
__device__ __forceinline__ bool threshold_bit(int y, const int (&thr)[THR_LEVELS], int b) {
  bool bit = ((OUT_QMIN >> b) & 1) != 0;
#pragma unroll
  for (int k = 0; k < THR_LEVELS; ++k)
    if (level_flips(k, b)) bit ^= y >= thr[k];
  return bit;
}
// Four levels on two bits with QMIN = 0 or -2 (u2, s2): a binary search, since bit b of QMIN +
// level is then bit b of the level XOR bit b of QMIN (the only carry leaves the two bits):
// level >= 2 is one compare against thr[1], and the low bit one compare against thr[2] or thr[0]
// as that one says (2 compares and a select per output instead of a chain of 4).
constexpr bool THR_SEARCH = OUT_BITS == 2 && THR_LEVELS == 3 && (OUT_QMIN & 1) == 0;
__device__ __forceinline__ void threshold_bits(int y, const int (&thr)[THR_LEVELS],
                                               bool (&bits)[OUT_BITS]) {
  if constexpr (THR_SEARCH) {  // (indices guarded: this branch also compiles for 1 level)
    const bool upper = y >= thr[THR_SEARCH ? 1 : 0];
    bits[1] = upper != (((OUT_QMIN >> 1) & 1) != 0);
    bits[0] = y >= (upper ? thr[THR_SEARCH ? 2 : 0] : thr[0]);
  } else {
#pragma unroll
    for (int b = 0; b < OUT_BITS; ++b) bits[b] = threshold_bit(y, thr, b);
  }
}
__device__ __forceinline__ u32 threshold_code(int y, const int (&thr)[THR_LEVELS]) {
  bool bits[OUT_BITS];
  threshold_bits(y, thr, bits);
  u32 code = 0;
#pragma unroll
  for (int b = 0; b < OUT_BITS; ++b) code |= (u32)bits[b] << b;
  return code;
}
