// Template cuda.bitserial_mma_sync: one output tile per block (grid = all tiles), mma.sync
// m16n8k256 b1 AND per warp, fragments loaded from the cp.async stages; optionally the
// duplicate-aware halo load (HALO) and split-K (SPLIT_K: grid.z blocks per tile, the last to
// arrive runs the epilogue). sm_80 and newer.

#include "bitserial_common.cu"
#include "bitserial_mma_sync_stage.cu"
#include "bitserial_split_k.cu"

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_kernel(BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(16) u32 smem[];
  chain_begin();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  const ARows ar = a_rows(m0, tid);
  u32* halo = smem + STAGES * STAGE_WORDS;  // HALO=1: the block's input slab, behind the stages
  const int halo_row0 = HALO ? halo_load(x, halo, m0, tid) : 0;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);

  const int k0 = split_k_begin(), k1 = split_k_end();  // [0, KTILES) without split-K
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (k0 + s < k1) load_stage(x, w, smem + s * STAGE_WORDS, ar, n0, k0 + s, tid, halo, halo_row0);
    copy_commit();
  }
  for (int kt = k0; kt < k1; ++kt) {
    copy_wait<STAGES - 2>();
    __syncthreads();
    {
      const int next = kt + STAGES - 1;
      if (next < k1)
        CUT_LOADS load_stage(x, w, smem + ((next - k0) % STAGES) * STAGE_WORDS, ar, n0, next, tid, halo, halo_row0);
      copy_commit();
    }
    const u32* sa = smem + ((kt - k0) % STAGES) * STAGE_WORDS;
    CUT_MMA mma_sync_stage(acc, rsum, sa, sa + A_STAGE_WORDS, warp_m, warp_n, lane);
  }
  copy_wait<0>();
  chain_mmas_issued();

  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  if constexpr (SPLIT_K > 1) {
    split_store(acc, rsum, ea, m0, n0, warp_m * WM, warp_n * WN, lane);
    if (!split_arrive(split_count, tid)) return;
  }
  u32* s_out = smem;  // packing tile over the operand stages, once every warp is done with them
  CUT_EPILOGUE tile_epilogue(acc, rsum, m0, n0, warp_m * WM, warp_n * WN, lane, tid, ea, s_out);
}
