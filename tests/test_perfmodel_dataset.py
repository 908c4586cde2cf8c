"""Measurement rows from results files: parsing, verification filters, dedup, snapshot."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload
from lowbit.kernels.base import TORCH_FP16
from lowbit.kernels.cuda import FAMILIES, LEGACY, MMA_SYNC, MMA_SYNC_PERSISTENT
from lowbit.perfmodel.dataset import (
    GRAPH_OFFSET_US,
    SNAPSHOT,
    Measurement,
    deduplicate,
    file_stamp,
    load_records,
    load_results,
    load_snapshot,
    paired_graph_offsets,
    save_snapshot,
    workload_from_key,
)

ROOT = Path(__file__).resolve().parent.parent
CONV = ConvWorkload(N=2, H=8, W=8, C=64, K=64, R=3, S=3, pad=1, w="s8", a="s8",
                    epilogue=Epilogue(bias=True, relu=True, out="s8"))
BITS = CONV.replace(w="b1", a="u2", w_layout="bitplane", a_layout="bitplane",
                    epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"))


def test_workload_key_round_trip():
    cases = [CONV, BITS, GemmWorkload(M=8, N=40, K=100, w="s8", a="s8"),
             GemmWorkload(M=3, N=5, K=7, epilogue=Epilogue(relu=True, out="fp16")),
             CONV.replace(epilogue=Epilogue(bias=True, out="int32"))]
    for wl in cases:
        assert workload_from_key(wl.key) == wl
    with pytest.raises(ValueError, match="not a workload key"):
        workload_from_key("conv2d N=1")
    assert len(cases) == 5


def _write(folder: Path, name: str, doc: dict) -> None:
    (folder / name).write_text(json.dumps(doc))


def test_load_results_keeps_only_verified_rows(tmp_path):
    igemm = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
             "GROUP_M": 1, "LOOP_ORDER": "rsc", "SPLIT_K": 1, "SPLIT_SUM": "second_kernel"}
    _write(tmp_path, "tables-20261122-100000.json", {
        "benchmark": "tuning_tables", "gpu": "G", "template": "triton.conv2d_int8",
        "layers": [{"wl": CONV.to_dict(), "table": [
            [igemm, 10.0, None], [{**igemm, "BLOCK_M": 128}, None, "wrong: 3 differ"],
            [{**igemm, "num_stages": 2}, 12.0, None]]}]})
    # rows of the single "cuda.bitserial" template: every kernel parameter in the config
    bit_cfg = {"BM": 64, "BN": 64, "WM": 32, "WN": 32, "KT": 2, "STAGES": 3, "MMA": "mma_sync",
               "PERSIST": 0}
    _write(tmp_path, "bitserial-20261123-100000.json", {
        "benchmark": "bitserial", "gpu": "G", "rows": [{
            "workload": "x", "precision": "w1a2", "impl": LEGACY,
            "workload_key": BITS.key, "verified": True, "config": bit_cfg, "time_us": 5.0,
            "tried": [{"config": {**bit_cfg, "PERSIST": 1}, "us": 6.0, "exact": True},
                      {"config": {**bit_cfg, "KT": 8}, "us": 1.0, "exact": False},
                      {"config": {**bit_cfg, "PREFETCH": 1}, "us": 2.0, "exact": True},
                      {"config": {**bit_cfg, "MMA": "wgmma", "WM": 64, "SPLIT_K": 2},
                       "us": 3.0, "exact": True}],  # a probe's knob; a kernel no family has
            "baselines_us": {"cudnn_fp16": 20.0}, "baseline_configs": {}}]})
    _write(tmp_path, "notes.json", {"nothing": 1})  # not a results document: skipped
    ms = load_results(tmp_path, complete=False)
    kinds = sorted((m.template, m.timing, m.time_us) for m in ms)
    assert kinds == [(MMA_SYNC.name, "graph", 5.0), (MMA_SYNC_PERSISTENT.name, "graph", 6.0),
                     (TORCH_FP16, "graph", 20.0), ("triton.conv2d_int8", "events", 10.0),
                     ("triton.conv2d_int8", "events", 12.0)]
    plain = next(m for m in ms if m.time_us == 5.0)
    assert plain.config == MMA_SYNC.config_of({**MMA_SYNC.fixed, **MMA_SYNC.knobs.neutral(),
                                               **bit_cfg})
    fp16 = next(m for m in ms if m.template == TORCH_FP16)
    assert fp16.workload.a_layout.value == "int8"  # fp16 rows keyed by the shape's s8 twin
    assert fp16.events_us == pytest.approx(20.0 + GRAPH_OFFSET_US)
    assert {m.stamp for m in ms} == {"20261122-100000", "20261123-100000"}


def test_deduplicate_prefers_latest_then_events():
    cfg = Config(A=1)

    def m(t: float, timing: str, stamp: str) -> Measurement:
        return Measurement("G", "t", CONV, cfg, t, timing, "f", stamp)

    got = deduplicate([m(1.0, "events", "20261122-"), m(2.0, "graph", "20261124-"),
                       m(3.0, "events", "20261124-"), m(4.0, "graph", "20261123-")])
    assert [x.time_us for x in got] == [3.0]
    assert file_stamp("config_probe-20261125-s18.json") == "20261125-s18"
    assert file_stamp("plain.json") == ""


def test_snapshot_round_trip(tmp_path):
    ms = [Measurement("G", "t", wl, Config(A=i), float(i + 1), "events", "s", "x")
          for i, wl in enumerate([CONV, BITS, GemmWorkload(M=4, N=4, K=4)])]
    path = tmp_path / "m.jsonl.gz"
    assert save_snapshot(ms, path) == 3
    assert load_snapshot(path) == ms
    assert load_snapshot(tmp_path / "missing.gz") == []


def test_records_database_rows(tmp_path):
    from lowbit.tune.records import Record, RecordsDB

    with RecordsDB(tmp_path / "r.sqlite") as db:
        db.add(Record(CONV.key, "triton.conv2d_int8", Config(A=1).to_json(), 7.5, None, "G",
                      workload_json=CONV.to_json()))
        db.add(Record(CONV.key, "triton.conv2d_int8", Config(A=2).to_json(), None,
                      "wrong: 1 differ", "G"))
        spec = MMA_SYNC_PERSISTENT.spec(MMA_SYNC_PERSISTENT.default_config(BITS))
        db.add(Record(BITS.key, LEGACY, Config(spec).to_json(), 4.0, None, "G",
                      workload_json=BITS.to_json()))  # a row of before the families' split
        ms = load_records(db)  # a RecordsDB iterates over its rows
    assert [(m.template, m.workload, m.config, m.time_us, m.timing) for m in ms] == [
        ("triton.conv2d_int8", CONV, Config(A=1), 7.5, "events"),
        (MMA_SYNC_PERSISTENT.name, BITS, MMA_SYNC_PERSISTENT.config_of(spec), 4.0, "events")]


def test_packaged_snapshot_and_offset_agree_with_the_results_files():
    ms = load_snapshot(SNAPSHOT)
    templates = {m.template for m in ms}
    assert len(ms) > 5000
    assert {"triton.conv2d_int8", TORCH_FP16, *(f.name for f in FAMILIES)} <= templates
    assert LEGACY not in templates  # rows of before the split as their family's
    assert all(m.time_us > 0 for m in ms)
    offsets = paired_graph_offsets(ROOT / "benchmarks" / "results")
    assert len(offsets) > 100
    assert abs(statistics.median(offsets) - GRAPH_OFFSET_US) < 0.3
