"""References that cannot go stale: every file, Markdown document and NOTES / BENCHMARKS section
that the docs, docstrings and comments cite exists.

Read: README.md, NOTES.md, BENCHMARKS.md and docs/**/*.md whole; the docstrings and comments of
the .py files under src/, benchmarks/ and tests/; the .cu and .sh files whole. Checked:

- a backticked path: text in backticks that ends in a file extension (`EXTENSIONS`) or is a
  folder ending in "/", with no spaces or pattern characters (`benchmarks/results/<gpu>/*.json`
  is a pattern, not a path); a `::test` or `:line` suffix is dropped. It resolves against the
  repository root, lowbit's package (src/lowbit), the citing file's folder or docs/; a bare file
  name (no "/") also as any file of that name under src, benchmarks, tests or docs; a results
  file (`name-YYYYMMDD...`) also as one committed under benchmarks/results/ and since moved out
  (git history keeps it: docs/history/README.md says how to read one);
- a Markdown document named anywhere (in backticks, a link or plain text), resolved the same
  way;
- a section: NOTES.md or BENCHMARKS.md followed by a quoted text (NOTES.md "Stem",
  BENCHMARKS.md, "Whole networks") names a heading of that file that starts with the text.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "lowbit"
EXTENSIONS = (".py", ".cu", ".md", ".json", ".jsonl", ".sh", ".toml", ".gz", ".png", ".txt")
DOCS = [ROOT / "README.md", ROOT / "NOTES.md", ROOT / "BENCHMARKS.md",
        *sorted((ROOT / "docs").rglob("*.md"))]
CODE = [p for folder in ("src", "benchmarks", "tests") for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".cu", ".sh") and "results" not in p.relative_to(ROOT).parts]
SOURCE_FOLDERS = ("src", "benchmarks", "tests", "docs")
BACKTICKED = re.compile(r"`([^`\n]+)`")
MARKDOWN = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b")
SECTION = re.compile(r"\b(NOTES|BENCHMARKS)(?:\.md)?,?\s+(?:section\s+)?[\"“]([^\"”\n]+)[\"”]")
RESULTS_FILE = re.compile(r"^[a-z0-9_]+-\d{8}[\w-]*\.(json|png)$")
NOT_A_PATH = set(" <>*{}$()[]|=,'\"")


def cited_text(path: Path) -> str:
    """What a file says to its reader: a .py file's docstrings and comments, else its text."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (
                tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(
                    ('"""', "'''"))):
            out.append(tok.string)
    return "\n".join(out)


@cache
def files_named() -> dict[str, list[Path]]:
    names: dict[str, list[Path]] = {}
    for folder in SOURCE_FOLDERS:
        for p in (ROOT / folder).rglob("*"):
            names.setdefault(p.name, []).append(p)
    return names


@cache
def committed_results() -> frozenset[str]:
    """Names of every file ever committed under benchmarks/results/ (git history)."""
    try:
        out = subprocess.run(["git", "log", "--all", "--name-only", "--format=", "--",
                              "benchmarks/results"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(Path(line).name for line in out.splitlines() if line.strip())


def resolves(ref: str, citing: Path) -> bool:
    ref = re.sub(r"::.*$", "", ref)
    ref = re.sub(r":\d+(-\d+)?$", "", ref)
    if any((base / ref).exists() for base in (ROOT, PACKAGE, citing.parent, ROOT / "docs")):
        return True
    name = ref.rstrip("/")
    if "/" not in name and name in files_named():
        return True
    return bool(RESULTS_FILE.match(Path(name).name)) and Path(name).name in committed_results()


def cited_path(text: str) -> str | None:
    """The path a backticked text names, None when it is no path (module doc)."""
    text = text.strip()
    if NOT_A_PATH & set(text) or text.startswith(("-", ".", "http", "lowbit.")):
        return None
    if (text.endswith("/") and "/" in text[:-1]) or text.endswith(EXTENSIONS):
        return text
    return None


def stale_references(path: Path, text: str) -> list[str]:
    where = path.relative_to(ROOT)
    out = []
    for m in BACKTICKED.finditer(text):
        ref = cited_path(m.group(1))
        if ref is not None and not resolves(ref, path):
            out.append(f"{where}: `{ref}`")
    for m in MARKDOWN.finditer(text):
        if not resolves(m.group(1), path):
            out.append(f"{where}: {m.group(1)}")
    for m in SECTION.finditer(text):
        doc, section = m.group(1), m.group(2).strip()
        if not any(h.lower().startswith(section.lower()) for h in headings(doc)):
            out.append(f"{where}: {doc}.md section {section!r}")
    return out


@cache
def headings(doc: str) -> tuple[str, ...]:
    lines = (ROOT / f"{doc}.md").read_text().splitlines()
    return tuple(re.sub(r"^#+\s*", "", line).strip() for line in lines if line.startswith("#"))


def test_every_cited_file_document_and_section_exists():
    stale = sorted({ref for p in DOCS + CODE for ref in stale_references(p, cited_text(p))})
    assert not stale, "references to files, documents or sections that do not exist:\n" + \
        "\n".join(stale)


def test_the_reader_finds_each_kind_of_reference(tmp_path):
    """Each kind of stale reference is reported, and live ones are not (so a pass means
    something)."""
    citing = ROOT / "tests" / "test_references.py"
    text = ("`benchmarks/no_such_script.py` `kernels/cuda/nvrtc.py` `docs/history/` `nvrtc.py` "
            "`no_such_file.cu` `benchmarks/results/<gpu>/*.json` `lowbit.core.space` "
            "see NO_SUCH_GUIDE.md and README.md; NOTES.md \"Stem\", NOTES.md, \"No such section\"; "
            "`tests/test_core.py::test_parse_errors` `no_such_run-20990101-000000.json`")
    got = stale_references(citing, text)
    assert got == ["tests/test_references.py: `benchmarks/no_such_script.py`",
                   "tests/test_references.py: `no_such_file.cu`",
                   "tests/test_references.py: `no_such_run-20990101-000000.json`",
                   "tests/test_references.py: NO_SUCH_GUIDE.md",
                   "tests/test_references.py: NOTES.md section 'No such section'"]
    assert len(DOCS) >= 8 and len(CODE) > 300
