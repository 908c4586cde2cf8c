// Host emulation (bitserial_emu.py): host C++ of bitserial_wgmma_device.cu's primitives and of
// the rendered wgmma wrappers (descriptors, swizzles, wgmma issued and completed at the latest
// legal moment, mbarriers with bulk and tensor copies), supplied in their place.

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
