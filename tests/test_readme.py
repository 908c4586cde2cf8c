"""README.md runs as pasted: every ```python and ```bash block is extracted and run.

A block may be preceded by a marker comment:
    <!-- readme-test: skip (why) -->   not run (the set-up commands: they install lowbit and run
                                       the whole suite; their text is checked instead)
    <!-- readme-test: gpu -->          a Python block runs only with a CUDA GPU (`gpu` marker);
                                       each command of a shell block must exit 3 without a GPU,
                                       recording nothing (its runs are the GPU benchmarks)
The Python blocks continue one another, as a reader pastes them: they run in order in one fresh
process. Shell commands run in a fresh folder with the user's records database and results
folder pointed into it: a `lowbit ...` command through this checkout's CLI in this process
(typer's CliRunner, the arguments split as the shell splits them), anything else through bash.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"^<!--\s*readme-test:\s*(skip|gpu)\b.*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
#: README's first two lines: the commands, then their comments from one column
_SETUP = [('python3 -m pip install torch==2.13.0 -e . && lowbit demo', "# set up + main job"),
          ('python3 -m pip install torch==2.13.0 -e ".[dev]" && python3 -m pytest -q -n auto '
           '-m "not slow"', "# set up + tests")]
SETUP_COMMANDS = [command.ljust(96) + comment for command, comment in _SETUP]


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    marker: str  # "", "skip" or "gpu"
    line: int


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of `text` with its language and the marker comment just above it
    (blank lines between allowed)."""
    blocks, marker, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            marker = m.group(1)
        fence = FENCE.match(line)
        if fence:
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"README.md line {i + 1}: unclosed code block")
            blocks.append(Block(fence.group(1), "\n".join(lines[i + 1:j]) + "\n", marker, i + 1))
            marker, i = "", j
        elif line.strip() and not m:
            marker = ""
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
RUN = [b for b in BLOCKS if b.lang in ("python", "bash")]


def _env(tmp_path: Path, gpu: bool) -> dict[str, str]:
    """This checkout's lowbit first on the paths; the user's files in `tmp_path`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "lowbit"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lowbit.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
           "LOWBIT_RECORDS": str(tmp_path / "user" / "records.sqlite"),
           "LOWBIT_RESULTS": str(tmp_path / "user" / "results"),
           "LOWBIT_PROGRESS": "0"}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run(args: list[str], tmp_path: Path, gpu: bool = False, timeout: int = 600):
    return subprocess.run(args, cwd=tmp_path, env=_env(tmp_path, gpu), capture_output=True,
                          text=True, timeout=timeout)


def _commands(block: Block) -> list[str]:
    return [ln for ln in block.code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _shell(command: str, tmp_path: Path, monkeypatch) -> tuple[int, str]:
    """(exit code, output) of one README shell command run in `tmp_path`."""
    words = shlex.split(command, comments=True)
    if words[0] != "lowbit":
        done = _run(["bash", "-c", command], tmp_path)
        return done.returncode, done.stdout + done.stderr
    from typer.testing import CliRunner

    from lowbit.cli import app

    monkeypatch.chdir(tmp_path)
    for key, value in _env(tmp_path, gpu=True).items():
        if key.startswith("LOWBIT_"):
            monkeypatch.setenv(key, value)
    result = CliRunner().invoke(app, words[1:])
    return result.exit_code, result.output


def test_the_readme_has_its_blocks_and_keeps_its_first_two_commands():
    langs = [b.lang for b in RUN]
    assert langs.count("python") >= 3 and langs.count("bash") >= 3, langs
    assert {b.marker for b in RUN} <= {"", "skip", "gpu"}
    first = RUN[0]
    assert first.lang == "bash" and first.marker == "skip"
    assert first.code.splitlines() == SETUP_COMMANDS
    assert [b for b in RUN if b.marker == "skip"] == [first]  # nothing else is left out
    # every Python block runs on the CPU or under the gpu marker; every shell command runs on
    # the CPU or is shown to exit 3 there
    assert sum(b.marker == "gpu" for b in RUN if b.lang == "python") >= 1
    assert sum(len(_commands(b)) for b in RUN if b.lang == "bash" and b.marker == "gpu") >= 3


def _python_script(gpu: bool) -> str:
    parts = [f"# README.md line {b.line}\n{b.code}" for b in RUN
             if b.lang == "python" and (b.marker == "" or (gpu and b.marker == "gpu"))]
    return "\n".join(parts)


def test_python_blocks_run_on_the_cpu(tmp_path):
    script = tmp_path / "readme.py"
    script.write_text(_python_script(gpu=False))
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "digits-w2a2.safetensors").is_file()
    assert "reference" in done.stderr  # the CPU ran the plan through the exact reference


@pytest.mark.gpu
def test_python_blocks_run_on_the_gpu(tmp_path):
    script = tmp_path / "readme.py"
    script.write_text(_python_script(gpu=True))
    done = _run([sys.executable, str(script)], tmp_path, gpu=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "exact reference executor" not in done.stderr


def test_shell_blocks_run_on_the_cpu(tmp_path, monkeypatch):
    ran = 0
    for block in RUN:
        if block.lang != "bash" or block.marker:
            continue
        for command in _commands(block):
            code, output = _shell(command, tmp_path, monkeypatch)
            assert code == 0, (command, output[-3000:])
            ran += 1
    assert ran >= 3
    assert (tmp_path / "m.safetensors").is_file()
    assert (tmp_path / "lowbit-report.html").is_file()


def test_gpu_shell_commands_exit_3_without_a_gpu_and_record_nothing(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checked = 0
    for block in RUN:
        if block.lang != "bash" or block.marker != "gpu":
            continue
        for command in _commands(block):
            code, output = _shell(command, tmp_path, monkeypatch)
            assert code == 3, (command, output[-3000:])
            assert "needs a CUDA GPU" in output and "Traceback" not in output
            checked += 1
    assert checked >= 3
    assert not (tmp_path / "user").exists()  # no records database, no results
