// One output tile per block on Hopper warpgroup MMA (sm_90a): wgmma.mma_async m64nNk256 b1 AND,
// both operands read from shared memory through descriptors (no fragment loads: the mma.sync
// path is co-limited by them). Needs bitserial_common.cu and the rendered wgmma_planes /
// wgmma_rowsum (bitserial.py) before it.
//
// Warpgroup (wg_m, wg_n) owns rows [64 wg_m, 64 wg_m + 64) and columns [WN wg_n, WN wg_n + WN)
// of the block tile; per k256 slab it issues one m64nNk256 (N = P_BITS * WN: all weight planes
// at once) per activation plane, and for binary weights one m64n8k256 against a tile of ones
// (the row popcounts). Pipeline: cp.async STAGES deep; stage kt is overwritten only after
// wgmma.wait_group 1 of the next k tile and a barrier, so one wgmma batch stays in flight.

__device__ __forceinline__ u64 smem_desc(const u32* p) {
  // start address >> 4 | LBO >> 4 << 16 | SBO >> 4 << 32 | swizzle mode << 62 (base offset 0:
  // every matrix starts on a 256-byte boundary). SWIZZLE=0: LBO 128 B (k halves of a core
  // matrix row), SBO 256 B (8-row groups). SWIZZLE=32 (mode 3): LBO unused (1), SBO 256 B.
  const u64 start = (smem_addr(p) & 0x3FFFF) >> 4;
  if constexpr (SWIZZLE == 32) return start | (1ull << 16) | ((u64)(256 >> 4) << 32) | (3ull << 62);
  return start | ((u64)(128 >> 4) << 16) | ((u64)(256 >> 4) << 32);
}
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
// </device-primitives>

constexpr int ONES_WORDS = ROWSUM_MMA ? 64 : 0;  // 8 rows x 32 bytes of ones
static_assert(STAGES >= 3, "wgmma pipeline keeps one stage in flight: STAGES >= 3");
static_assert(WM == 64 && BM % 64 == 0, "a warpgroup owns 64 rows");

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_wgmma(
    const u32* __restrict__ x, const u32* __restrict__ w, void* __restrict__ out,
    const int* __restrict__ bias, const float* __restrict__ scale,
    const int* __restrict__ mult, const int* __restrict__ shift, const int* __restrict__ wtap,
    const int* __restrict__ xpop) {
  extern __shared__ __align__(128) u32 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  const ARows ar = a_rows(m0, tid);
  u32* ones = smem + STAGES * STAGE_WORDS;
  if constexpr (ROWSUM_MMA) {
    for (int i = tid; i < ONES_WORDS; i += THREADS) ones[i] = 0xffffffffu;
  }
  u32* halo = ones + ONES_WORDS;  // HALO=1: the block's input slab
  const int halo_row0 = HALO ? halo_load(x, halo, m0, tid) : 0;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < KTILES) load_stage(x, w, smem + s * STAGE_WORDS, ar, n0, s, tid, halo, halo_row0);
    copy_commit();
  }
  for (int kt = 0; kt < KTILES; ++kt) {
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();  // stage kt landed everywhere; every warpgroup's wgmma of kt-2 has retired
    {
      const int next = kt + STAGES - 2;
      if (next < KTILES)
        load_stage(x, w, smem + (next % STAGES) * STAGE_WORDS, ar, n0, next, tid, halo, halo_row0);
      copy_commit();
    }
    const u32* sa = smem + (kt % STAGES) * STAGE_WORDS + wg_m * 64 * 8;
    const u32* sb = smem + (kt % STAGES) * STAGE_WORDS + A_STAGE_WORDS + wg_n * (P_BITS * WN) * 8;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KT; ++ks) {
      const u64 db = smem_desc(sb + ks * B_ROWS * 8);
#pragma unroll
      for (int i = 0; i < Q_BITS; ++i) {
        const u64 da = smem_desc(sa + i * A_PLANE_STEP + ks * BM * 8);
        wgmma_planes(acc[i], da, db);
        if constexpr (ROWSUM_MMA) wgmma_rowsum(rsum[i], da, smem_desc(ones));
      }
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  copy_wait<0>();

  u32* s_out = smem;  // packing tile over the operand stages, once every warpgroup is done
  if constexpr (PACK_IN_SMEM) pack_tile_clear(s_out, tid);
  const EpilogueArgs ea{out, bias, scale, mult, shift, wtap, xpop};
  epilogue_warp(acc, rsum, m0, n0, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, ea, s_out);
  if constexpr (PACK_IN_SMEM) pack_tile_store(s_out, out, m0, n0, tid);
}
