"""Tune a whole network on this machine's GPUs within a budget, then time it before and after
(`lowbit tune --model`'s session, `lowbit.tune_network`): one results file
`tuning_network-<stamp>.json` with a "tuning" row (GPUs, wall time, trials, where the time
went per GPU, network time before / after / the performance model's plan) and the "network"
rows (`"chooser"`: "default", "tuned", "model"), plus the records database it tuned into.

    python benchmarks/tune_network.py --model resnet50 --batch 256 --precision w1a2 \\
        --budget 300 --out $OUT
    python benchmarks/tune_network.py --model resnet18 --batch 8 --precision w1a2 --budget 120

A fresh records database per run (`<out>/records-<stamp>.sqlite`) unless --db names one (a
rerun on the same file resumes: nothing is measured twice). --gpus 0 / 0,1 picks the GPUs.
--scaling runs the same session twice, on GPU 0 alone and on every GPU (fresh databases,
the same budget each), and adds a "tuning_scaling" row: the seconds each took to reach the
one-GPU session's final sum of the layers' best kernel times (`trajectory`), and their ratio.
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
    ap.add_argument("--precision", default="w1a2", help="recipe (lowbit.bench)")
    ap.add_argument("--budget", default="300", help="tuning time: 300, 90s, 5m")
    ap.add_argument("--residual-bits", type=int, default=None)
    ap.add_argument("--gpus", default="", help="GPU indices, e.g. 0,1 (default all)")
    ap.add_argument("--scheduler", default=None, help="Dask scheduler address")
    ap.add_argument("--build-workers", type=int, default=None)
    ap.add_argument("--strategy", default="pruned")
    ap.add_argument("--db", type=Path, default=None, help="records database (default fresh)")
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    ap.add_argument("--scaling", action="store_true",
                    help="GPU 0 alone, then every GPU: time to the same kernel sum")
    args = ap.parse_args(argv)
    import torch

    from lowbit.tune_network import tune_network, write_results

    if not torch.cuda.is_available() and args.scheduler is None:
        print("tune_network.py needs a CUDA GPU (or --scheduler)", file=sys.stderr)
        return 3
    out = args.out or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None
    runs = [[0], None] if args.scaling else [gpus]
    sessions = []
    for run_gpus in runs:
        db = args.db if args.db and not args.scaling else \
            out / f"records-{time.strftime('%Y%m%d-%H%M%S')}-{len(sessions)}.sqlite"
        sessions.append(tune_network(
            args.model, args.batch, args.precision, parse_budget(args.budget),
            residual_bits=args.residual_bits, db=db, gpus=run_gpus, scheduler=args.scheduler,
            build_workers=args.build_workers, strategy=args.strategy))
        report(sessions[-1], db)
    session = sessions[-1]
    if args.scaling:
        session["rows"] = [scaling_row(*sessions)] + [r for s in sessions for r in s["rows"]]
    path = write_results(session, out, extra=versions())
    print(f"results: {path}")
    return 0


def time_to_reach(trajectory: list, target_us: float) -> float | None:
    """Seconds into a session when the layers' best kernel sum first was <= target_us."""
    return next((t for t, us in trajectory if us <= target_us * (1 + 1e-9)), None)


def scaling_row(one: dict, many: dict) -> dict:
    """Seconds of the one-GPU and the every-GPU session to the one-GPU session's final
    kernel sum, and their ratio (the multi-GPU speedup of the same tuning)."""
    a, b = one["rows"][0], many["rows"][0]
    row = {"row": "tuning_scaling", "model": a["model"], "batch": a["batch"],
           "precision": a["precision"], "budget_s": a["budget_s"], "gpus": [1, b["gpus"]],
           "trials": [a["trials"], b["trials"]],
           "network_ms_after": [a.get("network_ms_after"), b.get("network_ms_after")]}
    if a["trajectory"]:
        t_one, target = a["trajectory"][-1]
        t_many = time_to_reach(b["trajectory"], target)
        row.update(target_kernel_sum_us=target, seconds_to_target=[t_one, t_many],
                   speedup=t_one / t_many if t_many else None)
    return row


def report(session: dict, db: Path) -> None:
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
    print(f"records: {db}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
