"""Host emulation of the bit-serial kernels: the same CUDA text, run on the CPU.

`emulate(workload, config, x, w, params)` renders the kernel of `cuda.bitserial` for (workload,
config), replaces only its device primitives (the `<device-primitives>` regions of
bitserial_common.cu and bitserial_wgmma.cu, and the inline-PTX wgmma wrappers) with host C++ of
their PTX-specified behaviour, compiles it with the host compiler and runs every block with one
std::thread per CUDA thread:
- cp.async copies are queued per thread and land at `cp.async.wait_group` (the latest moment the
  hardware may complete them; src-size 0 zero-fills), so a missing wait or barrier reads stale
  shared memory (which starts as 0xCD garbage, not zeros);
- mma.sync m16n8k256 .b1 .and.popc: the PTX fragment layouts (groupID g = lane/4, t = lane%4;
  A regs 0/1: rows g / g+8, k 32t..32t+31; regs 2/3: k 128+32t..; B regs 0/1: column g, same
  k; C/D: rows g, g+8, columns 2t, 2t+1), operands gathered across the warp;
- wgmma m64nNk256 .b1 .and.popc (and m64nNk32 .s8/.u8 x .s8 for the int8 mode) from
  shared-memory descriptors (start, LBO, SBO, base offset; no swizzle, or the 128 / 64 /
  32-byte swizzle: a row's 16-byte chunk index XORed with its address bits 7.. counted from the
  pattern's start), K-major, executed at `wgmma.wait_group` (the latest legal moment) and at
  issue (the earliest): operands that differ between the two, overwritten or landing late,
  raise `StaleOperands`; each thread computes its own accumulator registers (warp w of the
  warpgroup: rows 16w + g (+8), register k: column 8(k/4) + 2t + k%2);
- mbarriers with bulk copies and tiled tensor copies (swizzled like the descriptors, zeros out
  of bounds): the copies land when a thread waits on their mbarrier, which checks the bytes
  announced by expect_tx;
- griddepcontrol (CHAINED): a thread's copies from x before its wait raise `EarlyInputRead`
  (x is the previous kernel's output, possibly still being written);
- shfl (indexed and xor), bar.sync (the block's and named barriers of a thread count, with
  bar.arrive), __syncwarp, atomicOr on shared memory, cvt.rn.f16.f32 (_Float16), prmt.b32.
It checks the kernels' indexing, pipelines, descriptors and packing on machines without a GPU;
it is slow (threads and barriers per instruction) and meant for small workloads.
"""

from __future__ import annotations

import ctypes
import re
import struct

import torch

from ...core import Config, Workload
from ...core.epilogue import EpilogueParams
from ...core.validate import check_inputs, out_storage
from .bitserial import (
    WGMMA_ARCH,
    WTAP_THREADS,
    XPOP_THREADS,
    bulk_weights,
    epilogue_thresholds,
    halo_map_geometry,
    int8_operands,
    k_tiles,
    kernel_name,
    persistent_grid,
    render,
    row_table,
    s8_atype,
    side_table_blocks,
    side_tables,
    smem_bytes,
    split_k,
    split_workspace,
    stage_bytes,
    threads,
    tile_grid,
    tma_halo,
    weight_images,
)
from .host_emu import HOST_INCLUDES, HOST_THREADS, host_library

#: largest dynamic shared memory a block may use (H100: 227 KiB)
SMEM_LIMIT = 227 * 1024

HOST_INTRINSICS = r"""
#define LOWBIT_HOST_EMU 1
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return uint4{a, b, c, d};
}

// the block's dynamic shared memory (blocks run one at a time); the kernels declare it extern
extern "C" { alignas(256) unsigned int smem[EMU_SMEM_BYTES / 4 + 64]; }

static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline unsigned atomicOr(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_or(v);
}
// split-K arrival: global atomics, fences and L2 loads (blocks run one at a time)
static inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline uint2 __ldcg(const uint2* p) { return *p; }
static inline int2 __ldg(const int2* p) { return *p; }
static inline int __ldg(const int* p) { return *p; }
static std::atomic<int> emu_or_flag;
static std::atomic<bool> emu_wgmma_stale{false};  // reported by emu_run
// CHAINED: until a thread has run griddepcontrol.wait, x is the previous kernel's output still
// being written; a copy from x's bytes [emu_x_lo, emu_x_hi) before it sets emu_chain_early
static const unsigned char* emu_x_lo = nullptr;
static const unsigned char* emu_x_hi = nullptr;
static std::atomic<bool> emu_chain_early{false};  // reported by emu_run
thread_local bool emu_grid_waited = false;  // a thread per CUDA thread: false at block start
// bulk copies (BULK_WEIGHTS) and tensor copies (TMA_HALO: their bytes, read at issue, in
// `data`), queued under a lock (blocks run one at a time, their threads at once) until a thread
// waits on their mbarrier
struct EmuBulk {
  unsigned* dst;
  const unsigned* src;
  unsigned bytes;
  unsigned long long* bar;
  std::vector<unsigned char> data;
};
// TMA_HALO: the emulation's tensor map (bitserial_emu.py, emu_tensor_map): the global base,
// dims and box innermost first (bytes), strides of dims 1.. in bytes, swizzle bytes
struct EmuTensorMap {
  unsigned long long base;
  long long dims[4], strides[3];
  int box[4], swizzle;
};
static std::mutex emu_bulk_lock;
static std::vector<EmuBulk> emu_bulk_pending;
static std::map<unsigned long long*, long long> emu_bulk_expected, emu_bulk_landed;
static inline void emu_no_wimage(const unsigned*, unsigned*) {}
static inline int __syncthreads_or(int pred) {
  emu->bar->arrive_and_wait();  // every thread has read the previous result
  if (threadIdx.x == 0) emu_or_flag = 0;
  emu->bar->arrive_and_wait();
  if (pred) emu_or_flag = 1;
  emu->bar->arrive_and_wait();
  return emu_or_flag.load();
}
"""

COMMON_PRIMITIVES = r"""
__device__ __forceinline__ u32 smem_addr(const void* p) {
  const long long off = (const unsigned char*)p - emu->smem;
  if (off < 0 || off >= emu->smem_size) emu_fail("address outside the block's shared memory");
  return (u32)off;
}

static inline void emu_input_read(const void* src) {
  const unsigned char* p = (const unsigned char*)src;
  if (CHAINED && !emu_grid_waited && p >= emu_x_lo && p < emu_x_hi) emu_chain_early = true;
}
__device__ __forceinline__ void launch_dependents() {}
__device__ __forceinline__ void grid_dependency_wait() { emu_grid_waited = true; }

struct EmuCopy { u32* dst; const u32* src; };
thread_local std::vector<std::vector<EmuCopy>> emu_copy_groups;
thread_local std::vector<EmuCopy> emu_copy_open;

__device__ __forceinline__ void copy_async(u32* dst, const u32* src, bool valid) {
  const u32 d = smem_addr(dst);
  if (d % (VEC * 4) || d + VEC * 4 > emu->smem_size) emu_fail("cp.async destination");
  if (valid && ((unsigned long long)src) % (VEC * 4)) emu_fail("misaligned cp.async source");
  if (valid) emu_input_read(src);
  emu_copy_open.push_back(EmuCopy{dst, valid ? src : nullptr});
}
__device__ __forceinline__ int opaque(int v) { return v; }
__device__ __forceinline__ void prefetch_l1(const void* p) {
  if (p == nullptr) emu_fail("prefetch of a null pointer");
}
__device__ __forceinline__ void copy_commit() {
  emu_copy_groups.push_back(emu_copy_open);
  emu_copy_open.clear();
}
template <int N> __device__ __forceinline__ void copy_wait() {
  while ((int)emu_copy_groups.size() > N) {
    for (const EmuCopy& c : emu_copy_groups.front()) {
      if (c.src) memcpy(c.dst, c.src, 4 * VEC); else memset(c.dst, 0, 4 * VEC);
    }
    emu_copy_groups.erase(emu_copy_groups.begin());
  }
}

// Named barriers (bar.sync / bar.arrive id, count): a phase completes when `count` threads
// have arrived, the first arrival setting the count; every arrival of a phase must name the
// same count. Blocks run one at a time, so one set serves them all; emu_run reports a block
// that left a phase half full (an arrive without its partners) and resets it.
#define EMU_BARRIER_TIMEOUT_S 300
struct EmuNamedBarrier {
  std::mutex mu;
  std::condition_variable cv;
  int expected = 0, arrived = 0;
  unsigned long long phase = 0;
};
static EmuNamedBarrier emu_named[16];
static inline void emu_named_arrive(int id, int count, bool wait) {
  if (id < 1 || id > 15 || count <= 0 || count % 32 || count > (int)blockDim.x)
    emu_fail("named barrier id or thread count");
  EmuNamedBarrier& b = emu_named[id];
  std::unique_lock<std::mutex> lock(b.mu);
  if (b.arrived == 0) b.expected = count;
  else if (b.expected != count) emu_fail("named barrier arrivals with different counts");
  const unsigned long long phase = b.phase;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.phase;
    b.cv.notify_all();
  } else if (wait) {  // a phase that never completes hangs a GPU; here it ends the process
    if (!b.cv.wait_for(lock, std::chrono::seconds(EMU_BARRIER_TIMEOUT_S),
                       [&] { return b.phase != phase; }))
      emu_fail("named barrier deadlock: a phase never completed");
  }
}
__device__ __forceinline__ void named_sync(int id, int count) {
  emu_named_arrive(id, count, true);
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  emu_named_arrive(id, count, false);
}
// Whether every named barrier ended the block with no arrivals pending; resets them all.
static inline bool emu_named_idle() {
  bool idle = true;
  for (EmuNamedBarrier& b : emu_named) {
    if (b.arrived) idle = false;
    b.arrived = 0;
  }
  return idle;
}

__device__ __forceinline__ void mma_and(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  EmuWarp& wp = emu_share_fragments(a, b0, b1);
  const int lane = emu_lane();
  const int g = lane >> 2, t = lane & 3;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    int sum = 0;
    for (int tt = 0; tt < 4; ++tt) {
      const int la = (row & 7) * 4 + tt, lb = col * 4 + tt;
      sum += __builtin_popcount((u32)wp.slot[la][row >> 3] & (u32)wp.slot[lb][4]);
      sum += __builtin_popcount((u32)wp.slot[la][2 + (row >> 3)] & (u32)wp.slot[lb][5]);
    }
    d[e] += sum;
  }
  wp.bar->arrive_and_wait();
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
  const _Float16 h = (_Float16)v;
  unsigned short bits;
  memcpy(&bits, &h, 2);
  return bits;
}
// prmt.b32, default mode: per result byte a selector nibble, bits 0-2 the byte of {b, a},
// bit 3 that byte's sign bit in all 8 bits
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  const unsigned long long src = ((unsigned long long)b << 32) | a;
  u32 d = 0;
  for (int i = 0; i < 4; ++i) {
    const u32 nib = (sel >> (4 * i)) & 0xF;
    u32 byte = (u32)(src >> (8 * (nib & 7))) & 0xFF;
    if (nib & 8) byte = (byte & 0x80) ? 0xFF : 0;
    d |= byte << (8 * i);
  }
  return d;
}
"""

WGMMA_PRIMITIVES = r"""
// byte address of byte kb (0..31, the 256 k bits) of row `row` of a K-major operand
static inline u32 emu_desc_addr(u64 desc, int row, int kb) {
  const u32 start = (u32)(desc & 0x3FFF) << 4;
  const u32 lbo = (u32)((desc >> 16) & 0x3FFF) << 4;
  const u32 sbo = (u32)((desc >> 32) & 0x3FFF) << 4;
  const int mode = (int)(desc >> 62);
  u32 a = 0;
  if (mode == 0) {  // 8 x 16-byte core matrices: k halves LBO apart, 8-row groups SBO apart
    a = start + (row >> 3) * sbo + (kb >> 4) * lbo + (row & 7) * 16 + (kb & 15);
  } else {  // 128 / 64 / 32-byte swizzle (modes 1 / 2 / 3): rows that wide, 8-row groups SBO
    // apart; a row's 16-byte chunk XORed with its address bits 7.. counted from the pattern's
    // start, whose bits 7-9 are the base offset (PTX ISA, matrix descriptor: 0 where the
    // pattern starts on its period's boundaries, wherever the matrix starts)
    const u32 sw = 256u >> mode, base = (u32)((desc >> 49) & 7);
    a = start + (row >> 3) * sbo + (row & 7) * sw + kb;
    a ^= (((a >> 7) - base) & (sw / 16 - 1)) << 4;
  }
  if ((long long)a >= emu->smem_size) emu_fail("wgmma operand outside shared memory");
  return a;
}

// products: this thread's sums as the operands read at issue; a wgmma whose operands change
// before it completes (overwritten, or copies landing late) sets emu_wgmma_stale
struct EmuWgmma { int* d; int regs; u64 da, db; bool s8, accumulate; std::vector<int> products; };
thread_local std::vector<std::vector<EmuWgmma>> emu_wg_groups;
thread_local std::vector<EmuWgmma> emu_wg_open;

static inline std::vector<int> emu_wgmma_products(const EmuWgmma& op);
static inline void emu_wgmma_issue(EmuWgmma op) {
  op.products = emu_wgmma_products(op);
  emu_wg_open.push_back(op);
}
static inline void emu_wgmma_run(const EmuWgmma& op) {
  const std::vector<int> sums = emu_wgmma_products(op);
  if (sums != op.products) emu_wgmma_stale = true;  // emu_run reports it
  for (int k = 0; k < op.regs; ++k) op.d[k] = op.accumulate ? op.d[k] + sums[k] : sums[k];
}
static inline std::vector<int> emu_wgmma_products(const EmuWgmma& op) {
  const int lane = emu_lane(), g = lane >> 2, t = lane & 3, wi = (threadIdx.x >> 5) & 3;
  std::vector<int> sums(op.regs);
  for (int k = 0; k < op.regs; ++k) {
    const int row = 16 * wi + g + 8 * ((k & 3) >> 1), col = 8 * (k >> 2) + 2 * t + (k & 1);
    int sum = 0;
    for (int kb = 0; kb < 32; ++kb) {
      const unsigned char a = emu->smem[emu_desc_addr(op.da, row, kb)];
      const unsigned char b = emu->smem[emu_desc_addr(op.db, col, kb)];
      if (op.s8)  // m64nNk32 .s32.{s8,u8}.s8: 32 byte products
        sum += (EMU_A_S8 ? (int)(signed char)a : (int)a) * (int)(signed char)b;
      else        // m64nNk256 .b1 .and.popc: 256 bit products
        sum += __builtin_popcount(a & b);
    }
    sums[k] = sum;
  }
  return sums;
}

__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void fence_proxy_async() {}
// BULK_WEIGHTS: an mbarrier is its 8 shared bytes; the copies it counts (EmuBulk, above) land
// when a thread waits on it, which checks that they brought the bytes announced
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
  std::lock_guard<std::mutex> g(emu_bulk_lock);
  smem_addr(bar);
  if (count != 1) emu_fail("mbarrier emulated with one arrival");
  emu_bulk_expected[bar] = 0;
  emu_bulk_landed[bar] = 0;
}
__device__ __forceinline__ void fence_mbar_init() {}
__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
  std::lock_guard<std::mutex> g(emu_bulk_lock);
  if (!emu_bulk_expected.count(bar)) emu_fail("mbarrier used before its init");
  emu_bulk_expected[bar] += bytes;
}
__device__ __forceinline__ void bulk_copy(u32* dst, const u32* src, u32 bytes, u64* bar) {
  std::lock_guard<std::mutex> g(emu_bulk_lock);
  const u32 d = smem_addr(dst);
  if (d % 16 || bytes % 16 || d + bytes > emu->smem_size) emu_fail("bulk copy destination");
  if ((unsigned long long)src % 16) emu_fail("misaligned bulk copy source");
  emu_input_read(src);
  emu_bulk_pending.push_back(EmuBulk{dst, src, bytes, bar});
}
// TMA_HALO: a tiled copy of a sw x b1 x b2 x b3 box (sw: the swizzle width, 32 / 64 / 128
// bytes), its rows' 16-byte chunks XORed with their row's phase in the 8-row period (the
// destination starts one), zeros out of bounds
__device__ __forceinline__ void tensor_copy_4d(u32* dst, const TensorMap* map, int c0, int c1,
                                               int c2, int c3, u64* bar) {
  EmuTensorMap m;
  memcpy(&m, map, sizeof m);
  emu_input_read((const void*)m.base);
  const u32 d = smem_addr(dst);
  const int sw = m.swizzle;
  if ((sw != 32 && sw != 64 && sw != 128) || m.box[0] != sw)
    emu_fail("tensor copies emulated: boxes one swizzle wide");
  if (d % (8 * sw)) emu_fail("swizzled tensor copy destination off its swizzle period");
  const int c[4] = {c0, c1, c2, c3};
  const long long n = (long long)m.box[0] * m.box[1] * m.box[2] * m.box[3];
  if (d + n > emu->smem_size) emu_fail("tensor copy destination");
  EmuBulk op{dst, nullptr, (unsigned)n, bar, std::vector<unsigned char>(n)};
  long long at = 0;
  for (int i3 = 0; i3 < m.box[3]; ++i3)
    for (int i2 = 0; i2 < m.box[2]; ++i2)
      for (int i1 = 0; i1 < m.box[1]; ++i1)
        for (int i0 = 0; i0 < m.box[0]; ++i0, ++at) {
          const long long g[4] = {c[0] + i0, c[1] + i1, c[2] + i2, (long long)c[3] + i3};
          bool inside = true;
          for (int k = 0; k < 4; ++k) inside = inside && g[k] >= 0 && g[k] < m.dims[k];
          const unsigned char* src = (const unsigned char*)m.base + g[0] + g[1] * m.strides[0]
                                     + g[2] * m.strides[1] + g[3] * m.strides[2];
          op.data[at ^ (((at >> 7) & (sw / 16 - 1)) << 4)] = inside ? *src : 0;
        }
  std::lock_guard<std::mutex> g(emu_bulk_lock);
  emu_bulk_pending.push_back(std::move(op));
}
__device__ __forceinline__ void mbar_wait(u64* bar, int phase) {
  if (phase != 0) emu_fail("mbarrier phases past the first not emulated");
  for (int spin = 0;; ++spin) {
    {
      std::lock_guard<std::mutex> g(emu_bulk_lock);
      if (!emu_bulk_expected.count(bar)) emu_fail("mbarrier waited on before its init");
      for (size_t i = 0; i < emu_bulk_pending.size();) {
        const EmuBulk& c = emu_bulk_pending[i];
        if (c.bar != bar) { ++i; continue; }
        memcpy(c.dst, c.data.empty() ? (const void*)c.src : c.data.data(), c.bytes);
        emu_bulk_landed[bar] += c.bytes;
        emu_bulk_pending.erase(emu_bulk_pending.begin() + i);
      }
      const long long want = emu_bulk_expected[bar], got = emu_bulk_landed[bar];
      if (got > want) emu_fail("bulk copies of more than the announced bytes");
      if (want > 0 && got == want) return;  // the phase completed
    }
    if (spin > 20000000) emu_fail("mbarrier phase never completed");
    std::this_thread::yield();
  }
}
__device__ __forceinline__ void wgmma_commit() {
  emu_wg_groups.push_back(emu_wg_open);
  emu_wg_open.clear();
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  while ((int)emu_wg_groups.size() > N) {
    for (const EmuWgmma& op : emu_wg_groups.front()) emu_wgmma_run(op);
    emu_wg_groups.erase(emu_wg_groups.begin());
  }
}
__device__ __forceinline__ void wgmma_planes(int (&d)[P_BITS][MT][NT][4], u64 da, u64 db,
                                             int accumulate) {
  static_assert(MT == 1, "a warp holds 16 rows of m64");
  emu_wgmma_issue(EmuWgmma{&d[0][0][0][0], P_BITS * NT * 4, da, db, ELEM8 != 0,
                           accumulate != 0, {}});
}
__device__ __forceinline__ void wgmma_rowsum(int (&d)[MT][RS_REGS], u64 da, u64 db,
                                             int accumulate) {
  emu_wgmma_issue(EmuWgmma{&d[0][0], 4, da, db, false, accumulate != 0, {}});
}
// m64n(N+16)k256 (ROWSUM_COLS): the weights' N columns, then 16 more B rows (ones, zeros)
// into rs[0][0..7]; B row r lies SBO (256 B) per 8 rows on, so rows N.. are the B operand
// N * 32 bytes on.
__device__ __forceinline__ void wgmma_planes_ones(int (&d)[P_BITS][MT][NT][4],
                                                  int (&rs)[MT][RS_REGS], u64 da, u64 db,
                                                  int accumulate) {
  wgmma_planes(d, da, db, accumulate);
  emu_wgmma_issue(EmuWgmma{&rs[0][0], 8, da, desc_offset(db, P_BITS * WN * 2), false,
                           accumulate != 0, {}});
}
"""

HOST_MAIN = r"""
extern "C" void emu_set_input(const void* x, long long bytes) {
  emu_x_lo = (const unsigned char*)x;
  emu_x_hi = emu_x_lo + bytes;
}
extern "C" int emu_run(int which, const u32* x, const u32* w, void* out, const int* bias,
                       const float* scale, const int* mult, const int* shift, int* wtap,
                       int* xpop, const int* thr, int* split_ws, int* split_count,
                       const int* vrows, const void* xmap,
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
                  vrows EMU_XMAP_ARG);
    if (!emu_copy_groups.empty() || !emu_copy_open.empty()) emu_fail("copies left pending");
    if (threadIdx.x == 0 && !emu_bulk_pending.empty()) emu_fail("bulk copies left pending");
  });
  if (emu_wgmma_stale) return -3;
  if (emu_chain_early) return -4;
  return emu_blocks_ok ? 0 : -2;  // a block left a named barrier phase with arrivals pending
}
"""

#: the weights' image kernel the emulation runs (BULK_WEIGHTS), or a stand-in
WIMAGE = {True: "bitserial_wimage", False: "emu_no_wimage"}
_REGION = re.compile(r"// <device-primitives>.*?// </device-primitives>\n", re.S)


def host_source(wl: Workload, config: Config, chained: int = 0) -> str:
    """The kernel's CUDA text with its device primitives replaced by the host versions."""
    text = render(wl, config, wgmma_asm=False, chained=chained)
    regions = _REGION.findall(text)
    want = 2 if config["MMA"] == "wgmma" else 1
    if len(regions) != want:
        raise RuntimeError(f"expected {want} device-primitive regions, found {len(regions)}")
    text = text.replace(regions[0], COMMON_PRIMITIVES, 1)
    if want == 2:
        text = text.replace(regions[1], WGMMA_PRIMITIVES, 1)
    if re.search(r"\basm\b", text):
        raise RuntimeError("inline PTX left outside the device-primitive regions")
    head = (f"#define EMU_SMEM_BYTES {SMEM_LIMIT}\n#define EMU_MAIN {kernel_name(config)}\n"
            f"#define EMU_WIMAGE {WIMAGE[bulk_weights(config)]}\n"
            f"#define EMU_A_S8 {int(s8_atype(wl) == 's8')}\n"
            f"#define EMU_XMAP_ARG {', *(const TensorMap*)xmap' if tma_halo(config) else ''}\n")
    return HOST_INCLUDES + head + HOST_THREADS + HOST_INTRINSICS + text + HOST_MAIN


def emulate(wl: Workload, config: Config, x: torch.Tensor, w: torch.Tensor,
            params: EpilogueParams, persistent_blocks: int = 2, poison: int = 0xA5,
            launches: int = 1, chained: int = 0) -> torch.Tensor:
    """Run the `cuda.bitserial` kernel of (wl, config) on CPU tensors through the host
    emulation; returns the output (poisoned before each launch). Persistent configs run
    `persistent_blocks` blocks, so each loops over several tiles. `launches` > 1 runs the main
    kernel again on the same side buffers (split-K counters must come back to zero).
    chained = 1 or 2 runs the kernels rendered for programmatic dependent launch
    (`bitserial.CHAIN_TRIGGERS`) and raises
    `EarlyInputRead` where a thread copies from x before its griddepcontrol.wait."""
    from . import BITSERIAL, INT8_WGMMA

    template = INT8_WGMMA if int8_operands(wl) else BITSERIAL
    config = Config(config)
    reason = template.space(wl, WGMMA_ARCH).why_invalid(config)
    if reason:
        raise ValueError(f"config {config} is not in {template.name}'s space for {wl.key}: "
                         f"{reason}")
    check_inputs(wl, x, w, params)
    shape, dtype = out_storage(wl)
    out = torch.empty(shape, dtype=dtype)
    wtap, xpop = side_tables(wl, config, "cpu")
    split_ws, split_count = split_workspace(wl, config, "cpu")
    vrows = row_table(wl, config, "cpu")
    for table in (wtap, xpop, split_ws):
        if table is not None:
            table.fill_(-7)  # garbage until a kernel writes it
    if x.dtype == torch.uint8 or w.dtype == torch.uint8:  # int8 layout: the bytes as they are
        x, w = x.view(torch.int8), w.view(torch.int8)
    lib = host_library(host_source(wl, config, chained), "bitserial")
    x_bytes = ctypes.c_longlong(x.numel() * x.element_size())
    lib.emu_set_input(ctypes.c_void_p(x.data_ptr()), x_bytes)
    ptr = ctypes.c_void_p
    vecs = [params.bias, params.scale, params.multiplier, params.shift]
    thr = epilogue_thresholds(wl, config, params)  # held here: args keep only raw pointers
    xmap = emu_tensor_map(wl, config, x)  # held here too
    args = [ptr(t.data_ptr()) if t is not None else ptr(0)
            for t in (x, w, out, *vecs, wtap, xpop, thr, split_ws, split_count, vrows, xmap)]
    grid = (*tile_grid(wl, config), split_k(config))
    if config["PERSIST"]:
        grid = persistent_grid(wl, config, persistent_blocks)
    wtap_blocks, xpop_blocks = side_table_blocks(wl)
    if wtap is not None:
        _run(lib, 0, args, (wtap_blocks, 1, 1), WTAP_THREADS, 0)
    if xpop is not None:
        _run(lib, 2, args, (xpop_blocks, 1, 1), XPOP_THREADS, 0)
    wimg = weight_images(wl, config, "cpu")
    if wimg is not None:  # the weights' stage images, then the main kernel reads them as its w
        wimg.fill_(-7)
        image_args = list(args)
        image_args[2] = ptr(wimg.data_ptr())
        _run(lib, 3, image_args, (grid[0], k_tiles(wl, config), 1), threads(config),
             stage_bytes(wl, config))
        args[1] = ptr(wimg.data_ptr())
    for _ in range(launches):
        out.view(torch.uint8).fill_(poison)
        _run(lib, 1, args, grid, threads(config), smem_bytes(wl, config))
    return out


def emu_tensor_map(wl: Workload, config: Config, x: torch.Tensor) -> torch.Tensor | None:
    """TMA_HALO: the emulation's stand-in for the tensor map of `x` (EmuTensorMap in 128
    bytes: the geometry of `halo_map_geometry`, swizzled TMA_HALO bytes); None without it."""
    if not tma_halo(config):
        return None
    dims, strides, box = halo_map_geometry(wl, config)
    raw = struct.pack("<Q4q3q5i", x.data_ptr(), *dims, *strides, *box, tma_halo(config))
    return torch.frombuffer(bytearray(raw.ljust(128, b"\0")), dtype=torch.uint8)


class StaleOperands(RuntimeError):
    """An emulated wgmma read shared memory that changed before the MMA completed."""


class EarlyInputRead(RuntimeError):
    """A chained kernel copied from its input before waiting for the kernel that writes it."""


def _run(lib: ctypes.CDLL, which: int, args: list, grid: tuple[int, int, int], nthreads: int,
         smem: int) -> None:
    rc = lib.emu_run(ctypes.c_int(which), *args, *(ctypes.c_int(g) for g in grid),
                     ctypes.c_int(nthreads), ctypes.c_longlong(smem))
    if rc == -2:
        raise RuntimeError("the kernel left a named barrier with arrivals pending (bar.arrive "
                           "without the threads that complete its phase)")
    if rc == -4:
        raise EarlyInputRead("a chained kernel copied from x before griddepcontrol.wait (the "
                             "previous kernel, which writes x, may still be running)")
    if rc == -3:
        raise StaleOperands("wgmma operands changed between issue and completion (a stage "
                            "refilled while its MMAs ran, or their copies landing late)")
    if rc:
        raise ValueError(f"launch refused by the emulation: {nthreads} threads, {smem} B "
                         f"of shared memory (at most 512 threads and {SMEM_LIMIT} B)")
