"""Quantization accuracy (issue 4): a small CNN on scikit-learn's digits (8x8), FP32 against
QAT with the MAX scale, the stochastic Rand scale and Rand + adaptive precision mix, at w8a8,
w4a4, w2a2 and w1a2, over several seeds (mean and std of test accuracy).

Protocol per seed: stratified 75/25 split of the 1797 images (seed), FP32 training from scratch,
then for every precision and method a QAT fine-tune of a copy of the FP32 model (same epochs,
optimizer and data order for every method). The first conv and the last linear layer stay float
(partial quantization); BatchNorm stays float during QAT and is folded by `convert`. Every QAT
model is also converted to integer layers and evaluated through `lowbit.reference` (the
`integer_accuracy_*` columns), which must equal the fake-quant accuracy up to rare rounding flips.

Targets: Rand+mix >= MAX (mean over seeds) at every bit width; w8a8 within 0.5 points of FP32;
w2a2 within 3 points. Differences to MAX are paired (same FP32 model, data order and test split
per seed) and reported with their standard error over seeds. Runs on CPU in a few minutes (one
process per seed, 20 seeds ~4 min on 2 cores); writes benchmarks/results/cpu/accuracy-*.json.
    python benchmarks/accuracy.py [--seeds 20] [--fp32-epochs 12] [--qat-epochs 10] [--workers N]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lowbit
from common import write_results
from lowbit.core import parse_wa
from lowbit.quant import precision_schedule
from lowbit.quant.data import digits_loaders

PRECISIONS = ("w8a8", "w4a4", "w2a2", "w1a2")
METHODS = (("max", "max", False), ("rand", "rand", False), ("rand+mix", "rand", True))
# Rand's tail threshold: the thesis' 0.001% is below one element of these small activation
# tensors (batch 64 x 32 x 4 x 4 = 32768), which would make p = 0 and Rand the same as MAX.
RAND_THRESHOLD = 1e-3
# Mix settings, one rule for every bit width (no per-precision tuning):
# - the precision warm-up is capped at the first quarter of QAT (MIX_UNTIL_FRACTION), as a
#   learning-rate warm-up would be, so rand+mix trains >= 75% of its steps at the deployed
#   precision (with 1/2, as before, it spent 30-40% of QAT at >= 9 bits);
# - tau * eta = 20 steps, the histogram window, is about one epoch (22 steps);
# - beta is set so that the slowest schedule still descends gradually inside the cap: at
#   beta = 8 the slowest layer (w2a2) reached its target at step 88-96 of 220 (43%), so beta is
#   scaled by 43% / 25% and rounded up to a power of two: 16. At beta = 8 with the 25% cap
#   the 2-bit schedules were cut at >= 9 bits and jumped to the target (results 153901).
TAU, ETA, BETA = 4, 5, 16.0
MIX_UNTIL_FRACTION = 0.25


def make_model() -> nn.Module:
    """4 conv + BN + ReLU layers and a linear classifier, ~33k parameters."""
    def block(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, stride, 1), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(*block(1, 16, 1), *block(16, 32, 2), *block(32, 32, 1),
                         *block(32, 64, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def train(model: nn.Module, loader, epochs: int, lr: float) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * len(loader))
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sched.step()


@torch.no_grad()
def accuracy(model: nn.Module, loader) -> float:
    model.eval()
    right = total = 0
    for x, y in loader:
        right += int((model(x).argmax(1) == y).sum())
        total += len(y)
    return 100.0 * right / total


def qat(fp32: nn.Module, precision: str, method: str, mix: bool, train_loader, epochs: int,
        seed: int) -> nn.Module:
    wb, ab = parse_wa(precision)
    steps = epochs * len(train_loader)
    q = lowbit.quantize(fp32, weight_bits=wb, act_bits=ab, method=method, mix=mix,
                        skip_first=True, skip_last=True, threshold=RAND_THRESHOLD, tau=TAU,
                        eta=ETA, beta=BETA, mix_until=int(MIX_UNTIL_FRACTION * steps))
    torch.manual_seed(1000 + seed)
    train_loader.generator.manual_seed(seed)  # same data order for every method
    train(q, train_loader, epochs, lr=1e-3)
    return q


def _mean_std(v: list[float]) -> tuple[float, float]:
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def run_seed(seed: int, fp32_epochs: int, qat_epochs: int, threads: int) -> dict:
    """Every (precision, method) of one seed: accuracies, integer accuracies, mix schedules."""
    torch.set_num_threads(threads)
    t0 = time.time()
    acc, iacc, schedules = {}, {}, {}
    train_loader, test_loader = digits_loaders(batch_size=64, seed=seed)
    torch.manual_seed(seed)
    fp32 = make_model()
    train(fp32, train_loader, fp32_epochs, lr=3e-3)
    acc["fp32", "fp32"] = accuracy(fp32, test_loader)
    for precision in PRECISIONS:
        for name, method, mix in METHODS:
            q = qat(copy.deepcopy(fp32), precision, method, mix, train_loader, qat_epochs, seed)
            acc[precision, name] = accuracy(q, test_loader)
            iacc[precision, name] = accuracy(lowbit.convert(q), test_loader)
            if mix:
                schedules[precision] = {layer: [list(h) for h in _changes(hist)]
                                        for layer, hist in precision_schedule(q).items()}
            print(f"seed {seed} {precision:5s} {name:8s} acc {acc[precision, name]:6.2f} "
                  f"integer {iacc[precision, name]:6.2f}  [{time.time() - t0:5.0f} s]",
                  flush=True)
    return {"acc": acc, "iacc": iacc, "schedules": schedules,
            "qat_steps": qat_epochs * len(train_loader)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--fp32-epochs", type=int, default=12)
    ap.add_argument("--qat-epochs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=0,
                    help="processes, one seed each (default: min(seeds, CPU cores))")
    args = ap.parse_args()
    t0 = time.time()
    workers = args.workers or min(args.seeds, os.cpu_count() or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)
    jobs = [(seed, args.fp32_epochs, args.qat_epochs, threads) for seed in range(args.seeds)]
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(run_seed, *zip(*jobs, strict=True)))
    else:
        results = [run_seed(*job) for job in jobs]
    rows = []
    for key in results[0]["acc"]:
        precision, name = key
        mean, std = _mean_std([r["acc"][key] for r in results])
        row = {"precision": precision, "method": name, "accuracy_mean": round(mean, 3),
               "accuracy_std": round(std, 3),
               "accuracies": [round(r["acc"][key], 3) for r in results]}
        if key in results[0]["iacc"]:
            im, istd = _mean_std([r["iacc"][key] for r in results])
            row.update(integer_accuracy_mean=round(im, 3), integer_accuracy_std=round(istd, 3))
        if name in ("rand", "rand+mix"):
            # same FP32 model, data order and test split per seed: a paired comparison
            diff = [r["acc"][key] - r["acc"][precision, "max"] for r in results]
            dm, ds = _mean_std(diff)
            row.update(paired_minus_max_mean=round(dm, 3), paired_minus_max_std=round(ds, 3),
                       paired_minus_max_se=round(ds / len(diff) ** 0.5, 3))
        if name == "rand+mix":
            row["schedule"] = [r["schedules"][precision] for r in results]
        rows.append(row)
    steps = results[0]["qat_steps"]
    setup = {"dataset": "sklearn digits 8x8, 75/25 stratified split per seed",
             "model": "conv16-conv32/s2-conv32-conv64/s2 (3x3, BN, ReLU) + avgpool + fc10",
             "float_layers": ["first conv (0)", "last linear (15)"],
             "schedule_format": "per seed: {layer: [[qat step, activation bits], ...]} "
                                "at every change of the integer training precision",
             "seeds": args.seeds, "fp32_epochs": args.fp32_epochs, "qat_epochs": args.qat_epochs,
             "qat_steps": steps, "rand_threshold": RAND_THRESHOLD, "tau": TAU, "eta": ETA,
             "beta": BETA, "mix_until_step": int(MIX_UNTIL_FRACTION * steps),
             "workers": workers, "wall_s": round(time.time() - t0, 1)}
    path = write_results("accuracy", rows, {"setup": setup, "targets": _targets(rows)})
    _print_table(rows)
    print(f"wrote {path}")
    print(f"wrote {plot_schedules(results[0]['schedules'], path.with_suffix('.png'))}")


def plot_schedules(schedules: dict[str, dict], path: Path) -> Path:
    """One panel per precision: activation training bits per layer over the QAT steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(schedules), figsize=(4 * len(schedules), 3), sharey=True)
    for ax, (precision, layers) in zip(axes, schedules.items(), strict=True):
        for layer, hist in layers.items():
            steps, bits = zip(*hist, strict=True)
            ax.step(steps, bits, where="post", label=f"layer {layer}")
        ax.set_title(f"rand+mix {precision} (seed 0)")
        ax.set_xlabel("QAT step")
    axes[0].set_ylabel("activation training bits")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _changes(history: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = history[:1]
    for prev, h in itertools.pairwise(history):
        if h[1] != prev[1]:
            out.append(h)
    return out


def _targets(rows: list[dict]) -> dict:
    by = {(r["precision"], r["method"]): r["accuracy_mean"] for r in rows}
    fp32 = by["fp32", "fp32"]
    out = {f"rand+mix>=max@{p}": by[p, "rand+mix"] >= by[p, "max"] for p in PRECISIONS}
    out["w8a8_within_0.5_of_fp32"] = all(fp32 - by["w8a8", m] <= 0.5 for m, _, _ in METHODS)
    out["w2a2_within_3_of_fp32"] = all(fp32 - by["w2a2", m] <= 3.0 for m, _, _ in METHODS)
    return out


def _print_table(rows: list[dict]) -> None:
    print(f"{'precision':9s} {'method':9s} {'acc mean':>9s} {'std':>6s} {'integer':>8s} "
          f"{'-max (paired, +- se)':>20s}")
    for r in rows:
        diff = (f"{r['paired_minus_max_mean']:+6.2f} +- {r['paired_minus_max_se']:.2f}"
                if "paired_minus_max_mean" in r else "")
        print(f"{r['precision']:9s} {r['method']:9s} {r['accuracy_mean']:9.2f} "
              f"{r['accuracy_std']:6.2f} {r.get('integer_accuracy_mean', float('nan')):8.2f} "
              f"{diff:>20s}")


if __name__ == "__main__":
    main()
