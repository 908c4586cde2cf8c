// Persistent blocks on Hopper warpgroup MMA (sm_90a): tiles blockIdx.x, +gridDim.x, ... with
// the cp.async pipeline running across tile boundaries, so the next tile's first stages load
// while this tile's last wgmma batches and its epilogue run (a one-tile block exposes its
// pipeline fill and its epilogue once per tile: GEMM 4096 w1a1 has 4 k tiles of KT=4, ResNet-50
// s4 9). A tile's k loop is unrolled: each copy's k tile is then a constant (its tap and channel
// word fold into the addresses, as in the one-tile kernel), and the copy rows of a tile are
// decoded once, when the copies reach it (`TileLoads`). Needs bitserial_common.cu, the rendered
// wgmma wrappers and bitserial_wgmma_common.cu before it.

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_wgmma_persistent(
    BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const int row0 = wg_m * 64 + (warp & 3) * 16, col0 = wg_n * WN;
  u32* ones = smem + STAGES * STAGE_WORDS;
  fill_ones(ones, tid);
  u32* s_out = ones + ONES_WORDS;  // packing tile apart: the next tiles' copies are in flight
  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  constexpr int AHEAD = STAGES - 2;  // k tiles the copies run ahead of the MMAs
  // every tile starts on stage 0 when STAGES divides KTILES: the unrolled steps' stages are
  // then constants, and so are their wgmma descriptors
  constexpr bool FIXED_STAGES = K_UNROLL == KTILES && KTILES % STAGES == 0;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  TileLoads ld = tile_loads((int)blockIdx.x, tid);
#pragma unroll
  for (int g = 0; g < AHEAD; ++g) {
    if (g > 0 && g % KTILES == 0) ld = tile_loads(ld.tile + (int)gridDim.x, tid);
    if (ld.tile < N_TILES) load_stage(x, w, smem + g * STAGE_WORDS, ld.ar, ld.n0, g % KTILES, tid);
    copy_commit();
  }
  int fill = AHEAD, read = 0;  // the stages the next copies fill and the next MMAs read
  for (int tile = (int)blockIdx.x; tile < N_TILES; tile += (int)gridDim.x) {
#pragma unroll K_UNROLL
    for (int kt = 0; kt < KTILES; ++kt) {
      copy_wait<STAGES - 3>();
      fence_proxy_async();
      __syncthreads();  // stage `read` landed everywhere; the wgmma of two k tiles ago retired
      const int kl = (kt + AHEAD) % KTILES;  // the k tile these copies load
      if (kl == 0) ld = tile_loads(ld.tile + (int)gridDim.x, tid);
      const int to = FIXED_STAGES ? (kt + AHEAD) % STAGES : fill;
      const int from = FIXED_STAGES ? kt % STAGES : read;
      // opaque: NVRTC otherwise computes each k tile's copy offsets (which depend on tid alone)
      // once, before the tile loop, and spills them (s5 w1a1 256 x 128: 76 bytes)
      if (ld.tile < N_TILES)
        load_stage(x, w, smem + to * STAGE_WORDS, ld.ar, ld.n0, kl, opaque(tid));
      copy_commit();
      fill = fill == STAGES - 1 ? 0 : fill + 1;
      wgmma_stage(acc, rsum, smem + from * STAGE_WORDS, ones, wg_m, wg_n, kt > 0);
      read = read == STAGES - 1 ? 0 : read + 1;
      if (kt < KTILES - 1) wgmma_wait<1>();
    }
    wgmma_wait<0>();  // the tile's accumulators are final
    tile_epilogue(acc, rsum, tile / N_COL_TILES * BM, tile % N_COL_TILES * BN, row0, col0, lane,
                  tid, ea, s_out);
    zero_acc(acc, rsum);
  }
  copy_wait<0>();
}
