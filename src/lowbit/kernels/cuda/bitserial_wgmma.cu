// One output tile per block on Hopper warpgroup MMA (sm_90a). Needs bitserial_common.cu, the
// rendered wgmma wrappers and bitserial_wgmma_common.cu before it.

// A_IN_HALO with every k tile of a slice in its own stage (STAGES - 2 >= its k tiles; the
// stages hold weights only, STAGES=12): no stage is refilled, so the loop issues each stage's
// MMAs once its copies land, without waiting for the previous stage's MMAs
constexpr bool RESIDENT_STAGES = A_IN_HALO && (KTILES + SLICES - 1) / SLICES <= STAGES - 2;

// ROWSUM_SLAB with A_IN_HALO (one k slice): binary weights' row popcounts from the halo instead
// of a row-sum wgmma per plane and slab (m64n8 beside two m64n32 per slab at BN = 32). Each
// thread counts sum_i c_i popc(plane i) over the channel groups of its halo pixels as they land
// (behind the MMAs of the first stage reading each group), stores the counts once all are in,
// and each row sums its taps' counts (the halo's zeros outside the image count nothing, as in
// the MMA's rows).
constexpr bool HALO_POP = A_IN_HALO && ROWSUM_SLAB;
constexpr int POP_PER_THREAD = (HALO_PIX + THREADS - 1) / THREADS;
static_assert(!HALO_POP || SLICES == 1, "ROWSUM_SLAB with A_IN_HALO: one k slice (bitserial.py)");
__device__ __forceinline__ void halo_popcounts(const u32* halo, int kt, int tid,
                                               int (&pc)[POP_PER_THREAD]) {
  const int g0 = (kt * KT + RS - 1) / RS, g1 = ((kt + 1) * KT + RS - 1) / RS;
  for (int g = g0; g < g1; ++g)
#pragma unroll
    for (int k = 0; k < POP_PER_THREAD; ++k) {
      const int j = tid + k * THREADS;
      if (j >= HALO_PIX) continue;
#pragma unroll
      for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
        for (int lc = 0; lc < 2; ++lc) {
          const uint4 v = *reinterpret_cast<const uint4*>(
              halo + ((i * HALO_CHUNKS + 2 * g + lc) * CHUNK_UNITS + j) * 4);
          pc[k] += a_coef(i) * (__popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w));
        }
    }
}
// ... the row terms of this lane's rows (warpgroup wg_m, its warp's rows row_in_wg..+15): lane
// l sums the taps of the warp's row l % 16, then each lane fetches its two
__device__ __forceinline__ void add_halo_rowsums(RowPrep& rows, const int* pop, int wg_m,
                                                 int row_in_wg, int lane) {
  const int ri = row_in_wg + (lane & 15);
  const int* p = pop + (8 * wg_m + ri / 8) * HALO_W + ri % 8;
  int sum = 0;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 0; s < S; ++s) sum += p[r * HALO_W + s];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    rows.term[0][h] += A_ALPHA * W_BETA * __shfl_sync(0xffffffffu, sum, (lane >> 2) + 8 * h);
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) bitserial_wgmma(BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  // SLICES > 1: slice s (THREADS threads, its own stage ring and named barrier) reduces the k
  // tiles [s KTILES / SLICES, (s + 1) KTILES / SLICES); slice 0 adds the others' sums and runs
  // the epilogue. For grids of fewer blocks than SMs, whose k loop is one warpgroup's chain of
  // stages: measured on an H100, fc_b128 -8 to -15%, the APNN-TC conv -2 to -3% (NOTES.md,
  // "Wide one-tile blocks ...").
  const int slice = slice_of_thread();
  const int tid = (int)threadIdx.x - slice * THREADS, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  const ARows ar = a_rows(m0, tid);
  u32* stages = smem + slice * STAGES * STAGE_WORDS;
  u32* ones = smem + SLICES * STAGES * STAGE_WORDS;
  if (slice == 0) fill_ones(ones, tid);
  fill_stage_ones_rows(stages, tid);
  u32* halo = ones + ONES_WORDS;  // HALO=1: the block's input slab
  int halo_row0 = 0;
  if constexpr (A_IN_HALO && !HALO_STAGED) halo_tile_load(x, halo, blockIdx.y, (int)threadIdx.x, BLOCK_THREADS);
  else if constexpr (HALO && !A_IN_HALO) halo_row0 = halo_load(x, halo, m0, (int)threadIdx.x, BLOCK_THREADS);
  if constexpr (SLICES > 1 && (!HALO || A_IN_HALO)) {  // the ones tile, for every slice
    if constexpr (A_IN_HALO) fence_proxy_async();
    __syncthreads();
  }

  // A_IN_HALO (small grids: each SM one tile's chain): the epilogue's rows worked out and its
  // per-column data prefetched before the k loop, off the path after the last MMA
  RowPrep rows{};
  if constexpr (A_IN_HALO) {
    const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
    rows = epilogue_rows(m0, n0, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, ea);
    if (slice == 0) prefetch_row_data(rows, n0 + wg_n * WN + 2 * (lane & 3), ea);
  }

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  int pc[POP_PER_THREAD] = {};  // HALO_POP

  // [0, KTILES) without split-K or slices
  const int k0 = SLICES > 1 ? slice * KTILES / SLICES : split_k_begin();
  const int k1 = SLICES > 1 ? (slice + 1) * KTILES / SLICES : split_k_end();
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (k0 + s < k1) {
      load_stage(x, w, stages + s * STAGE_WORDS, ar, n0, k0 + s, tid, halo, halo_row0);
      if constexpr (HALO_STAGED) halo_stage_load(x, halo, k0 + s, k0, tid);
    }
    copy_commit();
  }
  if constexpr (A_IN_HALO && !HALO_STAGED) {  // the halo (with the first stage) landed for every slice
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();
  }
  for (int kt = k0; kt < k1; ++kt) {
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    tile_sync();  // stage kt landed everywhere; every warpgroup's wgmma of kt-2 has retired
    {
      const int next = kt + STAGES - 2;
      if (next < k1) {
        load_stage(x, w, stages + ((next - k0) % STAGES) * STAGE_WORDS, ar, n0, next, tid, halo, halo_row0);
        if constexpr (HALO_STAGED) halo_stage_load(x, halo, next, k0, tid);
      }
      copy_commit();
    }
    wgmma_stage(acc, rsum, stages + ((kt - k0) % STAGES) * STAGE_WORDS, ones, wg_m, wg_n, kt > k0,
                halo, kt);
    if constexpr (HALO_POP) halo_popcounts(halo, kt, tid, pc);
    if constexpr (!RESIDENT_STAGES) wgmma_wait<1>();  // stage kt - 1 is refilled next
  }
  if constexpr (HALO_POP) {  // while the last MMAs run
    int* pop = reinterpret_cast<int*>(halo + Q_BITS * HALO_CHUNKS * CHUNK_UNITS * 4);
#pragma unroll
    for (int k = 0; k < POP_PER_THREAD; ++k)
      if (tid + k * THREADS < HALO_PIX) pop[tid + k * THREADS] = pc[k];
    tile_sync();
    add_halo_rowsums(rows, pop, wg_m, (warp & 3) * 16, lane);
  }
  wgmma_wait<0>();
  copy_wait<0>();

  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  const int row0 = wg_m * 64 + (warp & 3) * 16;
  if constexpr (SLICES > 1) {
    if (!slices_reduce(acc, rsum, smem, slice, tid)) return;
  }
  if constexpr (SPLIT_K > 1) {  // not in the space: wrong on an H100 though exact in the
    // host emulation (NOTES.md, "Split-K"); kept, emulation-exact, for that investigation
    split_store(acc, rsum, ea, m0, n0, row0, wg_n * WN, lane);
    if (!split_arrive(split_count, tid)) return;
  }
  u32* s_out = smem;  // packing tile over the operand stages, once every warpgroup is done
  const RowPrep prep = A_IN_HALO ? rows : epilogue_rows(m0, n0, row0, wg_n * WN, lane, ea);
  tile_epilogue(acc, rsum, prep, m0, n0, row0, wg_n * WN, lane, tid, ea, s_out);
}
