// Warp-specialized first layer: the kernel (roles in stem_ws.cu's header).

struct StemDims {
  int N, H, W, sn, sc, sh, sw;
  float scale;
  int OH, OW, PH, PW, K, bands, band_rows, col_blocks, tiles;
};

struct StemTile {
  int n, t0, steps, jt0, xs0;  // image, first pooled row, steps, first pooled column, s2d col
};

__device__ __forceinline__ StemTile stem_tile(const StemDims& d, int tile) {
  StemTile s;
  const int cb = tile % d.col_blocks;
  const int band = (tile / d.col_blocks) % d.bands;
  s.n = tile / (d.col_blocks * d.bands);
  s.t0 = band * d.band_rows;
  s.steps = min(s.t0 + d.band_rows, d.PH) - s.t0 + 1;  // step t0 - 1 first: the carried row
  s.jt0 = cb * JT;
  s.xs0 = 2 * s.jt0 - PP - 1;
  return s;
}

// ------------------------------------------------------------------ producer
// A fill is pair k of space-to-depth rows (2k - PP + 1 + r, r = 0, 1) of a tile: FILL_ROWS
// image rows (r, d, c) of IXS columns; lane l holds columns l + 32 m (m < MC) of each, so a
// value's image offset and ring byte are a row part (per fill) plus a column part (per tile).
struct FillColumns {
  int off[MC];   // image offset of column m (ix * sw)
  int byte[MC];  // ring byte of column m within its pixel row
  u32 ok;        // bit m: column m inside the image
  u32 in_tile;   // bit m: column m one of the tile's IXS
};

__device__ __forceinline__ FillColumns fill_columns(const StemDims& d, const StemTile& s,
                                                    int lane) {
  FillColumns fc;
  fc.ok = fc.in_tile = 0;
#pragma unroll
  for (int m = 0; m < MC; ++m) {
    const int ixl = lane + 32 * m;
    const int ix = 2 * (s.xs0 - PS) + ixl;
    fc.off[m] = ix * d.sw;
    fc.byte[m] = (ixl >> 1) * CP + (ixl & 1);
    if (ixl < IXS) fc.in_tile |= 1u << m;
    if (ixl < IXS && ix >= 0 && ix < d.W) fc.ok |= 1u << m;
  }
  return fc;
}

// image row (r, d, c) = row `rho` of fill k: its offset; false outside the image
__device__ __forceinline__ bool fill_row(const StemDims& d, const StemTile& s, int k, int rho,
                                         i64& off) {
  const int c = rho % C, rd = rho / C;
  const int iy = 2 * (2 * k - PP + 1 + (rd >> 1) - PS) + (rd & 1);
  off = (i64)s.n * d.sn + (i64)c * d.sc + (i64)iy * d.sh;
  return iy >= 0 && iy < d.H;
}

template <int CI, class T>
__device__ __forceinline__ void load_chunk(const T* x, const StemDims& d, const StemTile& s,
                                           const FillColumns& fc, int k, T (&v)[EPC]) {
#pragma unroll
  for (int rr = 0; rr < RPC; ++rr) {
    i64 off;
    const bool row_ok = CI * RPC + rr < FILL_ROWS && fill_row(d, s, k, CI * RPC + rr, off);
#pragma unroll
    for (int m = 0; m < MC; ++m)
      v[rr * MC + m] = row_ok && (fc.ok >> m & 1) ? (x + off)[fc.off[m]] : (T)0;
  }
}

// The quantized value of a float x, clamp(floor(x / scale + 0.5), QMIN, QMAX) with IEEE
// division and addition (`quantize_value`), without a division: the candidate
// k = clamp(floor(fma(x, 1 / scale, 0.5 - QMIN)), 0, 255) is the exact index x's value - QMIN
// or a neighbour (1 / scale a normal float: `stem_ws.float_thresholds`), so with step k of
// the table (base QMIN + k and thresholds T(k), T(k + 1), T(l) the least float of value
// QMIN + l; past the last level: base QMAX, no thresholds) x's value is
// base + [x >= T(k + 1)] - [x < T(k)] (a missing threshold is NaN: no comparison holds).
// Non-finite x: some value in [QMIN, QMAX + 1] (flagged by the caller).
struct alignas(16) QuantStep {
  float lo, hi;
  int base, unused;
};

__device__ __forceinline__ int quantize_by_thresholds(float x, float inv,
                                                      const QuantStep* steps) {
  const QuantStep t = steps[saturate_index(fmaf(x, inv, 0.5f - (float)QMIN))];
  const int up = x >= t.hi ? -1 : 0, down = x < t.lo ? -1 : 0;
  return t.base - up + down;
}

template <int CI, class T>
__device__ __forceinline__ void store_chunk(u8* slot, const s8* table, const StemDims& d,
                                            const StemTile& s, const FillColumns& fc, int k,
                                            const T (&v)[EPC], float inv, float& nonfinite) {
#pragma unroll
  for (int rr = 0; rr < RPC; ++rr) {
    const int rho = CI * RPC + rr;
    if (rho >= FILL_ROWS) continue;
    const int c = rho % C, rd = rho / C;
    i64 off;
    const bool row_ok = fill_row(d, s, k, rho, off);  // (a uint8 0 is not quantized to 0)
    u8* row = slot + (rd >> 1) * ROW_BYTES + ((rd & 1) * C + c) * 2;
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      if (32 * m >= IXS) continue;
      int q;
      if constexpr (U8_INPUT) {
        q = row_ok && (fc.ok >> m & 1) ? (int)table[c * 256 + (int)v[rr * MC + m]] : 0;
      } else {
        const float xf = (float)v[rr * MC + m];
        // x 0 = 0 for finite x, NaN for inf or nan (outside the image x is 0)
        if constexpr (HAS_STATUS) nonfinite = fmaf(xf, 0.0f, nonfinite);
        if constexpr (DIV_QUANT) q = quantize_value(xf, d.scale);
        else q = quantize_by_thresholds(xf, inv, (const QuantStep*)table);
      }
      if (32 * (m + 1) <= IXS || (fc.in_tile >> m & 1)) row[fc.byte[m]] = (u8)q;
    }
  }
}

// chunks CI.. of a fill, chunk CI loaded into `now`: the next chunk's loads are issued
// before this one is quantized, so they are in flight meanwhile
template <int CI, class T>
__device__ __forceinline__ void fill_chunks(const T* x, u8* ring, const s8* table,
                                            const StemDims& d, const StemTile& s,
                                            const FillColumns& fc, int k, T (&now)[EPC],
                                            T (&next)[EPC], float inv, float& nonfinite) {
  if constexpr (CI < NCHUNK) {
    if constexpr (CI + 1 < NCHUNK) load_chunk<CI + 1>(x, d, s, fc, k, next);
    store_chunk<CI>(ring, table, d, s, fc, k, now, inv, nonfinite);
    fill_chunks<CI + 1>(x, ring, table, d, s, fc, k, next, now, inv, nonfinite);
  }
}

template <class T>
__device__ void produce(const T* x, u8* smem, const StemDims& d, int* status, int pwarp,
                        int lane) {
  u64* full = (u64*)(smem + SM_BARS);
  u64* empty = full + NSLOT;
  const s8* table = (const s8*)(smem + SM_TABLE);
  const float inv = __fdiv_rn(1.0f, d.scale);  // correctly rounded
  float nonfinite = 0.0f;  // NaN once a non-finite image value was seen
  i64 f = 0;  // fills of this CTA so far (slot f % NSLOT)
  for (int tile = blockIdx.x; tile < d.tiles; tile += gridDim.x) {
    const StemTile s = stem_tile(d, tile);
    const FillColumns fc = fill_columns(d, s, lane);
    for (int q = 0; q < s.steps + 2; ++q, ++f) {
      if (f % PRODUCER_WARPS != pwarp) continue;
      const int k = s.t0 - 1 + q, slot = (int)(f % NSLOT);
      u8* ring = smem + slot * SLOT_BYTES;
      T va[EPC], vb[EPC];
      load_chunk<0>(x, d, s, fc, k, va);
      if (f >= NSLOT) mbar_wait(&empty[slot], (int)((f / NSLOT - 1) & 1));
      fill_chunks<0>(x, ring, table, d, s, fc, k, va, vb, inv, nonfinite);
      mbar_arrive(&full[slot]);
    }
  }
  // the last fills' "empty" phases, so that every phase completes
  for (i64 g = f; g < f + NSLOT; ++g) {
    if (g % PRODUCER_WARPS == pwarp && g >= NSLOT) {
      mbar_wait(&empty[g % NSLOT], (int)((g / NSLOT - 1) & 1));
    }
  }
  if (HAS_STATUS && nonfinite != nonfinite) flag_status(status);
}

// ------------------------------------------------------------------ consumer
// Output o of 4 pooled int32 values y[mt][hr] (channels 32h + 16 mt + 8 hr + g of the CTA's
// block) at pooled pixel pix, stored where `valid` (the pixel) and the channel is < K.
template <int KIND, int LAYOUT, int BITS, int LO, int HI>
__device__ __forceinline__ void write_output(void* out, const int* epi, const int (&y)[2][2],
                                             const StemDims& d, int c0, int h, int g,
                                             i64 pix, bool valid) {
  if constexpr (KIND == 0) return;
  int q[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int* e = epi + (32 * h + 16 * mt + 8 * hr + g) * EPI_WORDS;
      if constexpr (KIND == 1) {  // thresholds: LO + #{l : y >= T[l]}
        int v = LO;
#pragma unroll
        for (int l = 0; l < HI - LO; ++l) v += y[mt][hr] >= e[l] ? 1 : 0;
        q[mt][hr] = v;
      } else if constexpr (KIND == 4) {  // floor((y m + c) / 2^s), every partial sum int32
        const int v = (int)((u32)y[mt][hr] * (u32)e[0] + (u32)e[2]) >> e[1];
        q[mt][hr] = min(max(v, LO), HI);
      } else if constexpr (KIND == 2) {  // floor((y m + c) / 2^s): the sum int64, the quotient
        const i64 c = (i64)(((u64)(u32)e[3] << 32) | (u32)e[2]);  // int32 (host bound)
        const int v = (int)(((i64)y[mt][hr] * (i64)e[0] + c) >> e[1]);
        q[mt][hr] = min(max(v, LO), HI);
      } else {  // floor((y m + b + 2^(s-1)) / 2^s), b + 2^(s-1) split at 2^s on the host
        const int sh = e[1];
        const i64 hi = (i64)(((u64)(u32)e[3] << 32) | (u32)e[2]);
        const i64 lo = (i64)(((u64)(u32)e[5] << 32) | (u32)e[4]);
        const i64 p = (i64)y[mt][hr] * (i64)e[0];
        const i64 mask = (1LL << sh) - 1;
        i64 v = (p >> sh) + hi + (((p & mask) + lo) >> sh);
        v = v < LO ? LO : (v > HI ? HI : v);
        q[mt][hr] = (int)v;
      }
    }
  if constexpr (LAYOUT == 0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int ch = c0 + 32 * h + 16 * mt + 8 * hr + g;
        if (valid && ch < d.K) ((u8*)out)[pix * d.K + ch] = (u8)q[mt][hr];
      }
  } else {
    const int kw = (d.K + 31) / 32;
    const i64 plane = (i64)d.N * d.PH * d.PW * kw;
    const int word = c0 / 32 + h;
#pragma unroll
    for (int b = 0; b < BITS; ++b) {
      u32 bits = 0;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int pos = 16 * mt + 8 * hr + g;
          if (32 * word + pos < d.K) bits |= (u32)((q[mt][hr] >> b) & 1) << pos;
        }
      bits |= __shfl_xor_sync(0xffffffffu, bits, 4);
      bits |= __shfl_xor_sync(0xffffffffu, bits, 8);
      bits |= __shfl_xor_sync(0xffffffffu, bits, 16);
      if (valid && g == 0 && word < kw) ((u32*)out)[b * plane + pix * kw + word] = bits;
    }
  }
}

__device__ void consume(const u8* __restrict__ w, u8* smem, const StemDims& d, void* out0,
                        void* out1, void* out2, int cw, int lane) {
  u64* full = (u64*)(smem + SM_BARS);
  u64* empty = full + NSLOT;
  const int* epi = (const int*)(smem + SM_EPI);
  const int* bias = (const int*)(smem + SM_BIAS);
  const int h = cw & 1, gi = cw >> 1;
  const int g = lane >> 2, tq = lane & 3;
  const int c0 = blockIdx.y * KBLOCK;
  int* carry = (int*)(smem + SM_CARRY) + 32 * cw + lane;
  // the weights of channels c0 + 32h + 16 mt + (g, g + 8) as mma A fragments
  u32 wa[2][KCH][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int kc = 0; kc < KCH; ++kc)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int ch = c0 + 32 * h + 16 * mt + g + 8 * (r & 1);
        wa[mt][kc][r] = *(const u32*)(w + (i64)ch * KBYTES + 32 * kc + 16 * (r >> 1) + 4 * tq);
      }
  int bch[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) bch[mt][hr] = bias[32 * h + 16 * mt + 8 * hr + g];
  i64 f = 0;  // the tile's first fill
  for (int tile = blockIdx.x; tile < d.tiles; tile += gridDim.x) {
    const StemTile s = stem_tile(d, tile);
    // the pooled columns' max over the previous step's second row, [nt][mt][hr] of this
    // thread (no value of the tile's first step is written)
    for (int i = 0; i < s.steps; ++i) {
      const int t = s.t0 - 1 + i;
      if (i == 0) {
        mbar_wait(&full[f % NSLOT], (int)((f / NSLOT) & 1));
        mbar_wait(&full[(f + 1) % NSLOT], (int)(((f + 1) / NSLOT) & 1));
      }
      const i64 fn = f + i + 2;
      mbar_wait(&full[fn % NSLOT], (int)((fn / NSLOT) & 1));
      // ring rows 2t - PP + 1 .. 2t - PP + 5: pairs t, t + 1 and the first row of t + 2
      u32 rows[5];
#pragma unroll
      for (int r = 0; r < 5; ++r) rows[r] = (u32)(((f + i + r / 2) % NSLOT) * SLOT_BYTES
                                                  + (r & 1) * ROW_BYTES);
      const int oh = 2 * t - PP + 1;
      const bool row_ok[2] = {oh >= 0 && oh < d.OH, oh + 1 >= 0 && oh + 1 < d.OH};
      int prev[2][2][2];  // the previous n-tile's second column (rows, mt, hr), lane t = 3
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) prev[x][mt][0] = prev[x][mt][1] = INT32_LOW;
#pragma unroll
      for (int nt = 0; nt < NT_W; ++nt) {
        int acc[2][2][4];
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[x][mt][r] = 0;
        const u32 col = (u32)((2 * gi * JW + 8 * nt + g) * CP + 4 * tq);
#pragma unroll
        for (int kc = 0; kc < KCH; ++kc)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const u32 b0 = *(const u32*)(smem + rows[(2 * kc) / C + x] + col
                                         + ((2 * kc) % C) * 16);
            const u32 b1 = *(const u32*)(smem + rows[(2 * kc + 1) / C + x] + col
                                         + ((2 * kc + 1) % C) * 16);
            mma(acc[x][0], wa[0][kc], b0, b1);
            mma(acc[x][1], wa[1][kc], b0, b1);
          }
        // conv columns of this lane's pair; positions outside the conv output pool as -inf
        const int cc = s.xs0 + 2 * gi * JW + 8 * nt + 2 * tq;
        const bool col_ok[2] = {cc >= 0 && cc < d.OW, cc + 1 >= 0 && cc + 1 < d.OW};
        int pooled[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            int hm[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              const int a = row_ok[x] && col_ok[0] ? acc[x][mt][2 * hr] : INT32_LOW;
              const int b = row_ok[x] && col_ok[1] ? acc[x][mt][2 * hr + 1] : INT32_LOW;
              // the window's first column: the previous pair's second (lane t - 1, or for
              // t = 0 the previous n-tile's lane t = 3)
              const int send = tq == 3 ? prev[x][mt][hr] : b;
              const int got = __shfl_sync(0xffffffffu, send, (lane & ~3) | ((tq + 3) & 3));
              prev[x][mt][hr] = b;
              hm[x] = max(got, max(a, b));
            }
            int& kept = carry[((nt * 2 + mt) * 2 + hr) * CONSUMERS];
            pooled[mt][hr] = max(kept, max(hm[0], hm[1]));
            kept = hm[1];
          }
        if (i > 0) {
          const int j = s.jt0 + gi * JW - 1 + 4 * nt + tq;
          const bool valid = (nt > 0 || tq > 0) && j < d.PW;
          const i64 pix = ((i64)s.n * d.PH + t) * d.PW + j;
          int y[2][2];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
              y[mt][hr] = (int)((u32)pooled[mt][hr] + (u32)bch[mt][hr]);
          write_output<OUT0_KIND, OUT0_LAYOUT, OUT0_BITS, OUT0_LO, OUT0_HI>(
              out0, epi, y, d, c0, h, g, pix, valid);
          write_output<OUT1_KIND, OUT1_LAYOUT, OUT1_BITS, OUT1_LO, OUT1_HI>(
              out1, epi + KBLOCK * EPI_WORDS, y, d, c0, h, g, pix, valid);
          write_output<OUT2_KIND, OUT2_LAYOUT, OUT2_BITS, OUT2_LO, OUT2_HI>(
              out2, epi + 2 * KBLOCK * EPI_WORDS, y, d, c0, h, g, pix, valid);
        }
      }
      mbar_arrive(&empty[(f + i) % NSLOT]);  // pair t is read by no later step
    }
    mbar_arrive(&empty[(f + s.steps) % NSLOT]);
    mbar_arrive(&empty[(f + s.steps + 1) % NSLOT]);
    f += s.steps + 2;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
stem_ws(const void* __restrict__ x, const s8* __restrict__ table, const u8* __restrict__ w,
        const int* __restrict__ epi, const int* __restrict__ bias, void* out0, void* out1,
        void* out2, int* status, int N, int H, int W, int sn, int sc, int sh, int sw,
        float scale, int OH, int OW, int PH, int PW, int K, int bands, int band_rows,
        int col_blocks, int tiles) {
  DECLARE_SMEM(smem);
  const StemDims d{N, H, W, sn, sc, sh, sw, scale, OH, OW, PH, PW, K, bands, band_rows,
                   col_blocks, tiles};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int c0 = blockIdx.y * KBLOCK;
  // the CTA's epilogue constants, bias and table; the ring's mbarriers
  for (int i = tid; i < NOUT * KBLOCK * EPI_WORDS; i += THREADS) {
    const int o = i / (KBLOCK * EPI_WORDS), r = i % (KBLOCK * EPI_WORDS);
    ((int*)(smem + SM_EPI))[i] = epi[((i64)o * gridDim.y * KBLOCK + c0) * EPI_WORDS + r];
  }
  for (int i = tid; i < KBLOCK; i += THREADS) ((int*)(smem + SM_BIAS))[i] = bias[c0 + i];
  for (int i = tid; i < TABLE_BYTES / 4; i += THREADS) {
    ((int*)(smem + SM_TABLE))[i] = ((const int*)table)[i];
  }
  if (tid == 0) {
    u64* bars = (u64*)(smem + SM_BARS);
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(&bars[s], 32);              // full: the filling producer warp
      mbar_init(&bars[NSLOT + s], CONSUMERS);  // empty: every consumer thread
    }
  }
  __syncthreads();
  if (warp < PRODUCER_WARPS) {
    if constexpr (U8_INPUT) produce((const u8*)x, smem, d, status, warp, lane);
    else produce((const float*)x, smem, d, status, warp, lane);
  } else {
    consume(w, smem, d, out0, out1, out2, warp - PRODUCER_WARPS, lane);
  }
}
