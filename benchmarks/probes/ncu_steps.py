"""Nsight Compute counters of chosen steps of a compiled network, in the form the engine runs
them (GPU; run under `benchmarks/ncu_steps.sh`, which wraps this in `ncu`).

Builds the case's plan and GPU executor exactly as `benchmarks/network.py` does
(`lowbit.bench.network.case_plan`), runs one forward (kernels compiled, caches warm), then
launches each named step once inside the NVTX range "ncu:<step>" (ncu profiles only the
launches inside "ncu:" ranges). Writes $OUT/ncu_steps-<case>.order.json: per named step, its
description, the kernels it launches in order and the plan's floor, so the wrapper can label
ncu's rows (ncu numbers kernels in launch order).

    python benchmarks/probes/ncu_steps.py --case resnet50:256:w1a2:res8 \\
        --steps layer1_0_conv3,layer1_0_downsample_0

`--summarize DETAILS_CSV ORDER_JSON` (no GPU): ncu's details page (`ncu -i REP --page details
--csv`) and the order file as $OUT/ncu_steps-<case>.json: per profiled kernel its step, name,
grid, block and every metric ncu printed ("Section / Metric": "value unit").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from lowbit.bench.network import case_plan
from lowbit.bench.timing import step_floor_us
from lowbit.runtime.gpu import GpuExecutor
from network import parse_case


def case_tag(text: str) -> str:
    """A file-name form of a case string."""
    return text.replace(":", "_").replace("=", "-").replace("/", "-")


def summarize(details_csv: Path, order_json: Path) -> dict:
    """The module docstring's summary of one ncu run."""
    kernels: dict[str, dict] = {}
    with open(details_csv, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own lines first
    for r in csv.DictReader(lines):
        k = kernels.setdefault(r["ID"], {"kernel": r.get("Kernel Name", ""),
                                         "grid": r.get("Grid Size", ""),
                                         "block": r.get("Block Size", ""), "metrics": {}})
        if r.get("Metric Name"):
            unit = r.get("Metric Unit") or ""
            k["metrics"][f"{r.get('Section Name', '')} / {r['Metric Name']}"] = \
                f"{r.get('Metric Value', '')} {unit}".strip()
    order = json.loads(order_json.read_text())
    labels = [s for s in order["steps"] for _ in range(s["launches"])]
    rows = []
    for i, (_, k) in enumerate(sorted(kernels.items(), key=lambda kv: int(kv[0]))):
        step = labels[i] if i < len(labels) else {}
        rows.append({"step": step.get("step"), "how": step.get("how"),
                     "floor_us": step.get("floor_us"), **k})
    return {"case": order["case"], "kernels": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", help="a network.py case, MODEL:BATCH:PRECISION...")
    ap.add_argument("--steps", help="comma-separated step names (with or without 'layer.')")
    ap.add_argument("--summarize", nargs=2, metavar=("DETAILS_CSV", "ORDER_JSON"), type=Path)
    args = ap.parse_args()
    if args.summarize:
        summary = summarize(*args.summarize)
        out = Path(os.environ.get("OUT", ".")) / f"ncu_steps-{case_tag(summary['case'])}.json"
        out.write_text(json.dumps(summary, indent=1))
        print(f"wrote {out}: {len(summary['kernels'])} kernels")
        return 0
    if not args.case or not args.steps:
        ap.error("--case and --steps are required (or --summarize)")
    case = parse_case(args.case)
    wanted = [s if s.startswith("layer.") else f"layer.{s}" for s in args.steps.split(",")]
    _, x, plan, _ = case_plan(case, torch.device("cuda"))
    ex = GpuExecutor(plan, torch.device("cuda"))
    ex(x)
    torch.cuda.synchronize()
    by_name = {b.name: b for b in ex.steps if not b.record_only}
    missing = [w for w in wanted if w not in by_name]
    if missing:
        raise SystemExit(f"--steps: no step named {missing} in the plan; steps: "
                         f"{', '.join(sorted(by_name))}")
    order = []
    for name in wanted:
        b = by_name[name]
        torch.cuda.nvtx.range_push(f"ncu:{name}")
        b()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        kernels = sum(len(getattr(f, "launches", (f,))) for f in b.launches) or 1
        order.append({"step": name, "how": b.how, "launches": kernels,
                      "floor_us": step_floor_us(plan, b.step, b.how.startswith("triton stem"))})
    out = Path(os.environ.get("OUT", ".")) / f"ncu_steps-{case_tag(args.case)}.order.json"
    out.write_text(json.dumps({"case": args.case, "steps": order}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
