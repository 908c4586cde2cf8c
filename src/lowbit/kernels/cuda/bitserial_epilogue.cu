// ---- fused epilogue (shared by all kernels) ----
// In parts, in this order: the packing tile and thresholds, the terms (column parameters, plane
// products, row popcounts, split-K sums), the per-row part, the column-pair loads and stores,
// the value of one output, the bit-plane stores; then the per-column walk and the tile's
// epilogue (here), the column-pair thresholds (THR_PAIRS) and the block-end epilogue.

#include "bitserial_epilogue_thresholds.cu"
#include "bitserial_epilogue_terms.cu"
#include "bitserial_epilogue_rows.cu"
#include "bitserial_epilogue_stores.cu"
#include "bitserial_epilogue_value.cu"
#include "bitserial_epilogue_planes.cu"
// The per-column part: columns outer (their parameters loaded once), this lane's rows inner.
__device__ __forceinline__ void epilogue_cols(const Acc& acc, const RowPrep& rows, int m0, int n0,
                                              int row0, int col0, int lane,
                                              const EpilogueArgs& ea, u32* s_out) {
  const auto& term = rows.term;
  const auto& rowp = rows.rowp;
  const int g = lane >> 2, t4 = lane & 3;
  // this lane's bits of each 32-column word, at positions 8 * (ni % 4) + e: shifted by 2 * t4
  // once per word at the store instead of once per output
  u32 word_bits[MT][2][OUT_WORD_TILES][OUT_BITS];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int wd = 0; wd < OUT_WORD_TILES; ++wd)
#pragma unroll
        for (int b = 0; b < OUT_BITS; ++b) word_bits[mi][h][wd][b] = 0;
  u32 int16_prev[MT][2];  // QUAD_STORE16: the previous (even) tile's pairs
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    int pats[MT][2][2];
    uint2 wpair[MT][2];           // BORDER: the tap-rectangle weight sums of this lane's column pair
    uint2 splits[MT][2];          // SPLIT_K > 1: the k-linear sums of that pair (split_sum)
    PairThresholds thr[MT][2];    // OUT_THRESH: that pair's thresholds, per row
    i64 res[MT][2][2];            // RES_PAIRS: that pair's residuals, per row
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (OUT_THRESH) {
          if (RECT_THR || (mi == 0 && h == 0)) {
            load_thresholds(rowp[mi][h] + ni * 8 * THR_STRIDE, thr[mi][h]);
          } else {  // one table for every row: the first row's pair
#pragma unroll
            for (int k = 0; k < THR_LEVELS; ++k) {
              thr[mi][h][0][k] = thr[0][0][0][k];
              thr[mi][h][1][k] = thr[0][0][1][k];
            }
          }
        } else if constexpr (BORDER) {
          wpair[mi][h] = *reinterpret_cast<const uint2*>(rowp[mi][h] + ni * 8);
        }
        if constexpr (SPLIT_K > 1)
          splits[mi][h] = split_sum(ea, m0 + row0 + mi * 16 + g + 8 * h, n0 + col0 + ni * 8 + 2 * t4);
        if constexpr (RES_PAIRS) load_residual_pair(ea, rows.m[mi][h], n0 + col0 + ni * 8 + 2 * t4, res[mi][h]);
      }
    const ColParams cps[2] = {col_params(ea, n0 + col0 + ni * 8 + 2 * t4),
                              col_params(ea, n0 + col0 + ni * 8 + 2 * t4 + 1)};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + col0 + ni * 8 + 2 * t4 + e;
      const ColParams& cp = cps[e];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int y = term[mi][h] + cp.off;
          if constexpr (SPLIT_K > 1) {
            y += e ? (int)splits[mi][h].y : (int)splits[mi][h].x;
          } else {
            y += plane_dot(acc, mi, ni, 2 * h + e);
          }
          if constexpr (BORDER && !OUT_THRESH) y += e ? (int)wpair[mi][h].y : (int)wpair[mi][h].x;
          if constexpr (OUT_THRESH && !PACK_IN_SMEM) {  // straight into the packed words
            bool bits[OUT_BITS];
            threshold_bits(y, thr[mi][h][e], bits);
#pragma unroll
            for (int b = 0; b < OUT_BITS; ++b)
              or_if(word_bits[mi][h][ni / 4][b], bits[b], 1u << ((ni % 4) * 8 + e));
          } else {
            pats[mi][h][e] = epilogue_value(y, cp, thr[mi][h][e], rows.m[mi][h], col, ea,
                                            RES_PAIRS ? res[mi][h][e] : 0);
          }
        }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (QUAD_STORE16) {
          if (ni % 2 == 0) {
            int16_prev[mi][h] = int16_pair(pats[mi][h]);
          } else {
            store_int16_quad(ea, rows.m[mi][h], n0 + col0 + (ni - 1) * 8 + 2 * t4,
                             int16_prev[mi][h], int16_pair(pats[mi][h]), t4);
          }
        } else if constexpr (PAIR_STORE) {
          store_output_pair(ea, rows.m[mi][h], n0 + col0 + ni * 8 + 2 * t4, pats[mi][h]);
        } else if constexpr (PACK_IN_SMEM) {
          const int c0 = col0 + ni * 8;  // first column of this n8 tile in the block
          const int row = row0 + mi * 16 + g + 8 * h;
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b) {
            u32 bits = 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) bits |= (u32)((pats[mi][h][e] >> b) & 1) << (c0 % 32 + 2 * t4 + e);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 1);
            bits |= __shfl_xor_sync(0xffffffffu, bits, 2);
            if (t4 == 0) atomicOr(&s_out[(b * BM + row) * BLOCK_WORDS + c0 / 32], bits);
          }
        } else if constexpr (OUT_MODE == 3 && !OUT_THRESH) {
#pragma unroll
          for (int b = 0; b < OUT_BITS; ++b)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              word_bits[mi][h][ni / 4][b] |= (u32)((pats[mi][h][e] >> b) & 1) << ((ni % 4) * 8 + e);
        }
      }
  }
  if constexpr (OUT_MODE == 3 && !PACK_IN_SMEM) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_row_words(word_bits[mi][h], rows.m[mi][h], (n0 + col0) / 32, t4, ea);
  }
}

#include "bitserial_epilogue_pairs.cu"
#if LOWBIT_BLOCK_END  // (its constants exist in block-end kernels only)
#include "bitserial_block_end.cu"
#endif

// The fused epilogue of the block tile at (m0, n0), this warp's rows row0 + mi*16 + g (+8) and
// columns col0 + ni*8 + 2*t4 (+1): combines the planes (see the top of this file), adds the
// bias, ReLU, then int32 / fp16 / requantized INT8 or bit planes, through the packing tile s_out
// where warp tiles are narrower than a word. rows: epilogue_rows of the same tile and warp.
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, RowPrep rows,
                                              int m0, int n0, int row0, int col0, int lane,
                                              int tid, const EpilogueArgs& ea, u32* s_out) {
  if constexpr (SPLIT_K == 1) {  // split-K: the row-sum MMA's part is in split_sum
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) rows.term[mi][h] += rowsum_mma_term(rsum, mi, h);
  }
#if LOWBIT_BLOCK_END
  block_end_cols(acc, rows, m0, n0, row0, col0, lane, ea);
  return;
#endif
  if constexpr (PACK_IN_SMEM) pack_tile_clear(s_out, tid);
  if constexpr (THR_PAIRS) {
    epilogue_pairs(acc, rows, n0, col0, lane, ea);
    return;
  }
  epilogue_cols(acc, rows, m0, n0, row0, col0, lane, ea, s_out);
  if constexpr (PACK_IN_SMEM) pack_tile_store(s_out, ea.out, m0, n0, tid);
}
__device__ __forceinline__ void tile_epilogue(const Acc& acc, const RowSum& rsum, int m0, int n0,
                                              int row0, int col0, int lane, int tid,
                                              const EpilogueArgs& ea, u32* s_out) {
  tile_epilogue(acc, rsum, epilogue_rows(m0, n0, row0, col0, lane, ea), m0, n0, row0, col0, lane,
                tid, ea, s_out);
}

