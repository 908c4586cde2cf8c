// ---- the block-end epilogue (HAS_BIAS = 5: Epilogue.requant32; its constants from
// bitserial_render.block_end_params) ----
//
// Per output (row m, column k): y the exact accumulator (plane products, row and column terms
// as in epilogue_cols), then in 32-bit integers (the host proved every sum below 2^31:
// validate.check_requant32_range)
//   z = y m[k] + (b[k] + 2^(s[k]-1)) + res r[k],   q = clamp(z >> s[k], MID_LO, OUT_QMAX)
// with res the narrow residual (one byte per value, the output's NHWC shape; RES_BYTES 1:
// unsigned, 2: signed). SUM64 (Epilogue.sum64: multipliers of 31 significant bits) forms the
// same z in 64 bits (the host proved |z| < 2^min(63, 31 + s)): y m + c by one wide multiply-add
// (c = b + 2^(s-1) - o r), plus u r as u r_lo (wide) + (u r_hi) 2^32 with u = res + o the
// residual byte read unsigned (o = 128 for a signed residual: its bytes' top bits flipped), and
// z >> s as the funnel shift of z's words by min(s, 32) (its low word: z >> s fits int32), then
// shifted by max(s - 32, 0). GUARDED (Epilogue.guarded, with SUM64: the same exact q) forms a
// 32-bit approximation z' = y m' + c' + u r' of z (2^s' / 2^s times it; bitserial_tables.
// guarded_form proved |z' - z 2^(s'-s)| < H, the band's half-width, a power of two) plus H
// (c' = b' + 2^(s'-1) - o r' + H): where its bits log2(2H) .. s' - 1 are not all zero (z' lies
// >= H from a multiple of 2^s') its shift is q; the rest (rare: 2H / 2^s' of the sums) are
// redone in 64 bits as SUM64, one branch per n8 tile or column (REDO_TILES). q is stored
// (STORE_OUT) as bytes (OUT_MODE 2) or bit planes (3), and
// each derived output j (N_DERIVED) stores its value P_j.qmin + #{i : q >= T_j[i]} as bytes
// (D<j>_MODE 2) or bit planes (3). Bit planes of one or three levels (u1, u2, s2: PAIR_CMP)
// compare two columns per 32-bit add: the pair's qo = q - MID_LO (0..255) in the 16-bit halves
// of one word, plus a threshold word whose halves are 0x8000 - (T - MID_LO) (clamped to
// 0..256; bitserial_tables.block_end_args), leaves q >= T in each half's top bit, no carry
// crossing; a byte permute gathers those bits into the plane words (gather_plane_bits). Other
// derived outputs read the byte table lut[j][qo] (one L1-resident load per value).
//
// Memory access: a lane holds columns 2 t4 + (0, 1) of each n8 tile of its rows. With groups of
// four n8 tiles (32 columns) and KOUT % 8 == 0 (QUAD8) a quad exchanges its 16-bit column pairs
// (quad_transpose16, two shuffles) so that each lane reads / writes 8 adjacent bytes of its
// row: the residual arrives by one 8-byte load and each byte output leaves by one 8-byte store
// per row and 32 columns (a quad: a whole 32-byte sector), instead of four 2-byte accesses.
// Bit planes pack in registers (whole 32-column words per warp: WN % 32 == 0) and leave
// through store_plane_words. The column parameters are one 16-byte entry per column
// {m, b + 2^(s-1), r, s} (bitserial_tables.requant32_columns, padded past KOUT with zeros and
// shift 1; SUM64: two 16-byte entries {m, s, c lo, c hi} {r lo, r hi, max(s - 32, 0), 0};
// GUARDED: {m', c', r', s' | 2^s' - 2H} per column, then SUM64's table from entry KPAD on, read
// only by the redo), read through the kernel's `mult` argument.
constexpr bool BLOCK_END = HAS_BIAS == 5;
constexpr int MID_LO = (RELU && OUT_QMIN < 0) ? 0 : OUT_QMIN;
constexpr int GROUP_TILES = NT % 4 == 0 ? 4 : NT;  // n8 tiles per column group
constexpr int COL_GROUPS = NT / GROUP_TILES;
constexpr bool QUAD8 = GROUP_TILES == 4 && KOUT % 8 == 0;
constexpr bool BYTE_PAIRS = KOUT % 2 == 0;
constexpr bool MID_PLANES = STORE_OUT && OUT_MODE == 3;
constexpr bool ANY_PLANES = MID_PLANES || D0_MODE == 3 || D1_MODE == 3;
// Bit-plane words leave every FLUSH_TILES column groups (a 128-column chunk at most: the
// words of a whole 256-column warp tile spilled past the accumulators)
constexpr int FLUSH_TILES = OUT_WORD_TILES < 4 ? OUT_WORD_TILES : 4;
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

// SUM64 reads a signed residual's bytes as unsigned values res + 128: their top bits flipped
// (one XOR per four bytes; the column table's constant takes the 128 r back)
constexpr u32 RES_FLIP = (SUM64 && RES_BYTES == 2) ? 0x80808080u : 0u;
// Byte b (0..3) of residual word v as a value (RES_BYTES 1 or SUM64: unsigned, 2: signed): one
// byte permute (selector nibble 8 | b copies byte b's sign bit).
__device__ __forceinline__ int res_byte(u32 v, int b) {
  constexpr bool SIGNED = RES_BYTES == 2 && !SUM64;
  const u32 fill = SIGNED ? (u32)b | 8u : 4u;  // 4: a zero byte of the second word
  return (int)prmt(v, 0u, (u32)b | fill << 4 | fill << 8 | fill << 12);
}

// SUM64's z >> s of accumulator y and residual byte u (unsigned: RES_FLIP) from the column's
// entries c = {m, s, c lo, c hi} (c's words an aligned register pair: the wide multiply-add's
// addend as loaded), d = {r lo, r hi, max(s - 32, 0), 0}: z = y m + c + u r_lo by two wide
// multiply-adds and u r_hi added to z's high word, all modulo 2^64 (the sum itself fits),
// then the funnel shift's low word. Five instructions (the 32-bit sum: three).
__device__ __forceinline__ int requant64(int y, int u, const uint4& c, const uint4& d) {
  const u64 yc = (u64)((i64)y * (int)c.x + (i64)(((u64)c.w << 32) | c.z));
  u32 lo = (u32)yc, hi = (u32)(yc >> 32);
  if constexpr (RES_BYTES != 0) {
    const u64 z = (u64)(u32)u * d.x + yc;
    lo = (u32)z;
    hi = (u32)(z >> 32) + (u32)u * d.y;
  }
  return (int)__funnelshift_rc(lo, hi, c.y) >> (int)d.z;
}

// SUM64's second entry of column j in the table `tab`: {r lo, r hi, max(s - 32, 0), 0}
// (without a residual only its shift word is read)
__device__ __forceinline__ uint4 sum64_rest(const uint4* tab, int j) {
  if constexpr (RES_BYTES != 0) return tab[2 * j + 1];
  return make_uint4(0u, 0u, reinterpret_cast<const u32*>(tab)[8 * j + 6], 0u);
}

// GUARDED: one branch to the 64-bit redo per n8 tile (two columns) with one row pair per warp
// tile (MT 1), else per column (the redo keeps fewer of a taller tile's sums alive)
constexpr bool REDO_TILES = MT == 1;

// The mid value v clamped to [MID_LO, OUT_QMAX], less MID_LO
__device__ __forceinline__ int clamp_mid(int v) {
  return (v < MID_LO ? MID_LO : (v > OUT_QMAX ? OUT_QMAX : v)) - MID_LO;
}

typedef int GroupValues[GROUP_TILES][2];  // one row's values of a column group, per lane

// Where a lane's bytes of a column group start: `at` = m * KOUT + its first column (QUAD8:
// of its 8-byte chunk; else of its pair in the group's first n8 tile), `col` that column,
// `row_ok` m < M_ROWS. Worked out once per row; a group adds its first column's offset.
struct ByteRow {
  i64 at;
  int col;
  bool row_ok;
};
__device__ __forceinline__ ByteRow byte_row(int m, int lane_col) {
  return ByteRow{(i64)m * KOUT + lane_col, lane_col, m < M_ROWS};
}

// QUAD8: this lane's 8 residual bytes of one row in the group `gc` columns on (zeros outside
// the output and without a residual), one 8-byte load; block_end_cols loads every group's
// before the first group's stores (a store may alias the residual for the compiler: loads
// between the groups' stores would wait a memory round trip each).
__device__ __forceinline__ uint2 residual_quad(const EpilogueArgs& ea, const ByteRow& r, int gc) {
  uint2 v = make_uint2(0u, 0u);
  if constexpr (RES_BYTES != 0 && QUAD8) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(ea.thr) + r.at + gc;
    if (r.row_ok && r.col + gc < KOUT) v = *reinterpret_cast<const uint2*>(base);
  }
  return v;
}

// The residual values of this lane's columns of one row in the group `gc` columns on (zeros
// outside the output and without a residual); QUAD8: from its residual_quad word `quad`.
__device__ __forceinline__ void load_residual_group(const EpilogueArgs& ea, const ByteRow& r,
                                                    int gc, int t4, uint2 quad, GroupValues& res) {
  const unsigned char* base = reinterpret_cast<const unsigned char*>(ea.thr) + r.at + gc;
  if constexpr (RES_BYTES == 0) {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) res[t][0] = res[t][1] = 0;
  } else if constexpr (QUAD8) {
    const uint2 mine = quad_transpose16(quad.x ^ RES_FLIP, quad.y ^ RES_FLIP, t4);  // pairs of tiles 0-1, 2-3
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) res[t][e] = res_byte(t < 2 ? mine.x : mine.y, 2 * (t & 1) + e);
  } else {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) {
      const int col = r.col + gc + t * 8;
      u32 v = 0;
      if constexpr (BYTE_PAIRS) {
        if (r.row_ok && col < KOUT) v = *reinterpret_cast<const unsigned short*>(base + t * 8);
      } else {
        if (r.row_ok && col < KOUT) v = base[t * 8];
        if (r.row_ok && col + 1 < KOUT) v |= (u32)base[t * 8 + 1] << 8;
      }
      v ^= RES_FLIP;  // past the output: 128, times r = 0
      res[t][0] = res_byte(v, 0);
      res[t][1] = res_byte(v, 1);
    }
  }
}

// A block end's residual bytes for this lane's rows (virtual rows v0 + mi*16 + g + 8h) and
// columns (col0 on, as block_end_cols reads them) prefetched into L1 when the block starts:
// a hint (nothing is read), so the epilogue after the last MMA finds them on chip instead of
// waiting a DRAM round trip.
__device__ __forceinline__ void prefetch_residual(int v0, int col0, int lane, const EpilogueArgs& ea) {
  if constexpr (BLOCK_END && RES_BYTES != 0) {
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned char* res = reinterpret_cast<const unsigned char*>(ea.thr);
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = out_row(v0 + mi * 16 + g + 8 * h);
        if (m >= M_ROWS) continue;
#pragma unroll
        for (int gi = 0; gi < COL_GROUPS; ++gi) {
          const int col = col0 + gi * GROUP_TILES * 8 + (QUAD8 ? 8 : 2) * t4;
          if (col < KOUT) prefetch_l1(res + (i64)m * KOUT + col);
        }
      }
  }
}

// QUAD8: store one row's group bytes, a = this lane's column pairs of tiles 0, 1 (16-bit
// halves, column 2 t4 in the low byte), b of tiles 2, 3: the quad's transpose, then 8 bytes.
__device__ __forceinline__ void store_quad_bytes(void* dst, const ByteRow& r, int gc, int t4,
                                                 u32 a, u32 b) {
  const uint2 w = quad_transpose16(a, b, t4);
  if (r.row_ok && r.col + gc < KOUT)
    *reinterpret_cast<uint2*>(reinterpret_cast<unsigned char*>(dst) + r.at + gc) = w;
}

// Store the low bytes of one row's values of the group `gc` columns on (as
// load_residual_group reads them).
__device__ __forceinline__ void store_group_bytes(void* dst, const ByteRow& r, int gc, int t4,
                                                  const GroupValues& v) {
  unsigned char* base = reinterpret_cast<unsigned char*>(dst) + r.at + gc;
  if constexpr (QUAD8) {
    const u32 p0 = prmt(v[0][0], v[0][1], 0x0040), p1 = prmt(v[1][0], v[1][1], 0x0040);
    const u32 p2 = prmt(v[2][0], v[2][1], 0x0040), p3 = prmt(v[3][0], v[3][1], 0x0040);
    store_quad_bytes(dst, r, gc, t4, prmt(p0, p1, 0x5410), prmt(p2, p3, 0x5410));
  } else {
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t) {
      const int col = r.col + gc + t * 8;
      if (!r.row_ok) continue;
      if constexpr (BYTE_PAIRS) {
        if (col < KOUT)
          *reinterpret_cast<unsigned short*>(base + t * 8) =
              (unsigned short)(((u32)v[t][0] & 0xffu) | (((u32)v[t][1] & 0xffu) << 8));
      } else {
        if (col < KOUT) base[t * 8] = (unsigned char)v[t][0];
        if (col + 1 < KOUT) base[t * 8 + 1] = (unsigned char)v[t][1];
      }
    }
  }
}

// The byte (or the bits) of derived output J of mid value q, qo = q - MID_LO: its byte table.
template <int J>
__device__ __forceinline__ int derived_byte(int qo, const BlockEndArgs& be) {
  return __ldg(be.lut[J] + qo);
}
template <int J> struct DerivedOut {
  static constexpr int MODE = J == 0 ? D0_MODE : D1_MODE, BITS = J == 0 ? D0_BITS : D1_BITS;
  static constexpr int LEVELS = J == 0 ? D0_LEVELS : D1_LEVELS, QMIN = J == 0 ? D0_QMIN : D1_QMIN;
  // bit planes of one or three levels (u1, u2, s2) by 16-bit compares (block_end_args)
  static constexpr bool PAIR_CMP = MODE == 3 && ((LEVELS == 1 && BITS == 1) ||
                                                 (LEVELS == 3 && BITS == 2 && (QMIN & 1) == 0));
};

// The plane word of a column group from its four tiles' pair words (tile t: columns 8t + 2 t4
// + e in the top bits of halves e = 0, 1): bit 8t + e (shifted by 2 t4 at the store).
__device__ __forceinline__ u32 gather_plane_bits(u32 w0, u32 w1, u32 w2, u32 w3) {
  const u32 p01 = prmt(w0, w1, 0xFBD9), p23 = prmt(w2, w3, 0xFBD9);  // byte masks (t0e0, t1e0, t0e1, t1e1)
  return (prmt(p01, p23, 0x5410) & 0x01010101u) | (prmt(p01, p23, 0x7632) & 0x02020202u);
}

// The bytes of one row's group values v (the low bytes) as load_residual_group reads them:
// (tiles 0-1, tiles 2-3) from the pair words x[t] (value e of tile t in half e), plus `add`
// (mod 256 per byte).
template <int ADD>
__device__ __forceinline__ u32 bytes_plus(u32 a) {
  constexpr u32 C = (u32)(ADD & 0xff) * 0x01010101u;
  if constexpr ((ADD & 0xff) == 0) return a;
  else if constexpr ((ADD & 0xff) == 0x80) return a ^ 0x80808080u;
  else return ((a & 0x7f7f7f7fu) + (C & 0x7f7f7f7fu)) ^ ((a ^ C) & 0x80808080u);
}

// Output J (-1: the mid value) of one row's group from its pair words x[t] (tile t's qo of
// columns e = 0, 1 in the 16-bit halves): bytes stored now, bit planes into this lane's word
// of the group (bit 8t + e; shifted by 2 t4 at the store).
template <int J, int MODE, int BITS>
__device__ __forceinline__ void group_output(const u32 (&x)[GROUP_TILES], void* dst, const ByteRow& r,
                                             int gc, int t4, int word, const BlockEndArgs& be,
                                             u32 (&words)[FLUSH_TILES][BITS]) {
  if constexpr (J >= 0 && DerivedOut<J>::PAIR_CMP) {
    static_assert(J < 0 || GROUP_TILES == 4, "bit planes: whole 32-column words per warp");
    u32 hit[3][4];  // per level k and tile: qo >= T_k - MID_LO in the halves' top bits
#pragma unroll
    for (int k = 0; k < DerivedOut<J>::LEVELS; ++k)
#pragma unroll
      for (int t = 0; t < 4; ++t) hit[k][t] = x[t] + (u32)be.thr[J][k];
    if constexpr (DerivedOut<J>::LEVELS == 1) {
      const u32 w = gather_plane_bits(hit[0][0], hit[0][1], hit[0][2], hit[0][3]);
      words[word][0] = (DerivedOut<J>::QMIN & 1) ? ~w & 0x03030303u : w;
    } else {  // bit 1: level >= 2 (T_1); bit 0: T_2 in the upper half, T_0 in the lower
      u32 lo[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) lo[t] = (hit[1][t] & hit[2][t]) | (~hit[1][t] & hit[0][t]);
      const u32 w1 = gather_plane_bits(hit[1][0], hit[1][1], hit[1][2], hit[1][3]);
      words[word][0] = gather_plane_bits(lo[0], lo[1], lo[2], lo[3]);
      words[word][1] = ((DerivedOut<J>::QMIN >> 1) & 1) ? ~w1 & 0x03030303u : w1;
    }
  } else {
    GroupValues v;  // the values' low bytes (mid: q; derived: the table's)
#pragma unroll
    for (int t = 0; t < GROUP_TILES; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int qo = (int)(e ? x[t] >> 16 : x[t] & 0xffffu);
        if constexpr (J < 0) v[t][e] = qo + MID_LO;
        else v[t][e] = derived_byte<J>(qo, be);
      }
    if constexpr (MODE == 2) {
      if constexpr (QUAD8 && J < 0) {  // the pair words' bytes, MID_LO added back bytewise
        const u32 a = bytes_plus<MID_LO>(prmt(x[0], x[1], 0x6420));
        const u32 b = bytes_plus<MID_LO>(prmt(x[2], x[3], 0x6420));
        store_quad_bytes(dst, r, gc, t4, a, b);
      } else {
        store_group_bytes(dst, r, gc, t4, v);
      }
    } else if constexpr (MODE == 3) {
#pragma unroll
      for (int t = 0; t < GROUP_TILES; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int b = 0; b < BITS; ++b)
            or_if(words[word][b], ((v[t][e] >> b) & 1) != 0, 1u << (t * 8 + e));
    }
  }
}

typedef u32 MidWords[MT][2][FLUSH_TILES][MID_PLANES ? OUT_BITS : 1];
typedef u32 D0Words[MT][2][FLUSH_TILES][D0_MODE == 3 ? D0_BITS : 1];
typedef u32 D1Words[MT][2][FLUSH_TILES][D1_MODE == 3 ? D1_BITS : 1];
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
  ByteRow brow[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      brow[mi][h] = byte_row(rows.m[mi][h], n0 + col0 + (QUAD8 ? 8 : 2) * t4);
  MidWords mid_words;
  D0Words d0_words;
  D1Words d1_words;
  zero_words(mid_words);
  zero_words(d0_words);
  zero_words(d1_words);
  uint2 quads[COL_GROUPS][MT][2];  // QUAD8: every group's residual words, loaded up front
#pragma unroll
  for (int gi = 0; gi < COL_GROUPS; ++gi)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) quads[gi][mi][h] = residual_quad(ea, brow[mi][h], gi * GROUP_TILES * 8);
#pragma unroll
  for (int gi = 0; gi < COL_GROUPS; ++gi) {
    const int gc = gi * GROUP_TILES * 8, gcol = n0 + col0 + gc;
    GroupValues res[MT][2], q[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) load_residual_group(ea, brow[mi][h], gc, t4, quads[gi][mi][h], res[mi][h]);
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
      // the exact accumulator of row (mi, h), column col + e
      const auto acc_at = [&](int mi, int h, int e) {
        int y = rows.term[mi][h];
        if constexpr (NEED_WTAP && !BORDER) {
          if (col + e < KOUT) y += ea.wtap[WSUM0 + FULL_RECT * KPAD + col + e];
        }
        if constexpr (SPLIT_K > 1) {
          y += e ? (int)splits[mi][h].y : (int)splits[mi][h].x;
        } else {
          y += plane_dot(acc, mi, ni, 2 * h + e);
        }
        if constexpr (BORDER) y += e ? (int)wpair[mi][h].y : (int)wpair[mi][h].x;
        return y;
      };
      // GUARDED, rarely taken: column e's sums again, those near a step in 64 bits
      const auto redo_column = [&](int e) {
        const uint4* wide = ctab + KPAD;
        const uint4 c = ctab[col + e], c64 = wide[2 * (col + e)], d64 = sum64_rest(wide, col + e);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int y = acc_at(mi, h, e), u = res[mi][h][t][e];
            const u32 z = (u32)y * c.x + c.y + (u32)u * c.z;
            if ((z & c.w & ~31u) == 0u) q[mi][h][t][e] = clamp_mid(requant64(y, u, c64, d64));
          }
      };
      bool redo = false;  // GUARDED: some sum of this tile (REDO_TILES) or column near a step
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // {m, b + 2^(s-1), r, s}; SUM64: {m, s, c lo, c hi}, then d = {r lo, r hi, s - 32, 0};
        // GUARDED: {m, b + 2^(s-1) - o r + B/2, r, s | 2^s - B}, the SUM64 entries past KPAD
        constexpr bool WIDE = SUM64 && !GUARDED;
        const uint4 c = ctab[WIDE ? 2 * (col + e) : col + e];
        const uint4 d = WIDE ? sum64_rest(ctab, col + e) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int y = acc_at(mi, h, e);
            int v;
            if constexpr (GUARDED) {  // z + B/2: bits log2(B) .. s - 1 all zero (its remainder
              // below B) mark z within B/2 of a step (redone below), else (z + B/2) >> s = z >> s
              const u32 z = (u32)y * c.x + c.y + (u32)res[mi][h][t][e] * c.z;
              v = (int)z >> (int)(c.w & 31u);
              redo |= (z & c.w & ~31u) == 0u;
            } else if constexpr (SUM64) {
              v = requant64(y, res[mi][h][t][e], c, d);
            } else {
              const int z = y * (int)c.x + (int)c.y + res[mi][h][t][e] * (int)c.z;
              v = z >> (int)c.w;
            }
            q[mi][h][t][e] = clamp_mid(v);
          }
        if constexpr (GUARDED && !REDO_TILES) {
          if (redo) redo_column(e);
          redo = false;
        }
      }
      if constexpr (GUARDED && REDO_TILES) {
        if (redo) {
          redo_column(0);
          redo_column(1);
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const ByteRow& r = brow[mi][h];
        u32 x[GROUP_TILES];  // tile t's qo of columns e = 0, 1 in the 16-bit halves
#pragma unroll
        for (int t = 0; t < GROUP_TILES; ++t) x[t] = prmt(q[mi][h][t][0], q[mi][h][t][1], 0x5410);
        const int word = gi % FLUSH_TILES;
        if constexpr (STORE_OUT)
          group_output<-1, OUT_MODE>(x, ea.out, r, gc, t4, word, ea.be, mid_words[mi][h]);
        if constexpr (N_DERIVED > 0)
          group_output<0, D0_MODE>(x, ea.be.derived[0], r, gc, t4, word, ea.be, d0_words[mi][h]);
        if constexpr (N_DERIVED > 1)
          group_output<1, D1_MODE>(x, ea.be.derived[1], r, gc, t4, word, ea.be, d1_words[mi][h]);
      }
    if constexpr (ANY_PLANES) {
      if ((gi + 1) % FLUSH_TILES == 0) {
        const int word0 = (n0 + col0) / 32 + gi + 1 - FLUSH_TILES;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = rows.m[mi][h];
            if constexpr (MID_PLANES)
              store_plane_words(reinterpret_cast<u32*>(ea.out), mid_words[mi][h], m, word0, t4);
            if constexpr (D0_MODE == 3)
              store_plane_words(reinterpret_cast<u32*>(ea.be.derived[0]), d0_words[mi][h], m,
                                word0, t4);
            if constexpr (D1_MODE == 3)
              store_plane_words(reinterpret_cast<u32*>(ea.be.derived[1]), d1_words[mi][h], m,
                                word0, t4);
          }
        zero_words(mid_words);
        zero_words(d0_words);
        zero_words(d1_words);
      }
    }
  }
}
