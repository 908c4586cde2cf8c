// Template cuda.bitserial_mma_sync_persistent: one wave of persistent blocks, mma.sync
// m16n8k256 b1 AND per warp; a block takes tiles blockIdx.x, + gridDim.x, ..., and its cp.async
// pipeline runs across tile boundaries, so the next tile's operands load while this one's
// epilogue runs. sm_80 and newer.

#include "bitserial_common.cu"
#include "bitserial_mma_sync_stage.cu"

// The mma.sync persistent kernel runs its k loop at run time: iteration `it` is k tile
// it % KTILES of the block's (it / KTILES)-th tile, and its loads, STAGES - 1 iterations ahead,
// follow a LoadCursor (the loads' tile and their next k tile).
__device__ __forceinline__ int persistent_iters() {
  return (N_TILES - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * KTILES;
}
__device__ __forceinline__ int persistent_tile(int it) {
  return (int)blockIdx.x + (it / KTILES) * (int)gridDim.x;
}
struct LoadCursor {
  TileLoads at;
  int kt;
};
__device__ __forceinline__ LoadCursor load_cursor(int tid) {
  return LoadCursor{tile_loads((int)blockIdx.x, tid), 0};
}
// Issue the copies of the cursor's stage into `stage`, then advance the cursor by one k tile.
__device__ __forceinline__ void load_next_stage(const u32* __restrict__ x,
                                                const u32* __restrict__ w, u32* stage,
                                                LoadCursor& c, int tid) {
  load_stage(x, w, stage, c.at.ar, c.at.n0, c.kt, tid);
  if (++c.kt == KTILES) {
    c.kt = 0;
    c.at = tile_loads(c.at.tile + (int)gridDim.x, tid);
  }
}
// Fused epilogue of the tile whose last k tile is iteration `it` (the next tiles' copies are in
// flight, so s_out lies beside the stages), then fresh accumulators for the next tile.
__device__ __forceinline__ void persistent_epilogue(Acc& acc, RowSum& rsum, int it, int row0,
                                                    int col0, int lane, int tid,
                                                    const EpilogueArgs& ea, u32* s_out) {
  const int tile = persistent_tile(it);
  const i64 m0 = (i64)(tile / N_COL_TILES) * BM;
  const int n0 = (tile % N_COL_TILES) * BN;
  tile_epilogue(acc, rsum, m0, n0, row0, col0, lane, tid, ea, s_out);
  zero_acc(acc, rsum);
}


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
      if (next < iters) CUT_LOADS load_next_stage(x, w, smem + (next % STAGES) * STAGE_WORDS, cursor, tid);
      copy_commit();
    }
    const u32* sa = smem + (it % STAGES) * STAGE_WORDS;
    CUT_MMA mma_sync_stage(acc, rsum, sa, sa + A_STAGE_WORDS, warp_m, warp_n, lane);
    if (it % KTILES == KTILES - 1)
      CUT_EPILOGUE persistent_epilogue(acc, rsum, it, warp_m * WM, warp_n * WN, lane, tid, ea, s_out);
  }
  copy_wait<0>();
}
