// Bit-serial (APNN-TC) conv2d / GEMM on 1-bit tensor cores: mma.sync m16n8k256 b1 .and.popc
// (bitserial_mma_sync*.cu) or, on sm_90a, wgmma m64nNk256 b1 .and.popc (bitserial_wgmma*.cu,
// bitserial_tap_shift.cu). This file holds the constants every kernel derives from the
// rendered constexpr parameters (shape, encodings, tiles: bitserial_render.py) and the row
// geometry; bitserial_common.cu includes it first.
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
// each row's taps while the tile's MMAs run (bitserial_tap_shift.cu).
constexpr bool ROWSUM_MMA = NEED_ROWSUM && !ROWSUM_TABLE && !ROWSUM_SLAB;
// ... by a second wgmma (m64n8k256) against a tile of ones, unless ROWSUM_COLS puts the ones
// in the products' own wgmma
constexpr bool ROWSUM_ONES_TILE = ROWSUM_MMA && !ROWSUM_COLS;
static_assert(!ROWSUM_COLS || (ROWSUM_MMA && WGMMA && BN == WN && !FUSE_PLANES),
              "ROWSUM_COLS: binary weights, wgmma, one warpgroup in N (the template's constraints)");
static_assert(!(ROW_TABLE && ROWSUM_TABLE) && (ROW_TABLE < 2 || TAP_SHIFT),
              "ROW_TABLE: not with the xpop sums; 2: TAP_SHIFT=1 (the template's constraints)");
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
              "PLANE_ROWS: A_IN_HALO, two activation planes, one k slice (the template's constraints)");
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
              "A_IN_HALO: wgmma, stride 1, channels a multiple of 256 (the template's constraints)");
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
// grid, bitserial_tap_shift.cu; without it VQ = VP = 1 and y = c = 0). n < 0: before the grid.
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
// the last image. Rows < 2^31 (bitserial_shape.support_limits_reason).
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

