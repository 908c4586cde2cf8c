"""`lowbit report`: one self-contained HTML page (no external files or links) of the benchmark
results under a folder (DESIGN.md's format: benchmarks/results/<gpu>/<benchmark>-<stamp>.json):
for every (GPU folder, benchmark) the latest file (or every file) as a table of its rows and,
where its rows have a label and a time or accuracy column, a bar chart (PNG, inline).
Files that cannot be read are listed by name, not fatal."""

from __future__ import annotations

import base64
import html
import io
import json
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


def render_page(root: Path, show_all: bool = False) -> tuple[str, int]:
    """(HTML page, number of results files shown) for the results under `root`."""
    files, bad = read_results(root)
    shown = files if show_all else latest(files)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>lowbit results"
             f"</title><style>{_STYLE}</style></head><body><h1>lowbit results</h1>"
             f"<p>{len(shown)} results files from {html.escape(str(root))}"
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
    parts.append("</body></html>")
    return "".join(parts), len(shown)


def write_report(root: str | Path, out: str | Path, show_all: bool = False) -> int:
    """Write the page for `root` to `out`; returns the number of results files shown."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no results folder {root}")
    page, n = render_page(root, show_all)
    Path(out).write_text(page)
    return n
