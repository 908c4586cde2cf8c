"""`lowbit report`: one self-contained HTML page (no external files or links) of the benchmark
results under a folder (<results>/<gpu>/<benchmark>-<stamp>.json) and of a tuning records
database: for every (GPU folder, benchmark) the latest file (or every file) as a table of its
rows and, where its rows have a label and a time or accuracy column, a bar chart (PNG, inline);
for every (GPU, workload) of the records its fastest measured kernel. Files that cannot be read
are listed by name, not fatal.

It runs from any folder: the results default to ./benchmarks/results where there is one (a
lowbit checkout), else the user's results folder (`default_results_dir`); the records to the
user's database (`lowbit.tune.default_db_path`). A default that does not exist is reported on
the page; a folder or database named explicitly must exist."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

LABEL_KEYS = ("workload", "model", "layer", "name", "precision", "method", "impl")
METRIC_KEYS = ("time_us", "time_ms", "images_per_s", "accuracy_mean", "median_us", "us",
               "tops", "speedup")
MAX_PLOT_ROWS = 40


@dataclass
class ResultsFile:
    path: Path
    gpu: str
    benchmark: str
    date: str
    rows: list[dict] = field(default_factory=list)


def _benchmark_name(path: Path, doc: object) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("benchmark"), str):
        return doc["benchmark"]
    return re.split(r"-\d", path.stem, maxsplit=1)[0]


def read_results(root: Path) -> tuple[list[ResultsFile], list[tuple[Path, str]]]:
    """(readable results files, [(path, why) of the unreadable ones]) under `root`."""
    files, bad = [], []
    for path in sorted(root.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            bad.append((path, f"{type(e).__name__}: {e}"))
            continue
        rows = doc.get("rows") if isinstance(doc, dict) else doc
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            bad.append((path, "no list of rows"))
            continue
        date = str(doc.get("date", "")) if isinstance(doc, dict) else ""
        gpu = path.parent.name if path.parent != root else "-"
        files.append(ResultsFile(path, gpu, _benchmark_name(path, doc), date, rows))
    return files, bad


def latest(files: list[ResultsFile]) -> list[ResultsFile]:
    """The newest file (by date, then name) of every (GPU folder, benchmark)."""
    best: dict[tuple[str, str], ResultsFile] = {}
    for f in files:
        key = (f.gpu, f.benchmark)
        if key not in best or (f.date, f.path.name) > (best[key].date, best[key].path.name):
            best[key] = f
    return sorted(best.values(), key=lambda f: (f.gpu, f.benchmark))


def _cell(v: object) -> str:
    if isinstance(v, float):
        text = f"{v:.4g}"
    elif isinstance(v, (dict, list)):
        text = json.dumps(v)
        text = text if len(text) <= 80 else text[:77] + "..."
    else:
        text = str(v)
    return html.escape(text)


def _table(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plot(rows: list[dict]) -> str:
    """An inline bar chart of the first metric column against the label columns, or ""."""
    metric = next((m for m in METRIC_KEYS
                   if any(isinstance(r.get(m), (int, float)) for r in rows)), None)
    labels = [k for k in LABEL_KEYS if any(k in r for r in rows)]
    if metric is None or not labels:
        return ""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(" ".join(str(r.get(k, "")) for k in labels[:3]).strip(), float(r[metric]))
              for r in rows if isinstance(r.get(metric), (int, float))][:MAX_PLOT_ROWS]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(points) + 1.2))
    ax.barh([p[0] for p in points][::-1], [p[1] for p in points][::-1])
    ax.set_xlabel(metric)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="{html.escape(metric)}" src="data:image/png;base64,{data}">'


_STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
          "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
          "th{background:#eee}h2{margin-top:2em}")


def default_results_dir() -> Path:
    """./benchmarks/results where it exists (a lowbit checkout), else $LOWBIT_RESULTS, else
    <user data dir>/lowbit/results."""
    local = Path("benchmarks") / "results"
    if local.is_dir():
        return local
    env = os.environ.get("LOWBIT_RESULTS")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("lowbit")) / "results"


def records_rows(db: Path) -> list[dict]:
    """One row per (GPU, workload) of a records database: its fastest correct kernel and how
    many measurements (failures among them) it holds. ValueError if `db` is no database."""
    import sqlite3

    query = ("SELECT gpu, workload, COUNT(*), SUM(time_us IS NULL), MIN(time_us) "
             "FROM measurements GROUP BY gpu, workload ORDER BY gpu, workload")
    best_q = ("SELECT template, config FROM measurements WHERE gpu = ? AND workload = ? AND "
              "time_us = ? LIMIT 1")
    try:
        with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
            rows = []
            for gpu, workload, n, failed, best in conn.execute(query).fetchall():
                template, config = (conn.execute(best_q, (gpu, workload, best)).fetchone()
                                    if best is not None else ("-", "-"))
                rows.append({"gpu": gpu, "workload": workload, "impl": template,
                             "config": config, "time_us": best, "measurements": n,
                             "failed": failed})
    except sqlite3.Error as e:
        raise ValueError(f"records database {str(db)!r} cannot be read ({e})") from None
    return rows


def _records_part(db: Path | None) -> str:
    if db is None:
        return ""
    if not db.is_file():
        return (f"<h2>Tuning records</h2><p>No records database at {html.escape(str(db))} "
                "(lowbit tune writes one).</p>")
    rows = records_rows(db)
    head = (f"<h2>Tuning records</h2><p>{html.escape(str(db))}: {len(rows)} workloads, "
            f"{sum(r['measurements'] for r in rows)} measurements</p>")
    return head + (_plot(rows) + _table(rows) if rows else "")


def render_page(root: Path, show_all: bool = False,
                db: Path | None = None) -> tuple[str, int]:
    """(HTML page, number of results files shown) for the results under `root` (a folder
    that does not exist shows none) and the records database `db`."""
    files, bad = read_results(root) if root.is_dir() else ([], [])
    shown = files if show_all else latest(files)
    where = (html.escape(str(root)) if root.is_dir() else
             f"{html.escape(str(root))} (no such folder: lowbit bench --out writes results)")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>lowbit results"
             f"</title><style>{_STYLE}</style></head><body><h1>lowbit results</h1>"
             f"<p>{len(shown)} results files from {where}"
             + ("" if show_all else f" (the latest of each benchmark and GPU; "
                f"{len(files) - len(shown)} older files not shown)") + "</p>"]
    for f in shown:
        parts.append(f"<h2>{html.escape(f.benchmark)} &middot; {html.escape(f.gpu)} &middot; "
                     f"{html.escape(f.date or 'no date')}</h2><p>{html.escape(f.path.name)}, "
                     f"{len(f.rows)} rows</p>")
        parts.append(_plot(f.rows))
        parts.append(_table(f.rows))
    if bad:
        items = "".join(f"<li>{html.escape(str(p.relative_to(root)))}: {html.escape(why)}</li>"
                        for p, why in bad)
        parts.append(f"<h2>Unreadable files</h2><ul>{items}</ul>")
    parts.append(_records_part(db))
    parts.append("</body></html>")
    return "".join(parts), len(shown)


def write_report(root: str | Path | None, out: str | Path, show_all: bool = False,
                 db: str | Path | None = None) -> int:
    """Write the page for the results folder `root` and the records database `db` to `out`
    (None: the defaults, which may be missing); returns the number of results files shown.
    FileNotFoundError for a folder or database given that does not exist."""
    from .tune.records import default_db_path

    if root is not None and not Path(root).is_dir():
        raise FileNotFoundError(f"--results {str(root)!r}: no such results folder")
    if db is not None and not Path(db).is_file():
        raise FileNotFoundError(f"--db {str(db)!r}: no such records database")
    out = Path(out)
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {str(out)!r}: the folder {str(out.parent)!r} does not "
                                "exist")
    page, n = render_page(Path(root) if root is not None else default_results_dir(), show_all,
                          Path(db) if db is not None else default_db_path())
    out.write_text(page)
    return n
