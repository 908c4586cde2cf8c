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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
