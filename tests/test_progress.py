"""The progress display of long steps (lowbit.core.progress): shown only after its delay,
only where enabled (a terminal, not under pytest), only for the outermost step."""

from __future__ import annotations

import io
import time

from rich.console import Console

from lowbit.core.progress import progress, progress_enabled


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_a_long_step_shows_its_bar_and_a_short_one_nothing():
    console, out = _console()
    with progress("building kernels", total=3, delay=0.05, console=console,
                  enabled=True) as bar:
        time.sleep(0.3)
        bar.advance()
        bar.describe("building kernels (2 left)")
        time.sleep(0.3)
    shown = out.getvalue()
    assert "building kernels" in shown and "/3" in shown
    assert bar.completed == 1

    console, out = _console()
    with progress("quick", delay=5.0, console=console, enabled=True) as bar:
        bar.advance(2)
    assert out.getvalue() == "" and bar.completed == 2


def test_silent_under_pytest_and_when_disabled():
    assert not progress_enabled()  # PYTEST_CURRENT_TEST is set
    console, out = _console()
    with progress("calibrating", total=2, delay=0.0, console=console, enabled=False) as bar:
        time.sleep(0.1)
        bar.advance()
    assert out.getvalue() == ""


def test_only_the_outermost_step_shows():
    console, out = _console()
    inner_console, inner_out = _console()
    with progress("compiling", delay=0.0, console=console, enabled=True):
        with progress("NVRTC", delay=0.0, console=inner_console, enabled=True):
            time.sleep(0.2)
    assert "compiling" in out.getvalue()
    assert inner_out.getvalue() == ""
