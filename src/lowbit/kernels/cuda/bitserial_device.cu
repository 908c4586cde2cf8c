// The device primitives every bit-serial kernel uses: cp.async copies, named barriers, mma.sync
// b1 AND, conversions, programmatic dependent launch. The host emulation (bitserial_emu.py)
// supplies emu_device.cu in this file's place: nothing else may hold inline PTX.

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// Copy VEC words global -> shared; zero-fill when !valid (out of image, past K, past rows).
__device__ __forceinline__ void copy_async(u32* dst, const u32* src, bool valid) {
  const u32 d = smem_addr(dst);
  const int n = valid ? VEC * 4 : 0;
  if constexpr (VEC == 4) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else if constexpr (VEC == 2) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(d), "l"(src), "r"(n));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(n));
  }
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// A hint: the global line at p into L1 (no fault, nothing waits for it)
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" :: "l"(p));
}
// v, hidden from the optimizer: values derived from it are not hoisted out of the loop using it
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}
template <int N> __device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
// Named barrier `id` (1..15; 0 is __syncthreads') of `count` threads, a multiple of 32:
// bar.sync waits for the count, bar.arrive counts this warp in and goes on.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void mma_and(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}
// PTX prmt.b32 (default mode): byte i of the result is byte sel[4i+2:4i] of {b, a} (a: bytes
// 0-3, b: 4-7), or with sel bit 4i+3 set that byte's sign bit copied into all 8 bits.
// (__byte_perm documents only the low 3 bits of each selector nibble.)
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// Programmatic dependent launch (CHAINED, sm_90; no-ops on older targets): let the next
// kernel of the stream launch now, so its blocks take SMs this grid leaves free and run their
// prologue; wait until the previous kernel of the stream completed and its writes are visible.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
