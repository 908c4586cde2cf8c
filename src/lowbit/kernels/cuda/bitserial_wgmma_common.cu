// What the Hopper warpgroup-MMA kernels share (bitserial_wgmma.cu: one tile per block;
// bitserial_wgmma_persistent.cu: persistent blocks): wgmma.mma_async m64nNk256 b1 AND, both
// operands read from shared memory through descriptors (no fragment loads: the mma.sync path is
// co-limited by them). Needs bitserial_common.cu and the rendered wgmma_planes / wgmma_rowsum
// (bitserial.py) before it.
//
// Warpgroup (wg_m, wg_n) owns rows [64 wg_m, 64 wg_m + 64) and columns [WN wg_n, WN wg_n + WN)
// of the block tile; per k256 slab it issues one m64nNk256 (N = P_BITS * WN: all weight planes
// at once) per activation plane, and for binary weights (ROWSUM_MMA) one m64n8k256 against a
// tile of ones (the row popcounts). Pipeline: cp.async STAGES deep; stage kt is overwritten only
// after wgmma.wait_group 1 of the next k tile and a barrier, so one wgmma batch stays in flight.

__device__ __forceinline__ u64 smem_desc(const u32* p) {
  // start address >> 4 | LBO >> 4 << 16 | SBO >> 4 << 32 | swizzle mode << 62 (base offset 0:
  // every matrix starts on a 256-byte boundary). SWIZZLE=0: LBO 128 B (k halves of a core
  // matrix row), SBO 256 B (8-row groups). SWIZZLE=32 (mode 3): LBO unused (1), SBO 256 B.
  const u64 start = (smem_addr(p) & 0x3FFFF) >> 4;
  if constexpr (SWIZZLE == 32) return start | (1ull << 16) | ((u64)(256 >> 4) << 32) | (3ull << 62);
  return start | ((u64)(128 >> 4) << 16) | ((u64)(256 >> 4) << 32);
}
// A descriptor `units` 16-byte units past `desc` (and `lbo` added to its LBO field): one 32-bit
// add to the low word, which holds the start address (bits 0-13; a shared address stays below
// 2^18 bytes, so no carry leaves the field) and the LBO (bits 16-29), instead of rebuilding it
// from the address for every k step.
__device__ __forceinline__ u64 desc_offset(u64 desc, int units, int lbo = 0) {
  const u32 lo = (u32)desc + (u32)units + ((u32)lbo << 16);
  return ((desc >> 32) << 32) | lo;
}
typedef u32 AFrags[KT][Q_BITS][4];  // A_REGS: one stage's A fragments (k slab, plane)
// <device-primitives> (bitserial_emu.py replaces this region with host versions)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async one.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The registers of `a` live (unchanged) up to here: an empty asm that reads them.
__device__ __forceinline__ void hold_registers(const AFrags& a) {
#pragma unroll
  for (int ks = 0; ks < KT; ++ks)
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) asm volatile("" :: "r"(a[ks][i][r]));
}
// </device-primitives>

// The MMAs of activation plane i (descriptor da) x all weight planes (db) at one k step, and
// for binary weights the plane's row popcounts: ROWSUM_COLS from the same wgmma's ones columns,
// else from a wgmma against the ones tile at `dones` (ROWSUM_ONES_TILE). The products go into
// acc[i], or with FUSE_PLANES a_coef(i) times into acc[0] (a0 + a1 + a1; only a tile's very
// first MMA overwrites: acc_in applies to plane 0's first issue).
__device__ __forceinline__ void wgmma_plane(Acc& acc, RowSum& rsum, int i, u64 da, u64 db,
                                            u64 dones, int acc_in) {
  if constexpr (ROWSUM_COLS) {
    wgmma_planes_ones(acc[i], rsum[i], da, db, acc_in);
    return;
  }
  if constexpr (FUSE_PLANES) {
#pragma unroll
    for (int rep = 0; rep < a_coef(i); ++rep)
      wgmma_planes(acc[0], da, db, i == 0 && rep == 0 ? acc_in : 1);
  } else {
    wgmma_planes(acc[i], da, db, acc_in);
  }
  if constexpr (ROWSUM_ONES_TILE) wgmma_rowsum(rsum[i], da, dones, acc_in);
}

constexpr int ONES_WORDS = ROWSUM_ONES_TILE ? 64 : 0;  // 8 rows x 32 bytes of ones
static_assert(STAGES >= 3, "wgmma pipeline keeps one stage in flight: STAGES >= 3");
static_assert(WM == 64 && BM % 64 == 0, "a warpgroup owns 64 rows");

// The wgmma batch of one stage: every activation plane x all weight planes of this
// warpgroup's columns, KT k256 slabs (committed as one group; the caller waits). accumulate =
// false on a tile's first stage: its first slab overwrites the accumulators (zero_acc leaves
// wgmma accumulators alone).
__device__ __forceinline__ void wgmma_stage(Acc& acc, RowSum& rsum, const u32* stage,
                                            const u32* ones, int wg_m, int wg_n, bool accumulate) {
  const u32* sa = stage + wg_m * 64 * 8;
  const u32* sb = stage + A_STAGE_WORDS + wg_n * (P_BITS * WN) * 8;
  const u64 dones = ROWSUM_ONES_TILE ? smem_desc(ones) : 0;  // no ones tile: none to address
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    const u64 db = smem_desc(sb + ks * B_ROWS * 8);
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i) {
      const u64 da = smem_desc(sa + i * A_PLANE_STEP + ks * BM * 8);
      const int acc_in = ks > 0 || accumulate;
      wgmma_plane(acc, rsum, i, da, db, dones, acc_in);
    }
  }
  wgmma_commit();
}

// ---- A_REGS: the A operand in registers, loaded from the halo slab ----
// The gather of im2col stage tiles from the halo (shared -> registers -> shared) and the wgmma
// reading them back took 3.3 of 7.9 us of the APNN-TC conv (apconv_probe "no_gather", H100):
// the block's shared-memory traffic, not its copies from L2, set its time. Register A reads
// each fragment word from the halo once.

// This thread's two A rows of its warp (rows 16 w + g and + 8 of the warpgroup's 64, lane
// g t4): the halo pixel of each row's window origin (before the slab for a padded row) and the
// origin's input row and column for the bounds test (rows past M fail it).
struct FragRows {
  int pix[2], ih0[2], iw0[2];
};
__device__ __forceinline__ FragRows frag_rows(i64 m0, int row0, int lane, int halo_row0) {
  FragRows fr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = (int)m0 + row0 + (lane >> 2) + 8 * h;
    const int qo = m % Q_OUT, t = m / Q_OUT, po = t % P_OUT;
    const bool ok = m < M_ROWS;
    fr.ih0[h] = ok ? po * STRIDE - PAD : -(1 << 28);
    fr.iw0[h] = qo * STRIDE - PAD;
    fr.pix[h] = ok ? ((t / P_OUT) * H + fr.ih0[h] - halo_row0) * W + fr.iw0[h] : 0;
  }
  return fr;
}
// The A fragment of k slab `slab` (im2col words 8 slab .. + 7, inside one tap: CW % 8 == 0) in
// one activation plane of the halo: a[h] = word t4 of row h, a[2 + h] = word 4 + t4, zeros
// outside the image or past KW (the m16n8k256 fragment of this warp's 16 rows).
__device__ __forceinline__ void load_a_frag(u32 (&a)[4], const u32* plane, const FragRows& fr,
                                            int slab, int lane) {
  const int kw = slab * 8, tap = kw / CW, cw = kw - tap * CW;
  const int r = tap / S, s = tap - r * S;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool valid = kw < KW && (unsigned)(fr.ih0[h] + r) < (unsigned)H
                       && (unsigned)(fr.iw0[h] + s) < (unsigned)W;
    // chunks cw / 4 (even) and cw / 4 + 1 of the pixel: swizzled, one offset bit apart
    const int off = valid ? halo_chunk(fr.pix[h] + r * W + s, cw / 4) + (lane & 3) : 0;
    a[h] = valid ? plane[off] : 0u;
    a[2 + h] = valid ? plane[off ^ 4] : 0u;
  }
}
// Every A fragment of stage kt into `a` (KT slabs x activation planes).
__device__ __forceinline__ void load_stage_frags(AFrags& a, const u32* halo, const FragRows& fr,
                                                 int kt, int lane) {
#pragma unroll
  for (int ks = 0; ks < KT; ++ks)
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i) load_a_frag(a[ks][i], halo + i * HALO_WORDS, fr, kt * KT + ks, lane);
}
// wgmma_stage with A from registers `a` (loaded by load_stage_frags; they must stay untouched
// until the group has retired): fenced first (wgmma reads registers written before
// wgmma.fence), then the MMAs issue as one group.
// (A body under `if constexpr`: the register-A wrappers exist only in A_REGS renders.)
__device__ __forceinline__ void wgmma_stage_regs(Acc& acc, RowSum& rsum, const u32* stage,
                                                 const u32* ones, int wg_n, bool accumulate,
                                                 const AFrags& a) {
  if constexpr (A_REGS) {
    const u32* sb = stage + wg_n * (P_BITS * WN) * 8;
    const u64 dones = ROWSUM_ONES_TILE ? smem_desc(ones) : 0;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KT; ++ks) {
      const u64 db = smem_desc(sb + ks * B_ROWS * 8);
#pragma unroll
      for (int i = 0; i < Q_BITS; ++i) {
        const int acc_in = ks > 0 || accumulate;
        if constexpr (ROWSUM_COLS) {
          wgmma_planes_ones_rs(acc[i], rsum[i], a[ks][i], db, acc_in);
        } else {
          wgmma_planes_rs(acc[i], a[ks][i], db, acc_in);
          if constexpr (ROWSUM_ONES_TILE) wgmma_rowsum_rs(rsum[i], a[ks][i], dones, acc_in);
        }
      }
    }
    wgmma_commit();
  }
}

// The 256-byte tile of ones the row-sum wgmma multiplies with (ROWSUM_ONES_TILE), filled once.
__device__ __forceinline__ void fill_ones(u32* ones, int tid) {
  if constexpr (ONES_WORDS > 0) {
    for (int i = tid; i < ONES_WORDS; i += THREADS) ones[i] = 0xffffffffu;
  }
}
// ROWSUM_COLS: rows P_BITS * BN.. of each k slab's B tile in every stage of `stages`, 8 of ones
// and 8 of zeros, written once (the stage copies write only the weight rows).
__device__ __forceinline__ void fill_stage_ones_rows(u32* stages, int tid) {
  if constexpr (ROWSUM_COLS) {
    for (int i = tid; i < STAGES * KT * ONES_ROWS * 8; i += THREADS) {
      const int s = i / (KT * ONES_ROWS * 8), ks = i / (ONES_ROWS * 8) % KT;
      const int row = i / 8 % ONES_ROWS, wd = i % 8;
      stages[s * STAGE_WORDS + A_STAGE_WORDS + slot(B_ROWS, P_BITS * BN + row, ks, wd)] =
          row < 8 ? ~0u : 0u;
    }
  }
}

// SLICES > 1: the k slices past the first leave their partial sums in shared memory (word w of
// thread t of slice s at [s - 1][w][t]: consecutive threads, consecutive banks) and the first
// slice adds them. Only what the MMAs wrote: FUSE_PLANES leaves acc[1] unused, and the row sums
// exist with binary weights' ones tile or ones columns.
static_assert(SLICES == 1 || SLICE_SUM_WORDS * 4 >= (int)(sizeof(Acc) + sizeof(RowSum)),
              "bitserial.slice_sum_words sizes the slices' sums");
template <bool ADD>
__device__ __forceinline__ void slice_sums(Acc& acc, RowSum& rsum, int* buf, int tid) {
  int w = 0;
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
    for (int j = 0; j < P_BITS; ++j)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e, ++w) {
            if (FUSE_PLANES && i > 0) continue;
            if constexpr (ADD) acc[i][j][mi][ni][e] += buf[w * THREADS + tid];
            else buf[w * THREADS + tid] = acc[i][j][mi][ni][e];
          }
  if constexpr (!ROWSUM_COLS && !ROWSUM_ONES_TILE) return;
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int e = 0; e < RS_REGS; ++e, ++w) {
        if constexpr (ADD) rsum[i][mi][e] += buf[w * THREADS + tid];
        else buf[w * THREADS + tid] = rsum[i][mi][e];
      }
}
// After every slice's last MMA: the first slice holds the tile's sums; the others return false.
__device__ __forceinline__ bool slices_reduce(Acc& acc, RowSum& rsum, u32* smem, int slice,
                                              int tid) {
  int* buf = reinterpret_cast<int*>(smem);
  __syncthreads();  // every slice is done with its stages (the sums go over them)
  if (slice > 0) slice_sums<false>(acc, rsum, buf + (slice - 1) * SLICE_SUM_WORDS * THREADS, tid);
  __syncthreads();
  if (slice > 0) return false;
#pragma unroll
  for (int s = 1; s < SLICES; ++s) slice_sums<true>(acc, rsum, buf + (s - 1) * SLICE_SUM_WORDS * THREADS, tid);
  tile_sync();  // the first slice has read every sum before its epilogue reuses the memory
  return true;
}
