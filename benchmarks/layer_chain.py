"""Bit-serial conv layers in a chain: each layer reads the previous one's output, as in a network,
launched plainly and as programmatic dependents (`BitserialKernel.bind(chained=True)`, PDL).

For each layer (C = K, stride 1: its bit-plane output is the next layer's input) and config:
- `isolated_us`: one launcher replayed alone (the figure of benchmarks/bitserial.py);
- `pair_us`: two launchers x -> y -> x replayed back to back, per layer, plain launches;
- `chained_us`: the same pair with chained=True, per layer (the faster trigger; both are
  kept, `chained_<trigger>_us`, and the one bind's trigger="auto" picks, `chained_auto_us`):
  each layer's blocks start on the SMs the previous one leaves free, issue their weights'
  copies, then wait for it.
Beside each layer, `empty`: a kernel of the default config's grid, block and shared memory
that only triggers and waits, timed the same three ways (the launch and dependency floor).
Every launcher pair is first run on fresh inputs and checked bit for bit against
`lowbit.reference.run`, layer by layer, plain and chained. Baselines in the same run: cuDNN fp16
alone and as the same x -> y -> x pair (channels_last), and for the APNN-TC conv the published
kernel's 17 us (a single launch, issue 6). Timing: CUDA-graph replays, median
(`lowbit.kernels.timing.time_us`). Floors: `workload_floor_us(wl, "bitserial")`.

Usage: python benchmarks/layer_chain.py [--layers apconv_b1_c1024,...] [--precisions w1a2,w1a1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bitserial import APNN_TC_US, bitserial_workload, build, gpu_inputs, valid
from lowbit.core import Config, ConvWorkload, Workload
from lowbit.core.hardware import gpu_spec_for
from lowbit.core.workloads import load_workloads
from lowbit.kernels.cuda import BitserialKernel, default_bitserial, family_of
from lowbit.kernels.cuda import bitserial_layout as layout
from lowbit.kernels.cuda.bitserial_kernel import CHAIN_TRIGGERS
from lowbit.kernels.cuda.nvrtc import load_kernel
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import measure_bandwidth, workload_floor_us
from lowbit.reference import run

LAYERS = {"apconv_b1_c1024": ConvWorkload(N=1, H=16, W=16, C=1024, K=1024, R=3, S=3, pad=1),
          **dict(load_workloads("apconv_sweep"))}


def default_spec(wl: Workload) -> Config:
    family, cfg = default_bitserial(wl)
    return family.spec(cfg)


def candidates(wl: Workload) -> list[Config]:
    """The default config (kernel parameters), then its in-place twins that change how the
    SMs are shared: 32 or 64 columns per block, weights by bulk or by cp.async, the window by
    tensor copies, both activation planes as rows (PLANE_ROWS: 4 x 8 pixel tiles, twice the
    blocks, each reading all its weights, which a chained block copies before its wait)."""
    d = default_spec(wl)
    twins = [d]
    if d["A_IN_HALO"]:
        for bn in (32, 64):
            for bulk in (0, 1):
                twins.append(d.replace(BN=bn, WN=bn, BULK_WEIGHTS=bulk))
            twins.append(d.replace(BN=bn, WN=bn, BULK_WEIGHTS=1, TMA_HALO=128))
            twins.append(d.replace(BN=bn, WN=bn, BULK_WEIGHTS=1, PLANE_ROWS=1))
    return [c for c in dict.fromkeys(twins) if valid(wl, c)]


def check_pair(kernel: BitserialKernel, chained: bool, seed: int,
               trigger: str = "start") -> bool:
    """x -> y -> z by two launchers of `kernel` on fresh inputs: both outputs bit-exact."""
    wl = kernel.workload
    x, w, params = gpu_inputs(wl, seed)
    y, z = torch.empty_like(x), torch.empty_like(x)
    for t in (y, z):
        t.view(torch.uint8).fill_(0xA5)
    first = kernel.bind(x, w, params, out=y, chained=chained, trigger=trigger)
    second = kernel.bind(y, w, params, out=z, chained=chained, trigger=trigger)
    first()
    second()
    torch.cuda.synchronize()
    return torch.equal(y, run(wl, x, w, params)) and torch.equal(z, run(wl, y, w, params))


def timed(fn) -> float:
    return time_us(fn, cuda_graph=True)


def config_row(wl: Workload, cfg: Config, seed: int) -> dict:
    family = family_of(cfg)
    row: dict = {"template": family.name, "config": dict(family.config_of(cfg))}
    kernel = build(wl, cfg)  # one build: its chained kernels compile once too
    row["exact"] = check_pair(kernel, False, seed) and all(
        check_pair(kernel, True, seed + 1 + i, trigger)
        for i, trigger in enumerate(CHAIN_TRIGGERS))
    if not row["exact"]:
        return row
    x, w, params = gpu_inputs(wl, seed)
    y = torch.empty_like(x)
    plain = [kernel.bind(x, w, params, out=y), kernel.bind(y, w, params, out=x)]
    row["isolated_us"] = timed(plain[0])
    row["pair_us"] = timed(lambda: (plain[0](), plain[1]())) / 2
    for trigger in CHAIN_TRIGGERS:
        pair = [kernel.bind(x, w, params, out=y, chained=True, trigger=trigger),
                kernel.bind(y, w, params, out=x, chained=True, trigger=trigger)]
        row[f"chained_{trigger}_us"] = timed(lambda p=pair: (p[0](), p[1]())) / 2
    row["chained_us"] = min(row[f"chained_{t}_us"] for t in CHAIN_TRIGGERS)
    row["auto_trigger"] = kernel.bind(x, w, params, out=y, chained=True).chain_trigger
    row["chained_auto_us"] = row[f"chained_{row['auto_trigger']}_us"]
    return row


EMPTY_SOURCE = """extern "C" __global__ void chain_empty(int* flag) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (flag[0] == 12345) flag[1] = 1;  // a read after the wait, as a layer's
}
"""


def empty_row(wl: Workload, cfg: Config) -> dict:
    """The launch and dependency floor of `cfg`'s grid: a kernel of its grid, block and shared
    memory that triggers, waits and exits, alone, as a plain pair and as a chained pair."""
    kernel = load_kernel(EMPTY_SOURCE, "chain_empty")
    grid, block = layout.tile_grid(wl, cfg), layout.threads(cfg)
    smem = layout.smem_bytes(wl, cfg)
    flag = torch.zeros(2, dtype=torch.int32, device="cuda")

    def launch(programmatic: bool = False) -> None:
        kernel.launch(grid, block, [flag], shared_mem=smem, programmatic=programmatic)

    return {"grid": list(grid), "threads": block, "smem_bytes": smem,
            "isolated_us": timed(launch), "pair_us": timed(lambda: (launch(), launch())) / 2,
            "chained_us": timed(lambda: (launch(True), launch(True))) / 2}


def cudnn_us(wl: ConvWorkload) -> dict:
    """cuDNN fp16 (channels_last, benchmark mode): one conv alone, and x -> y -> x per conv."""
    torch.backends.cudnn.benchmark = True
    x = torch.randn(wl.N, wl.C, wl.H, wl.W, device="cuda", dtype=torch.float16)
    x = x.to(memory_format=torch.channels_last)
    w = torch.randn(wl.K, wl.C, wl.R, wl.S, device="cuda", dtype=torch.float16)
    w = w.to(memory_format=torch.channels_last)

    def conv(t):
        return F.conv2d(t, w, stride=wl.stride, padding=wl.pad)

    conv(conv(x))
    return {"cudnn_fp16": timed(lambda: conv(x)),
            "cudnn_fp16_pair": timed(lambda: conv(conv(x))) / 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=lambda v: v.split(","),
                    default=["apconv_b1_c1024", "apconv_sweep_c512", "apconv_sweep_c1024"])
    ap.add_argument("--precisions", type=lambda v: v.split(","), default=["w1a2", "w1a1"])
    args = ap.parse_args()
    peaks = dataclasses.replace(gpu_spec_for(common.gpu_name()), bandwidth=measure_bandwidth())
    rows = []
    for name in args.layers:
        base = LAYERS[name]
        base_us = cudnn_us(base)
        for prec in args.precisions:
            wl = bitserial_workload(base, prec)
            row = {"workload": name, "precision": prec,
                   "workload_key": wl.key, "floor_us": workload_floor_us(wl, "bitserial", peaks),
                   "baselines_us": base_us, "configs": []}
            if (name, prec) in APNN_TC_US:
                row["apnn_tc_published_us"] = APNN_TC_US[(name, prec)]
            row["empty"] = empty_row(wl, default_spec(wl))
            for i, cfg in enumerate(candidates(wl)):
                try:
                    row["configs"].append(config_row(wl, cfg, seed=10 * i))
                except Exception as e:  # one config's failure is recorded, not fatal
                    row["configs"].append({"config": dict(cfg), "error": f"{e!r}"[:300]})
            exact = [c for c in row["configs"] if c.get("exact")]
            for key in ("isolated_us", "pair_us", "chained_us", "chained_auto_us"):
                row[key] = min((c[key] for c in exact), default=None)
            rows.append(row)
            print(summary_line(row), flush=True)
    path = common.write_results("layer_chain", rows, extra={"peaks": peaks.peaks()})
    print(f"wrote {path}")


def summary_line(row: dict) -> str:
    if row["chained_us"] is None:
        return f"{row['workload']:20s} {row['precision']} FAILED {row['configs']}"
    b = row["baselines_us"]
    apnn = row.get("apnn_tc_published_us")
    apnn_text = f" APNN-TC/chained {apnn / row['chained_us']:.2f}x" if apnn else ""
    return (f"{row['workload']:20s} {row['precision']} isolated {row['isolated_us']:.2f} "
            f"pair {row['pair_us']:.2f} chained {row['chained_us']:.2f} "
            f"(trigger auto {row['chained_auto_us']:.2f}) us "
            f"(floor {row['floor_us']:.2f}; empty kernel chained "
            f"{row['empty']['chained_us']:.2f}); cuDNN pair/chained "
            f"{b['cudnn_fp16_pair'] / row['chained_us']:.2f}x{apnn_text}")


if __name__ == "__main__":
    main()
