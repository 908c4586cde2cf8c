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

