"""The `lowbit` command: demo, quantize, summary, bench, tune, report.

A user mistake (a bad argument, a missing file, a model that does not fit) ends in one line
`error: ...` on stderr and exit code 2; a machine that cannot do the job (no CUDA GPU for a GPU
command, a measuring worker that cannot start) in one line and exit code 3. Neither prints a
traceback, and neither records anything. A GPU command calls `require_gpu` after checking its
arguments and before any work.

Only typer loads at start (torch, rich tables and lowbit's packages load inside the commands),
so that `lowbit --help` answers at once.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="lowbit: quantize PyTorch models to 1-8 bits and run them on auto-tuned "
                       "Tensor Core kernels.")
USER_ERROR, ENVIRONMENT_ERROR = 2, 3


class _LazyConsole:
    """rich's Console, made on first use (a pipe or a file gets wide tables, not wrapped)."""

    _console: Any = None

    def __getattr__(self, name: str) -> Any:
        if _LazyConsole._console is None:
            from rich.console import Console

            _LazyConsole._console = Console(width=None if sys.stdout.isatty() else 160,
                                            soft_wrap=True)
        return getattr(_LazyConsole._console, name)


console = _LazyConsole()


def _table(title: str, columns: Sequence[str]) -> Any:
    """A rich Table with right-justified `columns`."""
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    return table


def require_gpu(command: str, detail: str = "") -> None:
    """Exit 3 (before any work, nothing recorded) when no CUDA GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        from .tune.measure import MeasureEnvironmentError

        raise MeasureEnvironmentError(f"lowbit {command} needs a CUDA GPU; none is visible "
                                      f"here: nothing was run or recorded{detail}")


@app.callback()
def _root() -> None:
    """lowbit: quantize PyTorch models to 1-8 bits and run them on auto-tuned Tensor Core
    kernels."""


def _fail(message: str, code: int) -> None:
    typer.echo("error: " + " ".join(str(message).split()), err=True)
    raise typer.Exit(code)


def reports_errors(fn: Callable) -> Callable:
    """Turn user and environment errors raised by a command into one line and an exit code."""

    @functools.wraps(fn)
    def run(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as e:
            from .tune.measure import MeasureEnvironmentError

            if isinstance(e, MeasureEnvironmentError):
                _fail(str(e), ENVIRONMENT_ERROR)
            if isinstance(e, (ValueError, TypeError, OSError)):
                _fail(str(e), USER_ERROR)
            raise

    return run


# ----------------------------------------------------------------------------------- demo

@app.command()
@reports_errors
def demo(float_steps: int = typer.Option(200, help="float32 training steps"),
         qat_steps: int = typer.Option(100, help="QAT steps per precision"),
         precisions: str = typer.Option("w8a8,w4a4,w2a2,w1a2", help="comma-separated"),
         seed: int = typer.Option(0, help="data split and initialization seed")) -> None:
    """Train a small CNN on handwritten digits, quantize it to several precisions with QAT,
    convert it to integer layers and report accuracy and size (about a minute on a CPU)."""
    from .demo import MODEL, _check_precisions, run_demo

    chosen = tuple(p.strip() for p in precisions.split(",") if p.strip())
    _check_precisions(chosen)
    console.print(
        "[bold]lowbit demo[/]: lowbit quantizes PyTorch models to 1-8 bit weights and "
        "activations and runs their convolutions on auto-tuned NVIDIA Tensor Core kernels.\n"
        f"Here: a small CNN ({MODEL}) learns scikit-learn's 8x8 handwritten digits in float32, "
        "then each precision gets quantization-aware training (lowbit.quantize, first and last "
        "layer at 8 bits) and is converted to integer layers (lowbit.convert).")
    report = run_demo(float_steps, qat_steps, chosen, seed,
                      progress=lambda text: console.print(f"  {text}"))
    table = _table(f"digits test accuracy (float32 {report.float_accuracy:.1%})",
                   ("precision", "accuracy", "integer accuracy", "vs float32", "packed size",
                    "smaller", "QAT s"))
    table.add_row("float32", f"{report.float_accuracy:.1%}", "-", "-",
                  f"{report.float_bytes:,} B", "1.0x", "-")
    for r in report.rows:
        table.add_row(r.precision, f"{r.accuracy:.1%}", f"{r.integer_accuracy:.1%}",
                      f"{100 * (r.accuracy - report.float_accuracy):+.1f} pts",
                      f"{r.packed_bytes:,} B", f"{report.float_bytes / r.packed_bytes:.1f}x",
                      f"{r.seconds:.1f}")
    table.caption = ("wXaY = X-bit weights, Y-bit activations; packed size: integer weights "
                     "at their bit width plus per-channel scales (float32 kept where float)")
    console.print(table)
    ran = ("Integer accuracy is the converted model run through lowbit.reference, the exact "
           "CPU oracle every GPU kernel is checked against bit for bit.")
    kernels = (f"On {report.gpu}: {report.gpu_note}." if report.gpu else
               f"Kernels: {report.gpu_note}.")
    console.print(f"{ran}\n{kernels}\nDone in {report.seconds:.0f} s. Next: "
                  "`lowbit quantize MODEL --precision w4a4` for your own model.")


# ----------------------------------------------------------------------------------- quantize

def _layer_overrides(text: str) -> dict[str, dict]:
    """'conv1=w8a8,fc=float' -> {"conv1": {weight_bits: 8, act_bits: 8}, "fc": {float: True}}."""
    from .core import parse_wa

    out: dict[str, dict] = {}
    for item in filter(None, (t.strip() for t in text.replace(";", ",").split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--layers entry {item!r} must be NAME=wXaY or NAME=float")
        if value == "float":
            out[name] = {"float": True}
            continue
        try:
            wb, ab = parse_wa(value)
        except ValueError:
            raise ValueError(f"--layers entry {item!r} must be NAME=wXaY (bits 1..8) or "
                             "NAME=float") from None
        out[name] = {"weight_bits": wb, "act_bits": ab}
    return out


def _calibration_batches(data: str, batch_size: int, image_size: int):
    from .quant.data import digits_loaders, image_folder_loader

    if data == "digits":
        return digits_loaders(batch_size=batch_size)[0]
    if not Path(data).is_dir():
        raise FileNotFoundError(f"--data {data!r} is neither 'digits' nor an image folder "
                                "(root/<class>/<image>)")
    return image_folder_loader(data, batch_size=batch_size, size=image_size, shuffle=True)


def _float_model(spec: str, weights: str, random_weights: bool = True):
    """The float model MODEL names, with --weights loaded. A built-in model has random
    weights: without --weights it needs --random-weights (a factory's weights are its own)."""
    import torch

    from .serialize import arch_entry, build_model

    if weights and random_weights:
        raise ValueError("give --weights FILE or --random-weights, not both")
    entry = arch_entry(spec)
    if "zoo" in entry and not weights and not random_weights:
        raise ValueError(f"MODEL {spec!r} is a built-in architecture, randomly initialised: "
                         "pass --weights FILE (its trained float32 state dict), or "
                         "--random-weights to quantize the random weights (a trial run: the "
                         "result predicts nothing)")
    model = build_model(entry)
    if weights:
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"--weights {weights!r}: no such file")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"--weights {weights!r} does not fit {spec}: missing "
                             f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return model.eval()


@app.command()
@reports_errors
def quantize(
    model: str = typer.Argument(..., help="a built-in model name (see lowbit.models), "
                                "'file.py:function' or 'package.module:function'"),
    precision: str = typer.Option("w8a8", help="weights and activations, e.g. w4a4, w1a2"),
    method: str = typer.Option("max", help="clip method: max, percentile, mse, rand"),
    layers: str = typer.Option("", help="per-layer settings: 'NAME=wXaY,GLOB=float'"),
    skip_first: bool = typer.Option(False, help="keep the first layer float"),
    skip_last: bool = typer.Option(False, help="keep the last layer float"),
    data: str = typer.Option("digits", help="calibration data: 'digits' or an image folder"),
    image_size: int = typer.Option(224, help="image folder: resize and crop to this size"),
    batches: int = typer.Option(8, help="calibration batches"),
    batch_size: int = typer.Option(32, help="calibration batch size"),
    convert: bool = typer.Option(True, "--convert/--fake-quant",
                                 help="save integer layers, or the calibrated fake-quant model"),
    weights: str = typer.Option("", help="float weights to start from (a state dict file)"),
    random_weights: bool = typer.Option(False, "--random-weights",
                                        help="without --weights: quantize a built-in model's "
                                        "random initial weights (a trial run)"),
    out: str = typer.Option("", help="output file (default MODEL-PRECISION.safetensors)"),
) -> None:
    """Quantize a float model: calibrate its activation ranges on data (post-training),
    convert it to integer layers, save it (lowbit.load reads it) and print its summary.
    A built-in MODEL needs --weights (or --random-weights); a factory ('file.py:function')
    returns its model with whatever weights it sets."""
    import lowbit

    from .core import parse_wa
    from .quant import summary as layer_summary
    from .quant.inputs import InputShapeError
    from .serialize import save

    wb, ab = parse_wa(precision)
    overrides = _layer_overrides(layers)
    float_model = _float_model(model, weights, random_weights)
    q = lowbit.quantize(float_model, weight_bits=wb, act_bits=ab, method=method,
                        skip_first=skip_first, skip_last=skip_last, layers=overrides or None)
    loader = _calibration_batches(data, batch_size, image_size)
    try:
        lowbit.calibrate(q, loader, num_batches=batches)
    except InputShapeError as e:
        raise ValueError(f"--data {data} does not fit {model}: layer {e.layer} "
                         f"{e.problem}") from None
    except RuntimeError as e:  # torch's errors elsewhere: the data does not fit the model
        raise ValueError(f"--data {data} does not fit {model}: {e}") from None
    result = lowbit.convert(q) if convert else q
    stem = Path(model.rpartition(":")[2] or model).stem
    path = Path(out or f"{stem}-{precision}.safetensors")
    save(result, path, arch=model)
    layer_summary(result, console=console)
    kind = "integer" if convert else "fake-quant"
    console.print(f"saved the {kind} model to {path} (lowbit.load({str(path)!r}) reads it back)")


# ----------------------------------------------------------------------------------- summary

@app.command()
@reports_errors
def summary(target: str = typer.Argument(..., help="a saved lowbit model (.safetensors), or a "
                                         "model name / factory to preview quantize"),
            precision: str = typer.Option("w8a8", help="preview: precision to plan")) -> None:
    """Every conv / linear layer of a saved model (precision, method, scales, or kept float
    and why), or what `lowbit quantize` would do to a float model."""
    from .quant import LayerRow
    from .quant import summary as layer_summary
    from .quant.overview import render
    from .serialize import verify

    if target.endswith(".safetensors") or Path(target).is_file():
        manifest, _ = verify(target)  # every digest and integer range checked
        rows = [LayerRow(**r) for r in manifest.get("summary", [])]
        console.print(render(rows, f"{target} ({manifest['kind']})"))
        return
    import lowbit

    from .core import parse_wa

    wb, ab = parse_wa(precision)
    q = lowbit.quantize(_float_model(target, ""), weight_bits=wb, act_bits=ab)
    layer_summary(q, console=console)


# ---------------------------------------------------------------------------------- bench

@app.command()
@reports_errors
def bench(
    model: str = typer.Argument(..., help="zoo network (resnet18, resnet34, resnet50, vgg16, "
                                "alexnet, apnn_vgg_variant), a torchvision model "
                                "(tv:mobilenet_v2) or a function of a file (path.py:build)"),
    batch: int = typer.Option(8, help="images per forward"),
    precision: str = typer.Option("w1a2", help="recipe: wXaY (first conv and classifier at "
                                  "w8a8), wXaY-all, or mixed"),
    compile_mode: str = typer.Option("default", help="torch.compile mode of the fp16 baseline "
                                     "(default, max-autotune, ...; 'none' skips it)"),
    kernel_bias: bool = typer.Option(False, "--kernel-bias", help="biases in accumulator "
                                     "units, so single-output layers use their kernel's own "
                                     "epilogue"),
    policy: str = typer.Option("default", help="how each layer's kernel is chosen: default, "
                               "model (the performance model), or an int8 template's name "
                               "tried first (e.g. triton.conv2d_int8)"),
    fuse_outputs: bool = typer.Option(True, "--fuse-outputs/--no-fuse-outputs",
                                      help="int8 layers write their layer epilogue's outputs "
                                      "from the kernel (else a separate pass)"),
    residual_bits: int = typer.Option(0, help="quantize the residual stream in the model at "
                                      "4, 8 or 16 bits (lowbit.quantize residual_bits; 0: the "
                                      "engine's wide realization)"),
    tuned: bool = typer.Option(False, "--tuned", help="also time the plan with the configs "
                               "of your tuning records (lowbit tune) in the same run"),
    out: str = typer.Option("", help="write the results JSON (and the per-layer PNG) here"),
    image_size: int = typer.Option(0, help="input height and width (0: the model's default, "
                                   "224 outside the zoo)"),
) -> None:
    """Time a whole quantized network on this GPU against PyTorch fp16 (eager, CUDA graph,
    torch.compile) in the same run: per-layer table and whole-network latency; with --tuned
    the default-config network and the tuned one, one after the other."""
    import json

    import torch

    from .models import names
    from .bench import (
        BenchCase,
        bench_network,
        impl_chooser,
        per_layer_figure,
        summary_table,
    )
    from .runtime.model_source import is_external

    if model not in names() and not is_external(model):
        raise ValueError(f"model must be one of {', '.join(names())}, 'tv:NAME' (torchvision) "
                         f"or 'path.py:function', got {model!r}")
    if batch < 1 or image_size < 0:
        raise ValueError(f"--batch must be >= 1 and --image-size >= 0, got {batch}, "
                         f"{image_size}")
    try:
        impl_chooser(policy)
    except ValueError as e:
        raise ValueError(f"--policy must be 'default', 'model' or an int8 template's name "
                         f"({e})") from None
    if residual_bits not in (0, 4, 8, 16):
        raise ValueError(f"--residual-bits must be 0, 4, 8 or 16, got {residual_bits}")
    require_gpu("bench", " (lowbit.compile still runs the plan through the exact reference "
                "on a CPU)")
    case = BenchCase(model, batch, precision, image_size=image_size or None,
                     exact_bias=not kernel_bias, chooser=policy, fuse_outputs=fuse_outputs,
                     residual_bits=residual_bits or None)
    row = bench_network(case, compile_mode=None if compile_mode == "none" else compile_mode)
    rows = [row]
    if tuned:
        from dataclasses import replace

        rows.append(bench_network(replace(case, records=True), compile_mode=None))
        rows[-1]["baselines_ms"] = row["baselines_ms"]  # the same run's baselines
    table = _table(f"{model} batch {batch} {precision} on {torch.cuda.get_device_name()}",
                   ("step", "impl", "us", "floor us", "share", "fp16 us"))
    for r in row["layers"]:
        table.add_row(r["name"], r["impl"], f"{r['time_us']:.1f}", f"{r['floor_us']:.1f}",
                      f"{100 * r['share']:.1f}%", _us(r.get("fp16_us")))
    console.print(table)
    console.print(summary_table(rows))
    if tuned:
        console.print(f"tuned / default: {rows[0]['time_ms'] / rows[1]['time_ms']:.3f}x "
                      f"({rows[1]['time_ms']:.3f} ms against {rows[0]['time_ms']:.3f} ms)")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        stem = Path(out) / f"network-{Path(model).name.replace(':', '-')}-b{batch}-{precision}"
        stem.with_suffix(".json").write_text(json.dumps({"benchmark": "network",
                                                         "rows": rows}, indent=1))
        per_layer_figure(row, str(stem.with_suffix(".png")))
        console.print(f"wrote {stem}.json")


# ----------------------------------------------------------------------------------- tune

def _network_layers(model: str, batch: int, precision: str) -> Callable[[], list]:
    """The distinct layer workloads of a zoo network as the engine plans them
    (`lowbit.bench.network_workloads`), planned when called."""
    from .models import names

    if model not in names():
        raise ValueError(f"--model must be one of {', '.join(names())}, got {model!r}")

    def plan() -> list:
        from .bench import network_workloads

        return network_workloads(model, batch, precision)

    return plan


def _tune_layers(workloads: str, model: str, batch: int, precision: str, overrides: dict
                 ) -> Callable[[], list]:
    """The layers to tune, checked now and given when called (a network is planned then)."""
    from .core import load_workloads
    from .core.workloads import SUITES, workloads_from_file

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


@app.command()
@reports_errors
def tune(
    workloads: str = typer.Argument("", help="workload JSON file (a list of layers, as in "
                                    "src/lowbit/data/workloads) or the name of a shipped suite"),
    model: str = typer.Option("", help="tune this network (a lowbit.models name, "
                              "'file.py:fn' or 'module:fn'): its distinct workloads within "
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
    from .core import Precision
    from .kernels import get_template, templates
    from .tune import STRATEGIES, LocalMeasurer
    from .tune import tune as run_tune

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
    table = _table(f"lowbit tune ({strategy}, {trials} trials, {dev})",
                   ("layer", "template", "best us", "default us", "speedup", "trials",
                    "failed"))
    with LocalMeasurer(device=dev) as measurer:
        for name, wl in layers:
            console.print(f"[bold]{name}[/]: {wl.key}")
            r = run_tune(wl, chosen, trials=trials, strategy=strategy, db=db or None,
                         measurer=measurer, batch=round_size, seed=seed)
            d = r.default_us.get(r.template or "")
            table.add_row(name, r.template or "-", _us(r.time_us), _us(d),
                          f"{r.speedup_over_default:.2f}x" if r.speedup_over_default else "-",
                          str(r.trials), str(r.failures))
            if predict:
                _print_predictions(name, wl, r)
    console.print(table)


def _check_tune_device(dev: str, chosen: list) -> None:
    """Exit 3 before any measurement when the device cannot measure the chosen templates: no
    CUDA device for --device cuda, or templates that run only on a GPU for --device cpu."""
    from .tune.env import device_problem, needs_gpu
    from .tune.measure import MeasureEnvironmentError

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
    """A zoo name or a factory spec ('file.py:fn', 'module:fn'), else ValueError."""
    from .models import names

    if ":" not in model and model not in names():
        raise ValueError(f"--model must be one of {', '.join(names())}, or a float model "
                         f"factory 'file.py:fn' / 'module:fn', got {model!r}")


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
    from .tune import STRATEGIES
    from .tune_network import tune_network, write_results

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
        from .tune.env import device_name

        path = write_results(session, Path(out) / device_name().lower().replace(" ", "-"))
        console.print(f"wrote {path}")


def _tune_top(layers: list, chosen: list, top: int, db: str, dev: str) -> None:
    """`lowbit tune --top N`: per layer, the model's N top-ranked candidates timed, every
    measurement recorded (`lowbit.tune.dispatch.measure_top`)."""
    from .tune import LocalMeasurer
    from .tune.dispatch import measure_top

    table = _table(f"lowbit tune (the model's top {top}, {dev})",
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
            table.add_row(name, pick.template, _us(pick.predicted_us), str(top),
                          str(len(pick.alternatives)))
    console.print(table)


def _print_predictions(name: str, wl: object, r: object) -> None:
    """`lowbit tune --predict`: each measurement of this run beside the model's prediction."""
    from .perfmodel import predict_results

    preds = predict_results(wl, r.history, r.gpu)
    detail = _table(f"{name}: measured vs predicted ({r.gpu})",
                    ("template", "config", "measured us", "predicted us"))
    for res, p in zip(r.history, preds, strict=True):
        detail.add_row(res.template, res.config.to_json(), _us(res.time_us), f"{p:.1f}")
    console.print(detail)


def _us(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f}"


def _import_backends() -> None:
    """Register the built-in templates (a backend that cannot load is skipped)."""
    from .kernels import load_backends

    for mod, why in load_backends().items():  # e.g. no Triton here: the others still tune
        console.print(f"[yellow]skipping {mod}: {why}[/]")


# ----------------------------------------------------------------------------------- report

@app.command()
@reports_errors
def report(results: str = typer.Option("", help="results folder (default: "
                                     "./benchmarks/results where there is one, else "
                                     "$LOWBIT_RESULTS or <user data dir>/lowbit/results)"),
           db: str = typer.Option("", help="tuning records database (default: yours, "
                                  "$LOWBIT_RECORDS or the user cache file)"),
           out: str = typer.Option("lowbit-report.html", help="HTML file to write"),
           all_files: bool = typer.Option(False, "--all", help="every results file, not only "
                                          "the latest of each benchmark and GPU")) -> None:
    """Write one self-contained HTML page of your benchmark results and tuning records
    (tables and plots); runs from any folder."""
    from .report import write_report

    n = write_report(results or None, out, all_files, db or None)
    console.print(f"wrote {out} ({n} results files)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

