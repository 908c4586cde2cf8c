// ---- fused epilogue (shared by all kernels) ----

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
// Binary activations and padding: every output adds its tap rectangle's weight sum from
// bitserial_wtap's part 2 (one load per output through its row's pointer, branch-free), or with
// thresholds compares against part 3's, that sum folded in; without padding every pixel has the
// full rectangle, and that sum is a per-column offset.
constexpr bool BORDER = NEED_WTAP && PAD > 0;

// Per-column epilogue parameters (zeros past KOUT). off: the bias and, for binary activations
// without padding, the column's all-tap weight sum (both folded into the thresholds with
// OUT_THRESH). Loaded once per tile and lane: the epilogue walks columns outside rows.
// HAS_BIAS: 0 none, 1 int32 in accumulator units (off), 2 the shifted bias (Epilogue.shifted_bias,
// requantized outputs, multiply path): sbias, the column's int64 bias in units of 2^-shift
// output steps (the kernel's bias argument points at int64s then), added after the multiply;
// with thresholds it is folded into them on the host like any bias. (One parameter, not a new
// constexpr: an extra rendered constant alone changed the tap-shift kernel's SASS schedule.)
// HAS_BIAS 3 / 4: the shifted bias and a residual (Epilogue.residual; int32 / int16 storage),
// multiply path only: z = y m + b + res r in 64 bits, with int64 multipliers. No new parameter
// either: the pointers the multiply path leaves unused carry it (mult: int64 m, scale: int64 r,
// thr: the residual [M_ROWS][KOUT], NHWC like the output; bitserial_tables.epilogue_vectors).
// Requantized outputs (bytes or bit planes): the modes that read multipliers and shifts.
constexpr bool REQUANT_OUT = OUT_MODE == 2 || OUT_MODE == 3;
struct ColParams {
  int off, mult, shift;
  float scale;
  i64 sbias, wmult, rmult;
};
__device__ __forceinline__ ColParams col_params(const EpilogueArgs& ea, int col) {
  const bool ok = col < KOUT && !OUT_THRESH;
  const bool mul = REQUANT_OUT && ok;
  const int bias = (HAS_BIAS == 1 && ok) ? ea.bias[col] : 0;
  const int wall = (NEED_WTAP && !BORDER && ok) ? ea.wtap[WSUM0 + FULL_RECT * KPAD + col] : 0;
  const i64 sbias = (HAS_BIAS >= 2 && mul) ? reinterpret_cast<const i64*>(ea.bias)[col] : 0;
  const i64 wmult = (HAS_BIAS >= 3 && mul) ? reinterpret_cast<const i64*>(ea.mult)[col] : 0;
  const i64 rmult = (HAS_BIAS >= 3 && mul) ? reinterpret_cast<const i64*>(ea.scale)[col] : 0;
  return ColParams{bias + wall, (mul && HAS_BIAS < 3) ? ea.mult[col] : 0, mul ? ea.shift[col] : 1,
                   (OUT_MODE == 1 && ok) ? ea.scale[col] : 0.f, sbias, wmult, rmult};
}
typedef int PairThresholds[2][THR_LEVELS];  // columns col, col + 1
// The thresholds of a column pair (col even): 2 * THR_STRIDE adjacent ints at p, 8-byte
// aligned, read as 8- or 16-byte loads.
__device__ __forceinline__ void load_thresholds(const int* __restrict__ p, PairThresholds& thr) {
  constexpr int N = 2 * THR_STRIDE;
  int t[N];
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(p + i);
      t[i] = (int)v.x; t[i + 1] = (int)v.y; t[i + 2] = (int)v.z; t[i + 3] = (int)v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(p + i);
      t[i] = (int)v.x; t[i + 1] = (int)v.y;
    }
  }
#pragma unroll
  for (int k = 0; k < THR_LEVELS; ++k) { thr[0][k] = t[k]; thr[1][k] = t[THR_STRIDE + k]; }
}

// The plane products of accumulator register r of tile (mi, ni), combined (k-linear):
// A_ALPHA * W_ALPHA * sum_ij c_i d_j popc(a_i & b_j).
// FUSE_PLANES: the MMAs summed the activation planes into acc[0] already.
__device__ __forceinline__ int plane_dot(const Acc& acc, int mi, int ni, int r) {
  int y = 0;
#pragma unroll
  for (int i = 0; i < (FUSE_PLANES ? 1 : Q_BITS); ++i)
#pragma unroll
    for (int j = 0; j < P_BITS; ++j)
      y += (FUSE_PLANES ? 1 : a_coef(i)) * w_coef(j) * acc[i][j][mi][ni][r];
  return A_ALPHA * W_ALPHA * y;
}
// The row-popcount term of this lane's accumulator row (mi, h) from the row-sum MMA
// (ROWSUM_MMA; k-linear like the plane products), 0 otherwise.
__device__ __forceinline__ int rowsum_mma_term(const RowSum& rsum, int mi, int h) {
  int t = 0;
  if constexpr (ROWSUM_MMA) {
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i) t += a_coef(i) * rsum[i][mi][2 * h];
    t *= A_ALPHA * W_BETA;
  }
  return t;
}

// ROWSUM_TABLE: sum_i c_i popc(a_i) of output row m (pixel (n, po, qo)): the per-pixel table
// summed over the valid taps [rlo, rhi) x [slo, shi) (1x1 and GEMM: one lookup per plane).
__device__ __forceinline__ int table_row_popc(const int* __restrict__ xpop, int m, int po, int qo,
                                              int rlo, int rhi, int slo, int shi) {
  const i64 pix = (i64)(m / (P_OUT * Q_OUT)) * H * W + (i64)(po * STRIDE - PAD) * W
                  + qo * STRIDE - PAD;
  int total = 0;
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i) {
    int sum = 0;
    if constexpr (R * S == 1) {
      sum = xpop[i * PIXELS + pix];
    } else {
      for (int r = rlo; r < rhi; ++r)
        for (int s = slo; s < shi; ++s) sum += xpop[i * PIXELS + pix + r * W + s];
    }
    total += a_coef(i) * sum;
  }
  return total;
}

constexpr int OUT_WORD_TILES = WN / 32 > 0 ? WN / 32 : 1;

// SPLIT_K > 1: the k-linear sums of output row m, columns col, col + 1 (col even): every split's
// partial, this block's own included, read through L2 (ld.global.cg: other SMs wrote them
// during this launch). The own partial comes back from memory, not from the accumulators: on
// an H100 (NVRTC 13.0) wgmma accumulators kept live across split_arrive came back wrong in
// columns 16-31 of a 32-column warpgroup tile (s3 x b1 GEMM, BM = BN = 64), deterministically;
// the host emulation of the same text was exact.
__device__ __forceinline__ uint2 split_sum(const EpilogueArgs& ea, i64 m, int col) {
  const int* p = ea.split_ws + m * WS_COLS + col;
  uint2 sum = make_uint2(0u, 0u);
#pragma unroll
  for (int z = 0; z < SPLIT_K; ++z) {
    const uint2 v = __ldcg(reinterpret_cast<const uint2*>(p + z * WS_SPLIT));
    sum.x += v.x;
    sum.y += v.y;
  }
  return sum;
}

// The per-row part of the epilogue for this lane's accumulator rows (mi, h) (output row
// row0 + mi*16 + g + 8h of the block tile at m0), independent of the accumulators, so a kernel
// may work it out while its MMAs run: the padding terms and the table row sums (term; the
// row-sum MMA's part is added by tile_epilogue), and where the row's per-column data starts
// for this lane's first column col_base (rowp; the lane's columns col_base + ni*8 + e are
// compile-time offsets from it): OUT_THRESH, the thresholds (RECT_THR: of the row's tap
// rectangle, bitserial_wtap part 3); else BORDER, the weight sums of the row's tap rectangle
// (part 2).
typedef const int* RowPointers[MT][2];
typedef RowPos LaneRows[MT][2];  // this lane's accumulator rows (mi, h)
struct RowPrep {
  int m[MT][2];  // output rows (M_ROWS: dropped)
  int term[MT][2];
  int rect[MT][2];  // tap rectangle ids (RECT_THR with THR_SLOTS: the row table's slot ids)
  RowPointers rowp;
};
// Where a row's per-column data starts for column col_base (rect: the row's tap rectangle).
__device__ __forceinline__ const int* row_data(int rect, int col_base, const EpilogueArgs& ea) {
  if constexpr (PAIR_WTAP) return ea.wtap + WPAIR0 + (rect * (KPAD / 2) + col_base / 2) * PAIR_STRIDE;
  if constexpr (RECT_THR) return ea.wtap + WTHR0 + (rect * KPAD + col_base) * THR_STRIDE;
  else if constexpr (THR_PAIRS) return ea.thr + col_base / 2 * PAIR_STRIDE;  // packed pairs
  else if constexpr (OUT_THRESH) return ea.thr + col_base * THR_STRIDE;
  else if constexpr (BORDER) return ea.wtap + WSUM0 + rect * KPAD + col_base;
  return nullptr;
}
__device__ __forceinline__ RowPrep epilogue_rows(const LaneRows& pos, int n0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = pos[mi][h].m, po = pos[mi][h].po, qo = pos[mi][h].qo;
      int rlo = 0, rhi = R, slo = 0, shi = S;
      if constexpr (NEED_WTAP || ROWSUM_TABLE) {
        tap_range(po * STRIDE - PAD, H, R, rlo, rhi);
        tap_range(qo * STRIDE - PAD, W, S, slo, shi);
      }
      rows.rect[mi][h] = rect_id(rlo, rhi, slo, shi);
      rows.rowp[mi][h] = row_data(rows.rect[mi][h], col_base, ea);
      rows.m[mi][h] = m;
      int t = 0;
      if constexpr (ROWSUM_TABLE) {
        if (m < M_ROWS) t = A_ALPHA * W_BETA * table_row_popc(ea.xpop, m, po, qo, rlo, rhi, slo, shi);
      }
      rows.term[mi][h] = t;
    }
  return rows;
}
// ROW_TABLE (without ROWSUM="table"): the same from the per-row table that bind fills from the
// geometry alone (bitserial_tables.row_table): one 8-byte load per row instead of splitting the
// (virtual) row into (image, row, column), the margin test and the tap ranges (~40
// instructions per row, a fifth of a 32-output lane's tap-shift epilogue at C = 64). v0: the
// warp's first row (TAP_SHIFT: in the virtual grid).
__device__ __forceinline__ RowPrep table_rows(int v0, int n0, int col0, int lane,
                                              const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  const int2* table = reinterpret_cast<const int2*>(ea.vrows) + v0 + (lane >> 2);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int2 e = __ldg(table + mi * 16 + 8 * h);
      rows.m[mi][h] = e.x;
      rows.rect[mi][h] = e.y;
      rows.rowp[mi][h] = row_data(e.y, col_base, ea);
      rows.term[mi][h] = 0;
    }
  return rows;
}
__device__ __forceinline__ RowPrep epilogue_rows(int m0, int n0, int row0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  if constexpr (ROW_TABLE) return table_rows(m0 + row0, n0, col0, lane, ea);
  LaneRows pos;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mi][h] = row_pos(m0 + row0 + mi * 16 + (lane >> 2) + 8 * h);
  return epilogue_rows(pos, n0, col0, lane, ea);
}

// The per-column data this lane's epilogue will read (RowPrep's tables at rowp, the column
// parameters), prefetched into L1 (a one-tile block's epilogue then finds them there instead
// of waiting an L2 round trip after its last MMA). A hint: THR_PAIRS' packed tables are left
// out, and nothing is read.
__device__ __forceinline__ void prefetch_row_data(const RowPrep& rows, int col_base,
                                                  const EpilogueArgs& ea) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        if constexpr (OUT_THRESH && !THR_PAIRS) {
          if (RECT_THR || (mi == 0 && h == 0)) prefetch_l1(rows.rowp[mi][h] + ni * 8 * THR_STRIDE);
        } else if constexpr (BORDER && !OUT_THRESH) {
          prefetch_l1(rows.rowp[mi][h] + ni * 8);
        }
      }
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    const int col = col_base + ni * 8;
    if (OUT_THRESH || col >= KOUT) continue;
    if constexpr (HAS_BIAS == 5) {  // the block-end column table (bitserial_block_end.cu)
      prefetch_l1(reinterpret_cast<const uint4*>(ea.mult) + col);
      continue;
    }
    if constexpr (HAS_BIAS == 1) prefetch_l1(ea.bias + col);
    if constexpr (HAS_BIAS >= 2) prefetch_l1(reinterpret_cast<const i64*>(ea.bias) + col);
    if constexpr (HAS_BIAS >= 3)
      prefetch_l1(reinterpret_cast<const i64*>(ea.mult) + col),
          prefetch_l1(reinterpret_cast<const i64*>(ea.scale) + col);
    if constexpr (REQUANT_OUT) prefetch_l1(ea.mult + col), prefetch_l1(ea.shift + col);
    if constexpr (OUT_MODE == 1) prefetch_l1(ea.scale + col);
  }
}

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

// The per-column part: columns outer (their parameters loaded once), this lane's rows inner.
__device__ __forceinline__ void epilogue_cols(const Acc& acc, const RowPrep& rows, int m0, int n0,
                                              int row0, int col0, int lane,
                                              const EpilogueArgs& ea, u32* s_out) {
  const auto& term = rows.term;
  const auto& rowp = rows.rowp;
  const int g = lane >> 2, t4 = lane & 3;
  // this lane's bits of each 32-column word, at positions 8 * (ni % 4) + e: shifted by 2 * t4
  // once per word at the store instead of once per output
  u32 word_bits[MT][2][OUT_WORD_TILES][OUT_BITS];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int wd = 0; wd < OUT_WORD_TILES; ++wd)
#pragma unroll
        for (int b = 0; b < OUT_BITS; ++b) word_bits[mi][h][wd][b] = 0;
  u32 int16_prev[MT][2];  // QUAD_STORE16: the previous (even) tile's pairs
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    int pats[MT][2][2];
    uint2 wpair[MT][2];           // BORDER: the tap-rectangle weight sums of this lane's column pair
    uint2 splits[MT][2];          // SPLIT_K > 1: the k-linear sums of that pair (split_sum)
    PairThresholds thr[MT][2];    // OUT_THRESH: that pair's thresholds, per row
    i64 res[MT][2][2];            // RES_PAIRS: that pair's residuals, per row
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (OUT_THRESH) {
          if (RECT_THR || (mi == 0 && h == 0)) {
            load_thresholds(rowp[mi][h] + ni * 8 * THR_STRIDE, thr[mi][h]);
          } else {  // one table for every row: the first row's pair
#pragma unroll
            for (int k = 0; k < THR_LEVELS; ++k) {
              thr[mi][h][0][k] = thr[0][0][0][k];
              thr[mi][h][1][k] = thr[0][0][1][k];
            }
          }
        } else if constexpr (BORDER) {
          wpair[mi][h] = *reinterpret_cast<const uint2*>(rowp[mi][h] + ni * 8);
        }
        if constexpr (SPLIT_K > 1)
          splits[mi][h] = split_sum(ea, m0 + row0 + mi * 16 + g + 8 * h, n0 + col0 + ni * 8 + 2 * t4);
        if constexpr (RES_PAIRS) load_residual_pair(ea, rows.m[mi][h], n0 + col0 + ni * 8 + 2 * t4, res[mi][h]);
      }
    const ColParams cps[2] = {col_params(ea, n0 + col0 + ni * 8 + 2 * t4),
                              col_params(ea, n0 + col0 + ni * 8 + 2 * t4 + 1)};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + col0 + ni * 8 + 2 * t4 + e;
      const ColParams& cp = cps[e];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int y = term[mi][h] + cp.off;
          if constexpr (SPLIT_K > 1) {
            y += e ? (int)splits[mi][h].y : (int)splits[mi][h].x;
          } else {
            y += plane_dot(acc, mi, ni, 2 * h + e);
          }
          if constexpr (BORDER && !OUT_THRESH) y += e ? (int)wpair[mi][h].y : (int)wpair[mi][h].x;
          if constexpr (OUT_THRESH && !PACK_IN_SMEM) {  // straight into the packed words
            bool bits[OUT_BITS];
            threshold_bits(y, thr[mi][h][e], bits);
#pragma unroll
            for (int b = 0; b < OUT_BITS; ++b)
              or_if(word_bits[mi][h][ni / 4][b], bits[b], 1u << ((ni % 4) * 8 + e));
          } else {
            pats[mi][h][e] = epilogue_value(y, cp, thr[mi][h][e], rows.m[mi][h], col, ea,
                                            RES_PAIRS ? res[mi][h][e] : 0);
          }
        }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (QUAD_STORE16) {
          if (ni % 2 == 0) {
            int16_prev[mi][h] = int16_pair(pats[mi][h]);
          } else {
            store_int16_quad(ea, rows.m[mi][h], n0 + col0 + (ni - 1) * 8 + 2 * t4,
                             int16_prev[mi][h], int16_pair(pats[mi][h]), t4);
          }
        } else if constexpr (PAIR_STORE) {
          store_output_pair(ea, rows.m[mi][h], n0 + col0 + ni * 8 + 2 * t4, pats[mi][h]);
        } else if constexpr (PACK_IN_SMEM) {
          const int c0 = col0 + ni * 8;  // first column of this n8 tile in the block
          const int row = row0 + mi * 16 + g + 8 * h;
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b) {
            u32 bits = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) bits |= (u32)((pats[mi][h][e] >> b) & 1) << (c0 % 32 + 2 * t4 + e);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
            if (t4 == 0) atomicOr(&s_out[(b * BM + row) * BLOCK_WORDS + c0 / 32], bits);
          }
        } else if constexpr (OUT_MODE == 3 && !OUT_THRESH) {
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              word_bits[mi][h][ni / 4][b] |= (u32)((pats[mi][h][e] >> b) & 1) << ((ni % 4) * 8 + e);
        }
      }
  }
  if constexpr (OUT_MODE == 3 && !PACK_IN_SMEM) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_row_words(word_bits[mi][h], rows.m[mi][h], (n0 + col0) / 32, t4, ea);
  }
}

#include "bitserial_epilogue_pairs.cu"
#if LOWBIT_BLOCK_END  // (its constants exist in block-end kernels only)
#include "bitserial_block_end.cu"
#endif

// The fused epilogue of the block tile at (m0, n0), this warp's rows row0 + mi*16 + g (+8) and
// columns col0 + ni*8 + 2*t4 (+1): combines the planes (see the top of this file), adds the
// bias, ReLU, then int32 / fp16 / requantized INT8 or bit planes, through the packing tile s_out
// where warp tiles are narrower than a word. rows: epilogue_rows of the same tile and warp.
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, RowPrep rows,
                                              int m0, int n0, int row0, int col0, int lane,
                                              int tid, const EpilogueArgs& ea, u32* s_out) {
  if constexpr (SPLIT_K == 1) {  // split-K: the row-sum MMA's part is in split_sum
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) rows.term[mi][h] += rowsum_mma_term(rsum, mi, h);
  }
#if LOWBIT_BLOCK_END
  block_end_cols(acc, rows, m0, n0, row0, col0, lane, ea);
  return;
#endif
  if constexpr (PACK_IN_SMEM) pack_tile_clear(s_out, tid);
  if constexpr (THR_PAIRS) {
    epilogue_pairs(acc, rows, n0, col0, lane, ea);
    return;
  }
  epilogue_cols(acc, rows, m0, n0, row0, col0, lane, ea, s_out);
  if constexpr (PACK_IN_SMEM) pack_tile_store(s_out, ea.out, m0, n0, tid);
}
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, int m0, int n0,
                                              int row0, int col0, int lane, int tid,
                                              const EpilogueArgs& ea, u32* s_out) {
  tile_epilogue(acc, rsum, epilogue_rows(m0, n0, row0, col0, lane, ea), m0, n0, row0, col0, lane,
                tid, ea, s_out);
}

