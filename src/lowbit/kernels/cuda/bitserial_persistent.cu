// Persistent blocks, pipelined across tiles (mma.sync). Needs bitserial_common.cu before it.

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_persistent(
    const u32* __restrict__ x, const u32* __restrict__ w, void* __restrict__ out,
    const int* __restrict__ bias, const float* __restrict__ scale,
    const int* __restrict__ mult, const int* __restrict__ shift, const int* __restrict__ wtap,
    const int* __restrict__ xpop) {
  extern __shared__ __align__(16) u32 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  // Persistent block: tiles blockIdx.x, +gridDim.x, ...; the cp.async pipeline runs across tile
  // boundaries, so the next tile's operands load while this one's epilogue runs.
  const int my_tiles = (N_TILES - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int iters = my_tiles * KTILES;

  auto load_tile = [&](int it, int stage) {
    const int tile = (int)blockIdx.x + (it / KTILES) * (int)gridDim.x;
    const i64 tm0 = (i64)(tile / N_COL_TILES) * BM;
    load_stage(x, w, smem + stage * STAGE_WORDS, a_rows(tm0, tid), (tile % N_COL_TILES) * BN,
               it % KTILES, tid);
  };

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < iters) load_tile(s, s);
    copy_commit();
  }

  u32* s_out = smem + STAGES * STAGE_WORDS;  // packing tile apart: next tiles' copies in flight
  const EpilogueArgs ea{out, bias, scale, mult, shift, wtap, xpop};
  for (int it = 0; it < iters; ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();
    {
      const int next = it + STAGES - 1;
      if (next < iters) load_tile(next, next % STAGES);
      copy_commit();
    }
    const u32* sa = smem + (it % STAGES) * STAGE_WORDS;
    mma_sync_stage(acc, rsum, sa, sa + A_STAGE_WORDS, warp_m, warp_n, lane);
    if (it % KTILES != KTILES - 1) continue;

    // fused epilogue of this tile (the next tiles' copies are in flight)
    const int tile = (int)blockIdx.x + (it / KTILES) * (int)gridDim.x;
    const i64 m0 = (i64)(tile / N_COL_TILES) * BM;
    const int n0 = (tile % N_COL_TILES) * BN;
    if constexpr (PACK_IN_SMEM) pack_tile_clear(s_out, tid);
    epilogue_warp(acc, rsum, m0, n0, warp_m * WM, warp_n * WN, lane, ea, s_out);
    if constexpr (PACK_IN_SMEM) pack_tile_store(s_out, out, m0, n0, tid);
    zero_acc(acc, rsum);
  }
  copy_wait<0>();
}
