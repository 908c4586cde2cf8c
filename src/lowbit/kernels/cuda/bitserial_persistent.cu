// Persistent blocks, pipelined across tiles. Needs bitserial_common.cu before it.

extern "C" __global__ void __launch_bounds__(THREADS) bitserial_persistent(
    const u32* __restrict__ x, const u32* __restrict__ w, void* __restrict__ out,
    const int* __restrict__ bias, const float* __restrict__ scale,
    const int* __restrict__ mult, const int* __restrict__ shift, const int* __restrict__ wtap) {
  extern __shared__ __align__(16) u32 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  // Persistent block: tiles blockIdx.x, +gridDim.x, ...; the cp.async pipeline runs across tile
  // boundaries, so the next tile's operands load while this one's epilogue runs.
  const int my_tiles = (N_TILES - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int iters = my_tiles * KTILES;

  auto load_tile = [&](int it, int stage) {
    const int tile = (int)blockIdx.x + (it / KTILES) * (int)gridDim.x;
    const int kt = it % KTILES;
    const int tm0 = (tile / N_COL_TILES) * BM, tn0 = (tile % N_COL_TILES) * BN;
    u32* sa = smem + stage * STAGE_WORDS;
    u32* sb = sa + A_STAGE_WORDS;
    const int kbase = kt * TILE_WORDS;
#pragma unroll
    for (int it2 = 0; it2 < A_ITERS; ++it2) {
      const int idx = tid + it2 * THREADS;
      if ((BM * CPR) % THREADS == 0 || idx < BM * CPR) {
        const int row = idx / CPR, c = idx % CPR;
        const int kw = kbase + c * VEC;
        const int m = tm0 + row;
        const int qo = m % Q_OUT, t = m / Q_OUT;
        const int po = t % P_OUT, img = t / P_OUT;
        const int tap = kw / CW, cw = kw - tap * CW;
        const int r = tap / S, s = tap - r * S;
        const int ih = po * STRIDE - PAD + r, iw = qo * STRIDE - PAD + s;
        const bool valid = m < M_ROWS && kw < KW && ih >= 0 && ih < H && iw >= 0 && iw < W;
        const i64 src = valid ? (((i64)img * H + ih) * W + iw) * CW + cw : 0;
        u32* dst = sa + ((c / (8 / VEC)) * BM + row) * 8 + (c % (8 / VEC)) * VEC;
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) copy_async(dst + i * A_PLANE_WORDS, x + i * X_PLANE + src, valid);
      }
    }
#pragma unroll
    for (int it2 = 0; it2 < B_ITERS; ++it2) {
      const int idx = tid + it2 * THREADS;
      if ((BN * CPR) % THREADS == 0 || idx < BN * CPR) {
        const int row = idx / CPR, c = idx % CPR;
        const int kw = kbase + c * VEC;
        const bool valid = kw < KW && tn0 + row < KOUT;
        const i64 src = valid ? (i64)(tn0 + row) * KW + kw : 0;
        u32* dst = sb + ((c / (8 / VEC)) * BN + row) * 8 + (c % (8 / VEC)) * VEC;
#pragma unroll
        for (int j = 0; j < P_BITS; ++j) copy_async(dst + j * B_PLANE_WORDS, w + j * W_PLANE + src, valid);
      }
    }
  };

  int acc[Q_BITS][P_BITS][MT][NT][4];
  int rsum[Q_BITS][MT][4];
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int e = 0; e < 4; ++e) rsum[i][mi][e] = 0;
#pragma unroll
      for (int j = 0; j < P_BITS; ++j)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][mi][ni][e] = 0;
    }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < iters) load_tile(s, s);
    copy_commit();
  }

  const int g = lane >> 2, t4 = lane & 3;
  u32* s_out = smem + STAGES * STAGE_WORDS;  // [OUT_BITS][BM][BLOCK_WORDS] when PACK_IN_SMEM
  for (int it = 0; it < iters; ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();
    {
      const int next = it + STAGES - 1;
      if (next < iters) load_tile(next, next % STAGES);
      copy_commit();
    }
    const u32* sa = smem + (it % STAGES) * STAGE_WORDS;
    const u32* sb = sa + A_STAGE_WORDS;
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
          const u32* p = sa + i * A_PLANE_WORDS + (ks * BM + warp_m * WM + mi * 16 + g) * 8 + 2 * t4;
          const uint2 lo = *reinterpret_cast<const uint2*>(p);
          const uint2 hi = *reinterpret_cast<const uint2*>(p + 64);
          af[i][mi][0] = lo.x; af[i][mi][1] = hi.x; af[i][mi][2] = lo.y; af[i][mi][3] = hi.y;
        }
#pragma unroll
      for (int j = 0; j < P_BITS; ++j)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const u32* p = sb + j * B_PLANE_WORDS + (ks * BN + warp_n * WN + ni * 8 + g) * 8 + 2 * t4;
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
          if constexpr (NEED_ROWSUM) mma_and(rsum[i][mi], af[i][mi], 0xffffffffu, 0xffffffffu);
        }
    }
    if (it % KTILES != KTILES - 1) continue;

  // ---- fused epilogue of this tile (the next tiles' copies are in flight) ----
  {
  const int tile = (int)blockIdx.x + (it / KTILES) * (int)gridDim.x;
  const i64 m0 = (i64)(tile / N_COL_TILES) * BM;
  const int n0 = (tile % N_COL_TILES) * BN;
  if constexpr (PACK_IN_SMEM) {
    __syncthreads();  // every warp is done reading the operand tiles
    for (int i = tid; i < OUT_BITS * BM * BLOCK_WORDS; i += THREADS) s_out[i] = 0;
    __syncthreads();
  }
  int col_bias[NT][2], col_mult[NT][2], col_shift[NT][2];
  float col_scale[NT][2];
#pragma unroll
  for (int ni = 0; ni < NT; ++ni)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + warp_n * WN + ni * 8 + 2 * t4 + e;
      const bool ok = col < KOUT;
      col_bias[ni][e] = (HAS_BIAS && ok) ? bias[col] : 0;
      col_scale[ni][e] = (OUT_MODE == 1 && ok) ? scale[col] : 0.f;
      col_mult[ni][e] = (OUT_MODE >= 2 && ok) ? mult[col] : 0;
      col_shift[ni][e] = (OUT_MODE >= 2 && ok) ? shift[col] : 1;
    }

#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_m * WM + mi * 16 + g + 8 * h;
      const i64 m = m0 + row;
      const bool row_ok = m < M_ROWS;
      // valid taps of this output pixel (input-aware padding)
      int rlo = 0, rhi = R, slo = 0, shi = S;
      if constexpr (NEED_WTAP) {
        const int qo = (int)(m % Q_OUT), po = (int)((m / Q_OUT) % P_OUT);
        tap_range(po * STRIDE - PAD, H, R, rlo, rhi);
        tap_range(qo * STRIDE - PAD, W, S, slo, shi);
      }
      // table offsets of the valid-tap rectangle [rlo, rhi) x [slo, shi)
      const int t11 = rhi * (S + 1) + shi, t01 = rlo * (S + 1) + shi;
      const int t10 = rhi * (S + 1) + slo, t00 = rlo * (S + 1) + slo;
      int row_term = 0;
      if constexpr (NEED_ROWSUM) {
#pragma unroll
        for (int i = 0; i < Q_BITS; ++i) row_term += a_coef(i) * rsum[i][mi][2 * h];
        row_term *= A_ALPHA * W_BETA;
      }
      if constexpr (NEED_WTAP) row_term += A_BETA * W_BETA * C * (rhi - rlo) * (shi - slo);

      int pats[NT][2];
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + warp_n * WN + ni * 8 + 2 * t4 + e;
          int y = 0;
#pragma unroll
          for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
            for (int j = 0; j < P_BITS; ++j) y += a_coef(i) * w_coef(j) * acc[i][j][mi][ni][2 * h + e];
          y = A_ALPHA * W_ALPHA * y + row_term;
          if constexpr (NEED_WTAP) {
            if (col < KOUT) {
              const int* wt = wtap + col * TAB;
              y += A_BETA * W_ALPHA * (wt[t11] - wt[t01] - wt[t10] + wt[t00]);
            }
          }
          if constexpr (HAS_BIAS) y += col_bias[ni][e];
          if constexpr (RELU) y = y > 0 ? y : 0;
          if constexpr (OUT_MODE == 0) {
            if (row_ok && col < KOUT) reinterpret_cast<int*>(out)[m * KOUT + col] = y;
          } else if constexpr (OUT_MODE == 1) {
            if (row_ok && col < KOUT)
              reinterpret_cast<unsigned short*>(out)[m * KOUT + col] =
                  f32_to_f16_bits(__fmul_rn((float)y, col_scale[ni][e]));
          } else {
            const int sh = col_shift[ni][e];
            i64 v = ((i64)y * col_mult[ni][e] + (1ll << (sh - 1))) >> sh;
            v = v < OUT_QMIN ? OUT_QMIN : (v > OUT_QMAX ? OUT_QMAX : v);
            const int pat = col < KOUT ? ((int)v & ((1 << OUT_BITS) - 1)) : 0;
            if constexpr (OUT_MODE == 2) {  // one byte per value: two's complement of all 8 bits
              if (row_ok && col < KOUT) reinterpret_cast<unsigned char*>(out)[m * KOUT + col] = (unsigned char)(int)v;
            }
            pats[ni][e] = pat;
          }
        }
      if constexpr (PACK_IN_SMEM) {
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const int c0 = warp_n * WN + ni * 8;  // first column of this n8 tile in the block
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b) {
            u32 bits = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) bits |= (u32)((pats[ni][e] >> b) & 1) << (c0 % 32 + 2 * t4 + e);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
            if (t4 == 0) atomicOr(&s_out[(b * BM + row) * BLOCK_WORDS + c0 / 32], bits);
          }
        }
      } else if constexpr (OUT_MODE == 3) {
        // Register-level packing of the output bit planes: each lane of a quad holds 2 of every
        // 8 columns; OR-reduce across the quad with two shuffles per 32-column word and plane.
#pragma unroll
        for (int wd = 0; wd < WN / 32; ++wd)
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b) {
            u32 bits = 0;
#pragma unroll
            for (int n4 = 0; n4 < 4; ++n4)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                bits |= (u32)((pats[wd * 4 + n4][e] >> b) & 1) << (n4 * 8 + 2 * t4 + e);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
            const int word = (n0 + warp_n * WN) / 32 + wd;
            if (t4 == (b & 3) && row_ok && word < OUT_WORDS)
              reinterpret_cast<u32*>(out)[((i64)b * M_ROWS + m) * OUT_WORDS + word] = bits;
          }
      }
    }
  if constexpr (PACK_IN_SMEM) {
    __syncthreads();
    for (int i = tid; i < OUT_BITS * BM * BLOCK_WORDS; i += THREADS) {
      const int wd = i % BLOCK_WORDS, row = (i / BLOCK_WORDS) % BM, b = i / (BLOCK_WORDS * BM);
      const i64 m = m0 + row;
      const int word = n0 / 32 + wd;
      if (m < M_ROWS && word < OUT_WORDS)
        reinterpret_cast<u32*>(out)[((i64)b * M_ROWS + m) * OUT_WORDS + word] = s_out[i];
    }
  }
  }  // epilogue
#pragma unroll
  for (int i = 0; i < Q_BITS; ++i)
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int e = 0; e < 4; ++e) rsum[i][mi][e] = 0;
#pragma unroll
      for (int j = 0; j < P_BITS; ++j)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][mi][ni][e] = 0;
    }
  }  // tile loop
  copy_wait<0>();
}
