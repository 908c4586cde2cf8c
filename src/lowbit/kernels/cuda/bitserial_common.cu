// Bit-serial (APNN-TC) conv2d / GEMM on 1-bit tensor cores: mma.sync m16n8k256 b1 .and.popc
// (bitserial.cu, bitserial_persistent.cu) or, on sm_90a, wgmma m64nNk256 b1 .and.popc
// (bitserial_wgmma.cu). This file holds what they share: constants, operand staging, the
// mma.sync stage loop, the fused epilogue. Rendered by bitserial.py, which prepends the
// constexpr parameters (shape, encodings, tiles).
//
// GEMM view: rows m = output pixels (n, p, q) [GEMM: rows of a], columns = filters [GEMM: rows
// of b], reduction over k words = (r, s, 32-channel word) of the bit planes. Each warp keeps one
// int32 accumulator set per (activation plane i, weight plane j): the q activation planes and p
// weight planes form a virtual (Q_BITS*BM) x (P_BITS*BN) binary GEMM whose shared-memory tiles
// are loaded once per k tile and reused for every plane pair (APNN-TC's batch-based caching).
// The epilogue combines the planes with their coefficients (reference/bitserial.py):
//   acc = aa*ab*sum c_i d_j popc(a_i&b_j) + aa*bb*sum c_i popc(a_i) + ba*ab*T + ba*bb*C*taps
// where T = sum of d_j popc(b_j) over the taps that fall inside the image (input-aware padding:
// padded pixels are zero words, so they add nothing to the AND products).

typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// A "warp tile" WM x WN is one warp's (mma.sync) or one warpgroup's (wgmma: WM = 64, 4 warps of
// 16 rows each) share of the block tile; the epilogue always works per warp.
constexpr int WARP_THREADS = WGMMA ? 128 : 32;
constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN, THREADS = WARPS_M * WARPS_N * WARP_THREADS;
// TEAMS > 1 (the persistent wgmma kernels): the block holds TEAMS teams of THREADS threads, each
// working its own tiles; everything per tile counts a team's THREADS. SLICES > 1 (the one-tile
// wgmma kernel): SLICES sets of THREADS threads reduce one tile's k tiles in SLICES ranges.
constexpr int BLOCK_THREADS = TEAMS * SLICES * THREADS;
static_assert(TEAMS == 1 || SLICES == 1, "teams and k slices are different kernels'");
constexpr int WARP_ROWS = WGMMA ? 16 : WM;     // accumulator rows of one warp
constexpr int MT = WARP_ROWS / 16, NT = WN / 8;  // m16 x n8 accumulator tiles per warp
constexpr int TILE_WORDS = KT * 8;             // k words per pipeline stage (8 words = k256)
constexpr int KW = R * S * CW;                 // k words of one im2col row
constexpr int KTILES = (KW + TILE_WORDS - 1) / TILE_WORDS;
// Stage tiles: Q_BITS activation planes of BM rows, P_BITS weight planes of BN rows, KT k slabs
// of 32 bytes per row. mma.sync: plane-major. wgmma: the weight planes of a warpgroup's WN
// columns are adjacent rows (B_ROWS = P_BITS * BN per slab), so one m64nNk256 with N = P_BITS*WN
// multiplies an activation plane with every weight plane.
constexpr int A_PLANE_STEP = KT * BM * 8;                   // words between activation planes
constexpr int B_PLANE_STEP = WGMMA ? WN * 8 : KT * BN * 8;  // words between weight planes
// ROWSUM_COLS (wgmma, binary weights, BN = WN): each B slab carries 16 more rows,
// 8 of ones (the row popcounts' columns) and 8 of zeros (wgmma N above 32 is a multiple of
// 16), so one m64n(WN+16)k256 reads the A tile once for the products and the row popcounts,
// instead of a second m64n8k256 re-reading it (shared-memory bandwidth limits the MMA phase).
constexpr int ONES_ROWS = ROWSUM_COLS ? 16 : 0;
constexpr int B_ROWS = WGMMA ? P_BITS * BN + ONES_ROWS : BN;  // rows of one B slab
// A_IN_HALO: the MMAs read the A tiles in place from the block's halo; the stages hold B only
constexpr int A_STAGE_WORDS = A_IN_HALO ? 0 : Q_BITS * A_PLANE_STEP;
constexpr int STAGE_WORDS = A_STAGE_WORDS + (P_BITS * BN + ONES_ROWS) * KT * 8;
constexpr int CPR = TILE_WORDS / VEC;          // copy chunks per row per stage
constexpr int A_ITERS = (BM * CPR + THREADS - 1) / THREADS;
constexpr int B_ITERS = (BN * CPR + THREADS - 1) / THREADS;
constexpr i64 X_PLANE = (i64)NB * H * W * CW;  // words per activation plane
constexpr i64 W_PLANE = (i64)KOUT * KW;        // words per weight plane
constexpr int RS = R * S;
constexpr int OUT_WORDS = (KOUT + 31) / 32;    // words per row of bit-plane output
constexpr bool NEED_ROWSUM = W_BETA != 0;      // binary weights: sum_i c_i popc(a_i)
// ROWSUM_TABLE: those row popcounts come from a per-pixel popcount table of x (bitserial_xpop)
// summed over the valid taps in the epilogue, instead of one extra MMA per plane and k step
// against a tile of ones (which re-reads the A tile from shared memory). ROWSUM_SLAB
// (TAP_SHIFT=1 persistent kernels): from the popcounts of the block's input slab, summed over
// each row's taps while the tile's MMAs run (bitserial_wgmma_shift.cu).
constexpr bool ROWSUM_MMA = NEED_ROWSUM && !ROWSUM_TABLE && !ROWSUM_SLAB;
// ... by a second wgmma (m64n8k256) against a tile of ones, unless ROWSUM_COLS puts the ones
// in the products' own wgmma
constexpr bool ROWSUM_ONES_TILE = ROWSUM_MMA && !ROWSUM_COLS;
static_assert(!ROWSUM_COLS || (ROWSUM_MMA && WGMMA && BN == WN && !FUSE_PLANES),
              "ROWSUM_COLS: binary weights, wgmma, one warpgroup in N (bitserial.py)");
static_assert(!(ROW_TABLE && ROWSUM_TABLE) && (ROW_TABLE < 2 || TAP_SHIFT),
              "ROW_TABLE: not with the xpop sums; 2: TAP_SHIFT=1 (bitserial.py)");
constexpr i64 PIXELS = (i64)NB * H * W;        // input pixels per activation plane
// Bit-plane output: a warp owning whole 32-column words packs them in registers; narrower warp
// tiles OR their bits into a shared-memory tile of the block's words first.
constexpr bool PACK_IN_SMEM = OUT_MODE == 3 && WN % 32 != 0;
constexpr int BLOCK_WORDS = BN >= 32 ? BN / 32 : 1;
constexpr int PACK_WORDS = OUT_BITS * BM * BLOCK_WORDS;
constexpr int N_COL_TILES = (KOUT + BN - 1) / BN;
constexpr int ROW_TILES = (int)((V_ROWS + BM - 1) / BM);  // V_ROWS: TAP_SHIFT's rows, else M_ROWS
// A_IN_HALO (wgmma, stride 1, CW % 8 == 0): block tile t covers the output pixels of a
// TILE_H x 8 pixel tile (rows of 8 pixels, 8 * wg_m.. for warpgroup wg_m; tiles past the
// image's edge keep their rows, dropped by row_pos). Its input window, HALO_H x HALO_W pixels,
// sits in shared memory as [plane][16-byte chunk][pixel] (16 bytes = 128 channels of a plane),
// so for tap (r, s) and a chunk pair the 64 rows of a warpgroup are eight runs of 8 pixels at
// a fixed stride: a core-matrix layout (8 rows x 16 contiguous bytes each, 8-row groups SBO =
// HALO_W * 16 bytes apart, k halves LBO = CHUNK_UNITS * 16 bytes apart) that wgmma reads
// through a descriptor, with no im2col copy at all. CHUNK_UNITS, the chunks' stride in 16-byte
// units, is odd: a warp's copies (8 chunks x 4 pixels) then write every 128-byte bank row
// equally, where an even stride (100 at 3 x 3, 8 x 8 tiles) piled them on two of the eight
// (Nsight, H100: 6.5x the ideal shared-memory wavefronts and twice the L2 sectors).
// PLANE_ROWS (two activation planes): a warp's 16 rows are one output row's 8 pixels in plane 0
// and the same pixels in plane 1, so one wgmma per k slab covers both planes (m64 = 4 output
// rows x 2 planes x 8 pixels) and the window holds [chunk][window row][plane][pixel]: the tap
// tiles' 8-row groups (row, plane) stay HALO_W * 16 bytes apart. Each thread's rows g and g + 8
// are then one pixel's two planes, moved to the planes' registers before the epilogue
// (planes_from_rows), which drops rows g + 8.
constexpr int PLANE_GROUPS = PLANE_ROWS ? Q_BITS : 1;  // 8-row groups per output row
static_assert(!PLANE_ROWS || (A_IN_HALO && Q_BITS == 2 && !FUSE_PLANES && !ROWSUM_COLS &&
                              SLICES == 1 && !TMA_HALO),
              "PLANE_ROWS: A_IN_HALO, two activation planes, one k slice (bitserial.py)");
constexpr int TILE_H = BM / 8 / PLANE_GROUPS, HALO_H = TILE_H + R - 1, HALO_W = 8 + S - 1;
constexpr int HALO_PIX = HALO_H * HALO_W, HALO_CHUNKS = CW / 4;
constexpr int CHUNK_UNITS = (PLANE_GROUPS * HALO_PIX) | 1;
// the window's 16-byte unit of plane i, chunk `chunk`, window pixel `pix`
__device__ __forceinline__ int halo_unit(int i, int chunk, int pix) {
  if constexpr (PLANE_ROWS)
    return chunk * CHUNK_UNITS + (pix / HALO_W * Q_BITS + i) * HALO_W + pix % HALO_W;
  return (i * HALO_CHUNKS + chunk) * CHUNK_UNITS + pix;
}
// A_IN_HALO: block tile `tile`'s image and the input pixel at its window's top left
struct WindowOrigin {
  int n, iy0, ix0;
};
__device__ __forceinline__ WindowOrigin window_origin(int tile) {
  const int tx = tile % TILES_X, ty = tile / TILES_X % TILES_Y;
  return WindowOrigin{tile / (TILES_X * TILES_Y), ty * TILE_H - PAD, tx * 8 - PAD};
}
constexpr bool B_BY_SLAB = A_IN_HALO;  // the weight copies' thread order (load_stage)
// TMA_HALO (bitserial_wgmma.cu; its value, 32, 64 or 128, is the swizzle width in bytes): the
// window as channel blocks of TMA_HALO bytes per pixel (CW * 4 / TMA_HALO per plane), HALO_PIX
// rows each, every block on a boundary of its swizzle's period (8 rows)
constexpr int HALO_BLOCKS = TMA_HALO ? CW * 4 / TMA_HALO : 0;
constexpr int HALO_BLOCK_BYTES = TMA_HALO ? (HALO_PIX + 7) / 8 * 8 * TMA_HALO : 0;
static_assert(!A_IN_HALO || (WGMMA && STRIDE == 1 && CW % 8 == 0 && VEC == 4),
              "A_IN_HALO: wgmma, stride 1, channels a multiple of 256 (bitserial.py)");
constexpr int N_TILES = N_COL_TILES * ROW_TILES;
// ROW_TABLE=2: the slab copies' input pixels follow the rows' {output row, rect} entries
constexpr int VPIX0 = ROW_TABLE >= 2 ? (int)(2 * ROW_TILES * BM) : 0;
// Split-K (SPLIT_K > 1, one-tile-per-block kernels; the space allows it on mma.sync only):
// block z of a tile reduces k tiles [z * KTILES_PER_SPLIT, ...) and stores its k-linear partial
// sums to the workspace slice z of ROW_TILES * BM x WS_COLS (the padded tile grid: no guards);
// the tile's last block to arrive sums every slice, its own included, and runs the epilogue.
// For grids of few tiles and long reductions (a 16x16 image with 1,024 channels fills 64
// blocks on 132 SMs over 36 k tiles).
constexpr int KTILES_PER_SPLIT = (KTILES + SPLIT_K - 1) / SPLIT_K;
constexpr int WS_COLS = N_COL_TILES * BN;
constexpr i64 WS_SPLIT = (i64)ROW_TILES * BM * WS_COLS;

// Virtual-grid coordinates of v = (n * VP + y) * VQ + c, 0 <= y < VP, 0 <= c < VQ (TAP_SHIFT's
// grid, bitserial_wgmma_shift.cu; without it VQ = VP = 1 and y = c = 0). n < 0: before the grid.
// A persistent kernel splits each tile's first row once and adds every thread's fixed offset
// with two carries (vpos_add) instead of two divisions per row or slab position.
struct VPos {
  int n, y, c;
};
__device__ __forceinline__ VPos vpos(int v) {  // v >= 0
  const int t = v / VQ;
  return VPos{t / VP, t % VP, v % VQ};
}
// Floor-wise for -VP * VQ <= v < 2^31 - VP * VQ (a slab offset before the tile's first row).
__device__ __forceinline__ VPos vpos_floor(int v) {
  const VPos p = vpos(v + VP * VQ);
  return VPos{p.n - 1, p.y, p.c};
}
__device__ __forceinline__ VPos vpos_add(VPos a, VPos d) {
  int c = a.c + d.c, y = a.y + d.y, n = a.n + d.n;
  if (c >= VQ) c -= VQ, ++y;
  if (y >= VP) y -= VP, ++n;
  return VPos{n, y, c};
}

// Output row m of block row v and its pixel's row and column (po, qo): v itself, or with
// TAP_SHIFT=1 the row of pixel (n, ho, wo) of virtual row v = (n * VP + ho) * VQ + wo, and
// M_ROWS (dropped) for rows in the virtual grid's margin (ho >= P_OUT or wo >= Q_OUT) or past
// the last image. Rows < 2^31 (bitserial.py).
struct RowPos {
  int m, po, qo;
};
__device__ __forceinline__ RowPos row_pos(VPos p) {  // TAP_SHIFT, A_IN_HALO
  const bool ok = p.n < NB && p.y < P_OUT && p.c < Q_OUT;
  return RowPos{ok ? (p.n * P_OUT + p.y) * Q_OUT + p.c : (int)M_ROWS, p.y, p.c};
}
__device__ __forceinline__ RowPos row_pos(int v) {
  if constexpr (TAP_SHIFT) return row_pos(vpos(v));
  if constexpr (A_IN_HALO) {  // tile t = (n * TILES_Y + ty) * TILES_X + tx, 8 pixels per row
    const int i = v % BM, t = v / BM;
    if constexpr (PLANE_ROWS)  // rows of plane 1 (the second 8 of 16): dropped
      if (i / 8 % Q_BITS) return row_pos(VPos{NB, 0, 0});
    return row_pos(VPos{t / (TILES_X * TILES_Y),
                        t / TILES_X % TILES_Y * TILE_H + i / 8 / PLANE_GROUPS, t % TILES_X * 8 + i % 8});
  }
  return RowPos{v, (v / Q_OUT) % P_OUT, v % Q_OUT};
}
__device__ __forceinline__ int out_row(int v) { return row_pos(v).m; }

__device__ __forceinline__ constexpr int a_coef(int i) {
  return (A_SIGNED && i == Q_BITS - 1) ? -(1 << i) : (1 << i);
}
__device__ __forceinline__ constexpr int w_coef(int j) {
  return (W_SIGNED && j == P_BITS - 1) ? -(1 << j) : (1 << j);
}

// <device-primitives> (bitserial_emu.py replaces this region with host versions)
__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// Copy VEC words global -> shared; zero-fill when !valid (out of image, past K, past rows).
__device__ __forceinline__ void copy_async(u32* dst, const u32* src, bool valid) {
  const u32 d = smem_addr(dst);
  const int n = valid ? VEC * 4 : 0;
  if constexpr (VEC == 4) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else if constexpr (VEC == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(n));
  }
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// A hint: the global line at p into L1 (no fault, nothing waits for it)
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" :: "l"(p));
}
// v, hidden from the optimizer: values derived from it are not hoisted out of the loop using it
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}
template <int N> __device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
// Named barrier `id` (1..15; 0 is __syncthreads') of `count` threads, a multiple of 32:
// bar.sync waits for the count, bar.arrive counts this warp in and goes on.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void mma_and(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}
// PTX prmt.b32 (default mode): byte i of the result is byte sel[4i+2:4i] of {b, a} (a: bytes
// 0-3, b: 4-7), or with sel bit 4i+3 set that byte's sign bit copied into all 8 bits.
// (__byte_perm documents only the low 3 bits of each selector nibble.)
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// Programmatic dependent launch (CHAINED, sm_90; no-ops on older targets): let the next
// kernel of the stream launch now, so its blocks take SMs this grid leaves free and run their
// prologue; wait until the previous kernel of the stream completed and its writes are visible.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// </device-primitives>

// CHAINED (a bind-time mode, not a config knob: BitserialKernel.bind(chained=True)): the kernel
// is launched as a programmatic dependent of the previous kernel on the stream (the previous
// layer, which writes x), so nothing may read x, xpop or the split workspace, or write any
// output, before grid_dependency_wait. Kernels call chain_begin first: it waits, except where
// CHAIN_EARLY_WEIGHTS (the in-place kernel with bulk weights) lets the block issue its weights'
// copies (layer constants) and prefetch its epilogue data first and wait after them
// (bitserial_wgmma.cu). When the next kernel may launch: CHAINED = 1 at once (chain_begin);
// CHAINED = 2 once the one-tile kernels have issued their last MMAs (chain_mmas_issued;
// persistent kernels: at exit), so that where several blocks fit an SM the blocks of later
// layers do not pile up on the SMs, waiting, while this layer's blocks still run.
constexpr bool CHAIN_EARLY_WEIGHTS = CHAINED && BULK_WEIGHTS;
__device__ __forceinline__ void chain_begin() {
  if constexpr (CHAINED == 1) launch_dependents();
  if constexpr (CHAINED && !CHAIN_EARLY_WEIGHTS) grid_dependency_wait();
}
__device__ __forceinline__ void chain_mmas_issued() {
  if constexpr (CHAINED == 2) launch_dependents();
}

// VEC words shared -> shared (halo tile -> im2col stage), zeros when !valid, as a load and a
// store: a stage's loads all go first, since ptxas keeps a shared load after an earlier shared
// store it cannot prove apart, and load-store pairs wait out each load's latency in turn.
template <int V> struct SharedVecOf { typedef u32 type; };
template <> struct SharedVecOf<2> { typedef uint2 type; };
template <> struct SharedVecOf<4> { typedef uint4 type; };
typedef SharedVecOf<VEC>::type SharedVec;
__device__ __forceinline__ SharedVec load_shared_vec(const u32* src, bool valid) {
  SharedVec v{};
  if (valid) v = *reinterpret_cast<const SharedVec*>(src);
  return v;
}
__device__ __forceinline__ void store_shared_vec(u32* dst, SharedVec v) {
  *reinterpret_cast<SharedVec*>(dst) = v;
}

// First/last+1 kernel row (or column) whose input row lies inside [0, extent).
__device__ __forceinline__ void tap_range(int start, int extent, int taps, int& lo, int& hi) {
  lo = start < 0 ? -start : 0;
  hi = extent - start < taps ? extent - start : taps;
  if (hi < lo) hi = lo;
}

// Weight sums for binary activations, one warp per output column (coalesced over the words).
// Part 1, wtap[col*TAB + r*(S+1) + s] = sum over taps (r' < r, s' < s) of
// sum_j d_j popc(b_j[col, r', s', :]) (a 2-D prefix table; its last entry is the all-tap sum).
// Part 2, wtap[WSUM0 + rect_id(rlo, rhi, slo, shi)*KPAD + col] = A_BETA * W_ALPHA times the
// weight sum over the taps [rlo, rhi) x [slo, shi), plus A_BETA * W_BETA * C times their count
// (ba*ab*T + ba*bb*C*taps above): what an output pixel whose valid taps are that rectangle
// adds, one lookup in the epilogue. Rectangle-major with KPAD columns
// (bitserial.wsum_columns: KOUT rounded up to the widest block tile; entries past KOUT are
// never written and only feed outputs that are discarded; rectangles no pixel has are not
// written either, rect_used), so one output row's lookups share a pointer and differ by
// compile-time offsets. Part 2 starts at WSUM0 (bitserial.wsum_start: past part 1, even, so a
// lane reads its two adjacent columns as one 8-byte load).
// Part 3 (RECT_THR: threshold requantization of binary activations), at WTHR0 = WSUM0 + RECTS *
// KPAD: wtap[WTHR0 + (rect_id * KPAD + col) * THR_STRIDE + k] = thr[col][k] minus part 2's sum,
// clamped to int32 (exact: y >= t <=> y - s >= t - s, and a clamped bound is never / always
// met by an int32 y - s). The epilogue compares the plane products plus row terms with it
// directly: per output one multiply-add and the compares, no weight-sum load and add.
constexpr int TAB = (R + 1) * (S + 1);
constexpr int RECTS = TAB * TAB;
static_assert(WSUM0 >= KOUT * TAB && WSUM0 % 2 == 0, "bitserial.wsum_start: after part 1, even");
constexpr bool NEED_WTAP = A_BETA != 0;        // binary activations: weight sums over valid taps
constexpr int THR_LEVELS = OUT_THRESH ? OUT_QMAX - OUT_QMIN : 1;
// THR_PAIRS: table words per column pair, one per level (3 padded to 4: one 16-byte load)
constexpr int PAIR_STRIDE = THR_LEVELS == 3 ? 4 : THR_LEVELS;
// THR_PAIRS (bitserial.thr_pairs): a lane's accumulator columns hold contiguous output
// channels, the weights' B rows permuted to match. Column j of a warp tile (n8 tile ni = j / 8,
// lane t4 = j % 8 / 2, e = j % 2, the m16n8 fragment) holds channel
// pair_channel(j) = 2 NT t4 + 16 (ni / 8) + 8 e + ni % 8: lane t4 owns channels [2 NT t4,
// 2 NT (t4 + 1)), byte e (+ 2 per 8 tiles) of its bit words collecting bit ni % 8 of them.
__device__ __forceinline__ constexpr int pair_channel(int j) {
  return 2 * NT * (j % 8 / 2) + 16 * (j / 64) + 8 * (j % 2) + j / 8 % 8;
}
__device__ __forceinline__ constexpr int pair_column(int c) {  // the inverse
  return 8 * (c % 8 + 8 * (c % (2 * NT) / 16)) + 2 * (c / (2 * NT)) + c / 8 % 2;
}
// One 16-bit half of a THR_PAIRS table word for threshold t: 0x8000 + PAIR_YLO - t, t clamped
// to [PAIR_YLO, PAIR_YHI + 1] (every y lies in [PAIR_YLO, PAIR_YHI]: the compare is the same).
// T: int, or i64 for the wtap kernel's thresholds less their rectangle sums.
template <typename T> __device__ __forceinline__ int pair_threshold_half(T t) {
  return 0x8000 + PAIR_YLO - (t < PAIR_YLO ? PAIR_YLO : (t > PAIR_YHI ? PAIR_YHI + 1 : (int)t));
}
// THR_STRIDE (rendered, bitserial.threshold_stride): ints per column in the threshold tables
static_assert(THR_STRIDE >= THR_LEVELS, "a column's thresholds fit its stride");
constexpr bool RECT_THR = OUT_THRESH && NEED_WTAP;
constexpr int WTHR0 = WSUM0 + RECTS * KPAD;
// Part 4 (RECT_THR with THR_PAIRS outside shared memory), at WPAIR0: part 3 packed for the pair
// epilogue, wtap[WPAIR0 + (rect_id * KPAD / 2 + p) * PAIR_STRIDE + k] holding the words of
// accumulator columns 2p, 2p + 1 (pair_thresholds), each column's warp writing its 16-bit half.
constexpr bool PAIR_WTAP = RECT_THR && THR_PAIRS && THR_SLOTS == 0;
constexpr int WPAIR0 = WTHR0 + RECTS * KPAD * THR_STRIDE;
__device__ __forceinline__ constexpr int rect_id(int rlo, int rhi, int slo, int shi) {
  return ((rlo * (R + 1) + rhi) * (S + 1) + slo) * (S + 1) + shi;
}
constexpr int FULL_RECT = rect_id(0, R, 0, S);  // all taps inside the image
// Whether some output pixel's valid taps along one axis (extent, taps, outputs) are [lo, hi):
// lo <= PAD always, and hi >= min(taps, extent + PAD - (outputs - 1) * STRIDE) unless the
// padding exceeds half the window (then tap_range may clamp hi to lo: no bound on hi). Only
// these rectangles are filled (16 of 256 for a padded 3x3) and read.
__device__ __forceinline__ constexpr bool rect_used(int lo, int hi, int extent, int taps,
                                                    int outputs) {
  const int last = extent + PAD - (outputs - 1) * STRIDE;
  const int hi_min = 2 * PAD > taps ? 0 : (taps < last ? taps : last);
  return lo <= hi && lo <= PAD && hi >= hi_min;
}
extern "C" __global__ void bitserial_wtap(const u32* __restrict__ w, const int* __restrict__ thr,
                                          int* __restrict__ wtap) {
  const int col = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (col >= KOUT) return;
  int* tab = wtap + col * TAB;
  for (int i = lane; i < S + 1; i += 32) tab[i] = 0;  // row r = 0
  int row_prefix = 0;  // only lane 0's copy is used
  for (int r = 0; r < R; ++r) {
    if (lane == 0) tab[(r + 1) * (S + 1)] = 0;
    row_prefix = 0;
    for (int s = 0; s < S; ++s) {
      int sum = 0;
      for (int i = lane; i < P_BITS * CW; i += 32) {
        const int j = i / CW, cw = i - j * CW;
        sum += w_coef(j) * __popc(w[j * W_PLANE + ((i64)col * RS + r * S + s) * CW + cw]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      row_prefix += sum;
      if (lane == 0) tab[(r + 1) * (S + 1) + s + 1] = tab[r * (S + 1) + s + 1] + row_prefix;
      __syncwarp();
    }
  }
  int* rect = wtap + WSUM0 + col;
  for (int i = lane; i < RECTS; i += 32) {
    const int shi = i % (S + 1), slo = i / (S + 1) % (S + 1);
    const int rhi = i / TAB % (R + 1), rlo = i / TAB / (R + 1);
    if (!rect_used(rlo, rhi, H, R, P_OUT) || !rect_used(slo, shi, W, S, Q_OUT)) continue;
    const int sum = A_BETA * W_ALPHA * (tab[rhi * (S + 1) + shi] - tab[rlo * (S + 1) + shi]
                                        - tab[rhi * (S + 1) + slo] + tab[rlo * (S + 1) + slo])
                    + A_BETA * W_BETA * C * (rhi - rlo) * (shi - slo);
    rect[i * KPAD] = sum;
    if constexpr (RECT_THR) {
      for (int k = 0; k < THR_LEVELS; ++k) {
        const i64 t = (i64)thr[col * THR_STRIDE + k] - sum;
        wtap[WTHR0 + ((i64)i * KPAD + col) * THR_STRIDE + k] =
            (int)(t < -2147483648ll ? -2147483648ll : (t > 2147483647ll ? 2147483647ll : t));
        if constexpr (PAIR_WTAP) {
          const int j = col / WN * WN + pair_column(col % WN);  // its accumulator column
          reinterpret_cast<unsigned short*>(wtap + WPAIR0)[
              (((i64)i * (KPAD / 2) + j / 2) * PAIR_STRIDE + k) * 2 + j % 2] =
              (unsigned short)pair_threshold_half(t);
        }
      }
    }
  }
}


// Popcount of each input pixel's channel words, per activation plane (ROWSUM_TABLE):
// xpop[i * PIXELS + pixel] = sum over words of popc(x plane i at pixel). XPOP_LANES adjacent
// lanes share a pixel and read its words side by side (coalesced; one thread per pixel walked
// 512-byte rows alone and cost 20-45 us on a 4096-row GEMM), then sum over the group with
// shuffles. No early return: every lane of a warp takes part in the shuffles.
extern "C" __global__ void bitserial_xpop(const u32* __restrict__ x, int* __restrict__ xpop) {
  if constexpr (CHAINED) {  // x is the previous kernel's output
    launch_dependents();
    grid_dependency_wait();
  }
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 pix = t / XPOP_LANES;
  const int j = (int)(t % XPOP_LANES);
  const bool ok = pix < PIXELS;
  for (int i = 0; i < Q_BITS; ++i) {
    int sum = 0;
    if (ok)
      for (int cw = j; cw < CW; cw += XPOP_LANES) sum += __popc(x[i * X_PLANE + pix * CW + cw]);
#pragma unroll
    for (int o = XPOP_LANES / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (ok && j == 0) xpop[i * PIXELS + pix] = sum;
  }
}

// ---- operand staging (shared by all kernels) ----

// Word offset of word wd (0..7) of k slab ks of row `row` in a stage tile of `rows` rows.
// mma.sync: a 32-byte row per slab. wgmma, SWIZZLE=0: 8 x 16-byte core matrices, each 128
// contiguous bytes; the two 16-byte k halves of a row 128 B apart (descriptor LBO), 8-row
// groups 256 B apart (SBO). wgmma, SWIZZLE=32: 32-byte rows whose 16-byte halves swap in rows
// 4..7 of each 8-row group (address bit 4 ^= bit 7), 8-row groups 256 B apart (SBO).
// Slabs are rows * 32 B apart.
__device__ __forceinline__ int slot(int rows, int row, int ks, int wd) {
  if constexpr (WGMMA && SWIZZLE == 32)
    return ks * rows * 8 + row * 8 + (((wd >> 2) ^ ((row >> 2) & 1)) << 2) + (wd & 3);
  if constexpr (WGMMA) return ks * rows * 8 + (row >> 3) * 64 + (wd >> 2) * 32 + (row & 7) * 4 + (wd & 3);
  return (ks * rows + row) * 8 + wd;
}
// Row of the B slab holding weight plane 0 of block column n (wgmma: planes of a warpgroup's
// WN columns are adjacent, plane j WN rows below plane 0).
__device__ __forceinline__ int b_row(int n) {
  if constexpr (THR_PAIRS) return (n / WN) * (P_BITS * WN) + pair_column(n % WN);  // wgmma
  return WGMMA ? (n / WN) * (P_BITS * WN) + n % WN : n;
}

// Per-thread copy rows of the activation tile at row m0: top-left input pixel of the window
// and its word offset in a plane (base; planes are < 2^31 words, bitserial.py), rows past M
// with ih0 = -BIG so every tap is out of range and copies zero-fill.
struct ARows {
  int base[A_ITERS], ih0[A_ITERS], iw0[A_ITERS];
};
// 32-bit index math: rows + BM < 2^31 (bitserial.py), and 64-bit divisions cost the persistent
// kernel, which calls this per stage, ~20% on 3x3 convs.
__device__ __forceinline__ ARows a_rows(i64 m0, int tid) {
  ARows ar;
#pragma unroll
  for (int it = 0; it < A_ITERS; ++it) {
    const int row = (tid + it * THREADS) / CPR;
    const int m = (int)m0 + row;
    const int qo = m % Q_OUT;
    const int t = m / Q_OUT;
    const int po = t % P_OUT;
    const bool ok = m < M_ROWS && row < BM;
    ar.ih0[it] = ok ? po * STRIDE - PAD : -(1 << 28);
    ar.iw0[it] = qo * STRIDE - PAD;
    ar.base[it] = ok ? ((t / P_OUT * H + ar.ih0[it]) * W + ar.iw0[it]) * CW : 0;
  }
  return ar;
}

// Tap (r, s) and channel word cw of k word kw of an im2col row, and whether kw < KW.
struct KWord {
  int r, s, cw, off;  // off: (r * W + s) * CW + cw, the word's offset from the window's base
  bool ok;
};
__device__ __forceinline__ KWord k_word(int kw) {
  const int tap = kw / CW, cw = kw - tap * CW;
  const int r = tap / S, s = tap - r * S;
  return KWord{r, s, cw, (r * W + s) * CW + cw, kw < KW};
}

// Duplicate-aware (halo) load, HALO=1: the input rows [row0, row0 + HALO_ROWS) of the flattened
// (image, row) axis that the block's output pixels touch, a contiguous slab of x, go to shared
// memory once (all planes, zeros past the tensor); the im2col stage tiles are then gathered
// shared -> shared, so each input pixel leaves L2 once per block instead of once per tap.
// Returns row0. Ends with a barrier: the slab is complete.
// (tid, nthreads: the threads that share the copies; HALO=1 with SLICES > 1, all of the block's)
__device__ __forceinline__ int halo_load(const u32* __restrict__ x, u32* halo, i64 m0, int tid,
                                         int nthreads = THREADS) {
  const int t0 = (int)(m0 / Q_OUT);
  const int ih0 = (t0 % P_OUT) * STRIDE - PAD;
  const int row0 = (t0 / P_OUT) * H + (ih0 > 0 ? ih0 : 0);
  const i64 src0 = (i64)row0 * W * CW, end = X_PLANE - src0;
  for (int idx = tid; idx < HALO_WORDS / VEC; idx += nthreads) {
    const bool valid = (i64)idx * VEC < end;
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
      copy_async(halo + i * HALO_WORDS + idx * VEC, x + i * X_PLANE + (valid ? src0 + idx * VEC : 0), valid);
  }
  copy_commit();
  copy_wait<0>();
  __syncthreads();
  return row0;
}

// A_IN_HALO: issue the copies of block tile `tile`'s input window into `halo` (layout above;
// zeros outside the image), all planes, 16-byte chunks [c0, c1), without a commit: they join
// the group of the stage committed next.
__device__ __forceinline__ void halo_tile_load(const u32* __restrict__ x, u32* halo, int tile,
                                               int tid, int nthreads, int c0, int c1) {
  const auto [n, iy0, ix0] = window_origin(tile);
  const int chunks = c1 - c0;
  for (int idx = tid; idx < HALO_PIX * chunks; idx += nthreads) {
    const int chunk = c0 + idx % chunks, pix = idx / chunks;  // a pixel's chunks coalesce
    const int iy = iy0 + pix / HALO_W, ix = ix0 + pix % HALO_W;
    const bool valid = (unsigned)iy < (unsigned)H && (unsigned)ix < (unsigned)W;
    const int src = valid ? ((n * H + iy) * W + ix) * CW + chunk * 4 : 0;
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
      copy_async(halo + halo_unit(i, chunk, pix) * 4, x + i * X_PLANE + src, valid);
  }
}
// A_IN_HALO's k slabs (256 channels of one tap) run channel group by channel group, the taps
// inside: slab j reads group j / RS of tap j % RS (k word slab_word(j)). The halo's chunks of
// group g are copied with the first stage (of the k slice) that reads them, so a block's first
// MMAs wait for 1 / (CW / 8) of its halo, not all of it (H100, APNN-TC conv w1a2: 5.4 us against
// 7.1 with the whole halo first, every k tile resident; NOTES.md).
__device__ __forceinline__ int slab_word(int j) { return j % RS * CW + j / RS * 8; }
// ... the halo's channel groups that k tile kt reads first in a slice starting at k tile k0
// (a group two slices read is copied by both, the same bytes)
__device__ __forceinline__ void halo_stage_load(const u32* __restrict__ x, u32* halo, int kt,
                                                int k0, int tid) {
  const int g0 = kt == k0 ? kt * KT / RS : (kt * KT + RS - 1) / RS;
  const int g1 = ((kt + 1) * KT + RS - 1) / RS;
  if (g0 < g1) halo_tile_load(x, halo, blockIdx.y, tid, THREADS, 2 * g0, 2 * g1);
}

// Issue the copies of k tile kt (all bit planes, im2col gather for A) into `stage`: cp.async from
// global memory, or with HALO=1 the A tile from the block's halo slab (rows from halo_row0).
__device__ __forceinline__ void load_stage(const u32* __restrict__ x, const u32* __restrict__ w,
                                           u32* stage, const ARows& ar, int n0, int kt, int tid,
                                           const u32* halo = nullptr, int halo_row0 = 0) {
  u32* sa = stage;
  u32* sb = stage + A_STAGE_WORDS;
  const int kbase = kt * TILE_WORDS;
  // THREADS % CPR == 0 (most configs): every chunk of this thread has the same chunk column,
  // so its tap and channel word are decoded once per stage, not per copy
  constexpr bool ONE_COLUMN = THREADS % CPR == 0;
  const KWord kw0 = k_word(kbase + (tid % CPR) * VEC);
  SharedVec halo_vals[HALO ? A_ITERS : 1][Q_BITS];  // HALO: loaded here, stored below
  u32* halo_dst[HALO ? A_ITERS : 1] = {};
#pragma unroll
  for (int it = 0; it < (A_IN_HALO ? 0 : A_ITERS); ++it) {
    const int idx = tid + it * THREADS;
    if ((BM * CPR) % THREADS == 0 || idx < BM * CPR) {
      const int row = idx / CPR, c = idx % CPR;
      const KWord k = ONE_COLUMN ? kw0 : k_word(kbase + c * VEC);
      const int ih = ar.ih0[it] + k.r, iw = ar.iw0[it] + k.s;
      const bool valid = k.ok && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
      u32* dst = sa + slot(BM, row, c / (8 / VEC), (c % (8 / VEC)) * VEC);
      if constexpr (HALO) {
        const int src = valid ? ar.base[it] + k.off - halo_row0 * W * CW : 0;
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) halo_vals[it][i] = load_shared_vec(halo + i * HALO_WORDS + src, valid);
        halo_dst[it] = dst;
      } else {
        const int src = valid ? ar.base[it] + k.off : 0;
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) copy_async(dst + i * A_PLANE_STEP, x + i * X_PLANE + src, valid);
      }
    }
  }
  if constexpr (HALO && !A_IN_HALO) {
#pragma unroll
    for (int it = 0; it < A_ITERS; ++it)
      if (halo_dst[it] != nullptr)
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) store_shared_vec(halo_dst[it] + i * A_PLANE_STEP, halo_vals[it][i]);
  }
#pragma unroll
  for (int it = 0; it < B_ITERS; ++it) {
    const int idx = tid + it * THREADS;
    if ((BN * CPR) % THREADS == 0 || idx < BN * CPR) {
      // B_BY_SLAB: 8 adjacent threads (a 16-byte access's shared-memory phase) copy 4 rows x 2
      // halves of one slab, 8 distinct 16-byte bank groups in the 32-byte swizzle, where a row's
      // 8 chunks (4 slabs x 2 halves) hit 2 of them (Nsight, H100: 4x the ideal wavefronts)
      const int row = B_BY_SLAB ? idx / 2 % BN : idx / CPR;
      const int c = B_BY_SLAB ? idx / (2 * BN) * 2 + idx % 2 : idx % CPR;
      const int kw = A_IN_HALO ? slab_word(kt * KT + c / 2) + c % 2 * 4 : kbase + c * VEC;
      const bool valid = kw < KW && n0 + row < KOUT;
      const i64 src = valid ? (i64)(n0 + row) * KW + kw : 0;
      u32* dst = sb + slot(B_ROWS, b_row(row), c / (8 / VEC), (c % (8 / VEC)) * VEC);
#pragma unroll
      for (int j = 0; j < P_BITS; ++j) copy_async(dst + j * B_PLANE_STEP, w + j * W_PLANE + src, valid);
    }
  }
}

// ---- accumulators ----

typedef int Acc[Q_BITS][P_BITS][MT][NT][4];  // one per (activation plane, weight plane) pair
// FUSE_PLANES (wgmma): the tensor cores add the two activation planes with their coefficients
// 1 and 2 (plane 1 issued twice into plane 0's accumulator, wgmma_plane); acc[1] stays unused
// and takes no registers.
static_assert(!FUSE_PLANES || (WGMMA && Q_BITS == 2 && !A_SIGNED && !ELEM8),
              "FUSE_PLANES: wgmma, unsigned two-bit activations (bitserial.fusable_planes)");
// popc of the activation planes (binary weights); ROWSUM_COLS: 4 more, the zero columns' sums
constexpr int RS_REGS = ROWSUM_COLS ? 8 : 4;
typedef int RowSum[Q_BITS][MT][RS_REGS];

// wgmma accumulators are not zeroed: a tile's first wgmma overwrites them (scale-d = 0). The
// host emulation fills them with garbage instead, so a first wgmma that accumulates fails there.
__device__ __forceinline__ void zero_acc(Acc& acc, RowSum& rsum) {
  if constexpr (WGMMA) {
#ifdef LOWBIT_HOST_EMU
    for (int& v : reinterpret_cast<int(&)[sizeof(Acc) / sizeof(int)]>(acc)) v = 0x5A5A5A5A;
    for (int& v : reinterpret_cast<int(&)[sizeof(RowSum) / sizeof(int)]>(rsum)) v = 0x5A5A5A5A;
#endif
    return;
  }
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int e = 0; e < RS_REGS; ++e) rsum[i][mi][e] = 0;
#pragma unroll
      for (int j = 0; j < P_BITS; ++j)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][mi][ni][e] = 0;
    }
}

// mma.sync on one stage: every plane pair of this warp's WM x WN tile, KT k256 steps. (A
// template: compiled only where called, so RowSum's 8-register form of ROWSUM_COLS, a wgmma
// kernel's, never meets mma_and's 4 registers.)
template <class RowSumT>
__device__ __forceinline__ void mma_sync_stage(Acc& acc, RowSumT& rsum, const u32* sa,
                                               const u32* sb, int warp_m, int warp_n, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int ks = 0; ks < KT; ++ks) {
    // Thread (g, t4) holds k words 2*t4 and 2*t4+1 of its rows for both operands: the mma's
    // k order is then a permutation of the stored one, the same for A and B, so popc sums match.
    u32 af[Q_BITS][MT][4];
    u32 bf[P_BITS][NT][2];
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const u32* p = sa + i * A_PLANE_STEP + (ks * BM + warp_m * WM + mi * 16 + g) * 8 + 2 * t4;
        const uint2 lo = *reinterpret_cast<const uint2*>(p);
        const uint2 hi = *reinterpret_cast<const uint2*>(p + 64);
        af[i][mi][0] = lo.x; af[i][mi][1] = hi.x; af[i][mi][2] = lo.y; af[i][mi][3] = hi.y;
      }
#pragma unroll
    for (int j = 0; j < P_BITS; ++j)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        const u32* p = sb + j * B_PLANE_STEP + (ks * BN + warp_n * WN + ni * 8 + g) * 8 + 2 * t4;
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        bf[j][ni][0] = v.x; bf[j][ni][1] = v.y;
      }
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
        for (int j = 0; j < P_BITS; ++j)
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) mma_and(acc[i][j][mi][ni], af[i][mi], bf[j][ni][0], bf[j][ni][1]);
        if constexpr (ROWSUM_MMA) mma_and(rsum[i][mi], af[i][mi], 0xffffffffu, 0xffffffffu);
      }
  }
}

// ---- fused epilogue (shared by all kernels) ----

// The opaque 128 bytes of a tensor map (cuTensorMapEncodeTiled; TMA_HALO's, of x), passed by
// value: the tensor copies read it from the kernel's parameters.
struct __align__(64) TensorMap {
  u64 opaque[16];
};
// The parameters of every bit-serial kernel (bitserial.py launches them in this order; with
// TMA_HALO the rendered BITSERIAL_XMAP_PARAM adds the tensor map of x).
#define BITSERIAL_KERNEL_PARAMS                                                               \
  const u32* __restrict__ x, const u32* __restrict__ w, void* __restrict__ out,               \
      const int* __restrict__ bias, const float* __restrict__ scale,                          \
      const int* __restrict__ mult, const int* __restrict__ shift, const int* __restrict__ wtap, \
      const int* __restrict__ xpop, const int* __restrict__ thr, int* split_ws,              \
      int* split_count, const int* __restrict__ vrows BITSERIAL_XMAP_PARAM

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
};
// The epilogue's view of BITSERIAL_KERNEL_PARAMS (inside a kernel taking them).
#define BITSERIAL_EPILOGUE_ARGS                                                               \
  EpilogueArgs{out, bias, scale, mult, shift, wtap, xpop, thr, vrows, split_ws,               \
               SPLIT_K > 1 ? (int)blockIdx.z : 0}

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

// Zero the tile's shared-memory packing tile [OUT_BITS][BM][BLOCK_WORDS] (narrow warp tiles).
__device__ __forceinline__ void pack_tile_clear(u32* s_out, int tid) {
  tile_sync();  // every warp is done reading the operand tiles
  for (int i = tid; i < PACK_WORDS; i += THREADS) s_out[i] = 0;
  tile_sync();
}

// Bits of output word `word` that hold columns < KOUT (a threshold code past KOUT is OUT_QMIN's).
__device__ __forceinline__ u32 word_mask(int word) {
  return (KOUT % 32 != 0 && word == OUT_WORDS - 1) ? (1u << (KOUT % 32)) - 1 : 0xffffffffu;
}

// Store the packing tile of the block tile at (m0, n0) to the bit-plane output.
__device__ __forceinline__ void pack_tile_store(const u32* s_out, void* out, int m0, int n0, int tid) {
  tile_sync();
  for (int i = tid; i < PACK_WORDS; i += THREADS) {
    const int wd = i % BLOCK_WORDS, row = (i / BLOCK_WORDS) % BM, b = i / (BLOCK_WORDS * BM);
    const int m = out_row(m0 + row);
    const int word = n0 / 32 + wd;
    if (m < M_ROWS && word < OUT_WORDS)
      reinterpret_cast<u32*>(out)[((i64)b * M_ROWS + m) * OUT_WORDS + word] = s_out[i] & word_mask(word);
  }
}

// OUT_THRESH: bias, ReLU and requantization to OUT_BITS <= 2 folded into OUT_QMAX - OUT_QMIN
// integer thresholds per column (lowbit.reference.requant_thresholds, computed on the host;
// bitserial.epilogue_thresholds pads the [KOUT][levels] table to KPAD columns with INT32_MAX):
// the output is OUT_QMIN + #{k : y >= thr[k]}, 1-3 compares instead of a 64-bit multiply, a
// shift and clamps per output (knob REQUANT="threshold").
constexpr u32 OUT_MASK = (1u << OUT_BITS) - 1;
// The thresholds are non-decreasing (the multiplier is >= 1), so level = #{k : y >= thr[k]}
// counts up one compare at a time, and bit b of the code OUT_QMIN + level is bit b of OUT_QMIN
// XOR the compares of the steps k -> k + 1 that flip it (compile-time): per output plane one
// predicate expression and one select, no adds, shifts or clamps.
__device__ __forceinline__ constexpr bool level_flips(int k, int b) {
  return ((((OUT_QMIN + k + 1) ^ (OUT_QMIN + k)) >> b) & 1) != 0;
}
__device__ __forceinline__ bool threshold_bit(int y, const int (&thr)[THR_LEVELS], int b) {
  bool bit = ((OUT_QMIN >> b) & 1) != 0;
#pragma unroll
  for (int k = 0; k < THR_LEVELS; ++k)
    if (level_flips(k, b)) bit ^= y >= thr[k];
  return bit;
}
// Four levels on two bits with QMIN = 0 or -2 (u2, s2): a binary search, since bit b of QMIN +
// level is then bit b of the level XOR bit b of QMIN (the only carry leaves the two bits):
// level >= 2 is one compare against thr[1], and the low bit one compare against thr[2] or thr[0]
// as that one says (2 compares and a select per output instead of a chain of 4).
constexpr bool THR_SEARCH = OUT_BITS == 2 && THR_LEVELS == 3 && (OUT_QMIN & 1) == 0;
__device__ __forceinline__ void threshold_bits(int y, const int (&thr)[THR_LEVELS],
                                               bool (&bits)[OUT_BITS]) {
  if constexpr (THR_SEARCH) {  // (indices guarded: this branch also compiles for 1 level)
    const bool upper = y >= thr[THR_SEARCH ? 1 : 0];
    bits[1] = upper != (((OUT_QMIN >> 1) & 1) != 0);
    bits[0] = y >= (upper ? thr[THR_SEARCH ? 2 : 0] : thr[0]);
  } else {
#pragma unroll
    for (int b = 0; b < OUT_BITS; ++b) bits[b] = threshold_bit(y, thr, b);
  }
}
__device__ __forceinline__ u32 threshold_code(int y, const int (&thr)[THR_LEVELS]) {
  bool bits[OUT_BITS];
  threshold_bits(y, thr, bits);
  u32 code = 0;
#pragma unroll
  for (int b = 0; b < OUT_BITS; ++b) code |= (u32)bits[b] << b;
  return code;
}
// Binary activations and padding: every output adds its tap rectangle's weight sum from
// bitserial_wtap's part 2 (one load per output through its row's pointer, branch-free), or with
// thresholds compares against part 3's, that sum folded in; without padding every pixel has the
// full rectangle, and that sum is a per-column offset.
constexpr bool BORDER = NEED_WTAP && PAD > 0;

// Per-column epilogue parameters (zeros past KOUT). off: the bias and, for binary activations
// without padding, the column's all-tap weight sum (both folded into the thresholds with
// OUT_THRESH). Loaded once per tile and lane: the epilogue walks columns outside rows.
struct ColParams {
  int off, mult, shift;
  float scale;
};
__device__ __forceinline__ ColParams col_params(const EpilogueArgs& ea, int col) {
  const bool ok = col < KOUT && !OUT_THRESH;
  const bool mul = OUT_MODE >= 2 && ok;
  const int bias = (HAS_BIAS && ok) ? ea.bias[col] : 0;
  const int wall = (NEED_WTAP && !BORDER && ok) ? ea.wtap[WSUM0 + FULL_RECT * KPAD + col] : 0;
  return ColParams{bias + wall, mul ? ea.mult[col] : 0, mul ? ea.shift[col] : 1,
                   (OUT_MODE == 1 && ok) ? ea.scale[col] : 0.f};
}
typedef int PairThresholds[2][THR_LEVELS];  // columns col, col + 1
// The thresholds of a column pair (col even): 2 * THR_STRIDE adjacent ints at p, 8-byte
// aligned, read as 8- or 16-byte loads.
__device__ __forceinline__ void load_thresholds(const int* __restrict__ p, PairThresholds& thr) {
  constexpr int N = 2 * THR_STRIDE;
  int t[N];
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(p + i);
      t[i] = (int)v.x; t[i + 1] = (int)v.y; t[i + 2] = (int)v.z; t[i + 3] = (int)v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(p + i);
      t[i] = (int)v.x; t[i + 1] = (int)v.y;
    }
  }
#pragma unroll
  for (int k = 0; k < THR_LEVELS; ++k) { thr[0][k] = t[k]; thr[1][k] = t[THR_STRIDE + k]; }
}

// The plane products of accumulator register r of tile (mi, ni), combined (k-linear):
// A_ALPHA * W_ALPHA * sum_ij c_i d_j popc(a_i & b_j).
// FUSE_PLANES: the MMAs summed the activation planes into acc[0] already.
__device__ __forceinline__ int plane_dot(const Acc& acc, int mi, int ni, int r) {
  int y = 0;
#pragma unroll
  for (int i = 0; i < (FUSE_PLANES ? 1 : Q_BITS); ++i)
#pragma unroll
    for (int j = 0; j < P_BITS; ++j)
      y += (FUSE_PLANES ? 1 : a_coef(i)) * w_coef(j) * acc[i][j][mi][ni][r];
  return A_ALPHA * W_ALPHA * y;
}
// The row-popcount term of this lane's accumulator row (mi, h) from the row-sum MMA
// (ROWSUM_MMA; k-linear like the plane products), 0 otherwise.
__device__ __forceinline__ int rowsum_mma_term(const RowSum& rsum, int mi, int h) {
  int t = 0;
  if constexpr (ROWSUM_MMA) {
#pragma unroll
    for (int i = 0; i < Q_BITS; ++i) t += a_coef(i) * rsum[i][mi][2 * h];
    t *= A_ALPHA * W_BETA;
  }
  return t;
}

// ROWSUM_TABLE: sum_i c_i popc(a_i) of output row m (pixel (n, po, qo)): the per-pixel table
// summed over the valid taps [rlo, rhi) x [slo, shi) (1x1 and GEMM: one lookup per plane).
__device__ __forceinline__ int table_row_popc(const int* __restrict__ xpop, int m, int po, int qo,
                                              int rlo, int rhi, int slo, int shi) {
  const i64 pix = (i64)(m / (P_OUT * Q_OUT)) * H * W + (i64)(po * STRIDE - PAD) * W
                  + qo * STRIDE - PAD;
  int total = 0;
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i) {
    int sum = 0;
    if constexpr (R * S == 1) {
      sum = xpop[i * PIXELS + pix];
    } else {
      for (int r = rlo; r < rhi; ++r)
        for (int s = slo; s < shi; ++s) sum += xpop[i * PIXELS + pix + r * W + s];
    }
    total += a_coef(i) * sum;
  }
  return total;
}

constexpr int OUT_WORD_TILES = WN / 32 > 0 ? WN / 32 : 1;

// SPLIT_K > 1: the k-linear sums of output row m, columns col, col + 1 (col even): every split's
// partial, this block's own included, read through L2 (ld.global.cg: other SMs wrote them
// during this launch). The own partial comes back from memory, not from the accumulators: on
// an H100 (NVRTC 13.0) wgmma accumulators kept live across split_arrive came back wrong in
// columns 16-31 of a 32-column warpgroup tile (s3 x b1 GEMM, BM = BN = 64), deterministically;
// the host emulation of the same text was exact.
__device__ __forceinline__ uint2 split_sum(const EpilogueArgs& ea, i64 m, int col) {
  const int* p = ea.split_ws + m * WS_COLS + col;
  uint2 sum = make_uint2(0u, 0u);
#pragma unroll
  for (int z = 0; z < SPLIT_K; ++z) {
    const uint2 v = __ldcg(reinterpret_cast<const uint2*>(p + z * WS_SPLIT));
    sum.x += v.x;
    sum.y += v.y;
  }
  return sum;
}

// The per-row part of the epilogue for this lane's accumulator rows (mi, h) (output row
// row0 + mi*16 + g + 8h of the block tile at m0), independent of the accumulators, so a kernel
// may work it out while its MMAs run: the padding terms and the table row sums (term; the
// row-sum MMA's part is added by tile_epilogue), and where the row's per-column data starts
// for this lane's first column col_base (rowp; the lane's columns col_base + ni*8 + e are
// compile-time offsets from it): OUT_THRESH, the thresholds (RECT_THR: of the row's tap
// rectangle, bitserial_wtap part 3); else BORDER, the weight sums of the row's tap rectangle
// (part 2).
typedef const int* RowPointers[MT][2];
typedef RowPos LaneRows[MT][2];  // this lane's accumulator rows (mi, h)
struct RowPrep {
  int m[MT][2];  // output rows (M_ROWS: dropped)
  int term[MT][2];
  int rect[MT][2];  // tap rectangle ids (RECT_THR with THR_SLOTS: the row table's slot ids)
  RowPointers rowp;
};
// Where a row's per-column data starts for column col_base (rect: the row's tap rectangle).
__device__ __forceinline__ const int* row_data(int rect, int col_base, const EpilogueArgs& ea) {
  if constexpr (PAIR_WTAP) return ea.wtap + WPAIR0 + (rect * (KPAD / 2) + col_base / 2) * PAIR_STRIDE;
  if constexpr (RECT_THR) return ea.wtap + WTHR0 + (rect * KPAD + col_base) * THR_STRIDE;
  else if constexpr (THR_PAIRS) return ea.thr + col_base / 2 * PAIR_STRIDE;  // packed pairs
  else if constexpr (OUT_THRESH) return ea.thr + col_base * THR_STRIDE;
  else if constexpr (BORDER) return ea.wtap + WSUM0 + rect * KPAD + col_base;
  return nullptr;
}
__device__ __forceinline__ RowPrep epilogue_rows(const LaneRows& pos, int n0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = pos[mi][h].m, po = pos[mi][h].po, qo = pos[mi][h].qo;
      int rlo = 0, rhi = R, slo = 0, shi = S;
      if constexpr (NEED_WTAP || ROWSUM_TABLE) {
        tap_range(po * STRIDE - PAD, H, R, rlo, rhi);
        tap_range(qo * STRIDE - PAD, W, S, slo, shi);
      }
      rows.rect[mi][h] = rect_id(rlo, rhi, slo, shi);
      rows.rowp[mi][h] = row_data(rows.rect[mi][h], col_base, ea);
      rows.m[mi][h] = m;
      int t = 0;
      if constexpr (ROWSUM_TABLE) {
        if (m < M_ROWS) t = A_ALPHA * W_BETA * table_row_popc(ea.xpop, m, po, qo, rlo, rhi, slo, shi);
      }
      rows.term[mi][h] = t;
    }
  return rows;
}
// ROW_TABLE (without ROWSUM="table"): the same from the per-row table that bind fills from the
// geometry alone (bitserial.row_table): one 8-byte load per row instead of splitting the
// (virtual) row into (image, row, column), the margin test and the tap ranges (~40
// instructions per row, a fifth of a 32-output lane's tap-shift epilogue at C = 64). v0: the
// warp's first row (TAP_SHIFT: in the virtual grid).
__device__ __forceinline__ RowPrep table_rows(int v0, int n0, int col0, int lane,
                                              const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  const int2* table = reinterpret_cast<const int2*>(ea.vrows) + v0 + (lane >> 2);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int2 e = __ldg(table + mi * 16 + 8 * h);
      rows.m[mi][h] = e.x;
      rows.rect[mi][h] = e.y;
      rows.rowp[mi][h] = row_data(e.y, col_base, ea);
      rows.term[mi][h] = 0;
    }
  return rows;
}
__device__ __forceinline__ RowPrep epilogue_rows(int m0, int n0, int row0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  if constexpr (ROW_TABLE) return table_rows(m0 + row0, n0, col0, lane, ea);
  LaneRows pos;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mi][h] = row_pos(m0 + row0 + mi * 16 + (lane >> 2) + 8 * h);
  return epilogue_rows(pos, n0, col0, lane, ea);
}

// The per-column data this lane's epilogue will read (RowPrep's tables at rowp, the column
// parameters), prefetched into L1 (a one-tile block's epilogue then finds them there instead
// of waiting an L2 round trip after its last MMA). A hint: THR_PAIRS' packed tables are left
// out, and nothing is read.
__device__ __forceinline__ void prefetch_row_data(const RowPrep& rows, int col_base,
                                                  const EpilogueArgs& ea) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        if constexpr (OUT_THRESH && !THR_PAIRS) {
          if (RECT_THR || (mi == 0 && h == 0)) prefetch_l1(rows.rowp[mi][h] + ni * 8 * THR_STRIDE);
        } else if constexpr (BORDER && !OUT_THRESH) {
          prefetch_l1(rows.rowp[mi][h] + ni * 8);
        }
      }
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    const int col = col_base + ni * 8;
    if (OUT_THRESH || col >= KOUT) continue;
    if constexpr (HAS_BIAS) prefetch_l1(ea.bias + col);
    if constexpr (OUT_MODE >= 2) prefetch_l1(ea.mult + col), prefetch_l1(ea.shift + col);
    if constexpr (OUT_MODE == 1) prefetch_l1(ea.scale + col);
  }
}

// Bias, ReLU and the output of one value y (accumulator + row and column terms) of row m,
// column col: stored here for int32 / fp16 / INT8 outputs; returns the requantized bit pattern
// for bit-plane outputs (0 past KOUT). thr: OUT_THRESH's thresholds of (m, col).
__device__ __forceinline__ int epilogue_value(int y, const ColParams& cp,
                                              const int (&thr)[THR_LEVELS], int m, int col,
                                              const EpilogueArgs& ea) {
  const bool ok = m < M_ROWS && col < KOUT;
  if constexpr (OUT_THRESH) return (int)threshold_code(y, thr);  // past KOUT: word_mask
  if constexpr (RELU) y = y > 0 ? y : 0;
  if constexpr (OUT_MODE == 0) {
    if (ok) reinterpret_cast<int*>(ea.out)[(i64)m * KOUT + col] = y;
    return 0;
  } else if constexpr (OUT_MODE == 1) {
    if (ok) reinterpret_cast<unsigned short*>(ea.out)[(i64)m * KOUT + col] = f32_to_f16_bits(__fmul_rn((float)y, cp.scale));
    return 0;
  } else {
    const int sh = cp.shift;
    i64 v = ((i64)y * cp.mult + (1ll << (sh - 1))) >> sh;
    v = v < OUT_QMIN ? OUT_QMIN : (v > OUT_QMAX ? OUT_QMAX : v);
    if constexpr (OUT_MODE == 2) {  // one byte per value: two's complement of all 8 bits
      if (ok) reinterpret_cast<unsigned char*>(ea.out)[(i64)m * KOUT + col] = (unsigned char)(int)v;
    }
    return col < KOUT ? ((int)v & ((1 << OUT_BITS) - 1)) : 0;
  }
}

// word |= bit where p: a predicated OR (ISETP + @P LOP3 per output plane bit) instead of a
// select and an add.
__device__ __forceinline__ void or_if(u32& word, bool p, u32 bit) {
  if (p) word |= bit;
}

// Register-level packing of one output row's bit planes: each lane of a quad holds 2 of every 8
// columns of the row's WN / 32 words per plane (lane t4's bits at 8 * (ni % 4) + e, shifted by
// 2 * t4 here). With a multiple of 4 words (plane-major index v), a reduce-scatter across the
// quad: exchange half the words with lane t4 ^ 2, then a quarter with t4 ^ 1, and lane t4
// stores words t4, t4 + 4, ...: 3 shuffles and one store per lane for 4 words. Otherwise every
// word is OR-reduced with two shuffles and stored by one lane.
constexpr int ROW_WORDS = OUT_WORD_TILES * OUT_BITS;  // packed words per row and warp tile
__device__ __forceinline__ void store_row_word(u32 bits, int v, int m, int word0,
                                               const EpilogueArgs& ea) {
  const int b = v / OUT_WORD_TILES, word = word0 + v % OUT_WORD_TILES;
  if (m < M_ROWS && word < OUT_WORDS)
    reinterpret_cast<u32*>(ea.out)[((i64)b * M_ROWS + m) * OUT_WORDS + word] = bits & word_mask(word);
}
__device__ __forceinline__ void store_row_words(const u32 (&bits)[OUT_WORD_TILES][OUT_BITS], int m,
                                                int word0, int t4, const EpilogueArgs& ea) {
  u32 vals[ROW_WORDS];
#pragma unroll
  for (int v = 0; v < ROW_WORDS; ++v)
    vals[v] = bits[v % OUT_WORD_TILES][v / OUT_WORD_TILES] << (2 * t4);
  // every shuffle before the first store: NVVM otherwise unswitches the word loop on the
  // stores' row check and duplicates the shuffles into divergent paths (BRA.DIV)
  if constexpr (WN >= 32 && ROW_WORDS % 4 == 0) {
    const bool hi = (t4 & 2) != 0, lo = (t4 & 1) != 0;
    u32 half[ROW_WORDS / 2 + 1];  // half[2p + q]: word 4p + q + 2 * hi, over t4 and t4 ^ 2
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const u32 a = vals[4 * p + q], c = vals[4 * p + q + 2];
        half[2 * p + q] = (hi ? c : a) | __shfl_xor_sync(0xffffffffu, hi ? a : c, 2);
      }
    u32 sums[ROW_WORDS / 4 + 1];  // word 4p + t4, summed over the quad
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p) {
      const u32 a = half[2 * p], c = half[2 * p + 1];
      sums[p] = (lo ? c : a) | __shfl_xor_sync(0xffffffffu, lo ? a : c, 1);
    }
#pragma unroll
    for (int p = 0; p < ROW_WORDS / 4; ++p) store_row_word(sums[p], 4 * p + t4, m, word0, ea);
  } else {
#pragma unroll
    for (int v = 0; v < ROW_WORDS; ++v) {
      vals[v] |= __shfl_xor_sync(0xffffffffu, vals[v], 1);
      vals[v] |= __shfl_xor_sync(0xffffffffu, vals[v], 2);
    }
#pragma unroll
    for (int v = 0; v < ROW_WORDS; ++v)
      if (t4 == (v & 3)) store_row_word(vals[v], v, m, word0, ea);
  }
}

// The per-column part: columns outer (their parameters loaded once), this lane's rows inner.
__device__ __forceinline__ void epilogue_cols(const Acc& acc, const RowPrep& rows, int m0, int n0,
                                              int row0, int col0, int lane,
                                              const EpilogueArgs& ea, u32* s_out) {
  const auto& term = rows.term;
  const auto& rowp = rows.rowp;
  const int g = lane >> 2, t4 = lane & 3;
  // this lane's bits of each 32-column word, at positions 8 * (ni % 4) + e: shifted by 2 * t4
  // once per word at the store instead of once per output
  u32 word_bits[MT][2][OUT_WORD_TILES][OUT_BITS];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int wd = 0; wd < OUT_WORD_TILES; ++wd)
#pragma unroll
        for (int b = 0; b < OUT_BITS; ++b) word_bits[mi][h][wd][b] = 0;
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    int pats[MT][2][2];
    uint2 wpair[MT][2];           // BORDER: the tap-rectangle weight sums of this lane's column pair
    uint2 splits[MT][2];          // SPLIT_K > 1: the k-linear sums of that pair (split_sum)
    PairThresholds thr[MT][2];    // OUT_THRESH: that pair's thresholds, per row
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (OUT_THRESH) {
          if (RECT_THR || (mi == 0 && h == 0)) {
            load_thresholds(rowp[mi][h] + ni * 8 * THR_STRIDE, thr[mi][h]);
          } else {  // one table for every row: the first row's pair
#pragma unroll
            for (int k = 0; k < THR_LEVELS; ++k) {
              thr[mi][h][0][k] = thr[0][0][0][k];
              thr[mi][h][1][k] = thr[0][0][1][k];
            }
          }
        } else if constexpr (BORDER) {
          wpair[mi][h] = *reinterpret_cast<const uint2*>(rowp[mi][h] + ni * 8);
        }
        if constexpr (SPLIT_K > 1)
          splits[mi][h] = split_sum(ea, m0 + row0 + mi * 16 + g + 8 * h, n0 + col0 + ni * 8 + 2 * t4);
      }
    const ColParams cps[2] = {col_params(ea, n0 + col0 + ni * 8 + 2 * t4),
                              col_params(ea, n0 + col0 + ni * 8 + 2 * t4 + 1)};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + col0 + ni * 8 + 2 * t4 + e;
      const ColParams& cp = cps[e];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int y = term[mi][h] + cp.off;
          if constexpr (SPLIT_K > 1) {
            y += e ? (int)splits[mi][h].y : (int)splits[mi][h].x;
          } else {
            y += plane_dot(acc, mi, ni, 2 * h + e);
          }
          if constexpr (BORDER && !OUT_THRESH) y += e ? (int)wpair[mi][h].y : (int)wpair[mi][h].x;
          if constexpr (OUT_THRESH && !PACK_IN_SMEM) {  // straight into the packed words
            bool bits[OUT_BITS];
            threshold_bits(y, thr[mi][h][e], bits);
#pragma unroll
            for (int b = 0; b < OUT_BITS; ++b)
              or_if(word_bits[mi][h][ni / 4][b], bits[b], 1u << ((ni % 4) * 8 + e));
          } else {
            pats[mi][h][e] = epilogue_value(y, cp, thr[mi][h][e], rows.m[mi][h], col, ea);
          }
        }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (PACK_IN_SMEM) {
          const int c0 = col0 + ni * 8;  // first column of this n8 tile in the block
          const int row = row0 + mi * 16 + g + 8 * h;
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b) {
            u32 bits = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) bits |= (u32)((pats[mi][h][e] >> b) & 1) << (c0 % 32 + 2 * t4 + e);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
            if (t4 == 0) atomicOr(&s_out[(b * BM + row) * BLOCK_WORDS + c0 / 32], bits);
          }
        } else if constexpr (OUT_MODE == 3 && !OUT_THRESH) {
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              word_bits[mi][h][ni / 4][b] |= (u32)((pats[mi][h][e] >> b) & 1) << ((ni % 4) * 8 + e);
        }
      }
  }
  if constexpr (OUT_MODE == 3 && !PACK_IN_SMEM) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_row_words(word_bits[mi][h], rows.m[mi][h], (n0 + col0) / 32, t4, ea);
  }
}

// THR_PAIRS: threshold bits of two columns per 32-bit add. A column pair's values y (of one
// row) sit in the 16-bit halves of one word, offset so that a half is 0x8000 + y - t against
// threshold t: its top bit is y >= t, and the adds never carry across halves, since every y
// lies in [PAIR_YLO, PAIR_YHI] (bitserial.pair_range: a span under 2^15) and t is clamped to
// [PAIR_YLO, PAIR_YHI + 1], which decides the same. Per pair: each column's plane products
// summed from -PAIR_DOT_LO (so >= 0; one multiply-add per plane pair), both packed by one PRMT,
// scaled and the row word added (one multiply-add), one add per threshold, one LOP3 per output
// bit, a PRMT copying the halves' top bits into byte masks and a LOP3 into the row's bit
// words: about 5 instructions per output instead of 9 (compares, selects, predicated ORs, quad
// shuffles). The table holds per column pair and level 0x8000 + PAIR_YLO - t in each half:
// in shared memory where persistent tap-shift blocks keep their thresholds
// (bitserial_wgmma_shift.cu), else in global memory from bind (bitserial.pair_table); the
// row word term - PAIR_YLO + S * PAIR_DOT_LO (>= 0) in both halves.
constexpr int PAIR_WORDS = (NT + 7) / 8;  // a row's bit words per lane (NT = 8: 1, 16: 2, 32: 4)
static_assert(!THR_PAIRS || (WGMMA && OUT_THRESH && OUT_BITS <= 2 && A_ALPHA * W_ALPHA > 0
                             && SPLIT_K == 1 && (NT == 8 || NT == 16 || NT == 32) && MT == 1),
              "THR_PAIRS: wgmma, WN = 64, 128 or 256 (bitserial.py)");
__device__ __forceinline__ constexpr u32 pair_half(int lo, int hi) {
  return (u32)lo | ((u32)hi << 16);
}
// the table word of thresholds t0, t1 (columns of one pair)
__device__ __forceinline__ u32 pair_thresholds(int t0, int t1) {
  return pair_half(pair_threshold_half(t0), pair_threshold_half(t1));
}
// Output words of one row from its bit words: byte 2b + e of bytes[i] holds plane b's bits of
// this lane's channels 2 NT t4 + 16 i + 8 e + (0..7). NT >= 16: NT / 16 words per plane of this
// lane's own; NT = 8: two lanes' halves per word, the even lane storing plane 0's, the odd one
// plane 1's.
__device__ __forceinline__ void store_pair_row(const u32 (&bytes)[PAIR_WORDS], int m, int word0,
                                               int t4, const EpilogueArgs& ea) {
  if constexpr (NT >= 16) {
    constexpr int LANE_WORDS = NT / 16;
#pragma unroll
    for (int q = 0; q < LANE_WORDS; ++q)
#pragma unroll
      for (int b = 0; b < OUT_BITS; ++b)
        store_row_word(prmt(bytes[2 * q], bytes[2 * q + 1], b ? 0x7632 : 0x5410),
                       b * OUT_WORD_TILES + t4 * LANE_WORDS + q, m, word0, ea);
  } else {
    const u32 other = __shfl_xor_sync(0xffffffffu, bytes[0], 1);
    const int b = t4 & 1;
    const u32 word = prmt(bytes[0], other, b ? 0x3276 : 0x5410);
    if (b < OUT_BITS) store_row_word(word, b * OUT_WORD_TILES + (t4 >> 1), m, word0, ea);
  }
}
// rows.rowp[mi][h]: the table entries of this lane's first column pair for row (mi, h).
__device__ __forceinline__ void epilogue_pairs(const Acc& acc, const RowPrep& rows, int n0,
                                               int col0, int lane, const EpilogueArgs& ea) {
  const int t4 = lane & 3;
  u32 bytes[MT][2][PAIR_WORDS] = {};
  u32 row_word[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_word[mi][h] =
          (u32)(rows.term[mi][h] - PAIR_YLO + A_ALPHA * W_ALPHA * PAIR_DOT_LO) * 0x10001u;
#pragma unroll
  for (int ni = 0; ni < NT; ++ni)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // the row's tap-rectangle slot (binary activations), else one table for every row
        const u32* p = reinterpret_cast<const u32*>(RECT_THR ? rows.rowp[mi][h] : rows.rowp[0][0])
                       + ni * 4 * PAIR_STRIDE;
        u32 thr[PAIR_STRIDE];
#pragma unroll
        for (int k = 0; k < PAIR_STRIDE; ++k) thr[k] = p[k];
        int dot[2] = {-PAIR_DOT_LO, -PAIR_DOT_LO};  // sum_ij c_i d_j popc(a_i & b_j), both
#pragma unroll                                         // columns, less its least value
        for (int i = 0; i < (FUSE_PLANES ? 1 : Q_BITS); ++i)
#pragma unroll
          for (int j = 0; j < P_BITS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              dot[e] += (FUSE_PLANES ? 1 : a_coef(i)) * w_coef(j) * acc[i][j][mi][ni][2 * h + e];
        // y - PAIR_YLO per half (the halves of dot < 2^16: one byte permute packs them)
        const u32 y = prmt(dot[0], dot[1], 0x5410) * (A_ALPHA * W_ALPHA) + row_word[mi][h];
        u32 bit[2] = {0u, 0u};  // output bit b of both columns in the halves' top bits
#pragma unroll
        for (int b = 0; b < OUT_BITS; ++b) {
          bit[b] = ((OUT_QMIN >> b) & 1) ? ~0u : 0u;
#pragma unroll
          for (int k = 0; k < THR_LEVELS; ++k)
            if (level_flips(k, b)) bit[b] ^= y + thr[k];
        }
        const u32 masks = prmt(bit[0], bit[1], OUT_BITS > 1 ? 0xFDB9 : 0x44B9);
        bytes[mi][h][ni / 8] |= masks & (0x01010101u << (ni % 8));
      }
  const int word0 = (n0 + col0) / 32;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) store_pair_row(bytes[mi][h], rows.m[mi][h], word0, t4, ea);
}

// The fused epilogue of the block tile at (m0, n0), this warp's rows row0 + mi*16 + g (+8) and
// columns col0 + ni*8 + 2*t4 (+1): combines the planes (see the top of this file), adds the
// bias, ReLU, then int32 / fp16 / requantized INT8 or bit planes, through the packing tile s_out
// where warp tiles are narrower than a word. rows: epilogue_rows of the same tile and warp.
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, RowPrep rows,
                                              int m0, int n0, int row0, int col0, int lane,
                                              int tid, const EpilogueArgs& ea, u32* s_out) {
  if constexpr (SPLIT_K == 1) {  // split-K: the row-sum MMA's part is in split_sum
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) rows.term[mi][h] += rowsum_mma_term(rsum, mi, h);
  }
  if constexpr (PACK_IN_SMEM) pack_tile_clear(s_out, tid);
  if constexpr (THR_PAIRS) {
    epilogue_pairs(acc, rows, n0, col0, lane, ea);
    return;
  }
  epilogue_cols(acc, rows, m0, n0, row0, col0, lane, ea, s_out);
  if constexpr (PACK_IN_SMEM) pack_tile_store(s_out, ea.out, m0, n0, tid);
}
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, int m0, int n0,
                                              int row0, int col0, int lane, int tid,
                                              const EpilogueArgs& ea, u32* s_out) {
  tile_epilogue(acc, rsum, epilogue_rows(m0, n0, row0, col0, lane, ea), m0, n0, row0, col0, lane,
                tid, ea, s_out);
}

// ---- split-K (bitserial.cu, bitserial_wgmma.cu; constants above N_TILES) ----

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

// ---- persistent blocks (bitserial_persistent.cu, bitserial_wgmma_persistent.cu) ----
// A block takes tiles blockIdx.x, + gridDim.x, ..., and its copy pipeline runs across tile
// boundaries. The copy side: the tile the copies are at, with that tile's first column and its
// copy rows, decoded once per tile (a per-stage a_rows, three divisions per row, was half of
// the wgmma persistent kernel's ~130 instructions per k step). Past the last tile its rows lie
// past M.
struct TileLoads {
  int tile, n0;
  ARows ar;
};
__device__ __forceinline__ TileLoads tile_loads(int tile, int tid) {
  return TileLoads{tile, tile % N_COL_TILES * BN, a_rows((i64)(tile / N_COL_TILES) * BM, tid)};
}
// k tiles of the persistent wgmma loop unrolled: all of them up to 36 (a 3x3 conv over 1,024
// channels at KT=1), beyond that none
constexpr int K_UNROLL = KTILES <= 36 ? KTILES : 1;

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
