// Host emulation (mma_conv_emu.py): the entry point the Python side calls (ctypes): one
// launch of the conv kernel.

extern "C" int emu_run(const u8* x, const u8* w, void* out, const int* bias, const float* scale,
                       const int* mult, const int* shift, int grid_x, int grid_y, int smem) {
  std::vector<u8> shared(smem + 16);
  emu_run_blocks(THREADS, grid_x, grid_y, 1, shared.data(), smem, shared.size(),
                 [&] { mma_conv(x, w, out, bias, scale, mult, shift); });
  return 0;
}
