"""int8 GEMM benchmark (issue 3): our int8 templates vs `torch._int_mm` (cuBLASLt).

Per shape of gemm.json (w8a8, int32 output like `torch._int_mm`): a bounded slice of the
`triton.gemm_int8` space searched exhaustively (each config verified bit for bit, then timed),
the default config, int_mm, fp16 matmul for reference, and the roofline floor; on sm_90a also
the best of 12 configs of `cuda.int8_wgmma` (s8 wgmma: the default, then sampled points;
`row["cuda_int8_wgmma"]`). The row's impl / config / time_us are the faster template's
(`row["triton_gemm_int8"]` keeps the Triton figures). Shapes that `torch._int_mm` refuses
(M <= 16) have no int_mm baseline.

    python benchmarks/gemm.py [--max-configs 40]

Writes benchmarks/results/<gpu>/gemm-<stamp>.json (or into $LOWBIT_RESULTS_DIR).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from conv import ResultsFile, bench_configs, int8_wgmma_configs, precompile, sweep
from lowbit.core import Epilogue, load_workloads
from lowbit.core.hardware import gpu_spec_for
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import GEMM_INT8
from lowbit.perfmodel.roofline import measure_bandwidth, workload_floor_us

EPILOGUE = Epilogue()  # int32 out, as torch._int_mm


def int_mm_graph_us(wl) -> float | None:
    """torch._int_mm timed as CUDA-graph replays (launch overhead out, as for ours)."""
    if wl.M <= 16 or wl.K % 8 or wl.N % 8:
        return None
    a = torch.randint(-128, 128, (wl.M, wl.K), device="cuda", dtype=torch.int8)
    bt = torch.randint(-128, 128, (wl.N, wl.K), device="cuda", dtype=torch.int8).T
    torch._int_mm(a, bt)
    return time_us(lambda: torch._int_mm(a, bt), cuda_graph=True)


def faster_template(row: dict) -> dict:
    """The row with "ours" (impl, config, time_us, cuda_graph_us "ours") from whichever int8
    template ran faster, plain time first: `triton_gemm_int8` keeps the Triton figures."""
    cuda = row.get("cuda_int8_wgmma", {})
    row["triton_gemm_int8"] = {"config": row["config"], "time_us": row["time_us"]}
    graph = row.get("cuda_graph_us")
    if graph:
        row["triton_gemm_int8"]["graph_us"] = graph["triton"]
        graph["ours"] = graph["triton"]
    if cuda.get("time_us") is None or cuda["time_us"] >= row["time_us"]:
        return row
    row.update(impl="cuda.int8_wgmma", config=cuda["config"], time_us=cuda["time_us"])
    if graph and cuda.get("graph_us") is not None:
        graph["ours"] = cuda["graph_us"]
    return row


def _configs(wl, args) -> list:
    """The bounded slice, or the whole space (default config first) when it is small."""
    space = GEMM_INT8.space(wl)
    if len(space) < args.whole_space_below:
        default = GEMM_INT8.default_config(wl)
        return [default, *(c for c in space if c != default)]
    return bench_configs(GEMM_INT8, wl, args.max_configs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-configs", type=int, default=40)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--whole-space-below", type=int, default=0,
                    help="time every config of spaces smaller than this (the FC shapes)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gemm.py needs a CUDA GPU")
    t_start = time.perf_counter()
    peaks = replace(gpu_spec_for(common.gpu_name()), bandwidth=measure_bandwidth())
    from lowbit.kernels.cuda import INT8_WGMMA

    plan = [(n, wl, _configs(wl, args)) for n, wl in load_workloads("gemm", epilogue=EPILOGUE)]
    cuda_plan = {n: int8_wgmma_configs(wl, 12) for n, wl, _ in plan}  # sm_90a only
    precompile([(GEMM_INT8, wl, c) for _, wl, cfgs in plan for c in cfgs]
               + [(INT8_WGMMA, wl, c) for n, wl, _ in plan for c in cuda_plan[n]], args.workers)
    results = ResultsFile("gemm", {"peaks": peaks.peaks(), "epilogue": EPILOGUE.key})
    for name, wl, cfgs in plan:
        try:
            res = sweep(GEMM_INT8, wl, cfgs, graph=wl.M * wl.N < 8192 * 8192)
        except Exception as e:
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        cfg, us = res["best"]
        base = {"int_mm": common.int_mm_us(wl), "fp16_matmul": common.fp16_gemm_us(wl),
                "default_config": res["default_us"]}
        row = {"workload": name, "precision": "w8a8", "impl": GEMM_INT8.name,
               "epilogue": EPILOGUE.key, "config": dict(cfg), "time_us": us,
               "floor_us": workload_floor_us(wl, "int8", peaks), "baselines_us": base,
               "configs_timed": res["timed"], "configs_failed": res["failed"][:5],
               "compiled": res["compiled"]}
        if "best_graph_us" in res:
            row["cuda_graph_us"] = {"triton": res["best_graph_us"],
                                    "default_config": res["default_graph_us"],
                                    "int_mm": int_mm_graph_us(wl)}
        if cuda_plan[name]:  # the s8 wgmma template beside the Triton one, same run
            try:
                cres = sweep(INT8_WGMMA, wl, cuda_plan[name], graph="best_graph_us" in res)
                base[INT8_WGMMA.name] = cres["best"][1]
                row["cuda_int8_wgmma"] = {"config": dict(cres["best"][0]),
                                          "time_us": cres["best"][1],
                                          "graph_us": cres.get("best_graph_us"),
                                          "timed": cres["timed"], "failed": cres["failed"][:3]}
            except Exception as e:
                row["cuda_int8_wgmma"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        row = faster_template(row)
        us = row["time_us"]
        results.add(row)
        tops = wl.ops / (us * 1e-6) / 1e12
        im = base["int_mm"]
        g = row.get("cuda_graph_us", {})
        if g.get("int_mm"):
            print(f"{'':24s} graph: ours {g['ours']:.1f} us, int_mm {g['int_mm']:.1f} us, "
                  f"int_mm/ours {g['int_mm'] / g['ours']:.2f}")
        dflt = res["default_us"]
        print(f"{name:24s} {row['impl']:18s} {us:9.1f} us ({tops:6.0f} TOPS)  "
              f"floor x{us / row['floor_us']:.2f}"
              f"  int_mm/ours {'-' if im is None else f'{im / us:.2f}'}  default/ours "
              f"{'-' if dflt is None else f'{dflt / us:.2f}'}  n={res['timed']} {res['compiled']}",
              flush=True)
    print(f"wrote {results.path} in {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
