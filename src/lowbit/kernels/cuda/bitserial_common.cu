// Bit-serial (APNN-TC) conv2d / GEMM on 1-bit tensor cores: mma.sync m16n8k256 b1 .and.popc.
// Rendered by bitserial.py, which prepends the constexpr parameters (shape, encodings, tiles).
//
// GEMM view: rows m = output pixels (n, p, q) [GEMM: rows of a], columns = filters [GEMM: rows
// of b], reduction over k words = (r, s, 32-channel word) of the bit planes. Each warp keeps one
// int32 accumulator set per (activation plane i, weight plane j): the q activation planes and p
// weight planes form a virtual (Q_BITS*BM) x (P_BITS*BN) binary GEMM whose shared-memory tiles
// are loaded once per k tile and reused for every plane pair (APNN-TC's batch-based caching).
// The epilogue combines the planes with their coefficients (reference/bitserial.py):
//   acc = aa*ab*sum c_i d_j popc(a_i&b_j) + aa*bb*sum c_i popc(a_i) + ba*ab*T + ba*bb*C*taps
// where T = sum of d_j popc(b_j) over the taps that fall inside the image (input-aware padding:
// padded pixels are zero words, so they add nothing to the AND products).

typedef unsigned int u32;
typedef long long i64;

constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN, THREADS = WARPS_M * WARPS_N * 32;
constexpr int MT = WM / 16, NT = WN / 8;       // mma tiles per warp
constexpr int TILE_WORDS = KT * 8;             // k words per pipeline stage (8 words = k256)
constexpr int KW = R * S * CW;                 // k words of one im2col row
constexpr int KTILES = (KW + TILE_WORDS - 1) / TILE_WORDS;
constexpr int A_PLANE_WORDS = KT * BM * 8, B_PLANE_WORDS = KT * BN * 8;
constexpr int A_STAGE_WORDS = Q_BITS * A_PLANE_WORDS;
constexpr int STAGE_WORDS = A_STAGE_WORDS + P_BITS * B_PLANE_WORDS;
constexpr int CPR = TILE_WORDS / VEC;          // copy chunks per row per stage
constexpr int A_ITERS = (BM * CPR + THREADS - 1) / THREADS;
constexpr int B_ITERS = (BN * CPR + THREADS - 1) / THREADS;
constexpr i64 X_PLANE = (i64)NB * H * W * CW;  // words per activation plane
constexpr i64 W_PLANE = (i64)KOUT * KW;        // words per weight plane
constexpr int RS = R * S;
constexpr int OUT_WORDS = (KOUT + 31) / 32;    // words per row of bit-plane output
constexpr bool NEED_ROWSUM = W_BETA != 0;      // binary weights: sum_i c_i popc(a_i)
constexpr bool NEED_WTAP = A_BETA != 0;        // binary activations: weight sums over valid taps
// Bit-plane output: a warp owning whole 32-column words packs them in registers; narrower warp
// tiles OR their bits into a shared-memory tile of the block's words first.
constexpr bool PACK_IN_SMEM = OUT_MODE == 3 && WN % 32 != 0;
constexpr int BLOCK_WORDS = BN >= 32 ? BN / 32 : 1;
constexpr int N_COL_TILES = (KOUT + BN - 1) / BN;
constexpr int N_TILES = N_COL_TILES * (int)((M_ROWS + BM - 1) / BM);

__device__ __forceinline__ constexpr int a_coef(int i) {
  return (A_SIGNED && i == Q_BITS - 1) ? -(1 << i) : (1 << i);
}
__device__ __forceinline__ constexpr int w_coef(int j) {
  return (W_SIGNED && j == P_BITS - 1) ? -(1 << j) : (1 << j);
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// Copy VEC words global -> shared; zero-fill when !valid (out of image, past K, past rows).
__device__ __forceinline__ void copy_async(u32* dst, const u32* src, bool valid) {
  const u32 d = smem_addr(dst);
  const int n = valid ? VEC * 4 : 0;
  if constexpr (VEC == 4) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else if constexpr (VEC == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(n));
  }
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

__device__ __forceinline__ void mma_and(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}

// First/last+1 kernel row (or column) whose input row lies inside [0, extent).
__device__ __forceinline__ void tap_range(int start, int extent, int taps, int& lo, int& hi) {
  lo = start < 0 ? -start : 0;
  hi = extent - start < taps ? extent - start : taps;
  if (hi < lo) hi = lo;
}

// Weight sums for binary activations, one warp per output column (coalesced over the words):
// wtap[col*TAB + r*(S+1) + s] = sum over taps (r' < r, s' < s) of sum_j d_j popc(b_j[col, r', s', :])
// (a 2-D prefix table: the sum over any rectangle of valid taps is 4 lookups).
constexpr int TAB = (R + 1) * (S + 1);
extern "C" __global__ void bitserial_wtap(const u32* __restrict__ w, int* __restrict__ wtap) {
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
}

