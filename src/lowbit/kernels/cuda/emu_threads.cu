// Host emulations (host_emu.py): the thread model both emulations share: CUDA's launch
// qualifiers compiled away, thread and block indices per std::thread, a block barrier and
// per-warp barriers, the warp shuffle, and the block runner (blocks one at a time, shared
// memory refilled with 0xCD garbage, not zeros).

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __restrict__
#define __shared__
#define __align__(n)
#define __grid_constant__
struct EmuDim { unsigned x, y, z; };
thread_local EmuDim threadIdx, blockIdx;
EmuDim blockDim, gridDim;

struct EmuWarp { std::barrier<>* bar; unsigned long long slot[32][8]; };
struct EmuBlock {
  unsigned char* smem;
  long long smem_size;
  std::barrier<>* bar;
  EmuWarp warps[32];
};
thread_local EmuBlock* emu;

static void emu_fail(const char* what) { fprintf(stderr, "emu: %s\n", what); abort(); }
static inline int emu_lane() { return threadIdx.x & 31; }
static inline EmuWarp& emu_warp() { return emu->warps[threadIdx.x >> 5]; }

static inline void __syncthreads() { emu->bar->arrive_and_wait(); }
static inline void __syncwarp() { emu_warp().bar->arrive_and_wait(); }
static inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  EmuWarp& wp = emu_warp();
  wp.slot[emu_lane()][7] = v;
  wp.bar->arrive_and_wait();
  const unsigned r = (unsigned)wp.slot[src & 31][7];
  wp.bar->arrive_and_wait();
  return r;
}
static inline int __shfl_sync(unsigned m, int v, int src) {
  return (int)__shfl_sync(m, (unsigned)v, src);
}
static inline unsigned __shfl_xor_sync(unsigned m, unsigned v, int mask) {
  return __shfl_sync(m, v, emu_lane() ^ mask);
}

// mma.sync: publish this lane's A (4 registers) and B (2) fragments in slots 0-5 of its warp
// and wait for the other lanes; the caller reads any lane's fragments, then waits once more.
static inline EmuWarp& emu_share_fragments(const unsigned (&a)[4], unsigned b0, unsigned b1) {
  EmuWarp& wp = emu_warp();
  const int lane = emu_lane();
  for (int r = 0; r < 4; ++r) wp.slot[lane][r] = a[r];
  wp.slot[lane][4] = b0;
  wp.slot[lane][5] = b1;
  wp.bar->arrive_and_wait();
  return wp;
}

// Set by an emulation that checks each block's end state once its threads have joined (false:
// the block failed the check; emu_run_blocks then clears emu_blocks_ok).
static bool (*emu_block_end)() = nullptr;
static bool emu_blocks_ok = true;

// Run `body` as every thread of every block of a grid_x x grid_y x grid_z launch of nthreads
// threads; smem[0, smem_size) is the block's shared memory, the first fill_bytes refilled per
// block. Blocks run one at a time; the z blocks of one (x, y) run in a rotated order, so the
// last of them to run differs from tile to tile (split-K: any block may arrive last).
template <class Body>
static void emu_run_blocks(int nthreads, int grid_x, int grid_y, int grid_z, unsigned char* smem,
                           long long smem_size, long long fill_bytes, Body body) {
  std::barrier<> block_bar(nthreads);
  std::vector<std::barrier<>*> warp_bars;
  EmuBlock blk;
  blk.smem = smem;
  blk.smem_size = smem_size;
  blk.bar = &block_bar;
  for (int i = 0; i < nthreads / 32; ++i) {
    warp_bars.push_back(new std::barrier<>(32));
    blk.warps[i].bar = warp_bars.back();
  }
  blockDim = EmuDim{(unsigned)nthreads, 1, 1};
  gridDim = EmuDim{(unsigned)grid_x, (unsigned)grid_y, (unsigned)grid_z};
  for (int zi = 0; zi < grid_z; ++zi)
  for (int by = 0; by < grid_y; ++by) {
    for (int bx = 0; bx < grid_x; ++bx) {
      const int bz = (zi + bx + by) % grid_z;
      memset(smem, 0xCD, fill_bytes);
      std::vector<std::thread> pool;
      for (int t = 0; t < nthreads; ++t) {
        pool.emplace_back([&, t] {
          threadIdx = EmuDim{(unsigned)t, 0, 0};
          blockIdx = EmuDim{(unsigned)bx, (unsigned)by, (unsigned)bz};
          emu = &blk;
          body();
        });
      }
      for (auto& th : pool) th.join();
      if (emu_block_end && !emu_block_end()) emu_blocks_ok = false;
    }
  }
  for (auto* b : warp_bars) delete b;
}
