// The fused epilogue's per-row part, worked out while the MMAs run (bitserial_epilogue.cu
// includes this).
// The per-row part of the epilogue for this lane's accumulator rows (mi, h) (output row
// row0 + mi*16 + g + 8h of the block tile at m0), independent of the accumulators, so a kernel
// may work it out while its MMAs run: the padding terms and the table row sums (term; the
// row-sum MMA's part is added by tile_epilogue), and where the row's per-column data starts
// for this lane's first column col_base (rowp; the lane's columns col_base + ni*8 + e are
// compile-time offsets from it): OUT_THRESH, the thresholds (RECT_THR: of the row's tap
// rectangle, bitserial_wtap part 3); else BORDER, the weight sums of the row's tap rectangle
// (part 2).
typedef const int* RowPointers[MT][2];
typedef RowPos LaneRows[MT][2];  // this lane's accumulator rows (mi, h)
struct RowPrep {
  int m[MT][2];  // output rows (M_ROWS: dropped)
  int term[MT][2];
  int rect[MT][2];  // tap rectangle ids (RECT_THR with THR_SLOTS: the row table's slot ids)
  RowPointers rowp;
};
// Where a row's per-column data starts for column col_base (rect: the row's tap rectangle).
__device__ __forceinline__ const int* row_data(int rect, int col_base, const EpilogueArgs& ea) {
  if constexpr (PAIR_WTAP) return ea.wtap + WPAIR0 + (rect * (KPAD / 2) + col_base / 2) * PAIR_STRIDE;
  if constexpr (RECT_THR) return ea.wtap + WTHR0 + (rect * KPAD + col_base) * THR_STRIDE;
  else if constexpr (THR_PAIRS) return ea.thr + col_base / 2 * PAIR_STRIDE;  // packed pairs
  else if constexpr (OUT_THRESH) return ea.thr + col_base * THR_STRIDE;
  else if constexpr (BORDER) return ea.wtap + WSUM0 + rect * KPAD + col_base;
  return nullptr;
}
__device__ __forceinline__ RowPrep epilogue_rows(const LaneRows& pos, int n0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = pos[mi][h].m, po = pos[mi][h].po, qo = pos[mi][h].qo;
      int rlo = 0, rhi = R, slo = 0, shi = S;
      if constexpr (NEED_WTAP || ROWSUM_TABLE) {
        tap_range(po * STRIDE - PAD, H, R, rlo, rhi);
        tap_range(qo * STRIDE - PAD, W, S, slo, shi);
      }
      rows.rect[mi][h] = rect_id(rlo, rhi, slo, shi);
      rows.rowp[mi][h] = row_data(rows.rect[mi][h], col_base, ea);
      rows.m[mi][h] = m;
      int t = 0;
      if constexpr (ROWSUM_TABLE) {
        if (m < M_ROWS) t = A_ALPHA * W_BETA * table_row_popc(ea.xpop, m, po, qo, rlo, rhi, slo, shi);
      }
      rows.term[mi][h] = t;
    }
  return rows;
}
// ROW_TABLE (without ROWSUM="table"): the same from the per-row table that bind fills from the
// geometry alone (bitserial_tables.row_table): one 8-byte load per row instead of splitting the
// (virtual) row into (image, row, column), the margin test and the tap ranges (~40
// instructions per row, a fifth of a 32-output lane's tap-shift epilogue at C = 64). v0: the
// warp's first row (TAP_SHIFT: in the virtual grid).
__device__ __forceinline__ RowPrep table_rows(int v0, int n0, int col0, int lane,
                                              const EpilogueArgs& ea) {
  const int col_base = n0 + col0 + 2 * (lane & 3);
  const int2* table = reinterpret_cast<const int2*>(ea.vrows) + v0 + (lane >> 2);
  RowPrep rows;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int2 e = __ldg(table + mi * 16 + 8 * h);
      rows.m[mi][h] = e.x;
      rows.rect[mi][h] = e.y;
      rows.rowp[mi][h] = row_data(e.y, col_base, ea);
      rows.term[mi][h] = 0;
    }
  return rows;
}
__device__ __forceinline__ RowPrep epilogue_rows(int m0, int n0, int row0, int col0, int lane,
                                                 const EpilogueArgs& ea) {
  if constexpr (ROW_TABLE) return table_rows(m0 + row0, n0, col0, lane, ea);
  LaneRows pos;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mi][h] = row_pos(m0 + row0 + mi * 16 + (lane >> 2) + 8 * h);
  return epilogue_rows(pos, n0, col0, lane, ea);
}

// The per-column data this lane's epilogue will read (RowPrep's tables at rowp, the column
// parameters), prefetched into L1 (a one-tile block's epilogue then finds them there instead
// of waiting an L2 round trip after its last MMA). A hint: THR_PAIRS' packed tables are left
// out, and nothing is read.
__device__ __forceinline__ void prefetch_row_data(const RowPrep& rows, int col_base,
                                                  const EpilogueArgs& ea) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        if constexpr (OUT_THRESH && !THR_PAIRS) {
          if (RECT_THR || (mi == 0 && h == 0)) prefetch_l1(rows.rowp[mi][h] + ni * 8 * THR_STRIDE);
        } else if constexpr (BORDER && !OUT_THRESH) {
          prefetch_l1(rows.rowp[mi][h] + ni * 8);
        }
      }
#pragma unroll
  for (int ni = 0; ni < NT; ++ni) {
    const int col = col_base + ni * 8;
    if (OUT_THRESH || col >= KOUT) continue;
    if constexpr (HAS_BIAS == 5) {  // the block-end column table (bitserial_block_end.cu)
      prefetch_l1(reinterpret_cast<const uint4*>(ea.mult) + col);
      continue;
    }
    if constexpr (HAS_BIAS == 1) prefetch_l1(ea.bias + col);
    if constexpr (HAS_BIAS >= 2) prefetch_l1(reinterpret_cast<const i64*>(ea.bias) + col);
    if constexpr (HAS_BIAS >= 3)
      prefetch_l1(reinterpret_cast<const i64*>(ea.mult) + col),
          prefetch_l1(reinterpret_cast<const i64*>(ea.scale) + col);
    if constexpr (REQUANT_OUT) prefetch_l1(ea.mult + col), prefetch_l1(ea.shift + col);
    if constexpr (OUT_MODE == 1) prefetch_l1(ea.scale + col);
  }
}

