"""What every `lowbit` command shares: the typer app, the console (made on first use), the
exit codes and `reports_errors`, which turns a user's mistake or a missing GPU into one line.

Only typer loads here; rich, torch and lowbit's packages load when a command runs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
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


def rich_table(title: str, columns: Sequence[str]) -> Any:
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
        from ..tune.measure import MeasureEnvironmentError

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
            from ..tune.measure import MeasureEnvironmentError

            if isinstance(e, MeasureEnvironmentError):
                _fail(str(e), ENVIRONMENT_ERROR)
            if isinstance(e, (ValueError, TypeError, OSError)):
                _fail(str(e), USER_ERROR)
            raise

    return run


def us_or_dash(t: float | None) -> str:
    """A time in microseconds for a table cell ("-" for none)."""
    return "-" if t is None else f"{t:.1f}"

