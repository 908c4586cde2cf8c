// Template cuda.bitserial_wgmma_persistent: persistent blocks on Hopper warpgroup MMA (sm_90a):
// tiles blockIdx.x, +gridDim.x, ... with
// the cp.async pipeline running across tile boundaries, so the next tile's first stages load
// while this tile's last wgmma batches and its epilogue run (a one-tile block exposes its
// pipeline fill and its epilogue once per tile: GEMM 4096 w1a1 has 4 k tiles of KT=4, ResNet-50
// s4 9). A tile's k loop is unrolled: each copy's k tile is then a constant (its tap and channel
// word fold into the addresses, as in the one-tile kernel), and the copy rows of a tile are
// decoded once, when the copies reach it (`TileLoads`). TEAMS = 2: two teams of warpgroups,
// each with its own stage ring and barrier (named barrier 1 + team), take the block's tiles in
// turn (team t: blockIdx.x + (2i + t) gridDim.x), and a team starts issuing a tile's MMAs only
// once the other team has issued all of its previous tile's (named barriers 3 + team), so one
// team's MMAs run while the other's epilogue does (bitserial_tap_shift.cu has the same
// order).

#include "bitserial_common.cu"
#include "bitserial_wgmma_common.cu"

static_assert(TEAMS <= 2, "the MMA order alternates between two teams");

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) bitserial_wgmma_persistent(
    BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  chain_begin();
  const int team = team_of_thread();
  const int tid = (int)threadIdx.x - team * THREADS, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const int row0 = wg_m * 64 + (warp & 3) * 16, col0 = wg_n * WN;
  const int step = TEAMS * (int)gridDim.x;  // from one of the team's tiles to its next
  u32* stages = smem + team * STAGES * STAGE_WORDS;
  u32* ones = smem + TEAMS * STAGES * STAGE_WORDS;
  if (team == 0) fill_ones(ones, tid);
  fill_stage_ones_rows(stages, tid);  // the team's own stages
  // the packing tile apart: the next tiles' copies are in flight
  u32* s_out = ones + ONES_WORDS + team * PACK_WORDS;
  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  constexpr int AHEAD = STAGES - 2;  // k tiles the copies run ahead of the MMAs
  // every tile starts on stage 0 when STAGES divides KTILES: the unrolled steps' stages are
  // then constants, and so are their wgmma descriptors
  constexpr bool FIXED_STAGES = K_UNROLL == KTILES && KTILES % STAGES == 0;

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  TileLoads ld = tile_loads((int)blockIdx.x + team * (int)gridDim.x, tid);
#pragma unroll
  for (int g = 0; g < AHEAD; ++g) {
    if (g > 0 && g % KTILES == 0) ld = tile_loads(ld.tile + step, tid);
    if (ld.tile < N_TILES)
      load_stage(x, w, stages + g * STAGE_WORDS, ld.ar, ld.n0, g % KTILES, tid);
    copy_commit();
  }
  if constexpr (TEAMS > 1) {  // team 0's ones tile, for both teams' row-sum wgmmas
    fence_proxy_async();
    __syncthreads();
  }
  int fill = AHEAD, read = 0;  // the stages the next copies fill and the next MMAs read
  bool first = true;
  for (int tile = (int)blockIdx.x + team * (int)gridDim.x; tile < N_TILES; tile += step) {
#pragma unroll K_UNROLL
    for (int kt = 0; kt < KTILES; ++kt) {
      copy_wait<STAGES - 3>();
      fence_proxy_async();
      tile_sync();  // stage `read` landed everywhere; the wgmma of two k tiles ago retired
      const int kl = (kt + AHEAD) % KTILES;  // the k tile these copies load
      if (kl == 0) ld = tile_loads(ld.tile + step, tid);
      const int to = FIXED_STAGES ? (kt + AHEAD) % STAGES : fill;
      const int from = FIXED_STAGES ? kt % STAGES : read;
      // opaque: NVRTC otherwise computes each k tile's copy offsets (which depend on tid alone)
      // once, before the tile loop, and spills them (s5 w1a1 256 x 128: 76 bytes)
      if (ld.tile < N_TILES)
        CUT_LOADS load_stage(x, w, stages + to * STAGE_WORDS, ld.ar, ld.n0, kl, opaque(tid));
      copy_commit();
      fill = fill == STAGES - 1 ? 0 : fill + 1;
      if (kt == 0) mma_turn_wait(team, first);
      CUT_MMA wgmma_stage(acc, rsum, stages + from * STAGE_WORDS, ones, wg_m, wg_n, kt > 0);
      if (kt == KTILES - 1) mma_turn_pass(team, tile + (int)gridDim.x < N_TILES);
      read = read == STAGES - 1 ? 0 : read + 1;
      if (kt < KTILES - 1) wgmma_wait<1>();
    }
    first = false;
    wgmma_wait<0>();  // the tile's accumulators are final
    CUT_EPILOGUE tile_epilogue(acc, rsum, tile / N_COL_TILES * BM, tile % N_COL_TILES * BN, row0, col0, lane,
                  tid, ea, s_out);
    zero_acc(acc, rsum);
  }
  copy_wait<0>();
}
