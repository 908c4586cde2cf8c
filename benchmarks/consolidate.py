"""Fold the results files that nothing cites into the consolidated measurement dataset.

    python benchmarks/consolidate.py                   # list what would be folded / removed
    python benchmarks/consolidate.py --write           # fold them into the dataset
    python benchmarks/consolidate.py --write --remove  # and `git rm` them

benchmarks/results/ keeps the files that the generated BENCHMARKS.md tables cite (what
`benchmarks/report.py` would write now, not the committed page) and those that the docs, notes,
tests or scripts name; every other git-tracked results file is uncited. An uncited JSON
file's verified measurements (what `lowbit.perfmodel.dataset.load_results` reads from it,
raw, with the file's path, GPU, date and versions) go into
benchmarks/results/measurements.jsonl.gz (`lowbit.perfmodel.dataset.consolidate`), which
`load_results` reads beside the files, so the performance model trains and evaluates on the
same rows after the file is gone; plots and other files of uncited runs are only removed (git
keeps them). Files that git does not track yet (someone's new results) are never touched.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowbit.perfmodel.consolidated import (
    CONSOLIDATED,
    read_consolidated,
    write_consolidated,
)
from lowbit.perfmodel.dataset import (
    consolidate,
)
from report import extra_files, load, render
from report_core import RESULTS, ROOT

#: where a results file counts as cited when its name appears (besides the report's links)
CITING = ("*.md", "docs/**/*.md", "tests/**/*.py", "src/**/*.py", "benchmarks/*.py",
          "benchmarks/*.sh", "benchmarks/probes/*.py")


def tracked(results: Path = RESULTS, root: Path = ROOT) -> list[str]:
    """The git-tracked files under `results`, as paths relative to `root`."""
    out = subprocess.run(["git", "ls-files", "-z", "--", str(results)], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.split("\0") if p)


def cited(report: str, texts: list[str], paths: list[str]) -> set[str]:
    """The `paths` that the generated `report` links to, or whose file name one of `texts`
    (docs, notes, tests, scripts) mentions."""
    links = set(re.findall(r"^\[[^\]]+\]: (\S+)$", report, re.M))
    links |= set(re.findall(r"\]\((benchmarks/results/[^)]+)\)", report))
    names = "\n".join(texts)
    return {p for p in paths if p in links or Path(p).name in names}


def citing_texts(root: Path = ROOT) -> list[str]:
    files = {p for pattern in CITING for p in root.glob(pattern) if p.is_file()}
    return [p.read_text(errors="replace") for p in sorted(files)
            if p.name != "BENCHMARKS.md"]  # the committed page may be stale: `render` decides


def uncited(results: Path = RESULTS, root: Path = ROOT) -> list[str]:
    """The git-tracked results files (paths relative to `root`) that nothing cites, the
    consolidated dataset left out."""
    paths = [p for p in tracked(results, root) if Path(p).name != CONSOLIDATED]
    report = render(load(results, root), extra_files(results, root))
    keep = cited(report, citing_texts(root), paths)
    return [p for p in paths if p not in keep]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"fold the uncited files into "
                    f"{CONSOLIDATED}")
    ap.add_argument("--remove", action="store_true", help="git rm the uncited files (needs "
                    "--write)")
    args = ap.parse_args(argv)
    if args.remove and not args.write:
        ap.error("--remove needs --write (the measurements must be folded first)")
    paths = uncited()
    jsons = [ROOT / p for p in paths if p.endswith(".json")]
    records = consolidate(RESULTS, jsons)
    n = sum(len(r.measurements) for r in records)
    print(f"{len(paths)} uncited files ({len(jsons)} JSON, {len(records)} results documents, "
          f"{n} raw measurements)")
    for p in paths:
        print(f"  {p}")
    if not args.write:
        return 0
    dataset = RESULTS / CONSOLIDATED
    new = {r.path for r in records}
    kept = [r for r in read_consolidated(dataset)  # a file back in the tree replaces its record
            if r.path not in new and not (RESULTS / r.path).exists()]
    total = write_consolidated(kept + records, dataset)
    print(f"wrote {dataset.relative_to(ROOT)}: {len(kept) + len(records)} files, {total} "
          "measurements")
    if args.remove and paths:
        subprocess.run(["git", "rm", "-q", "--", *paths], cwd=ROOT, check=True)
        print(f"git rm: {len(paths)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
