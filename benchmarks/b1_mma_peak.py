"""Tensor-core rate of the b1 AND-popc instructions on the current GPU, with no loads in the loop.

mma.sync m16n8k256 (register fragments, 8 independent accumulators per warp) against wgmma
m64nNk256 (sm_90a; N = 64, 128, 256; A from shared memory or registers, B from shared memory in
the unswizzled core-matrix layout or the 32-byte swizzle of the wgmma families' SWIZZLE knob;
1 or 2 warpgroups per block, 2 blocks per SM). Reports T bit-ops/s (2 * m * n * k per
instruction), best of 5 launches timed with CUDA events. The wgmma rows need an sm_90a GPU.

Usage: python benchmarks/b1_mma_peak.py   (writes results/<gpu>/b1_mma_peak-<stamp>.json)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from lowbit.kernels.cuda.bitserial_render import wgmma_source as wgmma_wrappers
from lowbit.kernels.cuda.bitserial_shape import WGMMA_ARCH
from lowbit.kernels.cuda.nvrtc import device_arch, load_kernel

HDR = "typedef unsigned int u32;\ntypedef unsigned long long u64;\n"
UNROLL = 4  # wgmma per commit group


def _wgmma_rs(n: int) -> str:
    """wgmma_rs: the m64nNk256 b1 AND with the A fragment (4 x b32 per thread) in registers."""
    regs = n // 2
    ops = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+r"(d[0][0][{k // 4}][{k % 4}])' for k in range(regs))
    return (
        "__device__ __forceinline__ void wgmma_rs(int (&d)[P_BITS][MT][NT][4], "
        "const u32 (&a)[4], u64 db) {\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
        f'  "wgmma.mma_async.sync.aligned.m64n{n}k256.s32.b1.b1.and.popc {{{ops}}}, '
        f'{{%{regs},%{regs + 1},%{regs + 2},%{regs + 3}}}, %{regs + 4}, p;\\n}}\\n"\n'
        f'  : {outs} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));\n}}\n')


def wgmma_source(n: int, swizzle: int, a_in_registers: bool) -> str:
    """Kernel `peak(out, iters)`: each warpgroup issues UNROLL wgmma per commit group, keeping
    one group in flight, on one shared-memory tile (filled once)."""
    desc = ("start | (1ull << 16) | (16ull << 32) | (3ull << 62)" if swizzle
            else "start | (8ull << 16) | (16ull << 32)")
    call = "wgmma_rs(acc, af, db);" if a_in_registers else "wgmma_planes(acc, da, db, 1);"
    return (HDR + f"constexpr int P_BITS = 1, MT = 1, NT = {n // 8}, RS_REGS = 4;\n"
            + wgmma_wrappers(1, n) + (_wgmma_rs(n) if a_in_registers else "") + f"""
__device__ __forceinline__ u64 desc(const u32* p) {{
  const u64 start = ((u64)__cvta_generic_to_shared(p) & 0x3FFFF) >> 4;
  return {desc};
}}
extern "C" __global__ void peak(int* out, int iters) {{
  extern __shared__ __align__(1024) u32 smem[];
  const int tid = threadIdx.x, wg = tid >> 7;
  const int words = (blockDim.x / 128) * 512 + {n} * 8;
  for (int i = tid; i < words; i += blockDim.x) smem[i] = i * 2654435761u;
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  __syncthreads();
  int acc[1][1][NT][4];
  for (int i = 0; i < NT; ++i) for (int e = 0; e < 4; ++e) acc[0][0][i][e] = 0;
  const u64 da = desc(smem + wg * 512), db = desc(smem + (blockDim.x / 128) * 512);
  const u32 af[4] = {{smem[tid], smem[tid + 1], smem[tid + 2], smem[tid + 3]}};
  for (int it = 0; it < iters; ++it) {{
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) {{ {call} }}
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
  int s = 0;
  for (int i = 0; i < NT; ++i) for (int e = 0; e < 4; ++e) s += acc[0][0][i][e];
  out[blockIdx.x * blockDim.x + tid] = s;
}}
""")


MMA_SYNC = HDR + r"""
extern "C" __global__ void peak(int* out, int iters) {
  int c[8][4] = {};
  unsigned x = threadIdx.x * 2654435761u, y = x ^ 0x5bd1e995u;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      asm volatile("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+r"(c[k][0]), "+r"(c[k][1]), "+r"(c[k][2]), "+r"(c[k][3])
          : "r"(x), "r"(y), "r"(x), "r"(y), "r"(x), "r"(y));
  }
  int s = 0;
  for (int k = 0; k < 8; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def best_seconds(kernel, grid: int, block: int, iters: int, smem: int) -> float:
    out = torch.empty(grid * block, dtype=torch.int32, device="cuda")
    kernel.launch(grid, block, [out, iters], shared_mem=smem)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        kernel.launch(grid, block, [out, iters], shared_mem=smem)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    return best


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = 2 * sms
    rows = []
    kernel = load_kernel(MMA_SYNC, "peak")
    for warps in (4, 8, 16):
        iters = 4096
        t = best_seconds(kernel, blocks, warps * 32, iters, 0)
        ops = 2 * 16 * 8 * 256 * 8 * iters * warps * blocks
        rows.append({"kind": "mma.sync m16n8k256", "warps_per_block": warps, "blocks_per_sm": 2,
                     "tops": ops / t / 1e12})
        print(rows[-1], flush=True)
    if device_arch() != WGMMA_ARCH:
        print("no wgmma on this GPU")
    else:
        for n in (64, 128, 256):
            for swizzle in (0, 32):
                for rs in (False, True):
                    for wgs in (1, 2):
                        kernel = load_kernel(wgmma_source(n, swizzle, rs), "peak")
                        iters = 2048
                        t = best_seconds(kernel, blocks, wgs * 128, iters, (wgs * 512 + n * 8) * 4)
                        ops = 2 * 64 * n * 256 * UNROLL * iters * wgs * blocks
                        rows.append({"kind": f"wgmma m64n{n}k256 {'rs' if rs else 'ss'} "
                                             f"swz{swizzle}", "warpgroups_per_block": wgs,
                                     "blocks_per_sm": 2, "tops": ops / t / 1e12})
                        print(rows[-1], flush=True)
    print(f"wrote {common.write_results('b1_mma_peak', rows)}")


if __name__ == "__main__":
    main()
