"""The `lowbit` command: demo, quantize, summary, bench, tune, report.

A user mistake (a bad argument, a missing file, a model that does not fit) ends in one line
`error: ...` on stderr and exit code 2; a machine that cannot do the job (no CUDA GPU for a GPU
command, a measuring worker that cannot start) in one line and exit code 3. Neither prints a
traceback, and neither records anything. A GPU command calls `require_gpu` after checking its
arguments and before any work.

Only typer loads at start (torch, rich tables and lowbit's packages load inside the commands),
so that `lowbit --help` answers at once. The shared parts (the app, the console, the exit codes)
are in `cli/common.py`; `lowbit tune` is in `cli/tune_command.py`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from .common import (
    ENVIRONMENT_ERROR,
    USER_ERROR,
    app,
    console,
    reports_errors,
    require_gpu,
    rich_table,
    us_or_dash,
)
from .tune_command import parse_budget, tune

__all__ = ["ENVIRONMENT_ERROR", "USER_ERROR", "app", "main", "parse_budget", "require_gpu"]


# ----------------------------------------------------------------------------------- demo

@app.command()
@reports_errors
def demo(float_steps: int = typer.Option(200, help="float32 training steps"),
         qat_steps: int = typer.Option(100, help="QAT steps per precision"),
         precisions: str = typer.Option("w8a8,w4a4,w2a2,w1a2", help="comma-separated"),
         seed: int = typer.Option(0, help="data split and initialization seed")) -> None:
    """Train a small CNN on handwritten digits, quantize it to several precisions with QAT,
    convert it to integer layers and report accuracy and size (about a minute on a CPU)."""
    from ..demo import MODEL, _check_precisions, run_demo

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
    table = rich_table(f"digits test accuracy (float32 {report.float_accuracy:.1%})",
                   ("precision", "accuracy", "integer accuracy", "vs float32", "packed size",
                    "smaller", "plan = integer", "QAT s"))
    table.add_row("float32", f"{report.float_accuracy:.1%}", "-", "-",
                  f"{report.float_bytes:,} B", "1.0x", "-", "-")
    for r in report.rows:
        table.add_row(r.precision, f"{r.accuracy:.1%}", f"{r.integer_accuracy:.1%}",
                      f"{100 * (r.accuracy - report.float_accuracy):+.1f} pts",
                      f"{r.packed_bytes:,} B", f"{report.float_bytes / r.packed_bytes:.1f}x",
                      f"{r.plan_equal[0]} / {r.plan_equal[1]}", f"{r.seconds:.1f}")
    table.caption = ("wXaY = X-bit weights, Y-bit activations; packed size: integer weights "
                     "at their bit width plus per-channel scales (float32 kept where float); "
                     "plan = integer: test images whose logits lowbit.compile's plan gives "
                     "as the integer model run in float64 (where the model computes in float, "
                     "as the average pool before the classifier's quantizer, the plan holds "
                     "the value as a 24-bit integer: an image at a rounding step can move by "
                     "one step)")
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
    from ..core import parse_wa

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
    from ..quant.data import digits_loaders, image_folder_loader

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

    from ..serialize import arch_entry, build_model

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

    from ..core import parse_wa
    from ..quant import summary as layer_summary
    from ..quant.inputs import InputShapeError
    from ..serialize import save

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
    from ..quant import LayerRow
    from ..quant import summary as layer_summary
    from ..quant.overview import render
    from ..serialize import verify

    if target.endswith(".safetensors") or Path(target).is_file():
        manifest, _ = verify(target)  # every digest and integer range checked
        rows = [LayerRow(**r) for r in manifest.get("summary", [])]
        console.print(render(rows, f"{target} ({manifest['kind']})"))
        return
    import lowbit

    from ..core import parse_wa

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

    from ..bench import (
        BenchCase,
        bench_network,
        impl_chooser,
        per_layer_figure,
        summary_table,
    )
    from ..models import names
    from ..runtime.model_source import is_external

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
    table = rich_table(f"{model} batch {batch} {precision} on {torch.cuda.get_device_name()}",
                   ("step", "impl", "us", "floor us", "share", "fp16 us"))
    for r in row["layers"]:
        table.add_row(r["name"], r["impl"], f"{r['time_us']:.1f}", f"{r['floor_us']:.1f}",
                      f"{100 * r['share']:.1f}%", us_or_dash(r.get("fp16_us")))
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

app.command()(tune)  # `lowbit.cli.tune_command`


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
    from ..report import write_report

    n = write_report(results or None, out, all_files, db or None)
    console.print(f"wrote {out} ({n} results files)")


def main() -> None:
    app()


