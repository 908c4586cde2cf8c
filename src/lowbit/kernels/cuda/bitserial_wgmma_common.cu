// What the Hopper warpgroup-MMA kernels share (bitserial_wgmma.cu: one tile per block;
// bitserial_wgmma_persistent.cu: persistent blocks; bitserial_tap_shift.cu): wgmma.mma_async
// m64nNk256 b1 AND, both operands read from shared memory through descriptors (no fragment
// loads: the mma.sync path is co-limited by them). Needs bitserial_common.cu before it.
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
// A_IN_HALO: the descriptor of the halo's first pixel, core matrices of 8 pixels: 8-row groups
// (pixel rows) HALO_W * 16 bytes apart, k halves (16-byte channel chunks) CHUNK_UNITS * 16 apart
__device__ __forceinline__ u64 halo_desc(const u32* halo) {
  return ((smem_addr(halo) & 0x3FFFF) >> 4) | ((u64)CHUNK_UNITS << 16) | ((u64)HALO_W << 32);
}
// ... and the 16-byte units from it to the A tile of k slab j (channel group j / RS of tap
// j % RS, slab_word) for warpgroup wg_m's pixel rows 8 wg_m..
__device__ __forceinline__ int halo_units(int j, int wg_m) {
  const int tap = j % RS, g = j / RS;
  return 2 * g * CHUNK_UNITS + (8 / PLANE_GROUPS * wg_m + tap / S) * PLANE_GROUPS * HALO_W +
         tap % S;
}
// TMA_HALO: the window's first channel block, on the first 1,024-byte boundary in `halo` (its
// slack: bitserial_layout.halo_bytes).
__device__ __forceinline__ u32* halo_tiles(u32* halo) {
  const u32 a = smem_addr(halo);
  return halo + (((a + 1023) & ~1023u) - a) / 4;
}
// ... and the descriptor of k slab j's A tile (channel group g = j / RS: block
// g / GROUPS_PER_BLOCK, bytes 32 (g % GROUPS_PER_BLOCK).. of each pixel row; tap j % RS) of
// activation plane i for warpgroup wg_m, read in place: TMA_HALO-byte swizzle, rows TMA_HALO
// bytes apart, 8-row groups (pixel rows) SBO = HALO_W * TMA_HALO bytes apart, LBO unused
// (1). Base offset 0: the swizzle pattern
// starts on its period's boundaries, where the tensor copies put it, so a row's phase is its
// address's (PTX ISA, matrix descriptor), wherever a tap's tile starts.
constexpr int GROUPS_PER_BLOCK = TMA_HALO ? TMA_HALO / 32 : 1;  // 256-channel groups per block
constexpr u64 HALO_SWIZZLE_MODE = TMA_HALO == 128 ? 1 : TMA_HALO == 64 ? 2 : 3;
__device__ __forceinline__ u64 halo_desc_swizzled(const u32* tiles, int j, int wg_m, int i) {
  const int tap = j % RS, g = j / RS;
  const u32 a = smem_addr(tiles) + (i * HALO_BLOCKS + g / GROUPS_PER_BLOCK) * HALO_BLOCK_BYTES +
                ((8 * wg_m + tap / S) * HALO_W + tap % S) * TMA_HALO + g % GROUPS_PER_BLOCK * 32;
  return ((a & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(HALO_W * TMA_HALO / 16) << 32) |
         (HALO_SWIZZLE_MODE << 62);
}
#include "bitserial_wgmma_device.cu"
// wgmma_planes, wgmma_rowsum (and wgmma_planes_ones): inline PTX rendered for this kernel's N
// (bitserial_render.wgmma_source), or the emulation's host versions
#include "bitserial_wgmma_ops.cu"

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
// wgmma accumulators alone). A_IN_HALO: the A tiles of k tile kt from `halo` (TMA_HALO: its
// channel blocks, halo_tiles).
__device__ __forceinline__ void wgmma_stage(Acc& acc, RowSum& rsum, const u32* stage,
                                            const u32* ones, int wg_m, int wg_n, bool accumulate,
                                            const u32* halo = nullptr, int kt = 0) {
  const u32* sa = stage + wg_m * 64 * 8;
  const u32* sb = stage + A_STAGE_WORDS + wg_n * (P_BITS * WN) * 8;
  const u64 dones = ROWSUM_ONES_TILE ? smem_desc(ones) : 0;  // no ones tile: none to address
  const u64 dhalo = A_IN_HALO ? halo_desc(halo) : 0;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    const u64 db = smem_desc(sb + ks * B_ROWS * 8);
#pragma unroll
    for (int i = 0; i < (PLANE_ROWS ? 1 : Q_BITS); ++i) {  // PLANE_ROWS: every plane's rows
      const u64 da = TMA_HALO ? halo_desc_swizzled(halo, kt * KT + ks, wg_m, i)
          : A_IN_HALO
          ? desc_offset(dhalo, halo_units(kt * KT + ks, wg_m) + i * HALO_CHUNKS * CHUNK_UNITS)
          : smem_desc(sa + i * A_PLANE_STEP + ks * BM * 8);
      const int acc_in = ks > 0 || accumulate;
      wgmma_plane(acc, rsum, i, da, db, dones, acc_in);
    }
  }
  wgmma_commit();
}

// PLANE_ROWS: rows g + 8 of this thread's accumulators (and row sums) hold plane 1 of rows
// g's pixel: moved into plane 1's registers of rows g, which the epilogue reads as that pixel's
// plane 1 (it drops rows g + 8).
__device__ __forceinline__ void planes_from_rows(Acc& acc, RowSum& rsum) {
  if constexpr (PLANE_ROWS) {
    static_assert(MT == 1, "a warpgroup's warp owns 16 rows");
#pragma unroll
    for (int j = 0; j < P_BITS; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[1][j][0][nt][0] = acc[0][j][0][nt][2];
        acc[1][j][0][nt][1] = acc[0][j][0][nt][3];
      }
    rsum[1][0][0] = rsum[0][0][2];
    rsum[1][0][1] = rsum[0][0][3];
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
              "bitserial_layout.slice_sum_words sizes the slices' sums");
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
