"""Fake kernel templates for the tuner tests (CPU): a stand-in whose time comes from a torch
op sized by a knob, plus candidates that crash the process (out-of-bounds write), hang,
return wrong values, fail to build or raise at launch. Importable by the spawned measuring
workers (this module lives on the test session's sys.path)."""

from __future__ import annotations

import ctypes
import os
import time

import torch

from lowbit.core import Config, ConfigSpace, ConvWorkload, Knob, Workload
from lowbit.kernels.base import KernelTemplate
from lowbit.reference import random_inputs, run

TINY = ConvWorkload(N=1, H=5, W=5, C=8, K=8, R=3, S=3, stride=1, pad=1)
BAD_MODES = ("crash", "hang", "wrong", "compile_error", "raise")


class StandInKernel:
    """Exact output (the reference) plus `tile`-sized matmul work: time grows with tile."""

    def __init__(self, workload: Workload, config: Config) -> None:
        self.workload, self.config = workload, config
        # cubic in tile: 96 x tile keeps tile 2 vs 3 apart by ~3x even when two measurers
        # share two CPU cores (48 x tile let noise reorder them: test_tune_dask flaked)
        n = 96 * int(config["tile"])
        self._a = torch.randn(n, n)

    def __call__(self, x, w, params):
        mode = self.config["mode"]
        if mode == "crash":  # write to an unmapped address: SIGSEGV kills the process
            ctypes.memset(16, 0, 1 << 16)
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise RuntimeError("launch failed: too many resources requested")
        for _ in range(4):
            torch.mm(self._a, self._a)
        out = run(self.workload, x, w, params)
        if mode == "wrong":
            out = out.clone()
            out.view(-1)[::7] += 1
        return out


class CheckedCallKernel(StandInKernel):
    """A call path that spends 50 ms of host time in checks, and a bound launcher that does
    not: a measurer that times the call would rank this kernel by its checks."""

    def __call__(self, x, w, params):
        time.sleep(0.05)
        return super().__call__(x, w, params)

    def bind(self, x, w, params, out=None):
        return lambda: StandInKernel.__call__(self, x, w, params)


class BoundTemplate(KernelTemplate):
    name = "fake.bound"
    backend = "fake"

    def unsupported_reason(self, workload: Workload) -> str | None:
        return None

    def space(self, workload: Workload) -> ConfigSpace:
        return ConfigSpace([Knob("tile", (1,)), Knob("mode", ("ok",))])

    def default_config(self, workload: Workload) -> Config:
        return Config(tile=1, mode="ok")

    def build(self, workload: Workload, config: Config) -> CheckedCallKernel:
        return CheckedCallKernel(workload, config)


class FakeConvTemplate(KernelTemplate):
    """tile in 1..4 (1 fastest); the bad modes exist only with tile=1 (so they would win)."""

    name = "fake.conv"
    backend = "fake"

    def __init__(self, modes: tuple[str, ...] = ("ok", *BAD_MODES), tiles=(1, 2, 3, 4),
                 name: str | None = None) -> None:
        self.modes, self.tiles = modes, tuple(tiles)
        if name:
            self.name = name

    def unsupported_reason(self, workload: Workload) -> str | None:
        return None if isinstance(workload, ConvWorkload) else "conv only"

    def space(self, workload: Workload) -> ConfigSpace:
        def bad_only_small(c: Config) -> str | None:
            return "bad modes only at tile=1" if c["mode"] != "ok" and c["tile"] != 1 else None

        return ConfigSpace([Knob("tile", self.tiles), Knob("mode", self.modes)],
                           [bad_only_small])

    def default_config(self, workload: Workload) -> Config:
        return Config(tile=self.tiles[-1], mode="ok")

    def build(self, workload: Workload, config: Config) -> StandInKernel:
        if config["mode"] == "compile_error":
            raise ValueError("ptxas: too much shared memory")
        return StandInKernel(workload, config)


class SleepMeasurer:
    """In-process measurer for the kill -9 test: each candidate takes `delay_s`; time = tile."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self.measured: list[Config] = []

    def env(self) -> dict[str, str]:
        return {"gpu": "fake-gpu"}

    def measure(self, inputs, on_result=None):
        from lowbit.tune.measure import MeasureResult

        out = []
        for inp in inputs:
            time.sleep(self.delay_s)
            self.measured.append(inp.config)
            res = MeasureResult(inp.template.name, inp.workload.key, inp.config,
                                float(inp.config["tile"]), None, env=self.env())
            out.append(res)
            if on_result:
                on_result(res)
        return out

    def close(self) -> None:
        pass


def test_stand_in_kernel_is_exact_and_bad_modes_are_in_the_space():
    t = FakeConvTemplate()
    space = t.space(TINY)
    assert len(space) == 4 + len(BAD_MODES)
    x, w, p = random_inputs(TINY, seed=3)
    k = t.build(TINY, Config(tile=2, mode="ok"))
    assert torch.equal(k(x, w, p), run(TINY, x, w, p))
    assert os.environ.get("LOWBIT_FAKE_NEVER_SET") is None
