"""Tuning benchmark (issue 5): search strategies against the exhaustive optimum of the space.

Two steps, because GPU time is scarce and a replay is exact:

    python benchmarks/tuning.py measure [--budget-s 480] [--layers a,b]  # on the GPU
    python benchmarks/tuning.py timed [--layers a,b] [--trials 500]     # on the GPU
    python benchmarks/tuning.py multigpu [--gpus 2]                     # 1 vs n GPUs (Dask)
    python benchmarks/tuning.py replay TABLES.json [MORE.json ...]      # anywhere (CPU)

`measure` builds, verifies bit for bit against `lowbit.reference.run` and times *every* config
of the `triton.conv2d_int8` space on each ResNet-50 3x3 layer (batch 16 and 256) and the TVM
tutorial layer (epilogue bias + ReLU -> s8), and writes the tables (config -> time or error)
plus the measured seconds per config (compile + verify + time) to `tables-<stamp>.json`.
`replay` runs `lowbit.tune.tune` with each strategy (random, sa, diversity, tpe; 5 seeds) on a
`TableMeasurer` over those tables, so every strategy sees the same measured times; it writes
`"benchmark": "tuning"` JSON and a PNG of best-so-far vs trials. `wall_s_500` is estimated
from the measured seconds per config (parallel compile included), and labelled so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from lowbit.core import Config, Epilogue, load_workloads, workload_from_dict

SUITES = ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial")
EPILOGUE = Epilogue(bias=True, relu=True, out="s8")
STRATEGY_NAMES = ("random", "sa", "diversity", "tpe")
TRIALS, SEEDS = 500, 5


def _layers(only: list[str] | None) -> list[tuple[str, object]]:
    layers = [(n, wl) for s in SUITES for n, wl in load_workloads(s, epilogue=EPILOGUE)]
    if only:
        unknown = set(only) - {n for n, _ in layers}
        if unknown:
            raise SystemExit(f"unknown layers {sorted(unknown)}; known: {[n for n, _ in layers]}")
        layers = [(n, wl) for n, wl in layers if n in only]
    return layers


def measure(budget_s: float, workers: int, only: list[str] | None = None) -> Path:
    """Exhaustive verified timing of the conv space per layer; the table file is rewritten
    after every layer so a run cut short keeps the finished layers."""
    import conv  # the sweep / precompile helpers of the conv benchmark
    from lowbit.kernels.triton import CONV2D_INT8

    t0 = time.perf_counter()
    layers = _layers(only)
    plan = [(n, wl, list(CONV2D_INT8.space(wl))) for n, wl in layers]
    conv.precompile([(CONV2D_INT8, wl, c) for _, wl, cs in plan for c in cs], workers)
    compile_s = time.perf_counter() - t0
    n_all = sum(len(cs) for *_, cs in plan)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = common.results_dir() / f"tables-{stamp}.json"
    doc = {"benchmark": "tuning_tables", "gpu": common.gpu_name(), "versions": common.versions(),
           "template": CONV2D_INT8.name, "epilogue": EPILOGUE.key,
           "compile_s_per_config": compile_s / n_all, "layers": []}
    conv.WARMUP_MS, conv.REP_MS = 3, 15  # shorter timing: 3,000+ configs in one call
    for name, wl, configs in plan:
        if time.perf_counter() - t0 > budget_s:
            print(f"{name}: skipped, budget spent", flush=True)
            continue
        t1 = time.perf_counter()
        res = conv.sweep_table(CONV2D_INT8, wl, configs)
        per = (time.perf_counter() - t1) / len(configs)
        doc["layers"].append({"workload": name, "key": wl.key, "wl": wl.to_dict(),
                              "measure_s_per_config": per,
                              "table": [[dict(c), t, e] for c, t, e in res]})
        path.write_text(json.dumps(doc))
        ok = [t for _, t, e in res if e is None]
        print(f"{name:32s} {len(ok)}/{len(configs)} ok, best {min(ok):.1f} us, "
              f"{per * 1e3:.0f} ms/config", flush=True)
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return path


def timed(only: list[str] | None, trials: int, strategy: str, budget_s: float,
          templates: list[str] | None = None) -> Path:
    """Real tunes as a user runs them (`lowbit.tune.tune` with its default crash-isolated
    `LocalMeasurer`: parallel compile, verify, time), on an empty records file per layer;
    writes the wall time of each to `timed-<stamp>.json`. templates: names of the templates
    searched together (default `triton.conv2d_int8`); each row gives every one's default."""
    from lowbit.kernels import get_template, load_backends
    from lowbit.kernels.triton import CONV2D_INT8
    from lowbit.tune import tune

    load_backends()  # CUDA templates (e.g. cuda.int8_wgmma) can join the search too
    pool = [get_template(n) for n in templates] if templates else [CONV2D_INT8]

    t0 = time.perf_counter()
    path = common.results_dir() / f"timed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {"benchmark": "tuning_timed", "gpu": common.gpu_name(), "versions": common.versions(),
           "templates": [t.name for t in pool], "strategy": strategy, "trials": trials, "rows": []}
    for name, wl in _layers(only):
        if time.perf_counter() - t0 > budget_s:
            print(f"{name}: skipped, budget spent", flush=True)
            continue
        with tempfile.TemporaryDirectory() as d:
            t1 = time.perf_counter()
            res = tune(wl, pool, trials=trials, strategy=strategy,
                       db=Path(d) / "records.db", seed=0, transfer=False, progress=False)
            wall = time.perf_counter() - t1
        fails = sum(not r.ok for r in res.history)
        usable = [t for t in pool if t.supports(wl)]
        row = {"workload": name, "key": wl.key, "wall_s": round(wall, 1),
               "trials": len(res.history), "space_size": sum(len(t.space(wl)) for t in usable),
               "failures": fails, "best_us": res.time_us, "best_template": res.template,
               "best_config": dict(res.config),
               "trials_by_template": {t.name: sum(r.template == t.name for r in res.history)
                                      for t in usable},
               "default_us": res.default_us.get(CONV2D_INT8.name),
               "defaults_us": dict(res.default_us), **best_by_template(res.history)}
        doc["rows"].append(row)
        path.write_text(json.dumps(doc, indent=1))
        print(f"{name:32s} {row['trials']} trials in {wall:.0f} s, best {res.time_us:.1f} us "
              f"({res.template}), "
              f"default {row['default_us']}, {fails} failed", flush=True)
    return path


def best_by_template(history: list) -> dict:
    """best_us_by_template / best_config_by_template: each template's fastest measured config,
    so a losing template's best is kept beside the winner's."""
    best: dict[str, object] = {}
    for r in history:
        if r.ok and r.time_us is not None and (
                r.template not in best or r.time_us < best[r.template].time_us):
            best[r.template] = r
    return {"best_us_by_template": {t: r.time_us for t, r in best.items()},
            "best_config_by_template": {t: dict(r.config) for t, r in best.items()}}


def multi_gpu(layer: str, trials: int, gpus: int) -> Path:
    """The same tune on one GPU (`LocalMeasurer`) and on `gpus` GPUs (`DaskMeasurer` over a
    local cluster, one measuring worker per GPU); writes both wall times to
    `multigpu-<stamp>.json`."""
    import distributed

    from lowbit.kernels.triton import CONV2D_INT8
    from lowbit.tune import tune
    from lowbit.tune.dask_backend import DaskMeasurer

    (name, wl), = _layers([layer])
    doc = {"benchmark": "tuning_multigpu", "gpu": common.gpu_name(), "gpus": gpus,
           "versions": common.versions(), "workload": name, "trials": trials, "runs": []}
    path = common.results_dir() / f"multigpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for n in (1, gpus):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            if n == 1:
                res = tune(wl, [CONV2D_INT8], trials=trials, db=Path(d) / "r.db", seed=0,
                           transfer=False, progress=False)
            else:
                with distributed.LocalCluster(n_workers=n, threads_per_worker=1,
                                              processes=False, dashboard_address=None) as cl, \
                        distributed.Client(cl) as client, \
                        DaskMeasurer(client, gpus=n) as m:
                    res = tune(wl, [CONV2D_INT8], trials=trials, db=Path(d) / "r.db", seed=0,
                               measurer=m, transfer=False, progress=False)
            wall = time.perf_counter() - t0
        run = {"gpus": n, "wall_s": round(wall, 1), "trials": len(res.history),
               "failures": sum(not r.ok for r in res.history), "best_us": res.time_us}
        doc["runs"].append(run)
        path.write_text(json.dumps(doc, indent=1))
        print(f"{name} on {n} GPU(s): {run['trials']} trials in {wall:.0f} s, best "
              f"{res.time_us:.1f} us", flush=True)
    return path


def _replay_one(layer: dict, strategy: str, seed: int, template) -> list[float | None]:
    """Best-so-far time after each trial of one tune over the measured table."""
    from lowbit.tune import tune
    from lowbit.tune.replay import TableMeasurer

    table = {(template.name, Config(c)): (t if e is None else e) for c, t, e in layer["table"]}
    wl = workload_from_dict(layer["wl"])
    with tempfile.TemporaryDirectory() as d:
        res = tune(wl, [template], trials=TRIALS, strategy=strategy, db=Path(d) / "r.db",
                   measurer=TableMeasurer(table, gpu="replay"), seed=seed, transfer=False,
                   progress=False)
    best, curve = None, []
    for r in res.history:
        if r.ok and (best is None or r.time_us < best):
            best = r.time_us
        curve.append(best)
    return curve


def _trials_to(curve: list[float | None], target_us: float) -> int | None:
    for i, b in enumerate(curve):
        if b is not None and b <= target_us:
            return i + 1
    return None


def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else
                                (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)


def _load_tables(paths: list[Path]) -> dict:
    """Merge table files (later files win per layer); keeps each layer's compile cost."""
    merged: dict = {"layers": {}, "tables": []}
    for p in paths:
        doc = json.loads(p.read_text())
        merged.update(gpu=doc["gpu"], versions=doc["versions"])
        merged["tables"].append(p.name)
        for layer in doc["layers"]:
            merged["layers"][layer["workload"]] = dict(
                layer, compile_s_per_config=doc["compile_s_per_config"])
    return merged


QUALITY_AT = (50, 100, 200, TRIALS)


def replay(tables: list[Path], seeds: int, timed_path: Path | None = None) -> Path:
    from lowbit.kernels.triton import CONV2D_INT8

    doc = _load_tables(tables)
    timed_rows = ({r["workload"]: r for r in json.loads(timed_path.read_text())["rows"]}
                  if timed_path else {})
    rows, curves = [], {}
    for layer in doc["layers"].values():
        ok = [t for _, t, e in layer["table"] if e is None]
        best = min(ok)
        row = {"workload": layer["workload"], "precision": "w8a8", "impl": CONV2D_INT8.name,
               "space_size": len(layer["table"]), "space_ok": len(ok), "exhaustive_best_us": best,
               "trials_to_095": {}, "trials_to_095_by_seed": {}, "quality_at_500_by_strategy": {},
               "quality_at_trials": {}, "replay_s": {}}
        for strategy in STRATEGY_NAMES:
            t0 = time.perf_counter()
            runs = [_replay_one(layer, strategy, s, CONV2D_INT8) for s in range(seeds)]
            row["replay_s"][strategy] = round(time.perf_counter() - t0, 1)
            curves[(layer["workload"], strategy)] = runs
            row["quality_at_trials"][strategy] = {
                n: _median([best / r[min(n, len(r)) - 1] for r in runs if r and r[-1]])
                for n in QUALITY_AT}
            row["quality_at_500_by_strategy"][strategy] = row["quality_at_trials"][strategy][TRIALS]
            per_seed = [_trials_to(r, best / 0.95) for r in runs]
            row["trials_to_095_by_seed"][strategy] = per_seed  # the spread behind the median
            row["trials_to_095"][strategy] = _median(per_seed)
            print(f"{layer['workload']:32s} {strategy:9s} trials to 0.95x: "
                  f"{row['trials_to_095'][strategy]}  quality@50/100/200/500 "
                  f"{row['quality_at_trials'][strategy]}", flush=True)
        row["quality_at_500"] = row["quality_at_500_by_strategy"]["diversity"]
        row.update(_wall_s_500(layer, timed_rows.get(layer["workload"])))
        rows.append(row)
    folder = common.ROOT / "benchmarks" / "results" / doc["gpu"].lower().replace(" ", "-")
    out = folder / f"tuning-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"benchmark": "tuning", "gpu": doc["gpu"],
                               "date": time.strftime("%Y-%m-%d"), "versions": doc["versions"],
                               "tables": doc["tables"], "timed": timed_path and timed_path.name,
                               "seeds": seeds, "rows": rows}, indent=1))
    _plot(curves, {r["workload"]: r["exhaustive_best_us"] for r in rows}, out.with_suffix(".png"))
    print(f"wrote {out}")
    return out


def _wall_s_500(layer: dict, timed_row: dict | None) -> dict:
    """Measured wall time of a real tune where `timed` ran the layer, else an estimate."""
    if timed_row is not None:
        return {"wall_s_500": timed_row["wall_s"], "wall_s_500_note": (
            f"measured: lowbit.tune.tune, {timed_row['trials']} trials (the whole space when it "
            "holds fewer than 500), parallel compile, verify + time per candidate"),
            "timed_best_us": timed_row["best_us"]}
    per = layer["compile_s_per_config"] + layer["measure_s_per_config"]
    return {"wall_s_500": round(per * min(TRIALS, len(layer["table"])), 1),
            "wall_s_500_note": ("estimated: measured compile (16 processes) + verify + time "
                                "seconds per config on the GPU x trials (capped at the space)")}


def _plot(curves: dict, best: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(best)
    cols = 3
    fig, axes = plt.subplots(-(-len(names) // cols), cols, figsize=(15, 3.2 * -(-len(names) //
                                                                                 cols)))
    for ax, name in zip(axes.flat, names, strict=False):
        for strategy in STRATEGY_NAMES:
            runs = curves[(name, strategy)]
            n = max(len(r) for r in runs)
            at = [[best[name] / r[min(i, len(r) - 1)] for r in runs if r[min(i, len(r) - 1)]]
                  for i in range(n)]
            line, = ax.plot(range(1, n + 1), [_median(q) for q in at], label=strategy)
            ax.fill_between(range(1, n + 1), [min(q, default=0) for q in at],
                            [max(q, default=0) for q in at], color=line.get_color(), alpha=0.12)
        ax.set_title(name, fontsize=9)
        ax.set_ylim(0.5, 1.01)
        ax.axhline(0.95, color="gray", lw=0.5)
        ax.set_xscale("log")
    axes.flat[0].legend(fontsize=8)
    fig.supxlabel("trials")
    fig.supylabel("exhaustive best / best so far (median of seeds; band: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--budget-s", type=float, default=480.0)
    m.add_argument("--workers", type=int, default=16)
    m.add_argument("--layers", type=lambda v: v.split(","), help="comma-separated names")
    t = sub.add_parser("timed")
    t.add_argument("--layers", type=lambda v: v.split(","), help="comma-separated names")
    t.add_argument("--trials", type=int, default=TRIALS)
    t.add_argument("--strategy", default="diversity", choices=STRATEGY_NAMES)
    t.add_argument("--budget-s", type=float, default=480.0)
    t.add_argument("--templates", type=lambda v: v.split(","),
                   help="comma-separated template names searched together")
    g = sub.add_parser("multigpu")
    g.add_argument("--layer", default="resnet50_s3_3x3_b256")
    g.add_argument("--trials", type=int, default=128)
    g.add_argument("--gpus", type=int, default=2)
    r = sub.add_parser("replay")
    r.add_argument("tables", type=Path, nargs="+")
    r.add_argument("--timed", type=Path, help="a timed-*.json of `timed` for wall_s_500")
    r.add_argument("--seeds", type=int, default=SEEDS)
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        measure(args.budget_s, args.workers, args.layers)
    elif args.cmd == "multigpu":
        multi_gpu(args.layer, args.trials, args.gpus)
    elif args.cmd == "timed":
        timed(args.layers, args.trials, args.strategy, args.budget_s, args.templates)
    else:
        replay(args.tables, args.seeds, args.timed)


if __name__ == "__main__":
    main()
