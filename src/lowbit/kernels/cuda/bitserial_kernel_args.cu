// ---- the kernels' arguments, their barriers, and the probes' cut points ----

// The opaque 128 bytes of a tensor map (cuTensorMapEncodeTiled; TMA_HALO's, of x), passed by
// value: the tensor copies read it from the kernel's parameters.
struct __align__(64) TensorMap {
  u64 opaque[16];
};
// The block-end epilogue's outputs (HAS_BIAS = 5, bitserial_block_end.cu), passed by value:
// each derived output's storage, and its levels as threshold words (bit planes of one or three
// levels: thr[j][k] = 0x8000 - (T_j[k] - MID_LO) in both 16-bit halves, compared two columns
// per add) or as a byte table of the mid value (lut[j][q - MID_LO]: the others);
// bitserial_tables.block_end_args builds both from EpilogueParams.thresholds at bind.
// (Declared in block-end kernels only, as their constants: every namespace-scope constant
// took a slot in constant bank 4, moving the offsets other kernels' SASS reads.)
#if LOWBIT_BLOCK_END
constexpr int THR_CMP_LEVELS = 3;
struct BlockEndArgs {
  void* derived[2];
  const unsigned char* lut[2];
  int thr[2][THR_CMP_LEVELS];
};
#endif
// The parameters of every bit-serial kernel (bitserial_kernel.py launches them in this order; with
// TMA_HALO the rendered BITSERIAL_XMAP_PARAM adds the tensor map of x, with the block-end
// epilogue BITSERIAL_BLOCK_END_PARAM its BlockEndArgs).
#define BITSERIAL_KERNEL_PARAMS                                                               \
  const u32* __restrict__ x, const u32* __restrict__ w, void* __restrict__ out,               \
      const int* __restrict__ bias, const float* __restrict__ scale,                          \
      const int* __restrict__ mult, const int* __restrict__ shift, const int* __restrict__ wtap, \
      const int* __restrict__ xpop, const int* __restrict__ thr, int* split_ws,              \
      int* split_count, const int* __restrict__ vrows BITSERIAL_XMAP_PARAM                   \
      BITSERIAL_BLOCK_END_PARAM

struct EpilogueArgs {
  void* out;
  const int* bias;
  const float* scale;
  const int* mult;
  const int* shift;
  const int* wtap;
  const int* xpop;
  const int* thr;  // OUT_THRESH: [KPAD][THR_LEVELS] requantization thresholds
  const int* vrows;  // ROW_TABLE: [ROW_TILES * BM][2] {output row, tap rectangle} per row
  int* split_ws;   // SPLIT_K > 1: [SPLIT_K][ROW_TILES * BM][WS_COLS] k-linear partial sums
  int split_z;     // this block's k split (blockIdx.z; 0 without split-K)
#if LOWBIT_BLOCK_END
  BlockEndArgs be;  // HAS_BIAS = 5: the derived outputs
#endif
};
// The epilogue's view of BITSERIAL_KERNEL_PARAMS (inside a kernel taking them).
#define BITSERIAL_EPILOGUE_ARGS                                                               \
  EpilogueArgs{out, bias, scale, mult, shift, wtap, xpop, thr, vrows, split_ws,               \
               SPLIT_K > 1 ? (int)blockIdx.z : 0 BITSERIAL_BLOCK_END}

// The barrier of the threads that share a tile's pipeline: the block's, or with TEAMS > 1 this
// thread's team's, with SLICES > 1 its k slice's (named barrier 1 + team or slice).
__device__ __forceinline__ int group_of_thread() {  // its team or k slice (one is 1)
  return BLOCK_THREADS > THREADS ? (int)threadIdx.x / THREADS : 0;
}
__device__ __forceinline__ int team_of_thread() { return TEAMS > 1 ? group_of_thread() : 0; }
__device__ __forceinline__ int slice_of_thread() { return SLICES > 1 ? group_of_thread() : 0; }
__device__ __forceinline__ void tile_sync() {
  if constexpr (BLOCK_THREADS > THREADS) named_sync(1 + group_of_thread(), THREADS);
  else __syncthreads();
}
// TEAMS = 2: the teams take turns issuing their tiles' MMAs (named barrier 3 + team), so one
// team's MMAs run while the other's epilogue does. A team waits before a tile's first MMA until
// the other team has issued its previous tile's (`first`: team 0's first tile waits for
// nobody), and passes the turn after its last MMA where the other team has a tile that waits
// for it (`partner_waits`; a pass nobody waits for would leave the barrier half full).
__device__ __forceinline__ void mma_turn_wait(int team, bool first) {
  if constexpr (TEAMS > 1) {
    if (team == 1 || !first) named_sync(3 + team, 2 * THREADS);
  }
}
__device__ __forceinline__ void mma_turn_pass(int team, bool partner_waits) {
  if constexpr (TEAMS > 1) {
    if (partner_waits) named_arrive(4 - team, 2 * THREADS);
  }
}


// Probes' cut points (bitserial_render.CUTS; benchmarks/probes/cut_probe.py): a kernel writes
// CUT_MMA / CUT_EPILOGUE / CUT_LOADS before the statement of that part. Rendered with the cut
// (LOWBIT_CUT_<NAME> defined), the statement runs only where shared word 0 holds a value that
// operand data never holds on the GPU: its code stays in the binary, its work is gone (and the
// output is garbage). Without the cut the macros are empty: the kernels are unchanged.
#define LOWBIT_NEVER if (*(volatile u32*)smem == 0x9E3779B9u)
#if LOWBIT_CUT_MMA
#define CUT_MMA LOWBIT_NEVER
#else
#define CUT_MMA
#endif
#if LOWBIT_CUT_EPILOGUE
#define CUT_EPILOGUE LOWBIT_NEVER
#else
#define CUT_EPILOGUE
#endif
#if LOWBIT_CUT_LOADS
#define CUT_LOADS LOWBIT_NEVER
#else
#define CUT_LOADS
#endif
