// Template cuda.bitserial_tap_shift: the tap-shift conv on Hopper warpgroup MMA (sm_90a;
// geometry in tap_shift.py, which renders VQ, VP, SHIFT_BASE, SLAB_PIX, ... and the SHIFT_*
// tables with the parameters), one tile per block or persistent (PERSIST). One
// output tile of BM virtual rows per block: the block copies its input slab (every channel
// group, cp.async, zeros at padding) and its weights once, then issues every k256 step as a
// wgmma whose A descriptor points into the slab at the tap's shift: no im2col copies, no
// per-step barriers.

#include "bitserial_common.cu"
#include "bitserial_wgmma_common.cu"

// Shared memory: the weights of every channel group ([GROUPS][B_GROUP_WORDS], wgmma B layout),
// then the input slab of every group ([GROUPS][A_GROUP_WORDS]; persistent blocks keep
// SLAB_BUFFERS of them per team), then the row-popcount tiles of ones.
constexpr int A_SHIFT_PLANE = GROUP_CHUNKS * SLAB_PIX * 4;           // words per plane slab
constexpr int A_GROUP_WORDS = (Q_BITS * A_SHIFT_PLANE + 63) / 64 * 64;  // 256-byte aligned
constexpr int B_GROUP_WORDS = (GROUP_STEPS * B_ROWS * 8 + 63) / 64 * 64;
constexpr int SLABS_WORDS = GROUPS * A_GROUP_WORDS;
// Persistent blocks keep SLAB_BUFFERS = 3 slabs (rendered, bitserial_layout.slab_buffers). STAGES = 3:
// the slab two tiles ahead loads into the buffer the previous tile released while this one
// computes (one barrier per tile). STAGES = 4 (PINGPONG): the next tile's MMAs run during this
// tile's epilogue too, in a second accumulator set, while the tile after that loads.
constexpr bool PINGPONG = PERSIST && STAGES == 4;
static_assert(SLAB_BUFFERS == (PERSIST ? 3 : 1), "bitserial_layout.slab_buffers");
constexpr int ONES_OFFSET = GROUPS * B_GROUP_WORDS + TEAMS * SLAB_BUFFERS * SLABS_WORDS;
// TEAMS = 2 (persistent, STAGES = 3): two teams of warpgroups in one block share the resident
// weights and take the block's row tiles in turn, each with its own slab buffers, barrier
// (named barrier 1 + team) and epilogue. Their MMA issue alternates (named barriers 3 + team:
// a team issues a tile's MMAs once the other has issued its previous tile's), so one team's
// MMAs run on the tensor cores while the other team's epilogue runs on the SIMT units: two
// blocks per SM instead start together and stay in step, MMAs beside MMAs and epilogues beside
// epilogues (NOTES.md, "Tap-shift family").
static_assert(TEAMS == 1 || (PERSIST && !PINGPONG), "TEAMS > 1: persistent blocks, STAGES = 3");
static_assert(TEAMS <= 2, "the MMA order alternates between two teams");
static_assert(GROUPS <= 8, "copy_wait_groups handles at most 8 channel groups");
static_assert(!HALO && SPLIT_K == 1, "TAP_SHIFT=1 runs without HALO and SPLIT_K (tap_shift.py)");

// Descriptor of a slab window: 16-byte entries, no swizzle; 8-row core matrices are 8
// consecutive entries (SBO 128 B), the high k half `lbo` entries on (tap_shift.Step.lbo).
__device__ __forceinline__ u64 slab_desc(const u32* p, int lbo) {
  return ((smem_addr(p) & 0x3FFFF) >> 4) | ((u64)lbo << 16) | ((u64)(128 >> 4) << 32);
}


// The input pixel at virtual position p, -1 in the margin or before / after the grid.
__device__ __forceinline__ int slab_pixel(VPos p) {
  return (p.n >= 0 && p.n < NB && p.y < H && p.c < W) ? (p.n * H + p.y) * W + p.c : -1;
}

// This thread's copies of a group's slab: copy idx = tid + k * THREADS (k < SLAB_SLOTS) fills
// position e of entry j of chunk lc (C <= 64: PER_ENTRY positions of CW words per entry), idx =
// (lc * SLAB_PIX + j) * PER_ENTRY + e, i.e. slab word idx * COPY_WORDS, with virtual position
// m0 - SHIFT_BASE + j + e. d[k]: that position's offset from the tile's first row m0, split
// once per kernel.
constexpr int SLAB_COPIES = SLAB_PIX * GROUP_CHUNKS * PER_ENTRY;
constexpr int SLAB_SLOTS = (SLAB_COPIES + THREADS - 1) / THREADS;
constexpr int COPY_WORDS = 4 / PER_ENTRY;  // CW, or 4 (one 16-byte chunk) for C >= 128
// ROW_TABLE=2: each copy's input pixel from the bound table of virtual input positions
// (bitserial_tables.row_table, after the rows' entries: vpix[f + SHIFT_BASE] = pixel of position f,
// -1 in the margin) instead of carries and bounds tests (~30 instructions per copy, two to
// three copies per thread and tile at C = 64). off[k]: copy k's position offset from the
// tile's first row plus SHIFT_BASE; d[k]: the same split into (image, row, column).
constexpr bool SLAB_TABLE = ROW_TABLE >= 2;
struct SlabSlots {
  VPos d[SLAB_SLOTS];
  int off[SLAB_SLOTS];
};
__device__ __forceinline__ SlabSlots slab_slots(int tid) {
  SlabSlots s;
#pragma unroll
  for (int k = 0; k < SLAB_SLOTS; ++k) {
    const int idx = tid + k * THREADS;
    s.off[k] = idx / PER_ENTRY % SLAB_PIX + idx % PER_ENTRY;
    s.d[k] = vpos_floor(s.off[k] - SHIFT_BASE);
  }
  return s;
}
// The input pixel of each of this thread's copies of row tile t's slab (-1: zeros).
struct SlabPix {
  int p[SLAB_SLOTS];
};
__device__ __forceinline__ SlabPix slab_pixels(const int* __restrict__ vpix, int t,
                                               const SlabSlots& slots, int tid) {
  SlabPix s;
  if constexpr (SLAB_TABLE) {
#pragma unroll
    for (int k = 0; k < SLAB_SLOTS; ++k)
      s.p[k] = t < ROW_TILES && tid + k * THREADS < SLAB_COPIES ? __ldg(vpix + t * BM + slots.off[k]) : -1;
  } else {
    const VPos t0 = vpos(t * BM);
#pragma unroll
    for (int k = 0; k < SLAB_SLOTS; ++k) s.p[k] = slab_pixel(vpos_add(t0, slots.d[k]));
  }
  return s;
}

// cp.async the slab of channel group `grp` whose copies' input pixels are `pix` (every
// activation plane; zeros at padding and margins).
__device__ __forceinline__ void load_slab(const u32* __restrict__ x, u32* sa, const SlabPix& pix,
                                          int grp, int tid) {
  const int chunks = CHUNKS - 2 * grp < GROUP_CHUNKS ? CHUNKS - 2 * grp : GROUP_CHUNKS;
#pragma unroll
  for (int k = 0; k < SLAB_SLOTS; ++k) {
    const int idx = tid + k * THREADS, lc = idx / (PER_ENTRY * SLAB_PIX);
    if (idx >= SLAB_COPIES || lc >= chunks) continue;
    const int p = pix.p[k];
    const int src = p < 0 ? 0 : p * CW + (CW >= 4 ? 4 * (2 * grp + lc) : 0);
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
      copy_async(sa + idx * COPY_WORDS + i * A_SHIFT_PLANE, x + i * X_PLANE + src, p >= 0);
  }
}

// cp.async the weight words of every k256 step of group `grp` (SHIFT_HALVES: per half its
// first weight word and count; zeros past the count) into B slabs of the wgmma layout; thread
// `first` of `threads` copying threads takes chunks first, first + threads, ...
__device__ __forceinline__ void load_group_weights(const u32* __restrict__ w, u32* sb, int n0,
                                                   int grp, int first, int threads) {
  constexpr int PER_HALF = 4 / VEC;  // copy chunks per 16-byte half of a row
#define LOAD_HALF(G_, T_, H_, WORD, WORDS)                                                   \
  if (grp == G_) {                                                                          \
    for (int idx = first; idx < BN * PER_HALF; idx += threads) {                            \
      const int row = idx / PER_HALF, c = idx % PER_HALF;                                   \
      const bool valid = c * VEC < WORDS && n0 + row < KOUT;                                \
      const i64 src = valid ? (i64)(n0 + row) * KW + WORD + c * VEC : 0;                    \
      u32* dst = sb + slot(B_ROWS, b_row(row), T_, H_ * 4 + c * VEC);                       \
      _Pragma("unroll") for (int j = 0; j < P_BITS; ++j)                                    \
        copy_async(dst + j * B_PLANE_STEP, w + j * W_PLANE + src, valid);                    \
    }                                                                                       \
  }
  SHIFT_HALVES(LOAD_HALF)
#undef LOAD_HALF
}

// The row-popcount wgmma's B tiles (binary weights): tile i has ones in the weight words its
// steps use (SHIFT_ONES), so A bits that meet zero weights are not counted.
__device__ __forceinline__ void fill_shift_ones(u32* ones, int tid) {
  if constexpr (ROWSUM_ONES_TILE) {
#define FILL_ONES(I_, LO, HI)                                                                \
    for (int i = tid; i < 64; i += THREADS)                                                  \
      ones[I_ * 64 + slot(8, i / 8, 0, i % 8)] = (i % 8 < 4 ? i % 8 < LO : i % 8 - 4 < HI) ? ~0u : 0u;
    SHIFT_ONES(FILL_ONES)
#undef FILL_ONES
  }
}
// ROWSUM_COLS: the same ones as rows BN..BN+7 of every k step's B slab (the step's tile of
// SHIFT_ONES), rows BN+8..BN+15 zeros; written once per block (cp.async never writes them).
#define ONES_LO(I_, LO, HI) LO,
#define ONES_HI(I_, LO, HI) HI,
__device__ constexpr int ONES_LO_WORDS[] = {SHIFT_ONES(ONES_LO) 0};
__device__ constexpr int ONES_HI_WORDS[] = {SHIFT_ONES(ONES_HI) 0};
#undef ONES_LO
#undef ONES_HI
__device__ __forceinline__ void fill_ones_rows(u32* weights, int tid, int threads) {
  if constexpr (ROWSUM_COLS) {
#define FILL_ROWS(G_, T_, OFF, LBO, ONES)                                                    \
    for (int i = tid; i < ONES_ROWS * 8; i += threads) {                                     \
      const int row = i / 8, wd = i % 8;                                                     \
      const bool one = row < 8 && (wd < 4 ? wd < ONES_LO_WORDS[ONES] : wd - 4 < ONES_HI_WORDS[ONES]); \
      weights[G_ * B_GROUP_WORDS + slot(B_ROWS, BN + row, T_, wd)] = one ? ~0u : 0u;        \
    }
    SHIFT_STEPS(FILL_ROWS)
#undef FILL_ROWS
  }
}

// ROWSUM_SLAB: the row popcounts of binary weights from the slab instead of a row-sum wgmma
// per plane and step, which re-reads the A operand from shared memory (the MMA phase's limit:
// 2 KB of A + 4 KB of B per m64n128k256, ~95 B per cycle at the measured b1 rate). The weights
// of a tap meet every channel word of its input position, so row v's popcount term is the sum
// over taps of pop[v - m0 + r * VQ + s], pop[j] = sum_i c_i popc(plane i at slab position j).
// SIMT work during the tile's MMAs: ~SLAB_PIX / THREADS positions per thread, R * S shared
// loads per warp row.
constexpr int POP_WORDS = ROWSUM_SLAB ? (SLAB_PIX + 3) / 4 * 4 : 0;
// C <= 128 (one group of one chunk): every position of a plane is copied once with e == 0, so
// each thread counts the words it copied itself (visible to it after its own wait_group), for
// the next tile during this tile's MMAs, and the next loop-top barrier publishes them: no
// barrier of their own, two pop buffers by tile parity (a slow warp may still read this
// tile's). C >= 256: the chunks of a position come from several threads, so one pass over the
// landed slab and a barrier.
constexpr bool POP_OWN = ROWSUM_SLAB && GROUPS == 1 && CHUNKS == 1;
constexpr int POP_BUFFERS = POP_OWN ? 2 : 1;
static_assert(!ROWSUM_SLAB || (PERSIST && !PINGPONG && NEED_ROWSUM),
              "ROWSUM_SLAB: binary weights, persistent tap-shift kernel, STAGES = 3");

// THR_SMEM (THR_SLOTS > 0, rendered by bitserial_layout.threshold_slots): a persistent block's
// columns are fixed, so it copies its BN columns' thresholds to shared memory once, after the
// packing tiles, and the epilogue's threshold loads (per tile and lane, NT column pairs of
// 16-byte loads for two-bit outputs; for binary activations one 8-byte load per row and pair)
// hit shared memory instead of L1 / L2. Without binary activations every row compares with
// the one per-column table (bitserial_tables.epilogue_thresholds: THR_SLOTS = 1); with them, each tap
// rectangle an output pixel has gets a slot (RECT_OF_SLOT: its part-3 rows of wtap), and the
// row table holds the rows' slots instead of their rectangle ids (one slot where pad = 0).
constexpr bool THR_SMEM = THR_SLOTS > 0;
constexpr int THR_WORDS = THR_SLOTS * BN * THR_STRIDE;
static_assert(!THR_SMEM || (PERSIST && OUT_THRESH && (RECT_THR ? ROW_TABLE : THR_SLOTS == 1)),
              "THR_SLOTS: persistent threshold kernels; rectangle slots from the row table");
// THR_PAIRS: a slot holds per column pair of the block (accumulator columns 2p, 2p + 1; their
// channels by pair_channel) and level the pair's word (pair_thresholds), PAIR_STRIDE words a pair
constexpr int SLOT_WORDS = THR_PAIRS ? BN / 2 * PAIR_STRIDE : BN * THR_STRIDE;
__device__ __forceinline__ int block_channel(int j) { return j / WN * WN + pair_channel(j % WN); }
__device__ __forceinline__ void copy_pair_thresholds(int* s_thr, int n0, const EpilogueArgs& ea) {
  for (int i = threadIdx.x; i < THR_SLOTS * SLOT_WORDS; i += BLOCK_THREADS) {
    const int slot = i / SLOT_WORDS, p = i % SLOT_WORDS / PAIR_STRIDE, k = i % PAIR_STRIDE;
    const int* t = RECT_THR ? ea.wtap + WTHR0 + RECT_OF_SLOT[slot] * KPAD * THR_STRIDE : ea.thr;
    const int c0 = n0 + block_channel(2 * p), c1 = n0 + block_channel(2 * p + 1);
    s_thr[i] = k < THR_LEVELS
                   ? (int)pair_thresholds(t[c0 * THR_STRIDE + k], t[c1 * THR_STRIDE + k]) : 0;
  }
}

// sum_i c_i popc(plane i) of WORDS (<= 4) slab words at p: one position's chunk, every plane.
template <int WORDS>
__device__ __forceinline__ int weighted_popc(const u32* p) {
  int total = 0;
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i) {
    const u32* q = p + i * A_SHIFT_PLANE;
    int sum = 0;
    if constexpr (WORDS == 4) {  // a 16-byte chunk
      const uint4 v = *reinterpret_cast<const uint4*>(q);
      sum = __popc(v.x) + __popc(v.y) + __popc(v.z) + __popc(v.w);
    } else {
#pragma unroll
      for (int w = 0; w < WORDS; ++w) sum += __popc(q[w]);
    }
    total += a_coef(i) * sum;
  }
  return total;
}
// pop[j] for every slab position j of the slabs at `slabs` (C >= 256, !POP_OWN: every group's
// 16-byte chunks). Zeros at padding and margins.
__device__ __forceinline__ void slab_popcounts(const u32* slabs, int* pop, int tid) {
  static_assert(!ROWSUM_SLAB || POP_OWN || CW % 4 == 0, "C <= 128 counts its own copies");
  for (int j = tid; j < SLAB_PIX; j += THREADS) {
    int total = 0;
#pragma unroll
    for (int grp = 0; grp < GROUPS; ++grp)
#pragma unroll
      for (int lc = 0; lc < GROUP_CHUNKS; ++lc)
        if (2 * grp + lc < CHUNKS)  // the last group may miss its second chunk
          total += weighted_popc<4>(slabs + grp * A_GROUP_WORDS + (lc * SLAB_PIX + j) * 4);
    pop[j] = total;
  }
}
// pop[j] of the positions this thread copied into `slab` (POP_OWN; its copies have landed).
__device__ __forceinline__ void own_slab_popcounts(const u32* slab, int* pop, int tid) {
#pragma unroll
  for (int k = 0; k < SLAB_SLOTS; ++k) {
    const int idx = tid + k * THREADS;  // chunk 0, entry idx / PER_ENTRY: position j at word 4j
    if (idx >= SLAB_COPIES || idx % PER_ENTRY) continue;
    pop[idx / PER_ENTRY] = weighted_popc<CW>(slab + idx * COPY_WORDS);
  }
}
// Add the slab row popcount terms to this lane's rows (their indices in the tile: row0 + g
// + 8h). Lane l sums the taps of the warp's row l % 16 (warp instructions count, not lanes:
// half the loads and adds of summing both of a lane's rows), then lanes fetch theirs.
__device__ __forceinline__ void add_slab_rowsums(RowPrep& rows, const int* pop, int row0,
                                                 int lane) {
  static_assert(MT == 1, "a warp owns 16 rows of its warpgroup's m64 tile");
  const int* p = pop + row0 + (lane & 15);
  int sum = 0;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 0; s < S; ++s) sum += p[r * VQ + s];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    rows.term[0][h] += A_ALPHA * W_BETA * __shfl_sync(0xffffffffu, sum, (lane >> 2) + 8 * h);
}

// cp.async.wait_group with a run-time count < GROUPS (the template needs a constant).
__device__ __forceinline__ void copy_wait_groups(int n) {
  switch (n) {
    case 0: copy_wait<0>(); break;
    case 1: copy_wait<1>(); break;
    case 2: copy_wait<2>(); break;
    case 3: copy_wait<3>(); break;
    case 4: copy_wait<4>(); break;
    case 5: copy_wait<5>(); break;
    case 6: copy_wait<6>(); break;
    default: copy_wait<7>(); break;
  }
}

// Issue the k256 steps of channel group `grp` (SHIFT_STEPS) for warpgroup (wg_m, wg_n), from
// the tile's slabs and the block's weights. acc_in: 0 on a tile's first step (scale-d 0
// overwrites the accumulators), then 1.
__device__ __forceinline__ void shift_group_steps(Acc& acc, RowSum& rsum, const u32* slabs,
                                                  const u32* weights, const u32* ones, int grp,
                                                  int wg_m, int wg_n, int& acc_in) {
  // base descriptors: the warpgroup's 64 rows of the slab, its weight columns, the ones tiles
  const u64 da0 = slab_desc(slabs + grp * A_GROUP_WORDS + wg_m * 64 * 4, 0);
  const u64 db0 = smem_desc(weights + grp * B_GROUP_WORDS + wg_n * (P_BITS * WN) * 8);
  const u64 d1 = ROWSUM_ONES_TILE ? smem_desc(ones) : 0;
  // offsets in 16-byte units: entries of 4 words, weight rows of 8 words, ones tiles of 64
#define SHIFT_STEP(G_, T_, OFF, LBO, ONES)                                                   \
  if (grp == G_) {                                                                          \
    const u64 db = desc_offset(db0, T_ * B_ROWS * 2);                                       \
    _Pragma("unroll") for (int i = 0; i < Q_BITS; ++i) {                                    \
      const u64 da = desc_offset(da0, i * A_SHIFT_PLANE / 4 + OFF, LBO);                    \
      wgmma_plane(acc, rsum, i, da, db, desc_offset(d1, ONES * 16), acc_in);               \
    }                                                                                       \
    acc_in = 1;                                                                             \
  }
  SHIFT_STEPS(SHIFT_STEP)
#undef SHIFT_STEP
}

// One output tile per block; channel group g's MMAs start once its slab and weights landed.
extern "C" __global__ void __launch_bounds__(THREADS) bitserial_wgmma_shift(BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  chain_begin();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const int m0 = blockIdx.y * BM;  // virtual rows < 2^31 (the template's constraints)
  const int n0 = blockIdx.x * BN;
  u32* weights = smem;
  u32* slabs = smem + GROUPS * B_GROUP_WORDS;
  u32* ones = smem + ONES_OFFSET;
  fill_shift_ones(ones, tid);
  fill_ones_rows(weights, tid, THREADS);
  const SlabPix pix = slab_pixels(vrows + VPIX0, blockIdx.y, slab_slots(tid), tid);
#pragma unroll
  for (int grp = 0; grp < GROUPS; ++grp) {
    load_slab(x, slabs + grp * A_GROUP_WORDS, pix, grp, tid);
    load_group_weights(w, weights + grp * B_GROUP_WORDS, n0, grp, tid, THREADS);
    copy_commit();
  }

  Acc acc;
  RowSum rsum;
  zero_acc(acc, rsum);
  int acc_in = 0;
#pragma unroll
  for (int grp = 0; grp < GROUPS; ++grp) {
    copy_wait_groups(GROUPS - 1 - grp);
    fence_proxy_async();
    __syncthreads();  // group grp landed everywhere
    wgmma_fence();
    CUT_MMA shift_group_steps(acc, rsum, slabs, weights, ones, grp, wg_m, wg_n, acc_in);
    wgmma_commit();
  }
  chain_mmas_issued();
  wgmma_wait<0>();

  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  // the packing tile over the operands, once every warpgroup is done
  CUT_EPILOGUE tile_epilogue(acc, rsum, m0, n0, wg_m * 64 + (warp & 3) * 16, wg_n * WN, lane, tid, ea, smem);
}

// cp.async every channel group's slab of row tile t (nothing past the last tile; its copies'
// input pixels `pix`) as one copy group.
__device__ __forceinline__ void load_slabs(const u32* __restrict__ x, u32* slabs, int t,
                                           const SlabPix& pix, int tid) {
  if (t < ROW_TILES) {
#pragma unroll
    for (int grp = 0; grp < GROUPS; ++grp) load_slab(x, slabs + grp * A_GROUP_WORDS, pix, grp, tid);
  }
  copy_commit();
}

// The MMAs of every channel group of the tile whose slab is `slab`, as one wgmma group.
__device__ __forceinline__ void shift_tile_mma(Acc& acc, RowSum& rsum, const u32* slab,
                                               const u32* weights, const u32* ones, int wg_m,
                                               int wg_n) {
  zero_acc(acc, rsum);
  int acc_in = 0;
  wgmma_fence();
#pragma unroll
  for (int grp = 0; grp < GROUPS; ++grp)
    shift_group_steps(acc, rsum, slab, weights, ones, grp, wg_m, wg_n, acc_in);
  wgmma_commit();
}

// The epilogue rows of this lane in row tile t: from the row table (ROW_TABLE), or from the
// rows' offsets d from the tile's first row (vpos of each row's index in the tile).
__device__ __forceinline__ RowPrep shift_rows(int t, const VPos (&d)[MT][2], int n0, int row0,
                                              int col0, int lane, const EpilogueArgs& ea) {
  if constexpr (ROW_TABLE) return table_rows(t * BM + row0, n0, col0, lane, ea);
  const VPos t0 = vpos(t * BM);
  LaneRows pos;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mi][h] = row_pos(vpos_add(t0, d[mi][h]));
  return epilogue_rows(pos, n0, col0, lane, ea);
}

// Persistent blocks (PERSIST=1): block (x, y) keeps column tile x's weights resident and takes
// row tiles y, y + gridDim.y, ... (TEAMS = 2: team t the tiles y + (2i + t) gridDim.y); the slab
// of a later tile loads into the buffer this tile's MMAs just released, while the epilogue runs.
// PINGPONG: tile t + 1's MMAs are issued (into the other accumulator set) before tile t's
// epilogue, so the tensor cores work through it.
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) bitserial_wgmma_shift_persistent(
    BITSERIAL_KERNEL_PARAMS) {
  extern __shared__ __align__(128) u32 smem[];
  chain_begin();
  const int team = team_of_thread();
  const int tid = (int)threadIdx.x - team * THREADS, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wg_m = wg / WARPS_N, wg_n = wg % WARPS_N;
  const int n0 = blockIdx.x * BN, step = TEAMS * gridDim.y;
  u32* weights = smem;
  u32* slabs = smem + GROUPS * B_GROUP_WORDS + team * SLAB_BUFFERS * SLABS_WORDS;
  u32* ones = smem + ONES_OFFSET;
  int* pop = reinterpret_cast<int*>(ones + (ROWSUM_ONES_TILE ? ONES_TILES * 64 : 0))  // ROWSUM_SLAB
             + team * POP_BUFFERS * POP_WORDS;
  u32* after_pop = reinterpret_cast<u32*>(pop + (TEAMS - team) * POP_BUFFERS * POP_WORDS);
  u32* s_out = after_pop + team * PACK_WORDS;  // apart: slabs load
  int* s_thr = reinterpret_cast<int*>(after_pop + (PACK_IN_SMEM ? TEAMS * PACK_WORDS : 0));
  const SlabSlots slots = slab_slots(tid);
  const int* vpix = vrows + VPIX0;
  // the block's constants, read by every team: each thread of the block copies its share of
  // the weights (joining its first copy group), team 0 fills the ones
  if (team == 0) fill_shift_ones(ones, tid);
  fill_ones_rows(weights, (int)threadIdx.x, BLOCK_THREADS);
#pragma unroll
  for (int grp = 0; grp < GROUPS; ++grp)
    load_group_weights(w, weights + grp * B_GROUP_WORDS, n0, grp, (int)threadIdx.x,
                       BLOCK_THREADS);
  int tile = blockIdx.y + team * gridDim.y;
  constexpr int AHEAD = PINGPONG ? SLAB_BUFFERS : SLAB_BUFFERS - 1;  // slabs loaded up front
#pragma unroll
  for (int b = 0; b < AHEAD; ++b)  // the first with the weights: one copy group each
    load_slabs(x, slabs + b * SLABS_WORDS, tile + b * step,
               slab_pixels(vpix, tile + b * step, slots, tid), tid);
  // SLAB_TABLE: the pixels of the slab the loop loads next, fetched an iteration early
  SlabPix pix_ahead = slab_pixels(vpix, tile + AHEAD * step, slots, tid);
  const EpilogueArgs ea = BITSERIAL_EPILOGUE_ARGS;
  const int row0 = wg_m * 64 + (warp & 3) * 16, col0 = wg_n * WN;
  if constexpr (THR_PAIRS) {  // published by the barrier before the first tile's epilogue
    copy_pair_thresholds(s_thr, n0, ea);
  } else if constexpr (THR_SMEM) {
    for (int i = threadIdx.x; i < THR_WORDS; i += BLOCK_THREADS) {
      const int j = n0 * THR_STRIDE + i % SLOT_WORDS;
      s_thr[i] = RECT_THR ? ea.wtap[WTHR0 + RECT_OF_SLOT[i / SLOT_WORDS] * KPAD * THR_STRIDE + j]
                          : ea.thr[j];
    }
  }
  // THR_SMEM: row_data's, in slot 0; THR_PAIRS: the entries of this lane's first column pair
  const int* lane_thr = s_thr + (THR_PAIRS ? (col0 / 2 + (lane & 3)) * PAIR_STRIDE
                                           : (col0 + 2 * (lane & 3)) * THR_STRIDE);
  VPos lane_d[MT][2];  // this lane's rows' offsets from a tile's first row
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) lane_d[mi][h] = vpos(row0 + mi * 16 + (lane >> 2) + 8 * h);
  if constexpr (TEAMS > 1) {  // every thread's weight copies (its first copy group) land for all
    copy_wait<AHEAD - 1>();
    fence_proxy_async();
    __syncthreads();
  }
  if constexpr (POP_OWN) {  // the first tile's popcounts (its slab is the first copy group)
    copy_wait<AHEAD - 1>();
    own_slab_popcounts(slabs, pop, tid);
  }
  Acc acc[PINGPONG ? 2 : 1];
  RowSum rsum[PINGPONG ? 2 : 1];
  if constexpr (PINGPONG) {
    copy_wait<SLAB_BUFFERS - 1>();  // the first tile's slab and the weights
    fence_proxy_async();
    __syncthreads();
    shift_tile_mma(acc[0], rsum[0], slabs, weights, ones, wg_m, wg_n);
  }
  // Iteration `it` finishes tile `tile` (slab buffer it % SLAB_BUFFERS); the accumulator sets
  // alternate, so the loop body is unrolled twice to keep them in registers.
  for (int it = 0; tile < ROW_TILES;) {
#pragma unroll
    for (int half = 0; half < (PINGPONG ? 2 : 1) && tile < ROW_TILES; ++half, ++it, tile += step) {
      Acc& cur = acc[PINGPONG ? half : 0];
      RowSum& cur_rs = rsum[PINGPONG ? half : 0];
      u32* slab = slabs + (it % SLAB_BUFFERS) * SLABS_WORDS;
      copy_wait<1>();  // PINGPONG: the next tile's slab landed; else this tile's
      fence_proxy_async();
      tile_sync();  // and every warpgroup of the team is past the previous tile's MMAs
      RowPrep rows;
      if constexpr (PINGPONG) {
        if (tile + step < ROW_TILES)
          shift_tile_mma(acc[1 - half], rsum[1 - half],
                         slabs + ((it + 1) % SLAB_BUFFERS) * SLABS_WORDS, weights, ones, wg_m, wg_n);
        else
          wgmma_commit();  // an empty group keeps the wait count below
        rows = shift_rows(tile, lane_d, n0, row0, col0, lane, ea);
        wgmma_wait<1>();   // this tile's MMAs are done
        __syncthreads();   // every warpgroup's MMAs are done with this tile's slab
        CUT_LOADS load_slabs(x, slab, tile + SLAB_BUFFERS * step,
                   slab_pixels(vpix, tile + SLAB_BUFFERS * step, slots, tid), tid);
      } else {
        mma_turn_wait(team, it == 0);  // the other team's tile gridDim.y back is issued
        CUT_MMA shift_tile_mma(cur, cur_rs, slab, weights, ones, wg_m, wg_n);
        mma_turn_pass(team, tile + (int)gridDim.y < ROW_TILES);  // its tile gridDim.y on
        // while the MMAs run: the slab two tiles on, into the buffer the previous tile released
        if constexpr (SLAB_TABLE) {
          CUT_LOADS load_slabs(x, slabs + ((it + 2) % SLAB_BUFFERS) * SLABS_WORDS,
                               tile + 2 * step, pix_ahead, tid);
          pix_ahead = slab_pixels(vpix, tile + 3 * step, slots, tid);
        } else {
          CUT_LOADS load_slabs(x, slabs + ((it + 2) % SLAB_BUFFERS) * SLABS_WORDS,
                               tile + 2 * step, slab_pixels(vpix, tile + 2 * step, slots, tid), tid);
        }
        if constexpr (POP_OWN) {  // the next tile's slab (garbage past the last: never read)
          copy_wait<1>();
          own_slab_popcounts(slabs + ((it + 1) % SLAB_BUFFERS) * SLABS_WORDS,
                             pop + ((it + 1) & 1) * POP_WORDS, tid);
        }
        rows = shift_rows(tile, lane_d, n0, row0, col0, lane, ea);
        if constexpr (ROWSUM_SLAB) {  // pop is free: every thread passed the loop-top barrier
          int* tile_pop = pop + (POP_OWN ? (it & 1) * POP_WORDS : 0);
          if constexpr (!POP_OWN) {
            slab_popcounts(slab, tile_pop, tid);
            tile_sync();
          }
          add_slab_rowsums(rows, tile_pop, row0, lane);
        }
        wgmma_wait<0>();
      }
      if constexpr (THR_SMEM) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            rows.rowp[mi][h] = lane_thr + (RECT_THR ? rows.rect[mi][h] * SLOT_WORDS : 0);
      }
      CUT_EPILOGUE tile_epilogue(cur, cur_rs, rows, tile * BM, n0, row0, col0, lane, tid, ea, s_out);
    }
  }
  wgmma_wait<0>();
  copy_wait<0>();
}
