"""`tune(workload, ...)`: search every template that supports a workload, measure, record.

Which template serves the layer (int8, bit-serial, fp16, ...) is part of the search: every
supporting template gets a strategy over its own space, each round's batch is shared among
them (half to the template holding the best time so far once there is one, three quarters
once every other template's best is LEAD_MARGIN times slower), and the answer is
the fastest verified (template, config). Each template's untuned default config is measured
first (the baseline the tuned one is compared with). Every result is committed to the records
database as it arrives; configs already recorded for this workload and GPU are not measured
again but count toward `trials` (a killed tune resumes where it stopped).

Environment failures are not results: templates that need a GPU with a measurer that has
none stop the tune before any trial, and a result whose reason starts with "env:" (or a
measurer raising MeasureEnvironmentError) stops it without recording anything for that
candidate, so a rerun retries it. Both raise MeasureEnvironmentError.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..core import Config, Workload, workload_from_json
from ..kernels import load_backends
from ..kernels.base import KernelTemplate
from ..kernels.base import templates as registered_templates
from .cost_model import Sample
from .env import needs_gpu
from .measure import ENV_PREFIX, MeasureEnvironmentError, MeasureInput, Measurer, MeasureResult
from .progress import TuneProgress
from .records import Record, RecordsDB
from .strategies import Strategy, Trial, make_strategy

#: most records of other workloads used to seed a template's cost model
TRANSFER_LIMIT = 4000
#: the leading template gets half of each round, or LEAD_SHARE once every other template's
#: best time is at least LEAD_MARGIN x its own (a clear lead: exploring the others costs more)
LEAD_MARGIN = 1.2
LEAD_SHARE = 0.75


@dataclass
class TuneResult:
    """Outcome of one tune: the fastest verified (template, config) and how it was found.

    `default_us`: each template's default config time (None if it failed); `history`: this
    run's measurements in the order they arrived; `trials`: configs measured for the workload
    on this GPU, resumed ones included.
    """

    workload: Workload
    gpu: str
    template: str | None
    config: Config | None
    time_us: float | None
    default_us: dict[str, float | None]
    trials: int
    failures: int
    wall_s: float
    history: list[MeasureResult] = field(default_factory=list)

    @property
    def speedup_over_default(self) -> float | None:
        """Default config time of the winning template / tuned time."""
        d = self.default_us.get(self.template or "")
        return d / self.time_us if d and self.time_us else None


@dataclass
class _Arm:
    template: KernelTemplate
    strategy: Strategy
    default: Config
    best_us: float | None = None


def _open_db(db: RecordsDB | str | Path | None) -> tuple[RecordsDB, bool]:
    if isinstance(db, RecordsDB):
        return db, False
    return RecordsDB(db), True


def _default_measurer() -> Measurer:
    import torch

    from .measure import LocalMeasurer

    return LocalMeasurer(device="cuda" if torch.cuda.is_available() else "cpu")


def _transfer(db: RecordsDB, template: str, gpu: str, workload: Workload) -> list[Sample]:
    out: list[Sample] = []
    for r in reversed(db.records(gpu=gpu, template=template)):
        if r.workload == workload.key or not r.workload_json:
            continue
        out.append(Sample(workload_from_json(r.workload_json), r.cfg, r.time_us))
        if len(out) >= TRANSFER_LIMIT:
            break
    return out


def _share(arms: list[_Arm], n: int) -> list[int]:
    """Split n proposals among the arms that still have configs (module doc)."""
    live = [i for i, a in enumerate(arms) if not a.strategy.exhausted]
    shares = [0] * len(arms)
    if not live or n <= 0:
        return shares
    timed = [i for i in live if arms[i].best_us is not None]
    lead = min(timed, key=lambda i: arms[i].best_us) if timed else None
    if lead is not None and len(live) > 1:
        best = arms[lead].best_us
        others = [arms[i].best_us for i in live if i != lead]
        clear = all(t is not None and t >= LEAD_MARGIN * best for t in others)
        shares[lead] = math.ceil(n * (LEAD_SHARE if clear else 0.5))
        n -= shares[lead]
        live = [i for i in live if i != lead]
    for j, i in enumerate(live):
        shares[i] += n // len(live) + (1 if j < n % len(live) else 0)
    return shares


def tune(workload: Workload, templates: Sequence[KernelTemplate] | None = None,
         trials: int = 500, strategy: str = "diversity",
         db: RecordsDB | str | Path | None = None, measurer: Measurer | None = None, *,
         batch: int = 32, seed: int = 0, transfer: bool = True, progress: bool = True,
         time_budget_s: float | None = None) -> TuneResult:
    """Tune `workload`; returns the fastest verified (template, config) found.

    templates: candidates (default: every registered template; those whose `supports` is
    False are dropped); strategy: one of `lowbit.tune.strategies.STRATEGIES`; db: records
    database or its path (default: the user cache file); measurer: default a
    `LocalMeasurer` on cuda (cpu without a GPU); batch: candidates measured per round;
    time_budget_s: stop starting new rounds after this many seconds, and size each round after
    the first to the trials that fit in what is left (at this run's measured seconds per
    trial), so a run overshoots by about one trial rather than one round.
    """
    t_start = time.perf_counter()
    if templates is None:
        load_backends()
    pool = list(templates) if templates is not None else registered_templates()
    usable = [t for t in pool if t.supports(workload)]
    if not usable:
        reasons = "; ".join(f"{t.name}: {t.unsupported_reason(workload)}" for t in pool)
        raise ValueError(f"no template supports {workload.key} ({reasons or 'none registered'})")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    records, own_db = _open_db(db)
    own_measurer = measurer is None
    measurer = measurer or _default_measurer()
    try:
        gpu = measurer.env()["gpu"]
        _check_measurable(usable, gpu)
        arms = _make_arms(usable, workload, strategy, seed, records, gpu, transfer)
        by_name = {a.template.name: a for a in arms}
        done = sum(len(a.strategy.measured) for a in arms)
        history: list[MeasureResult] = []
        title = f"tune {workload.key[:60]}"
        with TuneProgress(title, trials, done, enabled=progress) as bar:
            def commit(res: MeasureResult) -> None:
                if (res.error or "").startswith(ENV_PREFIX):
                    raise MeasureEnvironmentError(
                        f"{res.error[len(ENV_PREFIX):].strip()} (measuring {res.template} on "
                        f"{gpu}; nothing recorded for it: a rerun retries it)")
                records.add(Record.of(res, workload))
                history.append(res)
                bar.advance(res.ok, res.time_us, res.template)

            first = [MeasureInput(a.template, workload, a.default) for a in arms
                     if not a.strategy.seen(a.default)][: trials - done]
            for a in arms:  # defaults wait in `first` until a round has room for them
                a.strategy.pending.update(i.config for i in first if i.template is a.template)
            t_measure, measured = time.perf_counter(), 0
            while done < trials:
                now = time.perf_counter()
                if time_budget_s is not None and now - t_start > time_budget_s:
                    break
                size = min(batch, trials - done)
                if time_budget_s is not None and measured:
                    per_trial = (now - t_measure) / measured
                    size = min(size, max(1, int((time_budget_s - (now - t_start)) / per_trial)))
                inputs = first[:size]
                first = first[size:]
                room = max(0, size - len(inputs))
                for a, k in zip(arms, _share(arms, room), strict=True):
                    inputs += [MeasureInput(a.template, workload, c)
                               for c in a.strategy.propose(k)]
                if not inputs:
                    break  # every space is used up
                results = measurer.measure(inputs, on_result=commit)
                _feed(by_name, results)
                done += len(results)
                measured += len(results)
    finally:
        if own_measurer:
            measurer.close()
        if own_db:
            records.close()
    return _result(workload, gpu, arms, done, history, time.perf_counter() - t_start)


def _check_measurable(usable: list[KernelTemplate], gpu: str) -> None:
    """MeasureEnvironmentError when a template needs a GPU and the measurer has none."""
    if not gpu.startswith("cpu"):
        return
    gpu_only = [t.name for t in usable if needs_gpu(t)]
    if gpu_only:
        raise MeasureEnvironmentError(
            f"{', '.join(gpu_only)} can only be measured on a CUDA GPU, and this measurer runs "
            f"on {gpu}: nothing was measured or recorded (tune on a GPU machine, or pick "
            "templates that run here)")


def _make_arms(usable: list[KernelTemplate], workload: Workload, strategy: str, seed: int,
               records: RecordsDB, gpu: str, transfer: bool) -> list[_Arm]:
    arms = []
    for i, tmpl in enumerate(usable):
        space = tmpl.space(workload)
        seeds = _transfer(records, tmpl.name, gpu, workload) if transfer else []
        strat = make_strategy(strategy, space, workload, tmpl, seed + 1000 * i, seeds)
        arms.append(new_arm(tmpl, workload, strat, prior_trials(records, workload, tmpl.name,
                                                                gpu), space.is_valid))
    return arms


def prior_trials(records: RecordsDB, workload: Workload, template: str, gpu: str
                 ) -> list[Trial]:
    """The recorded measurements of `template` on `workload` and `gpu` (what a resumed tune
    does not measure again)."""
    return [Trial(r.cfg, r.time_us) for r in records.measured(workload, template, gpu).values()]


def new_arm(template: KernelTemplate, workload: Workload, strategy: Strategy,
            prior: Sequence[Trial], valid: Callable[[Config], bool]) -> _Arm:
    """A template's arm: its strategy fed the `prior` trials that are `valid` configs of its
    space (older records of a changed space are not), its best time among them."""
    arm = _Arm(template, strategy, template.default_config(workload))
    kept = [t for t in prior if valid(t.config)]
    strategy.update(kept)
    arm.best_us = min((t.time_us for t in kept if t.time_us is not None), default=None)
    return arm


def _feed(by_name: dict[str, _Arm], results: Sequence[MeasureResult]) -> None:
    grouped: dict[str, list[Trial]] = {}
    for r in results:
        grouped.setdefault(r.template, []).append(Trial(r.config, r.time_us))
        arm = by_name[r.template]
        if r.time_us is not None and (arm.best_us is None or r.time_us < arm.best_us):
            arm.best_us = r.time_us
    for name, trials in grouped.items():
        by_name[name].strategy.update(trials)


def _result(workload: Workload, gpu: str, arms: list[_Arm], done: int,
            history: list[MeasureResult], wall_s: float) -> TuneResult:
    best: tuple[float, str, Config] | None = None
    failures = 0
    defaults: dict[str, float | None] = {}
    for a in arms:
        for cfg, t in a.strategy.measured.items():
            if t is None:
                failures += 1
            elif best is None or t < best[0]:
                best = (t, a.template.name, cfg)
        defaults[a.template.name] = a.strategy.measured.get(a.default)
    return TuneResult(workload, gpu, best[1] if best else None, best[2] if best else None,
                      best[0] if best else None, defaults, done, failures, wall_s, history)
