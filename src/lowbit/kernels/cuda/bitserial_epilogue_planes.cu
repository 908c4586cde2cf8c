// The fused epilogue's bit-plane outputs: register-level packing and the plane word stores
// (bitserial_epilogue.cu includes this).
// word |= bit where p: a predicated OR (ISETP + @P LOP3 per output plane bit) instead of a
// select and an add.
__device__ __forceinline__ void or_if(u32& word, bool p, u32 bit) {
  if (p) word |= bit;
}

// Register-level packing of one output row's bit planes: each lane of a quad holds 2 of every 8
// columns of the row's WN / 32 words per plane (lane t4's bits at 8 * (ni % 4) + e, shifted by
// 2 * t4 here). With a multiple of 4 words (plane-major index v), a reduce-scatter across the
// quad: exchange half the words with lane t4 ^ 2, then a quarter with t4 ^ 1, and lane t4
// stores words t4, t4 + 4, ...: 3 shuffles and one store per lane for 4 words. Otherwise every
// word is OR-reduced with two shuffles and stored by one lane.
// (store_plane_words: TILES words of BITS planes of a row, into any bit-plane output of the
// workload's rows; the block-end epilogue's derived outputs too)
template <int TILES = OUT_WORD_TILES>
__device__ __forceinline__ void store_plane_word(u32* dst, u32 bits, int v, int m, int word0) {
  const int b = v / TILES, word = word0 + v % TILES;
  if (m < M_ROWS && word < OUT_WORDS)
    dst[((i64)b * M_ROWS + m) * OUT_WORDS + word] = bits & word_mask(word);
}
__device__ __forceinline__ void store_row_word(u32 bits, int v, int m, int word0,
                                               const EpilogueArgs& ea) {
  store_plane_word(reinterpret_cast<u32*>(ea.out), bits, v, m, word0);
}
template <int TILES, int BITS>
__device__ __forceinline__ void store_plane_words(u32* dst, const u32 (&bits)[TILES][BITS],
                                                  int m, int word0, int t4) {
  constexpr int ROW_WORDS = TILES * BITS;  // packed words per row and warp tile
  u32 vals[ROW_WORDS];
#pragma unroll
  for (int v = 0; v < ROW_WORDS; ++v)
    vals[v] = bits[v % TILES][v / TILES] << (2 * t4);
  // every shuffle before the first store: NVVM otherwise unswitches the word loop on the
  // stores' row check and duplicates the shuffles into divergent paths (BRA.DIV)
  if constexpr (WN >= 32 && ROW_WORDS % 4 == 0) {
    const bool hi = (t4 & 2) != 0, lo = (t4 & 1) != 0;
    u32 half[ROW_WORDS / 2 + 1];  // half[2p + q]: word 4p + q + 2 * hi, over t4 and t4 ^ 2
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const u32 a = vals[4 * p + q], c = vals[4 * p + q + 2];
        half[2 * p + q] = (hi ? c : a) | __shfl_xor_sync(0xffffffffu, hi ? a : c, 2);
      }
    u32 sums[ROW_WORDS / 4 + 1];  // word 4p + t4, summed over the quad
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p) {
      const u32 a = half[2 * p], c = half[2 * p + 1];
      sums[p] = (lo ? c : a) | __shfl_xor_sync(0xffffffffu, lo ? a : c, 1);
    }
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p) store_plane_word<TILES>(dst, sums[p], 4 * p + t4, m, word0);
  } else {
#pragma unroll
    for (int v = 0; v < ROW_WORDS; ++v) {
      vals[v] |= __shfl_xor_sync(0xffffffffu, vals[v], 1);
      vals[v] |= __shfl_xor_sync(0xffffffffu, vals[v], 2);
    }
#pragma unroll
    for (int v = 0; v < ROW_WORDS; ++v)
      if (t4 == (v & 3)) store_plane_word<TILES>(dst, vals[v], v, m, word0);
  }
}
__device__ __forceinline__ void store_row_words(const u32 (&bits)[OUT_WORD_TILES][OUT_BITS], int m,
                                                int word0, int t4, const EpilogueArgs& ea) {
  store_plane_words(reinterpret_cast<u32*>(ea.out), bits, m, word0, t4);
}

