"""The accuracy a quantized residual stream costs: `lowbit.quantize(..., residual_bits=b)`
against the engine's 24-bit stream (residual_bits=None), paired over seeds.

Per seed: the harder digits ResNet (residual adds) trained in FP32 once (benchmarks/accuracy.py's
digits_hard schedule), then for every precision and every residual setting an LSQ QAT from the
same FP32 weights with the same data order and torch stream (accuracy.py's schedule; first conv
and last linear float). residual_bits=None leaves the residual adds float in the model (the
engine realizes them 24 bits wide); 8 / 4 / 16 quantize the values residual adds read in the
model itself (`lowbit.quant.residual`), so QAT trains with them. Each QAT model is evaluated
fake-quant and through `lowbit.compile(q.eval(), x)` run by the exact reference executor on
the whole test split.

Rows: {seed, precision, residual_bits (None = the 24-bit engine stream), accuracy (fake-quant,
%), compiled_accuracy (%), agreement (fraction of test images whose compiled prediction is the
fake-quant model's), max_logit_diff, fp32_accuracy, qat_s, test_images}. The summary gives, per
precision and residual width b, the paired per-seed differences b - None of the compiled
accuracy (what a deployed model gains or loses) and of the fake-quant accuracy: mean, std,
standard error and the per-seed list, plus the agreement's mean and minimum.

Every finished row is appended at once to a journal (JSON lines keyed by the settings): a run
that is stopped loses no finished row, `--resume` skips the rows the journal holds, and
`--from-journal` writes the results of the rows finished so far. With `--fp32-cache` a seed's
FP32 model (and the random states its training left) is trained once for every run.
Runs on the CPU, one process; writes benchmarks/results/cpu/residual_bits-*.json.
    python benchmarks/residual_bits.py [--seeds 10] [--residual-bits none 8 4 16]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lowbit
from accuracy import QUICK, SCHEDULES, Schedule, _reseed, fp32_model, train
from common import write_results
from lowbit.core import parse_wa
from lowbit.quant.datasets import benchmark_loaders
from lowbit.quant.residual import residual_quantizers

DATASET, MODEL = "digits_hard", "digits_resnet"
#: residual settings: None (float in the model, the engine's 24-bit stream), then the widths
RESIDUAL = (None, 8, 16, 4)
BASELINE = None


def _bits(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if text not in ("4", "8", "16"):
        raise argparse.ArgumentTypeError(f"residual bits must be none, 4, 8 or 16, got {text!r}")
    return int(text)


def _predict(fn, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference executor
        return fn(x)


def run_one(fp32: torch.nn.Module, precision: str, residual_bits: int | None, loader,
            x: torch.Tensor, y: torch.Tensor, sched: Schedule, seed: int) -> dict:
    """QAT of one (precision, residual setting) from `fp32`; its fake-quant and compiled
    evaluation on the test split (x, y)."""
    t0 = time.time()
    wb, ab = parse_wa(precision)
    q = lowbit.quantize(copy.deepcopy(fp32), weight_bits=wb, act_bits=ab, method="lsq",
                        skip_first=True, skip_last=True, residual_bits=residual_bits)
    _reseed(loader, seed)
    train(q, loader, sched.qat_epochs, sched.qat_lr)
    qat_s = time.time() - t0
    q.eval()
    fake = _predict(q, x)
    compiled = lowbit.compile(q, x, executor="reference", records=False)
    got = _predict(compiled, x)
    return {"seed": seed, "precision": precision, "residual_bits": residual_bits,
            "accuracy": round(100 * float((fake.argmax(1) == y).float().mean()), 3),
            "compiled_accuracy": round(100 * float((got.argmax(1) == y).float().mean()), 3),
            "agreement": round(float((got.argmax(1) == fake.argmax(1)).float().mean()), 6),
            "max_logit_diff": round(float((got - fake).abs().max()), 4),
            "residual_points": len(residual_quantizers(q)),
            "qat_s": round(qat_s, 1), "eval_s": round(time.time() - t0 - qat_s, 1),
            "test_images": len(y)}


def _paired(a: list[float], b: list[float]) -> dict:
    d = [round(u - v, 3) for u, v in zip(a, b, strict=True)]
    std = statistics.stdev(d) if len(d) > 1 else 0.0
    return {"mean": round(statistics.fmean(d), 3), "std": round(std, 3),
            "se": round(std / len(d) ** 0.5, 3), "per_seed": d}


def summarize(rows: list[dict]) -> dict:
    """{precision: {"<b>_minus_none": paired differences over the seeds both have, "agreement":
    {setting: mean / min}}} (module docstring)."""
    out: dict[str, dict] = {}
    for precision in dict.fromkeys(r["precision"] for r in rows):
        rs = [r for r in rows if r["precision"] == precision]
        by = {}
        for r in rs:
            by.setdefault(r["residual_bits"], {})[r["seed"]] = r
        entry: dict[str, dict] = {"agreement": {}}
        for bits, seeds in by.items():
            agree = [r["agreement"] for r in seeds.values()]
            entry["agreement"][str(bits).lower()] = {
                "mean": round(statistics.fmean(agree), 6), "min": min(agree), "seeds": len(agree)}
        base = by.get(BASELINE, {})
        for bits, seeds in by.items():
            common = sorted(s for s in seeds if s in base)
            if bits is BASELINE or not common:
                continue
            entry[f"{bits}_minus_none"] = {
                "seeds": common,
                "compiled": _paired([seeds[s]["compiled_accuracy"] for s in common],
                                    [base[s]["compiled_accuracy"] for s in common]),
                "fake_quant": _paired([seeds[s]["accuracy"] for s in common],
                                      [base[s]["accuracy"] for s in common])}
        out[precision] = entry
    return out


def targets(summary: dict, limit: float = 0.5) -> dict[str, bool]:
    """residual_bits=8 within `limit` points of the 24-bit stream (compiled, paired mean)."""
    return {f"residual8_within_{limit:g}_of_24bit@{p}": s["8_minus_none"]["compiled"]["mean"]
            >= -limit for p, s in summary.items() if "8_minus_none" in s}


def _settings_key(sched: Schedule) -> str:
    return hashlib.sha256(json.dumps({"schedule": asdict(sched), "dataset": DATASET,
                                      "model": MODEL, "method": "lsq"},
                                     sort_keys=True).encode()).hexdigest()[:16]


def read_journal(path: Path, settings: str) -> dict[tuple, dict]:
    """{(seed, precision, residual_bits): row} of the journal's rows of these settings."""
    found = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if doc.get("settings") == settings:
                r = doc["row"]
                found[(r["seed"], r["precision"], r["residual_bits"])] = r
    return found


def run_seed(seed: int, precisions: tuple[str, ...], settings: tuple[int | None, ...],
             sched: Schedule, done: dict, journal: Path, key: str,
             fp32_cache: Path | None) -> list[dict]:
    todo = [(p, b) for p in precisions for b in settings if (seed, p, b) not in done]
    if not todo:
        return []
    train_loader, test_loader = benchmark_loaders(DATASET, sched.batch_size, seed)
    fp32 = fp32_model(DATASET, MODEL, seed, sched, train_loader, fp32_cache)
    xs, ys = zip(*test_loader, strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    fp32_acc = round(100 * float((_predict(fp32.eval(), x).argmax(1) == y).float().mean()), 3)
    rows = []
    for precision, bits in todo:
        row = {**run_one(fp32, precision, bits, train_loader, x, y, sched, seed),
               "fp32_accuracy": fp32_acc}
        rows.append(row)
        journal.parent.mkdir(parents=True, exist_ok=True)
        with journal.open("a") as f:
            f.write(json.dumps({"settings": key, "row": row}) + "\n")
        print(f"seed {seed} {precision} residual {bits!s:4s}: fake-quant "
              f"{row['accuracy']:6.2f} compiled {row['compiled_accuracy']:6.2f} agreement "
              f"{row['agreement']:.4f} (fp32 {fp32_acc:.2f}) [{row['qat_s']:.0f} + "
              f"{row['eval_s']:.0f} s]", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--precisions", nargs="+", default=["w1a2", "w2a2"])
    ap.add_argument("--residual-bits", nargs="+", type=_bits, default=list(RESIDUAL),
                    help="settings to compare: none (the 24-bit engine stream), 4, 8, 16")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 QAT epoch, short FP32")
    ap.add_argument("--fp32-cache", type=Path, help="folder of FP32 checkpoints (accuracy.py's)")
    ap.add_argument("--out", help="results folder (default benchmarks/results/cpu)")
    ap.add_argument("--journal", type=Path, help="row journal, JSON lines (default: "
                    "residual_bits-journal.jsonl in the results folder)")
    ap.add_argument("--resume", action="store_true",
                    help="skip the rows that the journal holds for the same settings")
    ap.add_argument("--from-journal", action="store_true",
                    help="run nothing: write the results of the journal's rows")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    if not 0 <= args.first_seed < args.seeds:
        ap.error("--first-seed must be in [0, --seeds)")
    for p in args.precisions:
        parse_wa(p)
    settings = tuple(dict.fromkeys(args.residual_bits))
    if BASELINE not in settings:
        ap.error("--residual-bits must include none (the baseline of the paired differences)")
    if args.out:
        os.environ["LOWBIT_RESULTS_DIR"] = args.out
    torch.set_num_threads(1)
    sched = (QUICK if args.quick else SCHEDULES)[DATASET]
    key = _settings_key(sched)
    journal = args.journal or Path(os.environ.get("LOWBIT_RESULTS_DIR") or
                                   Path(__file__).parent / "results" / "cpu"
                                   ) / "residual_bits-journal.jsonl"
    seeds = range(args.first_seed, args.seeds)
    done = {k: r for k, r in read_journal(journal, key).items()
            if k[0] in seeds and k[1] in args.precisions and k[2] in settings}
    if args.from_journal and not done:
        ap.error(f"--from-journal: {journal} holds no row of these settings")
    skip = done if (args.resume or args.from_journal) else {}
    t0 = time.time()
    rows = list(skip.values())
    if not args.from_journal:
        for seed in seeds:
            rows += run_seed(seed, tuple(args.precisions), settings, sched, skip, journal, key,
                             args.fp32_cache)
    rows.sort(key=lambda r: (r["seed"], args.precisions.index(r["precision"]),
                             settings.index(r["residual_bits"])))
    summary = summarize(rows)
    verdicts = targets(summary)
    setup = {"dataset": DATASET, "model": MODEL, "method": "lsq", "schedule": asdict(sched),
             "quick": args.quick, "seeds": sorted({r["seed"] for r in rows}),
             "precisions": list(args.precisions), "residual_bits": list(settings),
             "layer_policy": "first Conv2d and last Linear float (skip_first / skip_last)",
             "baseline": "residual_bits=None: residual adds float in the model, the compiled "
                         "plan's 24-bit stream",
             "compiled": "lowbit.compile(q.eval(), test split, executor='reference')",
             "settings_key": key, "wall_s": round(time.time() - t0, 1)}
    path = write_results("residual_bits", rows, {"setup": setup, "summary": summary,
                                                 "targets": verdicts})
    for precision, s in summary.items():
        for name, d in s.items():
            if name.endswith("_minus_none"):
                c, f = d["compiled"], d["fake_quant"]
                print(f"{precision} residual {name}: compiled {c['mean']:+.2f} (std "
                      f"{c['std']:.2f}, se {c['se']:.2f}), fake-quant {f['mean']:+.2f} "
                      f"(std {f['std']:.2f}) over {len(d['seeds'])} seeds")
        for bits, a in s["agreement"].items():
            print(f"{precision} residual {bits}: compiled vs fake-quant agreement mean "
                  f"{a['mean']:.4f} min {a['min']:.4f}")
    for k, v in verdicts.items():
        print(f"target {k}: {'met' if v else 'MISSED'}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
