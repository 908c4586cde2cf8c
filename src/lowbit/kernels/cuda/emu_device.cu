// Host emulation (bitserial_emu.py): host C++ of bitserial_device.cu's primitives, each by its
// PTX-specified behaviour (cp.async queued until its wait_group, named barriers, mma.sync b1
// AND by the fragment layouts, griddepcontrol), supplied in that file's place.

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
