// Tiled mma.sync conv: its device primitives (cp.async, ldmatrix, mma.sync s8 / s4, shuffles);
// the host emulation (mma_conv_emu.py) supplies emu_mma_conv_device.cu in this file's place.

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void copy_vec(u8* dst, const u8* src, bool ok, bool tail) {
  if constexpr (VEC == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 16 : 0));
  } else if constexpr (VEC == 4) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0));
  } else {
    u8 v = ok ? src[0] : (u8)0;
    // s4 with odd C: the high nibble of a row's last byte is padding, not a channel
    if (NIBBLE_TAIL && tail) v &= 0x0F;
    *dst = v;
  }
}

__device__ __forceinline__ void cp_async_commit() {
  if constexpr (VEC != 1) asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cp_async_wait1() {
  if constexpr (VEC != 1) asm volatile("cp.async.wait_group 1;\n" ::);
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ void mma(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if MMA_S4 && A_SIGNED && W_SIGNED
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 "
#elif MMA_S4 && A_SIGNED
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.s4.u4.s32 "
#elif MMA_S4 && W_SIGNED
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.u4.s4.s32 "
#elif MMA_S4
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.u4.u4.s32 "
#elif A_SIGNED && W_SIGNED
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
#elif A_SIGNED
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 "
#elif W_SIGNED
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
#else
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 "
#endif
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp16(float32): round to nearest even, as torch's float32 -> float16 conversion
__device__ __forceinline__ unsigned short to_half_bits(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
  return h;
}

#define DECLARE_SMEM(name) extern __shared__ __align__(16) u8 name[]
