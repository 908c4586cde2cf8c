"""The README recipe with and without the adaptive precision schedule (issue 35, item 3).

    q = lowbit.quantize(model, weight_bits=W, act_bits=A, method="rand", mix=MIX,
                        train_steps=QAT_STEPS)

on the issue's model (the digits ResNet of `lowbit.models`: residual adds, a stride-2 block, a
Linear head; every conv and the Linear quantized, as the README recipe does), scikit-learn
digits, for several seeds. Per seed: FP32 training from scratch, then for every precision one
QAT run of each method from a copy of the FP32 model with the same data order (paired), all
with Adam. Reported per precision and method: mean and std of test accuracy, the paired
difference mix - no mix with its standard error, and for mix the latest step at which a layer
reached its deployed precision (as a fraction of the QAT steps).

Target: rand+mix >= rand (paired mean over seeds) at every precision, every layer at its
deployed precision with most of training still ahead. CPU only; one process per seed.
    python benchmarks/qat_schedule.py [--seeds 10] [--qat-steps 100] [--workers 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRECISIONS = ("w8a8", "w4a4", "w2a2", "w1a2")
METHODS = (("max", "max", False), ("rand", "rand", False), ("rand+mix", "rand", True))


def run_seed(seed: int, args: argparse.Namespace) -> dict:
    import lowbit
    from lowbit.core import parse_wa
    from lowbit.demo import accuracy, train
    from lowbit.models import get
    from lowbit.quant import precision_schedule
    from lowbit.quant.data import digits_loaders

    torch.set_num_threads(1)
    t0 = time.time()
    train_loader, test_loader = digits_loaders(batch_size=64, seed=seed)
    torch.manual_seed(seed)
    fp32 = train(get(args.model, num_classes=10, width=args.width), train_loader,
                 args.fp32_steps, 3e-3)
    out = {"acc": {"fp32": 100 * accuracy(fp32, test_loader)}, "reached": {}, "errors": {}}
    for precision in args.precisions:
        wb, ab = parse_wa(precision)
        for name, method, mix in METHODS:
            key = f"{precision}/{name}"
            try:
                torch.manual_seed(1000 + seed)
                train_loader.generator.manual_seed(seed)  # same data order for every method
                q = lowbit.quantize(copy.deepcopy(fp32), weight_bits=wb, act_bits=ab,
                                    method=method, mix=mix, train_steps=args.qat_steps,
                                    mix_warmup=args.mix_warmup)
                train(q, train_loader, args.qat_steps, 1e-3)
                out["acc"][key] = 100 * accuracy(q, test_loader)
                if mix:
                    out["reached"][precision] = max(
                        next((s for s, b in hist if b == ab), args.qat_steps)
                        for hist in precision_schedule(q).values())
            except Exception as e:  # one failed case must not end the run
                out["errors"][key] = f"{type(e).__name__}: {e}"
                continue
            print(f"seed {seed:2d} {key:14s} acc {out['acc'][key]:6.2f} "
                  f"[{time.time() - t0:5.0f} s]", flush=True)
    return out


def _mean_std(v: list[float]) -> tuple[float, float]:
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def summarize(results: list[dict], args: argparse.Namespace) -> list[dict]:
    rows = []
    for precision in ("fp32", *args.precisions):
        for name in (("fp32",) if precision == "fp32" else [m[0] for m in METHODS]):
            key = "fp32" if precision == "fp32" else f"{precision}/{name}"
            accs = [r["acc"][key] for r in results if key in r["acc"]]
            if not accs:
                continue
            mean, std = _mean_std(accs)
            row = {"precision": precision, "method": name, "accuracy_mean": round(mean, 3),
                   "accuracy_std": round(std, 3), "accuracies": [round(a, 2) for a in accs]}
            if name == "rand+mix":
                diff = [r["acc"][key] - r["acc"][f"{precision}/rand"] for r in results
                        if key in r["acc"] and f"{precision}/rand" in r["acc"]]
                dm, ds = _mean_std(diff)
                row.update(paired_minus_rand_mean=round(dm, 3),
                           paired_minus_rand_se=round(ds / max(len(diff), 1) ** 0.5, 3),
                           target_reached_at=max(r["reached"].get(precision, args.qat_steps)
                                                 for r in results) / args.qat_steps)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--model", default="digits_resnet")
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--fp32-steps", type=int, default=300)
    ap.add_argument("--qat-steps", type=int, default=100)
    ap.add_argument("--mix-warmup", type=float, default=0.25)
    ap.add_argument("--workers", type=int, default=0, help="default: min(seeds, CPU cores)")
    ap.add_argument("--out", default="", help="results folder (default benchmarks/results/)")
    args = ap.parse_args()
    args.precisions = tuple(p for p in args.precisions.split(",") if p)
    if args.out:
        os.environ["LOWBIT_RESULTS_DIR"] = args.out
    from common import write_results

    t0 = time.time()
    workers = args.workers or min(args.seeds, os.cpu_count() or 1)
    seeds = list(range(args.seeds))
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(run_seed, seeds, [args] * len(seeds)))
    else:
        results = [run_seed(s, args) for s in seeds]
    rows = summarize(results, args)
    setup = {k: v for k, v in vars(args).items() if k != "out"}
    setup.update(workers=workers, wall_s=round(time.time() - t0, 1), dataset="sklearn digits",
                 recipe="lowbit.quantize(model, W, A, method='rand', mix=MIX, "
                        "train_steps=qat_steps)")
    errors = {f"seed {i}": r["errors"] for i, r in enumerate(results) if r["errors"]}
    path = write_results("qat_schedule", rows, {"setup": setup, "errors": errors})
    print(f"\n{'precision':9s} {'method':9s} {'acc mean':>8s} {'std':>6s} {'mix-rand':>9s} "
          f"{'se':>5s} {'at target from':>14s}")
    for r in rows:
        extra = ""
        if "paired_minus_rand_mean" in r:
            extra = (f"{r['paired_minus_rand_mean']:9.2f} {r['paired_minus_rand_se']:5.2f} "
                     f"{r['target_reached_at']:13.0%}")
        print(f"{r['precision']:9s} {r['method']:9s} {r['accuracy_mean']:8.2f} "
              f"{r['accuracy_std']:6.2f} {extra}")
    for seed, errs in errors.items():
        print(f"{seed}: {errs}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
