// The fused epilogue's terms: per-column parameters, plane products, row popcounts and the
// split-K partial sums (bitserial_epilogue.cu includes this).
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

