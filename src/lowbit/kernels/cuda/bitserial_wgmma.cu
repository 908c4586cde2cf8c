// Template cuda.bitserial_wgmma: one output tile per block on Hopper warpgroup MMA (sm_90a),
// the A tiles gathered (im2col) into the cp.async stages, from global memory or from the
// block's halo (HALO), or read in place from a pixel tile's input window (A_IN_HALO, with its
// weights by bulk copies, BULK_WEIGHTS, and the window by tensor copies, TMA_HALO); the k tiles
// optionally split over SLICES sets of warpgroups.

#include "bitserial_common.cu"
#include "bitserial_wgmma_common.cu"

// A_IN_HALO with every k tile of a slice in its own stage (STAGES - 2 >= its k tiles; the
// stages hold weights only, STAGES=12): no stage is refilled, so the loop issues each stage's
// MMAs once its copies land, without waiting for the previous stage's MMAs
constexpr bool RESIDENT_STAGES = A_IN_HALO && (KTILES + SLICES - 1) / SLICES <= STAGES - 2;
// BULK_WEIGHTS (with RESIDENT_STAGES, one k slice): stage kt's weights, a layer constant, come
// as one bulk copy of its shared-memory image (bitserial_wimage, made at bind) on mbarrier kt,
// instead of 16-byte cp.async per thread (on an H100 the in-place kernel's warps spent half
// their samples issuing its ~3,900 copies per block, 2,304 of them the weights').
constexpr int STAGE_BYTES = STAGE_WORDS * 4;
static_assert(!BULK_WEIGHTS || (RESIDENT_STAGES && SLICES == 1 && !ROWSUM_COLS),
              "BULK_WEIGHTS: A_IN_HALO, every k tile resident, one k slice (the template's constraints)");

// TMA_HALO = 32, 64 or 128 (A_IN_HALO, one k slice, channels a multiple of 8 x TMA_HALO): the
// block's input window arrives by the tensor copy engine, one copy per (plane, channel block of
// TMA_HALO bytes per pixel) of the tile's HALO_H x HALO_W pixels (zeros outside the image),
// pixel by pixel into TMA_HALO-byte rows that the copy swizzles; the MMAs read the tap tiles in
// place through swizzled descriptors (halo_desc_swizzled). A barrier per channel block (all
// planes), copied in the k slabs' order, so the first MMAs wait for the first block only. No
// thread issues a copy of the window or re-lays it: on an H100 a copy-only kernel of the
// APNN-TC conv's grid landed its operands in 2.16 us so (128-byte rows), 2.70 by bulk copies of
// the window's rows and 3.41 by 16-byte cp.async (benchmarks/apconv_floor.py); re-laying
// bulk-copied rows chunk by pixel cost the in-place kernel ~1 us (NOTES.md).
static_assert(!TMA_HALO || (A_IN_HALO && SLICES == 1 && CW * 4 % TMA_HALO == 0),
              "TMA_HALO: A_IN_HALO, one k slice, whole channel blocks (the template's constraints)");
constexpr int MBARS = (BULK_WEIGHTS ? KTILES : 0) + HALO_BLOCKS;
__device__ __forceinline__ void halo_tensor_load(const TensorMap* xmap, u32* halo, int tile,
                                                 u64* bars) {
  const WindowOrigin o = window_origin(tile);
  for (int b = 0; b < HALO_BLOCKS; ++b) {
    mbar_expect_tx(bars + b, Q_BITS * HALO_PIX * TMA_HALO);  // zero-filled bytes count too
    for (int i = 0; i < Q_BITS; ++i)
      tensor_copy_4d(halo + (i * HALO_BLOCKS + b) * (HALO_BLOCK_BYTES / 4), xmap, b * TMA_HALO,
                     o.ix0, o.iy0, i * NB + o.n, bars + b);
  }
}
// ... the last channel block that k tile kt's slabs read (blocks land in order: waiting for it
// and those before, once each, covers the tile)
__device__ __forceinline__ int halo_last_block(int kt) {
  return ((kt + 1) * KT - 1) / RS / GROUPS_PER_BLOCK;
}

// The weights' stage images for BULK_WEIGHTS, wimg[column tile][k tile][STAGE_WORDS] (the image
// of column tile n, k tile kt at stage_image(n, kt)): block (column tile, k tile) runs
// load_stage's own copies into shared memory and stores the result.
__device__ __forceinline__ i64 stage_image(i64 col_tile, i64 kt) {
  return (col_tile * KTILES + kt) * STAGE_WORDS;
}
extern "C" __global__ void bitserial_wimage(const u32* __restrict__ w, u32* __restrict__ wimg) {
  extern __shared__ __align__(128) u32 smem[];
  if constexpr (BULK_WEIGHTS) {
    const int tid = (int)threadIdx.x;
    load_stage(nullptr, w, smem, a_rows(0, tid), blockIdx.x * BN, blockIdx.y, tid);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
    u32* dst = wimg + stage_image(blockIdx.x, blockIdx.y);
    for (int i = tid; i < STAGE_WORDS; i += THREADS) dst[i] = smem[i];
  }
}

// BULK_WEIGHTS / TMA_HALO: thread 0 initializes the block's MBARS mbarriers (one arrival each)
// and makes them visible to the copy engine
__device__ __forceinline__ void mbars_init(u64* bars) {
  for (int b = 0; b < MBARS; ++b) mbar_init(bars + b, 1);
  fence_mbar_init();
}
// BULK_WEIGHTS: thread 0's bulk copies of every k tile's weights, stage kt on mbarrier kt
__device__ __forceinline__ void bulk_weights_load(const u32* w, u32* stages, u64* bars) {
  for (int kt = 0; BULK_WEIGHTS && kt < KTILES; ++kt) {
    mbar_expect_tx(bars + kt, STAGE_BYTES);
    bulk_copy(stages + kt * STAGE_WORDS, w + stage_image(blockIdx.x, kt), STAGE_BYTES, bars + kt);
  }
}
// A_IN_HALO: this lane's epilogue rows, and (slice 0) their per-column data prefetched into L1
__device__ __forceinline__ RowPrep prefetched_rows(i64 m0, int n0, int wg_m, int wg_n, int warp,
                                                   int lane, int slice, const EpilogueArgs& ea) {
  const RowPrep rows = epilogue_rows(m0, n0, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, ea);
  if (slice == 0) prefetch_row_data(rows, n0 + wg_n * WN + 2 * (lane & 3), ea);
  return rows;
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) bitserial_wgmma(BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  // SLICES > 1: slice s (THREADS threads, its own stage ring and named barrier) reduces the k
  // tiles [s KTILES / SLICES, (s + 1) KTILES / SLICES); slice 0 adds the others' sums and runs
  // the epilogue. For grids of fewer blocks than SMs, whose k loop is one warpgroup's chain of
  // stages: measured on an H100, fc_b128 -8 to -15%, the APNN-TC conv -2 to -3% (NOTES.md,
  // "Wide one-tile blocks ...").
  chain_begin();
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
  int halo_row0 = 0;  // A_IN_HALO: the halo by channel group with the stages (halo_stage_load)
  if constexpr (HALO && !A_IN_HALO) halo_row0 = halo_load(x, halo, m0, (int)threadIdx.x, BLOCK_THREADS);
  if constexpr (SLICES > 1 && (!HALO || A_IN_HALO)) {  // the ones tile, for every slice
    if constexpr (A_IN_HALO) fence_proxy_async();
    __syncthreads();
  }

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);

  // [0, KTILES) without slices
  const int k0 = SLICES > 1 ? slice * KTILES / SLICES : 0;
  const int k1 = SLICES > 1 ? (slice + 1) * KTILES / SLICES : KTILES;
  // BULK_WEIGHTS / TMA_HALO: thread 0 sets up a barrier per k tile (and per channel block of
  // the window, after them) and issues the copies (the window's first, after its weight
  // cp.async without BULK_WEIGHTS); the other threads first touch a barrier after the loop's
  // first block barrier, by then initialized
  u64* bars = reinterpret_cast<u64*>(halo + Q_BITS * HALO_WORDS);
  u64* halo_bars = bars + (BULK_WEIGHTS ? KTILES : 0);
  // A_IN_HALO (small grids, one tile's chain per SM): the epilogue's rows worked out and
  // its per-column data prefetched while the first copies fly (off the last MMA's path)
  RowPrep rows{};
  // CHAIN_EARLY_WEIGHTS: the weights' copies and the epilogue's prefetches (layer constants)
  // before the wait for the previous kernel, so they overlap its tail; the rows after it where
  // they read xpop (ROWSUM_TABLE)
  constexpr bool EARLY_ROWS = CHAIN_EARLY_WEIGHTS && !ROWSUM_TABLE;
  if constexpr (CHAIN_EARLY_WEIGHTS) {
    if (tid == 0) {
      mbars_init(bars);
      bulk_weights_load(w, stages, bars);
    }
    if constexpr (EARLY_ROWS)
      rows = prefetched_rows(m0, n0, wg_m, wg_n, warp, lane, slice, BITSERIAL_EPILOGUE_ARGS);
    grid_dependency_wait();
  }
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (k0 + s < k1) {
      if constexpr (!BULK_WEIGHTS)
        load_stage(x, w, stages + s * STAGE_WORDS, ar, n0, k0 + s, tid, halo, halo_row0);
      if constexpr (A_IN_HALO && !TMA_HALO) halo_stage_load(x, halo, k0 + s, k0, tid);
    }
    copy_commit();
  }
#if LOWBIT_BLOCK_END  // its residual tile into L1 behind the first stages' copies
  if (slice == 0) prefetch_residual((int)m0 + wg_m * 64 + (warp & 3) * 16, n0 + wg_n * WN, lane, BITSERIAL_EPILOGUE_ARGS);
#endif
  int halo_waited = 0;  // TMA_HALO: the channel blocks waited for
  if (MBARS && tid == 0) {
    if constexpr (!CHAIN_EARLY_WEIGHTS) mbars_init(bars);
    if constexpr (TMA_HALO)
      halo_tensor_load(BITSERIAL_XMAP, halo_tiles(halo), blockIdx.y, halo_bars);
    if constexpr (!CHAIN_EARLY_WEIGHTS) bulk_weights_load(w, stages, bars);
  }
  if constexpr (A_IN_HALO && !EARLY_ROWS)
    rows = prefetched_rows(m0, n0, wg_m, wg_n, warp, lane, slice, BITSERIAL_EPILOGUE_ARGS);
  for (int kt = k0; kt < k1; ++kt) {
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    tile_sync();  // stage kt landed everywhere; every warpgroup's wgmma of kt-2 has retired
    if constexpr (TMA_HALO)  // the window's channel blocks this k tile reads
      for (; halo_waited <= halo_last_block(kt); ++halo_waited)
        mbar_wait(halo_bars + halo_waited, 0);
    if constexpr (BULK_WEIGHTS) mbar_wait(bars + kt, 0);  // its weights (each barrier used once)
    {
      const int next = kt + STAGES - 2;
      if (next < k1) {
        if constexpr (!BULK_WEIGHTS)
          CUT_LOADS load_stage(x, w, stages + ((next - k0) % STAGES) * STAGE_WORDS, ar, n0, next, tid, halo, halo_row0);
        if constexpr (A_IN_HALO && !TMA_HALO) halo_stage_load(x, halo, next, k0, tid);
      }
      copy_commit();
    }
    CUT_MMA wgmma_stage(acc, rsum, stages + ((kt - k0) % STAGES) * STAGE_WORDS, ones, wg_m, wg_n, kt > k0,
                TMA_HALO ? halo_tiles(halo) : halo, kt);
    if constexpr (!RESIDENT_STAGES) wgmma_wait<1>();  // stage kt - 1 is refilled next
  }
  chain_mmas_issued();
  wgmma_wait<0>();
  copy_wait<0>();
  planes_from_rows(acc, rsum);

  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  const int row0 = wg_m * 64 + (warp & 3) * 16;
  if constexpr (SLICES > 1) {
    if (!slices_reduce(acc, rsum, smem, slice, tid)) return;
  }
  u32* s_out = smem;  // packing tile over the operand stages, once every warpgroup is done
  const RowPrep prep = A_IN_HALO ? rows : epilogue_rows(m0, n0, row0, wg_n * WN, lane, ea);
  CUT_EPILOGUE tile_epilogue(acc, rsum, prep, m0, n0, row0, wg_n * WN, lane, tid, ea, s_out);
}
