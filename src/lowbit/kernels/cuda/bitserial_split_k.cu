// ---- split-K (the mma.sync one-tile kernel, bitserial_mma_sync.cu; constants in
// bitserial_params.cu) ----

// This block's k tiles [split_k_begin(), split_k_end()).
__device__ __forceinline__ int split_k_begin() {
  return SPLIT_K > 1 ? (int)blockIdx.z * KTILES_PER_SPLIT : 0;
}
__device__ __forceinline__ int split_k_end() {
  if constexpr (SPLIT_K > 1) {
    const int end = split_k_begin() + KTILES_PER_SPLIT;
    return end < KTILES ? end : KTILES;
  }
  return KTILES;
}

// Store this warp's k-linear partial sums (plane products and ROWSUM_MMA row popcounts; the
// epilogue's other terms depend on the pixel alone) to split z's workspace slice.
__device__ __forceinline__ void split_store(const Acc& acc, const RowSum& rsum,
                                            const EpilogueArgs& ea, i64 m0, int n0, int row0,
                                            int col0, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
  int* base = ea.split_ws + ea.split_z * WS_SPLIT + m0 * WS_COLS + n0 + col0 + 2 * t4;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rs = rowsum_mma_term(rsum, mi, h);
      int* row = base + (i64)(row0 + mi * 16 + g + 8 * h) * WS_COLS;
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
        *reinterpret_cast<uint2*>(row + ni * 8) =
            make_uint2((u32)(plane_dot(acc, mi, ni, 2 * h) + rs), (u32)(plane_dot(acc, mi, ni, 2 * h + 1) + rs));
    }
}

// Count this block in once its partial sums are stored; true in the tile's last block to
// arrive, which resets the tile's counter for the next launch and runs the epilogue on the
// splits' sums (split_sum; the accumulators are dead past split_store). The
// fences order every thread's stores before the count and the count before the last block's
// reads (the threadfence-reduction pattern of the CUDA programming guide).
__device__ __forceinline__ bool split_arrive(int* split_count, int tid) {
  __threadfence();
  __syncthreads();
  const int tile = (int)(blockIdx.y * gridDim.x + blockIdx.x);
  int old = 0;
  if (tid == 0) old = atomicAdd(split_count + tile, 1);
  const bool last = __syncthreads_or(tid == 0 && old == SPLIT_K - 1) != 0;
  if (last) {
    if (tid == 0) split_count[tile] = 0;
    __threadfence();
  }
  return last;
}

