"""Skinny int8 GEMMs (issue 34, item 4): `triton.gemv_int8` against the default int8 templates
and cuBLAS fp16, on the GPU, same run.

Shapes: M in {1, 8, 16} x (K, N) in {(2048, 1000), (25088, 4096), (4096, 4096), (512, 1000)}
(classifiers and VGG-16 fc6 / fc7 at batch 1-16), and the odd shapes M = 64, K in {100, 1000,
1001}, N in {1000, 513} (part b: K not a multiple of 16 / 32 on `triton.gemm_int8`), and u8
activations (ReLU + pooling outputs: the GEMV's zero-point rewrite) at M = 8, (K, N) in
{(2048, 1000), (4096, 1000), (25088, 4096)} (VGG-16's fc8 / fc6 classifiers). Per shape
and implementation, at its untuned default config: bit-exact against `lowbit.reference.run`
(fresh random inputs, poisoned output), then the median time by CUDA events with L2 flushed
(`time_us`, the tuner's timing) and under CUDA-graph replay (`graph_us`). Baselines: fp16
`a @ b.T` (cuBLAS), `torch._int_mm` on the nearest shape it takes (M > 16, K and N rounded up
to multiples of 16 / 8), the default configs of `triton.gemm_int8` and `cuda.int8_wgmma`.
Beside each time the roofline floor max(bytes / bandwidth, ops / peak) with the copy bandwidth
measured in this run, and the time to read the int8 weights once. Also what zero-tuning
dispatch (`lowbit.tune.dispatch.choose`) and the engine's default policy pick.

--conv: conv2d layers whose implicit GEMM has M = N*P*Q <= 64 rows (`CONV`: batch 1 on 7x7
maps, 3x3 512 -> 512, the 1x1s 960 -> 320, 1152 -> 320, 2048 -> 512, 512 -> 2048, a 14x14 3x3
at stride 2, a 3x3 with C = 100, K = 200; the 3x3 512 -> 512 also with u8 activations),
measured the same way: the GEMV's default (its conv gather) against the defaults of the conv
templates `triton.conv2d_int8`, `triton.conv2d_int8_tma` and `cuda.int8_wgmma` where they take
the layer, and cuDNN fp16 (channels_last, benchmark mode; `common.cudnn_fp16_conv_us`). Conv
rows are named `conv_<shape>` and carry "op": "conv2d", the conv shape and the implicit GEMM's
(M, N, K).

    python3 benchmarks/probes/gemv_probe.py [--out DIR] [--quick | --u8 | --conv]

Writes {"benchmark": "gemv", "rows": [...]} to benchmarks/results/<gpu>/ (or DIR) and prints a
table; a failing case is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from common import cudnn_fp16_conv_us, gpu_name, write_results
from lowbit.core import ConvWorkload, Epilogue, GemmWorkload, Workload
from lowbit.core.hardware import GpuSpec, gpu_spec_for
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import floor_us, measure_bandwidth, workload_bytes
from lowbit.reference import random_inputs, run

GEMV = "triton.gemv_int8"
INT8_DEFAULTS = ("cuda.int8_wgmma", "triton.gemm_int8")
EPI = Epilogue(bias=True, out="s8")
FC = [(m, n, k) for m in (1, 8, 16) for k, n in ((2048, 1000), (25088, 4096), (4096, 4096),
                                                 (512, 1000))]
ODD = [(64, n, k) for k in (100, 1000, 1001) for n in (1000, 513)]
#: u8 x s8 classifiers (activations after ReLU and average pooling) at batch 8
U8 = [(8, n, k) for k, n in ((2048, 1000), (4096, 1000), (25088, 4096))]
#: convs of at most GEMV_MAX_M output pixels (row name after "conv_", shape); batch 4 on 7x7
#: (M = 196) is no GEMV layer
CONV = [
    ("b1_7x7_3x3_512to512", dict(N=1, H=7, W=7, C=512, K=512, R=3, S=3, pad=1)),
    ("b1_7x7_1x1_960to320", dict(N=1, H=7, W=7, C=960, K=320)),
    ("b1_7x7_1x1_1152to320", dict(N=1, H=7, W=7, C=1152, K=320)),
    ("b1_7x7_1x1_2048to512", dict(N=1, H=7, W=7, C=2048, K=512)),
    ("b1_7x7_1x1_512to2048", dict(N=1, H=7, W=7, C=512, K=2048)),
    ("b1_14x14_3x3_256to256_s2", dict(N=1, H=14, W=14, C=256, K=256, R=3, S=3, stride=2,
                                      pad=1)),
    ("b1_7x7_3x3_100to200", dict(N=1, H=7, W=7, C=100, K=200, R=3, S=3, pad=1)),
]
#: conv rows measured with u8 activations too (a ReLU's output: the GEMV's zero point)
CONV_U8 = ("b1_7x7_3x3_512to512",)
CONV_DEFAULTS = ("triton.conv2d_int8", "triton.conv2d_int8_tma", "cuda.int8_wgmma")


def _template(name: str):
    load_backends()
    try:
        return get_template(name)
    except ValueError:
        if name != GEMV:
            raise
        from lowbit.kernels.triton.gemv import GemvInt8Template  # not registered yet

        return GemvInt8Template()


def timed_impl(name: str, wl: Workload, x, w, params, ref) -> dict:
    """Default config of template `name`: exactness, events and graph medians (us)."""
    t = _template(name)
    reason = t.unsupported_reason(wl)
    if reason:
        return {"skipped": reason[:160]}
    cfg = t.default_config(wl)
    kernel = t.build(wl, cfg)
    shape, dtype = ref.shape, ref.dtype
    out = torch.full(shape, 0x5A if dtype.itemsize == 1 else -12345, dtype=dtype, device="cuda")
    launch = kernel.bind(x, w, params, out=out)
    launch()
    torch.cuda.synchronize()
    exact = bool(torch.equal(out, ref))
    return {"config": dict(cfg), "exact": exact, "time_us": time_us(launch),
            "graph_us": time_us(launch, cuda_graph=True)}


def timed_impls(names, wl, x, w, params, ref) -> dict:
    """`timed_impl` of each template name; one failing records its error and the others
    still run."""
    impls: dict = {}
    for name in names:
        try:
            impls[name] = timed_impl(name, wl, x, w, params, ref)
        except Exception as e:  # one implementation failing must not lose the others
            impls[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return impls


def fp16_us(wl: GemmWorkload) -> dict:
    a = torch.randn(wl.M, wl.K, device="cuda", dtype=torch.float16)
    b = torch.randn(wl.N, wl.K, device="cuda", dtype=torch.float16)
    fn = lambda: a @ b.T  # noqa: E731
    return {"time_us": time_us(fn), "graph_us": time_us(fn, cuda_graph=True)}


def int_mm_aligned_us(wl: GemmWorkload) -> dict | None:
    """torch._int_mm on the nearest shape it takes: M at least 17, K rounded up to a multiple
    of 16 and N of 8 (cuBLASLt's int8 GEMM; the target of odd-K GEMMs is 1.3x its time)."""
    m, n, k = max(wl.M, 17), -(-wl.N // 8) * 8, -(-wl.K // 16) * 16
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    bt = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).T
    fn = lambda: torch._int_mm(a, bt)  # noqa: E731
    return {"shape": [m, n, k], "time_us": time_us(fn), "graph_us": time_us(fn, cuda_graph=True)}


def picks(wl: Workload) -> dict:
    out = {}
    try:
        from lowbit.tune.dispatch import choose

        c = choose(wl)
        out["dispatch"] = {"template": c.template, "predicted_us": round(c.predicted_us, 2)}
    except Exception as e:  # recorded, the run goes on
        out["dispatch"] = f"{type(e).__name__}: {e}"[:200]
    try:
        from lowbit.graph.impl import choose_impl

        out["engine_default"] = choose_impl(wl)[0]
    except Exception as e:
        out["engine_default"] = f"{type(e).__name__}: {e}"[:200]
    return out


def row_name(m: int, n: int, k: int, a: str) -> str:
    return f"gemm_{m}x{n}x{k}" + ("" if a == "s8" else f"_{a}")


def measure(m: int, n: int, k: int, bandwidth: float, a: str = "s8") -> dict:
    wl = GemmWorkload(M=m, N=n, K=k, w="s8", a=a, epilogue=EPI)
    peaks = dataclasses.replace(gpu_spec_for(gpu_name()), bandwidth=bandwidth)
    row: dict = {"workload": row_name(m, n, k, a), "M": m, "N": n, "K": k, "precision": "w8a8",
                 "a": a, "w": "s8", "epilogue": EPI.key,
                 "floor_us": floor_us(wl.ops, workload_bytes(wl), peaks.int8, bandwidth),
                 "weight_read_us": n * k / bandwidth * 1e6,
                 "fp16_floor_us": floor_us(wl.ops, 2 * (m * k + n * k + m * n), peaks.fp16,
                                           bandwidth)}
    x, w, params = random_inputs(wl, seed=m * 7 + n + k, device="cuda")
    ref = run(wl, x, w, params)
    impls = timed_impls((GEMV, *INT8_DEFAULTS), wl, x, w, params, ref)
    row["impls"] = impls
    for key, fn in (("fp16_matmul", fp16_us), ("int_mm_aligned", int_mm_aligned_us)):
        try:
            row[key] = fn(wl)
        except Exception as e:
            row[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
    row.update(picks(wl))
    got = impls.get(GEMV, {})
    row["impl"], row["config"] = GEMV, got.get("config")
    row["time_us"] = got.get("time_us")
    row["baselines_us"] = {**{f"{t}_default": impls[t].get("time_us") for t in INT8_DEFAULTS},
                           "fp16_matmul": row["fp16_matmul"].get("time_us"),
                           "int_mm_aligned": row["int_mm_aligned"].get("time_us")}
    return row


def conv_workloads() -> list[tuple[str, ConvWorkload]]:
    """(row name, workload) of the --conv rows: `conv_<shape>`, `conv_<shape>_u8`."""
    return [(f"conv_{name}" + ("" if a == "s8" else f"_{a}"),
             ConvWorkload(**shape, w="s8", a=a, epilogue=EPI))
            for name, shape in CONV for a in (("s8", "u8") if name in CONV_U8 else ("s8",))]


def conv_row_head(name: str, wl: ConvWorkload, peaks: GpuSpec) -> dict:
    """The measurement-free part of a conv row: shapes, precisions and floors at `peaks`
    (bandwidth: the copy bandwidth measured in the run)."""
    m, n, k = wl.gemm_shape
    fp16_bytes = 2 * (wl.N * wl.H * wl.W * wl.C + n * k + m * n)
    return {"workload": name, "op": "conv2d",
            "shape": {f: getattr(wl, f) for f in ("N", "H", "W", "C", "K", "R", "S", "stride",
                                                  "pad")},
            "M": m, "gemm_shape": [m, n, k], "precision": "w8a8", "a": str(wl.a),
            "w": str(wl.w), "epilogue": wl.epilogue.key,
            "floor_us": floor_us(wl.ops, workload_bytes(wl), peaks.int8, peaks.bandwidth),
            "weight_read_us": n * k / peaks.bandwidth * 1e6,
            "fp16_floor_us": floor_us(wl.ops, fp16_bytes, peaks.fp16, peaks.bandwidth)}


def measure_conv(name: str, wl: ConvWorkload, bandwidth: float) -> dict:
    """One conv row: the GEMV's and the conv templates' defaults (exact first, then events
    and graph medians) and cuDNN fp16."""
    peaks = dataclasses.replace(gpu_spec_for(gpu_name()), bandwidth=bandwidth)
    row = conv_row_head(name, wl, peaks)
    m, n, k = wl.gemm_shape
    x, w, params = random_inputs(wl, seed=m * 7 + n + k, device="cuda")
    ref = run(wl, x, w, params)
    impls = timed_impls((GEMV, *CONV_DEFAULTS), wl, x, w, params, ref)
    row["impls"] = impls
    try:
        row["fp16_conv"] = {"time_us": cudnn_fp16_conv_us(wl),
                            "graph_us": cudnn_fp16_conv_us(wl, cuda_graph=True)}
    except Exception as e:
        row["fp16_conv"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    row.update(picks(wl))
    got = impls.get(GEMV, {})
    row["impl"], row["config"] = GEMV, got.get("config")
    row["time_us"] = got.get("time_us")
    row["baselines_us"] = {**{f"{t}_default": impls[t].get("time_us") for t in CONV_DEFAULTS},
                           "fp16_conv": row["fp16_conv"].get("time_us")}
    return row


def _fmt(v) -> str:
    return f"{v:8.1f}" if isinstance(v, float) else f"{'-':>8}"


def table(rows: list[dict]) -> None:
    print(f"\n{'workload':22s} {'floor':>8} {'w read':>8} | {'gemv':>8} {'wgmma':>8} "
          f"{'gemm_i8':>8} {'fp16':>8} {'int_mm':>8} | graph: {'gemv':>8} {'fp16':>8} | "
          f"exact  dispatch / engine")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:22s} ERROR {r['error']}")
            continue
        im = r["impls"]
        ex = "".join("y" if im[t].get("exact") else ("-" if "exact" not in im[t] else "N")
                     for t in (GEMV, *INT8_DEFAULTS))
        d = r.get("dispatch")
        pick = d["template"] if isinstance(d, dict) else "?"
        print(f"{r['workload']:22s} {_fmt(r['floor_us'])} {_fmt(r['weight_read_us'])} | "
              f"{_fmt(im[GEMV].get('time_us'))} {_fmt(im['cuda.int8_wgmma'].get('time_us'))} "
              f"{_fmt(im['triton.gemm_int8'].get('time_us'))} "
              f"{_fmt(r['fp16_matmul'].get('time_us'))} "
              f"{_fmt(r['int_mm_aligned'].get('time_us'))} | "
              f"{_fmt(im[GEMV].get('graph_us'))} {_fmt(r['fp16_matmul'].get('graph_us'))} | "
              f"{ex:5s}  {pick} / {r.get('engine_default')}")


def conv_table(rows: list[dict]) -> None:
    print(f"\n{'conv':32s} {'floor':>8} {'w read':>8} | {'gemv':>8} {'igemm':>8} {'tma':>8} "
          f"{'wgmma':>8} {'cudnn':>8} | graph: {'gemv':>8} {'cudnn':>8} | exact  dispatch / "
          "engine")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:32s} ERROR {r['error']}")
            continue
        im, fp16 = r["impls"], r["fp16_conv"]
        names = (GEMV, *CONV_DEFAULTS)
        ex = "".join("y" if im[t].get("exact") else ("-" if "exact" not in im[t] else "N")
                     for t in names)
        d = r.get("dispatch")
        pick = d["template"] if isinstance(d, dict) else "?"
        print(f"{r['workload']:32s} {_fmt(r['floor_us'])} {_fmt(r['weight_read_us'])} | "
              + " ".join(_fmt(im[t].get("time_us")) for t in names)
              + f" {_fmt(fp16.get('time_us'))} | {_fmt(im[GEMV].get('graph_us'))} "
              f"{_fmt(fp16.get('graph_us'))} | {ex:5s}  {pick} / {r.get('engine_default')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="results folder (default benchmarks/results/<gpu>/)")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true",
                       help="M = 8, the odd shapes and the u8 rows only")
    which.add_argument("--u8", action="store_true", help="the u8-activation rows only")
    which.add_argument("--conv", action="store_true",
                       help="the conv rows only (M = N*P*Q <= 64, module doc)")
    args = ap.parse_args()
    if args.out:
        os.environ["LOWBIT_RESULTS_DIR"] = args.out
    if not torch.cuda.is_available():
        sys.exit("gemv_probe needs a CUDA GPU")
    bandwidth = measure_bandwidth()
    print(f"{gpu_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows = []
    if args.conv:
        for name, wl in conv_workloads():
            try:
                row = measure_conv(name, wl, bandwidth)
            except Exception as e:  # one layer failing must not lose the others
                row = {"workload": name, "op": "conv2d",
                       "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(row["workload"], "done" if "error" not in row else row["error"], flush=True)
        conv_table(rows)
        print("wrote", write_results("gemv", rows, {"bandwidth_bytes_per_s": bandwidth}))
        return
    s8 = [] if args.u8 else [s for s in FC if s[0] == 8] + ODD if args.quick else FC + ODD
    shapes = [(*s, "s8") for s in s8] + [(*s, "u8") for s in U8]
    for m, n, k, a in shapes:
        try:
            row = measure(m, n, k, bandwidth, a)
        except Exception as e:  # one shape failing must not lose the others
            row = {"workload": row_name(m, n, k, a), "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        print(row["workload"], "done" if "error" not in row else row["error"], flush=True)
    table(rows)
    print("wrote", write_results("gemv", rows, {"bandwidth_bytes_per_s": bandwidth}))


if __name__ == "__main__":
    main()
