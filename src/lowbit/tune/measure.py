"""Crash-isolated measurement: parallel build, then verify and time in a worker process.

Stage 1 (optional) builds candidates in the build pool (`lowbit.tune.buildpool.BuildPool`,
`compile_workers` processes, one job per process at a time: a build that kills its process or
hangs fails only its own candidate): a template's `build` and, when the kernel has one, its
`compile()` (ahead-of-time compile that fills the on-disk kernel cache so the worker only
loads it). Stage 2 runs each candidate in
one long-lived worker process on the measuring device: build (cache hit), call on fresh random
inputs from `lowbit.reference.random_inputs`, compare bit for bit with `lowbit.reference.run`,
then time (`lowbit.kernels.timing.time_us` on CUDA: warm-up, median of repeats, L2 flushed).

Every failure of a candidate becomes a result with a reason, prefixed by its kind:
  compile: build raised (or its build process died)   launch: the call raised
  wrong: output differs   crash: the worker died   timeout: no answer in time
A worker that crashed, hung or hit a CUDA error (its context is unusable) is replaced.

Failures of the environment are not a candidate's: no such device (at construction), a worker
that does not start, or a worker that cannot set up the workload's inputs and reference on
its device. Those are retried with a fresh worker and then raised as MeasureEnvironmentError;
they never become a result. Workers and build processes die with the process that started
them (PR_SET_PDEATHSIG where available, and a thread watching the parent).
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing as mp
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core import Config, Workload, workload_from_json
from ..kernels.base import KernelTemplate
from .buildpool import BuildPool, build_outcome, die_with_parent, exit_reason
from .buildpool import parent_args as _parent_args

ResultCallback = Callable[["MeasureResult"], None]
#: prefix of an environment failure's reason (never a config's result)
ENV_PREFIX = "env:"


class MeasureEnvironmentError(RuntimeError):
    """The measuring environment failed (no device, a worker that cannot start or set up):
    nothing about the candidates; nothing is recorded for them, and a rerun retries them."""


def _aot_compile(kernel: object) -> None:
    """Call the kernel's ahead-of-time `compile()` when it has one that needs no arguments
    (`MmaConvKernel.compile(arch)` compiles in `build` already and wants an arch: skipped)."""
    fn = getattr(kernel, "compile", None)
    if not callable(fn):
        return
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return
    except ValueError:  # no signature (a builtin): try the plain call
        pass
    fn()


@dataclass(frozen=True)
class MeasureInput:
    template: KernelTemplate
    workload: Workload
    config: Config


@dataclass(frozen=True)
class MeasureResult:
    """`time_us`: median kernel time in microseconds, or None with `error` set."""

    template: str
    workload: str
    config: Config
    time_us: float | None
    error: str | None = None
    compile_s: float | None = None
    run_s: float | None = None
    env: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.time_us is not None


class Measurer:
    """Measures batches; calls `on_result` as each result arrives (so callers can commit it
    before the next one starts) and returns all results in input order."""

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: ResultCallback | None = None) -> list[MeasureResult]:
        raise NotImplementedError

    def precompile(self, inputs: Sequence[MeasureInput]) -> None:
        """Build these candidates ahead of `measure` (in parallel where the measurer can), so
        that measuring them one at a time later does not compile one at a time."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- stage 1: build

def compile_job(template: KernelTemplate, wl_json: str, cfg_json: str) -> tuple[str | None, float]:
    """Build (and ahead-of-time compile, if the kernel can) one candidate in a pool process."""
    t0 = time.perf_counter()
    try:
        kernel = template.build(workload_from_json(wl_json), Config.from_json(cfg_json))
        _aot_compile(kernel)
    except Exception as e:
        return f"compile: {type(e).__name__}: {_short(e)}", time.perf_counter() - t0
    return None, time.perf_counter() - t0


def _short(e: BaseException, limit: int = 400) -> str:
    text = " ".join(str(e).split())
    return text[:limit]


# ----------------------------------------------------------------------------- stage 2: worker

_FATAL_MARKERS = ("CUDA error", "cudaError", "illegal memory", "illegal instruction",
                  "misaligned address", "device-side assert", "CUDA_ERROR", "unspecified launch")


def _is_fatal(e: BaseException) -> bool:
    text = str(e)
    return any(m in text for m in _FATAL_MARKERS)


def _outputs_match(out: object, ref: object) -> str | None:
    """None when `out` equals `ref` (bit for bit; fp16 within 1e-3 relative L2), else why."""
    import torch

    if not isinstance(out, torch.Tensor):
        return f"kernel returned {type(out).__name__}, not a tensor"
    if out.dtype != ref.dtype or tuple(out.shape) != tuple(ref.shape):
        return f"got {out.dtype}{tuple(out.shape)}, reference {ref.dtype}{tuple(ref.shape)}"
    out = out.detach().to(ref.device)
    if ref.dtype == torch.float16:  # fp16 output: rounding order may differ, state tolerance
        r, o = ref.double(), out.double()
        err = float((o - r).norm() / r.norm().clamp_min(1e-30))
        return None if err < 1e-3 and not torch.isnan(o).any() else f"rel L2 error {err:.3g}"
    if torch.equal(out, ref):
        return None
    bad = int((out != ref).sum())
    return f"{bad} of {ref.numel()} elements differ from the reference"


def _poison_allocator(wl: Workload, device: str) -> None:
    """Leave a poisoned free block of the output's size in the caching allocator, so a kernel
    that allocates its output and skips elements shows garbage there, not the last
    candidate's correct values."""
    import torch

    from ..core.validate import out_storage

    shape, dtype = out_storage(wl)
    buf = torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        buf.fill_(float("nan"))
    else:
        buf.fill_(-0x5A if dtype.itemsize == 1 else -0x5A5A5A5A)
    del buf


def _worker_main(conn, device: str, visible: str | None, parent: tuple[int, bool]) -> None:
    """Worker loop: ("measure", template, wl_json, cfg_json, seed, warmup_ms, rep_ms) -> reply
    ("ok", time_us, fatal, run_s) or ("error", reason, fatal, run_s); a reason starting with
    ENV_PREFIX is an environment failure (the worker exits after sending it)."""
    die_with_parent(*parent)
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible  # before the first CUDA call
    import torch

    from ..kernels.timing import time_us
    from ..reference import random_inputs, run
    from .env import collect_env

    if device == "cpu":  # parallel CPU workers each spawning a core's worth of OpenMP threads
        torch.set_num_threads(1)  # oversubscribe the cores; spin-waits then decide the ranking

    conn.send(("ready", collect_env(device)))
    cache: dict = {}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        _, template, wl_json, cfg_json, seed, warmup_ms, rep_ms = msg
        t0 = time.perf_counter()
        wl = workload_from_json(wl_json)
        try:
            kernel = template.build(wl, Config.from_json(cfg_json))
        except Exception as e:
            conn.send(("error", f"compile: {type(e).__name__}: {_short(e)}", False,
                       time.perf_counter() - t0))
            continue
        key = (wl.key, seed)
        if key not in cache:
            cache.clear()  # one workload's inputs at a time: big layers are big
            try:
                x, w, params = random_inputs(wl, seed, device=device)
                cache[key] = (x, w, params, run(wl, x, w, params))  # exact on any device
            except Exception as e:  # the device, not the candidate
                conn.send(("error", f"{ENV_PREFIX} setting up inputs on {device}: "
                           f"{type(e).__name__}: {_short(e)}", True, time.perf_counter() - t0))
                return
        x, w, params, ref = cache[key]
        try:
            _poison_allocator(wl, device)
            # time the bound launcher: the call path checks inputs (a device sync) every time,
            # which would put host time into the events and rank configs by noise
            bind = getattr(kernel, "bind", None)
            launch = bind(x, w, params) if callable(bind) else functools.partial(
                kernel, x, w, params)
            out = launch()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            why = _outputs_match(out, ref)
            del out
        except Exception as e:
            fatal = _is_fatal(e)
            conn.send(("error", f"launch: {type(e).__name__}: {_short(e)}", fatal,
                       time.perf_counter() - t0))
            if fatal:
                return
            continue
        if why:
            conn.send(("error", f"wrong: {why}", False, time.perf_counter() - t0))
            continue
        try:
            t = time_us(launch, warmup_ms=warmup_ms,
                        rep_ms=rep_ms, device=device)
        except Exception as e:
            fatal = _is_fatal(e)
            conn.send(("error", f"launch: {type(e).__name__}: {_short(e)} (while timing)",
                       fatal, time.perf_counter() - t0))
            if fatal:
                return
            continue
        conn.send(("ok", float(t), False, time.perf_counter() - t0))


class _Worker:
    """One measuring process and its pipe."""

    def __init__(self, ctx, device: str, visible: str | None, start_timeout_s: float) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main,
                                args=(child, device, visible, _parent_args()), daemon=True)
        self.proc.start()
        child.close()
        try:
            if not self.conn.poll(start_timeout_s):
                raise MeasureEnvironmentError(f"measure worker did not start within "
                                              f"{start_timeout_s:g} s")
            _, self.env = self.conn.recv()
        except (EOFError, OSError) as e:
            self.proc.join(10)
            self.kill()
            raise MeasureEnvironmentError(f"measure worker died at start "
                                          f"({exit_reason(self.proc.exitcode)})") from e
        except MeasureEnvironmentError:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.proc.join(5)
        except (OSError, BrokenPipeError):
            pass
        self.kill()


class LocalMeasurer(Measurer):
    """Measures on one device of this host.

    device: "cuda" (or "cuda:i") or "cpu"; compile_workers: build pool size (0: build in the
    worker only); timeout_s: per-candidate limit for build + verify + time in the worker;
    compile_timeout_s: per-candidate limit in the pool; warmup_ms/rep_ms: passed to
    `lowbit.kernels.timing.time_us` (CUDA: do_bench, L2 flushed; CPU: perf_counter median);
    seed: inputs' seed (fresh random by default); gpu_index: sets CUDA_VISIBLE_DEVICES of the
    worker (one worker per GPU under Dask); start_retries: fresh workers tried after one that
    does not start (or cannot set up on the device) before MeasureEnvironmentError.
    ValueError for a device string naming no device; MeasureEnvironmentError for a CUDA device
    this machine does not have (before any worker starts).
    """

    def __init__(self, device: str = "cuda", compile_workers: int | None = None,
                 timeout_s: float = 60.0, compile_timeout_s: float = 300.0,
                 warmup_ms: float = 10.0, rep_ms: float = 40.0, seed: int | None = None,
                 gpu_index: int | None = None,
                 start_timeout_s: float = 180.0, start_retries: int = 2) -> None:
        from .env import device_problem

        problem = device_problem(device)
        if problem and gpu_index is None:
            raise MeasureEnvironmentError(problem)
        self.device = device
        self.start_retries = start_retries
        self.compile_workers = (os.cpu_count() or 1) if compile_workers is None else compile_workers
        self.timeout_s = timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.seed = random.SystemRandom().randrange(2**31) if seed is None else seed
        self.visible = None if gpu_index is None else str(gpu_index)
        self.start_timeout_s = start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._worker: _Worker | None = None
        self._pool: BuildPool | None = None
        self._built: dict[tuple[str, str, str], tuple[str | None, float | None]] = {}
        self.restarts = 0

    # -- lifecycle
    def _get_worker(self) -> _Worker:
        if self._worker is None or not self._worker.proc.is_alive():
            if self._worker is not None:
                self._worker.kill()
                self.restarts += 1
                self._worker = None
            tries = 1 + max(0, self.start_retries)
            for i in range(tries):
                try:
                    self._worker = _Worker(self._ctx, self.device, self.visible,
                                           self.start_timeout_s)
                    break
                except MeasureEnvironmentError as e:
                    if i == tries - 1:
                        raise MeasureEnvironmentError(f"{e} ({tries} tries)") from None
        return self._worker

    def env(self) -> dict[str, str]:
        return dict(self._get_worker().env)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    # -- stage 1
    def _compile(self, inputs: Sequence[MeasureInput]) -> list[tuple[str | None, float | None]]:
        """Build every candidate in the pool (one process per job: a build that kills its
        process or hangs fails only itself, `lowbit.tune.buildpool`)."""
        if self.compile_workers <= 0 or len(inputs) == 0:
            return [(None, None)] * len(inputs)
        if self._pool is None:
            self._pool = BuildPool(self.compile_workers, self.compile_timeout_s,
                                   self.start_timeout_s)
        futs = [self._pool.submit(compile_job, i.template, i.workload.to_json(),
                                  i.config.to_json()) for i in inputs]
        return [build_outcome(f) for f in futs]

    # -- stage 2
    def _run_one(self, inp: MeasureInput) -> tuple[float | None, str | None, float | None]:
        worker = self._get_worker()
        msg = ("measure", inp.template, inp.workload.to_json(), inp.config.to_json(),
               self.seed, self.warmup_ms, self.rep_ms)
        t0 = time.perf_counter()
        try:
            worker.conn.send(msg)
            if not worker.conn.poll(self.timeout_s):
                worker.kill()
                return None, f"timeout: no result within {self.timeout_s:g} s", self.timeout_s
            tag, value, fatal, run_s = worker.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            worker.proc.join(10)
            reason = exit_reason(worker.proc.exitcode)
            worker.kill()
            return None, f"crash: worker died ({reason})", time.perf_counter() - t0
        if fatal:
            worker.kill()
        if tag == "ok":
            return value, None, run_s
        return None, value, run_s

    def _run_checked(self, inp: MeasureInput) -> tuple[float | None, str | None, float | None]:
        """`_run_one`, retrying environment failures on fresh workers, then raising them."""
        for _ in range(1 + max(0, self.start_retries)):
            t, err, run_s = self._run_one(inp)
            if not (err or "").startswith(ENV_PREFIX):
                return t, err, run_s
        raise MeasureEnvironmentError(f"{err[len(ENV_PREFIX):].strip()} "
                                      f"({1 + max(0, self.start_retries)} workers tried)")

    @staticmethod
    def _key(inp: MeasureInput) -> tuple[str, str, str]:
        return inp.template.name, inp.workload.key, inp.config.to_json()

    def precompile(self, inputs: Sequence[MeasureInput]) -> None:
        for inp, built in zip(inputs, self._compile(inputs), strict=True):
            self._built[self._key(inp)] = built

    def measure(self, inputs: Sequence[MeasureInput],
                on_result: ResultCallback | None = None) -> list[MeasureResult]:
        todo = [i for i in inputs if self._key(i) not in self._built]
        fresh = dict(zip(map(self._key, todo), self._compile(todo), strict=True)) if todo else {}
        built = [fresh[k] if k in fresh else self._built.pop(k, (None, None))
                 for k in map(self._key, inputs)]
        results = []
        for inp, (err, compile_s) in zip(inputs, built, strict=True):
            if err is None:
                t, err, run_s = self._run_checked(inp)
            else:
                t, run_s = None, None
            env = self._worker.env if self._worker is not None else {}
            if not env:
                env = self.env()
            res = MeasureResult(inp.template.name, inp.workload.key, inp.config, t, err,
                                compile_s, run_s, dict(env))
            results.append(res)
            if on_result is not None:
                on_result(res)
        return results
