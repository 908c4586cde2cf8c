"""benchmarks/tuning.py measure: every config of a whole space gets a row (a time or why it
failed), with stand-ins for the compile pool and the measuring worker (no GPU); the tables
land as measurement rows of their template and workload."""

from __future__ import annotations

import json
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lowbit.core import Config
from lowbit.kernels import get_template, load_backends
from lowbit.perfmodel.dataset import load_results, table_spaces
from lowbit.tune.measure import MeasureEnvironmentError, Measurer, MeasureResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tuning

load_backends()


def _pick(cfg: Config, mod: int, rest: int) -> bool:
    """A fixed pseudo-random subset of configs (crc32 of the config's JSON)."""
    return zlib.crc32(cfg.to_json().encode()) % mod == rest


def fake_us(cfg: Config) -> float:
    return 5.0 + zlib.crc32(cfg.to_json().encode()) % 1000 / 10


class FakeMeasurer(Measurer):
    """Times from `fake_us`; "wrong" and "crash" results for fixed subsets (what the real
    worker reports); `delay_s` per config; `hook(n)` after the n-th result."""

    def __init__(self, delay_s: float = 0.0, hook=None, fail_after: int | None = None) -> None:
        self.delay_s, self.hook, self.fail_after = delay_s, hook, fail_after
        self.measured: list[Config] = []

    def env(self) -> dict[str, str]:
        return {"gpu": "fake"}

    def measure(self, inputs, on_result=None):
        out = []
        for inp in inputs:
            if self.fail_after is not None and len(self.measured) >= self.fail_after:
                raise MeasureEnvironmentError("fake device lost")
            time.sleep(self.delay_s)
            c = inp.config
            if _pick(c, 97, 1):
                res = MeasureResult(inp.template.name, inp.workload.key, c, None,
                                    "wrong: 3 of 100 elements differ from the reference")
            elif _pick(c, 97, 2):
                res = MeasureResult(inp.template.name, inp.workload.key, c, None,
                                    "crash: worker died (killed by SIGSEGV)")
            else:
                res = MeasureResult(inp.template.name, inp.workload.key, c, fake_us(c))
            self.measured.append(c)
            out.append(res)
            if on_result is not None:
                on_result(res)
            if self.hook is not None:
                self.hook(len(self.measured))
        return out


def fake_compile(template: str, wl_json: str, cfg_json: str) -> str | None:
    return "OutOfResources: shared memory" if _pick(Config.from_json(cfg_json), 97, 0) \
        else None


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_RESULTS_DIR", str(tmp_path))
    return tmp_path


def _run(**kw) -> dict:
    with ThreadPoolExecutor(4) as pool:
        kw.setdefault("measurer", FakeMeasurer())
        kw.setdefault("compile_one", fake_compile)
        path = tuning.measure(kw.pop("budget_s", 300.0), 4, pool=pool, **kw)
    assert path.name.startswith("tables-")
    return json.loads(path.read_text())


@pytest.mark.parametrize("template,suite,layer,precision,size", [
    ("triton.conv2d_int8_tma", "resnet18_b8", "resnet18_56x56_64to64_s1", "w8a8", 1776),
    ("cuda.bitserial_wgmma", "perfmodel_new", "mbv2_pw_28_144to32_b8", "w1a2", 1352)])
def test_measure_gives_every_config_of_a_1000_plus_space_a_row(results, template, suite,
                                                                 layer, precision, size):
    doc = _run(only=[layer], template=template, suites=[suite], precision=precision)
    (entry,) = doc["layers"]
    (name, wl), = tuning.space_layers([suite], [layer], precision)
    space = list(get_template(template).space(wl))
    assert len(space) == size == entry["space_size"] == entry["measured"]
    assert entry["workload"] == name and entry["key"] == wl.key and entry["template"] == template
    table = {Config(c): (t, e) for c, t, e in entry["table"]}
    assert len(table) == len(entry["table"]) == size and set(table) == set(space)
    for cfg, (t, err) in table.items():
        if _pick(cfg, 97, 0):
            assert t is None and err.startswith("compile: OutOfResources")
        elif _pick(cfg, 97, 1) or _pick(cfg, 97, 2):
            assert t is None and err.split(":")[0] in ("wrong", "crash")
        else:
            assert err is None and t == fake_us(cfg)
    ok = [t for t, e in table.values() if e is None]
    assert entry["exhaustive"] and entry["failed"] == size - len(ok) > 0
    assert entry["best_us"] == min(ok)
    assert doc["template"] == template and doc["timing"]["rep_ms"] == 15.0
    # the tables land as measurement rows of this template and workload (configs complete)
    ms = load_results(results)
    assert len(ms) == len(ok)
    assert {(m.template, m.workload.key, m.timing) for m in ms} == {(template, wl.key,
                                                                     "events")}
    assert {m.config: m.time_us for m in ms} == {c: t for c, (t, e) in table.items()
                                                if e is None}
    info = table_spaces(results)[(doc["gpu"], template, wl.key)]
    assert info["exhaustive"] and info["space_size"] == size
    assert info["failed"] == entry["failed"] and info["layer"] == name


def test_a_cut_run_keeps_its_rows_and_saves_within_a_layer(results):
    seen: dict[int, int] = {}

    def hook(n: int) -> None:  # what a reader of the file sees while the layer runs
        if n == 40:
            (path,) = results.glob("tables-*.json")
            seen[n] = len(json.loads(path.read_text())["layers"][0]["table"])

    doc = _run(only=["tvm_tutorial_14x14_256to512"], suites=["tvm_tutorial"], budget_s=2.5,
               measurer=FakeMeasurer(delay_s=0.02, hook=hook), save_every_s=0.05)
    (entry,) = doc["layers"]
    # saved within the layer (the file also holds the build failures seen by then)
    assert 0 < seen[40] < entry["measured"]
    assert 40 < entry["measured"] < entry["space_size"] == 396  # cut by the budget
    assert not entry["exhaustive"] and entry["cut"] == "budget spent"
    info = next(iter(table_spaces(results).values()))
    assert not info["exhaustive"] and info["measured"] == entry["measured"]


def test_a_hung_build_and_a_lost_device_do_not_stop_the_run(results):
    hung = []

    def compile_one(template: str, wl_json: str, cfg_json: str) -> str | None:
        if not hung:  # the first build never finishes (within the test)
            hung.append(Config.from_json(cfg_json))
            time.sleep(3)
        return fake_compile(template, wl_json, cfg_json)

    measurer = FakeMeasurer()
    doc = _run(only=["resnet50_s4_3x3", "resnet50_s5_3x3"], suites=["resnet50_3x3_b16"],
               compile_one=compile_one, stall_s=0.5, measurer=measurer)
    first, second = doc["layers"]
    assert first["unbuilt"] == 1 and hung[0] in measurer.measured  # the worker built it
    assert hung[0] in {Config(c) for c, _, _ in first["table"]}
    assert first["exhaustive"] and second["exhaustive"] and "unbuilt" not in second
    # the device lost after 100 results: the layer stops there, the next one still runs
    doc = _run(only=["resnet50_s4_3x3", "resnet50_s5_3x3"], suites=["resnet50_3x3_b16"],
               measurer=FakeMeasurer(fail_after=100))
    first, second = doc["layers"]
    assert "fake device lost" in first["error"] and not first["exhaustive"]
    assert first["measured"] >= 100 - 8  # the results before the error are kept
    assert "fake device lost" in second["error"] and second["measured"] >= 0


#: the config whose build kills its process (`crash_compile`)
CRASHER = Config(BLOCK_K=64, BLOCK_M=64, BLOCK_N=256, GROUP_M=8, LOOP_ORDER="rsc", SPLIT_K=1,
                 num_stages=3, num_warps=4)


def crash_compile(template: str, wl_json: str, cfg_json: str) -> str | None:
    """A build whose compiler kills its process (for `CRASHER`), in a `BuildPool` process."""
    import os

    if Config.from_json(cfg_json) == CRASHER:
        os._exit(3)
    return fake_compile(template, wl_json, cfg_json)


def test_a_build_that_kills_its_process_costs_only_its_own_build(results):
    """The real spawn `BuildPool`: a build that kills its process fails its own config (a
    row), the process is replaced, and every other config is built and measured."""
    measurer = FakeMeasurer()
    pool = tuning.BuildPool(2)
    try:
        path = tuning.measure(300.0, 2, ["tvm_tutorial_14x14_256to512"], suites=["tvm_tutorial"],
                              measurer=measurer, pool=pool, compile_one=crash_compile)
    finally:
        pool.shutdown()
    (entry,) = json.loads(path.read_text())["layers"]
    rows = {Config(c): e for c, _, e in entry["table"]}
    assert rows[CRASHER].startswith("compile: crash: the build process died (exit code 3)")
    assert CRASHER not in measurer.measured and "unbuilt" not in entry
    assert len(measurer.measured) == 396 - 1 - sum(_pick(c, 97, 0) for c in rows)
    assert entry["exhaustive"] and entry["measured"] == entry["space_size"] == 396
    stuck = tuning.BuildPool(1, timeout_s=0.5)
    try:  # a build that hangs is killed; the next job runs in a fresh process
        slow, fast = stuck.submit(time.sleep, 30), stuck.submit(abs, -3)
        with pytest.raises(TimeoutError, match=r"build over 0\.5 s"):
            slow.result(timeout=120)
        assert fast.result(timeout=120) == 3
    finally:
        stuck.shutdown()


def test_space_layers_names_and_variants():
    names = [n for n, _ in tuning.space_layers()]
    assert len(names) == 9 and names[0] == "resnet50_s2_3x3"  # measure's default layers
    (name, wl), = tuning.space_layers(["perfmodel_new"], ["densenet_56_128to32_b8_w1a2"], "w1a2")
    assert name == "densenet_56_128to32_b8_w1a2"
    assert (wl.w.bits, wl.a.bits, wl.a_layout.value, wl.epilogue.key) == (
        1, 2, "bitplane", "bias+relu->u2/bitplane")
    (_, s8), = tuning.space_layers(["resnet18_b8"], ["resnet18_56x56_64to64_s1"])
    assert s8.epilogue.key == "bias+relu->s8/int8" and s8.a_layout.value == "int8"
    with pytest.raises(SystemExit, match="unknown layers"):
        tuning.space_layers(["resnet18_b8"], ["nope"])


def test_measure_command_line(monkeypatch):
    got = {}
    monkeypatch.setattr(tuning, "measure", lambda *a, **k: got.update(args=a, **k))
    monkeypatch.setattr(tuning.signal, "signal", lambda *a: None)  # leave pytest's handlers
    tuning.main(["measure", "--template", "cuda.bitserial_wgmma", "--suites",
                 "perfmodel_new,resnet18_b8", "--layers", "a,b", "--precision", "w1a2",
                 "--budget-s", "99", "--workers", "14"])
    assert got["args"] == (99.0, 14, ["a", "b"])
    assert (got["template"], got["suites"], got["precision"]) == (
        "cuda.bitserial_wgmma", ["perfmodel_new", "resnet18_b8"], "w1a2")
    tuning.main(["measure"])  # the defaults: measure as before
    assert got["args"] == (480.0, 16, None) and got["template"] == "triton.conv2d_int8"
    assert got["suites"] == list(tuning.SUITES) and got["precision"] == "w8a8"
