"""benchmarks/gpu_tests_summary.py: pytest runs (JUnit XML or terminal logs) become the rows of
one "gpu_tests" results file, with the counts pytest reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_tests_summary as summary  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7" time="12.5">
<testcase classname="tests.test_stem" name="test_a" time="1.0"/>
<testcase classname="tests.test_stem" name="test_b" time="1.0"><failure message="x"/></testcase>
<testcase classname="tests.test_engine_gpu_cuda.TestNet" name="test_c" time="1.0"/>
</testsuite><testsuite name="more" errors="0" failures="0" skipped="0" tests="3" time="2.5">
<testcase classname="tests.sub.test_deep" name="test_d" time="1.0"/>
</testsuite></testsuites>
"""


def test_junit_counts_and_test_files(tmp_path):
    path = tmp_path / "tests_a.xml"
    path.write_text(JUNIT)
    r = summary.from_junit(path)
    assert r == {"step": "tests_a", "files": ["tests/sub/test_deep.py",
                                              "tests/test_engine_gpu_cuda.py",
                                              "tests/test_stem.py"],
                 "tests": 10, "passed": 6, "failed": 1, "errors": 1, "skipped": 2,
                 "duration_s": 15.0, "complete": True}
    (tmp_path / "bad.xml").write_text("<nothing/>")
    with pytest.raises(ValueError, match="no <testsuite>"):
        summary.from_junit(tmp_path / "bad.xml")


@pytest.mark.parametrize(("text", "counts", "seconds"), [
    ("....\n340 passed in 221.70s (0:03:41)\n", (340, 0, 0, 0), 221.7),
    ("tests/test_x.py::t PASSED\n=== 1 failed, 30 passed, 2 skipped, 1 error in 8.5s ===\n",
     (30, 1, 1, 2), 8.5),
    ("=========== 35 passed, 3 deselected in 81.59s (0:01:21) ===========", (35, 0, 0, 0),
     81.59),
])
def test_log_summary_line(text, counts, seconds):
    r = summary.from_log(text, "tests")
    assert (r["passed"], r["failed"], r["errors"], r["skipped"]) == counts
    assert r["duration_s"] == seconds and r["complete"]
    assert r["tests"] == sum(counts)


def test_a_cut_log_counts_its_progress_marks():
    text = ("bringing up nodes...\n" + "." * 72 + " [ 13%]\n" + ".F.s" * 18 + " [ 26%]\n"
            "..E\n")
    r = summary.from_log(text, "tests")
    assert (r["passed"], r["failed"], r["errors"], r["skipped"]) == (72 + 36 + 2, 18, 1, 18)
    assert r["duration_s"] is None and not r["complete"]
    with pytest.raises(ValueError, match="neither a pytest summary"):
        summary.from_log("ImportError: no module\n", "tests")


def test_main_writes_one_results_file(tmp_path):
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.log").write_text("5 passed in 1.00s\n")
    rc = summary.main([str(tmp_path / "a.xml"), "--log", str(tmp_path / "b.log"),
                       "--out", str(tmp_path), "--gpu", "NVIDIA X", "--versions",
                       '{"lowbit": "abc1234"}', "--stamp", "20261127-1801"])
    assert rc == 1  # a failure and an error in a.xml
    doc = json.loads((tmp_path / "gpu_tests-20261127-1801.json").read_text())
    assert {k: doc[k] for k in ("benchmark", "gpu", "date", "versions")} == {
        "benchmark": "gpu_tests", "gpu": "NVIDIA X", "date": "2026-11-27",
        "versions": {"lowbit": "abc1234"}}
    assert [(r["step"], r["passed"]) for r in doc["rows"]] == [("a", 6), ("b", 5)]
