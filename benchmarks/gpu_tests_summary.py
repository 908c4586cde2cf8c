"""Summarize a device call's GPU test runs as one results file ("benchmark": "gpu_tests").

    python benchmarks/gpu_tests_summary.py $OUT/logs/*.xml --out $OUT        # on the device
    python benchmarks/gpu_tests_summary.py --log tests.log --gpu "NVIDIA H200" \\
        --versions '{"torch": "2.11.0+cu130", "lowbit": "bb21add"}' --stamp 20261127-1801

Each pytest run becomes one row {step, files, tests, passed, failed, errors, skipped,
duration_s, complete}: from its JUnit XML (`pytest --junitxml`: the counts and time of its
test suites, the test files of its test cases) or, for runs that left only their terminal
output, from pytest's closing summary line ("340 passed in 221.70s"), else from the progress
characters of a log cut before it (`complete` false; `duration_s` null). The file records the
GPU, date and versions (`benchmarks/common.py`'s, unless given) and goes into --out (default
$LOWBIT_RESULTS_DIR or benchmarks/results/<gpu>/, as every results file); the raw logs stay
out of the tree. BENCHMARKS.md's "GPU tests" table cites these files.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
_SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s")
_PROGRESS = re.compile(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?\s*$")
_FILE = re.compile(r"\b(tests/[\w/]+\.py)\b")


def row(step: str, files: list[str], passed: int, failed: int, errors: int, skipped: int,
        duration_s: float | None, complete: bool = True) -> dict:
    return {"step": step, "files": sorted(set(files)),
            "tests": passed + failed + errors + skipped, "passed": passed, "failed": failed,
            "errors": errors, "skipped": skipped,
            "duration_s": None if duration_s is None else round(duration_s, 2),
            "complete": complete}


def from_junit(path: Path) -> dict:
    """One row from a `pytest --junitxml` file (its test suites summed)."""
    tree = ET.parse(path).getroot()
    suites = [tree] if tree.tag == "testsuite" else tree.findall("testsuite")
    if not suites:
        raise ValueError(f"{path}: no <testsuite> element (not a JUnit XML file)")
    n = {k: sum(int(s.get(k, 0)) for s in suites)
         for k in ("tests", "failures", "errors", "skipped")}
    files = []
    for case in tree.iter("testcase"):
        if case.get("file"):
            files.append(case.get("file"))
        elif case.get("classname"):  # "tests.test_x" or "tests.test_x.TestClass"
            parts = case.get("classname").split(".")
            while parts and not parts[-1].startswith("test_"):
                parts.pop()
            if parts:
                files.append("/".join(parts) + ".py")
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return row(path.stem, files, passed, n["failures"], n["errors"], n["skipped"],
               sum(float(s.get("time", 0)) for s in suites))


def from_log(text: str, step: str) -> dict:
    """One row from pytest's terminal output: its last summary line, or (a log cut before
    it) its progress characters, `complete` false."""
    files = _FILE.findall(text)
    lines = text.splitlines()
    for line in reversed(lines):
        m = _SUMMARY.match(line.strip())
        if m:
            c = {kind.rstrip("s") if kind.startswith("error") else kind: int(k)
                 for k, kind in _COUNT.findall(m[1])}
            return row(step, files, c.get("passed", 0), c.get("failed", 0),
                       c.get("error", 0), c.get("skipped", 0), float(m[2]))
    marks = "".join(m[1] for line in lines if (m := _PROGRESS.match(line.strip())))
    if not marks:
        raise ValueError(f"{step}: neither a pytest summary line nor progress output")
    return row(step, files, marks.count(".") + marks.count("x") + marks.count("X"),
               marks.count("F"), marks.count("E"), marks.count("s"), None, complete=False)


def document(rows: list[dict], gpu: str, date: str, versions: dict) -> dict:
    return {"benchmark": "gpu_tests", "gpu": gpu, "date": date, "versions": versions,
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path, nargs="*", help="pytest --junitxml files")
    ap.add_argument("--log", type=Path, nargs="*", default=[],
                    help="pytest terminal logs (runs without a JUnit file)")
    ap.add_argument("--step", default=None, help="the logs' step name (default: file stem)")
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    ap.add_argument("--gpu", default=None, help="GPU name (default: this machine's)")
    ap.add_argument("--versions", default=None, help="JSON object (default: this machine's)")
    ap.add_argument("--date", default=None, help="YYYY-MM-DD (default: today)")
    ap.add_argument("--stamp", default=None, help="file stamp (default: now)")
    args = ap.parse_args(argv)
    rows = [from_junit(p) for p in sorted(args.junit)]
    rows += [from_log(p.read_text(errors="replace"), args.step or p.stem) for p in args.log]
    if not rows:
        ap.error("no JUnit files or logs given")
    if args.gpu is None or args.versions is None or args.out is None:
        import common  # torch and the GPU: only where the caller did not name them

    gpu = args.gpu or common.gpu_name()
    versions = json.loads(args.versions) if args.versions else common.versions()
    out = args.out or common.results_dir()
    now = _dt.datetime.now()
    stamp = args.stamp or now.strftime("%Y%m%d-%H%M%S")
    date = args.date or (f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}" if args.stamp
                         else now.date().isoformat())
    path = out / f"gpu_tests-{stamp}.json"
    path.write_text(json.dumps(document(rows, gpu, date, versions), indent=1) + "\n")
    print(f"wrote {path}")
    for r in rows:
        print(f"  {r['step']:24s} {r['passed']:5d} passed {r['failed']:3d} failed "
              f"{r['errors']:3d} errors {r['skipped']:3d} skipped "
              f"{r['duration_s'] if r['duration_s'] is not None else '-'} s")
    return 0 if all(r["failed"] == r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
