"""Crash-isolated measurement on the CPU: bad candidates become recorded failures with their
reason, the worker is replaced, good candidates are verified and timed."""

from __future__ import annotations

import pytest

from lowbit.core import Config
from lowbit.tune import LocalMeasurer, MeasureInput
from test_tune_fakes import BAD_MODES, TINY, BoundTemplate, FakeConvTemplate


@pytest.fixture(scope="module")
def results():
    t = FakeConvTemplate()
    configs = [Config(tile=1, mode=m) for m in BAD_MODES] + [
        Config(tile=n, mode="ok") for n in (1, 2, 3, 4)]
    seen = []
    with LocalMeasurer(device="cpu", compile_workers=1, timeout_s=4, warmup_ms=2,
                       rep_ms=10, seed=11) as m:
        res = m.measure([MeasureInput(t, TINY, c) for c in configs], on_result=seen.append)
        restarts = m.restarts
    return {r.config["mode"] if r.config["mode"] != "ok" else r.config["tile"]: r
            for r in res}, seen, restarts


def test_each_failure_has_its_reason(results):
    by, _, _ = results
    assert by["crash"].error.startswith("crash: worker died (killed by SIGSEGV")
    assert by["hang"].error.startswith("timeout:")
    assert by["wrong"].error.startswith("wrong:")
    assert "differ from the reference" in by["wrong"].error
    assert by["compile_error"].error.startswith("compile: ValueError: ptxas")
    assert by["raise"].error.startswith("launch: RuntimeError")
    for mode in BAD_MODES:
        assert by[mode].time_us is None and not by[mode].ok


def test_worker_replaced_and_good_candidates_timed_in_order(results):
    by, seen, restarts = results
    assert restarts >= 2  # after the crash and after the hang
    times = [by[n].time_us for n in (1, 2, 3, 4)]
    assert all(t is not None and t > 0 for t in times)
    assert times[0] < times[3]  # 48^3 vs 192^3 matmuls: 64x the work
    assert len(seen) == 9  # on_result saw every candidate as it finished
    assert by[1].env["gpu"].startswith("cpu-") and by[1].env["torch"]


def test_the_bound_launcher_is_timed_not_the_checked_call():
    """Kernels with `bind` are timed through its launcher: per-call checks (a device sync on
    a GPU) are host time, not kernel time."""
    with LocalMeasurer(device="cpu", compile_workers=0, warmup_ms=1, rep_ms=5, seed=3) as m:
        (res,) = m.measure([MeasureInput(BoundTemplate(), TINY, Config(tile=1, mode="ok"))])
    assert res.ok, res.error
    assert res.time_us < 40_000  # the call path sleeps 50 ms


def test_precompiled_candidates_are_not_built_again(monkeypatch):
    """`precompile` builds a batch in the pool; measuring the candidates one at a time later
    (the Dask backend's one-candidate tasks) reuses those builds and their failures."""
    t = FakeConvTemplate()
    inputs = [MeasureInput(t, TINY, Config(tile=1, mode=m)) for m in ("compile_error", "ok")]
    with LocalMeasurer(device="cpu", compile_workers=1, warmup_ms=1, rep_ms=5, seed=5) as m:
        m.precompile(inputs)
        assert len(m._built) == 2
        monkeypatch.setattr(m, "_compile", lambda todo: pytest.fail(f"rebuilt {todo}"))
        res = [m.measure([i])[0] for i in inputs]
        assert not m._built
    assert res[0].error.startswith("compile: ValueError: ptxas") and res[0].compile_s
    assert res[1].ok and res[1].compile_s is not None


# ------------------------------------------------------------- environment vs config failures

class ArchKernel:
    """A kernel whose ahead-of-time compile needs an arch (as `MmaConvKernel.compile(arch)`)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def compile(self, arch):
        raise AssertionError("compile(arch) must not be called without an arch")

    def __call__(self, x, w, params):
        return self.inner(x, w, params)


class ArchTemplate(FakeConvTemplate):
    name = "fake.arch"

    def build(self, workload, config):
        return ArchKernel(super().build(workload, config))


def test_a_compile_that_needs_an_arch_is_not_a_failure():
    """Issue: 'one template fails with an internal `MmaConvKernel.compile() missing 1
    required positional argument: 'arch'`' (41 of 192 trials)."""
    inputs = [MeasureInput(ArchTemplate(modes=("ok",)), TINY, Config(tile=t, mode="ok"))
              for t in (1, 2)]
    with LocalMeasurer(device="cpu", compile_workers=1, warmup_ms=1, rep_ms=5, seed=2) as m:
        res = m.measure(inputs)
    assert [r.error for r in res] == [None, None]
    assert all(r.ok for r in res)


def test_cuda_without_a_gpu_is_an_environment_error_before_any_worker():
    from lowbit.tune.measure import MeasureEnvironmentError

    with pytest.raises(MeasureEnvironmentError, match="no CUDA device"):
        LocalMeasurer(device="cuda")
    with pytest.raises(ValueError, match="device must be"):
        LocalMeasurer(device="tpu")


def test_a_worker_that_cannot_start_is_an_environment_error_after_retries():
    from lowbit.tune.measure import MeasureEnvironmentError

    seen = []
    m = LocalMeasurer(device="cpu", compile_workers=0, start_timeout_s=0.01, start_retries=1)
    with m, pytest.raises(MeasureEnvironmentError, match=r"did not start .*\(2 tries\)"):
        m.measure([MeasureInput(FakeConvTemplate(), TINY, Config(tile=1, mode="ok"))],
                  on_result=seen.append)
    assert seen == []  # nothing reported as a config's result


_PARENT = """
import sys, time
sys.path.insert(0, {tests!r})
from lowbit.core import Config
from lowbit.tune import LocalMeasurer, MeasureInput
from test_tune_fakes import TINY, FakeConvTemplate
m = LocalMeasurer(device="cpu", compile_workers=1, warmup_ms=1, rep_ms=2)
m.precompile([MeasureInput(FakeConvTemplate(), TINY, Config(tile=1, mode="ok"))])
m.env()
pids = [m._worker.proc.pid] + [p.pid for p in m._pool._processes.values()]
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\\nState:\\tZ" not in f.read()  # a zombie is dead, only not reaped
    except FileNotFoundError:
        return False


def test_workers_die_with_their_parent():
    """Issue: 'killing `lowbit tune` leaves measurement workers running for minutes'."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = _PARENT.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
