"""The operand-delivery floor of the APNN-TC conv (device call): how fast can any kernel of
the in-place halo's grid get its operands into shared memory, by each copy mechanism?

The APNN-TC layer (batch 1, 16 x 16, C = K = 1,024, 3 x 3) at BN output columns per block:
grid (1,024 / BN, 4), 128 threads; block (n, t) needs pixel tile t's halo (10 x 10 pixels x
128 B per activation plane) and column tile n's weights (9 taps x BN x 128 B). Each kernel
below only lands those bytes (no MMAs, no epilogue) and keeps them live through one
never-taken store, so its time is what the real kernel spends before its first MMA could
start plus the launch, under each mechanism:

- empty: launch, nothing copied (same grid, block and shared memory);
- cp_async: 16-byte cp.async per thread (the committed kernel's mechanism: halo chunk-major,
  out-of-image pixels zero-filled; weights as their stage image);
- bulk: one thread issues `cp.async.bulk` per halo row run (pixel-major, out-of-image rows
  and columns skipped) and per k tile of weights, on one mbarrier;
- tma: weights as bulk copies, the halo as tiled tensor copies (`cp.async.bulk.tensor`) of
  16 B x 10 x 10 boxes, one per (plane, 16-byte chunk): the chunk-major layout that wgmma
  reads in place, zeros out of the image;
- tma_px: the halo as one 128 B x 10 x 10 box per plane (pixel-major);
- tma_mc: `tma` in clusters of the 4 pixel tiles of a column tile, each weight byte multicast
  from L2 once per cluster (CTA r issues k tiles r, r + 4, ...).
Beside them, in the same process: the committed default kernel of each precision.

Prints and writes $OUT/apconv_floor.json. Usage: python benchmarks/apconv_floor.py
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

import common
from apconv_probe import empty_launcher
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.kernels.cuda import BITSERIAL
from lowbit.kernels.cuda.nvrtc import load_kernel, tensor_map_tiled
from lowbit.tune.timing import time_us

MODES = {"empty": 0, "cp_async": 1, "bulk": 2, "tma": 3, "tma_px": 4, "tma_mc": 5}
TENSOR_MODES = {"tma": 16, "tma_px": 128, "tma_mc": 16}  # box bytes per pixel
ROUNDS = 3


def _primitives() -> str:
    """The library's own device primitives (mbarrier, bulk and tensor copies, cp.async), by
    their markers."""
    from lowbit.kernels import cuda

    root = Path(cuda.__file__).parent
    out = []
    for name in ("bitserial_common.cu", "bitserial_wgmma_common.cu"):
        text = (root / name).read_text()
        region = text.split("// <device-primitives>", 1)[1].split("// </device-primitives>")[0]
        out.append("//" + region)  # the marker line's rest is a comment
    return "".join(out)


KERNEL = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
constexpr int VEC = 4;
struct __align__(64) TensorMap {{ u64 v[16]; }};  // as bitserial_common.cu's, before its use
{primitives}

constexpr int BN = {bn}, MODE = {mode}, PLANES = {planes}, BOX_BYTES = {box};
constexpr int H = 16, W = 16, PIX_BYTES = 128;  // one plane of a pixel: 1,024 channels
constexpr int HALO_H = 10, HALO_W = 10, HALO_PIX = HALO_H * HALO_W, CHUNKS = PIX_BYTES / 16;
constexpr int BOXES = PLANES * PIX_BYTES / BOX_BYTES;
// tensor copies land on 128-byte boundaries
constexpr int BOX_STRIDE = (HALO_PIX * BOX_BYTES + 127) / 128 * 128;
constexpr int HALO_BYTES = BOXES * BOX_STRIDE;
constexpr int KT = 9, KT_BYTES = BN * PIX_BYTES, W_BYTES = KT * KT_BYTES;

__device__ __forceinline__ void bulk_multicast(void* dst, const void* src, u32 bytes, u64* bar,
                                               unsigned short mask) {{
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1], %2, [%3], %4;\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "h"(mask)
               : "memory");
}}
__device__ __forceinline__ void cluster_sync() {{
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}}
__device__ __forceinline__ u32 cluster_rank() {{
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}}

// halo rows of tile (y0, x0) that lie in the image, pixel-major: bytes, or issue them
__device__ int halo_rows(const unsigned char* x, unsigned char* halo, int y0, int x0, u64* bar,
                         bool issue) {{
  int bytes = 0;
  const int xs = max(x0, 0), xe = min(x0 + HALO_W, W);
  for (int p = 0; p < PLANES; ++p)
    for (int hy = 0; hy < HALO_H; ++hy) {{
      const int yy = y0 + hy;
      if (yy < 0 || yy >= H) continue;
      const int n = (xe - xs) * PIX_BYTES;
      if (issue)
        bulk_copy((u32*)(halo + ((p * HALO_H + hy) * HALO_W + xs - x0) * PIX_BYTES),
                  (const u32*)(x + ((size_t)(p * H + yy) * W + xs) * PIX_BYTES), n, bar);
      bytes += n;
    }}
  return bytes;
}}

extern "C" __global__ void {cluster} __launch_bounds__(128)
floor_kernel(const unsigned char* __restrict__ x, const unsigned char* __restrict__ w,
             u32* __restrict__ out, const __grid_constant__ TensorMap xmap) {{
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* halo = smem;
  unsigned char* wts = smem + HALO_BYTES;
  u64* bar = (u64*)(wts + W_BYTES);
  const int tid = (int)threadIdx.x;
  const int y0 = (blockIdx.y / 2) * 8 - 1, x0 = (blockIdx.y % 2) * 8 - 1;
  const unsigned char* wsrc = w + (size_t)blockIdx.x * W_BYTES;
  if constexpr (MODE == 0) {{
    if (x == nullptr) out[0] = 0;
    return;
  }}
  if constexpr (MODE == 1) {{
    for (int i = tid; i < PLANES * CHUNKS * HALO_PIX; i += 128) {{
      const int p = i / (CHUNKS * HALO_PIX), c = i / HALO_PIX % CHUNKS, pix = i % HALO_PIX;
      const int yy = y0 + pix / HALO_W, xx = x0 + pix % HALO_W;
      const bool ok = yy >= 0 && yy < H && xx >= 0 && xx < W;
      const size_t at = ((size_t)(p * H + (ok ? yy : 0)) * W + (ok ? xx : 0)) * PIX_BYTES;
      copy_async((u32*)(halo + i * 16), (const u32*)(x + at + c * 16), ok);
    }}
    for (int i = tid; i < W_BYTES / 16; i += 128)
      copy_async((u32*)(wts + i * 16), (const u32*)(wsrc + i * 16), true);
    copy_commit();
    copy_wait<0>();
    __syncthreads();
  }} else {{
    if (tid == 0) {{
      mbar_init(bar, 1);
      fence_mbar_init();
    }}
    if constexpr (MODE == 5) cluster_sync();  // every CTA's barrier set up before multicasts
    else __syncthreads();
    if (tid == 0) {{
      const int halo_bytes = MODE == 2 ? halo_rows(x, halo, y0, x0, bar, false)
                                       : BOXES * HALO_PIX * BOX_BYTES;
      mbar_expect_tx(bar, halo_bytes + W_BYTES);
      if constexpr (MODE == 2) halo_rows(x, halo, y0, x0, bar, true);
      else
        for (int b = 0; b < BOXES; ++b) {{
          const int p = b / (PIX_BYTES / BOX_BYTES), c = b % (PIX_BYTES / BOX_BYTES);
          tensor_copy_4d((u32*)(halo + b * BOX_STRIDE), &xmap, c * BOX_BYTES, x0, y0, p, bar);
        }}
      if constexpr (MODE == 5) {{
        for (int kt = (int)cluster_rank(); kt < KT; kt += 4)
          bulk_multicast(wts + kt * KT_BYTES, wsrc + kt * KT_BYTES, KT_BYTES, bar, 0xF);
      }} else {{
        for (int kt = 0; kt < KT; ++kt)
          bulk_copy((u32*)(wts + kt * KT_BYTES), (const u32*)(wsrc + kt * KT_BYTES), KT_BYTES,
                    bar);
      }}
    }}
    mbar_wait(bar, 0);
  }}
  const u32 s = ((const u32*)halo)[tid] ^ ((const u32*)wts)[tid];
  if (s == 0x9E3779B9u) out[blockIdx.x * gridDim.y + blockIdx.y] = s;  // never: keeps the data
  if constexpr (MODE == 5) cluster_sync();  // no CTA leaves while a peer's copy may reach it
}}
"""


def floor_source(mode: str, bn: int, planes: int) -> str:
    box = TENSOR_MODES.get(mode, 16)
    cluster = "__cluster_dims__(1, 4, 1)" if mode == "tma_mc" else ""
    return KERNEL.format(primitives=_primitives(), bn=bn, mode=MODES[mode], planes=planes,
                         box=box, cluster=cluster)


def smem_bytes(mode: str, bn: int, planes: int) -> int:
    """The kernel's halo (boxes on 128-byte boundaries), weights and mbarrier, in bytes."""
    box = TENSOR_MODES.get(mode, 16)
    return planes * 128 // box * ((100 * box + 127) // 128 * 128) + 9 * bn * 128 + 64


def tensor_map(x: torch.Tensor, box_bytes: int) -> ctypes.Array:
    """Tiled tensor map of x [planes, 16, 16, 128 B] (uint8): box box_bytes x 10 x 10 x 1,
    zeros out of bounds."""
    return tensor_map_tiled(x.data_ptr(), [128, 16, 16, x.shape[0]],
                            [128, 16 * 128, 16 * 16 * 128], [box_bytes, 10, 10, 1])


def floor_launcher(mode: str, bn: int, planes: int, x: torch.Tensor, w: torch.Tensor,
                   out: torch.Tensor):
    kernel = load_kernel(floor_source(mode, bn, planes), "floor_kernel")
    tmap = tensor_map(x, TENSOR_MODES.get(mode, 16))
    smem = smem_bytes(mode, bn, planes)
    grid = (1024 // bn, 4, 1)
    return lambda: kernel.launch(grid, 128, [x, w, out, tmap], shared_mem=smem)


def real_default(prec: str):
    wl = bitserial_workload(dict(workloads(False))["apconv_b1_c1024"], prec)
    cfg = BITSERIAL.default_config(wl, "wgmma")
    kernel = BITSERIAL.build(wl, cfg)
    x, w, params = gpu_inputs(wl, 1)
    return kernel.bind(x, w, params), empty_launcher(kernel, x), dict(cfg)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for prec, planes in (("w1a2", 2), ("w1a1", 1)):
        x = torch.randint(0, 256, (planes, 16, 16, 128), generator=g, device="cuda",
                          dtype=torch.uint8)
        w = torch.randint(0, 256, (1024 * 9 * 128,), generator=g, device="cuda",
                          dtype=torch.uint8)
        out = torch.zeros(1024, dtype=torch.int32, device="cuda")
        real, real_empty, cfg = real_default(prec)
        launchers = {"real_default": real, "real_empty": real_empty}
        for bn in (32, 64):
            for mode in MODES:
                launchers[f"{mode}_bn{bn}"] = floor_launcher(mode, bn, planes, x, w, out)
        times: dict[str, list[float]] = {name: [] for name in launchers}
        for _ in range(ROUNDS):  # rounds interleave the variants
            for name, fn in launchers.items():
                try:
                    times[name].append(time_us(fn, cuda_graph=True))
                except Exception as e:  # a variant that fails is reported, not fatal
                    times[name].append(float("nan"))
                    print(f"{prec} {name}: {type(e).__name__}: {e}"[:300], flush=True)
        row = {"precision": prec, "real_config": cfg, "us": times,
               "median_us": {k: sorted(v)[len(v) // 2] for k, v in times.items()}}
        print(json.dumps({"precision": prec, "median_us": row["median_us"]}), flush=True)
        rows.append(row)
    common.write_probe("apconv_floor", rows)


if __name__ == "__main__":
    main()
