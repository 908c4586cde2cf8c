// Warp-specialized first layer (stem_ws.py renders the prelude before this file): types and
// the constants derived from the prelude.

typedef unsigned char u8;
typedef signed char s8;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

constexpr int PRODUCER_WARPS = 4;
constexpr int GROUPS = 4;                       // column groups of consumer warps
constexpr int CONSUMER_WARPS = 2 * GROUPS;      // x 2 halves of the CTA's 64 channels
constexpr int CONSUMERS = 32 * CONSUMER_WARPS;
constexpr int THREADS = 32 * (PRODUCER_WARPS + CONSUMER_WARPS);
constexpr int KBLOCK = 64;                      // output channels per CTA
constexpr int CP = 4 * C;                       // bytes per space-to-depth pixel
constexpr int KCH = 2 * C;                      // k32 chunks of the reduction
constexpr int KBYTES = 32 * KCH;                // reduction bytes: 4 x 4 pixels
constexpr int JW = 4 * NT_W - 1;                // pooled columns a consumer warp writes
constexpr int JT = GROUPS * JW;                 // pooled columns per tile
constexpr int XS = 2 * JT + 5;                  // space-to-depth columns per tile
constexpr int IXS = 2 * XS;                     // image columns per tile
constexpr int ROW_BYTES = (XS * CP + 15) / 16 * 16;
constexpr int SLOT_BYTES = 2 * ROW_BYTES;       // one pair of space-to-depth rows
constexpr int FILL_ROWS = 4 * C;                // image rows (r, d, c) per fill
constexpr int MC = (IXS + 31) / 32;             // image columns per lane
constexpr int LANE_VALUES = U8_INPUT ? 16 : 32;  // image values a lane loads at once
constexpr int RPC = LANE_VALUES / MC > 0 ? LANE_VALUES / MC : 1;  // image rows a chunk
constexpr int EPC = RPC * MC;                   // image values a lane loads at once
constexpr int NCHUNK = (FILL_ROWS + RPC - 1) / RPC;
constexpr int EPI_WORDS = 8;                    // int32 words per output and channel
constexpr int INT32_LOW = -2147483647 - 1;
// shared memory: ring, epilogue constants, bias, table, mbarriers, the consumers'
// carried rows (registers they need for the MMA operands)
constexpr int SM_EPI = NSLOT * SLOT_BYTES;
constexpr int SM_BIAS = SM_EPI + NOUT * KBLOCK * EPI_WORDS * 4;
constexpr int SM_TABLE = SM_BIAS + KBLOCK * 4;
// the uint8 image's table (int8 [C][256]) or the float image's quantizer steps (QuantStep
// [256], `quantize_by_thresholds`)
constexpr int TABLE_BYTES = U8_INPUT ? (C * 256 + 15) / 16 * 16 : 256 * 16;
constexpr int SM_BARS = SM_TABLE + TABLE_BYTES;
constexpr int SM_CARRY = SM_BARS + 2 * NSLOT * 8;  // int32 [NT_W][4][CONSUMERS]
constexpr int SMEM_BYTES = SM_CARRY + NT_W * 4 * CONSUMERS * 4;
static_assert(SMEM_BYTES == SMEM_EXPECTED, "stem_ws.smem_bytes must match this layout");
static_assert(NSLOT >= 4, "a step reads three slots; one more lets the producers run ahead");
static_assert(C >= 1 && C <= 4 && NT_W >= 1 && NT_W <= 4, "shape");
// the mma_conv device primitives used: s8 x s8 mma.sync m16n8k32
#define MMA_S4 0
#define A_SIGNED 1
#define W_SIGNED 1
#define VEC 16
#define NIBBLE_TAIL 0
