"""The int8 implicit-GEMM kernel with a block end's layer epilogue fused, against the same
kernel writing its int32 accumulator plus the separate pass (GPU).

Each layer is a residual block end with u8 activations: two outputs (u8 with ReLU, a 24-bit
wide copy) and a 24-bit residual. Rows: the separate path (the template's default config,
then `netops.bind_layer_epilogue`) and the fused kernel (`conv_outputs.bind_conv_outputs`)
under several tile shapes and warp counts, each with its registers and spilled bytes
(Triton's compile) and its median time; every fused output checked against the separate
path's on the whole batch.

    python benchmarks/probes/conv_outputs_probe.py    # rows to $OUT/conv_outputs_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_probe
from lowbit.core import ConvWorkload, Layout, PackedTensor, WidePrecision
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import CONV2D_INT8
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton.conv_outputs import bind_conv_outputs
from lowbit.kernels.triton.templates import IgemmKernel, problem
from lowbit.reference import fixed_point_pair, random_inputs

S24 = WidePrecision(24)
LAYERS = {
    "resnet50_layer1_conv3_b256": ConvWorkload(N=256, H=56, W=56, C=64, K=256, R=1, S=1,
                                               a="u8"),
    "resnet50_layer3_conv3_b256": ConvWorkload(N=256, H=14, W=14, C=256, K=1024, R=1, S=1,
                                               a="u8"),
    "resnet18_layer1_conv2_b8": ConvWorkload(N=8, H=56, W=56, C=64, K=64, R=3, S=3, pad=1,
                                             a="u8"),
}
TILES = [  # (BLOCK_M, BLOCK_N, num_warps)
    (128, 128, 4), (128, 128, 8), (128, 64, 4), (64, 128, 4), (64, 64, 4), (64, 64, 2),
    (32, 64, 2), (64, 32, 2),
]


def specs_for(k: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for prec, relu in (("u8", True), (S24, False)):
        ratio = torch.rand(k, generator=g, dtype=torch.float64) * 1e-3 + 1e-4
        rr = torch.rand(k, generator=g, dtype=torch.float64) * 0.5 + 0.1
        m, r, s = fixed_point_pair(ratio, rr)
        out.append(K.Requantized(prec, m, s, None, r, relu=relu))
    return out


def probe(name: str, wl: ConvWorkload) -> list[dict]:
    rows = []
    x, w, params = random_inputs(wl, seed=1, device="cuda")
    default = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    shape = (wl.N, wl.P, wl.Q, wl.K)
    g = torch.Generator(device="cuda").manual_seed(2)
    res = PackedTensor(torch.randint(-(2**23), 2**23, shape, generator=g, device="cuda",
                                     dtype=torch.int32), shape, S24, Layout.INT8)
    specs = specs_for(wl.K, 3)

    def outs():
        return [K.empty_packed(shape, sp.precision, Layout.INT8, "cuda") for sp in specs]

    acc = torch.empty(shape, dtype=torch.int32, device="cuda")
    ref = outs()
    kernel_launch = default.bind(x, w, params, acc)
    pass_launch = K.bind_layer_epilogue(acc, specs, ref, res)

    def separate():
        kernel_launch()
        pass_launch()

    separate()
    torch.cuda.synchronize()
    rows.append({"layer": name, "path": "kernel int32 + pass", "config": dict(default.config),
                 "us": time_us(separate), "kernel_us": time_us(kernel_launch),
                 "pass_us": time_us(pass_launch)})
    print(rows[-1], flush=True)
    for bm, bn, warps in TILES:
        cfg = default.config.replace(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, SPLIT_K=1)
        row = {"layer": name, "path": "fused", "config": dict(cfg)}
        try:
            kernel = IgemmKernel("probe", wl, cfg, problem(wl, False))
            got = outs()
            launch = bind_conv_outputs(kernel, x, w, params, specs, got, res,
                                       tile=dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps))
            s = launch.launches[0]
            compiled = s.fn.warmup(*s.args, grid=s.grid, **s.kwargs)
            compiled._init_handles()  # loads the binary: fills n_regs / n_spills
            row.update(regs=compiled.n_regs, spills=compiled.n_spills)
            launch()
            torch.cuda.synchronize()
            row["exact"] = all(torch.equal(a.data, b.data) for a, b in zip(got, ref,
                                                                            strict=True))
            row["us"] = time_us(launch)
        except Exception as e:  # one config's failure must not end the probe
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    rows = []
    for name, wl in LAYERS.items():
        rows += probe(name, wl)
        write_probe("conv_outputs_probe", rows)
    print(write_probe("conv_outputs_probe", rows))


if __name__ == "__main__":
    main()
