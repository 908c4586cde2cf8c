"""Regenerate BENCHMARKS.md's tables from the committed results files.

    python benchmarks/report.py           # rewrite BENCHMARKS.md between the report markers
    python benchmarks/report.py --check   # exit 1 when BENCHMARKS.md differs from the files
    python benchmarks/report.py --stdout  # print the generated part

Every results file (benchmarks/results/<gpu>/*.json, format in docs/design.md) belongs to a
suite: its "benchmark" field, or for files written without one, its name before the date stamp.
A suite renderer turns its files into the suite's current table(s): the latest (or, for the
bit-serial kernels, the fastest bit-exact) row per key, never a history of runs, over the runs
of the GPU that ran the suite last and its CPU and offline runs; one line links the other GPUs'
files that their tables would cite. A concluded suite (`suite(..., concluded=summary)`) shows
one line of its deciding figures instead, linking the files its tables cite. Every figure
links to the file it comes from, every ratio divides times of one file (the same run), and the
report defines a link for exactly the files its tables cite; each section counts its other
files. Files that nothing cites leave the tree (`benchmarks/consolidate.py` folds their
measurements into benchmarks/results/measurements.jsonl.gz, which the performance-model section
cites; git keeps the files). The output is a pure function of the
files: sorted, fixed number formats, no clock.

Adding a suite: write `render_x(files: list[Result]) -> list[str]` (markdown lines) in
report_kernels.py or report_models.py and decorate it with
`@suite(name, title, script, benchmarks=(...))` (`concluded=` a `summary(files) -> str` once
the investigation is closed). A suite without a renderer gets the latest
file's rows as a generic table; a renderer that raises on its files falls back to that table
with the error shown, so a new results format never breaks the report.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import report_kernels  # noqa: F401  (registers the kernel suites)
import report_models  # noqa: F401  (registers the model suites)
from report_core import (
    BEGIN,
    DATASET_NAME,
    DOC,
    END,
    RESULTS,
    ROOT,
    SUITES,
    VERSION_LABELS,
    Result,
    dataset_line,
    latest,
    load,
    ratio,
    render_generic,
    suite_of,
    us,
)

__all__ = ["BEGIN", "DATASET_NAME", "END", "SUITES", "Result", "cited_labels", "extra_files",
           "load", "main", "ratio", "render", "splice", "us"]

# --- the report -----------------------------------------------------------------------------

_LINK = re.compile(r"\]\[([^\]]+)\]")


def cited_labels(text: str) -> set[str]:
    """The reference labels that `[text][label]` links in `text` use."""
    return set(_LINK.findall(text))


def _folders(paths: Iterable[str], base: str = "") -> str:
    """'under `dir/`' or ': `a/` n, `b/` m': where the paths live, relative to `base` (its
    own files: "top level")."""
    dirs = Counter(p.rsplit("/", 1)[0] for p in paths)
    name = {d: "top level" if d == base else f"`{d.removeprefix(base + '/') if base else d}/`"
            for d in dirs}
    if len(dirs) == 1:
        return f" under {name[next(iter(dirs))]}".replace("under top level", "at the top level")
    return ": " + ", ".join(f"{name[d]} {n}" for d, n in sorted(dirs.items()))


def results_base(files: list[Result]) -> str:
    """The folder whose subfolders hold every results file ("" where there is none)."""
    bases = {f.path.rsplit("/", 2)[0] for f in files if f.path.count("/") >= 2}
    return bases.pop() if len(bases) == 1 else ""


def files_line(files: list[Result], extra: list[str], body: str, base: str = "") -> str:
    """One line: how many files the suite has and in which folders (relative to `base`), how
    many the tables cite (where not all), and links to the plots of the cited runs."""
    cited = cited_labels(body)
    stems = {f.name.rsplit(".", 1)[0] for f in files if (f.label or f.path) in cited}
    plots = [p for p in extra if Path(p).stem in stems]
    n = len(files) + len(extra)
    n_cited = sum((f.label or f.path) in cited for f in files)
    text = (f"{n} file{'s' if n != 1 else ''} of this suite"
            f"{_folders([f.path for f in files] + extra, base)}"
            + (f"; the tables cite {n_cited}" if n_cited < len(files) else ""))
    if plots:
        text += "; plots: " + ", ".join(f"[{Path(p).name}]({p})" for p in plots)
    return text + "."


def cite_once(body: list[str], files: list[Result]) -> list[str]:
    """`body` where each table whose figures all cite one file names that file once above it
    (unless the line before the table already does) instead of in every row."""
    by_label = {f.label or f.path: f for f in files}
    out: list[str] = []
    i = 0
    while i < len(body):
        if not body[i].startswith("|"):
            out.append(body[i])
            i += 1
            continue
        j = i
        while j < len(body) and body[j].startswith("|"):
            j += 1
        block = body[i:j]
        labels = cited_labels("\n".join(block))
        uses = sum(len(_LINK.findall(line)) for line in block)
        if len(labels) == 1 and uses > 1 and (label := labels.pop()) in by_label:
            block = [re.sub(r"\[([^\]]*)\]\[" + re.escape(label) + r"\]", r"\1", line)
                     for line in block]
            before = next((line for line in reversed(out) if line), "")
            if label not in cited_labels(before):
                out += ([""] if out and out[-1] else []) + [
                    f"File: {by_label[label].link(by_label[label].name)}.", ""]
        out += block
        i = j
    return out


def current_and_older(files: list[Result]) -> tuple[list[Result], dict[str, list[Result]]]:
    """(the files of a suite's current table: every run on no GPU (CPU, offline) and the runs
    of the GPU that ran last; the other GPUs' files, by GPU)."""
    runs = [f for f in files if f.on_gpu]
    if not runs:
        return files, {}
    current = max(runs, key=lambda f: f.order).gpu
    older: dict[str, list[Result]] = {}
    for f in sorted(runs, key=lambda f: f.order):
        if f.gpu != current:
            older.setdefault(f.gpu, []).append(f)
    return [f for f in files if not f.on_gpu or f.gpu == current], older


def tables(name: str, files: list[Result]) -> list[str]:
    """The suite's tables of `files`; the latest file's rows where the suite has no renderer
    or its renderer fails on them."""
    s = SUITES.get(name)
    if s is None:
        return ["No renderer registered in `benchmarks/report.py`; the latest file's rows:", "",
                *render_generic(files)]
    try:
        return s.render(files)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        return [f"Renderer `{s.render.__name__}` failed ({type(e).__name__}: {e}); the "
                "latest file's rows:", "", *render_generic(files)]


def cited_files(name: str, files: list[Result]) -> list[Result]:
    """The files that the suite's tables of `files` cite (the latest file where none)."""
    labels = cited_labels("\n".join(tables(name, files)))
    return [f for f in sorted(files, key=lambda f: f.order) if (f.label or f.path) in labels
            ] or [latest(files)]


def file_links(files: list[Result]) -> str:
    """Links to `files`, each named by its stamp where they are of one benchmark (by its
    stem otherwise)."""
    one = len({f.benchmark for f in files}) == 1
    return ", ".join(f.link(f.stamp if one and f.stamp else f.name.rsplit(".", 1)[0])
                     for f in files)


def concluded(name: str, files: list[Result]) -> list[str] | None:
    """A concluded suite's one line: its summary and links to the files its tables would
    cite; None where the suite is not concluded or its summary fails on `files`."""
    s = SUITES.get(name)
    if s is None or s.summary is None:
        return None
    try:
        text = s.summary(files)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return None
    cited = cited_files(name, files)
    dates = sorted({f.date for f in cited})
    runs = [*dict.fromkeys(f.gpu for f in cited if f.gpu not in text),
            dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}"]
    return [f"Concluded ({', '.join(runs)}). {text} Tables: {file_links(cited)}.", ""]


def older_line(name: str, older: dict[str, list[Result]]) -> list[str]:
    """One line linking, per GPU that did not run last, the files its tables would cite."""
    if not older:
        return []
    return ["Other GPUs' runs: " + "; ".join(
        f"{gpu}: " + file_links(cited_files(name, group))
        for gpu, group in sorted(older.items())) + ".", ""]


def section(name: str, files: list[Result], extra: list[str], root: Path = ROOT,
            base: str = "") -> list[str]:
    """A suite's section: its current tables (or, for a concluded suite, its summary line),
    the line linking other GPUs' runs, the dataset line and the files line."""
    s = SUITES.get(name)
    title = s.title if s else f"Suite `{name}`"
    head = [f"## {title}" + (f" (`{s.script}`)" if s and s.script else ""), ""]
    shown, older = current_and_older(files)
    body = concluded(name, shown) or cite_once(tables(name, shown), files)
    body += older_line(name, older)
    body += [line for p in extra if Path(p).name == DATASET_NAME
             for line in (dataset_line(p, root), "")]
    return head + body + [files_line(files, extra, "\n".join(body), base), ""]


def _runs_parts(line: str) -> tuple[str, tuple[str, ...], list[str]]:
    """A provenance line's GPU, versions and other parts."""
    gpu, *parts = line.removeprefix("Runs: ").split(" · ")
    return (gpu, tuple(p for p in parts if p.startswith(VERSION_LABELS)),
            [p for p in parts if not p.startswith(VERSION_LABELS)])


def shared_versions(lines: list[str]) -> list[str]:
    """`lines` whose provenance lines ("Runs: ...") leave out their GPU's usual versions,
    preceded by one line stating those per GPU. A GPU's usual versions: those most of its
    lines name, where two or more lines (of any GPU) name them."""
    runs = [_runs_parts(line) for line in lines if line.startswith("Runs: ")]
    shared = Counter(versions for _, versions, _ in runs if versions)
    counts = Counter((gpu, versions) for gpu, versions, _ in runs if shared[versions] > 1)
    common: dict[str, tuple[str, ...]] = {}
    for (gpu, versions), _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        common.setdefault(gpu, versions)
    if not common:
        return lines
    out = []
    for line in lines:
        if line.startswith("Runs: "):
            gpu, versions, rest = _runs_parts(line)
            if common.get(gpu) == versions:
                line = "Runs: " + " · ".join([gpu, *rest])
        out.append(line)
    gpus: dict[tuple[str, ...], list[str]] = {}
    for gpu, versions in sorted(common.items()):
        gpus.setdefault(versions, []).append(gpu)
    return ["Versions of the runs whose line names none: " + "; ".join(
        " and ".join(g) + ": " + ", ".join(v) for v, g in gpus.items()) + ".", "", *out]


def render(files: list[Result], extra: Iterable[str] = (), root: Path = ROOT) -> str:
    """The generated part of BENCHMARKS.md (markers included). `extra`: non-JSON files under
    the results folder (plots, the consolidated dataset), as paths relative to `root`; those
    whose name starts like a suite's files belong to it, the dataset to the performance
    model's, the rest are counted under "Other files". Link definitions: the files cited."""
    groups: dict[str, list[Result]] = {}
    for f in files:
        groups.setdefault(suite_of(f.benchmark), []).append(f)
    order = [n for n in SUITES if n in groups] + sorted(n for n in groups if n not in SUITES)
    extra = sorted(extra)
    base = results_base(files)
    lines = []
    for name in order:
        mine = [p for p in extra if Path(p).name.split("-")[0] in
                {f.name.split("-")[0] for f in groups[name]}
                or (name == "perfmodel" and Path(p).name == DATASET_NAME)]
        extra = [p for p in extra if p not in mine]
        lines += section(name, groups[name], mine, root, base)
    lines = [BEGIN, "", "Each section ends with its number of files"
             + (f" (folders under `{base}/`)" if base else "") + "; files that nothing cites "
             "leave the tree (`benchmarks/consolidate.py`).", "", *shared_versions(lines)]
    if extra:
        dirs = Counter(p.rsplit("/", 1)[0] + "/" for p in extra)
        lines += ["## Other files", ""]
        lines += [f"- `{d}`: {n} files ("
                  + ", ".join(f"{c} {ext}" for ext, c in sorted(Counter(
                      Path(p).suffix or "no suffix" for p in extra
                      if p.startswith(d) and "/" not in p[len(d):]).items()))
                  + "), kept as data" for d, n in sorted(dirs.items())]
        lines += [""]
    return "\n".join([*number_links("\n".join(lines), files), "", END])


def number_links(text: str, files: list[Result]) -> list[str]:
    """`text` with each cited file's label replaced by its number, in order of first citation,
    and one link definition per cited file after it (as lines)."""
    by_label = {f.label or f.path: f for f in files}
    order = [x for x in dict.fromkeys(_LINK.findall(text)) if x in by_label]
    number = {x: str(i) for i, x in enumerate(order, 1)}
    text = _LINK.sub(lambda m: f"][{number.get(m[1], m[1])}]", text)
    return [*text.split("\n"), *(f"[{number[x]}]: {by_label[x].path}" for x in order)]


def extra_files(results: Path = RESULTS, root: Path = ROOT) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in results.rglob("*")
                  if p.is_file() and p.suffix != ".json")


def splice(doc: str, generated: str) -> str:
    """`doc` with the text between the markers replaced by `generated`."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"BENCHMARKS.md needs the markers {BEGIN!r} and {END!r}")
    return doc[:start] + generated + doc[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md is stale")
    ap.add_argument("--stdout", action="store_true", help="print the generated part")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    generated = render(load(), extra_files())
    if args.stdout:
        print(generated)
        return 0
    old = args.doc.read_text()
    new = splice(old, generated)
    if args.check:
        if new != old:
            print(f"{args.doc} differs from `python benchmarks/report.py`", file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

