// Tiled mma.sync conv: the kernel (plain or duplicate-aware load, register-level packing).

// Output pixel (index into the N*P*Q rows of the output) of block-local row ml; -1 if none.
__device__ __forceinline__ int out_pixel(int ml) {
  if constexpr (DUP) {
    const int tile = blockIdx.x;
    const int n = tile / (TILES_P * TILES_Q);
    const int tpq = tile % (TILES_P * TILES_Q);
    const int p = (tpq / TILES_Q) * TP + ml / TQ;
    const int q = (tpq % TILES_Q) * TQ + ml % TQ;
    return (p < P && q < Q) ? (n * P + p) * Q + q : -1;
  } else {
    const int m = blockIdx.x * BM + ml;
    return m < M_TOTAL ? m : -1;
  }
}

__device__ __forceinline__ int clamp_q(i64 y, int mult, int shift) {
  i64 v = (y * (i64)mult + (1LL << (shift - 1))) >> shift;
  v = v < QMIN ? QMIN : v;
  v = v > QMAX ? QMAX : v;
  return (int)v;
}

__device__ __forceinline__ void store_bytes(u8* dst, u32 v, int n) {
  for (int i = 0; i < n; ++i) dst[i] = (u8)(v >> (8 * i));
}

extern "C" __global__ void __launch_bounds__(THREADS)
mma_conv(const u8* __restrict__ x, const u8* __restrict__ w, void* __restrict__ out,
         const int* __restrict__ bias, const float* __restrict__ scale,
         const int* __restrict__ mult, const int* __restrict__ shift) {
  DECLARE_SMEM(smem);
  int* row_pix = (int*)smem;                    // n*H*W of each block row (plain load)
  int* row_ih = row_pix + BM;                   // top input row of each block row
  int* row_iw = row_ih + BM;                    // left input column
  u8* sA = smem + ROWINFO;                      // [2][A_ROWS][KBP]
  u8* sB = sA + 2 * A_STAGE;                    // [2][BN][KBP]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp % WARPS_M;
  const int warp_n = warp / WARPS_M;
  const int n0 = blockIdx.y * BN;

  int dup_n = 0, dup_ih = 0, dup_iw = 0;        // halo origin (DUP)
  if constexpr (DUP) {
    const int tile = blockIdx.x;
    dup_n = tile / (TILES_P * TILES_Q);
    const int tpq = tile % (TILES_P * TILES_Q);
    dup_ih = (tpq / TILES_Q) * TP * STRIDE - PAD;
    dup_iw = (tpq % TILES_Q) * TQ * STRIDE - PAD;
  } else {
    for (int ml = tid; ml < BM; ml += THREADS) {
      const int m = blockIdx.x * BM + ml;
      if (m < M_TOTAL) {
        const int n = m / (P * Q), pq = m % (P * Q);
        row_pix[ml] = n * H * W;
        row_ih[ml] = (pq / Q) * STRIDE - PAD;
        row_iw[ml] = (pq % Q) * STRIDE - PAD;
      } else {
        row_pix[ml] = 0;
        row_ih[ml] = -(1 << 28);                // never inside the image
        row_iw[ml] = 0;
      }
    }
    __syncthreads();
  }

  auto step_rs = [](int t) { return LOOP_CRS ? t % RS : t / CHUNKS; };
  auto step_cc = [](int t) { return LOOP_CRS ? t / RS : t % CHUNKS; };

  auto load_step = [&](int t) {
    const int rs = step_rs(t), cc = step_cc(t);
    const int r = rs / S, s = rs % S;
    const int cb0 = cc * KB;
    u8* a_dst = sA + (DUP ? (cc & 1) : (t & 1)) * A_STAGE;
    if (!DUP || rs == 0) {
      for (int idx = tid; idx < A_ROWS * VPR; idx += THREADS) {
        const int row = idx / VPR, cb = cb0 + (idx % VPR) * VEC;
        int ih, iw, pix;
        if constexpr (DUP) {
          ih = dup_ih + row / HQ;
          iw = dup_iw + row % HQ;
          pix = dup_n * H * W;
        } else {
          ih = row_ih[row] + r;
          iw = row_iw[row] + s;
          pix = row_pix[row];
        }
        const bool ok = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W && cb < CB;
        const u8* src = ok ? x + (i64)(pix + ih * W + iw) * CB + cb : x;
        copy_vec(a_dst + row * KBP + (idx % VPR) * VEC, src, ok, cb == CB - 1);
      }
    }
    u8* b_dst = sB + (t & 1) * B_STAGE;
    for (int idx = tid; idx < BN * VPR; idx += THREADS) {
      const int row = idx / VPR, cb = cb0 + (idx % VPR) * VEC;
      const int kf = n0 + row;
      const bool ok = kf < K && cb < CB;
      const u8* src = ok ? w + ((i64)kf * RS + rs) * CB + cb : w;
      copy_vec(b_dst + row * KBP + (idx % VPR) * VEC, src, ok, cb == CB - 1);
    }
  };

  // ldmatrix row addresses: A rows of this lane for each m tile (without the (r, s) shift)
  int a_row[TILES_M];
#pragma unroll
  for (int i = 0; i < TILES_M; ++i) {
    const int ml = warp_m * TILES_M * 16 + i * 16 + (lane & 15);
    a_row[i] = DUP ? (ml / TQ) * STRIDE * HQ + (ml % TQ) * STRIDE : ml;
  }
  const int a_col = (lane >> 4) * 16;
  // B: x4 covers n tiles j, j+1 (lanes 0-15 tile j, 16-31 tile j+1); x2 only lanes 0-15
  const int b_row = warp_n * TILES_N * 8 + (lane >> 4) * 8 + (lane & 7);
  const int b_col = ((lane >> 3) & 1) * 16;

  int acc[TILES_M][TILES_N][4];
#pragma unroll
  for (int i = 0; i < TILES_M; ++i)
#pragma unroll
    for (int j = 0; j < TILES_N; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

  load_step(0);
  cp_async_commit();
  for (int t = 0; t < STEPS; ++t) {
    if (t + 1 < STEPS) load_step(t + 1);
    cp_async_commit();
    cp_async_wait1();
    __syncthreads();
    const int rs = step_rs(t), cc = step_cc(t);
    const int shift_rows = DUP ? (rs / S) * HQ + rs % S : 0;
    const u32 a_base = smem_u32(sA + (DUP ? (cc & 1) : (t & 1)) * A_STAGE);
    const u32 b_base = smem_u32(sB + (t & 1) * B_STAGE);
#pragma unroll
    for (int kk = 0; kk < KB; kk += 32) {
      u32 a[TILES_M][4];
      u32 b[TILES_N][2];
#pragma unroll
      for (int i = 0; i < TILES_M; ++i)
        ldmatrix_x4(a[i], a_base + (a_row[i] + shift_rows) * KBP + kk + a_col);
#pragma unroll
      for (int j = 0; j + 1 < TILES_N; j += 2) {
        u32 r4[4];
        ldmatrix_x4(r4, b_base + (b_row + j * 8) * KBP + kk + b_col);
        b[j][0] = r4[0]; b[j][1] = r4[1]; b[j + 1][0] = r4[2]; b[j + 1][1] = r4[3];
      }
      if constexpr (TILES_N % 2 == 1) {
        const int j = TILES_N - 1;
        ldmatrix_x2(b[j][0], b[j][1],
                    b_base + (b_row - (lane >> 4) * 8 + j * 8) * KBP + kk + b_col);
      }
#pragma unroll
      for (int i = 0; i < TILES_M; ++i)
#pragma unroll
        for (int j = 0; j < TILES_N; ++j) mma(acc[i][j], a[i], b[j][0], b[j][1]);
    }
    __syncthreads();
  }

  // ---- fused epilogue: bias, relu, then int32 / fp16 / requantize (+ pack) ----
  const int g = lane >> 2, tq4 = lane & 3;
  u8* sOut = smem;                               // [BM][BN] pattern bytes (STAGE_OUT)
#pragma unroll
  for (int j = 0; j < TILES_N; ++j) {
    const int nl = warp_n * TILES_N * 8 + j * 8 + 2 * tq4;   // block-local column of e = 0
    const int k0 = n0 + nl;
    i64 bv[2] = {0, 0};
    int mv[2] = {1, 1}, sv[2] = {1, 1};
    float scv[2] = {0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = k0 + e;
      if (k < K) {
        if (HAS_BIAS) bv[e] = bias[k];
        if (OUT_KIND == 1) scv[e] = scale[k];
        if (OUT_KIND >= 2) { mv[e] = mult[k]; sv[e] = shift[k]; }
      }
    }
#pragma unroll
    for (int i = 0; i < TILES_M; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {              // rows g and g + 8
        const int ml = warp_m * TILES_M * 16 + i * 16 + g + 8 * h;
        const int pix = out_pixel(ml);
        i64 y[2];
        int qv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          y[e] = (i64)acc[i][j][2 * h + e] + bv[e];
          if (RELU) y[e] = y[e] < 0 ? 0 : y[e];
          qv[e] = 0;
          if (OUT_KIND >= 2 && k0 + e < K) qv[e] = clamp_q(y[e], mv[e], sv[e]);
        }
        if constexpr (OUT_KIND == 0) {
          if (pix >= 0) {
            int* o = (int*)out + (i64)pix * K + k0;
            if (K % 2 == 0 && k0 < K) {
              *(int2*)o = make_int2((int)y[0], (int)y[1]);
            } else {
              for (int e = 0; e < 2; ++e) if (k0 + e < K) o[e] = (int)y[e];
            }
          }
        } else if constexpr (OUT_KIND == 1) {
          if (pix >= 0) {
            unsigned short* o = (unsigned short*)out + (i64)pix * K + k0;
            unsigned short hv[2];
            for (int e = 0; e < 2; ++e) hv[e] = to_half_bits(__ll2float_rn(y[e]) * scv[e]);
            if (K % 2 == 0 && k0 < K) {
              *(u32*)o = (u32)hv[0] | ((u32)hv[1] << 16);
            } else {
              for (int e = 0; e < 2; ++e) if (k0 + e < K) o[e] = hv[e];
            }
          }
        } else if constexpr (OUT_KIND == 2) {
          const u32 v16 = (u32)(qv[0] & 0xFF) | ((u32)(qv[1] & 0xFF) << 8);
          if constexpr (REG_PACK) {
            // lanes t and t^1 of the quad join their 2 bytes into one 4-byte word
            const u32 other = __shfl_xor_sync(0xffffffffu, v16, 1);
            if ((tq4 & 1) == 0 && pix >= 0) {
              u8* o = (u8*)out + (i64)pix * K + k0;
              const u32 word = v16 | (other << 16);
              if (K % 4 == 0 && k0 < K) *(u32*)o = word;
              else store_bytes(o, word, min(4, K - k0));
            }
          } else if (pix >= 0) {
            u8* o = (u8*)out + (i64)pix * K + k0;
            if (K % 2 == 0 && k0 < K) *(unsigned short*)o = (unsigned short)v16;
            else store_bytes(o, v16, min(2, K - k0));
          }
        } else {
          constexpr u32 MASK = (1u << OUT_BITS) - 1;
          const u32 pair = ((u32)qv[0] & MASK) | (((u32)qv[1] & MASK) << OUT_BITS);
          if constexpr (REG_PACK) {
            // the quad's 8 channels = 8*OUT_BITS bits: OR the four 2-channel pieces together
            u32 v = pair << (tq4 * 2 * OUT_BITS);
            v |= __shfl_xor_sync(0xffffffffu, v, 1);
            v |= __shfl_xor_sync(0xffffffffu, v, 2);
            if (tq4 == (j & 3) && pix >= 0) {
              const int byte0 = (k0 - 2 * tq4) * OUT_BITS / 8;   // tile start, whole bytes
              u8* o = (u8*)out + (i64)pix * OB + byte0;
              const int nbytes = min(OUT_BITS, OB - byte0);
              if (OUT_BITS == 4 && OB % 4 == 0 && nbytes == 4) *(u32*)o = v;
              else if (OUT_BITS == 2 && OB % 2 == 0 && nbytes == 2) *(ushort*)o = (ushort)v;
              else if (nbytes > 0) store_bytes(o, v, nbytes);
            }
          } else {
            sOut[ml * BN + nl] = (u8)(pair & MASK);
            sOut[ml * BN + nl + 1] = (u8)(pair >> OUT_BITS);
          }
        }
      }
    }
  }
  if constexpr (STAGE_OUT) {
    // second pass: each thread packs 8 / OUT_BITS consecutive pattern bytes into one byte
    constexpr int PER = 8 / OUT_BITS;
    constexpr int ROW_BYTES = BN / PER;
    __syncthreads();
    for (int idx = tid; idx < BM * ROW_BYTES; idx += THREADS) {
      const int ml = idx / ROW_BYTES, jb = idx % ROW_BYTES;
      const int pix = out_pixel(ml);
      const int byte = n0 * OUT_BITS / 8 + jb;
      if (pix < 0 || byte >= OB) continue;
      u32 v = 0;
#pragma unroll
      for (int e = 0; e < PER; ++e) v |= (u32)sOut[ml * BN + jb * PER + e] << (e * OUT_BITS);
      ((u8*)out)[(i64)pix * OB + byte] = (u8)v;
    }
  }
}
