// Warp-specialized first layer: its device primitives beside mma_conv_device.cu's (mbarriers,
// the exact float32 quantizer, the status flag). The host emulation (stem_ws_emu.py) supplies
// emu_stem_ws_device.cu in this file's place.

__device__ __forceinline__ void mbar_init(u64* bar, int count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" :: "r"(smem_u32(bar)), "r"(count));
}
// release: this thread's earlier shared-memory reads and writes happen before the phase ends
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared.b64 st, [%0];\n}\n"
               :: "r"(smem_u32(bar)) : "memory");
}
// until the phase of parity `parity` has completed (acquire)
__device__ __forceinline__ void mbar_wait(u64* bar, int parity) {
  u32 done = 0;
  while (!done) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
#endif
  }
}
// clamp(floor(x / scale + 0.5), QMIN, QMAX), division and addition IEEE-rounded
__device__ __forceinline__ int quantize_value(float x, float scale) {
  const float v = floorf(__fadd_rn(__fdiv_rn(x, scale), 0.5f));
  return (int)fminf(fmaxf(v, (float)QMIN), (float)QMAX);
}
// clamp(trunc(u), 0, 255), NaN: 0 (a conversion to u8 saturates)
__device__ __forceinline__ int saturate_index(float u) {
  u32 r;
  asm("cvt.rzi.u8.f32 %0, %1;" : "=r"(r) : "f"(u));
  return (int)r;
}
__device__ __forceinline__ void flag_status(int* status) { atomicMax(status, 1); }
