"""Tune many workloads at once: builds on CPU processes run ahead of measurements on every GPU.

`PipelineTuner(tasks, slots, builder, records, budget_s).run()` tunes a list of `TuneTask`s
(a workload, the templates it may run on, its default kernel and its share of the budget) on
measuring `Slot`s (one per GPU, `lowbit.tune.workers`: a crash-isolated `LocalMeasurer`
pinned to that GPU, a Dask worker, or a stand-in in tests) with kernels built by a `Builder`
(a `BuildPool` of CPU processes, or Dask tasks on the worker that measures them). The
pipeline:

- the main thread proposes candidates and submits their builds, keeping every build process
  busy and a few built candidates waiting per GPU, so a batch's builds overlap the previous
  batch's measurements and no GPU waits on a round to finish;
- one thread per slot takes the next built candidate and measures it (verify bit for bit,
  time); with a shared build (one host: one disk cache) any GPU takes any candidate, so the
  GPUs share the work equally however long each trial is;
- every result goes to the records database as it arrives (the main thread is its only
  writer); a killed session loses nothing it measured, and a rerun measures nothing twice.

Which workload gets the next candidate: the one furthest below its share of the budget
(GPU-seconds spent, counting a candidate in flight at its workload's mean trial time, over
`quota_s`); a workload's default kernel is its first candidate (the baseline, and what the
plan keeps if nothing beats it). Within a workload, candidates come in rounds shared among its
templates as `lowbit.tune.tuner` shares them, a round back to back (a measuring worker keeps
one workload's inputs and reference at a time). With the "pruned" strategy each template's
measuring order (seconds of CPU for a bit-serial space) is computed in the build processes
(`pruned_order_job`) while the GPUs measure defaults. When the budget (wall seconds from the
start) is spent, no candidate starts; measurements in flight finish and are recorded, built
but unmeasured candidates are dropped (a rerun proposes them again).

Where the time goes is counted (`PipelineResult.stats`): per GPU its start-up, measuring and
idle seconds; builds (jobs, failures, CPU seconds), order jobs, and each candidate's wait
between its build and its measurement.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core import Config, Workload
from ..kernels.base import KernelTemplate
from .buildpool import build_outcome
from .measure import ENV_PREFIX, MeasureEnvironmentError, MeasureInput, MeasureResult
from .records import Record, RecordsDB
from .strategies import STRATEGIES, OrderedSearch, Trial, make_strategy, pruned_order_job
from .tuner import _Arm, _share, new_arm, prior_trials
from .workers import Builder, Slot

#: GPU-seconds a trial is assumed to take before one of its workload has been measured
DEFAULT_TRIAL_S = 0.3
#: candidates proposed per refill of a workload (shared among its templates)
ROUND = 8
#: built candidates kept waiting per measuring slot
READY_PER_SLOT = 2


@dataclass(frozen=True)
class TuneTask:
    """One workload to tune: the templates it may run on, its default kernel (measured first),
    the GPU-seconds it may spend (its share of the budget) and the layers it stands for."""

    name: str
    workload: Workload
    templates: tuple[KernelTemplate, ...]
    default: tuple[KernelTemplate, Config]
    quota_s: float = 1.0
    count: int = 1
    #: the predicted time of its layers in the network (us; None: quotas stay as given)
    weight_us: float | None = None
    #: GPU-seconds of its quota that do not move when quotas are re-weighted
    floor_s: float = 0.0


def reweight(tasks: Sequence[_Task]) -> None:
    """Quotas by measured time: the budget the tasks share (the sum of their specs' quotas)
    split again, each task's floor first, the rest in proportion to its layers' time in the
    network, measured (its default kernel's time x its layer count) where its default was
    measured, else its predicted `weight_us` scaled by the median measured / predicted ratio
    (the performance model's error on this network so far). No-op unless every task has a
    prediction and the floors fit the budget."""
    if not tasks or any(t.spec.weight_us is None for t in tasks):
        return
    ratios = sorted(t.default_us * t.spec.count / t.spec.weight_us for t in tasks
                    if t.default_us is not None and t.spec.weight_us > 0)
    if not ratios:
        return
    scale = ratios[len(ratios) // 2]
    weights = [t.default_us * t.spec.count if t.default_us is not None
               else t.spec.weight_us * scale for t in tasks]
    total = sum(t.spec.quota_s for t in tasks)
    floors = sum(t.spec.floor_s for t in tasks)
    weight = sum(weights)
    if total < floors or weight <= 0:
        return
    for t, w in zip(tasks, weights, strict=True):
        t.quota_s = t.spec.floor_s + (total - floors) * w / weight


# ------------------------------------------------------------------------------ state
@dataclass
class _Candidate:
    task: _Task
    input: MeasureInput
    est_s: float
    slot: int | None = None
    built_t: float = 0.0


@dataclass
class _Task:
    spec: TuneTask
    arms: dict[str, _Arm] = field(default_factory=dict)
    orders_left: int = 0  # templates whose measuring order is still being computed
    queue: deque = field(default_factory=deque)
    prior: dict[str, list[Trial]] = field(default_factory=dict)  # records + this run's
    inflight: dict[str, set] = field(default_factory=dict)
    charged_s: float = 0.0
    run_s: float = 0.0
    measured: int = 0
    trials: int = 0
    failures: int = 0
    resumed: int = 0
    default_us: float | None = None
    best: tuple[float, str, Config] | None = None
    done: bool = False
    quota_s: float = 0.0  # the spec's, until measured defaults re-weight it

    def __post_init__(self) -> None:
        self.quota_s = self.spec.quota_s

    def ratio(self) -> float:
        return self.charged_s / max(self.quota_s, 1e-9)

    def est_s(self, fallback: float) -> float:
        return self.run_s / self.measured if self.measured else fallback

    def seen(self, name: str, cfg: Config) -> bool:
        return cfg in self.inflight.get(name, ()) or any(
            t.config == cfg for t in self.prior.get(name, ()))

    def summary(self) -> dict:
        s, d = self.spec, self.default_us
        b = self.best
        return {"name": s.name, "workload": s.workload.key, "count": s.count,
                "templates": [t.name for t in s.templates], "quota_s": round(self.quota_s, 3),
                "spent_s": round(self.run_s, 3), "trials": self.trials,
                "resumed": self.resumed, "failures": self.failures,
                "default_template": s.default[0].name, "default_us": d,
                "best_us": b and b[0], "best_template": b and b[1],
                "best_config": b and dict(b[2]),
                "speedup": d / b[0] if d and b and b[0] else None}


@dataclass
class PipelineResult:
    """Per workload: quota, GPU-seconds spent, trials, default and best (`tasks`); where the
    time went (`stats`)."""

    tasks: list[dict]
    stats: dict


class PipelineTuner:
    """Tune `tasks` on `slots` with `builder` within `budget_s` wall seconds (module doc).

    records: the database every result goes to (its only writer is this thread); gpu: the
    records' GPU name for resuming (default: the first slot's); strategy: "pruned" (orders in
    the build processes) or any `lowbit.tune.strategies` strategy made here; on_update: called
    with the task summaries and stats after each result (the progress display)."""

    def __init__(self, tasks: Sequence[TuneTask], slots: Sequence[Slot], builder: Builder,
                 records: RecordsDB, budget_s: float, *, gpu: str | None = None,
                 strategy: str = "pruned", seed: int = 0,
                 on_update: Callable[[list[dict], dict], None] | None = None) -> None:
        if not slots:
            raise ValueError("no measuring slot (GPU) to tune on")
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got "
                             f"{strategy!r}")
        self.tasks = [_Task(t) for t in tasks]
        self.slots, self.builder, self.records = list(slots), builder, records
        self.budget_s, self.gpu, self.strategy, self.seed = budget_s, gpu, strategy, seed
        self.on_update = on_update
        self.events: queue.Queue = queue.Queue()
        self.ready = [queue.Queue() for _ in (self.slots if not builder.shared else [0])]
        self.env: dict[str, str] = {}
        self.up: set[int] = set()
        self.building = self.outstanding = 0
        self.orders: deque = deque()
        self.orders_running = 0
        self.stopping = False
        self.slot_stats = [{"name": s.name, "gpu": None, "start_s": None, "measured": 0,
                            "measure_s": 0.0, "idle_s": 0.0} for s in self.slots]
        self.build_stats = {"workers": builder.workers, "jobs": 0, "failed": 0, "cpu_s": 0.0}
        self.order_stats = {"jobs": 0, "failed": 0, "cpu_s": 0.0}
        self.queue_s: list[float] = []
        self.trajectory: list[tuple[float, float]] = []
        self.first_measure: float | None = None
        self._current: _Task | None = None
        self.slot_building: dict[int, int] = {}  # builds for each slot (not shared)

    # ------------------------------------------------------------------ running
    def run(self) -> PipelineResult:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.budget_s
        threads = [threading.Thread(target=self._slot_loop, args=(i,), daemon=True,
                                    name=f"lowbit-slot-{i}") for i in range(len(self.slots))]
        for t in threads:
            t.start()
        try:
            while self.gpu is None:  # the records' GPU: the first slot's
                self._handle(self._next_event(timeout=None))
            self._prepare()
            while True:
                now = time.monotonic()
                if not self.stopping and (now >= self.deadline or self._finished()):
                    self._stop()
                if self.stopping and self.outstanding == 0:
                    break
                if not self.stopping:
                    self._top_up()
                ev = self._next_event(timeout=max(0.01, min(0.2, self.deadline - now)))
                if ev is not None:
                    self._handle(ev)
        finally:
            self._stop()
            for q in self.ready:
                for _ in self.slots:
                    q.put(None)
            for t in threads:
                t.join(30)
            for s in self.slots:
                s.close()
        return PipelineResult([t.summary() for t in self.tasks], self.stats())

    def _next_event(self, timeout: float | None):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _finished(self) -> bool:
        return (all(t.done for t in self.tasks) and self.building == 0
                and self.outstanding == 0)

    def _stop(self) -> None:
        """No candidate starts from now: drop the built ones not yet taken."""
        if self.stopping:
            return
        self.stopping = True
        for q in self.ready:
            while True:
                try:
                    c = q.get_nowait()
                except queue.Empty:
                    break
                if c is not None:
                    self.outstanding -= 1

    # ------------------------------------------------------------------ slots
    def _slot_loop(self, i: int) -> None:
        slot, st = self.slots[i], self.slot_stats[i]
        t = time.monotonic()
        try:
            env = slot.start()
        except Exception as e:
            self.events.put(("down", i, e, None))
            return
        st["start_s"] = time.monotonic() - t
        self.events.put(("up", i, env))
        q = self.ready[0 if self.builder.shared else i]
        while True:
            t = time.monotonic()
            cand = q.get()
            if cand is None:
                return
            t1 = time.monotonic()
            st["idle_s"] += t1 - t
            try:
                res = slot.measure(cand.input)
            except Exception as e:  # the device, not the candidate: this slot is done
                self.events.put(("down", i, e, cand))
                return
            if (res.error or "").startswith(ENV_PREFIX):  # likewise, as a result
                self.events.put(("down", i, MeasureEnvironmentError(res.error), cand))
                return
            self.events.put(("measured", i, cand, res, t1, time.monotonic()))

    def _handle(self, ev: tuple) -> None:
        kind = ev[0]
        if kind == "up":
            _, i, env = ev
            self.up.add(i)
            self.slot_stats[i]["gpu"] = env.get("gpu")
            self.env = self.env or env
            self.gpu = self.gpu or env.get("gpu")
        elif kind == "down":
            self._down(*ev[1:])
        elif kind == "built":
            self._built(*ev[1:])
        elif kind == "order":
            self._ordered(*ev[1:])
        elif kind == "measured":
            self._measured(*ev[1:])

    def _down(self, i: int, err: Exception, cand: _Candidate | None) -> None:
        self.up.discard(i)
        self.slot_stats[i]["error"] = f"{type(err).__name__}: {err}"[:300]
        lost = [cand] if cand is not None else []
        if not self.builder.shared:  # built for this slot's host: built again elsewhere
            while not self.ready[i].empty():
                lost.append(self.ready[i].get_nowait())
        for c in filter(None, lost):  # measured by another slot
            if self.builder.shared and not self.stopping:
                self.ready[0].put(c)
                continue
            self.outstanding -= 1
            c.task.charged_s -= c.est_s
            c.task.queue.appendleft(c.input)
            c.task.done = False
        alive = [j for j in range(len(self.slots)) if self.slot_stats[j].get("error") is None]
        if not alive:
            raise MeasureEnvironmentError(
                f"every measuring GPU failed ({self.slot_stats[i]['error']}); what was "
                "measured is recorded, a rerun goes on from there") from err

    # ------------------------------------------------------------------ proposing
    def _prepare(self) -> None:
        """Prior records of every task (resume), defaults first, then the arms."""
        for ti, task in enumerate(sorted(self.tasks, key=lambda t: -t.spec.quota_s)):
            spec = task.spec
            for tmpl in spec.templates:
                task.prior[tmpl.name] = prior_trials(self.records, spec.workload, tmpl.name,
                                                     self.gpu)
                task.inflight[tmpl.name] = set()
                for tr in task.prior[tmpl.name]:
                    self._note(task, tmpl.name, tr.config, tr.time_us, resumed=True)
            dt, dcfg = spec.default
            if not task.seen(dt.name, dcfg):
                task.queue.append(MeasureInput(dt, spec.workload, dcfg))
            # the default's template first: its order is the first that can propose
            ordered = sorted(spec.templates, key=lambda t: t.name != dt.name)
            for j, tmpl in enumerate(ordered):
                seed = self.seed + 1000 * j + 17 * ti
                if self.strategy == "pruned":
                    self.orders.append((j, ti, task, tmpl))
                    task.orders_left += 1
                    continue
                try:
                    space = tmpl.space(spec.workload)
                    strat = make_strategy(self.strategy, space, spec.workload, tmpl, seed)
                    self._arm(task, tmpl, strat, space.is_valid)
                except Exception as e:  # as a failed order: the template is left out
                    self._left_out(tmpl, e)
        # every workload's default template (largest shares first), then the others
        self.orders = deque((task, tmpl) for *_, task, tmpl in
                            sorted(self.orders, key=lambda o: o[:2]))
        self._submit_orders()

    def _submit_orders(self) -> None:
        """Keep at most half the build processes on orders (builds keep the GPUs busy)."""
        limit = max(1, self.builder.workers // 2)
        while self.orders and self.orders_running < limit and not self.stopping:
            task, tmpl = self.orders.popleft()
            fut = self.builder.run(pruned_order_job, tmpl, task.spec.workload.to_json(),
                                   self.gpu)
            self.orders_running += 1
            fut.add_done_callback(lambda f, task=task, tmpl=tmpl:
                                  self.events.put(("order", task, tmpl, f)))

    def _ordered(self, task: _Task, tmpl: KernelTemplate, fut) -> None:
        self.orders_running -= 1
        task.orders_left -= 1
        self.order_stats["jobs"] += 1
        try:
            order, survivors, secs = fut.result()
            self.order_stats["cpu_s"] += secs
            configs = [Config.from_json(c) for c in order]
            self._arm(task, tmpl, OrderedSearch(configs, survivors=survivors),
                      set(configs).__contains__)
        except Exception as e:  # the template cannot order this space: it is left out
            self._left_out(tmpl, e)
        self._submit_orders()

    def _left_out(self, tmpl: KernelTemplate, e: Exception) -> None:
        self.order_stats["failed"] += 1
        self.order_stats.setdefault("errors", []).append(
            f"{tmpl.name}: {type(e).__name__}: {e}"[:200])

    def _arm(self, task: _Task, tmpl: KernelTemplate, strat, valid) -> None:
        arm = new_arm(tmpl, task.spec.workload, strat, task.prior[tmpl.name], valid)
        strat.pending.update(task.inflight[tmpl.name])
        task.arms[tmpl.name] = arm

    def _top_up(self) -> None:
        live = max(1, len(self.up))
        while (self.building < max(1, self.builder.workers - self.orders_running)
               and self.outstanding < (READY_PER_SLOT + 1) * live):
            picked = self._next_candidate()
            if picked is None:
                return
            task, inp = picked
            cand = _Candidate(task, inp, task.est_s(self._mean_trial_s()))
            task.charged_s += cand.est_s
            task.inflight[inp.template.name].add(inp.config)
            if not self.builder.shared:  # built on the host of the least loaded slot
                cand.slot = min(self.up or {0}, key=lambda j: self.ready[j].qsize()
                                + self.slot_building.get(j, 0))
                self.slot_building[cand.slot] = self.slot_building.get(cand.slot, 0) + 1
            fut = self.builder.build(inp, cand.slot or 0)
            self.building += 1
            fut.add_done_callback(lambda f, c=cand: self.events.put(("built", c, f)))

    def _mean_trial_s(self) -> float:
        n = sum(t.measured for t in self.tasks)
        return sum(t.run_s for t in self.tasks) / n if n else DEFAULT_TRIAL_S

    def _next_candidate(self) -> tuple[_Task, MeasureInput] | None:
        """The rest of the current task's round, else the next round of the task furthest
        below its share: a round's candidates run back to back, so a measuring worker keeps
        one workload's inputs and reference instead of making them per candidate."""
        cur = self._current
        if cur is not None and cur.queue and not cur.done:
            return cur, cur.queue.popleft()
        for task in sorted((t for t in self.tasks if not t.done),
                           key=lambda t: (t.ratio(), -t.quota_s)):
            if not task.queue:
                self._refill(task)
            if task.queue:
                self._current = task
                return task, task.queue.popleft()
        return None

    def _refill(self, task: _Task) -> None:
        arms = list(task.arms.values())
        for arm, k in zip(arms, _share(arms, ROUND), strict=True):
            for cfg in arm.strategy.propose(k):
                if cfg not in task.inflight[arm.template.name]:
                    task.queue.append(MeasureInput(arm.template, task.spec.workload, cfg))
        if not task.queue and task.orders_left == 0:
            task.done = True  # every template's space is used up

    # ------------------------------------------------------------------ results
    def _built(self, cand: _Candidate, fut) -> None:
        self.building -= 1
        if cand.slot is not None:
            self.slot_building[cand.slot] -= 1
        if self.stopping:  # not measured: nothing recorded, a rerun proposes it again
            return
        err, secs = build_outcome(fut)
        self.build_stats["jobs"] += 1
        self.build_stats["cpu_s"] += secs or 0.0
        if err is not None:
            self.build_stats["failed"] += 1
            inp = cand.input
            res = MeasureResult(inp.template.name, inp.workload.key, inp.config, None, err,
                                secs, None, dict(self.env) or {"gpu": self.gpu})
            self._commit(cand, res, cand.est_s, measured=False)
            return
        cand.built_t = time.monotonic()
        self.outstanding += 1
        self.ready[0 if self.builder.shared else cand.slot].put(cand)

    def _measured(self, i: int, cand: _Candidate, res: MeasureResult, t1: float,
                  t2: float) -> None:
        self.outstanding -= 1
        st = self.slot_stats[i]
        st["measured"] += 1
        st["measure_s"] += t2 - t1
        self.queue_s.append(t1 - cand.built_t)
        if self.first_measure is None:
            self.first_measure = t1 - self.t0
        self._commit(cand, res, t2 - t1, measured=True)

    def _commit(self, cand: _Candidate, res: MeasureResult, spent_s: float,
                measured: bool) -> None:
        """Record a result; charge its task `spent_s` GPU-seconds instead of the estimate (a
        failed build is charged the estimate: it took a place in the pipeline)."""
        task, inp = cand.task, cand.input
        self.records.add(Record.of(res, task.spec.workload))
        name = inp.template.name
        task.inflight[name].discard(inp.config)
        task.charged_s += spent_s - cand.est_s
        if measured:
            task.run_s += spent_s
            task.measured += 1
        task.trials += 1
        task.failures += res.time_us is None
        trial = Trial(inp.config, res.time_us)
        arm = task.arms.get(name)
        if arm is not None:
            arm.strategy.update([trial])
            if res.time_us is not None and (arm.best_us is None or res.time_us < arm.best_us):
                arm.best_us = res.time_us
        task.prior[name].append(trial)
        self._note(task, name, inp.config, res.time_us)
        if self.on_update is not None:
            self.on_update([t.summary() for t in self.tasks], self.stats())

    def _note(self, task: _Task, name: str, cfg: Config, t: float | None,
              resumed: bool = False) -> None:
        """Default and best of a task, and the network's sum of bests over time."""
        task.resumed += resumed
        if t is None:
            return
        if (name, cfg) == (task.spec.default[0].name, task.spec.default[1]):
            task.default_us = t
            reweight(self.tasks)
        if task.best is None or t < task.best[0]:
            task.best = (t, name, cfg)
            timed = [x for x in self.tasks if x.best is not None]
            total = sum(x.spec.count * x.best[0] for x in timed)
            if not resumed and len(timed) == len(self.tasks):
                self.trajectory.append((round(time.monotonic() - self.t0, 3), total))

    # ------------------------------------------------------------------ accounting
    def stats(self) -> dict:
        now = time.monotonic()
        wall = now - getattr(self, "t0", now)
        gpus = []
        for st in self.slot_stats:
            up = wall - (st["start_s"] or 0.0)
            gpus.append({**st, "busy": st["measure_s"] / up if up > 0 else None})
        qs = self.queue_s
        return {"wall_s": round(wall, 3), "budget_s": self.budget_s, "strategy": self.strategy,
                "first_measure_s": self.first_measure,
                "trials": sum(t.trials for t in self.tasks),
                "failures": sum(t.failures for t in self.tasks),
                "resumed": sum(t.resumed for t in self.tasks),
                "gpus": gpus, "build": dict(self.build_stats), "orders": dict(self.order_stats),
                "queue_s_mean": sum(qs) / len(qs) if qs else None,
                "trajectory": list(self.trajectory)}
