// The wgmma kernels' device primitives: wgmma fences, commits and waits, the async-proxy
// fence, mbarriers, bulk and tensor copies. The host emulation (bitserial_emu.py) supplies
// emu_wgmma_device.cu in this file's place.

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async one.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// BULK_WEIGHTS: a bulk copy (the copy engine, one instruction) of `bytes` contiguous global
// bytes into shared memory, counted on the mbarrier `bar`, whose phase completes once the
// arrivals and the bytes announced by mbar_expect_tx are in.
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void fence_mbar_init() {  // the inits, visible to the copy engine
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {  // one arrival + bytes
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(u32* dst, const u32* src, u32 bytes, u64* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// TMA_HALO: a tiled tensor copy (the copy engine) of the 4-d box at coordinates (c0..c3) of
// the tensor map into shared memory at `dst`, counted on `bar` like a bulk copy
__device__ __forceinline__ void tensor_copy_4d(u32* dst, const TensorMap* map, int c0, int c1,
                                               int c2, int c3, u64* bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
               :: "r"(smem_addr(dst)), "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1),
                  "r"(c2), "r"(c3), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, int phase) {
  u32 done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(smem_addr(bar)), "r"(phase)
                 : "memory");
}
