"""Tune a whole network on this machine's GPUs within a budget, then time it before and after
(`lowbit tune --model`'s session, `lowbit.tune_network`): one results file
`tuning_network-<stamp>.json` with a "tuning" row (GPUs, wall time, trials, where the time
went per GPU, network time before / after / the performance model's plan) and the "network"
rows (`"chooser"`: "default", "tuned", "model"), plus the records database it tuned into.

    python benchmarks/tune_network.py --model resnet50 --batch 256 --precision w1a2 \\
        --budget 300 --out $OUT
    python benchmarks/tune_network.py --model resnet18 --batch 8 --precision w1a2 --budget 120

A fresh records database per run (`<out>/records-<stamp>.sqlite`) unless --db names one (a
rerun on the same file resumes: nothing is measured twice). --gpus 0 / 0,1: the speedup of
several GPUs is two runs of the same budget compared by `trajectory` (the layers' best-time
sum over the session's seconds) and the network times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import results_dir, versions


def main(argv: list[str] | None = None) -> int:
    from lowbit.cli import parse_budget

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", help="zoo name or 'file.py:fn'")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", default="w1a2", help="recipe (lowbit.runtime.bench)")
    ap.add_argument("--budget", default="300", help="tuning time: 300, 90s, 5m")
    ap.add_argument("--residual-bits", type=int, default=None)
    ap.add_argument("--gpus", default="", help="GPU indices, e.g. 0,1 (default all)")
    ap.add_argument("--scheduler", default=None, help="Dask scheduler address")
    ap.add_argument("--build-workers", type=int, default=None)
    ap.add_argument("--strategy", default="pruned")
    ap.add_argument("--db", type=Path, default=None, help="records database (default fresh)")
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    args = ap.parse_args(argv)
    import torch

    from lowbit.tune_network import tune_network, write_results

    if not torch.cuda.is_available() and args.scheduler is None:
        print("tune_network.py needs a CUDA GPU (or --scheduler)", file=sys.stderr)
        return 3
    out = args.out or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    db = args.db or out / f"records-{time.strftime('%Y%m%d-%H%M%S')}.sqlite"
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    session = tune_network(args.model, args.batch, args.precision, parse_budget(args.budget),
                           residual_bits=args.residual_bits, db=db, gpus=gpus,
                           scheduler=args.scheduler, build_workers=args.build_workers,
                           strategy=args.strategy)
    path = write_results(session, out, extra=versions())
    tuning = session["rows"][0]
    keys = ("model", "batch", "precision", "gpus", "workloads", "trials", "failures",
            "tune_wall_s", "network_ms_before", "network_ms_after", "speedup",
            "network_ms_model", "model_over_tuned", "layers_tuned", "tuned_logits_equal",
            "kernel_sum_us", "wall_s")
    print(json.dumps({k: tuning.get(k) for k in keys}, indent=1, default=str))
    for g in tuning["time_split"]["gpus"]:
        print(f"{g['name']}: {g['measured']} measured, {g['measure_s']:.1f} s measuring, "
              f"{g['idle_s']:.1f} s idle, start {g['start_s'] or 0:.1f} s, busy "
              f"{100 * (g['busy'] or 0):.0f}%")
    print(f"builds: {tuning['time_split']['build']}; orders: {tuning['time_split']['orders']}")
    print(f"results: {path}\nrecords: {db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
