// The small kernels a bound launcher runs first (bitserial_kernel.py): per-column weight sums
// and thresholds per tap rectangle (bitserial_wtap), per-pixel popcounts (bitserial_xpop).

// First/last+1 kernel row (or column) whose input row lies inside [0, extent).
__device__ __forceinline__ void tap_range(int start, int extent, int taps, int& lo, int& hi) {
  lo = start < 0 ? -start : 0;
  hi = extent - start < taps ? extent - start : taps;
  if (hi < lo) hi = lo;
}

// Weight sums for binary activations, one warp per output column (coalesced over the words).
// Part 1, wtap[col*TAB + r*(S+1) + s] = sum over taps (r' < r, s' < s) of
// sum_j d_j popc(b_j[col, r', s', :]) (a 2-D prefix table; its last entry is the all-tap sum).
// Part 2, wtap[WSUM0 + rect_id(rlo, rhi, slo, shi)*KPAD + col] = A_BETA * W_ALPHA times the
// weight sum over the taps [rlo, rhi) x [slo, shi), plus A_BETA * W_BETA * C times their count
// (ba*ab*T + ba*bb*C*taps above): what an output pixel whose valid taps are that rectangle
// adds, one lookup in the epilogue. Rectangle-major with KPAD columns
// (bitserial_shape.wsum_columns: KOUT rounded up to the widest block tile; entries past KOUT are
// never written and only feed outputs that are discarded; rectangles no pixel has are not
// written either, rect_used), so one output row's lookups share a pointer and differ by
// compile-time offsets. Part 2 starts at WSUM0 (bitserial_shape.wsum_start: past part 1, even, so a
// lane reads its two adjacent columns as one 8-byte load).
// Part 3 (RECT_THR: threshold requantization of binary activations), at WTHR0 = WSUM0 + RECTS *
// KPAD: wtap[WTHR0 + (rect_id * KPAD + col) * THR_STRIDE + k] = thr[col][k] minus part 2's sum,
// clamped to int32 (exact: y >= t <=> y - s >= t - s, and a clamped bound is never / always
// met by an int32 y - s). The epilogue compares the plane products plus row terms with it
// directly: per output one multiply-add and the compares, no weight-sum load and add.
constexpr int TAB = (R + 1) * (S + 1);
constexpr int RECTS = TAB * TAB;
static_assert(WSUM0 >= KOUT * TAB && WSUM0 % 2 == 0, "bitserial_shape.wsum_start: after part 1, even");
constexpr bool NEED_WTAP = A_BETA != 0;        // binary activations: weight sums over valid taps
constexpr int THR_LEVELS = OUT_THRESH ? OUT_QMAX - OUT_QMIN : 1;
// THR_PAIRS: table words per column pair, one per level (3 padded to 4: one 16-byte load)
constexpr int PAIR_STRIDE = THR_LEVELS == 3 ? 4 : THR_LEVELS;
// THR_PAIRS (knob THR_PAIRS): a lane's accumulator columns hold contiguous output
// channels, the weights' B rows permuted to match. Column j of a warp tile (n8 tile ni = j / 8,
// lane t4 = j % 8 / 2, e = j % 2, the m16n8 fragment) holds channel
// pair_channel(j) = 2 NT t4 + 16 (ni / 8) + 8 e + ni % 8: lane t4 owns channels [2 NT t4,
// 2 NT (t4 + 1)), byte e (+ 2 per 8 tiles) of its bit words collecting bit ni % 8 of them.
__device__ __forceinline__ constexpr int pair_channel(int j) {
  return 2 * NT * (j % 8 / 2) + 16 * (j / 64) + 8 * (j % 2) + j / 8 % 8;
}
__device__ __forceinline__ constexpr int pair_column(int c) {  // the inverse
  return 8 * (c % 8 + 8 * (c % (2 * NT) / 16)) + 2 * (c / (2 * NT)) + c / 8 % 2;
}
// One 16-bit half of a THR_PAIRS table word for threshold t: 0x8000 + PAIR_YLO - t, t clamped
// to [PAIR_YLO, PAIR_YHI + 1] (every y lies in [PAIR_YLO, PAIR_YHI]: the compare is the same).
// T: int, or i64 for the wtap kernel's thresholds less their rectangle sums.
template <typename T> __device__ __forceinline__ int pair_threshold_half(T t) {
  return 0x8000 + PAIR_YLO - (t < PAIR_YLO ? PAIR_YLO : (t > PAIR_YHI ? PAIR_YHI + 1 : (int)t));
}
// THR_STRIDE (rendered, bitserial_shape.threshold_stride): ints per column in the threshold tables
static_assert(THR_STRIDE >= THR_LEVELS, "a column's thresholds fit its stride");
constexpr bool RECT_THR = OUT_THRESH && NEED_WTAP;
constexpr int WTHR0 = WSUM0 + RECTS * KPAD;
// Part 4 (RECT_THR with THR_PAIRS outside shared memory), at WPAIR0: part 3 packed for the pair
// epilogue, wtap[WPAIR0 + (rect_id * KPAD / 2 + p) * PAIR_STRIDE + k] holding the words of
// accumulator columns 2p, 2p + 1 (pair_thresholds), each column's warp writing its 16-bit half.
constexpr bool PAIR_WTAP = RECT_THR && THR_PAIRS && THR_SLOTS == 0;
constexpr int WPAIR0 = WTHR0 + RECTS * KPAD * THR_STRIDE;
__device__ __forceinline__ constexpr int rect_id(int rlo, int rhi, int slo, int shi) {
  return ((rlo * (R + 1) + rhi) * (S + 1) + slo) * (S + 1) + shi;
}
constexpr int FULL_RECT = rect_id(0, R, 0, S);  // all taps inside the image
// Whether some output pixel's valid taps along one axis (extent, taps, outputs) are [lo, hi):
// lo <= PAD always, and hi >= min(taps, extent + PAD - (outputs - 1) * STRIDE) unless the
// padding exceeds half the window (then tap_range may clamp hi to lo: no bound on hi). Only
// these rectangles are filled (16 of 256 for a padded 3x3) and read.
__device__ __forceinline__ constexpr bool rect_used(int lo, int hi, int extent, int taps,
                                                    int outputs) {
  const int last = extent + PAD - (outputs - 1) * STRIDE;
  const int hi_min = 2 * PAD > taps ? 0 : (taps < last ? taps : last);
  return lo <= hi && lo <= PAD && hi >= hi_min;
}
extern "C" __global__ void bitserial_wtap(const u32* __restrict__ w, const int* __restrict__ thr,
                                          int* __restrict__ wtap) {
  const int col = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (col >= KOUT) return;
  int* tab = wtap + col * TAB;
  for (int i = lane; i < S + 1; i += 32) tab[i] = 0;  // row r = 0
  int row_prefix = 0;  // only lane 0's copy is used
  for (int r = 0; r < R; ++r) {
    if (lane == 0) tab[(r + 1) * (S + 1)] = 0;
    row_prefix = 0;
    for (int s = 0; s < S; ++s) {
      int sum = 0;
      for (int i = lane; i < P_BITS * CW; i += 32) {
        const int j = i / CW, cw = i - j * CW;
        sum += w_coef(j) * __popc(w[j * W_PLANE + ((i64)col * RS + r * S + s) * CW + cw]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      row_prefix += sum;
      if (lane == 0) tab[(r + 1) * (S + 1) + s + 1] = tab[r * (S + 1) + s + 1] + row_prefix;
      __syncwarp();
    }
  }
  int* rect = wtap + WSUM0 + col;
  for (int i = lane; i < RECTS; i += 32) {
    const int shi = i % (S + 1), slo = i / (S + 1) % (S + 1);
    const int rhi = i / TAB % (R + 1), rlo = i / TAB / (R + 1);
    if (!rect_used(rlo, rhi, H, R, P_OUT) || !rect_used(slo, shi, W, S, Q_OUT)) continue;
    const int sum = A_BETA * W_ALPHA * (tab[rhi * (S + 1) + shi] - tab[rlo * (S + 1) + shi]
                                        - tab[rhi * (S + 1) + slo] + tab[rlo * (S + 1) + slo])
                    + A_BETA * W_BETA * C * (rhi - rlo) * (shi - slo);
    rect[i * KPAD] = sum;
    if constexpr (RECT_THR) {
      for (int k = 0; k < THR_LEVELS; ++k) {
        const i64 t = (i64)thr[col * THR_STRIDE + k] - sum;
        wtap[WTHR0 + ((i64)i * KPAD + col) * THR_STRIDE + k] =
            (int)(t < -2147483648ll ? -2147483648ll : (t > 2147483647ll ? 2147483647ll : t));
        if constexpr (PAIR_WTAP) {
          const int j = col / WN * WN + pair_column(col % WN);  // its accumulator column
          reinterpret_cast<unsigned short*>(wtap + WPAIR0)[
              (((i64)i * (KPAD / 2) + j / 2) * PAIR_STRIDE + k) * 2 + j % 2] =
              (unsigned short)pair_threshold_half(t);
        }
      }
    }
  }
}


// Popcount of each input pixel's channel words, per activation plane (ROWSUM_TABLE):
// xpop[i * PIXELS + pixel] = sum over words of popc(x plane i at pixel). XPOP_LANES adjacent
// lanes share a pixel and read its words side by side (coalesced; one thread per pixel walked
// 512-byte rows alone and cost 20-45 us on a 4096-row GEMM), then sum over the group with
// shuffles. No early return: every lane of a warp takes part in the shuffles.
extern "C" __global__ void bitserial_xpop(const u32* __restrict__ x, int* __restrict__ xpop) {
  if constexpr (CHAINED) {  // x is the previous kernel's output
    launch_dependents();
    grid_dependency_wait();
  }
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 pix = t / XPOP_LANES;
  const int j = (int)(t % XPOP_LANES);
  const bool ok = pix < PIXELS;
  for (int i = 0; i < Q_BITS; ++i) {
    int sum = 0;
    if (ok)
      for (int cw = j; cw < CW; cw += XPOP_LANES) sum += __popc(x[i * X_PLANE + pix * CW + cw]);
#pragma unroll
    for (int o = XPOP_LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (ok && j == 0) xpop[i * PIXELS + pix] = sum;
  }
}

