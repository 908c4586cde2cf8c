"""cuda.int8_wgmma's default against the first valid preferred config (GPU, same run).

The default takes a smaller tile where the first preferred config's grid has fewer than
MIN_DEFAULT_TILES tiles (classifier GEMMs at small M, batch-8 convs). For the layers whose
pick that changes: both configs' median times, checked exact first on the layer itself.

    python benchmarks/probes/int8_default_probe.py      # rows to $OUT/int8_default_probe.json
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from bitserial import gpu_inputs
from common import cudnn_fp16_conv_us, fp16_gemm_us, write_probe
from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Layout, Precision
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.cuda import int8_wgmma
from lowbit.kernels.cuda.bitserial_layout import tile_grid
from lowbit.kernels.timing import time_us
from lowbit.reference import run

I8, S8 = Layout.INT8, Precision(8, "signed")
EPI = Epilogue(bias=True, out=S8, out_layout=I8)
LAYERS = {  # (M, N, K) GEMMs and conv dims
    "fc_resnet50_b256": dict(M=256, N=1000, K=2048),
    "fc_alexnet_b8": dict(M=8, N=1000, K=4096),
    "fc6_alexnet_b8": dict(M=8, N=4096, K=9216),
    "fc6_vgg16_b8": dict(M=8, N=4096, K=25088),
    "resnet18_28x28_128to128_b8": dict(N=8, H=28, W=28, C=128, K=128, R=3, S=3, stride=1, pad=1),
    "resnet18_56x56_64to128_s2_b8": dict(N=8, H=56, W=56, C=64, K=128, R=3, S=3, stride=2,
                                         pad=1),
    "resnet50_s5_3x3_b16": dict(N=16, H=7, W=7, C=512, K=512, R=3, S=3, stride=1, pad=1),
}


def workload(dims: dict):
    cls = GemmWorkload if "M" in dims else ConvWorkload
    return cls(w=S8, a=S8, w_layout=I8, a_layout=I8, epilogue=EPI, **dims)


def first_preferred(t, wl) -> Config:
    """The default as it was: the first valid preferred config, whatever its grid."""
    saved, int8_wgmma.MIN_DEFAULT_TILES = int8_wgmma.MIN_DEFAULT_TILES, 0
    try:
        return t.default_config(wl, "sm_90a")
    finally:
        int8_wgmma.MIN_DEFAULT_TILES = saved


def timed(t, wl, cfg, x, w, params) -> tuple[float, bool]:
    kernel = t.build(wl, cfg)
    exact = bool(torch.equal(kernel(x, w, params).cpu(), run(wl, x.cpu(), w.cpu(),
                                                             params.to("cpu"))))
    return time_us(kernel.bind(x, w, params), rep_ms=100), exact


def main() -> None:
    load_backends()
    t = get_template("cuda.int8_wgmma")
    rows = []
    for name, dims in LAYERS.items():
        wl = workload(dims)
        try:
            old, new = first_preferred(t, wl), t.default_config(wl, "sm_90a")
            x, w, params = gpu_inputs(wl, seed=1)
            row = {"layer": name, "old": dict(old), "new": dict(new),
                   "old_tiles": math.prod(tile_grid(wl, t.spec(old))),
                   "new_tiles": math.prod(tile_grid(wl, t.spec(new)))}
            row["old_us"], row["old_exact"] = timed(t, wl, old, x, w, params)
            row["new_us"], row["new_exact"] = timed(t, wl, new, x, w, params)
            row["fp16_us"] = fp16_gemm_us(wl) if "M" in dims else cudnn_fp16_conv_us(wl)
        except Exception as e:  # one layer failing must not lose the others
            row = {"layer": name, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        print(row if "error" in row else
              f"{name:32s} old {row['old_us']:8.1f} us ({row['old_tiles']} tiles) new "
              f"{row['new_us']:8.1f} us ({row['new_tiles']} tiles) fp16 {row['fp16_us']:7.1f}"
              f" exact {row['old_exact']}/{row['new_exact']}", flush=True)
    print("wrote", write_probe("int8_default_probe", rows))


if __name__ == "__main__":
    main()
