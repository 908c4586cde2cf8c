"""`lowbit tune --model`: tune a whole network on every GPU, then time it before and after.

A session (`tune_network`), on the CLI's layer of the package (it joins the planner, the
tuner and the GPU executor):

1. the quantized model: a zoo or torchvision ('tv:NAME') name as `lowbit bench` builds it
   (`lowbit.bench.build_quantized` under a precision recipe, calibrated on random images),
   or a float model factory ('file.py:fn', 'package.module:fn') quantized by the same
   recipe and calibrated on random images of `image_size`;
2. its plan without records (`lowbit.bench.compile_plan`, the options `bench_network`
   uses), whose Layer steps give the distinct final workloads and their default kernels
   (`lowbit.tune.network.network_workloads`, with the chooser's `_layout_twins`);
3. the tune: budget split by each workload's share of the network's predicted time, the
   pruned tuner, builds on CPU processes and one measuring worker per GPU (or a Dask
   cluster), every result in the records database (`lowbit.tune.network.tune_tasks`);
4. the network timed in this process, each plan's GPU executor replaying its CUDA graph in
   alternating rounds: the default configs (records off), the tuned plan (this database's
   records: `lowbit.compile`'s default path) and the performance model's zero-tuning plan
   (`chooser="model"`, records off); the tuned and default logits must be equal (every
   config computes the same integers);
5. a results document: one "tuning" row (GPUs, wall time, trials, where the time went,
   network time before and after) and the "network" rows (`"chooser"`: "default", "tuned",
   "model").
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

#: the network timings: rounds of alternating executors, each a do_bench of this many ms
TIMING_ROUNDS, TIMING_REP_MS = 3, 150


def quantized_model(model: str, precision: str, *, image_size: int | None = None,
                    residual_bits: int | None = None, seed: int = 0, device: str = "cuda"
                    ) -> tuple[torch.nn.Module, int, int]:
    """(calibrated fake-quant model, image size, channels) of a zoo name or a float model
    factory (module docstring)."""
    from .bench import IMAGE_SIZE, build_quantized, random_images, recipe_layers
    from .models import names

    if model in names() or model.startswith("tv:"):  # the zoo and torchvision, as `lowbit bench`
        size = image_size or IMAGE_SIZE.get(model, 224)
        q, _ = build_quantized(model, precision, image_size=size, seed=seed, device=device,
                               residual_bits=residual_bits)
        return q, size, 1 if model.startswith("digits") else 3
    from .quant.api import quantize_model
    from .quant.calibrate import calibrate
    from .serialize import model_from_spec

    float_model, _ = model_from_spec(model)
    first = next((m for m in float_model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if first is None:
        raise ValueError(f"--model {model!r}: no Conv2d layer to read the image channels from")
    size = image_size or 224
    w, a, layers = recipe_layers(float_model, precision)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_model(float_model.eval(), weight_bits=w, act_bits=a, layers=layers,
                           residual_bits=residual_bits).to(device).eval()
    calibrate(q, [random_images(4, size, first.in_channels, seed + 1, device)])
    return q, size, first.in_channels


def _plan(q, x, records, chooser: str = "default"):
    from .bench import compile_plan
    from .graph.launches import PlanOptions

    return compile_plan(q, x, True, 24, chooser, PlanOptions(), records)[0]


def time_plans(plans: dict, x: torch.Tensor) -> dict[str, dict]:
    """{name: {time_ms, sources, logits}} of each plan's GPU executor on x: CUDA-graph
    replays timed in `TIMING_ROUNDS` alternating rounds (drift hits every plan alike), the
    median round; sources: the plan's config sources by count."""
    from .kernels.timing import time_us
    from .runtime.gpu import GpuExecutor

    execs = {}
    out: dict[str, dict] = {}
    for name, plan in plans.items():
        ex = GpuExecutor(plan, x.device)
        out[name] = {"logits": ex(x).clone(), "sources": plan.config_sources(), "times": []}
        execs[name] = ex
    torch.cuda.synchronize()
    for _ in range(TIMING_ROUNDS):
        for name, ex in execs.items():
            out[name]["times"].append(time_us(ex.replay, warmup_ms=25,
                                              rep_ms=TIMING_REP_MS) / 1e3)
    for r in out.values():
        r["time_ms"] = statistics.median(r.pop("times"))
    return out


def tune_network(model: str, batch: int, precision: str, budget_s: float, *,
                 residual_bits: int | None = None, image_size: int | None = None,
                 db: str | Path | None = None, gpus: Sequence[int] | None = None,
                 scheduler: str | None = None, build_workers: int | None = None,
                 strategy: str = "pruned", time_network: bool = True, progress: bool = True,
                 console: object = None, slots: list | None = None, builder: object = None,
                 **measurer_kwargs: object) -> dict:
    """One session (module docstring); returns {"rows": [tuning row, network rows...],
    "tasks": per-workload summaries, "skipped": layers not tuned, "env"}.
    MeasureEnvironmentError without a CUDA GPU here (a Dask `scheduler` tunes on its workers,
    but the timing needs one here: without it the network rows are left out), before
    anything is recorded. slots / builder: stand-ins (`lowbit.tune.workers`; tests), which
    need no GPU here either. measurer_kwargs: each GPU's `LocalMeasurer` options."""
    from .bench import random_images
    from .graph.chooser import _layout_twins
    from .tune.env import collect_env
    from .tune.measure import MeasureEnvironmentError
    from .tune.network import network_tasks, network_workloads, tune_tasks
    from .tune.records import default_db_path

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if budget_s <= 0:
        raise ValueError(f"budget must be > 0 seconds, got {budget_s}")
    local_gpu = torch.cuda.is_available()
    if not local_gpu and scheduler is None and slots is None:
        raise MeasureEnvironmentError(
            "lowbit tune --model needs a CUDA GPU (or a Dask cluster: --scheduler); none is "
            "visible here: nothing was tuned or recorded")
    t0 = time.perf_counter()
    device = "cuda" if local_gpu else "cpu"
    q, size, channels = quantized_model(model, precision, image_size=image_size,
                                        residual_bits=residual_bits, device=device)
    x = random_images(batch, size, channels, 2, device)  # bench_network's input (seed + 2)
    plan = _plan(q, x, False)
    items, skipped = network_workloads(plan, _layout_twins)
    if not items:
        raise ValueError(f"--model {model}: no layer of its plan runs a tunable kernel")
    n_gpus = (len(slots) if slots is not None else len(gpus) if gpus is not None
              else _cluster_size(scheduler) if scheduler is not None
              else torch.cuda.device_count())
    tasks = network_tasks(items, budget_s, max(1, n_gpus))
    plan_s = time.perf_counter() - t0
    db_path = Path(db) if db else default_db_path()
    result = tune_tasks(tasks, budget_s, db_path, gpus=gpus, scheduler=scheduler,
                        build_workers=build_workers, strategy=strategy, progress=progress,
                        console=console, slots=slots, builder=builder, **measurer_kwargs)
    stats = result.stats
    env = collect_env("cuda") if local_gpu else {}
    base = {"model": model, "batch": batch, "precision": precision, "image_size": size,
            "residual_bits": residual_bits, "exact_bias": True, "wide_bits": 24}
    tuning = {"row": "tuning", **base, "budget_s": budget_s, "strategy": strategy,
              "gpus": len(stats["gpus"]), "gpu_names": sorted({g["gpu"] or "?" for g in
                                                               stats["gpus"]}),
              "scheduler": scheduler, "workloads": len(items), "layers": len(plan.layers),
              "skipped_layers": len(skipped), "plan_s": round(plan_s, 2),
              "tune_wall_s": stats["wall_s"], "trials": stats["trials"],
              "failures": stats["failures"], "resumed": stats["resumed"],
              "time_split": {k: stats[k] for k in ("first_measure_s", "gpus", "build",
                                                   "orders", "queue_s_mean")},
              "kernel_sum_us": _kernel_sums(result.tasks), "trajectory": stats["trajectory"],
              "records": str(db_path)}
    rows = [tuning]
    if time_network and local_gpu:
        t1 = time.perf_counter()
        try:  # the records are saved: a failing timing is noted, not the session's end
            rows += _timed_rows(q, x, plan, db_path, base, tuning, env.get("gpu"))
        except Exception as e:
            tuning["timing_error"] = f"{type(e).__name__}: {e}"[:500]
        tuning["timing_s"] = round(time.perf_counter() - t1, 1)
    tuning["wall_s"] = round(time.perf_counter() - t0, 1)
    return {"rows": rows, "tasks": result.tasks, "skipped": skipped, "env": env}


def _timed_rows(q, x, plan, db_path: Path, base: dict, tuning: dict, gpu: str | None
                ) -> list[dict]:
    """The "network" rows of the default, tuned and model plans (`time_plans`); the tuning
    row gets the times, the speedup and whether the logits match."""
    plans = {"default": plan, "tuned": _plan(q, x, str(db_path))}
    try:
        plans["model"] = _plan(q, x, False, "model")
    except Exception as e:  # the zero-tuning comparison is optional
        tuning["model_plan_error"] = f"{type(e).__name__}: {e}"[:300]
    timed = time_plans(plans, x)
    rows = [{"row": "network", **base, "chooser": name, "tuned": name == "tuned",
             "time_ms": r["time_ms"], "images_per_s": base["batch"] / r["time_ms"] * 1e3,
             "config_sources": r["sources"], "gpu": gpu} for name, r in timed.items()]
    before, after = timed["default"]["time_ms"], timed["tuned"]["time_ms"]
    model = timed.get("model", {}).get("time_ms")
    tuning.update(network_ms_before=before, network_ms_after=after, speedup=before / after,
                  network_ms_model=model, model_over_tuned=model and model / after,
                  layers_tuned=timed["tuned"]["sources"].get("tuned", 0),
                  tuned_logits_equal=bool(torch.equal(timed["default"]["logits"],
                                                      timed["tuned"]["logits"])))
    return rows


def _kernel_sums(tasks: list[dict]) -> dict[str, float | None]:
    """Sum over workloads of layers x (default, best) measured kernel time (microseconds):
    the tune's own before / after, where every workload has both."""
    if not tasks or any(t["default_us"] is None or t["best_us"] is None for t in tasks):
        return {"default": None, "best": None}
    return {"default": sum(t["count"] * t["default_us"] for t in tasks),
            "best": sum(t["count"] * t["best_us"] for t in tasks)}


def _cluster_size(scheduler: str) -> int:
    from distributed import Client

    with Client(scheduler) as client:
        return len(client.scheduler_info()["workers"])


def write_results(session: dict, folder: str | Path, extra: dict | None = None) -> Path:
    """The session's rows as `<folder>/tuning_network-<stamp>.json` ("benchmark":
    "tuning_network": the "tuning" row first, then the "network" rows), with the GPU, date,
    versions (`extra` adds to them) and the per-workload summaries."""
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    while True:  # a second run in the same second waits for a new name
        path = folder / f"tuning_network-{time.strftime('%Y%m%d-%H%M%S')}.json"
        if not path.exists():
            break
        time.sleep(1)
    env = session.get("env", {})
    doc = {"benchmark": "tuning_network", "gpu": env.get("gpu"),
           "date": time.strftime("%Y-%m-%d"), "versions": {**env, **(extra or {})},
           "rows": session["rows"], "workloads": session["tasks"],
           "skipped": [list(s) for s in session["skipped"]]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)
    return path
