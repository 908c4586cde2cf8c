"""The CPU tier's sampling (conftest.py): every sampled test exists, and the hook keeps the
first of every SAMPLE_EVERY cases of a sampled test and leaves other tests alone."""

from __future__ import annotations

from pathlib import Path

from conftest import SAMPLE_EVERY, SAMPLED, sample_cases

ROOT = Path(__file__).resolve().parents[1]


def test_every_sampled_test_exists():
    for name in sorted(SAMPLED):
        path, func = name.split("::")
        assert f"def {func}(" in (ROOT / path).read_text(), name
    assert len(SAMPLED) >= 40


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid, self.marks = nodeid, []

    def add_marker(self, mark: object) -> None:
        self.marks.append(mark)


def test_sampling_keeps_every_nth_case_of_sampled_tests_only():
    sampled = sorted(SAMPLED)[0]
    cases = [_Item(f"{sampled}[{i}]") for i in range(2 * SAMPLE_EVERY + 1)]
    others = [_Item("tests/test_x.py::test_y[0]"), _Item("tests/test_x.py::test_y[1]"),
              _Item(sampled)]  # an unparametrized id is never sampled
    marked = sample_cases(cases + others)
    kept = [i for i, c in enumerate(cases) if not c.marks]
    assert kept == [0, SAMPLE_EVERY, 2 * SAMPLE_EVERY]
    assert marked == len(cases) - 3
    assert all(m.name == "slow" for c in cases for m in c.marks)
    assert not any(o.marks for o in others)
