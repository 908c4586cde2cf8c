// Host emulation (stem_ws_emu.py): the entry point the Python side calls (ctypes): one launch
// of the warp-specialized first layer. 0: done; -2: a block ended with mbarrier arrivals
// pending.

extern "C" int emu_run(const void* x, const s8* table, const u8* w, const int* epi,
                       const int* bias, void* out0, void* out1, void* out2, int* status, int N,
                       int H, int W, int sn, int sc, int sh, int sw, float scale, int OH,
                       int OW, int PH, int PW, int K, int bands, int band_rows, int col_blocks,
                       int tiles, int grid_x, int grid_y) {
  std::vector<u8> shared(SMEM_BYTES + 16);
  emu_block_end = emu_mbars_idle;
  emu_blocks_ok = true;
  emu_run_blocks(THREADS, grid_x, grid_y, 1, shared.data(), SMEM_BYTES, shared.size(), [&] {
    stem_ws(x, table, w, epi, bias, out0, out1, out2, status, N, H, W, sn, sc, sh, sw, scale,
            OH, OW, PH, PW, K, bands, band_rows, col_blocks, tiles);
  });
  return emu_blocks_ok ? 0 : -2;
}
