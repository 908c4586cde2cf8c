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


#: seconds between the progress lines written to a console that is not a terminal
LOG_EVERY_S = 15.0


class NetworkProgress:
    """Live table of a network's tuning (rich): per workload its share of the budget, GPU
    seconds spent, trials, default and best time so far; a header with the time left, the
    trials and how busy the GPUs are. `update(tasks, stats)` takes the pipeline's task
    summaries and stats (`lowbit.tune.pipeline`); redrawn at most `fps` times a second, or on
    a console that is not a terminal (a log) one line every `LOG_EVERY_S` and the table at
    the end."""

    def __init__(self, tasks: list, budget_s: float, gpus: int, enabled: bool = True,
                 console: Console | None = None, fps: float = 2.0) -> None:
        self.budget_s, self.gpus, self.enabled = budget_s, gpus, enabled
        self.total_quota = sum(t.quota_s for t in tasks) or 1.0
        self._live = None
        self._console = console
        self._last = 0.0
        self._period = 1.0 / fps
        self._rows: list[dict] = []
        self._stats: dict = {}

    def __enter__(self) -> NetworkProgress:
        if self.enabled:
            from rich.live import Live

            self._console = self._console or Console()
            if not self._console.is_terminal:  # a log: a line every `LOG_EVERY_S`
                self._period = LOG_EVERY_S
                return self
            self._live = Live(self._render(), console=self._console, auto_refresh=False,
                              transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
        elif self.enabled and self._rows:
            self._console.print(self._render())

    def update(self, rows: list[dict], stats: dict) -> None:
        import time

        self._rows, self._stats = rows, stats
        now = time.monotonic()
        if not self.enabled or now - self._last < self._period:
            return
        self._last = now
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
        else:
            self._console.print(self._title(), highlight=False)

    def _title(self) -> str:
        st = self._stats
        wall = st.get("wall_s", 0.0)
        busy = [g["busy"] for g in st.get("gpus", []) if g.get("busy") is not None]
        title = (f"tuning: {wall:.0f} of {self.budget_s:.0f} s, "
                 f"{max(0.0, self.budget_s - wall):.0f} s left, {st.get('trials', 0)} trials "
                 f"({st.get('failures', 0)} failed), {self.gpus} GPU(s)"
                 + (f" {100 * sum(busy) / len(busy):.0f}% busy" if busy else ""))
        if st.get("trajectory"):
            title += f", layers' best sum {st['trajectory'][-1][1]:.0f} us"
        return title

    def _render(self):
        from rich.table import Table

        table = Table(title=self._title())
        for col in ("workload", "share", "spent s", "trials", "default us", "best us",
                    "speedup", "template"):
            table.add_column(col, justify="right")
        for r in self._rows:
            def us(v: float | None) -> str:
                return "-" if v is None else f"{v:.1f}"

            table.add_row(r["name"][:40], f"{100 * r['quota_s'] / self.total_quota:.0f}%",
                          f"{r['spent_s']:.1f}", str(r["trials"] + r["resumed"]),
                          us(r["default_us"]), us(r["best_us"]),
                          f"{r['speedup']:.2f}x" if r.get("speedup") else "-",
                          r["best_template"] or "-")
        return table
