// One output tile per block on Hopper warpgroup MMA (sm_90a). Needs bitserial_common.cu, the
// rendered wgmma wrappers and bitserial_wgmma_common.cu before it.

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
              "BULK_WEIGHTS: A_IN_HALO, every k tile resident, one k slice (bitserial.py)");

// BULK_HALO (A_IN_HALO, one k slice): the block's input window arrives as bulk copies, one
// per (plane, window row) of the pixels inside the image, pixel-major into a staging area, on
// one mbarrier; the threads then re-lay it chunk-major (the layout wgmma reads in place, zeros
// outside the image). On an H100 a copy-only kernel of the APNN-TC conv's grid landed its
// operands in 2.70 us so against 3.41 by 16-byte cp.async (benchmarks/apconv_floor.py).
static_assert(!BULK_HALO || (A_IN_HALO && SLICES == 1), "BULK_HALO: A_IN_HALO, one k slice");
constexpr int MBARS = (BULK_WEIGHTS ? KTILES : 0) + (BULK_HALO ? 1 : 0);
constexpr int STAGING_WORDS = BULK_HALO ? Q_BITS * HALO_PIX * CW : 0;  // [plane][pixel][CW]
// The window of pixel tile `tile` (rows and columns inside the image): its bytes, and with
// `issue` its bulk copies into `staging` on `bar`.
__device__ __forceinline__ u32 halo_bulk_load(const u32* __restrict__ x, u32* staging, int tile,
                                              u64* bar, bool issue) {
  const int tx = tile % TILES_X, ty = tile / TILES_X % TILES_Y, n = tile / (TILES_X * TILES_Y);
  const int iy0 = ty * TILE_H - PAD, ix0 = tx * 8 - PAD;
  const int xs = ix0 > 0 ? ix0 : 0, xe = ix0 + HALO_W < W ? ix0 + HALO_W : W;
  if (xe <= xs) return 0;
  const u32 row_bytes = (u32)(xe - xs) * CW * 4;
  u32 bytes = 0;
  for (int i = 0; i < Q_BITS; ++i)
    for (int hy = 0; hy < HALO_H; ++hy) {
      const int iy = iy0 + hy;
      if ((unsigned)iy >= (unsigned)H) continue;
      if (issue)
        bulk_copy(staging + ((i * HALO_H + hy) * HALO_W + xs - ix0) * CW,
                  x + i * X_PLANE + ((i64)(n * H + iy) * W + xs) * CW, row_bytes, bar);
      bytes += row_bytes;
    }
  return bytes;
}
// ... then every thread re-lays its share of the window: staging [plane][pixel][chunk] ->
// halo [plane][chunk][pixel] (16-byte chunks, the chunk stride CHUNK_UNITS), zeros for the
// pixels outside the image; RELAYOUT_BATCH loads first, then their stores (load_shared_vec).
constexpr int HALO_UNITS = Q_BITS * HALO_PIX * HALO_CHUNKS, RELAYOUT_BATCH = 8;
__device__ __forceinline__ void halo_relayout(const u32* staging, u32* halo, int tile, int tid) {
  const int tx = tile % TILES_X, ty = tile / TILES_X % TILES_Y;
  const int iy0 = ty * TILE_H - PAD, ix0 = tx * 8 - PAD;
  for (int base = tid; base < HALO_UNITS; base += RELAYOUT_BATCH * THREADS) {
    SharedVec v[RELAYOUT_BATCH];
#pragma unroll
    for (int u = 0; u < RELAYOUT_BATCH; ++u) {
      const int idx = base + u * THREADS;  // a pixel's chunks: consecutive threads, one line
      const int chunk = idx % HALO_CHUNKS, pix = idx / HALO_CHUNKS % HALO_PIX;
      const int iy = iy0 + pix / HALO_W, ix = ix0 + pix % HALO_W;
      const bool inside = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
      v[u] = load_shared_vec(staging + (idx / HALO_CHUNKS) * CW + chunk * 4,
                             inside && idx < HALO_UNITS);
    }
#pragma unroll
    for (int u = 0; u < RELAYOUT_BATCH; ++u) {
      const int idx = base + u * THREADS;
      const int chunk = idx % HALO_CHUNKS, pix = idx / HALO_CHUNKS % HALO_PIX;
      const int i = idx / (HALO_CHUNKS * HALO_PIX);
      if (idx < HALO_UNITS)
        store_shared_vec(halo + ((i * HALO_CHUNKS + chunk) * CHUNK_UNITS + pix) * 4, v[u]);
    }
  }
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
  int halo_row0 = 0;  // A_IN_HALO: the halo by channel group with the stages (halo_stage_load)
  if constexpr (HALO && !A_IN_HALO) halo_row0 = halo_load(x, halo, m0, (int)threadIdx.x, BLOCK_THREADS);
  if constexpr (SLICES > 1 && (!HALO || A_IN_HALO)) {  // the ones tile, for every slice
    if constexpr (A_IN_HALO) fence_proxy_async();
    __syncthreads();
  }

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);

  // [0, KTILES) without split-K or slices
  const int k0 = SLICES > 1 ? slice * KTILES / SLICES : split_k_begin();
  const int k1 = SLICES > 1 ? (slice + 1) * KTILES / SLICES : split_k_end();
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (k0 + s < k1) {
      if constexpr (!BULK_WEIGHTS)
        load_stage(x, w, stages + s * STAGE_WORDS, ar, n0, k0 + s, tid, halo, halo_row0);
      if constexpr (A_IN_HALO && !BULK_HALO) halo_stage_load(x, halo, k0 + s, k0, tid);
    }
    copy_commit();
  }
  // BULK_WEIGHTS / BULK_HALO: thread 0 sets up a barrier per k tile (and one for the halo) and
  // issues the bulk copies (the halo's first, after its weight cp.async without BULK_WEIGHTS);
  // the other threads first touch a barrier after a block barrier, by then initialized
  u64* bars = reinterpret_cast<u64*>(halo + Q_BITS * HALO_WORDS);
  u64* halo_bar = bars + (MBARS ? MBARS - 1 : 0);
  u32* staging = reinterpret_cast<u32*>(bars + (MBARS + 1) / 2 * 2);  // 16-byte aligned
  if (MBARS && tid == 0) {
    for (int b = 0; b < MBARS; ++b) mbar_init(bars + b, 1);
    fence_mbar_init();
    if constexpr (BULK_HALO) {
      mbar_expect_tx(halo_bar, halo_bulk_load(x, staging, blockIdx.y, halo_bar, false));
      halo_bulk_load(x, staging, blockIdx.y, halo_bar, true);
    }
    for (int kt = 0; BULK_WEIGHTS && kt < KTILES; ++kt) {
      mbar_expect_tx(bars + kt, STAGE_BYTES);
      bulk_copy(stages + kt * STAGE_WORDS, w + stage_image(blockIdx.x, kt), STAGE_BYTES,
                bars + kt);
    }
  }
  // A_IN_HALO (small grids, one tile's chain per SM): the epilogue's rows worked out and
  // its per-column data prefetched while the first copies fly (off the last MMA's path)
  RowPrep rows{};
  if constexpr (A_IN_HALO) {
    const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
    rows = epilogue_rows(m0, n0, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, ea);
    if (slice == 0) prefetch_row_data(rows, n0 + wg_n * WN + 2 * (lane & 3), ea);
  }
  if constexpr (BULK_HALO) {  // the window, re-laid for the MMAs before the first of them
    tile_sync();
    mbar_wait(halo_bar, 0);
    halo_relayout(staging, halo, blockIdx.y, tid);
  }
  for (int kt = k0; kt < k1; ++kt) {
    copy_wait<STAGES - 3>();
    fence_proxy_async();
    tile_sync();  // stage kt landed everywhere; every warpgroup's wgmma of kt-2 has retired
    if constexpr (BULK_WEIGHTS) mbar_wait(bars + kt, 0);  // its weights (each barrier used once)
    {
      const int next = kt + STAGES - 2;
      if (next < k1) {
        if constexpr (!BULK_WEIGHTS)
          load_stage(x, w, stages + ((next - k0) % STAGES) * STAGE_WORDS, ar, n0, next, tid, halo, halo_row0);
        if constexpr (A_IN_HALO && !BULK_HALO) halo_stage_load(x, halo, next, k0, tid);
      }
      copy_commit();
    }
    wgmma_stage(acc, rsum, stages + ((kt - k0) % STAGES) * STAGE_WORDS, ones, wg_m, wg_n, kt > k0,
                halo, kt);
    if constexpr (!RESIDENT_STAGES) wgmma_wait<1>();  // stage kt - 1 is refilled next
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
