// Persistent blocks, pipelined across tiles (mma.sync). Needs bitserial_common.cu before it.

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_persistent(BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(16) u32 smem[];
  chain_begin();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  // the cp.async pipeline runs across tile boundaries, so the next tile's operands load while
  // this one's epilogue runs
  const int iters = persistent_iters();
  u32* s_out = smem + STAGES * STAGE_WORDS;  // packing tile apart: next tiles' copies in flight
  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  LoadCursor cursor = load_cursor(tid);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < iters) load_next_stage(x, w, smem + s * STAGE_WORDS, cursor, tid);
    copy_commit();
  }
  for (int it = 0; it < iters; ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();
    {
      const int next = it + STAGES - 1;
      if (next < iters) load_next_stage(x, w, smem + (next % STAGES) * STAGE_WORDS, cursor, tid);
      copy_commit();
    }
    const u32* sa = smem + (it % STAGES) * STAGE_WORDS;
    mma_sync_stage(acc, rsum, sa, sa + A_STAGE_WORDS, warp_m, warp_n, lane);
    if (it % KTILES == KTILES - 1)
      persistent_epilogue(acc, rsum, it, warp_m * WM, warp_n * WN, lane, tid, ea, s_out);
  }
  copy_wait<0>();
}
