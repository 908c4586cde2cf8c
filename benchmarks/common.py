"""Shared benchmark plumbing: results files in the format of docs/design.md (section 5),
GPU/version info, and the baselines a user would pick instead of lowbit (cuDNN fp16 conv,
im2col + torch._int_mm).

Every benchmark writes one JSON file per run under benchmarks/results/<gpu>/ (or the folder in
$LOWBIT_RESULTS_DIR, e.g. $OUT on the device machine); ratios come from one file only.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F

from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.kernels.timing import time_us
from lowbit.reference import im2col_nhwc

ROOT = Path(__file__).resolve().parent.parent


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def gpu_dirname(name: str | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (results layout: docs/design.md,
    section 5)."""
    return (name or gpu_name()).lower().replace(" ", "-")


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        sha = out.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha or "unknown") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("LOWBIT_GIT_SHA", "unknown")


def source_digest() -> str:
    """First 12 hex digits of the SHA-256 over src/lowbit's .py and .cu files (paths and
    contents): names the code that ran even where the device's copy of .git is stale (the
    device tool has reported an older HEAD than the tree it ran)."""
    h = hashlib.sha256()
    for path in sorted((ROOT / "src" / "lowbit").rglob("*")):
        if path.suffix in (".py", ".cu"):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def versions() -> dict[str, str]:
    import triton

    v = {"torch": torch.__version__, "triton": triton.__version__,
         "cuda": str(torch.version.cuda), "lowbit": os.environ.get("LOWBIT_GIT_SHA", git_sha()),
         "lowbit_src": source_digest()}
    if torch.cuda.is_available():
        try:
            query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            out = subprocess.run(query,
                                 capture_output=True, text=True, timeout=20)
            v["driver"] = out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return v


def results_dir() -> Path:
    d = os.environ.get("LOWBIT_RESULTS_DIR")
    path = Path(d) if d else ROOT / "benchmarks" / "results" / gpu_dirname()
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_results(benchmark: str, rows: list[dict], extra: dict | None = None) -> Path:
    """Write one results file; returns its path."""
    doc = {"benchmark": benchmark, "gpu": gpu_name(), "date": _dt.date.today().isoformat(),
           "versions": versions(), **(extra or {}), "rows": rows}
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = results_dir() / f"{benchmark}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def write_probe(name: str, rows: list[dict]) -> Path:
    """Write a probe's rows (measurement-only variants, not results rows) to $OUT/<name>.json
    (the current folder without $OUT), with "benchmark": name, the date, GPU and versions (the
    form BENCHMARKS.md's probes section reads once committed as <name>-<stamp>.json beside
    the results); returns its path."""
    path = Path(os.environ.get("OUT", ".")) / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "date": _dt.date.today().isoformat(),
                                "gpu": gpu_name(), "versions": versions(), "rows": rows},
                               indent=1))
    return path


def _rand_fp16(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=torch.float16)


def cudnn_fp16_conv_us(wl: ConvWorkload, cuda_graph: bool = False) -> float:
    """PyTorch fp16 conv (cuDNN, channels_last, cudnn.benchmark=True), median us."""
    torch.backends.cudnn.benchmark = True
    x = _rand_fp16((wl.N, wl.C, wl.H, wl.W)).to(memory_format=torch.channels_last)
    w = _rand_fp16((wl.K, wl.C // wl.groups, wl.R, wl.S)).to(memory_format=torch.channels_last)
    fn = lambda: F.conv2d(x, w, stride=wl.stride, padding=wl.pad, groups=wl.groups)  # noqa: E731
    fn()
    return time_us(fn, cuda_graph=cuda_graph)


def fp16_gemm_us(wl: GemmWorkload) -> float:
    a, b = _rand_fp16((wl.M, wl.K)), _rand_fp16((wl.N, wl.K))
    return time_us(lambda: a @ b.T)


def _int_mm_ok(m: int, n: int, k: int) -> bool:
    # torch._int_mm (cuBLASLt) needs m > 16 and k, n multiples of 8
    return m > 16 and k % 8 == 0 and n % 8 == 0


def int_mm_us(wl: GemmWorkload) -> float | None:
    """torch._int_mm on int8 a [M, K] x b^T (cuBLASLt), median us; None if shape unsupported."""
    if not _int_mm_ok(wl.M, wl.N, wl.K):
        return None
    a = torch.randint(-128, 128, (wl.M, wl.K), device="cuda", dtype=torch.int8)
    bt = torch.randint(-128, 128, (wl.N, wl.K), device="cuda", dtype=torch.int8).T
    return time_us(lambda: torch._int_mm(a, bt))


def int_mm_im2col_us(wl: ConvWorkload, cuda_graph: bool = False) -> float | None:
    """int8 im2col (materialized) + torch._int_mm, the int8 conv a PyTorch user can write."""
    m, n, k = wl.gemm_shape
    if not _int_mm_ok(m, n, k):
        return None
    x = torch.randint(-128, 128, (wl.N, wl.H, wl.W, wl.C), device="cuda", dtype=torch.int8)
    wt = torch.randint(-128, 128, (wl.K, k), device="cuda", dtype=torch.int8).T

    def fn() -> torch.Tensor:
        cols = im2col_nhwc(x, wl.R, wl.S, wl.stride, wl.pad).reshape(m, k)
        return torch._int_mm(cols, wt)

    fn()
    return time_us(fn, cuda_graph=cuda_graph)


def table_configs(paths: list[Path], wl, top: int = 6) -> list:
    """The `top` fastest configs of `wl` in exhaustive tuning tables (`tuning.py measure`)."""
    from lowbit.core import Config

    for p in reversed(paths):
        for layer in json.loads(Path(p).read_text())["layers"]:
            if layer["key"] == wl.key:
                ok = sorted((row for row in layer["table"] if row[2] is None),
                            key=lambda row: row[1])
                return [Config(c) for c, _, _ in ok[:top]]
    return []


def tuned_configs(template, wl, trials: int, records: Path, top: int = 6) -> list:
    """The `top` fastest configs a `lowbit.tune.tune` of `trials` finds (records kept in
    `records`, so a rerun resumes instead of measuring again)."""
    from lowbit.tune import RecordsDB, tune

    res = tune(wl, [template], trials=trials, db=records, seed=0, transfer=True,
               progress=False)
    with RecordsDB(records) as db:
        ok = sorted((r for r in db.records(wl)
                     if r.ok and r.template == template.name and r.gpu == res.gpu),
                    key=lambda r: r.time_us)
    return [r.cfg for r in ok[:top]]
