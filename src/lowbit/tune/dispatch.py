"""Dispatch without re-tuning: the best recorded (template, config) of a workload, built."""

from __future__ import annotations

from pathlib import Path

from ..core import Workload
from ..kernels.base import Kernel, KernelTemplate, get_template, templates
from .records import Record, RecordsDB


def best_record(workload: Workload, db: RecordsDB | str | Path | None = None,
                gpu: str | None = None) -> Record | None:
    """Fastest verified measurement of `workload` (on `gpu` when given) in the records."""
    if isinstance(db, RecordsDB):
        return db.best(workload, gpu)
    with RecordsDB(db) as records:
        return records.best(workload, gpu)


def kernel_for(workload: Workload, db: RecordsDB | str | Path | None = None,
               gpu: str | None = None, fallback: bool = True) -> Kernel:
    """The tuned kernel for `workload` from the records; without a record, the default config
    of the first registered template that supports it (`fallback`), else ValueError."""
    rec = best_record(workload, db, gpu)
    if rec is not None:
        return get_template(rec.template).build(workload, rec.cfg)
    if fallback:
        usable: list[KernelTemplate] = [t for t in templates() if t.supports(workload)]
        if usable:
            return usable[0].build(workload, usable[0].default_config(workload))
    raise ValueError(f"no tuning record for {workload.key}"
                     + (f" on {gpu}" if gpu else "") + " and no fallback template")
