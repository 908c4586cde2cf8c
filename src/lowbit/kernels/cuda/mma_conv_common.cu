// Tiled mma.sync implicit-GEMM conv (mma_conv.py renders the constexpr prelude before this
// file): types and the constants derived from the prelude.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned short ushort;
typedef unsigned long long u64;
typedef long long i64;

constexpr int THREADS = WARPS_M * WARPS_N * 32;
constexpr int BM = WARPS_M * TILES_M * 16;
constexpr int BN = WARPS_N * TILES_N * 8;
constexpr int KBP = KB + 16;                     // padded shared row (bytes)
constexpr int CHUNKS = (CB + KB - 1) / KB;
constexpr int RS = R * S;
constexpr int STEPS = RS * CHUNKS;
constexpr int M_TOTAL = NB * P * Q;
constexpr int HP = (TP - 1) * STRIDE + R;        // halo rows / cols (DUP)
constexpr int HQ = (TQ - 1) * STRIDE + S;
constexpr int TILES_P = (P + TP - 1) / TP;
constexpr int TILES_Q = (Q + TQ - 1) / TQ;
constexpr int A_ROWS = DUP ? HP * HQ : BM;
constexpr int A_STAGE = A_ROWS * KBP;
constexpr int B_STAGE = BN * KBP;
constexpr int ROWINFO = DUP ? 0 : 3 * BM * 4;
constexpr int PIPE = 2 * (A_STAGE + B_STAGE);
// OUT_KIND: 0 int32, 1 fp16, 2 requantized one byte per element, 3 requantized dense-packed
constexpr bool STAGE_OUT = OUT_KIND == 3 && !REG_PACK;
constexpr int OB = OUT_KIND == 3 ? (K * OUT_BITS + 7) / 8 : K;   // output row bytes (2, 3)
constexpr int VPR = KB / VEC;                    // vectors per staged row
static_assert(!DUP || LOOP_CRS, "duplicate-aware load needs the channel-outer loop order");
static_assert(!DUP || TP * TQ == BM, "the DUP pixel tile must hold BM rows");
static_assert(KB % 32 == 0 && BM % 16 == 0 && BN % 8 == 0, "tile shape");

