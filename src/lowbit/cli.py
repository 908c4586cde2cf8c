"""The `lowbit` command: demo, and (as they land) tune, bench, report."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="lowbit: 1-8 bit conv/GEMM on auto-tuned Tensor Core kernels.")
console = Console()


@app.callback()
def _root() -> None:
    """lowbit: 1-8 bit conv/GEMM on auto-tuned Tensor Core kernels."""


@app.command()
def demo(seed: int = typer.Option(0, help="seed of the random layer")) -> None:
    """Quantize one conv layer to several precisions and run it through lowbit."""
    from .demo import demo_layer, demo_rows

    wl, _, _ = demo_layer(seed)
    table = Table(title=f"conv {wl.N}x{wl.H}x{wl.W}x{wl.C} -> {wl.K}, {wl.R}x{wl.S} "
                        "(exact integer reference)")
    for col in ("w", "a", "max err / max|ref|", "rel. L2 err", "packed B", "fp16 B", "ratio"):
        table.add_column(col, justify="right")
    for r in demo_rows(seed):
        table.add_row(str(r.w), str(r.a), f"{r.max_error:.4f}", f"{r.rel_l2_error:.4f}",
                      f"{r.packed_bytes:,}", f"{r.fp16_bytes:,}",
                      f"{r.packed_bytes / r.fp16_bytes:.3f}x")
    table.caption = ("u = unsigned, s = signed two's complement, b = binary -1/+1; weights per "
                     "output channel, activations per tensor (max scaling); packed = bit planes")
    console.print(table)


@app.command()
def tune(
    workloads: str = typer.Argument(..., help="workload JSON file (a list of layers, as in "
                                    "src/lowbit/data/workloads) or the name of a shipped suite"),
    trials: int = typer.Option(500, help="measurements per layer (recorded ones count)"),
    strategy: str = typer.Option("diversity", help="random, exhaustive, sa, diversity, tpe"),
    db: str = typer.Option("", help="records database (default: the user cache file)"),
    template: str = typer.Option("", help="comma-separated template names to consider "
                                 "(default: every registered one)"),
    device: str = typer.Option("", help="cuda, cuda:i or cpu (default: cuda when present)"),
    w: str = typer.Option("", help="weight precision for every layer, e.g. s8, u4, b1"),
    a: str = typer.Option("", help="activation precision for every layer, e.g. s8, u4"),
    batch: int = typer.Option(32, help="candidates measured per round"),
    seed: int = typer.Option(0, help="search seed"),
) -> None:
    """Tune every layer of a workload file; the best configs go to the records database."""
    from pathlib import Path

    import torch

    from .core import load_workloads, workload_from_dict
    from .core.workloads import SUITES
    from .kernels import get_template, templates
    from .tune import LocalMeasurer
    from .tune import tune as run_tune

    _import_backends()
    overrides = {k: v for k, v in (("w", w), ("a", a)) if v}
    if workloads in SUITES:
        layers = load_workloads(workloads, **overrides)
    else:
        import json

        data = json.loads(Path(workloads).read_text())
        data = data if isinstance(data, list) else [data]
        layers = [(d.get("name", f"layer{i}"), workload_from_dict(d, **overrides))
                  for i, d in enumerate(data)]
    names = [n.strip() for n in template.split(",") if n.strip()]
    chosen = [get_template(n) for n in names] if names else templates()
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    table = Table(title=f"lowbit tune ({strategy}, {trials} trials, {dev})")
    for col in ("layer", "template", "best us", "default us", "speedup", "trials", "failed"):
        table.add_column(col, justify="right")
    with LocalMeasurer(device=dev) as measurer:
        for name, wl in layers:
            console.print(f"[bold]{name}[/]: {wl.key}")
            r = run_tune(wl, chosen, trials=trials, strategy=strategy, db=db or None,
                         measurer=measurer, batch=batch, seed=seed)
            d = r.default_us.get(r.template or "")
            table.add_row(name, r.template or "-", _us(r.time_us), _us(d),
                          f"{r.speedup_over_default:.2f}x" if r.speedup_over_default else "-",
                          str(r.trials), str(r.failures))
    console.print(table)


def _us(t: float | None) -> str:
    return "-" if t is None else f"{t:.1f}"


def _import_backends() -> None:
    """Register the built-in templates (a backend that cannot load is skipped)."""
    from .kernels import load_backends

    for mod, why in load_backends().items():  # e.g. no Triton here: the others still tune
        console.print(f"[yellow]skipping {mod}: {why}[/]")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
