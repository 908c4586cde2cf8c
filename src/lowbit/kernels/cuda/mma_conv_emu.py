"""Host emulation of the mma.sync conv kernel: the same CUDA text, run on the CPU.

`emulate(kernel, x, w, params)` compiles `COMMON + HOST_PRIMITIVES + KERNEL` (the kernel's own
code, unchanged) with the host C++ compiler and runs every block with one std::thread per CUDA
thread. Only the device primitives are replaced, each by its PTX-specified behaviour:
- cp.async copies are queued per thread and land at `cp.async.wait_group` (the latest moment
  the hardware may complete them), so a missing wait or barrier reads stale shared memory;
- ldmatrix (m8n8 .b16, x2/x4): lane i receives bytes 4*(i%4)..+3 of row i/4 of matrix j, whose
  row addresses lanes 8j..8j+7 supplied (rows must be 16-byte aligned and inside the buffer);
- mma.sync m16n8k32 (8-bit) / m16n8k64 (4-bit), A row-major, B column-major: the fragment
  layouts of the PTX ISA (groupID = lane/4, t = lane%4; A reg r: row g + 8*(r%2), elements
  k = t*E + 16*(r/2)*(8/bits)..; B reg r: column g, same k; C/D: rows g, g+8, columns 2t, 2t+1);
- shfl.bfly, bar.sync, cvt.rn.f16.f32 (_Float16), and the shared-memory array.
It is a check of the kernel's indexing, pipeline and packing on machines without a GPU; it is
slow (threads and barriers per instruction) and only meant for small workloads.
"""

from __future__ import annotations

import ctypes

import torch

from ...core.epilogue import EpilogueParams
from ...core.validate import check_inputs, out_storage
from .host_emu import HOST_INCLUDES, HOST_THREADS, host_library
from .mma_conv import MmaConvKernel, render
from .mma_conv_cuda import COMMON, KERNEL

HOST_PRIMITIVES = r"""
using std::min;
struct int2 { int x, y; };
inline int2 make_int2(int x, int y) { return int2{x, y}; }

struct Pending { u8* dst; const u8* src; int n; };
thread_local std::vector<std::vector<Pending>> groups;   // committed groups, oldest first
thread_local std::vector<Pending> open_group;

__device__ __forceinline__ u32 smem_u32(const void* p) {
  const i64 off = (const u8*)p - emu->smem;
  if (off < 0 || off > emu->smem_size) emu_fail("smem_u32 outside shared memory");
  return (u32)off;
}

__device__ __forceinline__ void copy_vec(u8* dst, const u8* src, bool ok, bool tail) {
  const i64 off = dst - emu->smem;
  if (off < 0 || off + VEC > emu->smem_size || off % VEC) emu_fail("copy_vec destination");
  if constexpr (VEC == 1) {
    u8 v = ok ? src[0] : (u8)0;
    if (NIBBLE_TAIL && tail) v &= 0x0F;
    *dst = v;
  } else {
    if (((u64)src) % VEC) emu_fail("misaligned cp.async source");
    open_group.push_back(Pending{dst, ok ? src : nullptr, VEC});
  }
}

__device__ __forceinline__ void cp_async_commit() {
  if constexpr (VEC != 1) { groups.push_back(open_group); open_group.clear(); }
}

__device__ __forceinline__ void cp_async_wait1() {
  if constexpr (VEC != 1) {
    while (groups.size() > 1) {
      for (const Pending& c : groups.front()) {
        if (c.src) memcpy(c.dst, c.src, c.n); else memset(c.dst, 0, c.n);
      }
      groups.erase(groups.begin());
    }
  }
}


static inline u32 ld_row_word(u64 row_addr, int lane) {
  if (row_addr % 16 || (i64)row_addr + 16 > emu->smem_size) emu_fail("ldmatrix row address");
  u32 v;
  memcpy(&v, emu->smem + row_addr + 4 * (lane % 4), 4);
  return v;
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  EmuWarp& wp = emu_warp();
  const int lane = emu_lane();
  wp.slot[lane][0] = addr;
  wp.bar->arrive_and_wait();
  for (int j = 0; j < 4; ++j) r[j] = ld_row_word(wp.slot[8 * j + lane / 4][0], lane);
  wp.bar->arrive_and_wait();
}

__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
  EmuWarp& wp = emu_warp();
  const int lane = emu_lane();
  wp.slot[lane][0] = addr;
  wp.bar->arrive_and_wait();
  r0 = ld_row_word(wp.slot[lane / 4][0], lane);
  r1 = ld_row_word(wp.slot[8 + lane / 4][0], lane);
  wp.bar->arrive_and_wait();
}

constexpr int EMU_EBITS = MMA_S4 ? 4 : 8;         // bits per element
constexpr int EMU_PER_REG = 32 / EMU_EBITS;        // elements per 32-bit register
constexpr int EMU_KHALF = 4 * EMU_PER_REG;         // k elements covered by one register column

static inline int emu_elem(u32 reg, int i, bool is_signed) {
  const u32 bits = (reg >> (i * EMU_EBITS)) & ((1u << EMU_EBITS) - 1);
  const int v = (int)bits;
  return (is_signed && (bits >> (EMU_EBITS - 1))) ? v - (1 << EMU_EBITS) : v;
}

// A(row, k): lane g*4 + t holds rows g (regs 0, 2) and g + 8 (regs 1, 3); k = t*PER + e in
// regs 0/1 and KHALF + t*PER + e in regs 2/3.
static inline int emu_a(int row, int k) {
  const int half = k / EMU_KHALF, kk = k % EMU_KHALF;
  const int lane = (row % 8) * 4 + kk / EMU_PER_REG;
  const int reg = (row / 8) + 2 * half;
  return emu_elem((u32)emu_warp().slot[lane][reg], kk % EMU_PER_REG, A_SIGNED);
}

// B(k, n): lane n*4 + t; reg 0: k = t*PER + e, reg 1: KHALF + t*PER + e.
static inline int emu_b(int k, int n) {
  const int half = k / EMU_KHALF, kk = k % EMU_KHALF;
  const int lane = n * 4 + kk / EMU_PER_REG;
  return emu_elem((u32)emu_warp().slot[lane][4 + half], kk % EMU_PER_REG, W_SIGNED);
}

__device__ __forceinline__ void mma(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  EmuWarp& wp = emu_share_fragments(a, b0, b1);
  const int lane = emu_lane();
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
    u32 acc = (u32)d[e];
    for (int k = 0; k < 2 * EMU_KHALF; ++k) acc += (u32)(emu_a(row, k) * emu_b(k, col));
    d[e] = (int)acc;
  }
  wp.bar->arrive_and_wait();
}

__device__ __forceinline__ unsigned short to_half_bits(float f) {
  _Float16 h = (_Float16)f;
  unsigned short bits;
  memcpy(&bits, &h, 2);
  return bits;
}

static inline float __ll2float_rn(i64 v) { return (float)v; }


#define DECLARE_SMEM(name) u8* name = emu->smem
"""

HOST_MAIN = r"""
extern "C" int emu_run(const u8* x, const u8* w, void* out, const int* bias, const float* scale,
                       const int* mult, const int* shift, int grid_x, int grid_y, int smem) {
  std::vector<u8> shared(smem + 16);
  emu_run_blocks(THREADS, grid_x, grid_y, 1, shared.data(), smem, shared.size(),
                 [&] { mma_conv(x, w, out, bias, scale, mult, shift); });
  return 0;
}
"""


def host_source(kernel: MmaConvKernel) -> str:
    body = COMMON + HOST_THREADS + HOST_PRIMITIVES + KERNEL + HOST_MAIN
    return HOST_INCLUDES + render(kernel.workload, kernel.config, kernel.variant, body=body)


def _library(kernel: MmaConvKernel) -> ctypes.CDLL:
    return host_library(host_source(kernel), "mma_conv")


def emulate(kernel: MmaConvKernel, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
            poison: int = 0xA5) -> torch.Tensor:
    """Run ``kernel`` on CPU tensors through the host emulation; the output starts poisoned."""
    check_inputs(kernel.workload, x, w, params)
    shape, dtype = out_storage(kernel.workload)
    out = torch.empty(shape, dtype=dtype)
    out.view(torch.uint8).fill_(poison)
    lib = _library(kernel)
    ptr = ctypes.c_void_p
    vecs = [params.bias, params.scale, params.multiplier, params.shift]
    args = [ptr(t.data_ptr()) if t is not None else ptr(0) for t in (x, w, out, *vecs)]
    lib.emu_run(*args, ctypes.c_int(kernel.grid[0]), ctypes.c_int(kernel.grid[1]),
                ctypes.c_int(kernel.smem))
    return out
