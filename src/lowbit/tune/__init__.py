"""Schedule tuning: verified crash-isolated measurement, SQLite records, XGBoost rank cost
model, search strategies (random, exhaustive, SA, diversity-aware, Optuna TPE), Dask backend.

    from lowbit.tune import tune
    result = tune(workload, trials=500, strategy="diversity")   # records in the user cache
    kernel = lowbit.tune.kernel_for(workload)                   # later: no re-tuning

A whole network (`lowbit tune --model NAME --budget 10m`): its plan's distinct workloads by
their share of the network's time, built on CPU processes ahead of measurements on every GPU
(`lowbit.tune.network`, `lowbit.tune.pipeline`).
"""

from .dispatch import best_record, kernel_for
from .measure import LocalMeasurer, MeasureInput, Measurer, MeasureResult
from .records import Record, RecordsDB, default_db_path
from .replay import TableMeasurer
from .strategies import STRATEGIES, Strategy, Trial, make_strategy
from .tuner import TuneResult, tune

__all__ = [
    "STRATEGIES", "LocalMeasurer", "MeasureInput", "MeasureResult", "Measurer", "Record",
    "RecordsDB", "Strategy", "TableMeasurer", "Trial", "TuneResult", "best_record",
    "default_db_path", "kernel_for", "make_strategy", "tune",
]
