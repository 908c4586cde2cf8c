"""The SASS of a compiled cubin, per kernel, without a GPU (nvdisasm).

`kernel_instructions(cubin)` disassembles with nvdisasm (on PATH, or from the
`nvidia-cuda-nvdisasm` wheel) and returns each kernel's instructions in order, addresses
dropped and branch labels renumbered per kernel, so two compiles of the same kernel compare
equal wherever the kernel sits in its cubin; `sass_summary` gives their count and a digest.
Used to check that a change of the templates leaves a kernel's machine code alone
(benchmarks/sass_check.py) and to count instructions (benchmarks/sass_stats.py).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"\.L_x_\d+")


def nvdisasm_path() -> str | None:
    """nvdisasm on PATH or inside the nvidia-cuda-nvdisasm wheel; None when neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for cand in sorted(Path(root).glob("*/bin/nvdisasm")):
            return str(cand)
    return None


def kernel_instructions(cubin: bytes) -> dict[str, list[str]]:
    """Each kernel's SASS instructions in order (predicates kept), without addresses, branch
    labels renumbered from 0 per kernel (nvdisasm numbers them across the whole cubin).
    RuntimeError without nvdisasm."""
    tool = nvdisasm_path()
    if tool is None:
        raise RuntimeError("nvdisasm not found: put it on PATH or pip install "
                           "nvidia-cuda-nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return {part.split(",", 1)[0]: _renumbered([m[1] for m in _INSTR.finditer(part)])
            for part in text.split("\t.section\t.text.")[1:]}


def _renumbered(instructions: list[str]) -> list[str]:
    """Branch labels renumbered in order of first use."""
    labels: dict[str, str] = {}

    def label(m: re.Match) -> str:
        return labels.setdefault(m[0], f".L{len(labels)}")

    return [_LABEL.sub(label, i) for i in instructions]


def opcodes(instructions: list[str]) -> list[str]:
    """The opcodes of instructions (predicates dropped)."""
    return [re.sub(r"^@!?U?P\w+\s+", "", i).split(" ", 1)[0] for i in instructions]


def sass_summary(cubin: bytes) -> dict[str, dict[str, int | str]]:
    """{kernel: {"count": instructions, "digest": sha256 of them (16 hex digits)}}."""
    return {k: {"count": len(v),
                "digest": hashlib.sha256("\n".join(v).encode()).hexdigest()[:16]}
            for k, v in kernel_instructions(cubin).items()}
