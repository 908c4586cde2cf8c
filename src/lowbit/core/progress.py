"""A progress display for long steps (calibration, compilation, kernel builds).

    with progress("calibrating", total=len(loader)) as bar:
        for batch in loader:
            ...
            bar.advance()

Nothing is shown unless the step is still running after `delay` seconds (1 s), stderr is a
terminal, no test is running (pytest) and `LOWBIT_PROGRESS` is not "0". Then a rich bar (or a
spinner, without a total) appears on stderr and is removed when the step ends. Only the
outermost step shows: a step started while another one is running (in any thread) stays silent.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DELAY_S = 1.0
_lock = threading.Lock()
_active = 0


def progress_enabled() -> bool:
    """Whether a progress display may appear here (a terminal, not under pytest)."""
    if os.environ.get("LOWBIT_PROGRESS", "") == "0" or "PYTEST_CURRENT_TEST" in os.environ:
        return False
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


class Progress:
    """The handle `progress` yields: `advance(n)` and `describe(text)`; both cheap when
    nothing is shown."""

    def __init__(self, description: str, total: int | None) -> None:
        self.description, self.total, self.completed = description, total, 0
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.completed += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.completed)

    def describe(self, description: str) -> None:
        with self._lock:
            self.description = description
            if self._bar is not None:
                self._bar.update(self._task, description=description)

    def _show(self, console: Any) -> None:
        from rich import progress as rp

        columns = [rp.SpinnerColumn(), rp.TextColumn("{task.description}")]
        if self.total is not None:
            columns += [rp.BarColumn(), rp.MofNCompleteColumn()]
        columns.append(rp.TimeElapsedColumn())
        with self._lock:
            if self._bar is not None:
                return
            bar = rp.Progress(*columns, console=console, transient=True)
            self._task = bar.add_task(self.description, total=self.total,
                                      completed=self.completed)
            bar.start()
            self._bar = bar

    def _close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None


@contextmanager
def progress(description: str, total: int | None = None, *, delay: float = DELAY_S,
             console: Any = None, enabled: bool | None = None) -> Iterator[Progress]:
    """A `Progress` handle for a step; shown after `delay` seconds where `progress_enabled()`
    (or `enabled`) allows. console: a rich Console (default: stderr)."""
    global _active
    handle = Progress(description, total)
    with _lock:
        outermost = _active == 0
        _active += 1
    show = outermost and (progress_enabled() if enabled is None else enabled)
    timer = None
    if show:
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        timer = threading.Timer(delay, handle._show, args=(console,))
        timer.daemon = True
        timer.start()
    try:
        yield handle
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        handle._close()
        with _lock:
            _active -= 1
