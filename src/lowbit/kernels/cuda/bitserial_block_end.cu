// ---- the block-end epilogue (HAS_BIAS = 5: Epilogue.requant32; its constants from
// bitserial_render.block_end_params) ----
//
// Per output (row m, column k): y the exact accumulator (plane products, row and column terms
// as in epilogue_cols), then in 32-bit integers (the host proved every sum below 2^31:
// validate.check_requant32_range)
//   z = y m[k] + (b[k] + 2^(s[k]-1)) + res r[k],   q = clamp(z >> s[k], MID_LO, OUT_QMAX)
// with res the narrow residual (one byte per value, the output's NHWC shape; RES_BYTES 1:
// unsigned, 2: signed). q is stored (STORE_OUT) as bytes (OUT_MODE 2) or bit planes (3), and
// each derived output j (N_DERIVED) stores its value P_j.qmin + #{i : q >= T_j[i]} as bytes
// (D<j>_MODE 2) or bit planes (3): <= THR_CMP_LEVELS thresholds compared in registers (from
// the kernel's BlockEndArgs, uniform), more through the byte table lut[j][q - MID_LO].
//
// Memory access: a lane holds columns 2 t4 + (0, 1) of each n8 tile of its rows. With groups of
// four n8 tiles (32 columns) and KOUT % 8 == 0 (QUAD8) a quad exchanges its 16-bit column pairs
// (quad_transpose16, two shuffles) so that each lane reads / writes 8 adjacent bytes of its
// row: the residual arrives by one 8-byte load and each byte output leaves by one 8-byte store
// per row and 32 columns (a quad: a whole 32-byte sector), instead of four 2-byte accesses.
// Bit planes pack in registers (whole 32-column words per warp: WN % 32 == 0) and leave
// through store_plane_words. The column parameters are one 16-byte entry per column
// {m, b + 2^(s-1), r, s} (bitserial_tables.requant32_columns, padded past KOUT with zeros and
// shift 1), read through the kernel's `mult` argument.
constexpr bool BLOCK_END = HAS_BIAS == 5;
constexpr int MID_LO = (RELU && OUT_QMIN < 0) ? 0 : OUT_QMIN;
constexpr int GROUP_TILES = NT % 4 == 0 ? 4 : NT;  // n8 tiles per column group
constexpr int COL_GROUPS = NT / GROUP_TILES;
constexpr bool QUAD8 = GROUP_TILES == 4 && KOUT % 8 == 0;
constexpr bool BYTE_PAIRS = KOUT % 2 == 0;
constexpr bool MID_PLANES = STORE_OUT && OUT_MODE == 3;
constexpr bool ANY_PLANES = MID_PLANES || D0_MODE == 3 || D1_MODE == 3;
static_assert(!BLOCK_END || (REQUANT_OUT && !OUT_THRESH && !THR_PAIRS && !PACK_IN_SMEM &&
                             (!ANY_PLANES || WN % 32 == 0)),
              "block-end epilogue: the multiply path, bit planes packed in registers (the "
              "template's constraints)");

// A 4 x 4 transpose of 16-bit elements across a quad: lane t4 holds v[0..3] = (a.lo, a.hi,
// b.lo, b.hi) and gets element v[t4] of lanes 0, 1 (x: low, high half) and 2, 3 (y). Its own
// inverse. Step 1 swaps the halves (v[0..1] / v[2..3]) with lane t4 ^ 2, step 2 single elements
// with t4 ^ 1; the rest is byte permutes.
__device__ __forceinline__ uint2 quad_transpose16(u32 a, u32 b, int t4) {
  const bool hi = (t4 & 2) != 0, lo = (t4 & 1) != 0;
  const u32 keep = hi ? b : a;
  const u32 got = __shfl_xor_sync(0xffffffffu, hi ? a : b, 2);
  const u32 even = prmt(keep, got, 0x5410);  // v[2 hi] of lanes t4, t4 ^ 2
  const u32 odd = prmt(keep, got, 0x7632);   // v[2 hi + 1] of the same
  const u32 recv = __shfl_xor_sync(0xffffffffu, lo ? even : odd, 1);
  const u32 mine = lo ? odd : even;  // v[t4] of lanes t4, t4 ^ 2; recv: of t4 ^ 1, t4 ^ 3
  const u32 first = lo ? recv : mine, second = lo ? mine : recv;  // lanes (0|2, 2|0), (1|3, 3|1)
  return make_uint2(prmt(first, second, hi ? 0x7632 : 0x5410),
                    prmt(first, second, hi ? 0x5410 : 0x7632));
}

// Byte b (0..3) of residual word v as a value (RES_BYTES 1: unsigned, 2: signed).
__device__ __forceinline__ int res_byte(u32 v, int b) {
  if constexpr (RES_BYTES == 2) return (int)(v << (24 - 8 * b)) >> 24;
  return (int)((v >> (8 * b)) & 0xffu);
}

typedef int GroupValues[GROUP_TILES][2];  // one row's values of a column group, per lane

// The residual values of this lane's columns of row m in the group starting at column gcol
// (zeros outside the output and without a residual).
__device__ __forceinline__ void load_residual_group(const EpilogueArgs& ea, int m, int gcol,
                                                    int t4, GroupValues& res) {
  const unsigned char* base = reinterpret_cast<const unsigned char*>(ea.thr);
  if constexpr (RES_BYTES == 0) {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) res[t][0] = res[t][1] = 0;
  } else if constexpr (QUAD8) {
    const int col = gcol + 8 * t4;
    uint2 v = make_uint2(0u, 0u);
    if (m < M_ROWS && col < KOUT) v = *reinterpret_cast<const uint2*>(base + (i64)m * KOUT + col);
    const uint2 mine = quad_transpose16(v.x, v.y, t4);  // this lane's pairs of tiles 0-1, 2-3
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) res[t][e] = res_byte(t < 2 ? mine.x : mine.y, 2 * (t & 1) + e);
  } else {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) {
      const int col = gcol + t * 8 + 2 * t4;
      const bool row_ok = m < M_ROWS;
      const i64 at = (i64)m * KOUT + col;
      u32 v = 0;
      if constexpr (BYTE_PAIRS) {
        if (row_ok && col < KOUT) v = *reinterpret_cast<const unsigned short*>(base + at);
      } else {
        if (row_ok && col < KOUT) v = base[at];
        if (row_ok && col + 1 < KOUT) v |= (u32)base[at + 1] << 8;
      }
      res[t][0] = res_byte(v, 0);
      res[t][1] = res_byte(v, 1);
    }
  }
}

// Store the low bytes of one row's values of a column group (as load_residual_group reads).
__device__ __forceinline__ void store_group_bytes(void* dst, int m, int gcol, int t4,
                                                  const GroupValues& v) {
  unsigned char* base = reinterpret_cast<unsigned char*>(dst);
  if constexpr (QUAD8) {
    const u32 p0 = prmt(v[0][0], v[0][1], 0x0040), p1 = prmt(v[1][0], v[1][1], 0x0040);
    const u32 p2 = prmt(v[2][0], v[2][1], 0x0040), p3 = prmt(v[3][0], v[3][1], 0x0040);
    const uint2 w = quad_transpose16(prmt(p0, p1, 0x5410), prmt(p2, p3, 0x5410), t4);
    const int col = gcol + 8 * t4;
    if (m < M_ROWS && col < KOUT) *reinterpret_cast<uint2*>(base + (i64)m * KOUT + col) = w;
  } else {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) {
      const int col = gcol + t * 8 + 2 * t4;
      const i64 at = (i64)m * KOUT + col;
      if (m >= M_ROWS) continue;
      if constexpr (BYTE_PAIRS) {
        if (col < KOUT)
          *reinterpret_cast<unsigned short*>(base + at) =
              (unsigned short)(((u32)v[t][0] & 0xffu) | (((u32)v[t][1] & 0xffu) << 8));
      } else {
        if (col < KOUT) base[at] = (unsigned char)v[t][0];
        if (col + 1 < KOUT) base[at + 1] = (unsigned char)v[t][1];
      }
    }
  }
}

// Derived output J's value of mid value q (the low byte where its levels go through the table:
// all that its bytes or bit planes keep).
template <int J>
__device__ __forceinline__ int derived_value(int q, const BlockEndArgs& be) {
  constexpr int LEVELS = J == 0 ? D0_LEVELS : D1_LEVELS, QMIN = J == 0 ? D0_QMIN : D1_QMIN;
  if constexpr (LEVELS > THR_CMP_LEVELS) {
    return __ldg(be.lut[J] + (q - MID_LO));
  } else if constexpr (LEVELS == 3) {  // non-decreasing: q >= T[1] decides the upper half
    const bool upper = q >= be.thr[J][1];
    return QMIN + (upper ? 2 + (int)(q >= be.thr[J][2]) : (int)(q >= be.thr[J][0]));
  } else {
    int v = QMIN;
#pragma unroll
    for (int k = 0; k < LEVELS; ++k) v += (int)(q >= be.thr[J][k]);
    return v;
  }
}

// Output J (-1: the mid value) of one row's group values: bytes stored now, bit planes ORed
// into this lane's words (bit 8 (ni % 4) + e; shifted by 2 t4 at the store).
template <int J, int MODE, int BITS>
__device__ __forceinline__ void group_output(const GroupValues& q, void* dst, int m, int gcol,
                                             int t4, int word, const BlockEndArgs& be,
                                             u32 (&bits)[OUT_WORD_TILES][BITS]) {
  GroupValues v;
#pragma unroll
  for (int t = 0; t < GROUP_TILES; ++t)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if constexpr (J < 0) v[t][e] = q[t][e];
      else v[t][e] = derived_value<J>(q[t][e], be);
    }
  if constexpr (MODE == 2) {
    store_group_bytes(dst, m, gcol, t4, v);
  } else if constexpr (MODE == 3) {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int b = 0; b < BITS; ++b)
          bits[word][b] |= (u32)((v[t][e] >> b) & 1) << (t * 8 + e);
  }
}

typedef u32 MidWords[MT][2][OUT_WORD_TILES][MID_PLANES ? OUT_BITS : 1];
typedef u32 D0Words[MT][2][OUT_WORD_TILES][D0_MODE == 3 ? D0_BITS : 1];
typedef u32 D1Words[MT][2][OUT_WORD_TILES][D1_MODE == 3 ? D1_BITS : 1];
template <typename Words>
__device__ __forceinline__ void zero_words(Words& w) {
  u32* p = &w[0][0][0][0];
#pragma unroll
  for (int i = 0; i < (int)(sizeof(Words) / sizeof(u32)); ++i) p[i] = 0;
}

// The block-end epilogue of this warp's rows (rows.m) and columns col0 + ni*8 + 2*t4 (+1) of
// the block tile at column n0: column groups outer (their parameters and residuals loaded
// once), this lane's rows inner.
__device__ __forceinline__ void block_end_cols(const Acc& acc, const RowPrep& rows, int m0, int n0,
                                               int row0, int col0, int lane,
                                               const EpilogueArgs& ea) {
  const int g = lane >> 2, t4 = lane & 3;
  const uint4* ctab = reinterpret_cast<const uint4*>(ea.mult);
  MidWords mid_words;
  D0Words d0_words;
  D1Words d1_words;
  zero_words(mid_words);
  zero_words(d0_words);
  zero_words(d1_words);
#pragma unroll
  for (int gi = 0; gi < COL_GROUPS; ++gi) {
    const int gcol = n0 + col0 + gi * GROUP_TILES * 8;
    GroupValues res[MT][2], q[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) load_residual_group(ea, rows.m[mi][h], gcol, t4, res[mi][h]);
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) {
      const int ni = gi * GROUP_TILES + t, col = gcol + t * 8 + 2 * t4;
      uint2 wpair[MT][2], splits[MT][2];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (BORDER) wpair[mi][h] = *reinterpret_cast<const uint2*>(rows.rowp[mi][h] + ni * 8);
          if constexpr (SPLIT_K > 1) splits[mi][h] = split_sum(ea, m0 + row0 + mi * 16 + g + 8 * h, col);
        }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint4 c = ctab[col + e];  // {m, b + 2^(s-1), r, s}
        const int off = (NEED_WTAP && !BORDER && col + e < KOUT)
                            ? ea.wtap[WSUM0 + FULL_RECT * KPAD + col + e] : 0;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int y = rows.term[mi][h] + off;
            if constexpr (SPLIT_K > 1) {
              y += e ? (int)splits[mi][h].y : (int)splits[mi][h].x;
            } else {
              y += plane_dot(acc, mi, ni, 2 * h + e);
            }
            if constexpr (BORDER) y += e ? (int)wpair[mi][h].y : (int)wpair[mi][h].x;
            const int z = y * (int)c.x + (int)c.y + res[mi][h][t][e] * (int)c.z;
            const int v = z >> (int)c.w;
            q[mi][h][t][e] = v < MID_LO ? MID_LO : (v > OUT_QMAX ? OUT_QMAX : v);
          }
      }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = rows.m[mi][h];
        if constexpr (STORE_OUT)
          group_output<-1, OUT_MODE>(q[mi][h], ea.out, m, gcol, t4, gi, ea.be, mid_words[mi][h]);
        if constexpr (N_DERIVED > 0)
          group_output<0, D0_MODE>(q[mi][h], ea.be.derived[0], m, gcol, t4, gi, ea.be,
                                   d0_words[mi][h]);
        if constexpr (N_DERIVED > 1)
          group_output<1, D1_MODE>(q[mi][h], ea.be.derived[1], m, gcol, t4, gi, ea.be,
                                   d1_words[mi][h]);
      }
  }
  if constexpr (ANY_PLANES) {
    const int word0 = (n0 + col0) / 32;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = rows.m[mi][h];
        if constexpr (MID_PLANES)
          store_plane_words(reinterpret_cast<u32*>(ea.out), mid_words[mi][h], m, word0, t4);
        if constexpr (D0_MODE == 3)
          store_plane_words(reinterpret_cast<u32*>(ea.be.derived[0]), d0_words[mi][h], m, word0, t4);
        if constexpr (D1_MODE == 3)
          store_plane_words(reinterpret_cast<u32*>(ea.be.derived[1]), d1_words[mi][h], m, word0, t4);
      }
  }
}
