// Host emulation (bitserial_emu.py): the entry points the Python side calls (ctypes): the input
// range a chained kernel must not read early, and one launch of a kernel of the source.

extern "C" void emu_set_input(const void* x, long long bytes) {
  emu_x_lo = (const unsigned char*)x;
  emu_x_hi = emu_x_lo + bytes;
}
extern "C" int emu_run(int which, const u32* x, const u32* w, void* out, const int* bias,
                       const float* scale, const int* mult, const int* shift, int* wtap,
                       int* xpop, const int* thr, int* split_ws, int* split_count,
                       const int* vrows, const void* xmap, const void* block_end,
                       int grid_x, int grid_y, int grid_z, int nthreads, long long smem_bytes) {
  if (smem_bytes > EMU_SMEM_BYTES || nthreads > 512 || nthreads % 32) return -1;
  emu_block_end = emu_named_idle;
  emu_blocks_ok = true;
  emu_wgmma_stale = false;
  emu_chain_early = false;
  emu_run_blocks(nthreads, grid_x, grid_y, grid_z, (unsigned char*)smem, smem_bytes,
                 sizeof(smem), [&] {
    if (which == 0) bitserial_wtap(w, thr, wtap);
    else if (which == 2) bitserial_xpop(x, xpop);
    else if (which == 3) EMU_WIMAGE(w, (u32*)out);
    else EMU_MAIN(x, w, out, bias, scale, mult, shift, wtap, xpop, thr, split_ws, split_count,
                  vrows EMU_XMAP_ARG EMU_BLOCK_END_ARG);
    if (!emu_copy_groups.empty() || !emu_copy_open.empty()) emu_fail("copies left pending");
    if (threadIdx.x == 0 && !emu_bulk_pending.empty()) emu_fail("bulk copies left pending");
  });
  if (emu_wgmma_stale) return -3;
  if (emu_chain_early) return -4;
  return emu_blocks_ok ? 0 : -2;  // a block left a named barrier phase with arrivals pending
}
