// THR_PAIRS: threshold bits of two columns per 32-bit add. A column pair's values y (of one
// row) sit in the 16-bit halves of one word, offset so that a half is 0x8000 + y - t against
// threshold t: its top bit is y >= t, and the adds never carry across halves, since every y
// lies in [PAIR_YLO, PAIR_YHI] (bitserial_shape.pair_range: a span under 2^15) and t is clamped to
// [PAIR_YLO, PAIR_YHI + 1], which decides the same. Per pair: each column's plane products
// summed from -PAIR_DOT_LO (so >= 0; one multiply-add per plane pair), both packed by one PRMT,
// scaled and the row word added (one multiply-add), one add per threshold, one LOP3 per output
// bit, a PRMT copying the halves' top bits into byte masks and a LOP3 into the row's bit
// words: about 5 instructions per output instead of 9 (compares, selects, predicated ORs, quad
// shuffles). The table holds per column pair and level 0x8000 + PAIR_YLO - t in each half:
// in shared memory where persistent tap-shift blocks keep their thresholds
// (bitserial_tap_shift.cu), else in global memory from bind (bitserial_tables.pair_table); the
// row word term - PAIR_YLO + S * PAIR_DOT_LO (>= 0) in both halves.
constexpr int PAIR_WORDS = (NT + 7) / 8;  // a row's bit words per lane (NT = 8: 1, 16: 2, 32: 4)
static_assert(!THR_PAIRS || (WGMMA && OUT_THRESH && OUT_BITS <= 2 && A_ALPHA * W_ALPHA > 0
                             && SPLIT_K == 1 && (NT == 8 || NT == 16 || NT == 32) && MT == 1),
              "THR_PAIRS: wgmma, WN = 64, 128 or 256 (the template's constraints)");
__device__ __forceinline__ constexpr u32 pair_half(int lo, int hi) {
  return (u32)lo | ((u32)hi << 16);
}
// the table word of thresholds t0, t1 (columns of one pair)
__device__ __forceinline__ u32 pair_thresholds(int t0, int t1) {
  return pair_half(pair_threshold_half(t0), pair_threshold_half(t1));
}
// Output words of one row from its bit words: byte 2b + e of bytes[i] holds plane b's bits of
// this lane's channels 2 NT t4 + 16 i + 8 e + (0..7). NT >= 16: NT / 16 words per plane of this
// lane's own; NT = 8: two lanes' halves per word, the even lane storing plane 0's, the odd one
// plane 1's.
__device__ __forceinline__ void store_pair_row(const u32 (&bytes)[PAIR_WORDS], int m, int word0,
                                               int t4, const EpilogueArgs& ea) {
  if constexpr (NT >= 16) {
    constexpr int LANE_WORDS = NT / 16;
#pragma unroll
    for (int q = 0; q < LANE_WORDS; ++q)
#pragma unroll
      for (int b = 0; b < OUT_BITS; ++b)
        store_row_word(prmt(bytes[2 * q], bytes[2 * q + 1], b ? 0x7632 : 0x5410),
                       b * OUT_WORD_TILES + t4 * LANE_WORDS + q, m, word0, ea);
  } else {
    const u32 other = __shfl_xor_sync(0xffffffffu, bytes[0], 1);
    const int b = t4 & 1;
    const u32 word = prmt(bytes[0], other, b ? 0x3276 : 0x5410);
    if (b < OUT_BITS) store_row_word(word, b * OUT_WORD_TILES + (t4 >> 1), m, word0, ea);
  }
}
// rows.rowp[mi][h]: the table entries of this lane's first column pair for row (mi, h).
__device__ __forceinline__ void epilogue_pairs(const Acc& acc, const RowPrep& rows, int n0,
                                               int col0, int lane, const EpilogueArgs& ea) {
  const int t4 = lane & 3;
  u32 bytes[MT][2][PAIR_WORDS] = {};
  u32 row_word[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_word[mi][h] =
          (u32)(rows.term[mi][h] - PAIR_YLO + A_ALPHA * W_ALPHA * PAIR_DOT_LO) * 0x10001u;
#pragma unroll
  for (int ni = 0; ni < NT; ++ni)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // the row's tap-rectangle slot (binary activations), else one table for every row
        const u32* p = reinterpret_cast<const u32*>(RECT_THR ? rows.rowp[mi][h] : rows.rowp[0][0])
                       + ni * 4 * PAIR_STRIDE;
        u32 thr[PAIR_STRIDE];
#pragma unroll
        for (int k = 0; k < PAIR_STRIDE; ++k) thr[k] = p[k];
        int dot[2] = {-PAIR_DOT_LO, -PAIR_DOT_LO};  // sum_ij c_i d_j popc(a_i & b_j), both
#pragma unroll                                         // columns, less its least value
        for (int i = 0; i < (FUSE_PLANES ? 1 : Q_BITS); ++i)
#pragma unroll
          for (int j = 0; j < P_BITS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              dot[e] += (FUSE_PLANES ? 1 : a_coef(i)) * w_coef(j) * acc[i][j][mi][ni][2 * h + e];
        // y - PAIR_YLO per half (the halves of dot < 2^16: one byte permute packs them)
        const u32 y = prmt(dot[0], dot[1], 0x5410) * (A_ALPHA * W_ALPHA) + row_word[mi][h];
        u32 bit[2] = {0u, 0u};  // output bit b of both columns in the halves' top bits
#pragma unroll
        for (int b = 0; b < OUT_BITS; ++b) {
          bit[b] = ((OUT_QMIN >> b) & 1) ? ~0u : 0u;
#pragma unroll
          for (int k = 0; k < THR_LEVELS; ++k)
            if (level_flips(k, b)) bit[b] ^= y + thr[k];
        }
        const u32 masks = prmt(bit[0], bit[1], OUT_BITS > 1 ? 0xFDB9 : 0x44B9);
        bytes[mi][h][ni / 8] |= masks & (0x01010101u << (ni % 8));
      }
  const int word0 = (n0 + col0) / 32;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) store_pair_row(bytes[mi][h], rows.m[mi][h], word0, t4, ea);
}

