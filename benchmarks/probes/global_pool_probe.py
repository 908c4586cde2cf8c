"""Global average pools with the map split over several programs against the unsplit launch
(GPU, same run).

The squeeze-excite pools of EfficientNet-B0 and MobileNet-V3-Large at batch 64 (their plans'
input precisions: wide s16 resp. u8, INT8 layout) and two head pools that stay unsplit
(MobileNet-V2 b64 7x7x1280: one reduction; ResNet-50 b256 7x7x2048: the window loop). Per
shape: the launch `pools.bind_avgpool2d` binds now (splits from `pools.global_pool_splits`)
and the unsplit one, each timed under CUDA-graph replay after a bit-exact check against
`lowbit.reference.avgpool2d_int`, beside the byte floor (input + output at 3.0 TB/s).

    python benchmarks/probes/global_pool_probe.py      # rows to $OUT/global_pool_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from common import write_probe
from lowbit.core import Layout, PackedTensor, Precision, WidePrecision
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton import pools
from lowbit.kernels.triton.stored import stored_dtype
from lowbit.quant.packing import pack
from lowbit.reference import avgpool2d_int, avgpool_multiplier, random_values

DRAM_BPS = 3.0e12  # device-to-device copy (docs/design.md, "Hardware facts")
S16 = WidePrecision(16)
#: (name, N, H = W, C, input precision)
SHAPES = [
    ("effnet_b0.features_1_0", 64, 112, 32, S16),
    ("effnet_b0.features_2_0", 64, 56, 96, S16),
    ("effnet_b0.features_2_1", 64, 56, 144, S16),
    ("effnet_b0.features_3_0", 64, 28, 144, S16),
    ("effnet_b0.features_3_1", 64, 28, 240, S16),
    ("effnet_b0.features_4_0", 64, 14, 240, S16),
    ("mnv3_large.features_4", 64, 28, 72, "u8"),
    ("mnv3_large.features_5", 64, 28, 120, "u8"),
    ("mnv2.head", 64, 7, 1280, "u8"),
    ("resnet50.head", 256, 7, 2048, "u8"),
]


def stored_input(shape, prec) -> tuple[PackedTensor, torch.Tensor]:
    prec = Precision.parse(prec) if isinstance(prec, str) else prec
    v = random_values(shape, prec, torch.Generator().manual_seed(1))
    data = (v.to(stored_dtype(prec, Layout.INT8)) if isinstance(prec, WidePrecision)
            else pack(v, prec, Layout.INT8))
    return PackedTensor(data.cuda(), shape, prec, Layout.INT8), v


def bound(x, out, m, s, split: bool):
    saved = pools.SPLIT_POOL_CHUNK, pools.SPLIT_POOL_MIN_CHUNK
    if not split:
        pools.SPLIT_POOL_CHUNK = pools.SPLIT_POOL_MIN_CHUNK = 1 << 30
    try:
        return K.bind_avgpool2d(x, out, None, None, 0, m, s)
    finally:
        pools.SPLIT_POOL_CHUNK, pools.SPLIT_POOL_MIN_CHUNK = saved


def main() -> None:
    rows = []
    for name, n, hw, c, prec in SHAPES:
        row = {"pool": name, "shape": [n, hw, hw, c], "input": str(prec)}
        try:
            x, v = stored_input((n, hw, hw, c), prec)
            top = float(v.sum(dim=(1, 2)).abs().max()) / (hw * hw)  # largest |mean| -> ~150
            m, s = avgpool_multiplier(hw * hw, 1.0, top / 150)
            ref = pack(avgpool2d_int(v, None, None, 0, m, s, "s8"), Precision.parse("s8"),
                       Layout.INT8)
            out = K.empty_packed((n, 1, 1, c), "s8", Layout.INT8, "cuda")
            row["floor_us"] = (x.data.numel() * x.data.element_size() + out.data.numel()) \
                / DRAM_BPS * 1e6
            for key, split in (("now", True), ("unsplit", False)):
                launcher = bound(x, out, m, s, split)
                out.data.fill_(0x5A)
                launcher()
                row[f"{key}_exact"] = bool(torch.equal(out.data.cpu(), ref))
                row[f"{key}_grids"] = [list(ln.grid) for ln in launcher.launches]
                row[f"{key}_us"] = time_us(launcher, rep_ms=100, cuda_graph=True)
        except Exception as e:  # one shape failing must not lose the others
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(row if "error" in row else
              f"{name:24s} now {row['now_us']:7.1f} us {row['now_grids']} unsplit "
              f"{row['unsplit_us']:7.1f} floor {row['floor_us']:5.1f} exact "
              f"{row['now_exact']}/{row['unsplit_exact']}", flush=True)
    print("wrote", write_probe("global_pool_probe", rows))


if __name__ == "__main__":
    main()
