// ---- accumulators ----

typedef int Acc[Q_BITS][P_BITS][MT][NT][4];  // one per (activation plane, weight plane) pair
// FUSE_PLANES (wgmma): the tensor cores add the two activation planes with their coefficients
// 1 and 2 (plane 1 issued twice into plane 0's accumulator, wgmma_plane); acc[1] stays unused
// and takes no registers.
static_assert(!FUSE_PLANES || (WGMMA && Q_BITS == 2 && !A_SIGNED && !ELEM8),
              "FUSE_PLANES: wgmma, unsigned two-bit activations (bitserial_shape.fusable_planes)");
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

