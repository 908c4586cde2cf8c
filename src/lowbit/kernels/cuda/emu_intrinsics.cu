// Host emulation (bitserial_emu.py): CUDA's vector types, the block's shared memory, and
// the intrinsics the bit-serial kernels call outside the device-primitive files (popc, atomics,
// fences, cached loads); host C++ compiled with the host compiler, after emu_threads.cu.

#define LOWBIT_HOST_EMU 1
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
inline int2 make_int2(int a, int b) { return int2{a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return uint4{a, b, c, d};
}

// the block's dynamic shared memory (blocks run one at a time); the kernels declare it extern
extern "C" { alignas(256) unsigned int smem[EMU_SMEM_BYTES / 4 + 64]; }

static inline int __popc(unsigned v) { return __builtin_popcount(v); }
// the low word of (hi:lo) >> min(shift, 32) (CUDA's right funnel shift, clamped)
static inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift < 32u ? shift : 32u));
}
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
static inline unsigned char __ldg(const unsigned char* p) { return *p; }
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
