"""TMA conv template (`triton.conv2d_int8_tma`) vs `triton.conv2d_int8` and cuDNN fp16.

Per stride-1 layer of the given suites (w8a8, bias + ReLU -> s8 NHWC, as benchmarks/conv.py):
a bounded slice of the TMA template's space (default config first) and the best known configs
of `triton.conv2d_int8` (its default, the best configs of earlier conv result files and the
top of the tuning tables) are compiled in parallel, verified bit for bit on fresh random
inputs and timed in this one process (`conv.sweep`: median, L2 flushed); cudnn_fp16 and the
roofline floor beside them; the batch-16 layers also as CUDA-graph replays.

    python benchmarks/tma_conv.py [--suites resnet50_3x3_b256,resnet50_3x3_b16]
                                  [--tma-configs 12] [--phase all|compile|time]

Writes <results dir>/tma_conv-<stamp>.json (rows in the DESIGN.md format).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from conv import EPILOGUE, ResultsFile, precompile, sweep, tma_configs
from lowbit.core import Config, Workload, load_workloads
from lowbit.kernels.triton import CONV2D_INT8, CONV2D_INT8_TMA
from lowbit.perfmodel.roofline import measure_bandwidth, peaks_for, workload_floor_us

RESULTS = Path(__file__).resolve().parent / "results" / "nvidia-h100-80gb-hbm3"


def igemm_configs(name: str, wl: Workload) -> list[Config]:
    """triton.conv2d_int8: default, best of earlier conv runs, top 3 of the tuning tables."""
    space = CONV2D_INT8.space(wl)
    out = [CONV2D_INT8.default_config(wl)]
    for f in sorted(RESULTS.glob("conv-*.json")):
        for row in json.loads(f.read_text())["rows"]:
            if row["workload"] == name and row["impl"] == CONV2D_INT8.name and row["config"]:
                out.append(Config(row["config"]))
    out += common.table_configs(sorted(RESULTS.glob("tables-*.json")), wl, top=3)
    uniq: list[Config] = []
    for c in out:
        if c not in uniq and space.is_valid(c):
            uniq.append(c)
    return uniq


def plan(suites: str, n_tma: int) -> list[tuple]:
    layers = [(n, wl) for s in suites.split(",") for n, wl in load_workloads(s, epilogue=EPILOGUE)
              if wl.stride == 1]
    return [(n, wl, tma_configs(wl, n_tma), igemm_configs(n, wl)) for n, wl in layers]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default="resnet50_3x3_b256,resnet50_3x3_b16")
    ap.add_argument("--tma-configs", type=int, default=12)
    ap.add_argument("--phase", default="all", choices=("all", "compile", "time"))
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/tma_conv.py needs a CUDA GPU")
    layers = plan(args.suites, args.tma_configs)
    if args.phase in ("all", "compile"):
        precompile([(t, wl, c) for _, wl, tc, ic in layers
                    for t, cfgs in ((CONV2D_INT8_TMA, tc), (CONV2D_INT8, ic)) for c in cfgs],
                   args.workers)
    if args.phase == "compile":
        return
    peaks = replace(peaks_for(common.gpu_name()), bandwidth=measure_bandwidth())
    results = ResultsFile("tma_conv", {"peaks": peaks.__dict__, "epilogue": EPILOGUE.key})
    for name, wl, tcfgs, icfgs in layers:
        small = wl.N <= 16
        try:
            tma = sweep(CONV2D_INT8_TMA, wl, tcfgs, graph=small)
            ig = sweep(CONV2D_INT8, wl, icfgs, graph=small)
        except Exception as e:
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        (cfg, us), (icfg, ius) = tma["best"], ig["best"]
        base = {"cudnn_fp16": common.cudnn_fp16_conv_us(wl), "triton.conv2d_int8": ius,
                "default_config": tma["default_us"]}
        row = {"workload": name, "precision": "w8a8", "impl": CONV2D_INT8_TMA.name,
               "epilogue": EPILOGUE.key, "config": dict(cfg), "time_us": us,
               "floor_us": workload_floor_us(wl, "int8", peaks), "baselines_us": base,
               "igemm_config": dict(icfg), "configs_timed": tma["timed"],
               "configs_failed": tma["failed"][:5], "compiled": tma["compiled"]}
        if small:
            row["cuda_graph_us"] = {"triton_tma": tma["best_graph_us"],
                                    "triton.conv2d_int8": ig["best_graph_us"],
                                    "cudnn_fp16": common.cudnn_fp16_conv_us(wl, cuda_graph=True)}
        results.add(row)
        g = row.get("cuda_graph_us", {})
        r = lambda a, b: "-" if a is None or b is None else f"{a / b:5.2f}"  # noqa: E731
        print(f"{name:24s} tma {us:7.1f} us floor x{r(us, row['floor_us'])} cudnn/tma "
              f"{r(base['cudnn_fp16'], us)} igemm {ius:7.1f} igemm/tma {r(ius, us)} "
              f"default/tma {r(base['default_config'], us)} graph cudnn/tma "
              f"{r(g.get('cudnn_fp16'), g.get('triton_tma'))} graph igemm/tma "
              f"{r(g.get('triton.conv2d_int8'), g.get('triton_tma'))} n={tma['timed']} "
              f"fail={len(tma['failed'])} {dict(cfg)} {tma['compiled']}", flush=True)
    print(f"wrote {results.path}")


if __name__ == "__main__":
    main()
