"""Int8 GEMMs whose K is not a multiple of 16 at M >= 256 (issue 34, item 4), on the GPU, same run.

Target: an int8 GEMM with odd K within 1.3x of `torch._int_mm` on the nearest aligned shape
(K rounded up to 16, N to 8). Shapes: M in {256, 4096} x (N, K) in {(1000, 1000), (1000, 1001),
(4096, 1000), (4096, 1001), (1000, 2048)}: K = 1000 lets the loads be 8 bytes wide
(`igemm.channel_alignment`), K = 1001 only 1 byte, so `triton.gemm_int8` runs it on operands
padded to 16-byte rows (`kernels/triton/padded.py`: W at bind, A by one copy launch per call);
K = 2048 is the aligned control. Per shape:
the default configs of `triton.gemm_int8` and `cuda.int8_wgmma` and zero-tuning dispatch's pick
(`lowbit.tune.dispatch.choose`, our templates only), each bit-exact against
`lowbit.reference.run` first, then the median time (CUDA events, L2 flushed); baselines
`torch._int_mm` on the aligned shape and the fp16 matmul of the same shape.

    python3 benchmarks/probes/odd_k_probe.py        # rows to $OUT/odd_k_probe.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from gemv_probe import EPI, fp16_us, int_mm_aligned_us, timed_impls

from common import write_probe
from lowbit.core import GemmWorkload
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.timing import time_us
from lowbit.reference import random_inputs, run

SHAPES = [(m, n, k) for m in (256, 4096)
          for n, k in ((1000, 1000), (1000, 1001), (4096, 1000), (4096, 1001), (1000, 2048))]
DEFAULTS = ("triton.gemm_int8", "cuda.int8_wgmma")
TARGET_OVER_INT_MM = 1.3


def dispatch_impl(wl: GemmWorkload, x, w, params, ref) -> dict:
    """Zero-tuning dispatch's pick among our templates: exactness and events median (us)."""
    from lowbit.tune.dispatch import choose

    pick = choose(wl, include_fp16=False)
    kernel = get_template(pick.template).build(wl, pick.config)
    out = torch.full(ref.shape, 0x5A if ref.dtype.itemsize == 1 else -12345, dtype=ref.dtype,
                     device="cuda")
    launch = kernel.bind(x, w, params, out=out)
    launch()
    torch.cuda.synchronize()
    return {"template": pick.template, "config": dict(pick.config),
            "predicted_us": round(pick.predicted_us, 2), "exact": bool(torch.equal(out, ref)),
            "time_us": time_us(launch)}


def measure(m: int, n: int, k: int) -> dict:
    wl = GemmWorkload(M=m, N=n, K=k, w="s8", a="s8", epilogue=EPI)
    x, w, params = random_inputs(wl, seed=m + 3 * n + 7 * k, device="cuda")
    ref = run(wl, x, w, params)
    row: dict = {"workload": f"gemm_{m}x{n}x{k}", "M": m, "N": n, "K": k, "precision": "w8a8",
                 "epilogue": EPI.key, "impls": timed_impls(DEFAULTS, wl, x, w, params, ref)}
    try:
        row["impls"]["dispatch"] = dispatch_impl(wl, x, w, params, ref)
    except Exception as e:
        row["impls"]["dispatch"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    for key, fn in (("fp16_matmul", fp16_us), ("int_mm_aligned", int_mm_aligned_us)):
        try:
            row[key] = fn(wl)
        except Exception as e:
            row[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
    times = [v["time_us"] for v in row["impls"].values()
             if v.get("exact") and v.get("time_us") is not None]
    best = min(times) if times else None
    aligned = row["int_mm_aligned"].get("time_us")
    row["best_default_or_dispatch_us"] = best
    row["over_int_mm_aligned"] = None if best is None or not aligned else round(best / aligned, 3)
    row["target_met"] = row["over_int_mm_aligned"] is not None and \
        row["over_int_mm_aligned"] <= TARGET_OVER_INT_MM
    return row


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("odd_k_probe needs a CUDA GPU")
    load_backends()
    rows = []
    for m, n, k in SHAPES:
        try:
            rows.append(measure(m, n, k))
        except Exception as e:  # one shape failing must not lose the others
            rows.append({"workload": f"gemm_{m}x{n}x{k}", "error": f"{type(e).__name__}: {e}"})
        r = rows[-1]
        times = " ".join(f"{t.split('.')[-1]}={v.get('time_us')}"
                         + ("" if v.get("exact") else "(not exact)")
                         for t, v in r.get("impls", {}).items())
        print(f"{r['workload']:20s} {times} int_mm={r.get('int_mm_aligned', {}).get('time_us')}"
              f" fp16={r.get('fp16_matmul', {}).get('time_us')}"
              f" ratio={r.get('over_int_mm_aligned')}", flush=True)
    print("wrote", write_probe("odd_k_probe", rows))


if __name__ == "__main__":
    main()
