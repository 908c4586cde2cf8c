// Persistent blocks on Hopper warpgroup MMA (sm_90a): tiles blockIdx.x, +gridDim.x, ... with
// the cp.async pipeline running across tile boundaries (as bitserial_persistent.cu does for
// mma.sync), so the next tile's first stages load while this tile's last wgmma batches and its
// epilogue run: a GEMM 4096 tile of w1a1 has only 4 k tiles of KT=4, so a one-tile block
// exposes its pipeline fill and epilogue once per 4 steps. Needs bitserial_common.cu, the
// rendered wgmma wrappers and bitserial_wgmma_common.cu before it.

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_wgmma_persistent(
    BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const int iters = persistent_iters();
  u32* ones = smem + STAGES * STAGE_WORDS;
  fill_ones(ones, tid);
  u32* s_out = ones + ONES_WORDS;  // packing tile apart: the next tiles' copies are in flight
  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  LoadCursor cursor = load_cursor(tid);

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < iters) load_next_stage(x, w, smem + s * STAGE_WORDS, cursor, tid);
    copy_commit();
  }
  for (int it = 0; it < iters; ++it) {
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();  // stage `it` landed everywhere; every warpgroup's wgmma of it-2 has retired
    {
      const int next = it + STAGES - 2;
      if (next < iters) load_next_stage(x, w, smem + (next % STAGES) * STAGE_WORDS, cursor, tid);
      copy_commit();
    }
    wgmma_stage(acc, rsum, smem + (it % STAGES) * STAGE_WORDS, ones, wg_m, wg_n,
                it % KTILES != 0);
    if (it % KTILES != KTILES - 1) {
      wgmma_wait<1>();
      continue;
    }
    wgmma_wait<0>();  // the tile's accumulators are final
    persistent_epilogue(acc, rsum, it, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, tid, ea,
                        s_out);
  }
  copy_wait<0>();
}
