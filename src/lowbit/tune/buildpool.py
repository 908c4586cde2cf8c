"""Processes the tuner starts, and the build pool: per-job crash isolation on CPU processes.

`BuildPool(workers, timeout_s)` is an `Executor` of `workers` spawn processes running jobs
(`submit(fn, *args)` returns a Future), one job per process at a time over its own pipe: a job
that kills its process (a compiler crash) fails only its own future (ChildProcessError "crash:
the build process died (...)") and one that runs past `timeout_s` is killed (TimeoutError
"timeout: build over N s"); the process is replaced either way and the other jobs go on. A job
that raises fails its future with RuntimeError(its text). The processes die with the process
that started them (`die_with_parent`) and at `shutdown`.

Kernel builds are CPU work (Triton and NVRTC compiles fill their disk caches; the measuring
worker then only loads them): `lowbit.tune.measure.LocalMeasurer` and the network tuner
(`lowbit.tune.pipeline`) build candidates in one of these.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future


def die_with_parent(parent_pid: int, deathsig: bool) -> None:
    """Make this process exit when `parent_pid` (its parent) does: PR_SET_PDEATHSIG on Linux
    when the parent started it from its main thread (the signal follows the starting thread),
    and a daemon thread that polls the parent pid."""
    if deathsig and sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="lowbit-parent-watch", daemon=True).start()


def parent_args() -> tuple[int, bool]:
    """`die_with_parent`'s arguments for a child this thread starts."""
    return os.getpid(), threading.current_thread() is threading.main_thread()


def exit_reason(code: int | None) -> str:
    """'killed by SIGSEGV' / 'exit code 3' of a process's exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _build_worker(conn, parent: tuple[int, bool]) -> None:
    """A `BuildPool` process: (fn, args) -> (True, fn(*args)) or (False, the error's text)."""
    die_with_parent(*parent)
    conn.send("ready")  # started: a job's time limit counts from here
    while True:
        msg = conn.recv()
        if msg is None:
            return
        fn, args = msg
        try:
            reply = (True, fn(*args))
        except Exception as e:
            reply = (False, f"{type(e).__name__}: {e}"[:300])
        conn.send(reply)


class BuildPool(Executor):
    """Per-job isolated process pool (module docstring)."""

    def __init__(self, workers: int, timeout_s: float = 60.0,
                 start_timeout_s: float = 300.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._processes: dict[int, object] = {}  # slot -> its live process
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True,
                                          name=f"lowbit-build-{i}") for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable, /, *args: object, **kwargs: object) -> Future:
        if kwargs:
            raise TypeError("BuildPool jobs take positional arguments only")
        if self._stop.is_set():
            raise RuntimeError("BuildPool is shut down")
        fut: Future = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def _start(self, slot: int):
        """A fresh process for `slot`, started (ChildProcessError if it does not start).
        Started from a pool thread: the parent-pid watch, not the death signal, ends it."""
        conn, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_build_worker, args=(child, (os.getpid(), False)),
                                 daemon=True)
        proc.start()
        child.close()
        self._processes[slot] = proc
        try:
            if conn.poll(self.start_timeout_s) and conn.recv() == "ready":
                return proc, conn
        except (EOFError, OSError):
            pass
        proc.kill()
        proc.join(10)
        raise ChildProcessError(f"crash: the build process did not start "
                                f"({exit_reason(proc.exitcode)})")

    def _serve(self, slot: int) -> None:
        """One slot: take a job, run it in this slot's process, replace a process that died
        or hung."""
        proc = conn = None
        while not self._stop.is_set():
            try:
                item = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if proc is None or not proc.is_alive():
                    proc, conn = self._start(slot)
                conn.send((fn, args))
                if conn.poll(self.timeout_s):
                    ok, value = conn.recv()
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(RuntimeError(value))
                    continue
                proc.kill()
                proc.join(10)
                proc = None
                fut.set_exception(TimeoutError(f"timeout: build over {self.timeout_s:g} s"))
            except ChildProcessError as e:  # no process to run it in
                proc = None
                fut.set_exception(e)
            except (EOFError, OSError) as e:
                if proc is not None:
                    proc.join(10)
                    why = exit_reason(proc.exitcode)
                    proc.kill()
                else:
                    why = f"{type(e).__name__}: {e}"
                proc = None
                fut.set_exception(ChildProcessError(f"crash: the build process died ({why})"))
        if proc is not None:
            proc.kill()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """End the processes now: running jobs are dropped, pending ones cancelled."""
        self._stop.set()
        for proc in list(self._processes.values()):
            if proc.is_alive():
                proc.kill()
        for t in self._threads:
            t.join(5)
        while True:
            try:
                fut, _, _ = self._jobs.get_nowait()
            except queue.Empty:
                break
            fut.cancel()


def build_outcome(fut: Future) -> tuple[str | None, float | None]:
    """(error, seconds) of a finished build future of `lowbit.tune.measure.compile_job`: its
    own result, or the pool's crash ("compile: crash: ..."), timeout ("timeout: build over
    ...") or error as that candidate's failure."""
    try:
        return fut.result()
    except ChildProcessError as e:
        return f"compile: {str(e)[:400]}", None
    except TimeoutError as e:
        return str(e)[:400], None
    except Exception as e:
        return f"compile: {type(e).__name__}: {str(e)[:300]}", None
