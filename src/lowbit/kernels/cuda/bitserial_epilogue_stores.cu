// The fused epilogue's column-pair loads and stores (bitserial_epilogue.cu includes this).
// A lane holds columns col, col + 1 (col even) of each of its rows: with an even KOUT the pair
// is never split by KOUT, so int32 / fp16 or int16 / INT8 outputs leave as one 8 / 4 / 2-byte
// store and a residual arrives as one 8 / 4-byte load. Per-element accesses of 4 bytes at an
// 8-byte lane stride kept the int32 store of a store-bound 1x1 conv (256 x 56 x 56 x 256,
// 822 MB) at ~1 TB/s on an H200, a quarter of its bandwidth (network bench, 2026-11-27).
constexpr bool PAIR_STORE = (OUT_MODE <= 2 || OUT_MODE == 4) && !OUT_THRESH && KOUT % 2 == 0;
constexpr bool RES_PAIRS = HAS_BIAS >= 3 && KOUT % 2 == 0;

// The residual values of this lane's column pair (col even) in row m, 0 outside the output.
__device__ __forceinline__ void load_residual_pair(const EpilogueArgs& ea, int m, int col,
                                                   i64 (&res)[2]) {
  res[0] = res[1] = 0;
  if (m >= M_ROWS || col >= KOUT) return;
  const i64 at = (i64)m * KOUT + col;
  if constexpr (HAS_BIAS == 4) {  // int16 storage
    const u32 v = *reinterpret_cast<const u32*>(reinterpret_cast<const short*>(ea.thr) + at);
    res[0] = (short)(v & 0xffffu);
    res[1] = (short)(v >> 16);
  } else {
    const int2 v = *reinterpret_cast<const int2*>(ea.thr + at);
    res[0] = v.x;
    res[1] = v.y;
  }
}

// Two 16-bit values (fp16 bits or int16) of a column pair as one word, col in the low half.
__device__ __forceinline__ u32 int16_pair(const int (&v)[2]) {
  return ((u32)v[0] & 0xffffu) | ((u32)v[1] << 16);
}

// Store the output pair (col, col + 1) of row m (PAIR_STORE; v: epilogue_value's returns).
__device__ __forceinline__ void store_output_pair(const EpilogueArgs& ea, int m, int col,
                                                  const int (&v)[2]) {
  if (m >= M_ROWS || col >= KOUT) return;
  const i64 at = (i64)m * KOUT + col;
  if constexpr (OUT_MODE == 0) {
    *reinterpret_cast<int2*>(reinterpret_cast<int*>(ea.out) + at) = make_int2(v[0], v[1]);
  } else if constexpr (OUT_MODE == 1 || OUT_MODE == 4) {  // fp16 bits / int16
    *reinterpret_cast<u32*>(reinterpret_cast<unsigned short*>(ea.out) + at) = int16_pair(v);
  } else {
    *reinterpret_cast<unsigned short*>(reinterpret_cast<unsigned char*>(ea.out) + at) =
        (unsigned short)(((u32)v[0] & 0xffu) | (((u32)v[1] & 0xffu) << 8));
  }
}

// int16 outputs of an even number of n8 tiles per warp (KOUT % 4 == 0): lanes t4 and t4 ^ 1
// swap half their column pairs of tiles ni - 1 and ni, so each lane stores 4 adjacent columns as
// one 8-byte store and a quad writes 32 adjacent bytes of its row, a whole sector. The pair
// stores (4 bytes, a quad's 16-byte half sector per tile) ran at 1.07 TB/s on an H200 against
// the int32 pairs' (8 bytes, whole sectors) 2.9 TB/s (ResNet-50's 1x1 block ends, b256).
constexpr bool QUAD_STORE16 = OUT_MODE == 4 && PAIR_STORE && NT % 2 == 0 && KOUT % 4 == 0;
// a: this lane's pair of tile ni - 1 (columns col_a, col_a + 1; col_a = that tile's first
// column + 2 t4), b: its pair of tile ni. Even lanes store their a and the odd neighbour's a
// (columns col_a .. col_a + 3), odd lanes the even neighbour's b and their own (8 columns on).
__device__ __forceinline__ void store_int16_quad(const EpilogueArgs& ea, int m, int col_a, u32 a,
                                                 u32 b, int t4) {
  const bool odd = (t4 & 1) != 0;
  const u32 got = __shfl_xor_sync(0xffffffffu, odd ? a : b, 1);
  const int col = odd ? col_a + 6 : col_a;
  if (m >= M_ROWS || col >= KOUT) return;
  *reinterpret_cast<uint2*>(reinterpret_cast<short*>(ea.out) + (i64)m * KOUT + col) =
      odd ? make_uint2(got, b) : make_uint2(a, got);
}

