"""Live tuning display (rich): trials done of total, failures, best time so far, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TuneProgress:
    """Context manager; `advance(ok, time_us, label)` once per measured candidate."""

    def __init__(self, title: str, total: int, done: int = 0, enabled: bool = True,
                 console: Console | None = None) -> None:
        self.enabled = enabled
        self.failures = 0
        self.best_us: float | None = None
        self.best_label = ""
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("fail {task.fields[failures]}"), TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, disable=not enabled, transient=False)
        self._task = self._progress.add_task(title, total=total, completed=done,
                                             failures=0, best="-")

    def __enter__(self) -> TuneProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, ok: bool, time_us: float | None, label: str = "") -> None:
        if not ok:
            self.failures += 1
        elif time_us is not None and (self.best_us is None or time_us < self.best_us):
            self.best_us, self.best_label = time_us, label
        best = "-" if self.best_us is None else f"{self.best_us:.1f} us {self.best_label}"
        self._progress.update(self._task, advance=1, failures=self.failures, best=best)
