"""Tuning benchmark (issue 5): search strategies against the exhaustive optimum of the space.

Two steps, because GPU time is scarce and a replay is exact:

    python benchmarks/tuning.py measure [--budget-s 480] [--layers a,b]  # on the GPU
        [--template triton.conv2d_int8_tma --suites resnet18_b8]
        [--template cuda.bitserial_wgmma --suites perfmodel_new --precision w1a2]
    python benchmarks/tuning.py timed [--layers a,b] [--trials 500]     # on the GPU
    python benchmarks/tuning.py multigpu [--gpus 2]                     # 1 vs n GPUs (Dask)
    python benchmarks/tuning.py replay TABLES.json [MORE.json ...]      # anywhere (CPU)

`measure` builds, verifies bit for bit against `lowbit.reference.run` and times *every* config
of one template's space (default `triton.conv2d_int8`) on each layer (default: each ResNet-50
3x3 layer at batch 16 and 256 and the TVM tutorial layer, epilogue bias + ReLU -> s8; any
shared suite, perfmodel.py's new shapes, or their bit-serial variants), and writes the tables
(config -> time or error) plus the measured seconds per config (compile + verify + time) to
`tables-<stamp>.json`. Builds run in a process pool and each config is verified and timed in a
crash-isolated worker as soon as its build is done (`measure`'s docstring).
`replay` runs `lowbit.tune.tune` with each strategy (random, sa, diversity, tpe; 5 seeds) on a
`TableMeasurer` over those tables, so every strategy sees the same measured times; it writes
`"benchmark": "tuning"` JSON and a PNG of best-so-far vs trials. `wall_s_500` is estimated
from the measured seconds per config (parallel compile included), and labelled so.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from lowbit.core import Config, Epilogue, Workload, load_workloads, workload_from_dict
from lowbit.tune.buildpool import BuildPool

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


# ----------------------------------------------------------------------------- measure

#: pseudo-suite of `measure`: the new layer shapes of benchmarks/perfmodel.py (NEW_LAYERS)
NEW_SHAPES = "perfmodel_new"


def space_layers(suites: Sequence[str] = SUITES, only: Sequence[str] | None = None,
                 precision: str = "w8a8") -> list[tuple[str, Workload]]:
    """(name, workload) of the layers `measure` times: each shared suite's layers
    (`load_workloads`, epilogue bias + ReLU -> s8) or, for the suite "perfmodel_new", the new
    layer shapes of benchmarks/perfmodel.py (`int8_layer`: conv bias + ReLU -> s8, GEMM
    int32). precision "w8a8": as loaded; any other (w1a2, w2a2, ...): the bit-serial variant
    (`bitserial.bitserial_workload`: bit-plane operands, epilogue bias + ReLU -> u<a bits>
    bit planes), named <layer>_<precision>. `only`: the names to keep (either form);
    SystemExit naming the known ones for an unknown name."""
    base: list[tuple[str, Workload]] = []
    for suite in suites:
        if suite == NEW_SHAPES:
            from perfmodel import NEW_LAYERS, int8_layer

            base += [(n, int8_layer(d)) for n, d in NEW_LAYERS]
        else:
            base += load_workloads(suite, epilogue=EPILOGUE)
    if precision == "w8a8":
        layers = [(n, wl, n) for n, wl in base]
    else:
        from bitserial import bitserial_workload

        layers = [(f"{n}_{precision}", bitserial_workload(wl, precision), n) for n, wl in base]
    if only:
        known = {n for n, _, _ in layers} | {b for _, _, b in layers}
        unknown = set(only) - known
        if unknown:
            raise SystemExit(f"unknown layers {sorted(unknown)}; known: "
                             f"{[n for n, _, _ in layers]}")
        layers = [(n, wl, b) for n, wl, b in layers if n in only or b in only]
    return [(n, wl) for n, wl, _ in layers]


def _timed_compile(compile_one: Callable[[str, str, str], str | None], template: str,
                   wl_json: str, cfg_json: str) -> tuple[str | None, float, float]:
    """`compile_one` (None or the error) of one job, its seconds and its end (epoch seconds):
    what a compile pool process returns."""
    t0 = time.perf_counter()
    try:
        err = compile_one(template, wl_json, cfg_json)
    except Exception as e:  # a compile_one that raises is the config's failure too
        err = f"{type(e).__name__}: {e}"[:300]
    return err, time.perf_counter() - t0, time.time()


def _future_result(fut: Future) -> tuple[str | None, float | None, float | None]:
    """(error, seconds, end) of a compile future (an exception the pool raised for it: that
    config's compile error; a `BuildPool` crash or timeout as its message says)."""
    try:
        return fut.result()
    except (ChildProcessError, TimeoutError, RuntimeError) as e:
        return str(e)[:300], None, None
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}", None, None


class _SpaceRun:
    """State of one `measure` run: the tables document, the compile jobs and the clock."""

    def __init__(self, template, plan: list[tuple[str, Workload, list[Config]]], doc: dict,
                 path: Path, measurer, pool: Executor, compile_one, deadline: float,
                 batch: int, stall_s: float, save_every_s: float) -> None:
        self.template, self.plan, self.doc, self.path = template, plan, doc, path
        self.measurer, self.pool, self.compile_one = measurer, pool, compile_one
        self.deadline, self.batch, self.stall_s = deadline, batch, stall_s
        self.save_every_s = save_every_s
        self.last_save = time.perf_counter()
        self.started = time.time()
        #: compile future -> the (layer index, config) pairs its binary serves
        self.members: dict[Future, list[tuple[int, Config]]] = {}
        self.by_layer: list[list[Future]] = [[] for _ in plan]
        self.compile_done: dict[Future, tuple[str | None, float | None, float | None]] = {}

    # -- compile
    def submit(self) -> None:
        """One compile job per distinct binary (`conv._compile_key` for Triton: configs of
        several layers may share one; CUDA: one per (workload, config)), all layers at once,
        in layer order, so later layers compile while earlier ones are measured."""
        import conv

        futs: dict[tuple, Future] = {}
        t = self.template
        for li, (_, wl, configs) in enumerate(self.plan):
            wl_json = wl.to_json()
            for cfg in configs:
                try:
                    key = (conv._compile_key(t.build(wl, cfg)) if t.backend == "triton"
                           else (t.name, wl.key, cfg))
                except Exception:  # build refuses it: its own job reports why
                    key = (t.name, wl.key, cfg)
                fut = futs.get(key)
                if fut is None:
                    fut = futs[key] = self.pool.submit(_timed_compile, self.compile_one, t.name,
                                                       wl_json, cfg.to_json())
                    self.members[fut] = []
                if fut not in self.by_layer[li]:
                    self.by_layer[li].append(fut)
                self.members[fut].append((li, cfg))

    def compile_stats(self) -> dict:
        """Compile pool seconds per distinct binary (first submit to the last build's end,
        over the builds done: the parallel throughput) and one build's mean seconds."""
        done = [v for v in self.compile_done.values() if v[1] is not None]
        if not done:
            return {"compile_s_per_config": None, "compile_job_s": None, "compiled": 0}
        wall = max(end for _, _, end in done) - self.started
        return {"compile_s_per_config": round(wall / len(done), 5),
                "compile_job_s": round(sum(s for _, s, _ in done) / len(done), 4),
                "compiled": len(done)}

    # -- saving
    def save(self, force: bool = False) -> None:
        if not force and time.perf_counter() - self.last_save < self.save_every_s:
            return
        self.doc.update(self.compile_stats())
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc))
        tmp.replace(self.path)  # a reader never sees half a file
        self.last_save = time.perf_counter()

    # -- one layer
    def measure_layer(self, li: int) -> dict:
        """Measure every config of layer `li` as its build finishes (`batch` at a time through
        the measurer); failures are rows; stops at the deadline (the layer then is not
        exhaustive). When no build finishes within `stall_s`, the unfinished ones (a build
        that hangs, or whose process died) go to the measurer unbuilt ("unbuilt": their
        count): its worker builds them, crash-isolated, under its per-config timeout."""
        from lowbit.tune.measure import MeasureEnvironmentError, MeasureInput

        name, wl, configs = self.plan[li]
        t0 = time.perf_counter()
        entry = {"workload": name, "key": wl.key, "wl": wl.to_dict(),
                 "template": self.template.name, "epilogue": wl.epilogue.key,
                 "space_size": len(configs), "exhaustive": False, "complete": False,
                 "table": []}
        self.doc["layers"].append(entry)
        table = entry["table"]
        measure_s = [0.0, 0]  # seconds inside the measurer, configs it measured
        last_print = [time.perf_counter()]

        def progress() -> None:
            if time.perf_counter() - last_print[0] < 10:
                return
            last_print[0] = time.perf_counter()
            el = time.perf_counter() - t0
            rate = len(table) / el if el else 0.0
            left = (len(configs) - len(table)) / rate if rate else float("nan")
            print(f"  {name}: {len(table)}/{len(configs)} in {el:.0f} s "
                  f"({sum(e is not None for _, _, e in table)} failed), "
                  f"{1e3 / rate if rate else float('nan'):.0f} ms/config, ~{left:.0f} s to go",
                  flush=True)

        def on_result(res) -> None:
            table.append([dict(res.config), res.time_us, res.error])
            self.save()
            progress()

        waiting, ready = set(self.by_layer[li]), []
        while waiting or ready:
            now = time.perf_counter()
            if now >= self.deadline:
                entry["cut"] = "budget spent"
                break
            if waiting:
                timeout = 0 if ready else min(self.stall_s, self.deadline - now)
                done, waiting = wait(waiting, timeout=timeout, return_when=FIRST_COMPLETED)
                if not done and not ready and time.perf_counter() < self.deadline:
                    # nothing finished for stall_s: builds that hang or whose process died;
                    # the measuring worker builds them (a crash or hang there is their row)
                    lost = [cfg for fut in waiting for lj, cfg in self.members[fut] if lj == li]
                    print(f"  {name}: {len(lost)} builds lost or hung (none finished in "
                          f"{self.stall_s:g} s): built by the measuring worker", flush=True)
                    entry["unbuilt"] = entry.get("unbuilt", 0) + len(lost)
                    ready += lost
                    waiting = set()
                for fut in done:
                    res = self.compile_done.setdefault(fut, _future_result(fut))
                    for lj, cfg in self.members[fut]:
                        if lj != li:
                            continue
                        if res[0] is None:
                            ready.append(cfg)
                        else:
                            table.append([dict(cfg), None, f"compile: {res[0]}"])
            if not ready:
                continue
            todo, ready = ready[: self.batch], ready[self.batch:]
            t1 = time.perf_counter()
            try:
                self.measurer.measure([MeasureInput(self.template, wl, c) for c in todo],
                                      on_result=on_result)
            except MeasureEnvironmentError as e:  # the device, not a config: stop the layer
                entry["error"] = f"measure environment: {e}"[:500]
                print(f"  {name}: {entry['error']}", flush=True)
                break
            finally:
                measure_s[0] += time.perf_counter() - t1
                measure_s[1] += len(todo)
        ok = [t for _, t, e in table if e is None]
        wall = time.perf_counter() - t0
        entry.update(
            measured=len(table), ok=len(ok), failed=len(table) - len(ok),
            complete=len(table) == len(configs), best_us=min(ok) if ok else None,
            exhaustive=len(table) == len(configs) and "error" not in entry,
            wall_s=round(wall, 1),
            measure_s_per_config=measure_s[0] / measure_s[1] if measure_s[1] else None,
            s_per_config=wall / len(table) if table else None)
        self.save(force=True)
        return entry


def measure(budget_s: float, workers: int, only: list[str] | None = None, *,
            template: str = "triton.conv2d_int8", suites: Sequence[str] = SUITES,
            precision: str = "w8a8", warmup_ms: float = 3.0, rep_ms: float = 15.0,
            timeout_s: float = 30.0, build_timeout_s: float = 60.0, stall_s: float = 90.0,
            save_every_s: float = 10.0, batch: int = 8, measurer=None, pool: Executor | None = None,
            compile_one: Callable[[str, str, str], str | None] | None = None) -> Path:
    """Exhaustive verified timing of `template`'s whole space on each layer (`space_layers`
    of `suites`, `only`, `precision`); returns the tables file (`tables-<stamp>.json` in the
    results folder).

    Every config is built in a `BuildPool` (`lowbit.tune.buildpool`, the tuner's one compile
    pool: `workers` processes, one job each at a time; Triton compiles ahead, NVRTC
    fills its disk cache; `conv._compile_one`), then, as its build finishes, checked bit for
    bit against `lowbit.reference.run` on fresh random inputs and timed (median of
    `lowbit.kernels.timing.time_us`, `warmup_ms` / `rep_ms`, L2 flushed) in the crash-isolated
    worker of a `LocalMeasurer` (`timeout_s` per config): a build error, launch error, wrong
    result, crash or hang is that config's row [config, None, reason], never the end of the
    run (a build that kills its process or runs past `build_timeout_s`: its row; no build
    finishing for `stall_s`: `_SpaceRun.measure_layer`). A
    config without a row is one the budget left out (`budget_s`: seconds from the start; the
    layer's "exhaustive" then is false). The file is rewritten every
    `save_every_s` seconds and after every layer, so a run cut short keeps its rows.

    Per layer: workload (name), key, wl, template, space_size, measured, ok, failed,
    exhaustive (every config of the space has a row), best_us, wall_s, measure_s_per_config
    (seconds in the measurer per config), s_per_config (layer wall / rows) and the table.
    measurer / pool / compile_one: stand-ins for tests (default: `LocalMeasurer` on "cuda",
    a `BuildPool`, `conv._compile_one`)."""
    import conv
    from lowbit.kernels import get_template, load_backends
    from lowbit.tune import LocalMeasurer

    t0 = time.perf_counter()
    load_backends()
    tmpl = get_template(template)
    plan = []
    for name, wl in space_layers(suites, only, precision):
        reason = tmpl.unsupported_reason(wl)
        if reason:
            print(f"{name}: {template} does not support it ({reason}); skipped", flush=True)
            continue
        plan.append((name, wl, list(tmpl.space(wl))))
    n_all = sum(len(cs) for *_, cs in plan)
    print(f"{template}: {len(plan)} layers, {n_all} configs "
          f"({', '.join(f'{n} {len(cs)}' for n, _, cs in plan)}); {workers} compile processes",
          flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = common.results_dir() / f"tables-{stamp}.json"
    while path.exists():  # two runs in one second
        time.sleep(1)
        path = common.results_dir() / f"tables-{time.strftime('%Y%m%d-%H%M%S')}.json"
    epilogues = sorted({wl.epilogue.key for _, wl, _ in plan})
    doc = {"benchmark": "tuning_tables", "gpu": common.gpu_name(), "versions": common.versions(),
           "template": tmpl.name, "epilogue": epilogues[0] if len(epilogues) == 1 else "mixed",
           "precision": precision, "workers": workers, "budget_s": budget_s,
           "timing": {"function": "lowbit.kernels.timing.time_us (do_bench: median, L2 flushed "
                                  "before every run, CUDA events)",
                      "warmup_ms": warmup_ms, "rep_ms": rep_ms},
           "compile_s_per_config": None, "layers": []}
    own_measurer = measurer is None
    if own_measurer:
        measurer = LocalMeasurer(device="cuda", compile_workers=0, timeout_s=timeout_s,
                                 warmup_ms=warmup_ms, rep_ms=rep_ms)
        doc["seed"] = measurer.seed
    own_pool = pool is None
    if own_pool:
        pool = BuildPool(workers, build_timeout_s)
    run = _SpaceRun(tmpl, plan, doc, path, measurer, pool, compile_one or conv._compile_one,
                    t0 + budget_s, batch, stall_s, save_every_s)
    try:
        run.submit()
        run.save(force=True)
        for li, (name, *_) in enumerate(plan):
            if time.perf_counter() >= run.deadline:
                print(f"{name}: skipped, budget spent", flush=True)
                continue
            e = run.measure_layer(li)
            best = "-" if e["best_us"] is None else f"{e['best_us']:.2f} us"
            print(f"{name:32s} {e['measured']}/{e['space_size']} configs "
                  f"({e['failed']} failed{', CUT: ' + e['cut'] if 'cut' in e else ''}), best "
                  f"{best}, {e['wall_s']:.0f} s: "
                  f"{(e['s_per_config'] or float('nan')) * 1e3:.0f} ms/config overall, "
                  f"measure {(e['measure_s_per_config'] or float('nan')) * 1e3:.0f} ms/config",
                  flush=True)
    finally:
        run.save(force=True)
        if own_measurer:
            measurer.close()
        if own_pool:
            pool.shutdown()
    stats = run.compile_stats()
    per = stats["compile_s_per_config"]
    print(f"compile: {stats['compiled']} builds, "
          f"{'-' if per is None else f'{per * 1e3:.0f}'} ms/config with {workers} processes "
          f"(one build {stats['compile_job_s']} s); wrote {path} in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
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
                layer, compile_s_per_config=doc["compile_s_per_config"],
                template=layer.get("template", doc["template"]))
    return merged


QUALITY_AT = (50, 100, 200, TRIALS)


def replay(tables: list[Path], seeds: int, timed_path: Path | None = None) -> Path:
    from lowbit.kernels import get_template, load_backends

    load_backends()
    doc = _load_tables(tables)
    timed_rows = ({r["workload"]: r for r in json.loads(timed_path.read_text())["rows"]}
                  if timed_path else {})
    rows, curves = [], {}
    for layer in doc["layers"].values():
        ok = [t for _, t, e in layer["table"] if e is None]
        best = min(ok)
        template = get_template(layer["template"])
        wl = workload_from_dict(layer["wl"])
        row = {"workload": layer["workload"], "precision": f"w{wl.w.bits}a{wl.a.bits}",
               "impl": template.name,
               "space_size": len(layer["table"]), "space_ok": len(ok), "exhaustive_best_us": best,
               "trials_to_095": {}, "trials_to_095_by_seed": {}, "quality_at_500_by_strategy": {},
               "quality_at_trials": {}, "replay_s": {}}
        for strategy in STRATEGY_NAMES:
            t0 = time.perf_counter()
            runs = [_replay_one(layer, strategy, s, template) for s in range(seeds)]
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
    per = (layer["compile_s_per_config"] or 0.0) + (layer["measure_s_per_config"] or 0.0)
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
    m.add_argument("--budget-s", type=float, default=480.0,
                   help="seconds from the start; configs left then get no row")
    m.add_argument("--workers", type=int, default=16, help="compile processes")
    m.add_argument("--layers", type=lambda v: v.split(","), help="comma-separated names")
    m.add_argument("--template", default="triton.conv2d_int8",
                   help="the template whose whole space is measured")
    m.add_argument("--suites", type=lambda v: v.split(","), default=list(SUITES),
                   help=f"comma-separated shared suites, or {NEW_SHAPES} (perfmodel.py's "
                        "new layer shapes)")
    m.add_argument("--precision", default="w8a8",
                   help="w8a8, or a bit-serial variant (w1a2, w2a2, ...: bit-plane layouts)")
    m.add_argument("--warmup-ms", type=float, default=3.0)
    m.add_argument("--rep-ms", type=float, default=15.0)
    m.add_argument("--timeout-s", type=float, default=30.0,
                   help="per config: verify + time in the measuring worker")
    m.add_argument("--build-timeout-s", type=float, default=60.0,
                   help="per build in the pool: past it the build process is killed")
    m.add_argument("--stall-s", type=float, default=90.0,
                   help="no build finishing for this long: the measuring worker builds the "
                        "unfinished ones (hung, or their process died)")
    m.add_argument("--save-every-s", type=float, default=10.0)
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
        # `timeout` sends SIGTERM: leave through the finally clauses (file written, pool and
        # measuring worker ended)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        measure(args.budget_s, args.workers, args.layers, template=args.template,
                suites=args.suites, precision=args.precision, warmup_ms=args.warmup_ms,
                rep_ms=args.rep_ms, timeout_s=args.timeout_s,
                build_timeout_s=args.build_timeout_s, stall_s=args.stall_s,
                save_every_s=args.save_every_s)
    elif args.cmd == "multigpu":
        multi_gpu(args.layer, args.trials, args.gpus)
    elif args.cmd == "timed":
        timed(args.layers, args.trials, args.strategy, args.budget_s, args.templates)
    else:
        replay(args.tables, args.seeds, args.timed)


if __name__ == "__main__":
    main()
