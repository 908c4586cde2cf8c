"""Wide realizations on trained models (issue 32): how often a compiled plan with residual
adds realized at `wide_bits` = 24 / 16 / 8 gives the converted integer model's prediction.

Per seed: the harder digits ResNet (residual adds) trained in FP32, LSQ QAT at each precision
(benchmarks/accuracy.py's schedule; first conv and last linear float), `lowbit.convert`, then
`lowbit.compile(..., wide_bits=b)` run through the exact reference executor on the whole test
split. Rows: {seed, precision, wide_bits, top1_agreement (fraction of test images whose
predicted class equals the integer model's), accuracy, integer_accuracy, max_logit_diff}.
Runs on the CPU; writes benchmarks/results/cpu/wide_bits-*.json.
    python benchmarks/wide_bits.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lowbit
from accuracy import SCHEDULES, _reseed, train
from common import write_results
from lowbit import models
from lowbit.core import parse_wa
from lowbit.quant.datasets import benchmark_loaders

DATASET, MODEL = "digits_hard", "digits_resnet"

#: QAT epochs of the committed wide_bits results (accuracy.py's digits_hard schedule then; it
#: runs 10 since its 2-bit targets were found bounded by the schedule): reruns reproduce them
RESULTS_QAT_EPOCHS = 3
WIDE_BITS = (24, 16, 8)


def run_seed(seed: int, precisions: tuple[str, ...]) -> list[dict]:
    sched = replace(SCHEDULES[DATASET], qat_epochs=RESULTS_QAT_EPOCHS)
    train_loader, test_loader = benchmark_loaders(DATASET, sched.batch_size, seed)
    torch.manual_seed(seed)
    fp32 = models.get(MODEL, num_classes=10, width=sched.width)
    train(fp32, train_loader, sched.fp32_epochs, sched.fp32_lr)
    xs, ys = zip(*test_loader, strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    rows = []
    for precision in precisions:
        wb, ab = parse_wa(precision)
        q = lowbit.quantize(copy.deepcopy(fp32), weight_bits=wb, act_bits=ab, method="lsq",
                            skip_first=True, skip_last=True)
        _reseed(train_loader, seed)
        train(q, train_loader, sched.qat_epochs, sched.qat_lr)
        integer = lowbit.convert(q.eval())
        with torch.no_grad():
            ref = integer(x)
        for bits in WIDE_BITS:
            compiled = lowbit.compile(integer, x, wide_bits=bits)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # the reference executor
                got = compiled(x)
            row = {"seed": seed, "precision": precision, "wide_bits": bits,
                   "top1_agreement": round(float((got.argmax(1) == ref.argmax(1)).float()
                                                 .mean()), 6),
                   "accuracy": round(100 * float((got.argmax(1) == y).float().mean()), 3),
                   "integer_accuracy": round(100 * float((ref.argmax(1) == y).float().mean()),
                                             3),
                   "max_logit_diff": round(float((got - ref).abs().max()), 4),
                   "test_images": len(y)}
            rows.append(row)
            print(f"seed {seed} {precision} wide {bits:2d}: agreement "
                  f"{row['top1_agreement']:.4f}, accuracy {row['accuracy']:.2f} (integer "
                  f"{row['integer_accuracy']:.2f})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--precisions", nargs="+", default=["w2a2", "w1a2"])
    ap.add_argument("--out", help="results folder (default benchmarks/results/cpu)")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    for p in args.precisions:
        parse_wa(p)
    if args.out:
        os.environ["LOWBIT_RESULTS_DIR"] = args.out
    torch.set_num_threads(1)
    rows = [r for seed in range(args.seeds) for r in run_seed(seed, tuple(args.precisions))]
    path = write_results("wide_bits", rows, {"setup": {
        "dataset": DATASET, "model": MODEL, "method": "lsq", "seeds": args.seeds,
        "reference": "lowbit.convert's integer model (the compiled plan through the "
                     "reference executor)"}})
    for bits in WIDE_BITS:
        agree = [r["top1_agreement"] for r in rows if r["wide_bits"] == bits]
        print(f"wide {bits:2d}: top-1 agreement min {min(agree):.4f} mean "
              f"{sum(agree) / len(agree):.4f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
