// Host emulation (mma_conv_emu.py): host C++ of mma_conv_device.cu's primitives, each by its
// PTX-specified behaviour, supplied in that file's place.

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
