"""Compile the Triton kernels of a built lowbit kernel for an NVIDIA GPU on a machine without
one: the launches of `kernel.compile_on("cpu")` are captured (`igemm.launch_or_compile`) and
each is compiled with `triton.compile` for `GPUTarget("cuda", 90, 32)`, specialized the way
Triton's launcher specializes (integers equal to 1 become constants, pointers and integers
divisible by 16 carry that hint; a tuple argument element by element). The interpreter runs
the kernel logic but not Triton's compiler, which rejects some programs the interpreter
accepts (a loop-carried variable changing type, for one); this catches those before a GPU
run.

Triton's compiler cannot run under TRITON_INTERPRET=1 (which the CPU test session sets), so
tests call `compile_in_subprocess(cases)`: a fresh interpreter with it unset compiles each
(template, workload, config) and reports what the PTX and ptxas show.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

OPTIONS = ("num_warps", "num_stages")


def captured_launches(kernel, requant: int | None = None) -> list[tuple]:
    """(JITFunction, args, kwargs) of each launch `kernel.compile_on("cpu")` makes."""
    import lowbit.kernels.triton.igemm as igemm

    calls: list[tuple] = []

    def record(fn, grid, args, kwargs, compile_only):
        calls.append((fn, args, kwargs))

    real = igemm.launch_or_compile
    igemm.launch_or_compile = record
    try:
        if requant is None:
            kernel.compile_on("cpu")
        else:
            kernel.compile_on("cpu", requant)
    finally:
        igemm.launch_or_compile = real
    return calls


def _source(fn, args: tuple, kwargs: dict):
    import torch
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    names = fn.arg_names
    values = dict(zip(names, args, strict=False))
    values.update({k: v for k, v in kwargs.items() if k not in OPTIONS})
    signature, constexprs, attrs = {}, {}, {}
    def argument(v, path: tuple) -> str | tuple:
        """The signature entry of the value at `path` (a tuple: one per element)."""
        if isinstance(v, tuple):
            return tuple(argument(x, (*path, j)) for j, x in enumerate(v))
        if v is None or (isinstance(v, int) and v == 1 and not isinstance(v, bool)):
            constexprs[path] = v
            return "constexpr"
        aligned = (v.data_ptr() % 16 == 0 if isinstance(v, torch.Tensor)
                   else isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0)
        if aligned:
            attrs[path] = [["tt.divisibility", 16]]
        return mangle_type(v)

    for i, name in enumerate(names):
        if fn.params[i].is_constexpr:
            signature[name] = "constexpr"
            constexprs[(i,)] = values[name]
        else:
            signature[name] = argument(values[name], (i,))
    options = {k: kwargs[k] for k in OPTIONS if k in kwargs}
    return ASTSource(fn, signature, constexprs, attrs), options


def compile_sm90(kernel, requant: int | None = None) -> list:
    """Triton's CompiledKernel (asm["ptx"], asm["cubin"], metadata) of each launch;
    requant: the shifted-bias form (`IgemmKernel.compile_on`)."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    return [triton.compile(src, target=target, options=opts)
            for src, opts in (_source(*call) for call in captured_launches(kernel, requant))]


def ptxas_usage(compiled) -> tuple[int, int]:
    """(registers per thread, spill-store bytes) that the ptxas Triton itself uses for sm_90
    reports."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    try:
        info = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                              capture_output=True, text=True, check=True).stderr
    finally:
        os.unlink(f.name)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spill = re.search(r"(\d+) bytes spill stores", info)
    return regs, int(spill.group(1)) if spill else 0


def cvt_f64(ptx: str) -> int:
    """The float64 conversions and roundings in PTX (sm_90 runs them at a quarter of the
    integer rate)."""
    return len(re.findall(r"\bcvt(?:\.[a-z0-9]+)*\.f64\b", ptx))


def report(template: str, workload_json: str, config_json: str,
           requant: int | None = None) -> list[dict]:
    """Per launch of the built kernel (its shifted-bias epilogue in the `requant` form, as
    `IgemmKernel.compile_on`): name, registers, spill bytes and PTX instruction counts the
    tests look at."""
    import lowbit.kernels.triton  # noqa: F401  (registers the templates)
    from lowbit.core import Config, workload_from_json
    from lowbit.kernels import get_template

    kernel = get_template(template).build(workload_from_json(workload_json),
                                          Config.from_json(config_json))
    out = []
    for ck in compile_sm90(kernel, requant):
        ptx = ck.asm["ptx"]
        regs, spill = ptxas_usage(ck)
        out.append({"name": ck.metadata.name, "regs": regs, "spill_bytes": spill,
                    "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
                    "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                    "acq_rel_atomics": len(re.findall(r"atom\.global\.gpu\.acq_rel", ptx)),
                    "mma_sync": len(re.findall(r"mma\.sync", ptx)),
                    "cp_async_bytes": sorted({int(b, 0) for b in re.findall(
                        r"cp\.async\.c[ag]\.shared\.global[^;]*?,\s*(0x[0-9a-f]+|\d+)", ptx)}),
                    "byte_loads": len(re.findall(r"ld\.global[.a-z0-9:]*\.[us]8\b", ptx)),
                    "dp4a": len(re.findall(r"\bdp4a\.", ptx)),
                    "prmt": len(re.findall(r"\bprmt\.b32\b", ptx)),
                    "cvt_f64": cvt_f64(ptx)})
    return out


def compile_in_subprocess(cases: list[tuple], timeout_s: float = 600
                          ) -> list[list[dict] | str]:
    """`report` of each (template, workload JSON, config JSON[, requant form]) case, computed
    in a fresh Python without TRITON_INTERPRET; a case that fails gives its error text
    instead."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())],
                          input=json.dumps(cases), capture_output=True, text=True, env=env,
                          timeout=timeout_s)
    if proc.returncode:
        raise RuntimeError(f"offline compile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def launcher_report(launchers: dict) -> dict:
    """{name: [{kernel, regs, spill_bytes} per launch] or the error text} of bound Triton
    launchers (`kernels.triton.stored.Launcher`), each launch compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget

    out: dict = {}
    for name, launcher in launchers.items():
        try:
            rows = []
            for s in launcher.launches:
                src, opts = _source(s.fn, s.args, s.kwargs)
                ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
                regs, spill = ptxas_usage(ck)
                rows.append({"kernel": s.fn.__name__, "regs": regs, "spill_bytes": spill,
                             "cvt_f64": cvt_f64(ck.asm["ptx"])})
            out[name] = rows
        except Exception as e:  # reported per case
            out[name] = f"{type(e).__name__}: {e}"[:3000]
    return out


def run_module_report(test_file: str, timeout_s: float = 900) -> dict:
    """Run `python test_file` (which prints `launcher_report(...)` as its last line) in a
    fresh Python without TRITON_INTERPRET, tests/ on its path; its JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = Path(test_file).resolve()
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(here)], capture_output=True, text=True, env=env,
                          timeout=timeout_s)
    if proc.returncode:
        raise RuntimeError(f"offline compile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def module_report_or_skip(test_file: str) -> dict:
    """`run_module_report(test_file)`; the calling test skipped where this Triton bundles no
    NVIDIA tools (ptxas)."""
    import pytest
    import triton

    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(test_file)


def one_launch_rows(report: dict, cases, kernel: str) -> dict:
    """{case: its launch's row} of a `launcher_report`, after checking that every one of
    `cases` compiled to one launch of `kernel` without spill."""
    failed = {k: v for k, v in report.items() if not isinstance(v, list)}
    assert not failed, failed
    assert sorted(report) == sorted(cases)
    rows = {k: r for k, (r,) in report.items()}
    assert {r["kernel"] for r in rows.values()} == {kernel}
    assert all(r["spill_bytes"] == 0 for r in rows.values()), rows
    return rows


def _main() -> None:
    results: list = []
    for case in json.loads(sys.stdin.read()):
        try:
            results.append(report(*case))
        except Exception as e:  # reported per case, the test names it
            results.append(f"{type(e).__name__}: {e}"[:2000])
    print(json.dumps(results))


if __name__ == "__main__":
    _main()
