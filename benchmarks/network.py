"""Whole networks on the GPU executor against PyTorch fp16 (issue 32): `"benchmark": "network"`
rows {model, batch, precision, time_ms, images_per_s, baselines_ms: {fp16_eager,
fp16_cuda_graph, fp16_compile}, layers: [{name, impl, time_us, floor_us, share, alone_us}],
weights_bytes, peak_activation_bytes, fp16_weights_bytes, fp16_peak_activation_bytes} in one
results file (`common.write_results`'s header) under benchmarks/results/<gpu>/ or --out,
rewritten after every case so a cut-off run keeps what it measured; a failing case is a row
with its error. Prints a table and the dataflow targets (met / missed, with what bounds each
miss) last, and draws the per-step times next to PyTorch fp16's per module
(network-<stamp>.png).

    python benchmarks/network.py --cases resnet18:8:w1a2 resnet50:256:w8a8 --compile-mode default
    python benchmarks/network.py --models resnet18 vgg16 --batches 8 --precisions w1a2 w8a8

Precisions are `lowbit.bench` recipes ("w1a2": first conv and last linear at w8a8).
The measuring code lives in lowbit.bench (what `lowbit bench` runs); the targets the rows are
judged by (`check_targets`) live here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpu_name, results_dir, versions
from lowbit.bench import (
    IMAGE_SIZE,
    TENSORRT_INT8_RESNET50_IMAGES_S,
    BenchCase,
    bench_network,
    compile_baseline_ms,
    fp16_model,
    impl_chooser,
    per_layer_figure,
    random_images,
    summary_table,
)
from lowbit.graph.stem_choice import STEM_CHOICES

DEFAULT_CASES = ["resnet18:8:w1a2", "resnet50:256:w1a2", "resnet50:256:w8a8", "vgg16:8:w1a2",
                 "alexnet:8:w1a2"]


# ------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    bound: float
    met: bool | None
    why: str = ""


def _row(rows: list[dict], model: str, batch: int, precision: str) -> dict | None:
    """The fastest default row of (model, batch, precision) (any residual stream, exact
    biases, the default wide width)."""
    found = [r for r in rows if (r.get("model"), r.get("batch"), r.get("precision")) ==
             (model, batch, precision) and r.get("time_ms") and r.get("exact_bias", True)
             and r.get("wide_bits", 24) == 24]
    return min(found, key=lambda r: r["time_ms"]) if found else None


def _bottleneck(row: dict) -> str:
    """What bounds a row: its floor and its three largest steps against their floors."""
    top = sorted(row.get("layers", []), key=lambda r: -r["time_us"])[:3]
    parts = [f"{r['name']} {r['time_us']:.1f} us (floor {r['floor_us']:.1f})" for r in top]
    return f"network floor {row.get('floor_ms', 0):.3f} ms; largest: " + ", ".join(parts)


def check_targets(rows: list[dict]) -> list[Target]:
    """The dataflow targets over the rows present (missing rows: met None): ResNet-50 at
    batch 256 against TensorRT int8's cited throughput and its own floor sum, ResNet-18 at
    batch 8, and every first layer within 3x its floor."""
    out: list[Target] = []

    def add(name: str, value: float | None, bound: float, higher: bool, r: dict | None) -> None:
        met = None if value is None else (value >= bound if higher else value <= bound)
        out.append(Target(name, value, bound, met, "" if met or r is None else _bottleneck(r)))

    for precision, bound in (("w1a2", 100_000), ("w2a2", TENSORRT_INT8_RESNET50_IMAGES_S),
                             ("w8a8", 60_000)):
        r = _row(rows, "resnet50", 256, precision)
        add(f"ResNet-50 {precision} b256 images/s >=", r and r["images_per_s"], bound, True, r)
        if r is not None and r.get("floor_ms"):
            add(f"ResNet-50 {precision} b256 time / floor sum <=",
                r["time_ms"] / r["floor_ms"], 1.5, False, r)
    r18 = _row(rows, "resnet18", 8, "w1a2")
    add("ResNet-18 w1a2 b8 time (ms) <=", r18 and r18["time_ms"], 0.10, False, r18)
    for r in rows:
        stems = [s for s in r.get("layers", []) if s["impl"].startswith("triton stem")]
        for s in stems:
            v = s["time_us"] / s["floor_us"]
            out.append(Target(f"{r['model']} b{r['batch']} first layer time / floor <=", v, 3.0,
                              v <= 3.0, f"{s['time_us']:.1f} us, floor {s['floor_us']:.1f}"))
    return out


def target_lines(rows: list[dict]) -> list[str]:
    """`check_targets` as lines: [met / MISS / n/a] name bound: value  what bounds it."""
    lines = []
    for t in check_targets(rows):
        state = "n/a " if t.met is None else ("met " if t.met else "MISS")
        val = "-" if t.value is None else (f"{t.value:.3f}" if t.value < 1000 else
                                           f"{t.value:,.0f}")
        lines.append(f"[{state}] {t.name} {t.bound:g}: {val}  {t.why}")
    return lines


def parse_case(text: str) -> BenchCase:
    """MODEL:BATCH:PRECISION (MODEL a zoo name or tv:NAME, a torchvision model), then
    optionally :kernelbias (the plan's biases in accumulator units, so single-output layers
    keep their kernel's own epilogue), :wide16 / :wide8
    (the residual stream's width, `lowbit.compile(wide_bits=...)`; default 24),
    :model / :int8=TEMPLATE / :int8=-TEMPLATE (the per-layer implementation policy,
    `impl_chooser`: the performance model's pick, the default with that int8 template first,
    or the default without it) and :nofuse
    (int8 layers leave their layer epilogue to the separate pass), :res8 / :res4 / :res16
    (the quantized model's residual stream, `lowbit.quantize(residual_bits=...)`), :tuned
    (the plan reads the user's tuning records), :approx (the approximate 32-bit
    requantizations, `PlanOptions(requant32=True)`; without it the plan equals `convert` at
    every precision, as `lowbit.compile`'s), :sum64 (exact block ends as the plain 64-bit
    sum, not the guarded 32-bit one: `PlanOptions(guarded_block_ends=False)`) and
    :stem=KERNEL (the fused first layer on that kernel where it runs it:
    `PlanOptions.stem_kernel`, "ws", "ring" or "bands")."""
    try:
        prefix = ""
        if text.startswith("tv:"):  # a torchvision model: tv:NAME:BATCH:PRECISION...
            prefix, text = "tv:", text[3:]
        model, batch, precision, *rest = text.split(":")
        model = prefix + model
        wide = [r for r in rest if r in ("wide16", "wide8", "wide24")]
        res = [r for r in rest if r in ("res4", "res8", "res16")]
        policy = [r for r in rest if r == "model" or r.startswith("int8=")]
        stem = [r.removeprefix("stem=") for r in rest if r.startswith("stem=")]
        if len(wide) > 1 or len(policy) > 1 or len(res) > 1 or len(stem) > 1 or any(
                s not in STEM_CHOICES for s in stem) or any(
                r not in ("kernelbias", "nofuse", "tuned", "approx", "sum64", *wide, *res, *policy,
                          *(f"stem={s}" for s in stem)) for r in rest):
            raise ValueError
        chooser = policy[0].removeprefix("int8=") if policy else "default"
        impl_chooser(chooser)
        return BenchCase(model, int(batch), precision, exact_bias="kernelbias" not in rest,
                         wide_bits=int(wide[0][4:]) if wide else 24, chooser=chooser,
                         fuse_outputs="nofuse" not in rest,
                         residual_bits=int(res[0][3:]) if res else None,
                         records=True if "tuned" in rest else False,
                         requant32="approx" in rest, guarded_block_ends="sum64" not in rest,
                         stem_kernel=stem[0] if stem else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a case is MODEL:BATCH:PRECISION[:kernelbias][:wide16|:wide8][:model|:int8=[-]NAME]"
            f"[:nofuse][:res8|:res4|:res16][:tuned][:approx|:sum64][:stem=ws|ring|bands], "
            f"got {text!r}"
        ) from None


def cases_of(args: argparse.Namespace) -> list[BenchCase]:
    if args.models or args.batches or args.precisions:
        return [BenchCase(m, b, p) for m in (args.models or ["resnet18"])
                for b in (args.batches or [8]) for p in (args.precisions or ["w1a2"])]
    return args.cases or [parse_case(c) for c in DEFAULT_CASES]


def write(path: Path, rows: list[dict], extra: dict) -> None:
    doc = {"benchmark": "network", "gpu": gpu_name(), "date": dt.date.today().isoformat(),
           "versions": versions(), **extra, "rows": rows,
           "targets": [t.__dict__ for t in check_targets(rows)]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def figure(rows: list[dict], path: Path) -> Path | None:
    """One picture, a panel per row (per_layer_figure's bars)."""
    good = [r for r in rows if r.get("layers")]
    if not good:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as tmp:
        panels = [per_layer_figure(r, f"{tmp}/{i}.png") for i, r in enumerate(good)]
        images = [plt.imread(p) for p in panels if p]
        fig, axes = plt.subplots(len(images), 1, figsize=(12, 4.2 * len(images)), squeeze=False)
        for ax, img in zip(axes[:, 0], images, strict=True):
            ax.imshow(img)
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path


def late_compile_baselines(rows: list[dict], models: list[str], mode: str, path: Path,
                           extra: dict) -> None:
    """torch.compile baselines of the rows of `models`, once per (model, batch), after every
    case ran; each result written as it comes."""
    done: dict[tuple, tuple] = {}
    for row in rows:
        if row.get("error") or row["model"] not in models:
            continue
        key = (row["model"], row["batch"], row.get("image_size"))
        if key not in done:
            print(f"== torch.compile({mode}) {row['model']} b{row['batch']}", flush=True)
            size = row.get("image_size") or IMAGE_SIZE.get(row["model"], 224)
            m = fp16_model(row["model"])
            xh = random_images(row["batch"], size, seed=2, device="cuda").half().contiguous(
                memory_format=torch.channels_last)
            done[key] = compile_baseline_ms(m, xh, mode)
            del m
            torch.cuda.empty_cache()
        row["baselines_ms"]["fp16_compile"], notes = done[key]
        row.setdefault("notes", {}).update(notes)
        write(path, rows, extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    ap.add_argument("--cases", type=parse_case, nargs="+", default=None,
                    help=f"MODEL:BATCH:PRECISION in priority order (default {DEFAULT_CASES})")
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--precisions", nargs="+", default=None)
    ap.add_argument("--compile-mode", default="max-autotune",
                    help="torch.compile mode of the fp16 baseline ('none' skips it)")
    ap.add_argument("--compile-models", nargs="+", default=None,
                    help="the torch.compile baseline only for these models, measured after "
                         "every case (a cut run keeps its other rows)")
    ap.add_argument("--no-chain", dest="chain", action="store_false",
                    help="launch the bit-serial layers unchained (no PDL; the engine chains "
                         "them by default)")
    ap.add_argument("--quick", action="store_true", help="fewer timing repeats")
    ap.add_argument("--no-figure", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("network.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out = args.out or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out / f"network-{stamp}.json"
    mode = None if args.compile_mode == "none" else args.compile_mode
    extra = {"compile_mode": mode, "chain": args.chain, "quick": args.quick}
    rows: list[dict] = []
    inline = mode if args.compile_models is None else None
    for case in cases_of(args):
        t0 = time.perf_counter()
        print(f"== {case.model} b{case.batch} {case.precision}", flush=True)
        try:
            row = bench_network(case, compile_mode=inline, chain=args.chain, quick=args.quick)
        except Exception as e:  # one failing case is a row, the run goes on
            traceback.print_exc()
            row = {"model": case.model, "batch": case.batch, "precision": case.precision,
                   "error": f"{type(e).__name__}: {e}"[:2000]}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        write(path, rows, extra)
        print(summary_table([row]), flush=True)
        torch.cuda.empty_cache()
    if mode and args.compile_models:
        late_compile_baselines(rows, args.compile_models, mode, path, extra)
    if not args.no_figure:
        try:
            figure(rows, out / f"network-{stamp}.png")
        except Exception as e:  # the picture is optional
            print(f"figure failed: {type(e).__name__}: {e}", file=sys.stderr)
    print(f"results: {path}")
    print(summary_table(rows))
    print()
    print("\n".join(target_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
