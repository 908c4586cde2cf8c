// ---- operand staging (shared by all kernels) ----

// VEC words shared -> shared (halo tile -> im2col stage), zeros when !valid, as a load and a
// store: a stage's loads all go first, since ptxas keeps a shared load after an earlier shared
// store it cannot prove apart, and load-store pairs wait out each load's latency in turn.
template <int V> struct SharedVecOf { typedef u32 type; };
template <> struct SharedVecOf<2> { typedef uint2 type; };
template <> struct SharedVecOf<4> { typedef uint4 type; };
typedef SharedVecOf<VEC>::type SharedVec;
__device__ __forceinline__ SharedVec load_shared_vec(const u32* src, bool valid) {
  SharedVec v{};
  if (valid) v = *reinterpret_cast<const SharedVec*>(src);
  return v;
}
__device__ __forceinline__ void store_shared_vec(u32* dst, SharedVec v) {
  *reinterpret_cast<SharedVec*>(dst) = v;
}


// Word offset of word wd (0..7) of k slab ks of row `row` in a stage tile of `rows` rows.
// mma.sync: a 32-byte row per slab. wgmma, SWIZZLE=0: 8 x 16-byte core matrices, each 128
// contiguous bytes; the two 16-byte k halves of a row 128 B apart (descriptor LBO), 8-row
// groups 256 B apart (SBO). wgmma, SWIZZLE=32: 32-byte rows whose 16-byte halves swap in rows
// 4..7 of each 8-row group (address bit 4 ^= bit 7), 8-row groups 256 B apart (SBO).
// Slabs are rows * 32 B apart.
__device__ __forceinline__ int slot(int rows, int row, int ks, int wd) {
  if constexpr (WGMMA && SWIZZLE == 32)
    return ks * rows * 8 + row * 8 + (((wd >> 2) ^ ((row >> 2) & 1)) << 2) + (wd & 3);
  if constexpr (WGMMA) return ks * rows * 8 + (row >> 3) * 64 + (wd >> 2) * 32 + (row & 7) * 4 + (wd & 3);
  return (ks * rows + row) * 8 + wd;
}
// Row of the B slab holding weight plane 0 of block column n (wgmma: planes of a warpgroup's
// WN columns are adjacent, plane j WN rows below plane 0).
__device__ __forceinline__ int b_row(int n) {
  if constexpr (THR_PAIRS) return (n / WN) * (P_BITS * WN) + pair_column(n % WN);  // wgmma
  return WGMMA ? (n / WN) * (P_BITS * WN) + n % WN : n;
}

// Per-thread copy rows of the activation tile at row m0: top-left input pixel of the window
// and its word offset in a plane (base; planes are < 2^31 words, bitserial_shape.py), rows past M
// with ih0 = -BIG so every tap is out of range and copies zero-fill.
struct ARows {
  int base[A_ITERS], ih0[A_ITERS], iw0[A_ITERS];
};
// 32-bit index math: rows + BM < 2^31 (bitserial_shape.py), and 64-bit divisions cost the persistent
// kernel, which calls this per stage, ~20% on 3x3 convs.
__device__ __forceinline__ ARows a_rows(i64 m0, int tid) {
  ARows ar;
#pragma unroll
  for (int it = 0; it < A_ITERS; ++it) {
    const int row = (tid + it * THREADS) / CPR;
    const int m = (int)m0 + row;
    const int qo = m % Q_OUT;
    const int t = m / Q_OUT;
    const int po = t % P_OUT;
    const bool ok = m < M_ROWS && row < BM;
    ar.ih0[it] = ok ? po * STRIDE - PAD : -(1 << 28);
    ar.iw0[it] = qo * STRIDE - PAD;
    ar.base[it] = ok ? ((t / P_OUT * H + ar.ih0[it]) * W + ar.iw0[it]) * CW : 0;
  }
  return ar;
}

// Tap (r, s) and channel word cw of k word kw of an im2col row, and whether kw < KW.
struct KWord {
  int r, s, cw, off;  // off: (r * W + s) * CW + cw, the word's offset from the window's base
  bool ok;
};
__device__ __forceinline__ KWord k_word(int kw) {
  const int tap = kw / CW, cw = kw - tap * CW;
  const int r = tap / S, s = tap - r * S;
  return KWord{r, s, cw, (r * W + s) * CW + cw, kw < KW};
}

// Duplicate-aware (halo) load, HALO=1: the input rows [row0, row0 + HALO_ROWS) of the flattened
// (image, row) axis that the block's output pixels touch, a contiguous slab of x, go to shared
// memory once (all planes, zeros past the tensor); the im2col stage tiles are then gathered
// shared -> shared, so each input pixel leaves L2 once per block instead of once per tap.
// Returns row0. Ends with a barrier: the slab is complete.
// (tid, nthreads: the threads that share the copies; HALO=1 with SLICES > 1, all of the block's)
__device__ __forceinline__ int halo_load(const u32* __restrict__ x, u32* halo, i64 m0, int tid,
                                         int nthreads = THREADS) {
  const int t0 = (int)(m0 / Q_OUT);
  const int ih0 = (t0 % P_OUT) * STRIDE - PAD;
  const int row0 = (t0 / P_OUT) * H + (ih0 > 0 ? ih0 : 0);
  const i64 src0 = (i64)row0 * W * CW, end = X_PLANE - src0;
  for (int idx = tid; idx < HALO_WORDS / VEC; idx += nthreads) {
    const bool valid = (i64)idx * VEC < end;
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
      copy_async(halo + i * HALO_WORDS + idx * VEC, x + i * X_PLANE + (valid ? src0 + idx * VEC : 0), valid);
  }
  copy_commit();
  copy_wait<0>();
  __syncthreads();
  return row0;
}

// A_IN_HALO: issue the copies of block tile `tile`'s input window into `halo` (layout above;
// zeros outside the image), all planes, 16-byte chunks [c0, c1), without a commit: they join
// the group of the stage committed next.
__device__ __forceinline__ void halo_tile_load(const u32* __restrict__ x, u32* halo, int tile,
                                               int tid, int nthreads, int c0, int c1) {
  const auto [n, iy0, ix0] = window_origin(tile);
  const int chunks = c1 - c0;
  for (int idx = tid; idx < HALO_PIX * chunks; idx += nthreads) {
    const int chunk = c0 + idx % chunks, pix = idx / chunks;  // a pixel's chunks coalesce
    const int iy = iy0 + pix / HALO_W, ix = ix0 + pix % HALO_W;
    const bool valid = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    const int src = valid ? ((n * H + iy) * W + ix) * CW + chunk * 4 : 0;
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
      copy_async(halo + halo_unit(i, chunk, pix) * 4, x + i * X_PLANE + src, valid);
  }
}
// A_IN_HALO's k slabs (256 channels of one tap) run channel group by channel group, the taps
// inside: slab j reads group j / RS of tap j % RS (k word slab_word(j)). The halo's chunks of
// group g are copied with the first stage (of the k slice) that reads them, so a block's first
// MMAs wait for 1 / (CW / 8) of its halo, not all of it (H100, APNN-TC conv w1a2: 5.4 us against
// 7.1 with the whole halo first, every k tile resident; NOTES.md).
__device__ __forceinline__ int slab_word(int j) { return j % RS * CW + j / RS * 8; }
// ... the halo's channel groups that k tile kt reads first in a slice starting at k tile k0
// (a group two slices read is copied by both, the same bytes)
__device__ __forceinline__ void halo_stage_load(const u32* __restrict__ x, u32* halo, int kt,
                                                int k0, int tid) {
  const int g0 = kt == k0 ? kt * KT / RS : (kt * KT + RS - 1) / RS;
  const int g1 = ((kt + 1) * KT + RS - 1) / RS;
  if (g0 < g1) halo_tile_load(x, halo, blockIdx.y, tid, THREADS, 2 * g0, 2 * g1);
}

// Issue the copies of k tile kt (all bit planes, im2col gather for A) into `stage`: cp.async from
// global memory, or with HALO=1 the A tile from the block's halo slab (rows from halo_row0).
__device__ __forceinline__ void load_stage(const u32* __restrict__ x, const u32* __restrict__ w,
                                           u32* stage, const ARows& ar, int n0, int kt, int tid,
                                           const u32* halo = nullptr, int halo_row0 = 0) {
  u32* sa = stage;
  u32* sb = stage + A_STAGE_WORDS;
  const int kbase = kt * TILE_WORDS;
  // THREADS % CPR == 0 (most configs): every chunk of this thread has the same chunk column,
  // so its tap and channel word are decoded once per stage, not per copy
  constexpr bool ONE_COLUMN = THREADS % CPR == 0;
  const KWord kw0 = k_word(kbase + (tid % CPR) * VEC);
  SharedVec halo_vals[HALO ? A_ITERS : 1][Q_BITS];  // HALO: loaded here, stored below
  u32* halo_dst[HALO ? A_ITERS : 1] = {};
#pragma unroll
  for (int it = 0; it < (A_IN_HALO ? 0 : A_ITERS); ++it) {
    const int idx = tid + it * THREADS;
    if ((BM * CPR) % THREADS == 0 || idx < BM * CPR) {
      const int row = idx / CPR, c = idx % CPR;
      const KWord k = ONE_COLUMN ? kw0 : k_word(kbase + c * VEC);
      const int ih = ar.ih0[it] + k.r, iw = ar.iw0[it] + k.s;
      const bool valid = k.ok && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
      u32* dst = sa + slot(BM, row, c / (8 / VEC), (c % (8 / VEC)) * VEC);
      if constexpr (HALO) {
        const int src = valid ? ar.base[it] + k.off - halo_row0 * W * CW : 0;
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) halo_vals[it][i] = load_shared_vec(halo + i * HALO_WORDS + src, valid);
        halo_dst[it] = dst;
      } else {
        const int src = valid ? ar.base[it] + k.off : 0;
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) copy_async(dst + i * A_PLANE_STEP, x + i * X_PLANE + src, valid);
      }
    }
  }
  if constexpr (HALO && !A_IN_HALO) {
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
      if (halo_dst[it] != nullptr)
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) store_shared_vec(halo_dst[it] + i * A_PLANE_STEP, halo_vals[it][i]);
  }
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    const int idx = tid + it * THREADS;
    if ((BN * CPR) % THREADS == 0 || idx < BN * CPR) {
      // B_BY_SLAB: 8 adjacent threads (a 16-byte access's shared-memory phase) copy 4 rows x 2
      // halves of one slab, 8 distinct 16-byte bank groups in the 32-byte swizzle, where a row's
      // 8 chunks (4 slabs x 2 halves) hit 2 of them (Nsight, H100: 4x the ideal wavefronts)
      const int row = B_BY_SLAB ? idx / 2 % BN : idx / CPR;
      const int c = B_BY_SLAB ? idx / (2 * BN) * 2 + idx % 2 : idx % CPR;
      const int kw = A_IN_HALO ? slab_word(kt * KT + c / 2) + c % 2 * 4 : kbase + c * VEC;
      const bool valid = kw < KW && n0 + row < KOUT;
      const i64 src = valid ? (i64)(n0 + row) * KW + kw : 0;
      u32* dst = sb + slot(B_ROWS, b_row(row), c / (8 / VEC), (c % (8 / VEC)) * VEC);
#pragma unroll
      for (int j = 0; j < P_BITS; ++j) copy_async(dst + j * B_PLANE_STEP, w + j * W_PLANE + src, valid);
    }
  }
}


// ---- persistent blocks (bitserial_mma_sync_persistent.cu, bitserial_wgmma_persistent.cu) ----
// A block takes tiles blockIdx.x, + gridDim.x, ..., and its copy pipeline runs across tile
// boundaries. The copy side: the tile the copies are at, with that tile's first column and its
// copy rows, decoded once per tile (a per-stage a_rows, three divisions per row, was half of
// the wgmma persistent kernel's ~130 instructions per k step). Past the last tile its rows lie
// past M.
struct TileLoads {
  int tile, n0;
  ARows ar;
};
__device__ __forceinline__ TileLoads tile_loads(int tile, int tid) {
  return TileLoads{tile, tile % N_COL_TILES * BN, a_rows((i64)(tile / N_COL_TILES) * BM, tid)};
}
// k tiles of the persistent wgmma loop unrolled: all of them up to 36 (a 3x3 conv over 1,024
// channels at KT=1), beyond that none
constexpr int K_UNROLL = KTILES <= 36 ? KTILES : 1;

