// Host emulation (stem_ws_emu.py): host C++ of stem_ws_device.cu's primitives, supplied in its
// place: mbarriers as phase counters under a lock (an arrival past the expected count, a wait
// that never completes, or a block ending with arrivals pending fails the run), the quantizer
// in IEEE float32, the status flag.

struct EmuMbar {
  std::mutex mu;
  std::condition_variable cv;
  int expected = 0, arrived = 0;
  unsigned long long phase = 0;
};
static std::map<u32, EmuMbar> emu_mbars;  // by shared-memory offset; blocks run one at a time
static std::mutex emu_mbars_lock;
static inline EmuMbar& emu_mbar(u64* bar, bool init) {
  std::lock_guard<std::mutex> g(emu_mbars_lock);
  const u32 at = smem_u32(bar);
  if (at % 8) emu_fail("misaligned mbarrier");
  if (!init && !emu_mbars.count(at)) emu_fail("mbarrier used before its init");
  return emu_mbars[at];
}
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
  EmuMbar& b = emu_mbar(bar, true);
  std::lock_guard<std::mutex> g(b.mu);
  b.expected = count;
  b.arrived = 0;
  b.phase = 0;
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  EmuMbar& b = emu_mbar(bar, false);
  std::lock_guard<std::mutex> g(b.mu);
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.phase;
    b.cv.notify_all();
  }
}
__device__ __forceinline__ void mbar_wait(u64* bar, int parity) {
  EmuMbar& b = emu_mbar(bar, false);
  std::unique_lock<std::mutex> lock(b.mu);
  if (!b.cv.wait_for(lock, std::chrono::seconds(300),
                     [&] { return (int)(b.phase & 1) != parity; }))
    emu_fail("mbarrier phase never completed");
}
// every mbarrier of the block ended with no arrivals pending (emu_run_blocks' end check)
static bool emu_mbars_idle() {
  bool idle = true;
  for (auto& [at, b] : emu_mbars) idle = idle && b.arrived == 0;
  emu_mbars.clear();
  return idle;
}
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
__device__ __forceinline__ int quantize_value(float x, float scale) {
  const float v = floorf(__fadd_rn(__fdiv_rn(x, scale), 0.5f));
  return (int)fminf(fmaxf(v, (float)QMIN), (float)QMAX);
}
static inline int saturate_index(float u) {
  return u >= 255.0f ? 255 : (u >= 1.0f ? (int)u : 0);  // NaN: 0
}
__device__ __forceinline__ void flag_status(int* status) {
  std::atomic_ref<int> s(*status);
  int old = s.load();
  while (old < 1 && !s.compare_exchange_weak(old, 1)) {}
}
using std::max;
