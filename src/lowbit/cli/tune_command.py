"""`lowbit tune`: a network within a time budget on its GPUs (`--model`), or every layer of a
workload file or suite (a search per layer, or the performance model's top candidates timed);
every measurement goes to the records database that `lowbit.compile` reads.

`tune` is registered on the app by `lowbit.cli` (after `bench`, so --help lists the commands
in their order); its imports beyond typer happen when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from .common import console, reports_errors, rich_table, us_or_dash


def _network_layers(model: str, batch: int, precision: str) -> Callable[[], list]:
    """The distinct layer workloads of a zoo network as the engine plans them
    (`lowbit.bench.network_workloads`), planned when called."""
    from ..models import names

    if model not in names():
        raise ValueError(f"--model must be one of {', '.join(names())}, got {model!r}")

    def plan() -> list:
        from ..bench import network_workloads

        return network_workloads(model, batch, precision)

    return plan


def _tune_layers(workloads: str, model: str, batch: int, precision: str, overrides: dict
                 ) -> Callable[[], list]:
    """The layers to tune, checked now and given when called (a network is planned then)."""
    from ..core import load_workloads
    from ..core.workloads import SUITES, workloads_from_file

    if workloads and model:
        raise ValueError("give a workload file or suite, or --model, not both")
    if model:
        return _network_layers(model, batch, precision)
    if not workloads:
        raise ValueError("give a workload file, a suite name or --model NAME")
    if workloads in SUITES:
        layers = load_workloads(workloads, **overrides)
    elif not Path(workloads).is_file():
        raise FileNotFoundError(f"{workloads!r} is neither a workload file nor a suite "
                                f"({', '.join(SUITES)})")
    else:
        layers = workloads_from_file(workloads, **overrides)
    return lambda: layers


@reports_errors
def tune(
    workloads: str = typer.Argument("", help="workload JSON file (a list of layers, as in "
                                    "src/lowbit/data/workloads) or the name of a shipped suite"),
    model: str = typer.Option("", help="tune this network (a lowbit.models name, a "
                              "torchvision model 'tv:NAME', 'file.py:fn' or 'module:fn'): its "
                              "distinct workloads within "
                              "--budget on every GPU, then time it before and after"),
    batch: int = typer.Option(8, help="--model: batch size"),
    precision: str = typer.Option("w1a2", help="--model: precision recipe, e.g. w1a2 (first "
                                  "conv and classifier at w8a8), w8a8, w4a4-all, mixed"),
    budget: str = typer.Option("", help="--model: tuning time, e.g. 10m, 300s, 1h "
                               "(default 10m)"),
    residual_bits: int = typer.Option(None, help="--model: the quantized residual stream's "
                                      "bits (lowbit.quantize(residual_bits=...))"),
    image_size: int = typer.Option(None, help="--model: input size (default the zoo's, or "
                                   "224)"),
    gpus: str = typer.Option("", help="--model: GPU indices to tune on, e.g. 0,1 (default "
                             "all)"),
    scheduler: str = typer.Option("", help="--model: a Dask scheduler address: tune on its "
                                  "workers (one GPU each) instead of the local GPUs"),
    build_workers: int = typer.Option(None, help="--model: kernel build processes (default "
                                      "one per core)"),
    out: str = typer.Option("benchmarks/results", help="--model: results folder (a "
                            "tuning_network-<stamp>.json under <out>/<gpu>/; '' for none)"),
    trials: int = typer.Option(None, help="measurements per layer (recorded ones count; "
                               "default 500); with --model: each distinct layer this many "
                               "times instead of a --budget"),
    strategy: str = typer.Option("", help="random, exhaustive, sa, diversity, tpe, pruned "
                                 "(default diversity; pruned with --model)"),
    db: str = typer.Option("", help="records database (default: the user cache file)"),
    template: str = typer.Option("", help="comma-separated template names to consider "
                                 "(default: every registered one)"),
    device: str = typer.Option("cuda", help="cuda, cuda:i, or cpu (only templates that run "
                               "on the CPU, e.g. Triton's interpreter)"),
    w: str = typer.Option("", help="weight precision for every layer, e.g. s8, u4, b1"),
    a: str = typer.Option("", help="activation precision for every layer, e.g. s8, u4"),
    round_size: int = typer.Option(32, help="candidates measured per round"),
    seed: int = typer.Option(0, help="search seed"),
    predict: bool = typer.Option(False, "--predict", help="print the performance model's "
                                 "predicted time beside each measurement"),
    top: int = typer.Option(0, help="instead of a search: time the performance model's TOP "
                            "top-ranked candidates over every template and keep the fastest "
                            "(lowbit.tune.dispatch.measure_top; 3 is within 1.25x of the "
                            "best measured on 57 of 63 H100 layers)"),
) -> None:
    """Tune a network (--model: its distinct workloads within --budget, then the network
    timed before and after), or every layer of a workload file or suite; every measurement
    goes to the records database, which lowbit.compile reads. Needs a CUDA GPU (exit 3
    without one, nothing recorded), unless --device cpu with templates that run on the
    CPU."""
    from ..core import Precision
    from ..kernels import get_template, templates
    from ..tune import STRATEGIES, LocalMeasurer
    from ..tune import tune as run_tune

    if model and trials is None and not top and not workloads:
        _check_model_spec(model)
        if template or device != "cuda" or w or a:
            raise ValueError("--template, --device, --w and --a tune lists of layers (with "
                             "--trials or --top); --model tunes the network on its "
                             "GPUs (--gpus, --scheduler)")
        _tune_network(model, batch, precision, budget or "10m", residual_bits, image_size,
                      gpus, scheduler, build_workers, strategy or "pruned", db, out)
        return
    if budget:
        raise ValueError("--budget is for --model without --trials (the network's tune)")
    strategy = strategy or "diversity"
    trials = 500 if trials is None else trials
    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if trials < 1:
        raise ValueError(f"--trials must be >= 1, got {trials}")
    if top < 0:
        raise ValueError(f"--top must be >= 0 candidates (0: search with --strategy), got {top}")
    overrides = {k: Precision.parse(v) for k, v in (("w", w), ("a", a)) if v}
    planned = _tune_layers(workloads, model, batch, precision, overrides)
    _import_backends()
    names = [n.strip() for n in template.split(",") if n.strip()]
    chosen = [get_template(n) for n in names] if names else templates()
    dev = device or "cuda"
    _check_tune_device(dev, chosen)
    layers = planned()
    if top:
        _tune_top(layers, chosen, top, db, dev)
        return
    table = rich_table(f"lowbit tune ({strategy}, {trials} trials, {dev})",
                   ("layer", "template", "best us", "default us", "speedup", "trials",
                    "failed"))
    with LocalMeasurer(device=dev) as measurer:
        for name, wl in layers:
            console.print(f"[bold]{name}[/]: {wl.key}")
            r = run_tune(wl, chosen, trials=trials, strategy=strategy, db=db or None,
                         measurer=measurer, batch=round_size, seed=seed)
            d = r.default_us.get(r.template or "")
            table.add_row(name, r.template or "-", us_or_dash(r.time_us), us_or_dash(d),
                          f"{r.speedup_over_default:.2f}x" if r.speedup_over_default else "-",
                          str(r.trials), str(r.failures))
            if predict:
                _print_predictions(name, wl, r)
    console.print(table)


def _check_tune_device(dev: str, chosen: list) -> None:
    """Exit 3 before any measurement when the device cannot measure the chosen templates: no
    CUDA device for --device cuda, or templates that run only on a GPU for --device cpu."""
    from ..tune.env import device_problem, needs_gpu
    from ..tune.measure import MeasureEnvironmentError

    try:
        problem = device_problem(dev)
    except ValueError:
        raise ValueError(f"--device must be cpu, cuda or cuda:i, got {dev!r}") from None
    if problem:
        raise MeasureEnvironmentError(f"lowbit tune needs a CUDA GPU: {problem}; nothing was "
                                      "run or recorded (--device cpu measures only templates "
                                      "that run on the CPU)")
    gpu_only = [t.name for t in chosen if needs_gpu(t)] if dev == "cpu" else []
    if gpu_only:
        raise MeasureEnvironmentError(
            f"lowbit tune measures {', '.join(gpu_only)} only on a CUDA GPU, and it runs on "
            f"{dev} here: nothing was run or recorded (tune on a GPU machine, or pass "
            "--template with templates that run on the CPU)")


def _check_model_spec(model: str) -> None:
    """A zoo name, a torchvision name ('tv:NAME') or a factory spec ('file.py:fn',
    'module:fn'), else ValueError."""
    from ..models import names

    if ":" not in model and model not in names():
        raise ValueError(f"--model must be one of {', '.join(names())}, a torchvision model "
                         f"'tv:NAME' or a float model factory 'file.py:fn' / 'module:fn', got "
                         f"{model!r}")


def parse_budget(text: str) -> float:
    """'10m' -> 600.0, '90s' / '90' -> 90.0, '1h' -> 3600.0 (seconds)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    body, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        seconds = float(body) * units[unit]
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"--budget must be a time like 10m, 300s or 1h, got {text!r}")
    return seconds


def _tune_network(model: str, batch: int, precision: str, budget: str,
                  residual_bits: int | None, image_size: int | None, gpus: str,
                  scheduler: str, build_workers: int | None, strategy: str, db: str,
                  out: str) -> None:
    """`lowbit tune --model`: `lowbit.tune_network.tune_network`, its summary, its file."""
    from ..tune import STRATEGIES
    from ..tune_network import tune_network, write_results

    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    try:
        indices = [int(g) for g in gpus.split(",") if g.strip()] if gpus else None
    except ValueError:
        raise ValueError(f"--gpus must be comma-separated GPU indices, got {gpus!r}") from None
    budget_s = parse_budget(budget)
    session = tune_network(model, batch, precision, budget_s, residual_bits=residual_bits,
                           image_size=image_size, db=db or None, gpus=indices,
                           scheduler=scheduler or None, build_workers=build_workers,
                           strategy=strategy, console=console)
    row = session["rows"][0]
    split = row["time_split"]
    busy = ", ".join(f"{g['name']} {100 * (g['busy'] or 0):.0f}%" for g in split["gpus"])
    console.print(f"tuned {row['workloads']} workloads ({row['skipped_layers']} layers not "
                  f"tunable) in {row['tune_wall_s']:.0f} s: {row['trials']} trials "
                  f"({row['failures']} failed, {row['resumed']} recorded before); GPUs busy: "
                  f"{busy}; records: {row['records']}")
    if "network_ms_before" in row:
        model_ms = row["network_ms_model"]
        console.print(f"network: default configs {row['network_ms_before']:.3f} ms, tuned "
                      f"{row['network_ms_after']:.3f} ms ({row['speedup']:.2f}x, "
                      f"{row['layers_tuned']} layers tuned), performance model's plan "
                      + (f"{model_ms:.3f} ms ({row['model_over_tuned']:.2f}x the tuned)"
                         if model_ms else row.get("model_plan_error", "-")))
    elif "timing_error" in row:
        console.print(f"[yellow]the network was not timed: {row['timing_error']}[/]")
    if out:
        from ..tune.env import device_name

        path = write_results(session, Path(out) / device_name().lower().replace(" ", "-"))
        console.print(f"wrote {path}")


def _tune_top(layers: list, chosen: list, top: int, db: str, dev: str) -> None:
    """`lowbit tune --top N`: per layer, the model's N top-ranked candidates timed, every
    measurement recorded (`lowbit.tune.dispatch.measure_top`)."""
    from ..tune import LocalMeasurer
    from ..tune.dispatch import measure_top

    table = rich_table(f"lowbit tune (the model's top {top}, {dev})",
                   ("layer", "template", "best us", "measured", "ran"))
    with LocalMeasurer(device=dev) as measurer:
        for name, wl in layers:
            console.print(f"[bold]{name}[/]: {wl.key}")
            try:
                pick = measure_top(wl, measurer, db or None, chosen, top)
            except ValueError as e:  # none of the candidates ran: the next layer goes on
                table.add_row(name, "-", "-", str(top), "0")
                console.print(f"[yellow]{name}: {e}[/]")
                continue
            table.add_row(name, pick.template, us_or_dash(pick.predicted_us), str(top),
                          str(len(pick.alternatives)))
    console.print(table)


def _print_predictions(name: str, wl: object, r: object) -> None:
    """`lowbit tune --predict`: each measurement of this run beside the model's prediction."""
    from ..perfmodel import predict_results

    preds = predict_results(wl, r.history, r.gpu)
    detail = rich_table(f"{name}: measured vs predicted ({r.gpu})",
                    ("template", "config", "measured us", "predicted us"))
    for res, p in zip(r.history, preds, strict=True):
        detail.add_row(res.template, res.config.to_json(), us_or_dash(res.time_us), f"{p:.1f}")
    console.print(detail)



def _import_backends() -> None:
    """Register the built-in templates (a backend that cannot load is skipped)."""
    from ..kernels import load_backends

    for mod, why in load_backends().items():  # e.g. no Triton here: the others still tune
        console.print(f"[yellow]skipping {mod}: {why}[/]")

